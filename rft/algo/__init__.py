"""The RL math, pure torch: advantage estimators, policy/KL/entropy losses, and their registry.

``advantages`` and ``losses`` are pure functions of tensors; ``registry`` maps the names that
:mod:`rft.config.names` declares to them and checks their arguments.
"""
