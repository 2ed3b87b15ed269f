"""Why an explorer task stopped on failing episodes: ``failures/<writer>.json``, one per writer.

The explorer writes its record (atomically, under its lease) just before it exits with
:class:`~rft.errors.EpisodesFailedError`. The record names the writer's lease generation: once
a new instance of the writer claims the lease (the user fixed the workflow and relaunched),
readers ignore the record at once, and the new instance removes it. Readers never wait on a
stopped explorer: the trainer ends with the explorer's message instead of waiting out
``sync_timeout``, and ``rft-run``/``rft-status`` print it. Only the message and where it
happened are recorded; the traceback stays in the explorer's log.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rft import atomic
from rft.errors import LeaseError
from rft.lease import newest_claim
from rft.rundir import FAILURES_DIR, LEASE_GENERATION

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExplorerFailure:
    """One explorer task's stop: its writer name, the step it stopped at and the message."""

    writer: str
    step: int
    message: str  # one line: why it stopped, the workflow, the task and the first error
    lease_generation: int  # the writer's lease when it stopped (a newer lease: a new instance)
    at: float = field(default_factory=time.time)  # when (epoch seconds)


assert LEASE_GENERATION in ExplorerFailure.__dataclass_fields__  # the JSON key readers use


def failure_path(run_dir: Path | str, writer: str) -> Path:
    return Path(run_dir) / FAILURES_DIR / f"{writer}.json"


def record_failure(run_dir: Path | str, failure: ExplorerFailure) -> None:
    """Write ``failure`` for its writer (replacing an older one)."""
    path = failure_path(run_dir, failure.writer)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_json(path, asdict(failure))


def clear_failure(run_dir: Path | str, writer: str) -> None:
    """A new instance of ``writer`` starts: its previous instance's record no longer holds."""
    path = failure_path(run_dir, writer)
    if path.exists():
        log.info("%s starts again: removing the record of its previous stop (%s)", writer, path)
        path.unlink(missing_ok=True)


def read_failures(run_dir: Path | str, writers: list[str] | None = None) -> list[ExplorerFailure]:
    """The stops that hold (of ``writers`` only, when given), oldest first: those whose writer
    has claimed no newer lease since. A damaged record is still a stop (its text unknown)."""
    folder = Path(run_dir) / FAILURES_DIR
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        if atomic.is_tmp(path) or (writers is not None and path.stem not in writers):
            continue
        try:
            fields = json.loads(path.read_text())
            failure = ExplorerFailure(
                str(fields["writer"]),
                int(fields["step"]),
                str(fields["message"]),
                int(fields[LEASE_GENERATION]),
                float(fields.get("at", 0.0)),
            )
        except (OSError, ValueError, KeyError, TypeError) as e:
            failure = ExplorerFailure(path.stem, -1, f"stopped on failures ({path}: {e})", -1, 0.0)
        if failure.lease_generation < 0 or not _relaunched(Path(run_dir), failure):
            out.append(failure)
    return sorted(out, key=lambda f: f.at)


def _relaunched(run_dir: Path, failure: ExplorerFailure) -> bool:
    """Whether a newer instance of the failure's writer has claimed its lease since."""
    try:
        newest, _ = newest_claim(run_dir, failure.writer)
    except LeaseError as e:  # a damaged claim: the record holds
        log.warning(
            "explorer %s: lease unreadable (%s); its recorded stop holds", failure.writer, e
        )
        return False
    return newest > failure.lease_generation
