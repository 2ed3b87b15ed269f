"""Full trainer checkpoints: where a run resumes, and writing one under the trainer lease.

Data in: the engines (:mod:`rft.trainer.engine`), the loop's position, the run directory's
trainer lease. Data out: ``global_step_N/`` (DeepSpeed shards, RNG states, the HF folder) made
visible by :func:`rft.trainer.state.finish_checkpoint`, the consumed buffer input released.
Rank 0 holds the lease; every check of it is collective so no rank waits alone. The folder
protocol itself (staging, meta, pointer, pruning) is :mod:`rft.trainer.state`'s.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rft.config.queries import uses_critic
from rft.config.schema import Config
from rft.errors import LeaseError, RftError
from rft.lease import NO_FENCE, Fence, Lease, fenced, remove_dead_tmp
from rft.models import tokenizer_files
from rft.rundir import ACTOR_DIR, CRITIC_DIR, HF_DIR, LEASE_GENERATION, TRAINER_LEASE, step_dir
from rft.trainer.state import (
    ds_tag,
    finish_checkpoint,
    newest_complete,
    read_meta,
    save_rng,
    staging_dir,
    temporary_prefixes,
)

if TYPE_CHECKING:
    from rft.trainer import engine
    from rft.trainer.dpo import DpoSource
    from rft.trainer.inputs import BufferSource, FileSource
    from rft.trainer.mix import MixSource

    Source = BufferSource | FileSource | MixSource | DpoSource  # the trainer's input (rank 0)

log = logging.getLogger(__name__)


@dataclass
class LoopPosition:
    """What a checkpoint records besides the engine: where the loop is."""

    step: int = 0  # last completed step
    weights_version: int = 0  # last published weights version (0: the initial model)
    cursor: dict[str, Any] = field(default_factory=dict)  # input position after `step`
    last_saved: int = -1


def resume_point(cfg: Config, run_dir: Path, world_size: int) -> tuple[int | None, dict[str, Any]]:
    """(step, metadata) of the newest complete checkpoint, or (None, {}) for a fresh start."""
    if not cfg.continue_from_checkpoint:
        return None, {}
    step = newest_complete(run_dir)
    if step is None:
        return None, {}
    meta = read_meta(run_dir, step)
    if meta.get("critic", False) != uses_critic(cfg):
        raise RftError(
            f"checkpoint {step_dir(run_dir, step)} was written "
            f"{'with' if meta.get('critic') else 'without'} a critic but this config "
            f"{'trains' if uses_critic(cfg) else 'trains no'} critic "
            f"(algorithm.advantage_fn {cfg.algorithm.advantage_fn!r}); resume with the "
            "run's algorithm, or start a new run (another name)"
        )
    if meta.get("world_size") != world_size:
        raise RftError(
            f"checkpoint {step_dir(run_dir, step)} was written by "
            f"{meta.get('world_size')} ranks but this run has {world_size}; DeepSpeed "
            "cannot reshard on resume: relaunch with that many ranks"
        )
    return step, meta


def claim_run_dir(cfg: Config, run_dir: Path, rank: int) -> Lease | None:
    """Rank 0 takes the run directory's trainer lease and removes its dead writers' temporaries
    (before anything is written); a refusal is raised on every rank, so none waits alone in a
    collective. Returns rank 0's held, beating lease (None on the other ranks)."""
    from rft.trainer import engine

    lease, refused = None, None
    if rank == 0:
        try:
            lease = Lease.acquire(
                run_dir,
                TRAINER_LEASE,
                cfg.explorer.heartbeat_interval_s,
                cfg.explorer.heartbeat_timeout_s,
            ).start()
        except LeaseError as e:
            refused = str(e)
    refused = engine.broadcast_object(refused)
    if refused is not None:
        raise LeaseError(refused)
    if lease is not None:
        remove_dead_tmp(run_dir, temporary_prefixes(), cfg.explorer.heartbeat_timeout_s)
    return lease


def check_lease(lease: Lease | None, before: str) -> None:
    """Collective: stop every rank with :class:`LeaseError` if rank 0 lost the trainer lease
    (another trainer took the run directory over), before ``before`` is written."""
    from rft.trainer import engine

    message = engine.broadcast_object(None if lease is None else lease.lost_message(before))
    if message is not None:
        raise LeaseError(message)


def _save_engine(
    cfg: Config, model: engine.Actor, folder: Path, step: int, rank: int, final: bool, *, rng: bool
) -> None:
    """One engine's DeepSpeed shards, the RNG states (``rng``) and its HF folder (config, and
    the weights when ``trainer.save_hf_checkpoint`` says so; a LoRA policy's adapter folder,
    always) into ``folder``. Collective."""
    from rft.atomic import copy_files
    from rft.trainer import engine

    engine.save_checkpoint(model, folder, ds_tag(step))
    if rng:
        save_rng(folder, rank)
    if model.lora:  # the adapter folder, always: it is small
        from rft.trainer.lora import save_adapter_folder

        state = engine.gather_adapter(model)
        if rank == 0:
            save_adapter_folder(model.module, state, folder / HF_DIR)
        return
    mode = cfg.trainer.save_hf_checkpoint
    state = engine.gather_weights(model) if mode == "always" or (mode == "last" and final) else None
    engine.barrier()
    if rank == 0:
        engine.save_hf_folder(model, state, folder / HF_DIR)
        copy_files(tokenizer_files(cfg.model.model_path), folder / HF_DIR)


def save_full_checkpoint(
    cfg: Config,
    run_dir: Path,
    actor: engine.Actor,
    source: Source | None,
    progress: LoopPosition,
    rank: int,
    world_size: int,
    final: bool,
    critic: engine.Actor | None = None,
    lease: Lease | None = None,
    fence: Fence = NO_FENCE,
) -> None:
    """Every rank writes its shards; rank 0 finishes (meta, rename, pointer) and releases input.
    The trainer lease is checked before the shards and again before the checkpoint is made
    visible (shards of a large model take minutes: a take-over meanwhile is caught there), and
    ``fence`` (every rank's view of it) right before each visible write."""
    from rft.trainer import engine

    what = f"writing checkpoint {step_dir(run_dir, progress.step).name}"
    check_lease(lease, what)
    tmp = engine.broadcast_object(staging_dir(run_dir, progress.step) if rank == 0 else None)
    with fenced(fence, what):  # a new owner may have removed our staging folder meanwhile
        _save_engine(cfg, actor, tmp / ACTOR_DIR, progress.step, rank, final, rng=True)
        if critic is not None:
            _save_engine(cfg, critic, tmp / CRITIC_DIR, progress.step, rank, final, rng=False)
    try:
        check_lease(lease, what)
    except LeaseError:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)  # ours: never published
        raise
    if rank == 0:
        meta = {
            "buffer_cursor": progress.cursor,
            "weights_version": progress.weights_version,
            "world_size": world_size,
            "zero_stage": cfg.trainer.zero_stage,
            "lr": engine.current_lr(actor),
            "time": time.time(),
            "lr_scheduler": actor.engine.lr_scheduler.state_dict(),
            "critic": critic is not None,
            LEASE_GENERATION: lease.gen if lease is not None else None,
        }
        keep = cfg.trainer.max_checkpoints_to_keep
        finish_checkpoint(run_dir, tmp, progress.step, meta, keep, fence)
        fence.check("removing the buffer segments the checkpoint consumed")
        source.release(progress.cursor)
        log.info("checkpoint global_step_%d saved", progress.step)
    progress.last_saved = progress.step
    engine.barrier()
