"""Exceptions a user can cause, the exit codes of every rft command, and "did you mean" hints.

Internal invariants use ``assert``; everything that bad input, a bad config or a broken file
on disk can trigger raises one of these, so command-line tools can print the message alone
(no traceback) and exit with the codes below (:mod:`rft.entry` does that for every command).
"""

from __future__ import annotations

import difflib
from typing import Iterable

EXIT_OK = 0
EXIT_FAILED = 1  # a role or a job failed; its log was shown
EXIT_USER_ERROR = 2  # a message was printed: bad config, missing file, refused job
EXIT_INTERRUPTED = 130  # stopped by Ctrl-C (the trainer checkpointed first)
EXIT_REQUEUE = 143  # the trainer stopped on SIGUSR1/SIGTERM after a full checkpoint: requeue


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


class SyncTimeoutError(RftError):
    """Waited longer than synchronizer.sync_timeout for weights or experiences."""


class WorkflowError(RftError):
    """A workflow class could not be found or loaded, or returned experiences that do not fit."""


class SlurmError(RftError):
    """sbatch missing, a submission refused, or a job that failed."""


def nearest(name: object, options: Iterable[object]) -> str | None:
    """The closest option to a misspelt name, or None when nothing is close."""
    found = difflib.get_close_matches(str(name), [str(o) for o in options], n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(name: object, options: Iterable[object]) -> str:
    """`` Did you mean 'x'?`` for the nearest option, or an empty string."""
    hint = nearest(name, options)
    return f" Did you mean {hint!r}?" if hint else ""
