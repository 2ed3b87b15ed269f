"""Rules applied after a config is parsed: presets, derived values, conflicts, unsupported keys.

Input: a typed :class:`~rft.config.Config` and the key paths the user wrote; output: the same
object completed in place, every default a consumer needs resolved here. A derived value fills
only a key the user left unset; contradicting values raise :class:`ConfigError` naming both
keys; options rft recognises but does not implement raise :class:`NotSupportedError`.
"""

from __future__ import annotations

import logging
from pathlib import Path

from rft.config.auxiliary import auxiliary_tp, check_auxiliary_models
from rft.config.gpus import split_gpus
from rft.config.mix import mix_counts
from rft.config.mix_args import check_mix_batch_args
from rft.config.names import (
    EXPERT_LOSSES,
    GROUP_BASELINES,
    NEEDS_CRITIC,
    SYNC_STYLE_ALIASES,
    TIS_THRESHOLD,
    VLLM_LORA_RANKS,
)
from rft.config.schema import Config, LoRAConfig, TasksetConfig
from rft.config.teacher import uses_teacher
from rft.config.trinity_rules import apply_trinity_keys, check_resumed_parts
from rft.config.trinity_rules import set_from_verl as _set_from_verl
from rft.config.typed_dict import not_supported
from rft.errors import ConfigError, NotSupportedError
from rft.placement import EXPLORER_MODES, task_gpus

log = logging.getLogger(__name__)

