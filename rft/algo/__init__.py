"""The RL math, pure torch: advantage estimators, policy/KL/entropy losses, token log-probs
and entropies, off-policy correction weights, and their registry.

``advantages``, ``losses``, ``logprobs`` and ``correction`` are pure functions of tensors;
``registry`` maps the names that :mod:`rft.config.names` declares to them and checks their
arguments.
"""
