"""Every algorithm choice a config can name, declared once: the schema's choices (no torch).

The registries in :mod:`rft.algo.registry` map these names to the pure functions of
:mod:`rft.algo.advantages` and :mod:`rft.algo.losses`, and check at import that they cover
exactly these names (less :data:`NEEDS_CRITIC`, which the config refuses as not supported).
"""

ADVANTAGE_FN_NAMES = ("grpo", "rloo", "reinforce", "reinforceplusplus", "opmd", "ppo")
POLICY_LOSS_FN_NAMES = ("ppo", "gspo", "sft", "mix_chord", "opmd")
KL_FN_NAMES = ("none", "k1", "k2", "k3", "low_var_kl", "abs")
ENTROPY_LOSS_FN_NAMES = ("default", "none")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
SAMPLE_STRATEGIES = ("default", "mix")
ALGORITHM_TYPES = ("grpo", "ppo", "rloo", "reinforce", "reinforceplusplus", "opmd", "gspo", "sft",
                   "mix_chord")
ROLLOUT_CORRECTION_MODES = ("none", "tis", "decoupled")  # algorithm.rollout_correction.mode
TIS_THRESHOLD = 2.0  # rollout_correction.rollout_is_threshold when unset (veRL's default)
NEEDS_CRITIC = frozenset({"ppo"})  # advantage_fn names that need a critic model (GAE)
