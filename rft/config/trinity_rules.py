"""Rules for the keys of Trinity-RFT's newer schema (trinity/common/config.py at 1d7fae4, its
main branch and v0.6) that act in rft: the external model's modes, the sync-method and
sample-strategy aliases, the rollout model's copies of model.* keys, Trinity's own trainer.*
spellings, sequence parallelism (its size checked), sample_strategy staleness_control, veRL's
checkpoint contents (and what a resume restores), the per-side sync intervals, parallelism
inside one engine, explorer.max_inflight_batches, model.chat_template_path, the buffers'
format.enable_thinking and data_selector, and the older use_priority_queue switch.

:func:`apply_trinity_keys` runs inside :func:`rft.config.rules.apply`, right after veRL's
section is mapped (so a veRL spelling and Trinity's meet here); :func:`resumed_parts` tells the
trainer what a resume restores. Pure functions of the config (one file read: the chat
template).
"""

from __future__ import annotations

import logging
from pathlib import Path

from rft.config.external import check_external_mode, uses_external_model
from rft.config.known_names import ROLLOUT_MODEL_MIRRORS
from rft.config.queries import uses_critic
from rft.config.schema import Config
from rft.config.teacher import teacher_in_trainer
from rft.config.typed_dict import not_supported
from rft.config.verl_rules import set_from_verl
from rft.errors import ConfigError

log = logging.getLogger(__name__)


def apply_trinity_keys(cfg: Config, seen: set[str]) -> None:
    """Complete and check the newer Trinity keys in place (``seen``: the keys the user set)."""
    check_external_mode(cfg)
    _check_engine_type(cfg)
    sync = cfg.synchronizer  # Trinity's SyncMethodEnumMeta.name_aliases
    sync.sync_method = {"online": "nccl", "offline": "checkpoint"}.get(
        sync.sync_method, sync.sync_method
    )
    _mirror_rollout_model_keys(cfg, seen)
    _trinity_trainer_spellings(cfg, seen)
    _check_sequence_parallel(cfg)
    if cfg.algorithm.sample_strategy == "warmup":  # Trinity's deprecated name of default
        cfg.algorithm.sample_strategy = "default"
    _derive_staleness_control(cfg, seen)
    _check_checkpoint_contents(cfg, seen)
    _check_sync_intervals(cfg)
    _check_engine_parallelism(cfg)
    _derive_inflight_batches(cfg)
    _read_chat_template_path(cfg)
    _derive_buffer_thinking(cfg)
    _check_buffer_selectors(cfg)
    _derive_priority_queue(cfg, seen)


def _mirror_rollout_model_keys(cfg: Config, seen: set[str]) -> None:
    """A length or sampling key written on explorer.rollout_model is model.<key> in rft (one
    value for generation and training); a different model.<key> written too is an error."""
    rollout, model = cfg.explorer.rollout_model, cfg.model
    for key in ROLLOUT_MODEL_MIRRORS:
        value = getattr(rollout, key)
        if value is None:
            continue
        if f"model.{key}" in seen and getattr(model, key) != value:
            raise ConfigError(
                f"explorer.rollout_model.{key}={value!r} contradicts model.{key}="
                f"{getattr(model, key)!r}: rft generates and trains with one value; set only one"
            )
        setattr(model, key, value)


def _check_engine_type(cfg: Config) -> None:
    """``engine_type: external`` is what Trinity sets with model.external_model (an example may
    write it): it needs that key on; vllm_async is rft's one engine too."""
    if cfg.explorer.rollout_model.engine_type == "external" and not uses_external_model(cfg):
        raise ConfigError(
            "explorer.rollout_model.engine_type: external needs model.external_model.enable: "
            "true (with base_url_env, api_key_env and model_name; mode bench)"
        )


def _trinity_trainer_spellings(cfg: Config, seen: set[str]) -> None:
    """Trinity's own trainer.* keys for what rft (or veRL's section) spells otherwise."""
    t = cfg.trainer
    for value, ours, key in (
        (t.use_remove_padding, "padding_free", "trainer.use_remove_padding"),
        (t.critic_warmup, "critic_warmup", "trainer.critic_warmup"),
    ):
        if value is None:
            continue
        target = t if ours == "padding_free" else t.trainer_config.trainer
        where = "trainer" if ours == "padding_free" else "trainer.trainer_config.trainer"
        if f"{where}.{ours}" in seen and getattr(target, ours) != value:
            raise ConfigError(
                f"{key}={value!r} contradicts {where}.{ours}={getattr(target, ours)!r}; "
                "set only one"
            )
        setattr(target, ours, value)


