"""The trainer's durable state in the run directory: full checkpoints, their metadata, resume.

Data in: what every rank wrote into a staging folder, the step's metadata. Data out: complete
``global_step_N`` checkpoints on the shared filesystem, the pointer, pruning, and what resume
reads back. A crash at any point must leave the previous checkpoint as the newest complete one.
Holds no deepspeed import: the engine calls go through :mod:`rft.trainer.engine`.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from pathlib import Path
from typing import Any

import torch

from rft import atomic
from rft.errors import CheckpointError
from rft.lease import NO_FENCE, Fence, fenced
from rft.rundir import (
    ACTOR_DIR,
    CHECKPOINT_POINTER,
    HF_DIR,
    LEASE_GENERATION,
    STEP_PREFIX,
    TRAINER_META,
    WEIGHTS_POINTER,
    step_dir,
    step_of,
)

log = logging.getLogger(__name__)

META_FORMAT = 1

# Layout written here (all on the shared filesystem):
#   global_step_N/actor/<tag>/...             DeepSpeed model + optimizer shards (every rank)
#   global_step_N/actor/latest                the tag (DeepSpeed's own pointer)
#   global_step_N/actor/huggingface/          config + tokenizer (+ weights: save_hf_checkpoint)
#   global_step_N/actor/rng_state_rank{r}.pt  RNG states per rank
#   global_step_N/trainer_meta.json           step, buffer cursor, weights version, lr, world size
#   latest_checkpointed_iteration.txt         N, written last: the checkpoint is complete
#   trainer_meta.json                         copy of the newest checkpoint's metadata


def ds_tag(step: int) -> str:
    return f"global_step{step}"


def list_checkpoints(run_dir: Path) -> list[int]:
    """Steps with a ``global_step_N`` folder (complete or not), ascending."""
    if not run_dir.is_dir():
        return []
    return sorted(s for s in map(step_of, run_dir.iterdir()) if s is not None)


def newest_complete(run_dir: Path) -> int | None:
    """The step the pointer names, checked to have its metadata; None for a fresh run."""
    step = atomic.read_pointer(run_dir / CHECKPOINT_POINTER)
    if step is None:
        return None
    if not (step_dir(run_dir, step) / TRAINER_META).is_file():
        raise CheckpointError(
            f"{run_dir / CHECKPOINT_POINTER} names step {step} but {step_dir(run_dir, step) / TRAINER_META} "
            "is missing; restore that folder, or point the file at an older complete "
            "global_step_N (or delete it to start over)"
        )
    return newer_owners_checkpoint(run_dir, step) or step


def newer_owners_checkpoint(run_dir: Path, step: int) -> int | None:
    """A complete checkpoint written under a newer trainer lease than the pointer's ``step``
    (the pointer was moved back by a displaced trainer that the fence missed): the newest
    such step, else None. Checkpoints without a generation (older rft) are not compared."""

    def generation(s: int) -> int | None:
        try:
            gen = json.loads((step_dir(run_dir, s) / TRAINER_META).read_text()).get(
                LEASE_GENERATION
            )
        except (OSError, ValueError):
            return None
        return gen if isinstance(gen, int) else None

    pointed = generation(step)
    if pointed is None:
        return None
    newer = [(gen, s) for s in list_checkpoints(run_dir) if (gen := generation(s)) is not None]
    gen, newest = max(newer, default=(pointed, step))
    if gen <= pointed:
        return None
    log.warning(
        "%s names step %d (trainer lease %d) but %s was written by a newer trainer (lease %d): "
        "resuming from it (to resume from step %d, remove %s)",
        CHECKPOINT_POINTER,
        step,
        pointed,
        step_dir(run_dir, newest).name,
        gen,
        step,
        step_dir(run_dir, newest),
    )
    return newest


def read_meta(run_dir: Path, step: int) -> dict[str, Any]:
    path = step_dir(run_dir, step) / TRAINER_META
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {path}: {e}; resume from an older checkpoint") from e
    if meta.get("format", 0) > META_FORMAT:
        raise CheckpointError(f"{path} was written by a newer rft; upgrade rft to resume")
    return meta


def rng_state() -> dict[str, Any]:
    import numpy as np

    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def rng_path(actor_dir: Path, rank: int) -> Path:
    return actor_dir / f"rng_state_rank{rank}.pt"


def save_rng(actor_dir: Path, rank: int) -> None:
    torch.save(rng_state(), rng_path(actor_dir, rank))


def load_rng(actor_dir: Path, rank: int) -> None:
    path = rng_path(actor_dir, rank)
    if not path.is_file():
        log.warning("%s missing: random state not restored", path)
        return
    set_rng_state(torch.load(path, weights_only=False))


def temporary_prefixes() -> tuple[str, ...]:
    """Names of the temporaries the trainer leaves in the run directory's root when killed
    mid-write (staged checkpoints, pointer and metadata files): removed at start when their
    writer is dead (:func:`rft.lease.remove_dead_tmp`)."""
    return (STEP_PREFIX, CHECKPOINT_POINTER, TRAINER_META, WEIGHTS_POINTER)


def staging_dir(run_dir: Path, step: int) -> Path:
    """Rank 0's temporary name for a checkpoint being written (broadcast to the other ranks):
    ``global_step_N.tmp.<host>.<pid>``."""
    final = step_dir(run_dir, step)
    for path in atomic.remove_stale_tmp(run_dir, prefix=final.name):
        log.info("removed %s (checkpoint left by a dead trainer)", path)
    tmp = atomic.tmp_name(final)
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / ACTOR_DIR / HF_DIR).mkdir(parents=True)
    return tmp


def finish_checkpoint(
    run_dir: Path,
    tmp: Path,
    step: int,
    meta: dict[str, Any],
    keep: int | None,
    fence: Fence = NO_FENCE,
) -> Path:
    """Rank 0, after every rank wrote into ``tmp``: metadata, rename, pointer, pruning, each
    right after ``fence`` said this trainer still owns the run. The pointer is replaced only
    after the rename, so a crash at any point leaves the previous checkpoint as the newest
    complete one."""
    final = step_dir(run_dir, step)
    meta = {"format": META_FORMAT, **meta, "step": step}
    with fenced(fence, f"finishing checkpoint {final.name}"):
        fence.check(f"finishing checkpoint {final.name}")
        atomic.write_json(tmp / TRAINER_META, meta)
        fence.check(f"moving checkpoint {final.name} into place")
        if final.exists():  # resumed from an earlier step and reached this one again
            log.warning("replacing %s (written before a resume from an earlier step)", final)
            doomed = atomic.tmp_name(final.with_name(final.name + ".old"))
            final.rename(doomed)
            shutil.rmtree(doomed, ignore_errors=True)
        atomic.publish_dir(tmp, final)
        fence.check(f"pointing {CHECKPOINT_POINTER} at step {step}")
        atomic.write_pointer(run_dir / CHECKPOINT_POINTER, step)
        fence.check(f"writing {TRAINER_META} of step {step}")
        atomic.write_json(run_dir / TRAINER_META, meta)
    prune(run_dir, keep, step, fence)
    return final


def prune(run_dir: Path, keep: int | None, newest: int, fence: Fence = NO_FENCE) -> list[int]:
    """Delete all but the newest ``keep`` complete checkpoints (never the pointer's)."""
    if keep is None:
        return []
    steps = [s for s in list_checkpoints(run_dir) if s <= newest]
    doomed = [s for s in steps[:-keep] if s != newest]
    for s in doomed:
        fence.check(f"removing checkpoint {step_dir(run_dir, s).name}")
        shutil.rmtree(step_dir(run_dir, s), ignore_errors=True)
    if doomed:
        log.info("removed checkpoints %s (trainer.max_checkpoints_to_keep=%d)", doomed, keep)
    return doomed
