"""The Hugging Face folder of one step (``.../actor/huggingface``): crash recovery, the swap.

A conversion fills ``X.tmp.<host>.<pid>/`` and :func:`publish_replacing` swaps it in for ``X``
by way of ``X.previous/``; :func:`recover`, run before a step is looked at, undoes or finishes a
swap a SIGKILL interrupted, so the old folder (the trainer's config and tokenizer) is never
lost. A reconversion replaces only the weight files (:func:`rft.safetensors_io.is_weights_file`);
:func:`carry_user_files` brings every other file of the old folder along. Nothing here reads
or writes tensors; a symlinked ``X`` is followed (:func:`output_target`).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Callable

from rft.atomic import (
    fsync_dir,
    fsync_tree,
    is_tmp,
    publish_dir,
    remove_stale_tmp,
)
from rft.errors import CheckpointError, storage_errors
from rft.safetensors_io import is_weights_file, weights_complete

log = logging.getLogger(__name__)

BACKUP_SUFFIX = (
    ".previous"  # X.previous: the old folder during a swap (no .tmp: never cleaned as debris)
)


def output_target(final: Path) -> Path:
    """The folder a conversion writes: ``final``, or where it links to when it is a symlink
    (a natural way to keep converted models on another disk). The swap happens beside the
    target, so the link itself is never replaced."""
    return Path(os.path.realpath(final)) if final.is_symlink() else final


def output_problem(final: Path) -> str | None:
    """Why no folder can be written at ``final`` (a file is there, or it links to a file or
    into a folder that does not exist), as a message saying what to do; None if one can."""
    target = output_target(final)
    link = f"{final} links to {target}, which" if target != final else f"{final}"
    if target.exists() and not target.is_dir():
        return (
            f"{link} is a file, not a folder; rft-convert writes the Hugging Face folder "
            "there: move the file away (or point the link at a folder) and rerun"
        )
    if target != final and not target.parent.is_dir():
        return (
            f"{final} links to {target}, but {target.parent} does not exist; create it "
            f"(mkdir -p {target.parent}) or fix the link, then rerun"
        )
    return None


def backup_path(final: Path) -> Path:
    """Where the old folder waits while ``final`` is being replaced."""
    return final.with_name(final.name + BACKUP_SUFFIX)


def recover(final: Path, complete: Callable[[Path], bool] = weights_complete) -> None:
    """Undo or finish an interrupted swap of ``final`` and delete dead temporaries;
    ``complete`` tells whether a folder is whole (an adapter folder has other files than a model's).

    A swap goes through four states (``X`` = ``final``): 1. ``X/`` (or none) and ``X.tmp.*/``
    being filled; 2. ``X.previous/`` and the complete new folder under its temporary name;
    3. the new ``X/`` and ``X.previous/`` not yet (or partly) deleted; 4. ``X/`` alone. This
    turns each into 4, or into 1 without the temporary.
    """
    if not final.parent.is_dir():
        return
    with storage_errors(final, "repair"):  # a read-only checkpoint folder: a message
        backup = backup_path(final)
        if backup.exists():
            if not final.exists():  # state 2: the new folder was never published
                os.rename(backup, final)
                fsync_dir(final.parent)
                log.warning(
                    "%s restored from %s: a conversion was killed while replacing it",
                    final,
                    backup.name,
                )
            elif complete(final):  # state 3
                shutil.rmtree(backup)
                log.info("removed %s: a conversion was killed after publishing %s", backup, final)
            else:
                raise CheckpointError(
                    f"both {final} and {backup} exist and {final} holds no complete weights, so "
                    f"it is unclear which is yours; keep the one you want (rename it to "
                    f"{final.name}), move the other away, then rerun"
                )
        for stale in remove_stale_tmp(final.parent, prefix=f"{final.name}."):
            log.info("removed %s, left by an interrupted conversion", stale)


def carry_user_files(old: Path, new: Path) -> list[str]:
    """Put into ``new`` what ``old`` holds besides weight files and what ``new`` already has
    (hard links, else copies); return the names carried, folders with a trailing ``/``."""
    if not old.is_dir():
        return []
    carried = []
    for src in sorted(old.iterdir()):
        dst = new / src.name
        if is_weights_file(src.name) or is_tmp(src.name) or os.path.lexists(dst):
            continue
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        elif src.is_dir():
            shutil.copytree(src, dst, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(src, dst)
        carried.append(src.name + ("/" if src.is_dir() and not src.is_symlink() else ""))
    return carried


def _link_or_copy(src: str | Path, dst: str | Path) -> None:
    try:
        os.link(src, dst)  # no bytes copied; the old folder keeps its own link until it is deleted
    except OSError:
        shutil.copy2(src, dst)


def publish_replacing(tmp: Path, final: Path) -> None:
    """Make the filled folder ``tmp`` the folder ``final``, replacing an old one through states
    2-4 of :func:`recover` (the old one is recoverable until the new one is durable)."""
    if not final.exists():
        publish_dir(tmp, final)
        return
    fsync_tree(tmp)  # the new folder is durable before the old one moves
    backup = backup_path(final)
    os.rename(
        final, backup
    )  # fails if a backup is left (recover() ran first): nothing is clobbered
    try:
        os.rename(tmp, final)
    except BaseException:
        os.rename(backup, final)
        raise
    fsync_dir(final.parent)
    try:
        shutil.rmtree(backup)
    except OSError as e:  # published already; the next run's recover() deletes the rest
        log.warning("could not delete %s (%s); the next rft-convert run deletes it", backup, e)
