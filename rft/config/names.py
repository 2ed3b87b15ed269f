"""Every algorithm choice a config can name, declared once: the schema's choices (no torch).

The registries in :mod:`rft.algo.registry` map these names to the pure functions of
:mod:`rft.algo.advantages` and :mod:`rft.algo.losses`; :mod:`rft.trainer.algorithm` checks at import that they cover
exactly these names (less :data:`NEEDS_CRITIC`: GAE, resolved apart as it needs a critic's
values). Also the engine limits a config is checked against on the login node.
"""

ADVANTAGE_FN_NAMES = (
    "grpo",
    "rloo",
    "reinforce",
    "reinforceplusplus",
    "opmd",
    "ppo",
    "step_wise_grpo",
)
POLICY_LOSS_FN_NAMES = ("ppo", "gspo", "sft", "mix_chord", "opmd")
KL_FN_NAMES = ("none", "k1", "k2", "k3", "low_var_kl", "abs")
ENTROPY_LOSS_FN_NAMES = ("default", "none")
LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)
SAMPLE_STRATEGIES = ("default", "mix")
ALGORITHM_TYPES = (
    "grpo",
    "ppo",
    "rloo",
    "reinforce",
    "reinforceplusplus",
    "opmd",
    "gspo",
    "sft",
    "mix_chord",
    "multi_step_grpo",
)
ROLLOUT_CORRECTION_MODES = ("none", "tis", "decoupled")  # algorithm.rollout_correction.mode
TIS_THRESHOLD = 2.0  # rollout_correction.rollout_is_threshold when unset (veRL's default)
NEEDS_CRITIC = frozenset({"ppo"})  # advantage_fn names that need a critic model (GAE)
BY_RUN = frozenset({"step_wise_grpo"})  # advantage_fn names that take each row's (run, env step)
# LoRA: the max_lora_rank values vLLM 0.32 accepts (vllm.config.lora.MaxLoRARanks); the engine
# rounds lora_rank up to the next one, the config rules refuse a rank above the last.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
