"""Explorer heartbeats: ``explorers/<name>.json``, one per explorer, rewritten atomically.

An explorer's :class:`Heartbeat` says which weights version it has loaded or is loading (the
publisher never prunes those), how far it got and whether it finished; every reader (trainer,
launchers, ``rft-status``) goes through :func:`read_heartbeats`, which also reads the writer's
lease (:mod:`rft.lease`): a released one means exited, a live one without a heartbeat yet means
an explorer still starting. The fields are the attributes of :class:`BeatFields`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any

from rft import atomic
from rft.errors import CheckpointError, LeaseError, storage_errors
from rft.lease import LeaseView, live_holders, newest_claim
from rft.rundir import EXPLORERS_DIR, LEASE_GENERATION, TRAINER_LEASE

log = logging.getLogger(__name__)

FINISHED_FIELD = "finished"  # heartbeat field: the explorer generated all its tasks
LOADED_FIELD = "loaded_version"  # heartbeat field: weights version in the engine (None: unknown)
LOADING_FIELD = "loading_version"  # heartbeat field: version being read from weights/ now
EVALUATING_FIELD = "evaluating"  # heartbeat field: an evaluation is running (launchers wait for it)
EXITED_FIELD = "exited"  # heartbeat field: the explorer stopped (dead at once for readers)
STEPS_FIELD = "steps_done"  # heartbeat field: explorer steps finished
TASKS_FIELD = "tasks_done"  # heartbeat field: tasks generated
TIME_FIELD = "time"  # heartbeat field: when it was last written (readers judge liveness by it)
STARTED_FIELD = "started_time"  # heartbeat field: when its explorer instance began beating


@dataclass
class BeatFields:
    """What one heartbeat file holds; the attribute names are its JSON keys."""

    name: str
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    slurm_job_id: str | None = field(default_factory=lambda: os.environ.get("SLURM_JOB_ID"))
    slurm_procid: str | None = field(default_factory=lambda: os.environ.get("SLURM_PROCID"))
    loaded_version: int | None = None
    loading_version: int | None = None
    tasks_done: int = 0
    steps_done: int = 0
    started_time: float = field(default_factory=time.time)
    lease_generation: int | None = None  # the writer's lease (an older one: a displaced writer)
    time: float = 0.0  # of the last beat
    exited: bool = False
    finished: bool = False
    evaluating: bool = False


BEAT_KEYS = frozenset(f.name for f in dataclass_fields(BeatFields))
assert {FINISHED_FIELD, LOADED_FIELD, LOADING_FIELD, EVALUATING_FIELD} <= BEAT_KEYS
assert {EXITED_FIELD, STEPS_FIELD, TASKS_FIELD, STARTED_FIELD, LEASE_GENERATION} <= BEAT_KEYS


class Heartbeat:
    """``explorers/<name>.json``, rewritten atomically by ``beat()`` and an optional thread."""

    def __init__(
        self,
        run_dir: Path | str,
        name: str,
        interval_s: float = 5.0,
        lease: LeaseView | None = None,
    ):
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", name) or atomic.is_tmp(name):
            raise CheckpointError(
                f"heartbeat name {name!r} must be letters, digits, '_.-', e.g. 'explorer-0'"
            )
        self.path = Path(run_dir) / EXPLORERS_DIR / f"{name}.json"
        with storage_errors(self.path.parent, "create"):
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lease = lease  # the explorer's: checked right before each write
        gen = None if lease is None else lease.gen
        self.fields: dict[str, Any] = asdict(BeatFields(name, lease_generation=gen))
        self.fields[TIME_FIELD] = self.fields[STARTED_FIELD]

    def beat(self, **fields: Any) -> None:
        """Merge ``fields`` into the heartbeat and rewrite it with the current time; raises
        LeaseError, writing nothing, once a newer instance owns the explorer's lease."""
        unknown = set(fields) - BEAT_KEYS
        assert not unknown, f"not heartbeat fields: {sorted(unknown)}"
        with self._lock:
            if self.lease is not None:
                self.lease.check(f"writing the heartbeat {self.path}")
            self.fields.update(fields)
            self.fields[TIME_FIELD] = time.time()
            atomic.write_json(self.path, self.fields)

    def start(self) -> "Heartbeat":
        """Beat now and then every ``interval_s`` from a daemon thread until :meth:`stop`."""
        self.beat()
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"heartbeat-{self.path.stem}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and mark the explorer as exited (dead at once for readers)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        try:
            self.beat(**{EXITED_FIELD: True, LOADING_FIELD: None})
        except OSError as e:  # a full disk: the error that stopped the role is the one to raise
            log.warning("heartbeat %s not marked exited (dead once stale): %s", self.path, e)
        except LeaseError:  # displaced: the heartbeat is the new instance's now
            pass

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except OSError as e:  # a hiccup of the shared filesystem must not kill the explorer
                log.warning("heartbeat %s not written: %s", self.path, e)
            except LeaseError as e:  # the explorer's next write stops it with the same line
                log.info("%s", e)
                return

    def __enter__(self) -> "Heartbeat":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class ExplorerStatus:
    """One heartbeat as read back: its fields, its age and whether it counts as live."""

    name: str
    age_s: float
    live: bool
    fields: dict[str, Any] = field(default_factory=dict)
    exited: bool = False  # it said so, or released its lease (a signal's exit writes only that)


