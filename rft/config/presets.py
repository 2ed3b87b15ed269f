"""Algorithm presets: what an ``algorithm.algorithm_type`` implies where the config leaves it unset.

Input: a parsed :class:`~rft.config.Config` and the key paths the user wrote; output: its
``algorithm`` section completed in place (:func:`apply_preset`, then :func:`resolve_old_logprobs`
for M2PO's rollout log-probs), both run by :func:`rft.config.rules.apply`. The tables are
Trinity-RFT's defaults, each with the source it was read from.
"""

from __future__ import annotations

import logging

from rft.config.names import ENTROPY_TOKEN_FILTER, EXPERT_LOSSES, GROUP_BASELINES
from rft.config.schema import Config
from rft.errors import ConfigError

log = logging.getLogger(__name__)

# algorithm_type -> the choices it implies where the config leaves them unset: Trinity-RFT's
# AlgorithmType.default_config() (trinity/algorithm/algorithm.py, v0.5.x main) over its base
# defaults (COMMON_DEFAULTS, from AlgorithmConfigValidator). "ppo" is GAE from a critic, as
# Trinity. Types without advantage_fn train on data, not advantages (sft, raft). "reinforce" is
# rft's own.
PRESETS: dict[str, dict[str, str]] = {
    "sft": dict(policy_loss_fn="sft", kl_loss_fn="none", entropy_loss_fn="none"),
    "ppo": dict(advantage_fn="ppo"),
    "grpo": dict(advantage_fn="grpo"),
    # Trinity's grpo_verl: GRPO with veRL's batch advantage (grpo_verl: epsilon only)
    "grpo_verl": dict(advantage_fn="grpo_verl"),
    # DAPO (agentscope-ai/Trinity-RFT@0fcd37e algorithm.py): GRPO's advantage and PPO's loss
    # without KL; its clip-higher, token-mean loss, overlong reward shaping and dynamic sampling
    # are the example's own keys (policy_loss_fn_args, reward_fn_args, data_processor).
    "dapo": dict(advantage_fn="grpo", kl_loss_fn="none"),
    "reinforceplusplus": dict(advantage_fn="reinforceplusplus"),
    "rloo": dict(advantage_fn="rloo"),
    "reinforce": dict(advantage_fn="reinforce", kl_loss_fn="none", entropy_loss_fn="none"),
    "opmd": dict(advantage_fn="opmd", policy_loss_fn="opmd"),
    "asymre": dict(
        advantage_fn="asymre", policy_loss_fn="opmd", kl_loss_fn="none", entropy_loss_fn="none"
    ),
    "topr": dict(advantage_fn="reinforce", policy_loss_fn="topr"),
    "cispo": dict(advantage_fn="grpo", policy_loss_fn="cispo"),
    "gspo": dict(advantage_fn="grpo", policy_loss_fn="gspo"),
    "sapo": dict(advantage_fn="grpo", policy_loss_fn="sapo"),
    "mix": dict(
        advantage_fn="grpo", policy_loss_fn="mix", sample_strategy="mix", entropy_loss_fn="mix"
    ),
    "mix_chord": dict(
        advantage_fn="grpo",
        policy_loss_fn="mix_chord",
        sample_strategy="mix",
        entropy_loss_fn="mix",
    ),
    "raft": dict(policy_loss_fn="sft", kl_loss_fn="none", entropy_loss_fn="none"),
    "sppo": dict(
        advantage_fn="opmd", policy_loss_fn="sppo", kl_loss_fn="none", entropy_loss_fn="none"
    ),
    "rec": dict(advantage_fn="rec", policy_loss_fn="rec"),
    "dpo": dict(policy_loss_fn="dpo"),  # pairs from a dataset (mode train), rft.trainer.dpo
    # Trinity's: one experience per step of a workflow's run, the run's last reward broadcast.
    "multi_step_grpo": dict(advantage_fn="step_wise_grpo"),
    # GiGPO (agentscope-ai/Trinity-RFT@0fcd37e GiGPOAlgorithm): episode + anchor-state step
    # advantages of step-wise runs; its preset's advantage/loss args are the functions' defaults.
    "gigpo": dict(advantage_fn="gigpo"),
    # A teacher's log-probs of the student's samples as advantages (no reward, no KL term);
    # the teacher is explorer.auxiliary_models[0] (rft.explorer.teacher).
    **{
        t: dict(advantage_fn=t, kl_loss_fn="none", entropy_loss_fn="none")
        for t in ("on_policy_distill", "jsd")
    },
    # M2PO (agentscope-ai/Trinity-RFT@402adb2 M2POAlgorithm, as its
    # tests/algorithm/test_m2po_policy_loss.py pins it): GRPO's advantage, the M2PO loss, no
    # reference model, no entropy term; its old log-probs are the rollout's
    # (_resolve_old_logprobs).
    "m2po": dict(
        advantage_fn="grpo", policy_loss_fn="m2po", kl_loss_fn="none", entropy_loss_fn="none"
    ),
}
# Trinity's base defaults under every type's (its "warmup" sample strategy is no type's now).
COMMON_DEFAULTS = dict(
    policy_loss_fn="ppo",
    kl_loss_fn="k2",
    kl_penalty_fn="none",
    entropy_loss_fn="default",
    sample_strategy="default",
    loss_agg_mode="token-mean",
)
# Trinity's default_config() repeat_times per type (rft's algorithm.repeat_times default stays
# 1): named in the warning for a group-baseline advantage with groups of one.
REPEAT_TIMES: dict[str, int] = {
    **{t: 2 for t in PRESETS if "advantage_fn" in PRESETS[t]},
    **dict.fromkeys(
        ("mix", "mix_chord", "multi_step_grpo", "on_policy_distill", "jsd", "m2po", "gigpo"), 8
    ),
    "dapo": 16,
    "ppo": 1,
}
del REPEAT_TIMES["reinforce"]  # rft's own type: no Trinity default
PRESET_KEYS = tuple(
    dict.fromkeys(key for preset in (*PRESETS.values(), COMMON_DEFAULTS) for key in preset)
)


