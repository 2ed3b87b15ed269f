"""CHORD mixing (``algorithm.sample_strategy: mix``): how many rollouts and expert samples a step takes.

Owns :func:`mix_counts`: ``buffer.train_batch_size`` counts both kinds, ``expert =
ceil(expert_data_ratio x train_batch_size)`` (Trinity's MixSampleStrategy) and ``rollout`` the
rest, in whole groups. Pure checks on a :class:`~rft.config.schema.Config`, run by :mod:`rft.config.rules` at
load (so the login node catches them); the trainer's :mod:`rft.trainer.mix` reads the counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rft.config.names import EXPERT_LOSSES
from rft.config.schema import Config, ExperienceBufferConfig
from rft.errors import ConfigError, did_you_mean

DEFAULT_EXPERT_DATA_RATIO = 0.5  # Trinity's default for sample_strategy: mix
STRATEGY_ARGS = ("expert_data_ratio",)


@dataclass(frozen=True)
class MixCounts:
    """Samples of each kind in one training step."""

    rollout: int  # from the rollout buffer, whole groups
    expert: int  # from the auxiliary (expert/SFT) dataset

    @property
    def total(self) -> int:
        return self.rollout + self.expert


def expert_samples_per_step(train_batch_size: int, ratio: float) -> int:
    """``ceil(ratio * train_batch_size)``, as Trinity's MixSampleStrategy computes its
    ``expert_batch_size`` (trinity/algorithm/sample_strategy/mix_sample_strategy.py), in the same
    float arithmetic (864 x 0.11 -> 96, 6 x 0.25 -> 2)."""
    return math.ceil(ratio * train_batch_size)


def expert_data_ratio(cfg: Config) -> float:
    """``algorithm.sample_strategy_args.expert_data_ratio``, checked to lie in (0, 1)."""
    args = cfg.algorithm.sample_strategy_args or {}
    for key in args:
        if key not in STRATEGY_ARGS:
            raise ConfigError(
                f"algorithm.sample_strategy_args.{key}: not an argument of sample "
                f"strategy 'mix'; valid arguments: {list(STRATEGY_ARGS)}."
                f"{did_you_mean(key, STRATEGY_ARGS)}"
            )
    ratio = args.get("expert_data_ratio", DEFAULT_EXPERT_DATA_RATIO)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio < 1:
        raise ConfigError(
            f"algorithm.sample_strategy_args.expert_data_ratio={ratio!r}: expected a "
            "number in (0, 1), the expert share of buffer.train_batch_size (for "
            "expert data only, use algorithm_type: sft)"
        )
    return float(ratio)


def expert_buffer(cfg: Config) -> ExperienceBufferConfig:
    """The one auxiliary buffer that holds the expert data."""
    aux = cfg.buffer.trainer_input.auxiliary_buffers
    if len(aux) != 1:
        raise ConfigError(
            f"algorithm.sample_strategy 'mix' reads one expert dataset, but "
            f"buffer.trainer_input.auxiliary_buffers has {len(aux)}: {sorted(aux)}; "
            "keep exactly one (storage_type: file, path)"
        )
    return next(iter(aux.values()))


def mix_counts(cfg: Config) -> MixCounts:
    """Validate a ``sample_strategy: mix`` config and return the per-mini-batch counts.

    ``mode: both`` splits the explorer's step into mini-batches of at most ``rollout`` rollouts
    (:mod:`rft.config.batches`), each with ``expert`` expert samples; ``mode: train`` reads up to
    ``rollout`` rollouts in whole groups (as many as arrive within ``synchronizer.sync_timeout``)
    plus ``expert``. Raises ConfigError naming the keys to change.
    """
    algo, buf = cfg.algorithm, cfg.buffer
    if algo.policy_loss_fn not in EXPERT_LOSSES:
        raise ConfigError(
            f"algorithm.sample_strategy 'mix' adds expert samples, which only "
            f"policy_loss_fn {' or '.join(map(repr, sorted(EXPERT_LOSSES, reverse=True)))} "
            f"trains on (got {algo.policy_loss_fn!r}); "
            "use algorithm_type: mix_chord or mix"
        )
    if buf.trainer_input.experience_buffer.storage_type == "file":
        raise ConfigError(
            "algorithm.sample_strategy 'mix' mixes rollouts into each step: "
            "buffer.trainer_input.experience_buffer must be the rollout buffer "
            "(storage_type queue or sql), with the expert data in auxiliary_buffers"
        )
    expert_buffer(cfg)
    ratio = expert_data_ratio(cfg)
    assert buf.train_batch_size is not None  # filled by the config rules
    expert = expert_samples_per_step(buf.train_batch_size, ratio)
    counts = MixCounts(rollout=buf.train_batch_size - expert, expert=expert)
    if counts.rollout < algo.repeat_times or counts.rollout % algo.repeat_times:
        raise ConfigError(
            f"buffer.train_batch_size={buf.train_batch_size} with expert_data_ratio="
            f"{ratio:g} leaves {counts.rollout} rollouts per step, not a positive "
            f"multiple of algorithm.repeat_times={algo.repeat_times} (groups are "
            "never split); adjust train_batch_size or the ratio"
        )
    return counts
