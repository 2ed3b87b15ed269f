"""The RL math, pure torch: advantages, policy/KL/entropy losses, token log-probs and entropies,
off-policy correction weights, the critic's GAE and value loss; ``registry`` maps names to them.

Every module here imports only torch, the stdlib, its siblings and (the registry) ``rft.errors``.
"""