# algorithm_type -> the choices it implies where the config leaves them unset: Trinity-RFT's
# AlgorithmType.default_config() (trinity/algorithm/algorithm.py, v0.5.x main) over its base
# defaults (_COMMON, from AlgorithmConfigValidator). "ppo" is GAE from a critic, as Trinity.
# Types without advantage_fn train on data, not advantages (sft, raft). "reinforce" is rft's own.
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
_COMMON = dict(
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
PRESET_KEYS = tuple(dict.fromkeys(key for preset in (*PRESETS.values(), _COMMON) for key in preset))


def apply(cfg: Config, seen: set[str]) -> None:
    """Complete and check ``cfg`` in place; ``seen`` holds the key paths the user set."""
    check_not_supported(cfg)
    _apply_preset(cfg)
    _resolve_old_logprobs(cfg, seen)
    _apply_verl_trainer_config(cfg, seen)
    apply_trinity_keys(cfg, seen)
    _derive_critic(cfg, seen)
    _check_lora(cfg)
    _derive_zero_stage(cfg, seen)
    check_resumed_parts(cfg)
    _derive_micro_batch_sizes(cfg)
    _derive_totals(cfg)
    _derive_lengths(cfg)
    _derive_runner_num(cfg, seen)
    _infer_file_storage(cfg, seen)
    _check_inputs(cfg)
    _check_trainer(cfg)
    _check_rollout_correction(cfg)
    _check_lead(cfg)
    _check_delta(cfg, seen)
    _check_partial_rollout(cfg)
    _check_teacher(cfg)
    _check_experience_pipeline(cfg)
    check_auxiliary_models(cfg)
    check_gpu_split(cfg)
    _check_monitor(cfg)
    if cfg.algorithm.sample_strategy == "mix":
        check_mix_batch_args(cfg, mix_counts(cfg))  # rollouts + expert samples of a mini-batch


def check_not_supported(cfg: Config) -> None:
    """Raise for Trinity choices rft reads but does not implement; say which keys have no effect.
    (Keys rft lacks altogether are refused by name at parsing: rft.config.known_names.)"""
    sync = cfg.synchronizer
    if sync.sync_method == "memory":
        raise not_supported(
            "synchronizer.sync_method: memory",
            "use nccl (weights broadcast from the trainer to the explorers) or checkpoint "
            "(weights/vNNNNNN folders on the shared filesystem)",
        )
    sync.sync_style = SYNC_STYLE_ALIASES.get(sync.sync_style, sync.sync_style)
    if sync.sync_style != "fixed" and sync.sync_offset:
        log.warning(
            "synchronizer.sync_offset=%d has no effect with sync_style %s (as in Trinity: only "
            "the fixed style waits for a version); synchronizer.max_lead_steps bounds how far "
            "explorers run ahead",
            sync.sync_offset,
            sync.sync_style,
        )


def _check_experience_pipeline(cfg: Config) -> None:
    """The experience operators act where the trainer reads rollouts (rft.trainer.inputs), not
    in the explorer as in Trinity: refused where they would do nothing."""
    pipeline = cfg.data_processor.experience_pipeline
    if pipeline is None or not pipeline.operators:
        return
    key = "data_processor.experience_pipeline.operators"
    if cfg.mode == "explore":
        raise not_supported(
            f"{key} in mode explore",
            "rft applies them in the trainer as it reads each batch (the explorer writes every "
            "experience): move them to the trainer's config (mode train)",
        )
    if cfg.buffer.trainer_input.experience_buffer.storage_type == "file":
        raise ConfigError(
            f"{key}: they act on rollouts, but this trainer reads a dataset "
            "(buffer.trainer_input.experience_buffer.storage_type: file); remove them"
        )
    if cfg.mode == "both" and any(op.name == "dapo_dynamic_sampling" for op in pipeline.operators):
        log.warning(
            "dapo_dynamic_sampling in mode both: each step trains on the groups it keeps from its "
            "own rollouts (no refill from later steps, unlike Trinity's queue); for full batches "
            "run mode explore + mode train with the operators in the trainer's config"
        )


def _check_teacher(cfg: Config) -> None:
    """A distillation advantage (on_policy_distill, jsd) scores the rollouts with one teacher,
    ``explorer.auxiliary_models[0]`` (Trinity's first auxiliary model), and no reward model."""
    algo, models = cfg.algorithm, cfg.explorer.auxiliary_models
    if not uses_teacher(cfg) or cfg.mode not in EXPLORER_MODES:
        return
    if len(models) != 1:
        raise ConfigError(
            f"algorithm.advantage_fn {algo.advantage_fn} needs exactly one teacher in "
            f"explorer.auxiliary_models (it has {len(models)}): set explorer.auxiliary_models: "
            "[{model_path: <a causal LM sharing the student's tokenizer>}]"
        )


def _check_monitor(cfg: Config) -> None:
    kinds = cfg.monitor.monitor_type
    if isinstance(kinds, list) and (not kinds or len(set(kinds)) < len(kinds)):
        raise ConfigError(
            f"monitor.monitor_type: {kinds!r} must name each monitor once, and at "
            "least one: e.g. tensorboard, or [tensorboard, wandb]"
        )


def _apply_preset(cfg: Config) -> None:
    algo = cfg.algorithm
    preset = {**_COMMON, **PRESETS[algo.algorithm_type]}
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


def _resolve_old_logprobs(cfg: Config, seen: set[str]) -> None:
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


def _apply_verl_trainer_config(cfg: Config, seen: set[str]) -> None:
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
        _set_from_verl(cfg, verl_key, value, ours, seen)
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


def lora_config(cfg: Config) -> LoRAConfig | None:
    """The run's LoRA adapter (``model.lora_configs``, one entry), or None: full fine-tuning."""
    return cfg.model.lora_configs[0] if cfg.model.lora_configs else None


def _check_lora(cfg: Config) -> None:
    configs = cfg.model.lora_configs
    if configs is None:
        return
    if not configs:
        raise ConfigError(
            "model.lora_configs: [] names no adapter; give one entry (lora_rank, "
            "lora_alpha...) or remove the key to train the whole model"
        )
    if len(configs) > 1:
        raise NotSupportedError(
            f"model.lora_configs: {len(configs)} adapters is not supported yet; "
            "rft trains one adapter (as Trinity): keep one entry"
        )
    lora = configs[0]
    if lora.lora_rank > VLLM_LORA_RANKS[-1]:
        raise ConfigError(
            f"model.lora_configs[0].lora_rank={lora.lora_rank}: vLLM serves adapters "
            f"up to rank {VLLM_LORA_RANKS[-1]}; lower it"
        )
    if lora.train_embeddings:
        raise NotSupportedError(
            "model.lora_configs[0].train_embeddings: true is not supported yet: "
            "vLLM serves adapters of linear layers only; set it to false"
        )
    if lora.base_model_name is not None:
        log.info(
            "model.lora_configs[0].base_model_name has no effect: the base model is "
            "model.model_path"
        )


def read_timeout(cfg: Config) -> tuple[float, str]:
    """Seconds the trainer waits for experiences, and the key that says so: the experience
    buffer's ``max_read_timeout`` (Trinity's queue read timeout) or ``synchronizer.sync_timeout``."""
    buf = cfg.buffer.trainer_input.experience_buffer
    if buf.max_read_timeout is not None:
        return buf.max_read_timeout, "buffer.trainer_input.experience_buffer.max_read_timeout"
    return float(cfg.synchronizer.sync_timeout), "synchronizer.sync_timeout"


def uses_critic(cfg: Config) -> bool:
    """Whether the run trains a value model: ``advantage_fn: ppo`` (GAE needs values)."""
    return cfg.algorithm.advantage_fn in NEEDS_CRITIC


def _derive_critic(cfg: Config, seen: set[str]) -> None:
    """``critic.model.path`` -> ``model.critic_model_path`` (default: the policy's folder, as in
    Trinity); critic keys without a critic have no effect (warned), a warm-up without one is
    an error."""
    path = cfg.trainer.trainer_config.critic.model.path
    if path is not None:
        if "model.critic_model_path" in seen and cfg.model.critic_model_path != path:
            raise ConfigError(
                f"trainer.trainer_config.critic.model.path={path!r} contradicts "
                f"model.critic_model_path={cfg.model.critic_model_path!r}; set only one"
            )
        cfg.model.critic_model_path = path
    warmup = cfg.trainer.trainer_config.trainer.critic_warmup
    if uses_critic(cfg):
        if cfg.model.critic_model_path is None:
            cfg.model.critic_model_path = cfg.model.model_path
        return
    if warmup:
        raise ConfigError(
            f"trainer.trainer_config.trainer.critic_warmup={warmup} needs a critic: "
            f"set algorithm.advantage_fn: ppo (GAE), or set critic_warmup to 0 "
            f"(advantage_fn is {cfg.algorithm.advantage_fn!r})"
        )
    critic_keys = sorted(
        k
        for k in seen
        if k == "model.critic_model_path" or k.startswith("trainer.trainer_config.critic.")
    )
    if critic_keys:
        log.warning(
            "%s: no effect, advantage_fn %r trains no critic (only advantage_fn: ppo does)",
            ", ".join(critic_keys),
            cfg.algorithm.advantage_fn,
        )


def _derive_zero_stage(cfg: Config, seen: set[str]) -> None:
    """Parameter offload exists only in ZeRO-3: asking for it with the stage unset selects 3."""
    t = cfg.trainer
    if t.param_offload and "trainer.zero_stage" not in seen and t.zero_stage != 3:
        log.info(
            "trainer.param_offload: true selects trainer.zero_stage=3 (parameters are "
            "partitioned, hence offloadable, only in ZeRO-3)"
        )
        t.zero_stage = 3


def _derive_micro_batch_sizes(cfg: Config) -> None:
    """The log-prob passes and the critic take ``trainer.micro_batch_size_per_gpu`` where unset."""
    t = cfg.trainer
    critic = t.trainer_config.critic
    if t.log_prob_micro_batch_size_per_gpu is None:
        t.log_prob_micro_batch_size_per_gpu = t.micro_batch_size_per_gpu
    if t.log_prob_use_dynamic_bsz is None:
        t.log_prob_use_dynamic_bsz = t.use_dynamic_bsz
    if t.log_prob_max_token_len_per_gpu is None:
        t.log_prob_max_token_len_per_gpu = t.max_token_len_per_gpu
    if critic.ppo_micro_batch_size_per_gpu is None:
        critic.ppo_micro_batch_size_per_gpu = t.micro_batch_size_per_gpu


def _infer_file_storage(cfg: Config, seen: set[str]) -> None:
    """Trinity's SFT stages give the experience buffer a dataset path and no storage_type."""
    buf = cfg.buffer.trainer_input.experience_buffer
    written = "buffer.trainer_input.experience_buffer.storage_type" in seen
    if not written and buf.path and not buf.path.startswith("sqlite:///"):
        buf.storage_type = "file"


def _derive_totals(cfg: Config) -> None:
    buf, algo = cfg.buffer, cfg.algorithm
    if buf.train_batch_size is None:
        buf.train_batch_size = buf.batch_size * algo.repeat_times
    elif (
        algo.algorithm_type != "sft"
        and algo.sample_strategy != "mix"  # mix: rft.config.mix
        and buf.train_batch_size % algo.repeat_times
    ):
        raise ConfigError(
            f"buffer.train_batch_size={buf.train_batch_size} is not a multiple of "
            f"algorithm.repeat_times={algo.repeat_times}: a group of samples is never split "
            f"across gradient steps; use e.g. {buf.batch_size * algo.repeat_times}"
        )
    trainer_steps = cfg.trainer.total_steps
    if trainer_steps is not None:
        if buf.total_steps is not None and buf.total_steps != trainer_steps:
            raise ConfigError(
                f"buffer.total_steps={buf.total_steps} contradicts "
                f"trainer.total_steps={trainer_steps}; set only one"
            )
        buf.total_steps = trainer_steps


def _derive_lengths(cfg: Config) -> None:
    model = cfg.model
    prompt, response, total = (
        model.max_prompt_tokens,
        model.max_response_tokens,
        model.max_model_len,
    )
    if total is not None and response is not None and response >= total:
        raise ConfigError(
            f"model.max_response_tokens={response} leaves no room for the prompt in "
            f"model.max_model_len={total}"
        )
    if total is not None and prompt is None and response is not None:
        model.max_prompt_tokens = total - response
    elif total is None and prompt is not None and response is not None:
        model.max_model_len = prompt + response
    elif None not in (prompt, response, total) and prompt + response > total:
        raise ConfigError(
            f"model.max_prompt_tokens + model.max_response_tokens = "
            f"{prompt + response} exceeds model.max_model_len={total}"
        )
    rollout = cfg.explorer.rollout_model
    if rollout.max_model_len is None:
        rollout.max_model_len = model.max_model_len


def _derive_runner_num(cfg: Config, seen: set[str]) -> None:
    explorer = cfg.explorer
    if explorer.runner_num is None:
        return
    if "explorer.runner_per_model" in seen and explorer.runner_per_model != explorer.runner_num:
        raise ConfigError(
            f"explorer.runner_num={explorer.runner_num} contradicts "
            f"explorer.runner_per_model={explorer.runner_per_model}; set only one"
        )
    explorer.runner_per_model = explorer.runner_num


def _check_inputs(cfg: Config) -> None:
    inputs = cfg.buffer.explorer_input
    if inputs.taskset is not None and inputs.tasksets:
        raise ConfigError(
            "set buffer.explorer_input.taskset or buffer.explorer_input.tasksets, not both"
        )
    if not cfg.model.model_path:
        raise ConfigError("model.model_path is empty: set it to a local Hugging Face model folder")
    needs_tasks = cfg.mode in ("both", "explore") and cfg.algorithm.algorithm_type != "sft"
    if needs_tasks and not cfg.training_tasksets():
        raise ConfigError(
            f"mode '{cfg.mode}' generates experiences but no taskset is configured: "
            "set buffer.explorer_input.taskset (path, split, format)"
        )
    if cfg.mode == "bench" and not inputs.eval_tasksets:
        raise ConfigError(
            "mode 'bench' evaluates checkpoints on buffer.explorer_input."
            "eval_tasksets, which is empty"
        )
    for label, taskset in cfg.labelled_tasksets():
        if not taskset.path:
            raise ConfigError(f"{label}.path is empty: set it to a dataset folder or file")
        _check_rollout_n(cfg, label, taskset)
    _check_experience_buffer(cfg)


def _check_rollout_n(cfg: Config, label: str, taskset: TasksetConfig) -> None:
    """Trinity overwrites ``rollout_args.n`` with the repeat count (its config says DO NOT SET):
    accepted when equal, an error when it would ask for another count."""
    n, repeat = taskset.rollout_args.n, taskset.repeat_times or cfg.algorithm.repeat_times
    if n is not None and n != repeat:
        where = f"{label}.repeat_times" if taskset.repeat_times else "algorithm.repeat_times"
        raise ConfigError(
            f"{label}.rollout_args.n={n} contradicts {where}={repeat}: Trinity sets n from "
            "repeat_times (samples per task) and ignores n; set repeat_times and remove n"
        )


def _check_experience_buffer(cfg: Config) -> None:
    buf = cfg.buffer.trainer_input.experience_buffer
    key = "buffer.trainer_input.experience_buffer"
    if cfg.algorithm.policy_loss_fn == "dpo" and (
        cfg.mode != "train" or buf.storage_type != "file" or not buf.path
    ):
        raise ConfigError(
            "algorithm.policy_loss_fn 'dpo' trains on a dataset of preference pairs: set mode: "
            f"train and {key}.path to the dataset (storage_type: file); got mode "
            f"{cfg.mode!r}, storage_type {buf.storage_type!r}, path {buf.path!r}"
        )
    if buf.storage_type == "sql" and cfg.cluster.node_num > 1:
        raise ConfigError(
            f"{key}.storage_type 'sql' uses SQLite as the transport, whose locking is unreliable "
            f"on network filesystems (NFS, Lustre), and cluster.node_num={cfg.cluster.node_num}. "
            "Use storage_type: queue (sealed segments; add path: sqlite:///x.db to also archive "
            "consumed experiences in SQLite)"
        )
    if buf.storage_type == "sql" and not (buf.path or "").startswith("sqlite:///"):
        raise ConfigError(f"{key}.path must be sqlite:///<file>.db with storage_type 'sql'")
    if buf.storage_type == "queue" and buf.path and not buf.path.startswith("sqlite:///"):
        raise ConfigError(
            f"{key}.path={buf.path!r}: with storage_type 'queue' the path is "
            "optional and, when set, must be sqlite:///<file>.db (an archive)"
        )
    if buf.storage_type == "file":
        if cfg.mode != "train":
            raise ConfigError(
                f"{key}.storage_type 'file' (a fixed dataset of experiences) needs "
                f"mode 'train', not '{cfg.mode}'"
            )
        if not buf.path:
            raise ConfigError(f"{key}.path is empty: set it to the SFT dataset folder or file")
    for name, aux in cfg.buffer.trainer_input.auxiliary_buffers.items():
        if aux.storage_type != "file" or not aux.path:
            raise ConfigError(
                f"buffer.trainer_input.auxiliary_buffers.{name}: expert data must "
                "be storage_type: file with a path to a dataset"
            )
    if cfg.algorithm.sample_strategy == "mix" and not cfg.buffer.trainer_input.auxiliary_buffers:
        raise ConfigError(
            "algorithm.sample_strategy 'mix' mixes in expert data: set "
            "buffer.trainer_input.auxiliary_buffers.<name> (storage_type: file, path)"
        )


def _check_trainer(cfg: Config) -> None:
    t = cfg.trainer
    if t.gradient_checkpointing_every > 1 and not t.gradient_checkpointing:
        log.warning(
            "trainer.gradient_checkpointing_every=%d: no effect, trainer.gradient_checkpointing "
            "is false (no layer recomputes)",
            t.gradient_checkpointing_every,
        )
    if t.compile_layers and t.zero_stage == 3:  # after _derive_zero_stage: param_offload selects 3
        raise NotSupportedError(
            "trainer.compile_layers with ZeRO-3 (trainer.zero_stage 3, or "
            "param_offload) is not supported yet: ZeRO-3 gathers each parameter "
            "in hooks inside the layers, which break compiled graphs. Use "
            "zero_stage 2 (or 1) without param_offload, or compile_layers: false"
        )
    if t.param_offload and t.zero_stage != 3:
        raise ConfigError(
            f"trainer.param_offload needs trainer.zero_stage=3, but trainer.zero_stage="
            f"{t.zero_stage} is set: ZeRO-1/2 keep whole parameters on each GPU; "
            "leave zero_stage unset (param_offload then selects 3) or use "
            "optimizer_offload with ZeRO-1/2"
        )
    tasksets = [taskset for _, taskset in cfg.labelled_tasksets()]
    if cfg.model.logprobs or any(taskset.rollout_args.logprobs for taskset in tasksets):
        raise NotSupportedError(
            "model.logprobs / rollout_args.logprobs > 0: extra top-k log-probs "
            "are not supported yet; rft keeps the sampled token's log-prob "
            "(always on). Remove the key or set it to 0"
        )
    rollout = cfg.explorer.rollout_model
    if rollout.enable_auto_tool_choice and not rollout.tool_call_parser:
        raise ConfigError(
            "explorer.rollout_model.enable_auto_tool_choice needs "
            "explorer.rollout_model.tool_call_parser (a vLLM tool parser, e.g. hermes)"
        )
    if rollout.tool_call_parser and not rollout.enable_auto_tool_choice:
        log.warning(
            "explorer.rollout_model.tool_call_parser=%s: no effect without "
            "enable_auto_tool_choice: true (replies are not parsed for tool calls)",
            rollout.tool_call_parser,
        )


def taskset_temperature(cfg: Config, taskset: TasksetConfig) -> float:
    """The sampling temperature of a taskset: its ``rollout_args.temperature``, else
    ``model.temperature`` (the one rule the explorer samples by and the trainer scores by)."""
    own = taskset.rollout_args.temperature
    return cfg.model.temperature if own is None else own


def scoring_temperature(sampling_temperature: float) -> float:
    """The temperature the trainer divides its logits by to score a rollout sampled at
    ``sampling_temperature``, so that its log-probs and vLLM's describe the same distribution:
    the same, but 1 for greedy (0), the temperature of vLLM's greedy log-probs."""
    return sampling_temperature if sampling_temperature > 0 else 1.0


def _check_rollout_correction(cfg: Config) -> None:
    """``algorithm.rollout_correction``: each key only with the mode it acts in, and a mode only
    with what it needs (rollouts to weight, and old log-probs recomputed by the trainer)."""
    rc, algo, key = cfg.algorithm.rollout_correction, cfg.algorithm, "algorithm.rollout_correction"
    if rc.rollout_is_threshold is not None and rc.mode != "tis":
        raise ConfigError(
            f"{key}.rollout_is_threshold acts only with {key}.mode: tis, but mode is "
            f"{rc.mode!r}; remove it, or set mode: tis"
        )
    if rc.behav_imp_weight_cap is not None and rc.mode != "decoupled":
        raise ConfigError(
            f"{key}.behav_imp_weight_cap acts only with {key}.mode: decoupled, but mode "
            f"is {rc.mode!r}; remove it, or set mode: decoupled"
        )
    if rc.mode == "none":
        return
    if rc.mode == "tis" and rc.rollout_is_threshold is None:
        rc.rollout_is_threshold = TIS_THRESHOLD
    if algo.policy_loss_fn == "sft":
        raise ConfigError(
            f"{key}.mode: {rc.mode} weights rollouts, but policy_loss_fn 'sft' trains on "
            f"data without behaviour log-probs; set {key}.mode: none"
        )
    if algo.old_logprobs == "rollout":
        raise ConfigError(
            f"{key}.mode: {rc.mode} needs old log-probs recomputed at the trainer's "
            "weights (the proximal policy), but algorithm.old_logprobs is 'rollout'; "
            "set algorithm.old_logprobs: recompute"
        )
    sync = cfg.synchronizer
    if cfg.mode == "both" and sync.sync_interval == 1 and sync.sync_offset == 0:
        log.info(
            "%s.mode: %s on an on-policy run (mode both, sync_interval 1, sync_offset 0): "
            "behaviour and proximal weights are the same, so the weights differ from 1 only "
            "by the vLLM/trainer numerical mismatch",
            key,
            rc.mode,
        )


def _check_lead(cfg: Config) -> None:
    """``synchronizer.max_lead_steps`` bounds an asynchronous explorer; say where it does not."""
    sync, buf = cfg.synchronizer, cfg.buffer
    if sync.max_lead_steps is not None and cfg.mode == "both" and sync.sync_style == "fixed":
        log.warning(
            "synchronizer.max_lead_steps has no effect in mode both: there "
            "synchronizer.sync_offset (%d) is how far explorers run ahead",
            sync.sync_offset,
        )
    explored = buf.batch_size * cfg.algorithm.repeat_times
    if (
        sync.max_lead_steps is not None
        and cfg.mode == "explore"
        and buf.train_batch_size is not None
        and buf.train_batch_size > explored
    ):
        log.warning(
            "synchronizer.max_lead_steps counts explorer steps against trainer steps, but an "
            "explorer step here (%d experiences) is smaller than a trainer step "
            "(buffer.train_batch_size=%d): the explorer would wait for weights its own "
            "data cannot produce and stop after synchronizer.sync_timeout; raise "
            "buffer.batch_size to >= %d tasks or unset max_lead_steps",
            explored,
            buf.train_batch_size,
            -(-buf.train_batch_size // cfg.algorithm.repeat_times),
        )


def _check_delta(cfg: Config, seen: set[str]) -> None:
    """``synchronizer.delta_*``: a local folder must not depend on where a task starts; say
    where the keys have no effect."""
    sync = cfg.synchronizer
    local = sync.delta_local_dir
    if local is not None and not (local.startswith("/") or local.startswith("$")):
        raise ConfigError(
            f"synchronizer.delta_local_dir={local!r} is relative: each explorer task would "
            "put its copy wherever it was started; give an absolute node-local folder "
            "(e.g. /tmp/rft or $TMPDIR, read on the node) or leave it unset ($TMPDIR)"
        )
    if not sync.delta_sync:
        for key in ("delta_anchor_interval", "delta_local_dir"):
            if f"synchronizer.{key}" in seen:
                log.warning("synchronizer.%s has no effect without synchronizer.delta_sync", key)
    elif lora_config(cfg) is not None:
        log.warning(
            "synchronizer.delta_sync has no effect with model.lora_configs: adapters (megabytes) "
            "are always published in full"
        )


def streams(cfg: Config) -> bool:
    """Whether the explorer streams (:mod:`rft.explorer.streaming`): ``explorer.partial_rollout``
    in an asynchronous run (``mode: explore``, or ``mode: both`` with ``sync_offset`` >= 1 or a
    dynamic ``sync_style``). A synchronous run generates step s only after the trainer's step
    s - 1: nothing could overlap, so the plain loop runs there."""
    sync = cfg.synchronizer
    asynchronous = cfg.mode == "explore" or sync.sync_offset > 0 or sync.sync_style != "fixed"
    return cfg.explorer.partial_rollout and asynchronous


def _check_partial_rollout(cfg: Config) -> None:
    """``explorer.partial_rollout``: what it cannot do, refused; where it has no effect, said."""
    ex = cfg.explorer
    if not ex.partial_rollout:
        for key in ("max_inflight_samples", "max_version_span"):
            if getattr(ex, key) is not None:
                log.warning("explorer.%s has no effect without explorer.partial_rollout", key)
        return
    spans = lora_config(cfg) is None  # with LoRA a request keeps its adapter: no sample spans
    if streams(cfg) and spans and cfg.algorithm.rollout_correction.mode == "none":
        log.warning(
            "explorer.partial_rollout: samples that span weights versions train as if the "
            "newest policy made them all; algorithm.rollout_correction.mode: tis (or decoupled) "
            "weighs each token by the policy that sampled it"
        )
    if cfg.mode == "both" and not streams(cfg):
        log.warning(
            "explorer.partial_rollout has no effect in a synchronous run (mode both, "
            "synchronizer.sync_offset 0): step s waits for the trainer's step s - 1, nothing "
            "overlaps; set sync_offset >= 1 or run mode explore + mode train"
        )


def check_gpu_split(cfg: Config, mode: str | None = None) -> None:
    """The GPUs of ``mode`` (default: the config's) fit the cluster section: an explorer task
    (its engine, then each auxiliary model's engine or scorer) on one node, the explorers within the cluster,
    and at least one GPU left for a trainer. The config rules and the SLURM job sizing call it."""
    mode = mode or cfg.mode
    rollout, cluster = cfg.explorer.rollout_model, cfg.cluster
    if cluster.gpu_per_node == 0:
        return  # CPU-only cluster description: the local runner decides
    split = split_gpus(cfg, mode)
    per_task = task_gpus(rollout.tensor_parallel_size, auxiliary_tp(cfg))
    scorers = (
        " plus each auxiliary model's tensor_parallel_size" if cfg.explorer.auxiliary_models else ""
    )
    if per_task > cluster.gpu_per_node:
        raise ConfigError(
            f"an explorer task needs {per_task} GPUs (explorer.rollout_model."
            f"tensor_parallel_size {rollout.tensor_parallel_size}{scorers}) but "
            f"cluster.gpu_per_node={cluster.gpu_per_node}: a task's GPUs must be on "
            "one node; lower the tensor_parallel_size of the rollout or auxiliary models"
        )
    whose = (
        f"{split.auxiliary} of them for explorer.auxiliary_models"
        if split.auxiliary
        else "explorer.rollout_model.engine_num x tensor_parallel_size"
    )
    if mode == "both" and split.trainer < 1:
        raise ConfigError(
            f"explorers take {split.explorer} GPUs ({whose}), leaving none of "
            f"cluster.node_num x gpu_per_node = {split.total} for the trainer; lower "
            "engine_num or raise cluster.gpu_per_node/node_num"
        )
    if mode == "explore" and split.explorer > split.total:
        raise ConfigError(
            f"explorers need {split.explorer} GPUs ({whose}) but the cluster section "
            f"has {split.total}; lower explorer.rollout_model.engine_num"
        )
