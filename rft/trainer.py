"""The trainer: read a batch, update the policy with DeepSpeed ZeRO, publish weights, checkpoint.

Run as ``python -m rft.trainer --config FILE [key=value ...]``, alone or under
``torchrun --nproc_per_node=N`` / ``srun`` (one process per GPU; CPU + gloo without GPUs).

Data in: experiences from the run directory's buffer (``mode: both`` / ``train``) or an SFT
dataset (``storage_type: file``), or both mixed (``sample_strategy: mix``, CHORD: see
:mod:`rft.mix_input`), read on rank 0 and broadcast. Data out, in the run
directory: ``weights/v<step>/`` every ``synchronizer.sync_interval`` steps (HF folders that
vLLM reloads), ``global_step_N/`` full checkpoints every ``trainer.save_interval`` steps and
at the end (:mod:`rft.trainer_state`), metrics in ``monitor/trainer/``.

Exit codes: 0 done; :data:`EXIT_REQUEUE` (143) after SIGUSR1/SIGTERM: the step in flight was
finished and a full checkpoint saved, so a requeued job resumes there
(``continue_from_checkpoint: true``); 2 for a user error (message printed, no traceback).
"""

from __future__ import annotations

import argparse
import logging
import math
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rft import trainer_state as ts
from rft.config import Config, load_config
from rft.errors import EXIT_REQUEUE, EXIT_USER_ERROR, ConfigError, RftError

log = logging.getLogger("rft.trainer")


