"""Weight sync through version folders, and explorer heartbeats, on the shared filesystem.

The trainer's :class:`WeightsPublisher` fills ``weights/v<N>.tmp.<host>.<pid>/``, adds a
completion marker (every file and its size, an id unique to this copy), renames it to
``weights/v<N>/`` and only then rewrites the pointer file. An explorer's :class:`WeightsWatcher`
loads complete folders only and announces each load in its :class:`Heartbeat`
(``explorers/<name>.json``), so the publisher never prunes a folder being read. Also the
schedule both sides import: :func:`publishes_weights` and :func:`required_version`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from rft import atomic
from rft.config.schema import ExplorerConfig
from rft.errors import CheckpointError, storage_errors
from rft.lease import describe, newest_claim
from rft.rundir import EXPLORERS_DIR, TRAINER_LEASE, WEIGHTS_DIR, WEIGHTS_POINTER, weights_dir

log = logging.getLogger(__name__)

COMPLETE_MARKER = "rft_complete.json"  # written last in a version folder: the file list
_VERSION_RE = re.compile(r"^v(\d{6,})$")

FINISHED_FIELD = "finished"  # heartbeat field: the explorer generated all its tasks
LOADED_FIELD = "loaded_version"  # heartbeat field: weights version in the engine (None: unknown)
LOADING_FIELD = "loading_version"  # heartbeat field: version being read from weights/ now
EVALUATING_FIELD = "evaluating"  # heartbeat field: an evaluation is running (launchers wait for it)


def publishes_weights(step: int, sync_interval: int, last_step: int | None) -> bool:
    """Whether the trainer publishes weights version ``step`` after finishing that step: every
    ``sync_interval`` steps, and after the run's last step."""
    return step % sync_interval == 0 or step == last_step