def apply_preset(cfg: Config) -> None:
    """Fill the choices ``algorithm_type`` implies; refuse a loss without what it needs."""
    algo = cfg.algorithm
    preset = {**COMMON_DEFAULTS, **PRESETS[algo.algorithm_type]}
    for key in PRESET_KEYS:
        if getattr(algo, key) is None and key in preset:
            setattr(algo, key, preset[key])
    if algo.policy_loss_fn not in ("sft", "dpo") and algo.advantage_fn is None:
        raise ConfigError(
            f"algorithm.advantage_fn must be set for algorithm_type '{algo.algorithm_type}' "
            f"(policy_loss_fn {algo.policy_loss_fn!r} trains on advantages)"
        )
    if algo.policy_loss_fn in EXPERT_LOSSES and algo.sample_strategy != "mix":
        raise ConfigError(
            f"algorithm.policy_loss_fn '{algo.policy_loss_fn}' needs expert data: set "
            "algorithm.sample_strategy=mix (and buffer.trainer_input.auxiliary_buffers)"
        )
    if algo.advantage_fn in GROUP_BASELINES and algo.repeat_times < 2:
        log.warning(
            "algorithm.repeat_times=1 with advantage_fn %s: every group has one sample, so "
            "there is no baseline to compare with and nothing is learned; Trinity's %s preset "
            "suggests repeat_times: %d",
            algo.advantage_fn,
            algo.algorithm_type,
            REPEAT_TIMES.get(algo.algorithm_type, 2),
        )


def resolve_old_logprobs(cfg: Config, seen: set[str]) -> None:
    """Trinity's ``algorithm.bypass_old_logprobs`` is rft's ``old_logprobs`` (true: rollout,
    false: recompute). M2PO's ratio is to the behaviour policy, so its old log-probs are the
    rollout's: set when the config leaves both keys unset, refused otherwise (as Trinity's
    M2POAlgorithm.check_config refuses bypass_old_logprobs: false)."""
    algo = cfg.algorithm
    if algo.bypass_old_logprobs is not None:
        bypass = "rollout" if algo.bypass_old_logprobs else "recompute"
        if "algorithm.old_logprobs" in seen and algo.old_logprobs != bypass:
            raise ConfigError(
                f"algorithm.bypass_old_logprobs={algo.bypass_old_logprobs} contradicts "
                f"algorithm.old_logprobs={algo.old_logprobs!r}; set only one"
            )
        algo.old_logprobs = bypass
    if algo.algorithm_type == "m2po" and algo.policy_loss_fn != "m2po":
        raise ConfigError(
            f"algorithm.algorithm_type m2po needs policy_loss_fn m2po (got "
            f"{algo.policy_loss_fn!r}); remove algorithm.policy_loss_fn, or choose another type"
        )
    if algo.advantage_fn in ENTROPY_TOKEN_FILTER and algo.old_logprobs != "recompute":
        raise ConfigError(
            f"algorithm.advantage_fn {algo.advantage_fn} filters tokens by the policy's entropy "
            "from the trainer's old-log-prob pass, which old_logprobs rollout (Trinity's "
            "bypass_old_logprobs / rollout_correction.bypass_mode: true) skips; set "
            "algorithm.old_logprobs: recompute (as Trinity's example requires bypass_mode: false)"
        )
    if algo.policy_loss_fn != "m2po":
        return
    written = {"algorithm.old_logprobs", "algorithm.bypass_old_logprobs"} & seen
    if algo.old_logprobs != "rollout" and written:
        raise ConfigError(
            "policy_loss_fn m2po takes the ratio to the rollout's behaviour policy, but the "
            "old log-probs are recomputed; set algorithm.bypass_old_logprobs: true (or "
            "algorithm.old_logprobs: rollout)"
        )
    algo.old_logprobs = "rollout"
