"""The trainer: read a batch, update the policy with DeepSpeed ZeRO, publish weights, checkpoint.

Run as ``python -m rft.trainer --config FILE`` (one process per GPU under torchrun/srun).
Data in: a batch per step from the buffer, an SFT dataset or CHORD's mix (read on rank 0,
broadcast). Data out: weights every ``sync_interval`` steps (folders or an NCCL broadcast),
full checkpoints every ``save_interval`` steps and at the end, ``monitor/trainer/``; rank 0
holds the run directory's trainer lease (:mod:`rft.lease`) and checks it before each write.
Exit codes: 0 done, ``EXIT_REQUEUE`` after SIGUSR1/SIGTERM (the step in flight finished and
checkpointed, so a requeued job resumes there), 2 for a user error or a lost lease.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from rft.config.batches import updates_per_step
from rft.config.queries import read_timeout, uses_critic
from rft.config.schema import Config
from rft.config.trinity_rules import resumed_parts
from rft.data import run_steps, trains_pairs
from rft.entry import config_parser, run_command, setup_logging
from rft.errors import EXIT_OK, EXIT_REQUEUE, ConfigError, DataError
from rft.lease import NO_FENCE, Fence, Lease, LeaseView
from rft.monitor import (
    BATCH_EXPERIENCES,
    BATCH_TOKENS,
    BUFFER_STATS_PREFIX,
    PUBLISH_TIME_S,
    READ_TIME_S,
    SKIPPED_NO_EXPERIENCES,
    STALENESS_COUNT,
    STALENESS_MAX,
    STALENESS_MEAN,
    STEP_TIME_S,
    TOKENS_PER_S,
    UPDATES,
    WEIGHTS_VERSION,
)
from rft.placement import TRAINER_MODES
from rft.rundir import ACTOR_DIR, CRITIC_DIR, TRAINER_LEASE, step_dir
from rft.stages import load_stage
from rft.sync.requests import RequestWatcher
from rft.sync.schedule import publishes_weights
from rft.trainer.algorithm import build_loss_fns, uses_reference
from rft.trainer.checkpoint import (
    LoopPosition,
    check_lease,
    claim_run_dir,
    resume_point,
    save_full_checkpoint,
)
from rft.trainer.state import (
    load_rng,
)
from rft.trainer.weights_out import WeightsOut

if TYPE_CHECKING:
    from rft.buffer.experience import Experience
    from rft.trainer import engine
    from rft.trainer.checkpoint import Source

log = logging.getLogger(__name__)


class StopFlag:
    """Set by SIGUSR1/SIGTERM: the loop finishes its step, checkpoints and exits."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def install(self) -> None:
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.signum = signum
        log.warning(
            "received %s: finishing the current step, then checkpoint and exit",
            signal.Signals(signum).name,
        )


def open_trainer_input(
    cfg: Config, run_dir: Path, cursor: dict[str, Any] | None, fence: Fence = NO_FENCE
) -> Source:
    """The trainer's input (rank 0): CHORD's mix, DPO's pairs, an SFT dataset, or the rollout
    buffer (its SQLite archive written under ``fence``)."""
    from rft.trainer.dpo import DpoSource
    from rft.trainer.inputs import BufferSource, FileSource
    from rft.trainer.mix import MixSource

    if trains_pairs(cfg):
        return DpoSource(cfg, cursor)
    if cfg.algorithm.sample_strategy == "mix":
        return MixSource(cfg, run_dir, cursor, fence=fence)
    if cfg.buffer.trainer_input.experience_buffer.storage_type == "file":
        return FileSource(cfg, cursor)
    return BufferSource(cfg, run_dir, cursor, fence=fence)


def check_mode(cfg: Config) -> None:
    """Config checks every rank makes before any collective (a rank-0-only error would hang)."""
    if cfg.mode not in TRAINER_MODES:
        raise ConfigError(
            f"mode {cfg.mode!r} has no trainer; the trainer runs in mode 'both' or 'train'"
        )