def required_version(step: int, sync_offset: int, sync_interval: int) -> int:
    """Weights version an explorer needs before generating ``step`` in mode both (0: the initial
    model): the newest version the trainer publishes after its step ``step - 1 - sync_offset``."""
    need = step - 1 - sync_offset
    return max(0, need // sync_interval * sync_interval)


def explorer_lead(
    mode: str, sync_offset: int, max_lead_steps: int | None
) -> tuple[int | None, str]:
    """How many steps an explorer may run ahead of the weights, and the key that says so:
    ``mode: both``'s ``sync_offset``; an asynchronous explorer's ``max_lead_steps`` (None:
    unbounded, it never waits)."""
    if mode == "both":
        return sync_offset, "synchronizer.sync_offset"
    return max_lead_steps, "synchronizer.max_lead_steps"


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The completion marker of ``folder`` if every file it lists is there at full size; else
    None. Two publishes of one version have different markers (``id``), so comparing markers
    tells whether a folder is still the same copy."""
    try:
        marker = json.loads((folder / COMPLETE_MARKER).read_text())
        sizes_ok = all(
            (folder / name).stat().st_size == size for name, size in marker["files"].items()
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return marker if sizes_ok else None


def is_complete(folder: Path) -> bool:
    """True when ``folder`` has its completion marker and every file it lists, at full size."""
    return read_marker(folder) is not None


def list_versions(run_dir: Path | str) -> list[int]:
    """Versions with a published folder (complete or not), ascending; temporaries excluded."""
    root = Path(run_dir) / WEIGHTS_DIR
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(_VERSION_RE.match, names) if m)


def newest_complete(run_dir: Path | str) -> int | None:
    """The newest version whose folder is complete, whatever the pointer says."""
    return next(
        (v for v in reversed(list_versions(run_dir)) if is_complete(weights_dir(run_dir, v))), None
    )


def _pointer_repair(run_dir: Path | str) -> str:
    """How to repair a pointer file that names no complete version ("it": the file)."""
    newest = newest_complete(run_dir)
    rewrite = "the trainer rewrites it at its next publish"
    if newest is None:
        return f"delete it ({rewrite}; {WEIGHTS_DIR}/ holds no complete version)"
    return (
        f"write {newest} (the newest complete version in {WEIGHTS_DIR}/) into it, or delete "
        f"it ({rewrite})"
    )


def read_weights_pointer(run_dir: Path | str) -> int | None:
    """The version the pointer file names; None before the first publish.

    Raises CheckpointError when the file holds no integer or a negative one: no publisher
    writes that, so the file is damaged, and waiting would not repair it.
    """
    path = Path(run_dir) / WEIGHTS_POINTER
    version = atomic.read_pointer(path)
    if version is not None and version < 0:
        raise CheckpointError(
            f"{path} names weights version {version}, but versions are trainer "
            f"steps (>= 0): the file is damaged; {_pointer_repair(run_dir)}"
        )
    return version


def weights_problem(run_dir: Path | str) -> str | None:
    """Why the pointer leads to no weights when the trainer cannot fix it by publishing more:
    it names a folder that is missing or incomplete. None when nothing is wrong."""
    version = read_weights_pointer(run_dir)
    if version is None or is_complete(weights_dir(run_dir, version)):
        return None
    return (
        f"{WEIGHTS_POINTER} names version {version} but {WEIGHTS_DIR}/v{version:06d} is "
        "missing or incomplete: the folder was deleted or the run directory was copied "
        f"partially; restore that folder, or repair {WEIGHTS_POINTER}: "
        f"{_pointer_repair(run_dir)}"
    )


def trainer_state(run_dir: Path | str, live_s: float, now: float | None = None) -> tuple[bool, str]:
    """(running, what the trainer's lease says), read from its newest claim (:mod:`rft.lease`):
    running while it is held and beats within ``live_s``."""
    _gen, claim = newest_claim(Path(run_dir), TRAINER_LEASE)
    now = time.time() if now is None else now
    if claim is None:
        return False, "no trainer has claimed the run directory"
    who = describe(claim, now)
    if claim.get("released"):
        return False, f"the last trainer exited ({who})"
    if now - float(claim.get("heartbeat_time") or 0.0) > live_s:
        return False, f"the last trainer stopped beating ({who})"
    return True, f"the trainer is running ({who})"


def pointer_fault(run_dir: Path | str, trainer_live_s: float) -> tuple[str, bool] | None:
    """(message, fatal) when the pointer names a missing or incomplete version, else None.

    Fatal unless the trainer runs: only a running trainer can be mid-publish (it removes a
    version it republishes right before renaming the new copy in), so without one waiting
    cannot help; with one, the message names it and says to wait.
    """
    problem = weights_problem(run_dir)
    if problem is None:
        return None
    running, trainer = trainer_state(run_dir, trainer_live_s)
    if running:
        return f"{problem}. Waiting: {trainer} and may be publishing it", False
    return f"{problem}. Waiting would not help: {trainer}", True


def latest_weights(run_dir: Path | str) -> tuple[int, Path] | None:
    """(version, folder) the pointer names, if that folder is complete; else None."""
    version = read_weights_pointer(run_dir)
    if version is None:
        return None
    folder = weights_dir(run_dir, version)
    return (version, folder) if is_complete(folder) else None


def copy_files(files: Iterable[Path | str], dest: Path | str) -> None:
    """Copy extra files (tokenizer, generation config...) into a folder being published."""
    for src in map(Path, files):
        if not src.is_file():
            raise CheckpointError(f"{src} does not exist or is not a file; cannot publish it")
        shutil.copy2(src, Path(dest) / src.name)


def _write_marker(folder: Path, version: int) -> None:
    files = {
        str(p.relative_to(folder)): p.stat().st_size
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != COMPLETE_MARKER
    }
    if not files:
        raise CheckpointError(
            f"publishing weights version {version}: the folder is empty (write_fn wrote nothing)"
        )
    marker = {
        "version": version,
        "files": files,
        "time": time.time(),
        "host": socket.gethostname(),
        "id": uuid.uuid4().hex,
    }
    (folder / COMPLETE_MARKER).write_text(json.dumps(marker, indent=1, sort_keys=True))


def _remove_version(folder: Path) -> None:
    """Rename a folder to a temporary name first (watchers stop seeing it at once), then delete."""
    doomed = atomic.tmp_name(folder.with_name(folder.name + ".old"))
    try:
        os.rename(folder, doomed)
    except FileNotFoundError:
        return
    shutil.rmtree(doomed, ignore_errors=True)


class WeightsPublisher:
    """The trainer's side: publish version folders, move the pointer, prune old versions.

    A version that a live explorer's heartbeat names (loaded or being loaded) is never removed
    or replaced. The decision is taken for each folder from heartbeats read right before the
    removal; an explorer that announces itself after that read notices the removal and reloads
    (:meth:`WeightsWatcher.load`), so no explorer ever loads a mix of two copies.
    """

    def __init__(self, run_dir: Path | str, keep_versions: int = 2, heartbeat_live_s: float = 60.0):
        if keep_versions < 1:
            raise CheckpointError(f"keep_versions must be >= 1, got {keep_versions}")
        self.run_dir = Path(run_dir)
        self.root = self.run_dir / WEIGHTS_DIR
        self.keep_versions = keep_versions
        self.heartbeat_live_s = heartbeat_live_s
        with storage_errors(self.root, "create"):
            self.root.mkdir(parents=True, exist_ok=True)
        self.clean_stale_tmp()

    def clean_stale_tmp(self) -> list[Path]:
        """Remove temporaries (folders, pointer files) left by dead publishers of this host."""
        removed = atomic.remove_stale_tmp(self.root)
        removed += atomic.remove_stale_tmp(self.run_dir, prefix=WEIGHTS_POINTER)
        for path in removed:
            log.info("removed %s (left by a dead publisher)", path)
        return removed

    def publish(
        self,
        version: int,
        write_fn: Callable[[Path], None],
        extra_files: Iterable[Path | str] = (),
    ) -> Path:
        """Publish weights ``version``: ``write_fn(tmp_dir)`` fills the folder; return its path.

        Republishing an existing version (a trainer resumed from an earlier checkpoint and
        trained that step again) replaces it with the new weights, which are what the trainer
        now has, unless a live explorer names it: see :meth:`_may_replace`.
        """
        final = weights_dir(self.run_dir, version)
        tmp = atomic.tmp_name(final)
        shutil.rmtree(tmp, ignore_errors=True)
        # A full disk or a read-only folder: one message naming the folder; the temporary goes,
        # and the pointer still names the last version published, which is intact.
        with storage_errors(final, "publish"):
            tmp.mkdir(parents=True)
            try:
                write_fn(tmp)
                copy_files(extra_files, tmp)
                _write_marker(tmp, version)
                if final.exists() and not self._may_replace(final, version):
                    shutil.rmtree(tmp, ignore_errors=True)
                else:
                    _remove_version(final)  # a no-op unless republishing
                    atomic.publish_dir(tmp, final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        atomic.write_pointer(self.run_dir / WEIGHTS_POINTER, version)
        self.prune()
        return final

    def _may_replace(self, final: Path, version: int) -> bool:
        """Whether a republish may replace the published folder of ``version``: only if no live
        heartbeat, read now, names it.

        Otherwise the old copy stays and the pointer names it: it is a whole snapshot of step
        ``version`` of the run before the resume, and the explorers that have it keep
        generating with it until the next published version (their experiences say
        ``version``; the trainer's weights of that step differ by what the lost steps changed,
        as stale experiences do). Waiting would not help: a load in progress ends with the
        version loaded, and a loaded version stays named until the pointer moves on.
        """
        naming = self.explorers_naming(version)
        if naming:
            log.warning(
                "not replacing published weights %s (resumed from an earlier step): live "
                "explorer(s) %s have it loaded or are loading it; they keep that copy until "
                "the next version",
                final,
                naming,
            )
            return False
        log.warning("replacing published weights %s (resumed from an earlier step)", final)
        return True

    def explorers_naming(
        self, version: int, fields: tuple[str, ...] = (LOADED_FIELD, LOADING_FIELD)
    ) -> list[str]:
        """Live explorers whose heartbeat, read now, names ``version`` in one of ``fields``."""
        return [
            status.name
            for status in read_heartbeats(self.run_dir, self.heartbeat_live_s)
            if status.live and any(status.fields.get(key) == version for key in fields)
        ]

    def prune(self) -> list[int]:
        """Delete versions beyond the newest ``keep_versions`` (up to the pointer), sparing the
        pointer's target and every version a live heartbeat names; return those deleted.

        Heartbeats are read again right before each removal: a list read once for all would be
        older than the later removals by the time each earlier one takes.
        """
        pointer = read_weights_pointer(self.run_dir)
        versions = list_versions(self.run_dir)
        candidates = [v for v in versions if pointer is None or v <= pointer]
        keep = set(candidates[-self.keep_versions :]) | (
            {pointer} if pointer is not None else set()
        )
        deleted = []
        for version in versions:  # includes orphans beyond the pointer
            if version in keep or self.explorers_naming(version):
                continue
            _remove_version(weights_dir(self.run_dir, version))
            deleted.append(version)
        if deleted:
            log.info(
                "pruned weights versions %s (kept %s)",
                deleted,
                [v for v in versions if v not in deleted],
            )
        return deleted


class WeightsWatcher:
    """The explorer's side: is there a complete version other than the one loaded? Load it."""

    def __init__(
        self,
        run_dir: Path | str,
        loaded_version: int | None = None,
        heartbeat: "Heartbeat | None" = None,
        newer_only: bool = False,
        trainer_live_s: float | None = None,
    ):
        self.run_dir = Path(run_dir)
        # the trainer's lease is live if it beat within this (explorer.heartbeat_timeout_s)
        self.trainer_live_s = trainer_live_s or ExplorerConfig().heartbeat_timeout_s
        self._warned_pointer: int | None = None  # the pointer value a warning was logged for
        self.loaded_version = loaded_version  # None after a voided load: the engine holds a mix
        self.loaded_marker: dict[str, Any] | None = None  # which copy of loaded_version
        self.heartbeat = heartbeat
        self.newer_only = newer_only  # weights also come by broadcast: a folder only if newer
        self._loading_marker: dict[str, Any] | None = None

    def poll(self) -> tuple[int, Path] | None:
        """(version, folder) if the pointer names a complete version other than the loaded one,
        or another copy of it.

        Normally that version is newer; it is older, or the same republished, only after the
        trainer resumed from an earlier checkpoint, and then the explorer should follow it too.
        A pointer to a missing or incomplete version raises CheckpointError at once unless the
        trainer is running (then a warning, once: it may be republishing that version).
        """
        version = read_weights_pointer(self.run_dir)
        if version is None:
            return None
        folder = weights_dir(self.run_dir, version)
        marker = read_marker(folder)
        if marker is None:
            self._check_pointer(version)
            return None
        same_copy = self.loaded_marker is None or marker == self.loaded_marker
        if version == self.loaded_version and same_copy:
            return None
        if self.newer_only and self.loaded_version is not None and version <= self.loaded_version:
            return None  # the broadcast brought this version or a newer one already
        return version, folder

    def _check_pointer(self, version: int) -> None:
        fault = pointer_fault(self.run_dir, self.trainer_live_s)
        if fault is None:
            return  # published meanwhile
        message, fatal = fault
        if fatal:
            raise CheckpointError(message)
        if self._warned_pointer != version:
            self._warned_pointer = version
            log.warning("%s", message)

    def load(self, version: int, load_fn: Callable[[Path], object]) -> bool:
        """Load ``version`` with ``load_fn(folder)``; False if the folder vanished or changed
        meanwhile (then :meth:`poll` again: retry with the newest version).

        The announcement (:meth:`begin_load`) keeps the folder from a publisher that reads it in
        time; the check after ``load_fn`` covers one that read heartbeats earlier: it renames a
        folder away before deleting or replacing it, so if the same copy is still there, every
        file ``load_fn`` opened belonged to it. After a voided load ``loaded_version`` is None:
        ``load_fn`` may have applied part of the files. An error of ``load_fn`` while the folder
        stayed intact is raised.
        """
        folder = self.begin_load(version)
        if folder is None:
            return False
        try:
            load_fn(folder)
        except Exception:
            if read_marker(folder) == self._loading_marker:  # intact folder: a real error
                self._void_load(folder, warn=False)
                raise
        if read_marker(folder) != self._loading_marker:  # also after a file vanished mid-read
            self._void_load(folder, warn=True)
            return False
        self.finish_load(version)
        return True

    def begin_load(self, version: int) -> Path | None:
        """Announce the load in the heartbeat (on disk before this returns), then re-check the
        folder and note which copy it is; None if it is gone."""
        self._beat(**{LOADING_FIELD: version})
        folder = weights_dir(self.run_dir, version)
        self._loading_marker = read_marker(folder)
        if self._loading_marker is not None:
            return folder
        self._beat(**{LOADING_FIELD: None})
        return None

    def finish_load(self, version: int) -> None:
        """Record that ``version`` (the copy :meth:`begin_load` saw) is now the explorer's."""
        self.loaded_version, self.loaded_marker = version, self._loading_marker
        self._loading_marker = None
        self._beat(**{LOADED_FIELD: version, LOADING_FIELD: None})

    def loaded_by_broadcast(self, version: int) -> None:
        """Record ``version`` as the engine's, received by broadcast (no folder: no marker)."""
        self.loaded_version, self.loaded_marker = version, None
        self._beat(**{LOADED_FIELD: version})

    def _void_load(self, folder: Path, warn: bool) -> None:
        if warn:
            log.warning(
                "weights %s were deleted or replaced while being read (the trainer pruned "
                "or republished them): loading the newest version instead",
                folder,
            )
        self.loaded_version = self.loaded_marker = self._loading_marker = None
        self._beat(**{LOADED_FIELD: None, LOADING_FIELD: None})

    def _beat(self, **fields: int | None) -> None:
        if self.heartbeat is not None:
            self.heartbeat.beat(**fields)


class Heartbeat:
    """``explorers/<name>.json``, rewritten atomically by ``beat()`` and an optional thread."""

    def __init__(self, run_dir: Path | str, name: str, interval_s: float = 5.0):
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
        now = time.time()
        self.fields: dict[str, Any] = {
            "name": name,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "slurm_procid": os.environ.get("SLURM_PROCID"),
            LOADED_FIELD: None,
            LOADING_FIELD: None,
            "tasks_done": 0,
            "steps_done": 0,
            "started_time": now,
            "time": now,
            "exited": False,
            FINISHED_FIELD: False,
            EVALUATING_FIELD: False,
        }

    def beat(self, **fields: Any) -> None:
        """Merge ``fields`` into the heartbeat and rewrite it with the current time."""
        with self._lock:
            self.fields.update(fields)
            self.fields["time"] = time.time()
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
            self.beat(exited=True, **{LOADING_FIELD: None})
        except OSError as e:  # a full disk: the error that stopped the role is the one to raise
            log.warning("heartbeat %s not marked exited (dead once stale): %s", self.path, e)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except OSError as e:  # a hiccup of the shared filesystem must not kill the explorer
                log.warning("heartbeat %s not written: %s", self.path, e)

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


def read_heartbeats(
    run_dir: Path | str, live_threshold_s: float = 30.0, now: float | None = None
) -> list[ExplorerStatus]:
    """Every explorer heartbeat, sorted by name; live = not exited and beat within the threshold.

    Ages compare the writer's clock with this host's: cluster nodes keep NTP time.
    """
    folder = Path(run_dir) / EXPLORERS_DIR
    now = time.time() if now is None else now
    statuses = []
    for path in sorted(folder.glob("*.json")):
        if atomic.is_tmp(path) or path.name.startswith("."):
            continue
        try:
            fields = json.loads(path.read_text())
            age_s = now - float(fields["time"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("unreadable heartbeat %s (%s): counted as dead", path, e)
            statuses.append(ExplorerStatus(path.stem, float("inf"), False))
            continue
        live = not fields.get("exited", False) and age_s <= live_threshold_s
        statuses.append(ExplorerStatus(path.stem, age_s, live, fields))
    return statuses


def explorers_finished(run_dir: Path | str) -> bool:
    """Whether at least one explorer joined the run and every one that did has finished its
    tasks (heartbeat field ``finished``, written after its last segment was sealed)."""
    statuses = read_heartbeats(run_dir)
    return bool(statuses) and all(s.fields.get(FINISHED_FIELD) for s in statuses)


def evaluating_explorers(run_dir: Path | str, live_threshold_s: float = 30.0) -> list[str]:
    """Names of live explorers whose heartbeat says an evaluation is running."""
    return [
        s.name
        for s in read_heartbeats(run_dir, live_threshold_s)
        if s.live and s.fields.get(EVALUATING_FIELD)
    ]