def _check_sync_intervals(cfg: Config) -> None:
    """Trinity's explorer_sync_interval / trainer_sync_interval default to sync_interval; rft
    has one interval for both sides."""
    sync = cfg.synchronizer
    for key in ("explorer_sync_interval", "trainer_sync_interval"):
        value = getattr(sync, key)
        if value is not None and value != sync.sync_interval:
            raise not_supported(
                f"synchronizer.{key}: {value}",
                f"rft has one interval for the trainer and the explorers: set "
                f"synchronizer.sync_interval: {value} (now {sync.sync_interval}) and remove it",
            )


def _check_engine_parallelism(cfg: Config) -> None:
    rollout = cfg.explorer.rollout_model
    for key in ("data_parallel_size", "pipeline_parallel_size"):
        value = getattr(rollout, key)
        if value > 1:
            raise not_supported(
                f"explorer.rollout_model.{key}: {value}",
                "rft runs one vLLM engine per explorer task: set explorer.rollout_model."
                "engine_num (more engines, each on its own GPUs) or tensor_parallel_size",
            )


def _derive_inflight_batches(cfg: Config) -> None:
    """Trinity v0.6's explorer.max_inflight_batches (train batches held at once) on rft's
    streaming explorer: max_inflight_samples = batches x batch_size x repeat_times."""
    explorer = cfg.explorer
    batches = explorer.max_inflight_batches
    if batches is None:
        return
    if not explorer.partial_rollout:
        log.warning(
            "explorer.max_inflight_batches=%d has no effect without explorer.partial_rollout: "
            "rft's explorer generates one step at a time unless it streams",
            batches,
        )
        return
    if explorer.max_inflight_samples is None:
        explorer.max_inflight_samples = batches * cfg.buffer.batch_size * cfg.algorithm.repeat_times


def _derive_buffer_thinking(cfg: Config) -> None:
    """Trinity's BufferConfigValidator: an experience/auxiliary buffer's format.enable_thinking
    defaults to model.enable_thinking (the SFT/DPO rows' chat template switch). On a taskset it
    has no effect, in Trinity too (the engine's switch is model.enable_thinking): warned."""
    for label, taskset in cfg.labelled_tasksets():
        if taskset.format.enable_thinking is not None:
            log.warning(
                "%s.format.enable_thinking has no effect (as in Trinity, it switches the chat "
                "template of SFT/DPO rows); the explorer's is model.enable_thinking",
                label,
            )
    trainer_input = cfg.buffer.trainer_input
    for buf in (trainer_input.experience_buffer, *trainer_input.auxiliary_buffers.values()):
        if buf.format.enable_thinking is None:
            buf.format.enable_thinking = cfg.model.enable_thinking


def _derive_priority_queue(cfg: Config, seen: set[str]) -> None:
    """``experience_buffer.use_priority_queue``: older Trinity's switch of the prioritized
    queue, now ``replay_buffer.enable``."""
    buf = cfg.buffer.trainer_input.experience_buffer
    if buf.use_priority_queue is None:
        return
    key = "buffer.trainer_input.experience_buffer.replay_buffer.enable"
    if key in seen and buf.replay_buffer.enable != buf.use_priority_queue:
        raise ConfigError(
            f"buffer.trainer_input.experience_buffer.use_priority_queue="
            f"{buf.use_priority_queue} contradicts {key}={buf.replay_buffer.enable}; set only one"
        )
    buf.replay_buffer.enable = buf.use_priority_queue
    if buf.use_priority_queue and buf.storage_type != "queue":
        raise ConfigError(
            "buffer.trainer_input.experience_buffer.use_priority_queue needs storage_type: queue"
        )