class StopFlag:
    """Set by SIGUSR1/SIGTERM: the loop finishes its step, checkpoints and exits."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def install(self) -> None:
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, _frame: Any) -> None:
        self.signum = signum
        log.warning("received %s: finishing the current step, then checkpoint and exit",
                    signal.Signals(signum).name)


@dataclass
class Progress:
    """What a checkpoint records besides the engine: where the loop is."""

    step: int = 0  # last completed step
    weights_version: int = 0  # last published weights version (0: the initial model)
    cursor: dict[str, Any] = field(default_factory=dict)  # input position after `step`
    last_saved: int = -1


def total_steps(cfg: Config, source: Any) -> int | None:
    """buffer.total_steps, else epochs x the SFT dataset or the taskset; None: until input ends."""
    if cfg.buffer.total_steps is not None:
        return cfg.buffer.total_steps
    if hasattr(source, "steps_per_epoch"):
        return cfg.buffer.total_epochs * source.steps_per_epoch()
    from rft.data import count_rows, resolve

    tasksets = cfg.training_tasksets()
    if len(tasksets) != 1:
        return None
    ts0 = tasksets[0]
    rows = count_rows(resolve(ts0.path, ts0.split, ts0.subset_name))
    return None if rows is None else cfg.buffer.total_epochs * math.ceil(rows / cfg.buffer.batch_size)


def check_mode(cfg: Config) -> None:
    """Config checks every rank makes before any collective (a rank-0-only error would hang)."""
    if cfg.mode not in ("both", "train"):
        raise ConfigError(f"mode {cfg.mode!r} has no trainer; the trainer runs in mode 'both' or 'train'")
    if cfg.algorithm.sample_strategy == "mix":
        from rft.mix_input import mix_counts

        mix_counts(cfg)


def resume_point(cfg: Config, run_dir: Path, world_size: int) -> tuple[int | None, dict[str, Any]]:
    """(step, metadata) of the newest complete checkpoint, or (None, {}) for a fresh start."""
    if not cfg.continue_from_checkpoint:
        return None, {}
    step = ts.newest_complete(run_dir)
    if step is None:
        return None, {}
    meta = ts.read_meta(run_dir, step)
    if meta.get("world_size") != world_size:
        raise RftError(f"checkpoint {ts.step_dir(run_dir, step)} was written by "
                       f"{meta.get('world_size')} ranks but this run has {world_size}; DeepSpeed "
                       "cannot reshard on resume: relaunch with that many ranks")
    return step, meta


def publish_weights(actor: Any, publisher: Any, version: int, model_path: str, rank: int) -> None:
    """Gather the weights (collective) and publish ``weights/v<version>/`` from rank 0."""
    from rft import ds_engine as dse

    state = dse.gather_weights(actor)
    if rank == 0:
        publisher.publish(version, lambda tmp: dse.save_hf_folder(actor, state, tmp),
                          extra_files=ts.tokenizer_files(model_path))
    dse.barrier()


def save_full_checkpoint(cfg: Config, run_dir: Path, actor: Any, source: Any, progress: Progress,
                         rank: int, world_size: int, final: bool) -> None:
    """Every rank writes its shards; rank 0 finishes (meta, rename, pointer) and releases input."""
    from rft import ds_engine as dse

    tmp = dse.broadcast_object(ts.staging_dir(run_dir, progress.step) if rank == 0 else None)
    actor_dir = tmp / "actor"
    dse.save_checkpoint(actor, actor_dir, ts.ds_tag(progress.step))
    ts.save_rng(actor_dir, rank)
    mode = cfg.trainer.save_hf_checkpoint
    state = dse.gather_weights(actor) if mode == "always" or (mode == "last" and final) else None
    dse.barrier()
    if rank == 0:
        from rft.sync import copy_files

        dse.save_hf_folder(actor, state, actor_dir / ts.HF_DIR)
        copy_files(ts.tokenizer_files(cfg.model.model_path), actor_dir / ts.HF_DIR)
        meta = {"buffer_cursor": progress.cursor, "weights_version": progress.weights_version,
                "world_size": world_size, "zero_stage": cfg.trainer.zero_stage,
                "lr": dse.current_lr(actor), "time": time.time(),
                "lr_scheduler": actor.engine.lr_scheduler.state_dict()}
        ts.finish_checkpoint(run_dir, tmp, progress.step, meta, cfg.trainer.max_checkpoints_to_keep)
        source.release(progress.cursor)
        log.info("checkpoint global_step_%d saved", progress.step)
    progress.last_saved = progress.step
    dse.barrier()


def staleness_metrics(batch: list[Any], version: int) -> dict[str, float]:
    """Weight versions between the rollouts and the trainer (expert samples have none)."""
    ages = [version - e.model_version for e in batch if e.source != "expert"]
    if not ages:
        return {}
    return {"staleness_mean": sum(ages) / len(ages), "staleness_max": float(max(ages))}


def run(cfg: Config) -> int:
    """The training loop (all ranks). Returns the exit code."""
    check_mode(cfg)
    stop = StopFlag()
    stop.install()
    from rft import ds_engine as dse
    from rft.monitor import Monitor
    from rft.policy_update import build_loss_fns, train_step
    from rft.sync import WeightsPublisher
    from rft.trainer_input import open_source

    info = dse.init_distributed(max(1800.0, cfg.synchronizer.sync_timeout + 600.0))
    rank = info.rank
    run_dir = cfg.run_dir
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
    fns = build_loss_fns(cfg)
    resumed, meta = dse.broadcast_object(resume_point(cfg, run_dir, info.world_size) if rank == 0 else None)
    progress = Progress(step=resumed or 0, weights_version=meta.get("weights_version", 0),
                        cursor=meta.get("buffer_cursor", {}), last_saved=resumed or -1)
    source = open_source(cfg, run_dir, progress.cursor or None) if rank == 0 else None
    steps = dse.broadcast_object(total_steps(cfg, source) if rank == 0 else None)
    actor = dse.build_actor(cfg, info, None if steps is None else steps * cfg.trainer.ppo_epochs)
    ref = dse.build_reference(cfg, info) if fns.needs_ref else None
    if resumed is not None:
        dse.load_checkpoint(actor, ts.step_dir(run_dir, resumed) / "actor")
        ts.load_rng(ts.step_dir(run_dir, resumed) / "actor", rank)
        log.info("resumed from global_step_%d (weights version %d)", resumed, progress.weights_version)
    publisher = WeightsPublisher(run_dir, cfg.synchronizer.weights_versions_to_keep) if rank == 0 else None
    monitor = Monitor(run_dir, "trainer", monitor_type=cfg.monitor.monitor_type, enabled=rank == 0,
                      flush_interval_s=cfg.monitor.flush_interval_s)
    pad_id = actor.module.config.pad_token_id or actor.module.config.eos_token_id or 0
    if isinstance(pad_id, list):
        pad_id = pad_id[0]
    while steps is None or progress.step < steps:
        step = progress.step + 1
        t0 = time.perf_counter()
        batch = dse.broadcast_object(source.next_batch(step, progress.weights_version, stop.requested)
                                     if rank == 0 else None)
        if batch is None:
            break
        t_read = time.perf_counter() - t0
        stale = staleness_metrics(batch, progress.weights_version)
        metrics = train_step(actor, ref, batch, cfg, fns, info, step, pad_id)
        progress.step = step
        progress.cursor = source.cursor() if rank == 0 else {}
        t1 = time.perf_counter()
        if step % cfg.synchronizer.sync_interval == 0 or step == steps:
            publish_weights(actor, publisher, step, cfg.model.model_path, rank)
            progress.weights_version = step
        t_publish = time.perf_counter() - t1
        elapsed = time.perf_counter() - t0
        metrics.update(stale)
        metrics.update(time_read_s=t_read, time_publish_s=t_publish, time_step_s=elapsed,
                       tokens_per_s=metrics["batch_tokens"] / max(elapsed - t_read - t_publish, 1e-9),
                       weights_version=progress.weights_version)
        if rank == 0:
            metrics.update({f"buffer/{k}": v for k, v in source.stats().items()})
        monitor.log(step, metrics)
        if cfg.trainer.save_interval and step % cfg.trainer.save_interval == 0:
            save_full_checkpoint(cfg, run_dir, actor, source, progress, rank, info.world_size,
                                 final=step == steps)
        if dse.all_reduce_max(int(stop.requested())):
            break
    exit_code = EXIT_REQUEUE if dse.all_reduce_max(int(stop.requested())) else 0
    if progress.last_saved != progress.step and progress.step > 0:
        save_full_checkpoint(cfg, run_dir, actor, source, progress, rank, info.world_size, final=True)
    monitor.close()
    log.info("trainer stopped at step %d (exit code %d)", progress.step, exit_code)
    return exit_code


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m rft.trainer", description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="run config (YAML)")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. trainer.zero_stage=3")
    return p.parse_args(argv)


def setup_logging() -> None:
    import os

    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"%(asctime)s [rank{rank}] %(levelname)s %(name)s: %(message)s")


def main(argv: list[str] | None = None) -> None:
    setup_logging()
    args = parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        code = run(cfg)
    except RftError as e:
        log.error("%s", e)
        code = EXIT_USER_ERROR
    from rft import ds_engine as dse

    dse.teardown(code)


if __name__ == "__main__":
    sys.exit(main())
