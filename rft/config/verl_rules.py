"""veRL's section of a config (``trainer.trainer_config``) mapped onto rft's keys.

Input: a parsed :class:`~rft.config.Config` and the key paths the user wrote; output: the veRL
spellings Trinity's examples use copied onto ``trainer.*`` / ``algorithm.*`` in place
(:func:`apply_verl_trainer_config`, run by :func:`rft.config.rules.apply`), a conflicting value
written on both sides refused (:func:`set_from_verl`). The keys that have no effect are taken out
before the schema check, by :mod:`rft.config.verl_keys`.
"""

from __future__ import annotations

import logging

from rft.config.schema import Config
from rft.config.typed_dict import not_supported
from rft.errors import ConfigError

log = logging.getLogger(__name__)


def apply_verl_trainer_config(cfg: Config, seen: set[str]) -> None:
    """Copy the veRL-style keys under ``trainer.trainer_config`` onto rft's ``trainer.*`` (and
    ``algorithm.*``) keys; a different value the user wrote there too is a conflict."""
    arr = cfg.trainer.trainer_config.actor_rollout_ref
    if cfg.trainer.trainer_type == "verl":
        log.info(
            "trainer.trainer_type 'verl': rft trains with DeepSpeed ZeRO; veRL-style "
            "trainer.trainer_config keys are mapped onto trainer.*"
        )
    pairs = [
        (
            "actor_rollout_ref.model.use_remove_padding",
            arr.model.use_remove_padding,
            "trainer.padding_free",
        ),
        (
            "actor_rollout_ref.model.enable_gradient_checkpointing",
            arr.model.enable_gradient_checkpointing,
            "trainer.gradient_checkpointing",
        ),
        (
            "actor_rollout_ref.actor.fsdp_config.param_offload",
            arr.actor.fsdp_config.param_offload,
            "trainer.param_offload",
        ),
        (
            "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
            arr.actor.fsdp_config.optimizer_offload,
            "trainer.optimizer_offload",
        ),
        (
            "actor_rollout_ref.ref.fsdp_config.param_offload",
            arr.ref.fsdp_config.param_offload,
            "trainer.ref_offload",
        ),
        (
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
            arr.actor.ppo_micro_batch_size_per_gpu,
            "trainer.micro_batch_size_per_gpu",
        ),
        ("actor_rollout_ref.actor.ppo_epochs", arr.actor.ppo_epochs, "trainer.ppo_epochs"),
        ("actor_rollout_ref.actor.grad_clip", arr.actor.grad_clip, "trainer.grad_clip"),
        (
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
            arr.rollout.log_prob_micro_batch_size_per_gpu,
            "trainer.log_prob_micro_batch_size_per_gpu",
        ),
        *_verl_aliases(cfg),
        *_verl_log_prob_passes(cfg),
    ]
    for verl_key, value, ours in pairs:
        set_from_verl(cfg, verl_key, value, ours, seen)
    _check_alg_type(cfg)


# Trinity 0.1's actor.alg_type -> the policy loss it selected (its examples' veRL files).
_ALG_TYPE_LOSS = {"ppo": "ppo", "opmd": "opmd", "dpo": "dpo", "sft": "sft"}


def _check_alg_type(cfg: Config) -> None:
    """``actor.alg_type`` has no effect when it names the loss the algorithm uses already."""
    alg_type = cfg.trainer.trainer_config.actor_rollout_ref.actor.alg_type
    if alg_type is None:
        return
    key = "trainer.trainer_config.actor_rollout_ref.actor.alg_type"
    if alg_type not in _ALG_TYPE_LOSS:
        raise not_supported(
            f"{key}: {alg_type}",
            "Trinity 0.1's pairwise OPMD is not built in rft; set algorithm.algorithm_type: opmd",
        )
    loss = cfg.algorithm.policy_loss_fn
    if _ALG_TYPE_LOSS[alg_type] != loss:
        raise ConfigError(
            f"{key}={alg_type!r} (Trinity 0.1's loss switch) contradicts "
            f"algorithm.policy_loss_fn={loss!r}; remove alg_type (algorithm.algorithm_type "
            "chooses the loss)"
        )


def _verl_log_prob_passes(cfg: Config) -> list[tuple[str, object, str]]:
    """veRL's old-policy (rollout.*) and reference (ref.*) log-prob batching -> rft's one
    batching of both passes: the smaller token budget when the two differ (log-probs do not
    depend on it; memory does), dynamic batching when either asks for it."""
    arr = cfg.trainer.trainer_config.actor_rollout_ref
    out: list[tuple[str, object, str]] = []
    for name, ours, pick in (
        ("log_prob_max_token_len_per_gpu", "trainer.log_prob_max_token_len_per_gpu", min),
        ("log_prob_use_dynamic_bsz", "trainer.log_prob_use_dynamic_bsz", any),
    ):
        given = {
            f"actor_rollout_ref.{part}.{name}": getattr(getattr(arr, part), name)
            for part in ("rollout", "ref")
            if getattr(getattr(arr, part), name) is not None
        }
        if not given:
            continue
        value = pick(given.values())
        if len(set(given.values())) > 1:
            log.info("%s differ (%s): rft batches both passes alike, with %r", name, given, value)
        out.append((" and ".join(given), value, ours))
    return out


def _verl_aliases(cfg: Config) -> list[tuple[str, object, str]]:
    """veRL keys of Trinity's examples that name a trainer.* or algorithm.* setting."""
    arr, verl = cfg.trainer.trainer_config.actor_rollout_ref, cfg.trainer.trainer_config
    actor = arr.actor
    return [
        (
            "actor_rollout_ref.actor.use_dynamic_bsz",
            actor.use_dynamic_bsz,
            "trainer.use_dynamic_bsz",
        ),
        (
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
            actor.ppo_max_token_len_per_gpu,
            "trainer.max_token_len_per_gpu",
        ),
        (
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
            actor.ulysses_sequence_parallel_size,
            "trainer.ulysses_sequence_parallel_size",
        ),
        ("actor_rollout_ref.actor.optim", actor.optim, "algorithm.optimizer"),
        (
            "actor_rollout_ref.actor.engine.param_offload",
            actor.engine.param_offload,
            "trainer.param_offload",
        ),
        (
            "actor_rollout_ref.actor.engine.optimizer_offload",
            actor.engine.optimizer_offload,
            "trainer.optimizer_offload",
        ),
        (
            "actor_rollout_ref.ref.engine.param_offload",
            arr.ref.engine.param_offload,
            "trainer.ref_offload",
        ),
        (
            "trainer.max_actor_ckpt_to_keep",
            verl.trainer.max_actor_ckpt_to_keep or verl.trainer.max_critic_ckpt_to_keep,
            "trainer.max_checkpoints_to_keep",
        ),
    ]


def set_from_verl(cfg: Config, verl_key: str, value: object, ours: str, seen: set[str]) -> None:
    """Copy a veRL-style setting onto rft's key; a different explicit value is a conflict."""
    if value is None:
        return
    section, name = ours.split(".")
    target = getattr(cfg, section)
    current = getattr(target, name)
    if ours in seen and current != value:
        raise ConfigError(
            f"trainer.trainer_config.{verl_key}={value!r} contradicts "
            f"{ours}={current!r}; set only one of them"
        )
    setattr(target, name, value)
