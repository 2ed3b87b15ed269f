"""Rules applied after a config is parsed: derived values, conflicts, unsupported keys.

Input: a typed :class:`~rft.config.Config` and the key paths the user wrote; output: the same
object completed in place, every default a consumer needs resolved here. :func:`apply` runs
them all, in order: the algorithm presets (:mod:`rft.config.presets`), veRL's section
(:mod:`rft.config.verl_rules`), Trinity's newer keys (:mod:`rft.config.trinity_rules`), the
inputs' rules (:mod:`rft.config.buffer_rules`) and this module's checks. A derived value fills
only a key the user left unset; contradicting values raise :class:`ConfigError` naming both
keys; options rft recognises but does not implement raise :class:`NotSupportedError`. What the
runtime reads from the result is in :mod:`rft.config.queries`.
"""

from __future__ import annotations

import logging

from rft.config.auxiliary import check_auxiliary_models
from rft.config.buffer_rules import check_experience_pipeline, check_inputs, infer_file_storage
from rft.config.gpus import check_gpu_split
from rft.config.mix import mix_counts
from rft.config.mix_args import check_mix_batch_args
from rft.config.names import SYNC_STYLE_ALIASES, TIS_THRESHOLD, VLLM_LORA_RANKS
from rft.config.presets import apply_preset, resolve_old_logprobs
from rft.config.queries import lora_config, streams, uses_critic
from rft.config.schema import Config
from rft.config.teacher import uses_teacher
from rft.config.trinity_rules import apply_trinity_keys, check_resumed_parts
from rft.config.typed_dict import not_supported
from rft.config.verl_rules import apply_verl_trainer_config
from rft.errors import ConfigError, NotSupportedError
from rft.placement import EXPLORER_MODES

log = logging.getLogger(__name__)


def apply(cfg: Config, seen: set[str]) -> None:
    """Complete and check ``cfg`` in place; ``seen`` holds the key paths the user set."""
    check_not_supported(cfg)
    apply_preset(cfg)
    resolve_old_logprobs(cfg, seen)
    apply_verl_trainer_config(cfg, seen)
    apply_trinity_keys(cfg, seen)
    _derive_critic(cfg, seen)
    _check_lora(cfg)
    _derive_zero_stage(cfg, seen)
    check_resumed_parts(cfg)
    _derive_micro_batch_sizes(cfg)
    _derive_totals(cfg)
    _derive_lengths(cfg)
    _derive_runner_num(cfg, seen)
    infer_file_storage(cfg, seen)
    check_inputs(cfg)
    _check_trainer(cfg)
    _check_rollout_correction(cfg)
    _check_lead(cfg)
    _check_delta(cfg, seen)
    _check_partial_rollout(cfg)
    _check_teacher(cfg)
    check_experience_pipeline(cfg)
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
        log.warning(
            "model.logprobs / rollout_args.logprobs > 0 has no effect on what is trained (as in "
            "Trinity, which keeps the sampled token's log-prob of vLLM's top-k list too; rft "
            "always records it): vLLM only computes the k others per token; set 0 to save that"
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
