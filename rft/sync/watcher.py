"""The explorer's side of folder sync: is there a complete version other than the one loaded?

:class:`WeightsWatcher` reads the pointer, loads complete folders only, and announces each load
in the explorer's heartbeat first, so the publisher never prunes a folder being read; a folder
renamed away mid-read voids the load (never a mix of two copies). A delta whose anchor was
deleted is not waited for past :data:`ANCHOR_GRACE_S` (:meth:`WeightsWatcher.check_anchor`).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable

from rft.config.schema import ExplorerConfig
from rft.errors import CheckpointError, DeltaError
from rft.rundir import weights_dir
from rft.sync.heartbeat import LOADED_FIELD, LOADING_FIELD, Heartbeat
from rft.sync.local import LocalCopy
from rft.sync.versions import (
    anchor_fault,
    anchor_loss,
    delta_base,
    is_complete,
    pointer_fault,
    read_marker,
    read_weights_pointer,
)

log = logging.getLogger(__name__)

# A delta whose anchor is lost stops a waiting explorer this long after its first failed load,
# not at once: a restarted trainer (which publishes in full) may not have claimed its lease yet.
ANCHOR_GRACE_S = 30.0


class WeightsWatcher:
    """The explorer's side: is there a complete version other than the one loaded? Load it."""

    def __init__(
        self,
        run_dir: Path | str,
        loaded_version: int | None = None,
        heartbeat: Heartbeat | None = None,
        newer_only: bool = False,
        trainer_live_s: float | None = None,
        local: LocalCopy | None = None,
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
        self.local = local  # delta sync: engines load node-local rebuilt folders
        self._bad_copy: dict[str, Any] | None = None  # a delta copy that failed its checks
        # (marker, version, monotonic time of the first such failure): a delta copy that did
        # not rebuild because its anchor is lost; tried again once the anchor is back
        self._lost: tuple[dict[str, Any], int, float] | None = None
        self._warned_anchor = ""

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
        if self._lost is not None and marker == self._lost[0]:
            if anchor_loss(self.run_dir, version) is not None:
                return None  # nothing rebuilds it: see check_anchor
            self._lost = None  # the anchor is back
        if marker == self._bad_copy:
            return self._fallback(folder)
        same_copy = self.loaded_marker is None or marker == self.loaded_marker
        if version == self.loaded_version and same_copy:
            return None
        if self.newer_only and self.loaded_version is not None and version <= self.loaded_version:
            return None  # the broadcast brought this version or a newer one already
        return version, folder

    def _fallback(self, folder: Path) -> tuple[int, Path] | None:
        """For a delta that cannot be rebuilt: its anchor, a full folder, if it is newer than
        what the engine holds; else None (keep the whole weights loaded, wait for the next)."""
        base = delta_base(folder)
        if base is None or not is_complete(weights_dir(self.run_dir, base)):
            return None
        if self.loaded_version is not None and base <= self.loaded_version:
            return None
        return base, weights_dir(self.run_dir, base)

    def check_anchor(self) -> str | None:
        """For an explorer that waits for weights: why the pointer's delta did not rebuild, if
        its anchor is lost (logged once), or None. DeltaError once waiting cannot help
        (:func:`~rft.sync.versions.anchor_fault`: no trainer started since the delta was
        published) and :data:`ANCHOR_GRACE_S` passed since the first failed load."""
        if self._lost is None:
            return None
        marker, version, since = self._lost
        if read_weights_pointer(self.run_dir) != version:
            return None  # the pointer moved on: poll tries the new version
        if read_marker(weights_dir(self.run_dir, version)) != marker:
            return None
        fault = anchor_fault(self.run_dir, version, self.trainer_live_s)
        if fault is None:
            return None  # the anchor is back: poll tries again
        message, fatal = fault
        if fatal and time.monotonic() - since >= ANCHOR_GRACE_S:
            raise DeltaError(message)
        if message != self._warned_anchor:
            self._warned_anchor = message
            log.warning("%s", message)
        return message

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
        stayed intact is raised. With :attr:`local`, ``load_fn`` gets the node-local rebuild; a
        delta that fails its checks is never handed to it: False, and :meth:`poll` falls back.
        """
        folder = self.begin_load(version)
        if folder is None:
            return False
        try:
            load_fn(folder if self.local is None else self.local.folder_for(version, folder))
        except DeltaError as e:  # raised before load_fn ran: the engine holds what it held
            intact = read_marker(folder) == self._loading_marker
            if intact and anchor_loss(self.run_dir, version) is not None:
                since = time.monotonic() if self._lost is None else self._lost[2]
                self._lost = (self._loading_marker, version, since)
            elif intact:
                self._bad_copy = self._loading_marker
            log.warning("weights %s not loaded (%s)%s", folder, e, "" if intact else "; retrying")
            self._loading_marker = None
            self._beat(**{LOADING_FIELD: None})
            return False
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
        self._loading_marker = self._lost = None
        self._beat(**{LOADED_FIELD: version, LOADING_FIELD: None})

    def loaded_by_broadcast(self, version: int) -> None:
        """Record ``version`` as the engine's, received by broadcast (no folder: no marker)."""
        self.loaded_version, self.loaded_marker, self._lost = version, None, None
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
