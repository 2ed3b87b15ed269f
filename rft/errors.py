"""Exceptions a user can cause. Each message says what was wrong and what to do.

Internal invariants use ``assert``; everything that bad input, a bad config or a broken file
on disk can trigger raises one of these, so command-line tools can print the message alone
(no traceback) and exit non-zero, with the exit codes below.
"""

EXIT_USER_ERROR = 2  # a message was printed: bad config, missing file, refused job
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
