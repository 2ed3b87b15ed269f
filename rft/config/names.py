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
    "asymre",
    "rec",
    "grpo_verl",
    "on_policy_distill",
    "jsd",
    "gigpo",
    "clipb",
)
POLICY_LOSS_FN_NAMES = (
    "ppo",
    "gspo",
    "sft",
    "mix_chord",
    "mix",
    "opmd",
    "topr",
    "cispo",
    "sapo",
    "sppo",
    "rec",
    "dpo",
    "importance_sampling",
    "m2po",
)
KL_FN_NAMES = ("none", "k1", "k2", "k3", "low_var_kl", "abs")
ENTROPY_LOSS_FN_NAMES = ("default", "mix", "none")
LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)
# "warmup": Trinity's deprecated name of "default" (its WarmupSampleStrategy subclasses it;
# trinity/algorithm/sample_strategy/sample_strategy.py), read as "default"
SAMPLE_STRATEGIES = ("default", "mix", "staleness_control", "warmup")
ALGORITHM_TYPES = (
    "grpo",
    "dapo",
    "ppo",
    "rloo",
    "reinforce",
    "reinforceplusplus",
    "opmd",
    "gspo",
    "sft",
    "mix_chord",
    "multi_step_grpo",
    "asymre",
    "topr",
    "cispo",
    "sapo",
    "mix",
    "raft",
    "sppo",
    "rec",
    "on_policy_distill",
    "jsd",
    "dpo",
    "m2po",
    "gigpo",
    "grpo_verl",
)
# advantage_fn names (and the algorithm types presetting them) that read the teacher's log-probs
# of each sampled token, computed by the explorer with explorer.auxiliary_models[0]
# (rft.explorer.teacher) and carried on each experience (teacher_logprobs).
NEEDS_TEACHER = frozenset({"on_policy_distill", "jsd"})
# policy_loss_fn names that train on expert rows too (algorithm.sample_strategy: mix).
EXPERT_LOSSES = frozenset({"mix_chord", "mix"})
# Trinity's MIX / CHORD policy_loss_fn_args that only size its own loss scaling (veRL's batch
# bookkeeping: trinity/algorithm/policy_loss_fn/{mix,chord}_policy_loss.py). rft weighs each
# part over its rows itself: no effect, checked against rft's values (rft.config.mix_args).
MIX_BATCH_ARGS = (
    "use_dynamic_bsz",
    "ppo_mini_batch_size",
    "ppo_micro_batch_size_per_gpu",
    "ngpus_trainer",
    "train_batch_size_usual",
    "train_batch_size_expert",
    "repeat_times",  # mix only
    "read_batch_size_usual",  # mix only
    "read_batch_size_expert",  # mix only
    "gradient_accumulation",  # older mix only
)
# entropy_loss_fn names whose bonus counts the rollout rows only (not the expert rows).
ROLLOUT_ENTROPY = frozenset({"mix"})
# advantage_fn names that compare a response with the rest of its group (repeat_times >= 2).
GROUP_BASELINES = frozenset(
    {"grpo", "rloo", "opmd", "asymre", "rec", "step_wise_grpo", "gigpo", "clipb"}
)
ROLLOUT_CORRECTION_MODES = ("none", "tis", "decoupled")  # algorithm.rollout_correction.mode
# data_processor.experience_pipeline operators rft applies (rft.trainer.experience_ops), as
# Trinity registers them (trinity/buffer/operators/__init__.py EXPERIENCE_OPERATORS).
EXPERIENCE_OPERATORS = (
    "mask_response_truncated",
    "dapo_dynamic_sampling",
    "reward_filter",
    "reward_std_filter",
    "invalid_reward_filter",
    "pass_rate_calculator",
)
TIS_THRESHOLD = 2.0  # rollout_correction.rollout_is_threshold when unset (veRL's default)
NEEDS_CRITIC = frozenset({"ppo"})  # advantage_fn names that need a critic model (GAE)
# advantage_fn names that take each row's (run, env step) (runs=...), and those of them that
# take each row's experience info too (infos=...: GiGPO's step reward and state hash).
BY_RUN = frozenset({"step_wise_grpo", "gigpo"})
BY_INFO = frozenset({"gigpo"})
# advantage_fn names followed by a token filter that reads the policy's per-token entropy from
# the trainer's old-log-prob pass and each token's rollout log-prob (Trinity's Clip-B:
# rft.algo.entropy_clip.clipb_keep): they need old_logprobs recompute and rollout log-probs.
ENTROPY_TOKEN_FILTER = frozenset({"clipb"})
# advantage_fn names whose std_threshold drops whole groups before a step (Trinity's group
# skip; rft.trainer.experience_ops.std_threshold_filter), and of them those whose groups are
# compared by their runs' last-step rewards.
STD_THRESHOLD_SKIP = frozenset({"grpo", "step_wise_grpo"})
# LoRA: the max_lora_rank values vLLM 0.32 accepts (vllm.config.lora.MaxLoRARanks); the engine
# rounds lora_rank up to the next one, the config rules refuse a rank above the last.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)

# synchronizer.sync_style: Trinity's SyncStyle values (trinity/common/constants.py), and its
# SyncStyleEnumMeta.name_aliases, the older names of the two dynamic styles.
SYNC_STYLES = ("fixed", "explorer_driven", "trainer_driven")
SYNC_STYLE_ALIASES = {
    "dynamic_by_explorer": "explorer_driven",
    "dynamic_by_trainer": "trainer_driven",
}
