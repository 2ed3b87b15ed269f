"""What the runtime reads from a checked config: derived answers that several roles need.

Input: a :class:`~rft.config.Config` completed by :func:`rft.config.rules.apply`; output: plain
values (the LoRA adapter, the trainer's read timeout, whether a critic trains, the sampling and
scoring temperatures, whether the explorer streams). Pure functions: each answer has one owner
here, imported by the explorer, trainer, sync and launch code and by the rules themselves.
"""

from __future__ import annotations

from rft.config.names import NEEDS_CRITIC
from rft.config.schema import Config, LoRAConfig, TasksetConfig


def lora_config(cfg: Config) -> LoRAConfig | None:
    """The run's LoRA adapter (``model.lora_configs``, one entry), or None: full fine-tuning."""
    return cfg.model.lora_configs[0] if cfg.model.lora_configs else None


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


def streams(cfg: Config) -> bool:
    """Whether the explorer's steps overlap (:mod:`rft.explorer.steps`):
    ``explorer.partial_rollout`` in an asynchronous run (``mode: explore``, or ``mode: both``
    with ``sync_offset`` >= 1 or a dynamic ``sync_style``). A synchronous run generates step s
    only after the trainer's step s - 1: nothing could overlap, so one step at a time."""
    sync = cfg.synchronizer
    asynchronous = cfg.mode == "explore" or sync.sync_offset > 0 or sync.sync_style != "fixed"
    return cfg.explorer.partial_rollout and asynchronous