def staleness_metrics(batch: list[Experience], version: int) -> dict[str, float]:
    """Weight versions between the rollouts and the trainer (expert samples have none): mean,
    max, and a histogram, the count of rollouts per age from 0 to the max (zeros included)."""
    ages = [version - e.model_version for e in batch if e.source != "expert"]
    if not ages:
        return {}
    counts = dict.fromkeys(range(max(ages) + 1), 0)  # zeros for the ages in between
    for age in ages:
        counts[age] = counts.get(age, 0) + 1
    histogram = {STALENESS_COUNT.format(versions=age): n for age, n in sorted(counts.items())}
    return {STALENESS_MEAN: sum(ages) / len(ages), STALENESS_MAX: float(max(ages)), **histogram}


def run(cfg: Config) -> int:
    """The training loop (all ranks). Returns the exit code."""
    check_mode(cfg)
    stop = StopFlag()
    stop.install()
    from rft.trainer import engine

    wait_s = max(cfg.synchronizer.sync_timeout, read_timeout(cfg)[0])
    info = engine.init_distributed(max(1800.0, wait_s + 600.0))
    size = cfg.trainer.ulysses_sequence_parallel_size
    if size > 1:  # every rank forms the groups; the model must split its heads evenly
        from rft.models import check_sequence_parallel_heads
        from rft.trainer import sequence_parallel

        check_sequence_parallel_heads(cfg.model.model_path, size)
        sequence_parallel.setup(size, info.rank, info.world_size)
        info = dataclasses.replace(info, sp_size=size)
        if info.rank == 0:
            log.info(
                "trainer: Ulysses sequence parallelism: %d group(s) of %d ranks, each sequence's "
                "positions split across its group",
                info.dp_size,
                size,
            )
    if info.rank == 0:
        cfg.run_dir.mkdir(parents=True, exist_ok=True)
    lease = claim_run_dir(cfg, cfg.run_dir, info.rank)
    gen = engine.broadcast_object(lease.gen if lease is not None else None)
    fence = lease if lease is not None else LeaseView(cfg.run_dir, TRAINER_LEASE, gen)
    try:
        return train(cfg, info, stop, lease, fence)
    finally:
        if lease is not None:
            lease.release()


def _build_models(
    cfg: Config, info: engine.DistInfo, fns: Any, total_updates: int | None
) -> tuple[engine.Actor, engine.Reference | None, engine.Actor | None]:
    """The actor, the reference model (a KL term, or DPO) and the critic (GAE) of the run."""
    from rft.trainer import engine

    actor = engine.build_actor(cfg, info, total_updates)
    ref = engine.build_reference(cfg, info, actor) if uses_reference(cfg, fns) else None
    critic = engine.build_critic(cfg, info, total_updates) if uses_critic(cfg) else None
    return actor, ref, critic


def _load_resumed(
    cfg: Config,
    rank: int,
    resumed: int,
    weights_version: int,
    actor: engine.Actor,
    critic: engine.Actor | None,
) -> None:
    """Load what ``checkpoint.load_contents`` restores of global_step_``resumed``."""
    from rft.trainer import engine

    folder = step_dir(cfg.run_dir, resumed)
    parts = resumed_parts(cfg)
    engine.load_checkpoint(actor, folder / ACTOR_DIR, parts)
    if critic is not None:
        engine.load_checkpoint(critic, folder / CRITIC_DIR, resumed_parts(cfg, "critic"))
    if "extra" in parts:
        load_rng(folder / ACTOR_DIR, rank)
    if parts != {"model", "optimizer", "extra"}:
        log.info("resumed the actor's %s only (checkpoint.load_contents)", sorted(parts))
    log.info(
        "resumed from global_step_%d (weights version %d)%s",
        resumed,
        weights_version,
        " with its critic" if critic is not None else "",
    )


def _pad_id(actor: engine.Actor) -> int:
    pad_id = actor.module.config.pad_token_id or actor.module.config.eos_token_id or 0
    return pad_id[0] if isinstance(pad_id, list) else pad_id


