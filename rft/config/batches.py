"""How a trainer step divides into optimizer updates: ``buffer.train_batch_size`` as veRL's mini-batch.

Owns the counts of one step: rollouts per step (``buffer.batch_size x repeat_times``), per
update (``train_batch_size``, its rollout part with CHORD's mix) and updates per step. Pure
functions of a checked :class:`~rft.config.schema.Config`, read by the config rules, the
dry-run plan and the trainer (:mod:`rft.trainer.step`).
"""

from __future__ import annotations

import math

from rft.config.mix import mix_counts
from rft.config.schema import Config
from rft.errors import ConfigError


def splits_steps(cfg: Config) -> bool:
    """Whether a step can hold several mini-batches (only ``mode: both`` trains on a fixed
    explorer step; elsewhere the trainer reads one mini-batch per step)."""
    return cfg.mode == "both" and cfg.algorithm.algorithm_type != "sft"


def rollouts_per_step(cfg: Config) -> int:
    """Rollout experiences the explorer produces per step: ``batch_size x repeat_times``."""
    return cfg.buffer.batch_size * cfg.algorithm.repeat_times


def rollouts_per_update(cfg: Config) -> int:
    """Rollout experiences of one mini-batch (CHORD: ``train_batch_size`` less its expert part)."""
    if cfg.algorithm.sample_strategy == "mix":
        return mix_counts(cfg).rollout
    assert cfg.buffer.train_batch_size is not None  # derived by the rules
    return cfg.buffer.train_batch_size


def groups_per_update(cfg: Config) -> int:
    """Whole rollout groups one mini-batch holds at most when each run gives one experience
    (the plan's count, before a step's experiences are known)."""
    return max(1, rollouts_per_update(cfg) // cfg.algorithm.repeat_times)


def groups_per_update_of(cfg: Config, experiences: int, groups: int) -> int:
    """Whole groups per mini-batch of a step whose ``groups`` rollout groups hold
    ``experiences`` experiences: ``buffer.train_batch_size`` counts experiences, as Trinity's
    trainer reads them (trinity/common/config_validator.py: the experience buffer's
    batch_size is train_batch_size), so a multi-turn run's turns each count; single-turn runs
    give :func:`groups_per_update`."""
    if groups <= 0 or experiences <= 0:
        return 1
    return max(1, rollouts_per_update(cfg) * groups // experiences)


def mini_batch_count(groups: int, per_update: int) -> int:
    """Mini-batches for a step of ``groups`` rollout groups, ``per_update`` at most each."""
    return max(1, math.ceil(groups / per_update))


def mini_batches_per_step(cfg: Config) -> int:
    """Optimizer updates per step and epoch (the trainer counts the groups that came).

    ``mode: both`` (as veRL): step ``s`` trains on the explorer's whole step, its groups split
    into mini-batches of whole groups, as even as possible, one update each, every epoch; the
    old and reference log-probs and the advantages are computed once, over the whole step.
    Elsewhere (asynchronous ``train``, SFT) a step reads one mini-batch."""
    if not splits_steps(cfg):
        return 1
    return mini_batch_count(cfg.buffer.batch_size, groups_per_update(cfg))


def updates_per_step(cfg: Config) -> int:
    """Optimizer updates of one trainer step: mini-batches x ``trainer.ppo_epochs``."""
    return mini_batches_per_step(cfg) * cfg.trainer.ppo_epochs


def check_train_batch_size(cfg: Config) -> None:
    """In ``mode: both`` a mini-batch cannot exceed the explorer's step, when each run gives
    one experience (the dry run checks it when every training taskset runs a single-turn
    recipe; a multi-turn workflow's step holds more experiences than runs, as Trinity counts
    train_batch_size)."""
    if not splits_steps(cfg):
        return
    per_update, per_step = rollouts_per_update(cfg), rollouts_per_step(cfg)
    if per_update > per_step:
        what = "its rollout part" if cfg.algorithm.sample_strategy == "mix" else "it"
        raise ConfigError(
            f"buffer.train_batch_size={cfg.buffer.train_batch_size} ({what}: {per_update} rollouts "
            f"per update) exceeds a step's batch_size x repeat_times = {cfg.buffer.batch_size} x "
            f"{cfg.algorithm.repeat_times} = {per_step} rollouts: in mode 'both' each step trains "
            f"on exactly the explorer's step, split into mini-batches of train_batch_size; lower "
            f"train_batch_size to at most {per_step} or raise buffer.batch_size"
        )


def describe(cfg: Config) -> str:
    """The plan's line, e.g. ``2 updates per step (2 mini-batches of <= 4 groups x 1 epoch)``."""
    minis, epochs = mini_batches_per_step(cfg), cfg.trainer.ppo_epochs
    total = minis * epochs
    if minis == 1:
        return f"{total} update{'s' * (total != 1)} per step ({epochs} epoch{'s' * (epochs != 1)})"
    groups = math.ceil(cfg.buffer.batch_size / minis)
    return (
        f"{total} updates per step ({minis} mini-batches of <= {groups} groups x {epochs} "
        f"epoch{'s' * (epochs != 1)})"
    )
