"""Node-local weight copies for delta sync: the trainer's anchor and the explorer's rebuilds.

The trainer (:class:`DeltaWriter`) writes each version to node-local scratch first, publishes it
as a delta against the anchor it keeps there, or in full (then it becomes the anchor). An
explorer (:class:`LocalCopy`) copies each anchor it meets to its own scratch, rebuilds deltas
against it and hands the engine a local folder that is whole and verified, or nothing.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from rft import atomic
from rft.rundir import weights_dir
from rft.sync.delta import DeltaError, apply_folder, encode_folder
from rft.sync.versions import read_index, read_marker

log = logging.getLogger(__name__)

ANCHOR_DIR = "anchor"  # in a scratch folder: the full copy deltas are made against or applied to


@dataclass(frozen=True)
class DeltaPolicy:
    """``synchronizer.delta_*``: when a version is published in full, and where copies live."""

    anchor_interval: int  # a full folder every N published versions (1: never a delta)
    local_dir: str | None = None  # node-local scratch root (None: $TMPDIR, else /tmp)
    last_version: int | None = None  # the run's last step: always full (next stage, conversion)

    def scratch(self, run_dir: Path | str, who: str) -> Path:
        """This process's scratch folder for run ``run_dir``: one per run and role name."""
        root = self.local_dir or os.environ.get("TMPDIR") or tempfile.gettempdir()
        run = hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:10]
        return Path(root) / f"rft-weights-{run}-{who}"


def _replace_dir(tmp: Path, final: Path) -> None:
    doomed = atomic.tmp_name(final.with_name(final.name + ".old"))
    if final.exists():
        os.rename(final, doomed)
    os.rename(tmp, final)
    shutil.rmtree(doomed, ignore_errors=True)


class DeltaWriter:
    """The trainer's side: fill a version folder with a delta when one is due, else in full."""

    def __init__(self, policy: DeltaPolicy, run_dir: Path | str):
        self.policy = policy
        self.scratch = policy.scratch(run_dir, "trainer")
        shutil.rmtree(self.scratch, ignore_errors=True)  # an old anchor's id is unknown: restart
        self.scratch.mkdir(parents=True)
        self.anchor: dict[str, Any] | None = None  # {"version", "id"} of the local anchor
        self.deltas_since_anchor = 0
        self._pending: Path | None = None  # a full version written: the anchor once published
        self.last_kind = ""  # "delta" or "full": what the last fill wrote

    def fill(
        self,
        tmp: Path,
        version: int,
        write_fn: Callable[[Path], None],
        extra_files: Iterable[Path | str],
    ) -> None:
        local = atomic.tmp_name(self.scratch / f"v{version:06d}")
        shutil.rmtree(local, ignore_errors=True)
        local.mkdir(parents=True)
        try:
            write_fn(local)
            atomic.copy_files(extra_files, local)
            if self._delta_due(version) and encode_folder(
                local, self.scratch / ANCHOR_DIR, tmp, self.anchor
            ):
                shutil.rmtree(local)
                self.last_kind = "delta"
                return
            shutil.copytree(local, tmp, dirs_exist_ok=True)
        except BaseException:
            shutil.rmtree(local, ignore_errors=True)
            raise
        self._pending, self.last_kind = local, "full"

    def _delta_due(self, version: int) -> bool:
        return (
            self.anchor is not None
            and version != self.policy.last_version
            and self.deltas_since_anchor + 1 < self.policy.anchor_interval
        )

    def published(self, version: int, marker: dict[str, Any] | None) -> None:
        """After a publish: ``marker`` of the folder now at ``weights/v<version>``, or None when
        it was not published (a live explorer kept the old copy)."""
        pending, self._pending = self._pending, None
        if self.last_kind == "delta":
            self.deltas_since_anchor += 1
        elif marker is None:  # the shared copy is another one: no delta may name this anchor
            shutil.rmtree(pending, ignore_errors=True)
            self.anchor = None
        else:
            _replace_dir(pending, self.scratch / ANCHOR_DIR)
            self.anchor, self.deltas_since_anchor = {"version": version, "id": marker["id"]}, 0

    def discard(self) -> None:
        """A publish failed: drop what it wrote here (the anchor stays)."""
        if self._pending is not None:
            shutil.rmtree(self._pending, ignore_errors=True)
            self._pending = None


class LocalCopy:
    """The explorer's side: a local, whole folder for a published version (full or delta)."""

    def __init__(self, run_dir: Path | str, root: Path):
        self.run_dir = Path(run_dir)
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.anchor_dir = root / ANCHOR_DIR

    def folder_for(self, version: int, folder: Path) -> Path:
        """A local full folder holding the weights of the complete ``folder`` (``version``).

        A full folder is copied and becomes the anchor. A delta is applied to the local anchor
        (fetched again from ``weights/`` when it is missing, another copy, or a checksum fails
        against it); DeltaError when no anchor rebuilds it: nothing was handed out.
        """
        index = read_index(folder)
        if index is None:
            self._copy_anchor(folder)
            return self.anchor_dir
        out = self.root / f"v{version:06d}"
        shutil.rmtree(out, ignore_errors=True)
        if not self._has_anchor(index):
            self._fetch_anchor(index)
        try:
            apply_folder(folder, self.anchor_dir, out, durable=False)
        except DeltaError as e:
            log.warning("local anchor did not rebuild %s (%s): fetching it again", folder, e)
            self._fetch_anchor(index)
            apply_folder(folder, self.anchor_dir, out, durable=False)
        for old in self.root.glob("v*"):
            if old != out:
                shutil.rmtree(old, ignore_errors=True)
        return out

    def _has_anchor(self, index: dict[str, Any]) -> bool:
        marker = read_marker(self.anchor_dir)
        return marker is not None and marker.get("id") == index["base_id"]

    def _fetch_anchor(self, index: dict[str, Any]) -> None:
        base = weights_dir(self.run_dir, int(index["base_version"]))
        marker = read_marker(base)
        if marker is None or marker.get("id") != index["base_id"]:
            raise DeltaError(
                f"the anchor of this delta, {base}, is gone or was replaced, and this explorer "
                "holds no local copy of it"
            )
        self._copy_anchor(base)

    def _copy_anchor(self, folder: Path) -> None:
        """Copy a complete full folder here; DeltaError if it changed while being copied."""
        before = read_marker(folder)
        tmp = atomic.tmp_name(self.anchor_dir)
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            shutil.copytree(folder, tmp)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise DeltaError(f"{folder} vanished while being copied ({e})") from e
        if before is None or read_marker(tmp) != before or read_marker(folder) != before:
            shutil.rmtree(tmp, ignore_errors=True)
            raise DeltaError(f"{folder} changed while being copied")
        _replace_dir(tmp, self.anchor_dir)