def _train_on(
    batch: list[Experience],
    models: tuple[engine.Actor, engine.Reference | None, engine.Actor | None],
    cfg: Config,
    fns: Any,
    info: engine.DistInfo,
    step: int,
    pad_id: int,
) -> dict[str, float]:
    """The step's metrics after training on ``batch``; a step on nothing is skipped."""
    from rft.trainer.dpo import dpo_step
    from rft.trainer.step import train_step

    actor, ref, critic = models
    if batch:
        train = dpo_step if trains_pairs(cfg) else train_step
        return train(actor, ref, batch, cfg, fns, info, step, pad_id, critic)
    # never a step on nothing; lockstep goes on (the weights are published unchanged)
    if info.rank == 0:
        log.warning(
            "step %d: no experiences to train on (every episode of the explorer's step "
            "failed, or the experience operators dropped every group): step skipped, "
            "weights unchanged",
            step,
        )
    return {SKIPPED_NO_EXPERIENCES: 1, BATCH_EXPERIENCES: 0, BATCH_TOKENS: 0, UPDATES: 0}


def _publish_if_due(
    cfg: Config,
    rank: int,
    steps: int | None,
    requests: RequestWatcher,
    weights: WeightsOut,
    actor: engine.Actor,
    lease: Lease | None,
    progress: LoopPosition,
) -> dict[str, float]:
    """Publish the weights of step ``progress.step`` when the sync schedule (or an explorer's
    ask, ``explorer_driven``: rank 0 decides for all) says so; the publishing's metrics."""
    from rft.trainer import engine

    step, sync = progress.step, cfg.synchronizer
    requested = False
    if sync.sync_style == "explorer_driven":
        requested = engine.broadcast_object(requests.pending() if rank == 0 else None)
    if not publishes_weights(step, sync.sync_interval, steps, sync.sync_style, requested):
        return {}
    if rank == 0 and requested:
        requests.answered()
    check_lease(lease, f"publishing weights version {step}")
    metrics = weights.publish(step, actor)
    progress.weights_version = step
    return metrics


def _step_times(tokens: int, t0: float, read_s: float, publish_s: float) -> dict[str, float]:
    """The step's timings since ``t0`` (perf_counter) and its tokens per second of training."""
    elapsed = time.perf_counter() - t0
    return {
        READ_TIME_S: read_s,
        PUBLISH_TIME_S: publish_s,
        STEP_TIME_S: elapsed,
        TOKENS_PER_S: tokens / max(elapsed - read_s - publish_s, 1e-9),
    }


def _check_trained_something(
    cfg: Config, source: Source | None, ran: int, skipped: list[int], exit_code: int
) -> None:
    """Say which of the launch's ``ran`` steps were skipped; raise when it trained on nothing."""
    if skipped:
        log.warning(
            "%d of the %d steps of this launch had no experiences and were skipped: %s",
            len(skipped),
            ran,
            skipped,
        )
    if ran == 0 and exit_code == EXIT_OK and getattr(source, "timed_out", False):  # rank 0
        wait_s, wait_key = read_timeout(cfg)
        raise DataError(
            "the trainer trained on nothing: no experiences arrived within "
            f"{wait_key}={wait_s:g}s and no step ran; check that the explorers run and write "
            f"to this run directory (rft-status RUN_DIR), or raise {wait_key}"
        )
    if skipped and len(skipped) == ran and exit_code == EXIT_OK:
        raise DataError(
            f"the trainer trained on nothing: each of its {ran} steps had no experiences "
            "(see the explorer's log for its failed episodes, or the experience operators' "
            "counts in monitor/trainer/metrics.jsonl)"
        )