def _check_buffer_selectors(cfg: Config) -> None:
    """A trainer buffer's ``data_selector`` (Trinity's order of reading a file dataset): rft
    reads SFT and expert rows in dataset order."""
    trainer_input = cfg.buffer.trainer_input
    buffers = {"experience_buffer": trainer_input.experience_buffer} | {
        f"auxiliary_buffers.{name}": buf for name, buf in trainer_input.auxiliary_buffers.items()
    }
    for label, buf in buffers.items():
        selector = buf.data_selector
        if selector is not None and selector.selector_type != "sequential":
            raise not_supported(
                f"buffer.trainer_input.{label}.data_selector.selector_type: "
                f"{selector.selector_type}",
                "rft reads SFT and expert rows in dataset order (sequential); shuffle the "
                "file beforehand, or remove it",
            )


def _read_chat_template_path(cfg: Config) -> None:
    """Trinity's model.chat_template_path: the file's text becomes model.custom_chat_template
    (a template written there wins, as in Trinity's ModelConfigValidator)."""
    model = cfg.model
    if model.chat_template_path is None or model.custom_chat_template is not None:
        return
    path = Path(model.chat_template_path).expanduser()
    try:
        model.custom_chat_template = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(
            f"model.chat_template_path={model.chat_template_path!r}: cannot read the chat "
            f"template ({e.strerror}); give a readable Jinja file or remove the key"
        ) from e


# Trinity's sample_strategy staleness_control (trinity/algorithm/sample_strategy; its test
# test_default_queue_staleness_control_sample_strategy reads, at step s, experiences of model
# versions >= s - max_staleness): rft's trainer.max_staleness_versions, the same bound.
_STALENESS_ARGS = ("max_staleness",)


def _derive_staleness_control(cfg: Config, seen: set[str]) -> None:
    algo = cfg.algorithm
    if algo.sample_strategy != "staleness_control":
        return
    args = algo.sample_strategy_args or {}
    for key in args:
        if key not in _STALENESS_ARGS:
            raise ConfigError(
                f"algorithm.sample_strategy_args.{key}: not an argument of sample strategy "
                f"'staleness_control'; valid: {list(_STALENESS_ARGS)}"
            )
    bound = args.get("max_staleness")
    if isinstance(bound, bool) or not isinstance(bound, int) or bound < 0:
        raise ConfigError(
            f"algorithm.sample_strategy_args.max_staleness={bound!r}: sample_strategy "
            "staleness_control needs a whole number >= 0 (the oldest weights version a step may "
            "train on is its own minus max_staleness)"
        )
    current = cfg.trainer.max_staleness_versions
    if "trainer.max_staleness_versions" in seen and current != bound:
        raise ConfigError(
            f"algorithm.sample_strategy_args.max_staleness={bound} contradicts "
            f"trainer.max_staleness_versions={current}; set only one"
        )
    cfg.trainer.max_staleness_versions = bound


def _check_sequence_parallel(cfg: Config) -> None:
    """Ulysses sequence parallelism (``trainer.ulysses_sequence_parallel_size``, veRL's actor key
    mapped to it; rft.trainer.sequence_parallel): one size for the policy and its reference
    model (the dry run checks that it divides the trainer's ranks and the model's heads),
    padded rows (a packed row is not split across a group: ``padding_free`` off, warned);
    refused for the models and losses whose passes it does not split (a critic, DPO's pairs,
    M2PO's per-update mask, a teacher in the trainer)."""
    t, verl = cfg.trainer, cfg.trainer.trainer_config
    size = t.ulysses_sequence_parallel_size
    ref = verl.actor_rollout_ref.ref.ulysses_sequence_parallel_size
    if ref is not None and ref != size:
        raise ConfigError(
            "trainer.trainer_config.actor_rollout_ref.ref.ulysses_sequence_parallel_size="
            f"{ref} contradicts trainer.ulysses_sequence_parallel_size={size}: the reference "
            "model's passes split the sequences as the policy's; set only one"
        )
    critic = verl.critic.ulysses_sequence_parallel_size
    if critic is not None and critic > 1:
        raise not_supported(
            f"trainer.trainer_config.critic.ulysses_sequence_parallel_size: {critic}",
            "rft splits the policy's (and its reference model's) sequences across a group, not "
            "the critic's; set it to 1",
        )
    if size == 1:
        return
    for needed, what in (
        (uses_critic(cfg), "a critic (advantage_fn ppo)"),
        (cfg.algorithm.policy_loss_fn == "dpo", "DPO's preference pairs"),
        (cfg.algorithm.policy_loss_fn == "m2po", "M2PO's per-update token mask"),
        (teacher_in_trainer(cfg), "a teacher held by the trainer"),
    ):
        if needed:
            raise not_supported(
                f"trainer.ulysses_sequence_parallel_size: {size}",
                f"rft splits the policy's and its reference model's passes across a sequence "
                f"group, not those of {what}; set it to 1 (fit long sequences with "
                "trainer.param_offload / optimizer_offload, zero_stage 3, gradient_checkpointing "
                "and a smaller trainer.max_token_len_per_gpu)",
            )
    if t.padding_free:
        log.warning(
            "trainer.padding_free has no effect with trainer.ulysses_sequence_parallel_size=%d: "
            "micro-batches are padded rows (a packed row would need variable-length attention "
            "kernels across the group's exchange, not built); lower "
            "trainer.max_token_len_per_gpu if the padding costs memory",
            size,
        )
        t.padding_free = False


