"""Node-local state for delta sync: the trainer's anchor in RAM, the explorer's local copies.

The trainer (:class:`DeltaWriter`) streams each version straight into ``weights/`` as a delta
against the anchor it keeps in host RAM, or in full (then it becomes the anchor). An explorer
(:class:`LocalCopy`) copies each anchor it meets to its own scratch, keeps one more copy there
that each delta rewrites in place (only the changed elements, for sparse frames) and hands the
engine that folder once every frame checked out and was applied, or nothing.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import socket
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Union

from rft import atomic
from rft.config.queries import lora_config
from rft.config.schema import Config
from rft.errors import ConfigError, DeltaError, storage_errors
from rft.rundir import weights_dir
from rft.safetensors_io import is_weights_file, write_safetensors
from rft.sync.delta_files import (
    CODER_THREADS,
    Anchor,
    DeltaEncoder,
    Dirty,
    FileMaps,
    WriteFile,
    apply_delta,
    weight_files,
)
from rft.sync.versions import anchor_state, read_index, read_marker

log = logging.getLogger(__name__)

ANCHOR_DIR = "anchor"  # in an explorer's scratch folder: the full copy deltas are made against
CURRENT_DIR = "current"  # next to it: the anchor's copy each delta rewrites in place


@dataclass(frozen=True)
class DeltaPolicy:
    """``synchronizer.delta_*``: when a version is published in full, and where copies live."""

    anchor_interval: int  # a full folder every N published versions (1: never a delta)
    local_dir: str | None = None  # node-local scratch root (None: $TMPDIR, else /tmp)
    last_version: int | None = None  # the run's last step: always full (next stage, conversion)

    def scratch(self, run_dir: Path | str, who: str) -> Path:
        """This process's scratch folder for run ``run_dir``: one per run and role name.
        ``$VARS`` in ``local_dir`` are this node's (``$TMPDIR`` differs between nodes)."""
        root = self.local_dir or os.environ.get("TMPDIR") or tempfile.gettempdir()
        if "$" in (root := os.path.expandvars(root)):
            raise ConfigError(
                f"synchronizer.delta_local_dir={self.local_dir!r} names a variable unset on "
                f"{socket.gethostname()}: export it in the job, or give a folder"
            )
        run = hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:10]
        return Path(root) / f"rft-weights-{run}-{who}"


def delta_policy(cfg: Config, last_version: int | None = None) -> DeltaPolicy | None:
    """The run's delta folders (``synchronizer.delta_sync``), read by the trainer and the
    explorers alike; None: full folders. Adapters (``model.lora_configs``) are megabytes: always
    in full (and an adapter in flight in a streaming explorer keeps its own folder)."""
    sync = cfg.synchronizer
    if not sync.delta_sync or lora_config(cfg) is not None:
        return None
    return DeltaPolicy(sync.delta_anchor_interval, sync.delta_local_dir, last_version)


@dataclass(frozen=True)
class StreamedFolder:
    """A version folder's writer that writes each safetensors file through the ``write_file``
    it is handed (``write(folder, write_file)``): :func:`~rft.safetensors_io.write_safetensors`
    for a full folder, a :class:`~rft.sync.delta_files.DeltaEncoder` for a delta (then no full
    file is written anywhere). Any other writer is a plain ``write_fn(folder)``."""

    write: Callable[[Path, WriteFile], None]


FolderWriter = Union[Callable[[Path], None], StreamedFolder]


def write_folder(write_fn: FolderWriter, folder: Path) -> None:
    """Fill ``folder`` in full with ``write_fn``."""
    if isinstance(write_fn, StreamedFolder):
        write_fn.write(folder, write_safetensors)
    else:
        write_fn(folder)


def _replace_dir(tmp: Path, final: Path) -> None:
    doomed = atomic.tmp_name(final.with_name(final.name + ".old"))
    if final.exists():
        os.rename(final, doomed)
    os.rename(tmp, final)
    shutil.rmtree(doomed, ignore_errors=True)


