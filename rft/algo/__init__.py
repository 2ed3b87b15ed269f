"""The RL math, pure torch: advantage estimators, policy/KL/entropy losses, and their registry.

``names`` declares every algorithm choice once (no torch: the config schema reads it);
``advantages`` and ``losses`` are pure functions of tensors; ``registry`` maps the names to
them and checks their arguments.
"""
