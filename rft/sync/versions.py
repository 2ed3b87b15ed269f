"""Version folders ``weights/v<N>/`` and the pointer file that names the current one.

A folder is complete once its marker (:data:`COMPLETE_MARKER`: every file and its size, an id
unique to this copy) is there and every file it lists has its size. Readers (explorers,
stages, the status view) use :func:`latest_weights`; :func:`pointer_fault` says whether a
pointer to a missing folder is worth waiting for, :func:`anchor_fault` the same for a delta whose
anchor is lost. Writes belong to :mod:`rft.sync.publisher`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import time
import uuid
import zlib
from pathlib import Path
from typing import Any

from rft import atomic
from rft.errors import CheckpointError, DeltaError
from rft.lease import describe, newest_claim
from rft.rundir import TRAINER_LEASE, WEIGHTS_DIR, WEIGHTS_POINTER, weights_dir

COMPLETE_MARKER = "rft_complete.json"  # written last in a version folder: the file list
DELTA_INDEX = "rft_delta.json"  # in a delta folder (rft.sync.delta): its base, every tensor
INDEX_CRC = "crc32"  # in DELTA_INDEX: the crc32 of its other keys (index_text)
_VERSION_RE = re.compile(r"^v(\d{6,})$")


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


def index_text(index: dict[str, Any]) -> str:
    """A delta folder's index as written: its keys and the crc32 of their JSON (sorted keys), so
    an index damaged yet still parseable (a tensor's offset or shape) is refused, not applied."""
    body = json.dumps(index, sort_keys=True)
    return json.dumps({**index, INDEX_CRC: zlib.crc32(body.encode())}, sort_keys=True)


def is_delta(folder: Path) -> bool:
    """Whether ``folder`` is a delta folder (it has an index), readable or not."""
    return (folder / DELTA_INDEX).exists()


def read_index(folder: Path) -> dict[str, Any] | None:
    """A delta folder's index (:mod:`rft.sync.delta_files`); None for a full folder (no index).
    DeltaError when it does not read back whole: it is never taken for a full folder."""
    path = folder / DELTA_INDEX
    try:
        index = json.loads(path.read_text())
        crc = index.pop(INDEX_CRC)
        whole = crc == zlib.crc32(json.dumps(index, sort_keys=True).encode())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise DeltaError(f"{path} is unreadable ({e}): a damaged delta") from e
    if not whole:
        raise DeltaError(f"{path} does not match its crc32: a damaged delta")
    return index


def delta_base(folder: Path) -> int | None:
    """The anchor version a delta folder needs; None for a full folder (loadable as it is), and
    for a delta whose index does not read (there is nothing to spare or fall back to)."""
    try:
        index = read_index(folder)
    except DeltaError:
        return None
    return None if index is None else int(index["base_version"])


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
    claim, said = _running_trainer(run_dir, live_s, time.time() if now is None else now)
    return claim is not None, said


def _running_trainer(run_dir: Path | str, live_s: float, now: float) -> tuple[dict | None, str]:
    """(the trainer's newest claim while it runs, else None; what its lease says)."""
    _gen, claim = newest_claim(Path(run_dir), TRAINER_LEASE)
    if claim is None:
        return None, "no trainer has claimed the run directory"
    who = describe(claim, now)
    if claim.get("released"):
        return None, f"the last trainer exited ({who})"
    if now - float(claim.get("heartbeat_time") or 0.0) > live_s:
        return None, f"the last trainer stopped beating ({who})"
    return claim, f"the trainer is running ({who})"


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


def anchor_loss(run_dir: Path | str, version: int) -> str | None:
    """Why delta ``weights/v<version>`` cannot be rebuilt from ``weights/``: its anchor is gone,
    incomplete or another copy than the one it was made against (one line naming both
    folders). None for a full folder, a delta whose anchor is there, and a delta whose index
    does not read (a damaged delta, not a lost anchor)."""
    lost = _lost_anchor(run_dir, version)
    return None if lost is None else lost[1]


def _lost_anchor(run_dir: Path | str, version: int) -> tuple[Path, str] | None:
    """(anchor folder, :func:`anchor_loss`'s line) when the anchor is lost, else None."""
    try:
        index = read_index(weights_dir(run_dir, version))
    except DeltaError:
        return None
    if index is None:
        return None
    base = int(index["base_version"])
    what = anchor_state(run_dir, base, index["base_id"])
    if what is None:
        return None
    return weights_dir(run_dir, base), (
        f"{WEIGHTS_DIR}/v{version:06d} is a delta against {WEIGHTS_DIR}/v{base:06d}, which {what}"
    )


def anchor_state(run_dir: Path | str, version: int, copy_id: str) -> str | None:
    """What became of anchor ``weights/v<version>``, the copy ``copy_id`` deltas were made
    against ("is gone (deleted outside rft?)", "is incomplete ...", "was replaced by another
    copy"); None while it is there, complete."""
    anchor = weights_dir(run_dir, version)
    marker = read_marker(anchor)
    if marker is not None:
        return None if marker.get("id") == copy_id else "was replaced by another copy"
    if anchor.exists():
        return "is incomplete (files deleted outside rft?)"
    return "is gone (deleted outside rft?)"


def anchor_fault(
    run_dir: Path | str, version: int, trainer_live_s: float
) -> tuple[str, bool] | None:
    """(message, fatal) when delta ``version`` cannot be rebuilt because its anchor is lost
    (:func:`anchor_loss`), else None.

    Fatal unless a trainer that started after the delta was published is running: a trainer
    process publishes its first version in full (:class:`rft.sync.local.DeltaWriter`), which
    replaces what cannot be rebuilt. The trainer that published the delta never republishes
    its anchor, and its prune spares the pointer's delta's anchor: for it the loss is final.
    """
    lost = _lost_anchor(run_dir, version)
    if lost is None:
        return None
    anchor, problem = lost
    published = float((read_marker(weights_dir(run_dir, version)) or {}).get("time") or 0.0)
    claim, trainer = _running_trainer(run_dir, trainer_live_s, time.time())
    if claim is not None and float(claim.get("start_time") or 0.0) > published:
        return (
            f"{problem}. Waiting: {trainer}, started after {WEIGHTS_DIR}/v{version:06d} was "
            "published, and publishes its first version in full",
            False,
        )
    return (
        f"{problem}; the explorer cannot load it: restore {anchor}, or restart the run from "
        "its newest checkpoint (a restarted trainer publishes its first version in full, and "
        "explorers wait for it)",
        True,
    )


def latest_weights(run_dir: Path | str) -> tuple[int, Path] | None:
    """(version, folder) the pointer names, if that folder is complete; else None."""
    version = read_weights_pointer(run_dir)
    if version is None:
        return None
    folder = weights_dir(run_dir, version)
    return (version, folder) if is_complete(folder) else None


def write_marker(folder: Path, version: int) -> dict[str, Any]:
    """Write the completion marker of a filled folder (last); return it."""
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
    return marker


def remove_version(folder: Path) -> None:
    """Rename a folder to a temporary name first (watchers stop seeing it at once), then delete."""
    doomed = atomic.tmp_name(folder.with_name(folder.name + ".old"))
    try:
        os.rename(folder, doomed)
    except FileNotFoundError:
        return
    shutil.rmtree(doomed, ignore_errors=True)