def read_heartbeats(
    run_dir: Path | str, live_threshold_s: float = 30.0, now: float | None = None
) -> list[ExplorerStatus]:
    """Every explorer heartbeat, sorted by name; live = not exited and beat within the threshold.

    Exited: the heartbeat says so or the explorer's lease (named as it) is released. Ages
    compare the writer's clock with this host's: cluster nodes keep NTP time.
    """
    folder = Path(run_dir) / EXPLORERS_DIR
    now = time.time() if now is None else now
    statuses = []
    for path in sorted(folder.glob("*.json")):
        if atomic.is_tmp(path) or path.name.startswith("."):
            continue
        try:
            fields = json.loads(path.read_text())
            age_s = now - float(fields[TIME_FIELD])
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("unreadable heartbeat %s (%s): counted as dead", path, e)
            statuses.append(ExplorerStatus(path.stem, float("inf"), False))
            continue
        gen, claim = _claim(Path(run_dir), path.stem)
        written = fields.get(LEASE_GENERATION)
        if isinstance(written, int) and gen is not None and written < gen:
            continue  # a displaced instance wrote it: the writer's new instance is starting
        exited = bool(fields.get(EXITED_FIELD)) or bool(claim and claim.get("released"))
        live = not exited and age_s <= live_threshold_s
        statuses.append(ExplorerStatus(path.stem, age_s, live, fields, exited))
    return statuses


def starting_explorers(run_dir: Path | str, live_threshold_s: float = 30.0) -> list[str]:
    """Explorers that hold a live lease but wrote no heartbeat yet (their engine is starting):
    none, or only one older than the lease (a previous instance's, whatever it said)."""
    beats = {s.name: s.fields for s in read_heartbeats(run_dir, live_threshold_s)}
    try:
        holders = live_holders(Path(run_dir), live_threshold_s)
    except LeaseError as e:  # a damaged claim: heartbeats alone decide (as before leases)
        log.warning("explorers starting not known: %s", e)
        return []
    return [
        name
        for name, claim in holders.items()
        if name != TRAINER_LEASE
        and float(beats.get(name, {}).get(STARTED_FIELD) or 0) < float(claim.get("start_time") or 0)
    ]


def _claim(run_dir: Path, name: str) -> tuple[int | None, dict[str, Any] | None]:
    """(generation, claim) of explorer ``name``'s newest lease claim; (None, None) if it is
    unreadable (a reader of heartbeats never fails on a damaged claim: the heartbeat alone
    decides), a claim of None if there is none."""
    try:
        return newest_claim(run_dir, name)
    except LeaseError as e:
        log.warning("explorer %s judged by its heartbeat alone: %s", name, e)
        return None, None


def explorers_finished(run_dir: Path | str, live_threshold_s: float = 30.0) -> bool:
    """Whether at least one explorer joined the run and every one that did has finished its
    tasks (heartbeat field ``finished``, written after its last segment was sealed); one that
    holds its lease and is still starting has not."""
    statuses = read_heartbeats(run_dir, live_threshold_s)
    return (
        bool(statuses)
        and all(s.fields.get(FINISHED_FIELD) for s in statuses)
        and not starting_explorers(run_dir, live_threshold_s)
    )


def evaluating_explorers(run_dir: Path | str, live_threshold_s: float = 30.0) -> list[str]:
    """Names of live explorers whose heartbeat says an evaluation is running."""
    return [
        s.name
        for s in read_heartbeats(run_dir, live_threshold_s)
        if s.live and s.fields.get(EVALUATING_FIELD)
    ]
