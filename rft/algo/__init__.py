"""The RL math, pure torch: advantage estimators, policy/KL/entropy losses, off-policy
correction weights, and their registry.

``advantages``, ``losses`` and ``correction`` are pure functions of tensors; ``registry`` maps
the names that :mod:`rft.config.names` declares to them and checks their arguments.
"""
