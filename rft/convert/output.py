"""The Hugging Face folder of one step (``.../actor/huggingface``): crash recovery, user files, the swap.

A conversion fills the new folder under a temporary name (:func:`rft.atomic.tmp_name`) and swaps
it in with two renames (:func:`publish_replacing`). A SIGKILL can stop it anywhere, so the disk
is always in one of these states (``X`` = ``huggingface``):

  1. ``X/`` (the old folder, or none) and ``X.tmp.<host>.<pid>/`` being filled
  2. the old folder moved to ``X.previous/``; the new one complete under its temporary name
  3. the new one published as ``X/``; ``X.previous/`` not yet (or partly) deleted
  4. ``X/`` alone

:func:`recover`, run before a step is looked at, turns any of them into 4 or into 1 without the
temporary: in state 2 it renames ``X.previous/`` back, in state 3 it deletes it (``X/`` is
complete), and it deletes the temporaries of dead processes of this host. The old folder thus
exists under one of two names at every moment and is deleted only after the new one is complete
and durable, so the trainer's config and tokenizer in it (which the new folder copies, see
``rft.convert.cli.copy_side_files``) cannot be lost.

A reconversion replaces only the weight files that a conversion writes
(:func:`rft.safetensors_io.is_weights_file`: ``model.safetensors``,
``model-NNNNN-of-NNNNN.safetensors``, ``model.safetensors.index.json``); every other file or folder
of the old one (an adapter, ``training_args.bin``, ``eval/``) is carried into the new one
(:func:`carry_user_files`), hard-linked where the filesystem allows.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
from pathlib import Path
from typing import Callable

from rft.atomic import (
    TMP_MARK,
    fsync_dir,
    fsync_tree,
    is_tmp,
    pid_alive,
    publish_dir,
    remove_stale_tmp,
    tmp_owner,
)
from rft.errors import CheckpointError
from rft.safetensors_io import is_weights_file, weights_complete

log = logging.getLogger("rft.convert")

BACKUP_SUFFIX = ".previous"  # X.previous: the old folder during a swap (no .tmp: never cleaned as debris)
_LEGACY_BACKUP = ".old" + TMP_MARK  # X.old.tmp.<host>.<pid>: where rft-convert used to move it


def backup_path(final: Path) -> Path:
    """Where the old folder waits while ``final`` is being replaced."""
    return final.with_name(final.name + BACKUP_SUFFIX)


def recover(final: Path, complete: Callable[[Path], bool] = weights_complete) -> None:
    """Undo or finish an interrupted swap of ``final`` and delete dead temporaries (see above);
    ``complete`` tells whether a folder is whole (an adapter folder has other files than a model's)."""
    if not final.parent.is_dir():
        return
    _restore_legacy_backup(final)
    backup = backup_path(final)
    if backup.exists():
        if not final.exists():
            os.rename(backup, final)
            fsync_dir(final.parent)
            log.warning("%s restored from %s: a conversion was killed while replacing it", final, backup.name)
        elif complete(final):
            shutil.rmtree(backup)
            log.info("removed %s: a conversion was killed after publishing %s", backup, final)
        else:
            raise CheckpointError(
                f"both {final} and {backup} exist and {final} holds no complete weights, so it is "
                f"unclear which is yours; keep the one you want (rename it to {final.name}), move the "
                "other away, then rerun")
    for stale in remove_stale_tmp(final.parent, prefix=f"{final.name}."):
        log.info("removed %s, left by an interrupted conversion", stale)


def _restore_legacy_backup(final: Path) -> None:
    """An older rft-convert killed mid-swap left the old folder only as ``X.old.tmp.<host>.<pid>``."""
    if final.exists():
        return  # then it is a plain temporary: remove_stale_tmp deletes it
    for old in sorted(final.parent.glob(f"{final.name}{_LEGACY_BACKUP}.*")):
        owner = tmp_owner(old)
        if old.is_dir() and owner and owner[0] == socket.gethostname() and not pid_alive(owner[1]):
            os.rename(old, final)
            fsync_dir(final.parent)
            log.warning("%s restored from %s: a conversion was killed while replacing it", final, old.name)
            return


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
    2-4 of the module docstring (the old one is recoverable until the new one is durable)."""
    if not final.exists():
        publish_dir(tmp, final)
        return
    fsync_tree(tmp)  # the new folder is durable before the old one moves
    backup = backup_path(final)
    os.rename(final, backup)  # fails if a backup is left (recover() ran first): nothing is clobbered
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