class DeltaWriter:
    """The trainer's side: fill a version folder with a delta when one is due, else in full
    (kept in RAM as the anchor once published)."""

    def __init__(self, policy: DeltaPolicy, run_dir: Path | str):
        self.policy = policy
        self.run_dir = Path(run_dir)
        self.scratch = policy.scratch(run_dir, "trainer")  # plain writers' files, to be coded
        shutil.rmtree(self.scratch, ignore_errors=True)
        self.scratch.mkdir(parents=True)
        self.anchor = Anchor()
        self.base: dict[str, Any] | None = None  # {"version", "id"} of the anchor, once out
        self.deltas_since_anchor = 0
        self.last_kind = ""  # "delta" or "full": what the last fill wrote
        self._pool = ThreadPoolExecutor(CODER_THREADS, thread_name_prefix="rft-delta-code")

    def fill(
        self, tmp: Path, version: int, write_fn: FolderWriter, extra_files: Iterable[Path | str]
    ) -> None:
        if self._delta_due(version):
            self.last_kind = "delta"
            encoder = DeltaEncoder(tmp, self.anchor, self._pool)
            try:
                if isinstance(write_fn, StreamedFolder):
                    write_fn.write(tmp, encoder.write_file)
                else:
                    self._code_written(write_fn, tmp, encoder)
                encoder.finish(self.base)
            finally:
                encoder.close()
        else:
            self.last_kind, self.base = "full", None  # until published: no delta names it
            self.anchor.begin()
            if isinstance(write_fn, StreamedFolder):
                write_fn.write(tmp, self.anchor.write_file)
            else:
                write_fn(tmp)
                for name in weight_files(tmp):
                    self.anchor.read_file(tmp / name)
            self.anchor.end()
        atomic.copy_files(extra_files, tmp)

    def _code_written(self, write_fn: Callable[[Path], None], tmp: Path, encoder) -> None:
        """A plain writer: its folder goes to scratch, then each weight file is coded."""
        local = atomic.tmp_name(self.scratch / "version")
        shutil.rmtree(local, ignore_errors=True)
        local.mkdir(parents=True)
        try:
            write_fn(local)
            for path in local.iterdir():
                if path.suffix == ".safetensors" and is_weights_file(path.name):
                    encoder.copy_file(path)
                elif path.is_file():
                    shutil.copyfile(path, tmp / path.name)
        finally:
            shutil.rmtree(local, ignore_errors=True)

    def _delta_due(self, version: int) -> bool:
        """A delta, unless none is due or the anchor it would name is no longer published as
        it was (deleted outside rft: explorers could not rebuild it; a full folder instead)."""
        if (
            self.base is None
            or version == self.policy.last_version
            or self.deltas_since_anchor + 1 >= self.policy.anchor_interval
        ):
            return False
        lost = anchor_state(self.run_dir, self.base["version"], self.base["id"])
        if lost is not None:
            log.warning(
                "weights/v%06d, the anchor of this trainer's deltas, %s: publishing version %d "
                "in full (the new anchor)",
                self.base["version"],
                lost,
                version,
            )
            return False
        return True

    def published(self, version: int, marker: dict[str, Any] | None) -> None:
        """After a publish: ``marker`` of the folder now at ``weights/v<version>``, or None when
        it was not published (a live explorer kept the old copy: no delta may name this)."""
        if self.last_kind == "delta":
            self.deltas_since_anchor += 1
        elif marker is not None:
            self.base, self.deltas_since_anchor = {"version": version, "id": marker["id"]}, 0


class LocalCopy:
    """The explorer's side: a local, whole folder for a published version (full or delta)."""

    def __init__(self, run_dir: Path | str, root: Path):
        self.run_dir = Path(run_dir)
        self.root = root
        with storage_errors(root, "create"):  # synchronizer.delta_local_dir
            self.root.mkdir(parents=True, exist_ok=True)
        self.anchor_dir = root / ANCHOR_DIR
        self.current_dir = root / CURRENT_DIR
        # per weight file of current_dir, where it differs from the anchor; None: not trusted
        # (never built, built on another anchor copy, or a rebuild failed half way). Kept in
        # memory only: a restarted explorer has none and rebuilds from the anchor, so a marker
        # file would cost an fsync per version and catch nothing more.
        self._dirty: dict[str, Dirty] | None = None
        self._maps = FileMaps()  # of the anchor's and current_dir's weight files
        self._pool = ThreadPoolExecutor(CODER_THREADS, thread_name_prefix="rft-delta-apply")

    def folder_for(self, version: int, folder: Path) -> Path:
        """A local full folder holding the weights of the complete ``folder`` (``version``).

        A full folder is copied and becomes the anchor. A delta rewrites the local copy of the
        anchor (fetched again from ``weights/`` when it is missing, another copy, or does not
        fit the delta); DeltaError when no anchor rebuilds it (a frame's crc32 differs, the
        anchor is gone): nothing was handed out. The folder returned is rewritten by the next
        delta: the engine must copy what it loads. Node-local bit rot in the anchor's copy is
        not detected (as in a full folder: checking would cost a pass over every byte).
        """
        index = read_index(folder)
        if index is None:
            self._copy_anchor(folder)
            return self.anchor_dir
        if not self._has_anchor(index):
            self._fetch_anchor(index)
        try:
            self._rebuild(folder, index)
        except DeltaError as e:
            log.warning("local anchor did not rebuild %s (%s): fetching it again", folder, e)
            self._fetch_anchor(index)
            self._rebuild(folder, index)
        return self.current_dir

    def _rebuild(self, folder: Path, index: dict[str, Any]) -> None:
        if self._dirty is None:
            tmp = atomic.tmp_name(self.current_dir)
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(self.anchor_dir, tmp)
            self._maps.drop()
            _replace_dir(tmp, self.current_dir)
            self._dirty = {name: {} for name in weight_files(self.current_dir)}
        dirty, self._dirty = self._dirty, None  # untrusted until every frame is applied
        apply_delta(folder, index, self.anchor_dir, self.current_dir, dirty, self._pool, self._maps)
        self._dirty = dirty

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
        self._dirty = None  # the rebuilt copy was made from the old anchor
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
        self._maps.drop()
        _replace_dir(tmp, self.anchor_dir)