# veRL's checkpoint.{save,load}_contents items; rft's full checkpoints hold the first three.
_CHECKPOINT_PARTS = ("model", "optimizer", "extra")
_CHECKPOINT_ITEMS = (*_CHECKPOINT_PARTS, "hf_model")


def _check_checkpoint_contents(cfg: Config, seen: set[str]) -> None:
    """veRL's actor/critic ``checkpoint.*contents``: rft writes resumable checkpoints (model,
    optimizer, extra) and, with ``hf_model`` in save_contents, a Hugging Face folder each time."""
    verl = cfg.trainer.trainer_config
    for owner, ckpt in (
        ("actor_rollout_ref.actor", verl.actor_rollout_ref.actor.checkpoint),
        ("critic", verl.critic.checkpoint),
    ):
        for name in ("contents", "save_contents", "load_contents"):
            items = getattr(ckpt, name)
            if items is None:
                continue
            key = f"trainer.trainer_config.{owner}.checkpoint.{name}"
            unknown = [item for item in items if item not in _CHECKPOINT_ITEMS]
            if unknown:
                raise ConfigError(
                    f"{key}: unknown parts {unknown}; veRL's are {list(_CHECKPOINT_ITEMS)}"
                )
            missing = [part for part in _CHECKPOINT_PARTS if part not in items]
            if name == "load_contents":  # acted on by resumed_parts
                if "model" in missing:
                    raise ConfigError(f"{key}: {items} leaves out the model; a resume needs it")
                continue
            if missing:
                log.warning(
                    "%s=%s: rft's checkpoints also hold %s (every checkpoint is resumable), more "
                    "disk than asked; trainer.max_checkpoints_to_keep bounds how many stay",
                    key,
                    items,
                    " and ".join(missing),
                )
            if "hf_model" in items and name != "load_contents" and owner != "critic":
                set_from_verl(
                    cfg, f"{owner}.checkpoint.{name}", "always", "trainer.save_hf_checkpoint", seen
                )


def check_resumed_parts(cfg: Config) -> None:
    """A resume without the optimizer's state under ZeRO-3 is refused: DeepSpeed's load with
    load_optimizer_states=False is not reliable at stage 3 (its partitioned optimizer owns the
    fp32 master weights)."""
    if cfg.trainer.zero_stage == 3 and "optimizer" not in resumed_parts(cfg):
        raise not_supported(
            "trainer.trainer_config.actor_rollout_ref.actor.checkpoint.load_contents without "
            "optimizer under trainer.zero_stage: 3",
            "list optimizer in load_contents (a resume restores it), or train with zero_stage 2",
        )


def resumed_parts(cfg: Config, owner: str = "actor") -> frozenset[str]:
    """What a resume restores of the actor's (or ``"critic"``'s) checkpoint: veRL's
    ``checkpoint.load_contents`` (default: model, optimizer and extra, i.e. the trainer state
    with the lr schedule and random generators)."""
    verl = cfg.trainer.trainer_config
    ckpt = verl.critic.checkpoint if owner == "critic" else verl.actor_rollout_ref.actor.checkpoint
    items = ckpt.load_contents
    return frozenset(_CHECKPOINT_PARTS if items is None else items) & frozenset(_CHECKPOINT_PARTS)
