"""What every rft command shares: its ``--config``/``key=value`` arguments, logging, and how a
user error ends it (``error: ...`` on stderr, no traceback, exit code ``EXIT_USER_ERROR``).

Used by ``bin/*`` (through :mod:`rft.launch.cli`, :mod:`rft.convert.cli`, :mod:`rft.status`) and
by the roles' ``python -m`` entries (:mod:`rft.explorer.loop`, :mod:`rft.trainer.loop`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Callable

from rft.errors import ERROR_PREFIX, EXIT_OK, EXIT_USER_ERROR, RftError, storage_error
from rft.lease import TAKE_OVER_ENV
from rft.placement import process_rank

PLUGIN_DIRS_ENV = "RFT_PLUGIN_DIRS"  # os.pathsep-separated folders of workflow plugin modules
TRINITY_PLUGIN_DIRS_ENV = "TRINITY_PLUGIN_DIRS"  # Trinity's spelling, read too


def config_parser(
    prog: str,
    description: str,
    epilog: str | None = None,
    stage: bool = False,
    take_over: bool = False,
) -> argparse.ArgumentParser:
    """A parser with ``--config FILE`` and trailing ``key=value`` overrides (and, for the roles,
    ``--stage I``: run stage I of a staged config, see :mod:`rft.stages`; for the commands that
    start roles, ``--take-over``: :func:`add_take_over`)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=epilog
        or "Overrides use dotted key paths, e.g. buffer.batch_size=4 "
        "buffer.explorer_input.taskset.split=test",
    )
    parser.add_argument("--config", required=True, help="YAML config (Trinity-RFT keys)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    parser.add_argument(
        "--plugin-dir",
        action="append",
        default=[],
        type=_plugin_dir,
        metavar="DIR",
        help="a folder of workflow modules to import (repeatable; "
        f"also {PLUGIN_DIRS_ENV} / {TRINITY_PLUGIN_DIRS_ENV})",
    )
    if stage:
        parser.add_argument("--stage", type=int, default=None, help="run this stage of the config")
    if take_over:
        add_take_over(parser)
    return parser


class _TakeOver(argparse.Action):
    """``--take-over`` sets :data:`~rft.lease.TAKE_OVER_ENV`, so every process this command
    starts (roles, SLURM tasks, requeues) takes its lease over."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # noqa: ANN001
        os.environ[TAKE_OVER_ENV] = "1"
        setattr(namespace, self.dest, True)


def add_take_over(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--take-over",
        nargs=0,
        action=_TakeOver,
        default=False,
        help="take the run directory over from a live trainer/explorer of the same name "
        "(it stops at its next save; see docs/reliability.md: run-directory ownership)",
    )


def _plugin_dir(path: str) -> str:
    """``--plugin-dir``: prepended to :data:`PLUGIN_DIRS_ENV`, so every process this command
    starts (roles, SLURM tasks) imports the same plugins."""
    folder = os.path.abspath(path)
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"plugin directory {folder} does not exist")
    os.environ[PLUGIN_DIRS_ENV] = os.pathsep.join(
        p for p in (folder, os.environ.get(PLUGIN_DIRS_ENV, "")) if p
    )
    return folder


def setup_logging(timestamps: bool = True) -> None:
    """stdlib logging to stderr; only rank 0 of a role logs INFO (the others WARNING)."""
    rank = process_rank(os.environ)
    when = "%(asctime)s " if timestamps else ""
    who = f"[rank{rank}] " if "RANK" in os.environ else ""
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"{when}{who}%(levelname)s %(name)s: %(message)s",
    )


def run_command(body: Callable[[], int | None]) -> int:
    """Run a command's body; an :class:`~rft.errors.RftError`, or an OSError a user can fix
    (:func:`~rft.errors.storage_error`: full disk, read-only...), prints its message alone and
    returns ``EXIT_USER_ERROR``."""
    try:
        return body() or EXIT_OK
    except RftError as e:
        print(f"{ERROR_PREFIX}{e}", file=sys.stderr, flush=True)
        return EXIT_USER_ERROR
    except OSError as e:
        user = storage_error(e, doing="use")
        if user is None:
            raise
        print(f"{ERROR_PREFIX}{user}", file=sys.stderr, flush=True)
        return EXIT_USER_ERROR
