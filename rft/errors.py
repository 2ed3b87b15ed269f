"""Exceptions a user can cause, the exit codes of every rft command, and "did you mean" hints.

Internal invariants use ``assert``; everything that bad input, a bad config or a broken file
on disk can trigger raises one of these, so command-line tools can print the message alone
(no traceback) and exit with the codes below (:mod:`rft.entry` does that for every command).
:func:`storage_error` is the one map from OS errors a user can fix (full disk, read-only,
permissions, a file where a folder belongs) to a :class:`StorageError` naming path and fix.
"""

from __future__ import annotations

import difflib
import errno
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Collection, Iterable, Iterator

EXIT_OK = 0
EXIT_FAILED = 1  # a role or a job failed; its log was shown
EXIT_USER_ERROR = 2  # a message was printed: bad config, missing file, refused job
EXIT_INTERRUPTED = 130  # stopped by Ctrl-C (the trainer checkpointed first)
EXIT_REQUEUE = 143  # the trainer stopped on SIGUSR1/SIGTERM after a full checkpoint: requeue
ERROR_PREFIX = "error: "  # how a command prints a user error: launchers find it in role logs


class RftError(Exception):
    """Base class: an error whose message is meant for the user."""


class ConfigError(RftError):
    """A config key, value or type is wrong (the message names the full key path)."""


class NotSupportedError(ConfigError):
    """A recognised Trinity-RFT option that rft does not implement yet."""


class DataError(RftError):
    """A dataset, taskset or buffer file is missing, malformed or incompatible."""


class CheckpointError(RftError):
    """A checkpoint or weights folder is missing, incomplete or inconsistent."""


class DeltaError(CheckpointError):
    """A delta weights folder cannot be applied: its base is gone or differs, its index or a
    frame's checksum does not match."""


class SyncTimeoutError(RftError):
    """Waited longer than synchronizer.sync_timeout for weights or experiences."""


class WorkflowError(RftError):
    """A workflow class could not be found or loaded, or returned experiences that do not fit."""


class EpisodesFailedError(WorkflowError):
    """An explorer stopped because its workflow's episodes kept failing
    (``explorer.max_failed_steps``, ``explorer.max_failed_share``), or a reader of its buffer
    ends because it did."""


class SlurmError(RftError):
    """sbatch missing, a submission refused, or a job that failed."""


class LeaseError(RftError):
    """The run directory's role is held by a live instance, or this instance lost it."""


class StorageError(RftError, OSError):
    """The filesystem refused something its user can fix: a full disk or quota, a read-only or
    protected folder, a file where a folder belongs. Also an OSError, so code that rides out
    filesystem hiccups (heartbeat threads) still catches it."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


_OS_FIXES = {  # errno -> what the user does about it (the OS's own words come first)
    errno.ENOSPC: "free space on that filesystem, or move the run (checkpoint_root_dir) to one "
    "with room",
    errno.EDQUOT: "free space within your quota (or ask for more), or move the run "
    "(checkpoint_root_dir) to another filesystem",
    errno.EROFS: "remount it read-write, or put the run (checkpoint_root_dir) on a writable "
    "filesystem",
    errno.EACCES: "give your user access to it (chmod/chown), or put the run "
    "(checkpoint_root_dir) in a folder you own",
}
_OS_FIXES[errno.EPERM] = _OS_FIXES[errno.EACCES]
_WRONG_KIND = (errno.ENOTDIR, errno.EEXIST, errno.EISDIR)


def file_in_the_way(path: Path | str) -> Path | None:
    """The nearest of ``path`` and its parents that exists and is not a folder (the file that
    keeps ``path`` from being created as a folder), or None."""
    path = Path(os.path.abspath(path))
    existing = next((p for p in (path, *path.parents) if os.path.lexists(p)), None)
    return existing if existing is not None and not existing.is_dir() else None


def storage_error(
    e: OSError, path: Path | str | None = None, doing: str = "write"
) -> StorageError | None:
    """The user's error for an OSError they can fix (full disk, read-only, permissions, a file
    where a folder is expected or the reverse), naming ``path`` (default: the error's own
    file name) and the fix; None for faults no user causes (kept as tracebacks: bugs, I/O)."""
    if isinstance(e, StorageError):
        return e
    where = path if path is not None else e.filename
    if e.errno in _OS_FIXES:
        fix = _OS_FIXES[e.errno]
    elif e.errno in _WRONG_KIND and where is not None:
        if e.errno == errno.EISDIR:
            fix = f"{where} is a folder, not a file: move the folder away"
        else:
            blocker = file_in_the_way(e.filename if e.filename is not None else where)
            if blocker is None:
                return None  # a race or a bug, not the user's layout
            fix = (
                f"{blocker} is a file, not a folder: move the file away, or choose another "
                "path (checkpoint_root_dir must name a folder)"
            )
    else:
        return None
    target = f" {where}" if where is not None else ""
    detail = os.strerror(e.errno)
    refused = None if e.filename is None else str(e.filename)
    if refused is not None and refused != str(where) and not refused.startswith(f"{where}."):
        detail += f": {refused}"  # the file the OS refused, unless ``where`` or its temporary
    error = StorageError(f"cannot {doing}{target} ({detail}): {fix}")
    error.errno, error.filename = e.errno, where
    return error


@contextmanager
def storage_errors(path: Path | str | None = None, doing: str = "write") -> Iterator[None]:
    """Raise the OS errors of the block a user can fix as :func:`storage_error` (others pass)."""
    try:
        yield
    except OSError as e:
        user = storage_error(e, path, doing)
        if user is None or user is e:
            raise
        raise user from e


def nearest(name: object, options: Iterable[object]) -> str | None:
    """The closest option to a misspelt name, or None when nothing is close."""
    found = difflib.get_close_matches(str(name), [str(o) for o in options], n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(
    name: object, options: Iterable[object], exclude: Collection[str] = frozenset()
) -> str:
    """`` Did you mean 'x'?`` for the nearest option, or an empty string; never for a name in
    ``exclude`` (callers pass :data:`rft.config.known_names.TRINITY_NAMES`: a real Trinity name
    rft lacks is refused as such, not taken for a typo)."""
    hint = None if str(name) in exclude else nearest(name, options)
    return f" Did you mean {hint!r}?" if hint else ""


def refuse_unknown_keys(what: str, given: Iterable[str], known: Iterable[str]) -> None:
    """WorkflowError for the first of ``given`` not in ``known``, with a "did you mean" and the
    valid keys (``what``: the message's start, e.g. "openenv_env: unknown workflow_args key")."""
    known = list(known)
    for key in given:
        if key not in known:
            raise WorkflowError(
                f"{what} {key!r}.{did_you_mean(key, known)} Valid keys: {sorted(known)}"
            )