def train(
    cfg: Config,
    info: engine.DistInfo,
    stop: StopFlag,
    lease: Lease | None,
    fence: Fence = NO_FENCE,
) -> int:
    """The loop itself, on every rank; rank 0 holds ``lease``; every rank checks ``fence`` (its
    view of the lease) right before each write others can see."""
    from rft.monitor import Monitor
    from rft.trainer import engine

    rank, run_dir = info.rank, cfg.run_dir
    fns = build_loss_fns(cfg.algorithm)
    resumed, meta = engine.broadcast_object(
        resume_point(cfg, run_dir, info.world_size) if rank == 0 else None
    )
    progress = LoopPosition(
        step=resumed or 0,
        weights_version=meta.get("weights_version", 0),
        cursor=meta.get("buffer_cursor", {}),
        last_saved=resumed or -1,
    )
    source = open_trainer_input(cfg, run_dir, progress.cursor or None, fence) if rank == 0 else None
    requests = RequestWatcher(run_dir)  # explorer_driven's asks (read by rank 0)
    steps = engine.broadcast_object(run_steps(cfg) if rank == 0 else None)
    total_updates = None if steps is None else steps * updates_per_step(cfg)  # LR schedule's
    models = _build_models(cfg, info, fns, total_updates)
    actor, critic = models[0], models[2]
    if resumed is not None:
        _load_resumed(cfg, rank, resumed, progress.weights_version, actor, critic)
    weights = WeightsOut(cfg, info, steps, fence)  # folders, deltas, broadcasts, adapters
    monitor = Monitor(
        run_dir, "trainer", monitor_type=cfg.monitor.monitor_type, enabled=rank == 0,
        flush_interval_s=cfg.monitor.flush_interval_s, project=cfg.project, name=cfg.name,
        fence=fence,
    )  # fmt: skip
    pad_id = _pad_id(actor)
    checkpoint = (cfg, run_dir, actor, source, progress, rank, info.world_size)
    skipped: list[int] = []  # steps of this launch with no experiences (no update)
    first_step = progress.step + 1
    while steps is None or progress.step < steps:
        step = progress.step + 1
        t0 = time.perf_counter()
        batch = engine.broadcast_object(
            source.next_batch(step, progress.weights_version, stop.requested) if rank == 0 else None
        )
        if batch is None:
            break
        t_read = time.perf_counter() - t0
        stale = staleness_metrics(batch, progress.weights_version)
        metrics = _train_on(batch, models, cfg, fns, info, step, pad_id)
        if not batch:
            skipped.append(step)
        progress.step = step
        progress.cursor = source.cursor() if rank == 0 else {}
        t1 = time.perf_counter()
        metrics.update(_publish_if_due(cfg, rank, steps, requests, weights, actor, lease, progress))
        t_publish = time.perf_counter() - t1
        metrics.update(stale)
        metrics.update(_step_times(metrics[BATCH_TOKENS], t0, t_read, t_publish))
        metrics[WEIGHTS_VERSION] = progress.weights_version
        if rank == 0:
            metrics.update({f"{BUFFER_STATS_PREFIX}{k}": v for k, v in source.stats().items()})
        monitor.log(step, metrics)
        if cfg.trainer.save_interval and step % cfg.trainer.save_interval == 0:
            save_full_checkpoint(*checkpoint, step == steps, critic, lease, fence)
        if engine.all_reduce_max(int(stop.requested())):
            break
    exit_code = EXIT_REQUEUE if engine.all_reduce_max(int(stop.requested())) else EXIT_OK
    if progress.last_saved != progress.step and progress.step > 0:
        save_full_checkpoint(*checkpoint, True, critic, lease, fence)
    weights.close()
    monitor.close()
    log.info("trainer stopped at step %d (exit code %d)", progress.step, exit_code)
    _check_trained_something(cfg, source, progress.step - first_step + 1, skipped, exit_code)
    return exit_code


def main(argv: list[str] | None = None) -> None:
    setup_logging()
    args = config_parser(
        "python -m rft.trainer", __doc__.split("\n")[0], stage=True, take_over=True
    ).parse_args(argv)
    code = run_command(lambda: run(load_stage(args.config, args.overrides, args.stage)))
    from rft.trainer import engine

    engine.teardown(code)
