"""The trainer's side of folder sync: publish ``weights/v<N>/``, move the pointer, prune.

:meth:`WeightsPublisher.publish` fills ``weights/v<N>.tmp.<host>.<pid>/``, adds the completion
marker, renames it to ``weights/v<N>/`` and only then rewrites the pointer file. Versions a live
explorer's heartbeat names (:mod:`rft.sync.heartbeat`) are never removed or replaced.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Iterable

from rft import atomic
from rft.errors import CheckpointError, storage_errors
from rft.lease import NO_FENCE, Fence, fenced, remove_dead_tmp
from rft.rundir import WEIGHTS_DIR, WEIGHTS_POINTER, weights_dir
from rft.sync.heartbeat import LOADED_FIELD, LOADING_FIELD, read_heartbeats
from rft.sync.local import DeltaPolicy, DeltaWriter, FolderWriter, write_folder
from rft.sync.versions import (
    delta_base,
    list_versions,
    read_weights_pointer,
    remove_version,
    write_marker,
)

log = logging.getLogger(__name__)


class WeightsPublisher:
    """The trainer's side: publish version folders, move the pointer, prune old versions.

    A version that a live explorer's heartbeat names (loaded or being loaded) is never removed
    or replaced. The decision is taken for each folder from heartbeats read right before the
    removal; an explorer that announces itself after that read notices the removal and reloads
    (:meth:`WeightsWatcher.load`), so no explorer ever loads a mix of two copies.
    """

    def __init__(
        self,
        run_dir: Path | str,
        keep_versions: int = 2,
        heartbeat_live_s: float = 60.0,
        delta: DeltaPolicy | None = None,
        fence: Fence = NO_FENCE,
    ):
        if keep_versions < 1:
            raise CheckpointError(f"keep_versions must be >= 1, got {keep_versions}")
        self.run_dir = Path(run_dir)
        self.root = self.run_dir / WEIGHTS_DIR
        self.keep_versions = keep_versions
        self.heartbeat_live_s = heartbeat_live_s
        self.delta = None if delta is None else DeltaWriter(delta, run_dir)  # None: full folders
        self.fence = fence  # checked right before each rename, pointer write and removal
        with storage_errors(self.root, "create"):
            self.root.mkdir(parents=True, exist_ok=True)
        self.clean_stale_tmp()

    def clean_stale_tmp(self) -> list[Path]:
        """Remove temporaries (version folders, pointer files) left by dead publishers: of this
        host, those whose process is gone; of another host, those whose writer holds no live
        lease (:func:`rft.lease.remove_dead_tmp`; a publisher holds the trainer's)."""
        live_s = self.heartbeat_live_s
        removed = remove_dead_tmp(self.run_dir, ("v",), live_s, folder=self.root)
        removed += remove_dead_tmp(self.run_dir, (WEIGHTS_POINTER,), live_s)
        return removed

    def publish(
        self,
        version: int,
        write_fn: FolderWriter,
        extra_files: Iterable[Path | str] = (),
    ) -> Path:
        """Publish weights ``version``: ``write_fn(tmp_dir)`` fills the folder (or, a
        :class:`~rft.sync.local.StreamedFolder`, writes its safetensors files through the writer
        it is handed: a delta then codes each tensor as it comes); return the folder's path.

        Republishing an existing version (a trainer resumed from an earlier checkpoint and
        trained that step again) replaces it with the new weights, which are what the trainer
        now has, unless a live explorer names it: see :meth:`_may_replace`. With ``delta``, the
        folder holds a delta against the newest anchor when one is due (:class:`DeltaWriter`).
        """
        final = weights_dir(self.run_dir, version)
        what = f"publishing weights version {version}"
        tmp = atomic.tmp_name(final)
        shutil.rmtree(tmp, ignore_errors=True)
        # A full disk or a read-only folder: one message naming the folder; the temporary goes,
        # and the pointer still names the last version published, which is intact.
        with storage_errors(final, "publish"), fenced(self.fence, what):
            tmp.mkdir(parents=True)
            try:
                if self.delta is None:
                    write_folder(write_fn, tmp)
                    atomic.copy_files(extra_files, tmp)
                else:
                    self.delta.fill(tmp, version, write_fn, extra_files)
                marker: dict | None = write_marker(tmp, version)
                if final.exists() and not self._may_replace(final, version):
                    shutil.rmtree(tmp, ignore_errors=True)
                    marker = None
                else:
                    self.fence.check(what)  # writing it may take minutes: a take-over meanwhile
                    remove_version(final)  # a no-op unless republishing
                    atomic.publish_dir(tmp, final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        if self.delta is not None:
            self.delta.published(version, marker)
        self.fence.check(f"pointing {WEIGHTS_POINTER} at version {version}")
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

    def _base(self, version: int) -> int | None:
        return delta_base(weights_dir(self.run_dir, version))

    def prune(self) -> list[int]:
        """Delete versions beyond the newest ``keep_versions`` (up to the pointer), sparing the
        pointer's target, every version a live heartbeat names, and the anchor of each delta
        spared (a chain is one link: a delta's base is always a full folder); return those
        deleted.

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
        bases = {self._base(v) for v in keep}
        for version in versions:  # includes orphans beyond the pointer
            if version in keep or version in bases:
                continue
            users = [v for v in versions if v == version or self._base(v) == version]
            if any(self.explorers_naming(v) for v in users):
                continue
            self.fence.check(f"pruning weights version {version}")
            remove_version(weights_dir(self.run_dir, version))
            deleted.append(version)
        if deleted:
            log.info(
                "pruned weights versions %s (kept %s)",
                deleted,
                [v for v in versions if v not in deleted],
            )
        return deleted
