"""The experience buffer: sealed JSONL segments on the shared filesystem (no locks, no appends).

Data enters through a :class:`SegmentWriter` (one per explorer task), which publishes each batch
as one segment atomically (temp, fsync, rename): a segment is absent or complete, and never
changes. Data leaves through a :class:`SegmentReader` (the trainer) as whole groups, exactly
once across restarts by way of a cursor saved in the trainer's checkpoint. Damage (corrupt
lines, copied or misplaced segments, seq gaps) is skipped, counted and logged, never fatal.
Only ``release(cursor)`` deletes segments, and never a writer's newest or a misplaced one.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection, Sequence

from rft import atomic
from rft.buffer.experience import (
    Experience,
    ReaderStats,
    StalenessFilter,
    check_group_fits,
    contiguous_groups,
    encode_record,
    poll_read,
)
from rft.buffer.segment_file import (
    MISPLACED_ADVICE,
    SEGMENT_FORMAT,
    check_writer_name,
    format_seqs,
    list_folder,
    list_segments,
    list_writers,
    load_segment,
    misplaced_reason,
    read_header,
    segment_name,
    whole_groups,
)
from rft.buffer.sqlite import (
    SqlBufferReader,
    SqlBufferWriter,
    SqliteArchive,
    check_sql_transport,
    sqlite_url_path,
)
from rft.errors import ConfigError, DataError, NotSupportedError, storage_errors
from rft.rundir import BUFFER_DIR

log = logging.getLogger(__name__)


class SegmentWriter:
    """Publishes batches of one explorer task as sealed segments in ``buffer/<writer>/``.

    The folder has this single writer. A restarted writer removes its dead predecessor's
    temporaries and continues the seq numbering after the newest sealed segment.
    """

    def __init__(self, buffer_dir: Path | str, writer: str):
        self.writer = check_writer_name(writer)
        self.folder = Path(buffer_dir) / writer
        with storage_errors(self.folder, "create"):  # names the file in the way, if one is
            self.folder.mkdir(parents=True, exist_ok=True)
        for path in atomic.remove_stale_tmp(self.folder):
            log.info("removed %s (temporary of a dead writer)", path)
        sealed = list_segments(self.folder)
        self.next_seq = sealed[-1] + 1 if sealed else 0

    def write(self, experiences: Sequence[Experience], seq: int | None = None) -> Path:
        """Seal ``experiences`` (whole groups) as one segment; return its path.

        ``seq`` defaults to the next number; synchronous runs pass the step. An empty batch still
        seals a segment, so the trainer can tell that this rank finished the step.
        """
        seq = self.next_seq if seq is None else seq
        path = self.folder / segment_name(seq)
        if seq < self.next_seq:
            raise DataError(
                f"{path}: seq {seq} is below the next free seq {self.next_seq}; sealed segments "
                "never change and readers may be past it: write with a seq >= next_seq"
            )
        records = contiguous_groups(experiences)
        header = {
            "format": SEGMENT_FORMAT,
            "writer": self.writer,
            "seq": seq,
            "num_records": len(records),
        }
        lines = [json.dumps(header).encode("utf-8")]
        lines += [encode_record(e, self.writer) for e in records]  # DataError if invalid
        lines.append(b"")  # the last line ends with a newline too
        try:  # one buffer, one write
            atomic.write_bytes(path, b"\n".join(lines), overwrite=False)
        except FileExistsError as e:
            raise DataError(f"{path} is already sealed; sealed segments never change") from e
        self.next_seq = seq + 1
        return path

    def close(self) -> None:
        """Nothing to flush (every write is sealed before it returns); for symmetry with SQL."""


@dataclass
class _Segment:
    """A loaded segment: its remaining whole groups, each with the line offset after it."""

    writer: str
    seq: int
    groups: deque[tuple[list[Experience], int]]


class SegmentReader:
    """Reads sealed segments (trainer side): whole groups, exactly once across restarts."""

    def __init__(
        self,
        buffer_dir: Path | str,
        cursor: dict[str, Any] | None = None,
        max_staleness_versions: int | None = None,
        drop_stale: bool = True,
    ):
        self.buffer_dir = Path(buffer_dir)
        list_folder(self.buffer_dir)  # fail now, naming the path, if it is not a readable folder
        self.stats = ReaderStats()
        self._staleness = StalenessFilter(max_staleness_versions, drop_stale)
        self._pos: dict[str, tuple[int, int]] = _parse_cursor(cursor)
        self._pending: dict[str, list[int]] = {}
        self._current: _Segment | None = None
        self._last_writer = ""
        self._may_scan = True
        self._misplaced: set[tuple[str, int]] = set()  # (writer, seq) skipped: never read again
        self._verified: set[tuple[str, int]] = set()  # loaded with a matching header: releasable
        self._warned_folders: set[str] = set()
        # (writer, group_id) -> seq of each group the last read returned: where a replay buffer
        # (rft.buffer.replay) finds it again after a restart
        self.group_seqs: dict[tuple[str, str], int] = {}

    def cursor(self) -> dict[str, Any]:
        """JSON-serialisable position, ``{"segments": {writer: {"seq", "offset"}}}``: per writer,
        the segment to read next and how many of its record lines are consumed."""
        return {"segments": {w: {"seq": s, "offset": o} for w, (s, o) in sorted(self._pos.items())}}

    def read(
        self,
        max_experiences: int | None = None,
        current_version: int | None = None,
        timeout_s: float = 0.0,
        poll_s: float = 0.5,
    ) -> list[Experience]:
        """Up to ``max_experiences`` records in whole groups (all available if None).

        Waits up to ``timeout_s`` for the budget to fill. ``current_version`` enables the
        staleness filter (groups older than ``max_staleness_versions`` are dropped or counted).
        """

        def once(budget: int | None, first: bool) -> tuple[list[Experience], bool, bool]:
            self._may_scan = True  # each pass may list the buffer once, not once per segment
            return self._read_once(budget, current_version, first)

        self.group_seqs = {}
        experiences = poll_read(once, max_experiences, timeout_s, poll_s)
        opened = 1 if self._current is not None and self._current.groups else 0
        self.stats.backlog_segments = opened + sum(map(len, self._pending.values()))
        return experiences

    def read_step(
        self, step: int, writers: Sequence[str], current_version: int | None = None
    ) -> list[Experience]:
        """Every remaining record of each writer's segment ``step`` (synchronous mode).

        Call once :func:`~rft.buffer.segment_file.unsealed_writers` is empty. Writers already past
        ``step`` (a resumed trainer) contribute nothing; unread segments before ``step`` are an
        error, because skipping them would lose experiences.
        """
        out: list[Experience] = []
        self.group_seqs = {}
        for writer in writers:
            seq, offset = self._pos.get(writer, (0, 0))
            if seq > step:
                continue
            earlier = [s for s in list_segments(self.buffer_dir / writer) if seq <= s < step]
            if earlier:
                raise DataError(
                    f"{self.buffer_dir / writer} has unread segments {earlier} before step {step}; "
                    "the buffer and the trainer's cursor disagree (was the run directory mixed?)"
                )
            segment = self._load(writer, step, offset if seq == step else 0)
            for group, _end in segment.groups if segment else ():
                if self._staleness.keep(group, current_version, self.stats):
                    out.extend(group)
                    self.stats.groups_read += 1
                    self.group_seqs[(writer, group[0].group_id)] = step
            self._pos[writer] = (step + 1, 0)
            if self._current is not None and self._current.writer == writer:
                self._current = None
        self._pending = {}
        self.stats.experiences_read += len(out)
        return out

    def release(self, cursor: dict[str, Any], keep: Collection[tuple[str, int]] = ()) -> list[Path]:
        """Delete segments consumed according to ``cursor`` (one saved in a checkpoint).

        Each writer's newest segment is kept: a restarted writer numbers on from it. So is a
        misplaced segment (header of another writer or seq): it is someone's copy, not ours.
        So is each ``(writer, seq)`` in ``keep``: groups a replay buffer still holds.
        """
        removed = []
        for writer, (seq, _offset) in _parse_cursor(cursor).items():
            upto = min(seq, self._pos.get(writer, (0, 0))[0])
            sealed = list_segments(self.buffer_dir / writer)
            for s in sealed[:-1]:
                path = self.buffer_dir / writer / segment_name(s)
                if s < upto and (writer, s) not in keep and self._releasable(writer, s, path):
                    path.unlink(missing_ok=True)
                    removed.append(path)
                    self._verified.discard((writer, s))
        return removed

    def reload_groups(
        self, refs: Collection[tuple[str, int, str]]
    ) -> dict[tuple[str, int, str], list[Experience]]:
        """The groups ``(writer, seq, group_id)`` read before (kept unreleased for a replay
        buffer), loaded again from their sealed segments; a missing or damaged one is absent
        from the result (the caller counts it). Reading counts nothing in ``stats``."""
        found: dict[tuple[str, int, str], list[Experience]] = {}
        wanted: dict[tuple[str, int], set[str]] = {}
        for writer, seq, group_id in refs:
            wanted.setdefault((writer, seq), set()).add(group_id)
        for (writer, seq), group_ids in sorted(wanted.items()):
            path = self.buffer_dir / writer / segment_name(seq)
            if not path.is_file():
                continue
            content = load_segment(path, 0, ReaderStats())
            if content.misplaced:
                continue
            for group, _end in whole_groups(path, content, ReaderStats()):
                if group[0].group_id in group_ids:
                    found[(writer, seq, group[0].group_id)] = group
        return found

    def _releasable(self, writer: str, seq: int, path: Path) -> bool:
        """Not misplaced: known from loading it, else (consumed by an earlier trainer process)
        from its header line."""
        if (writer, seq) in self._verified:
            return True
        if (writer, seq) in self._misplaced:
            return False
        return misplaced_reason(path, read_header(path)) is None

    def _read_once(
        self, budget: int | None, current_version: int | None, first: bool
    ) -> tuple[list[Experience], bool, bool]:
        out: list[Experience] = []
        progressed = False
        while True:
            segment = self._current or self._open_next()
            if segment is None:
                break
            self._current = segment
            while segment.groups:
                group, end = segment.groups[0]
                if budget is not None and len(out) + len(group) > budget:
                    if first and not out:
                        check_group_fits(group, budget)
                    self.stats.experiences_read += len(out)
                    return out, True, progressed
                segment.groups.popleft()
                progressed = True
                self._pos[segment.writer] = (segment.seq, end)
                if self._staleness.keep(group, current_version, self.stats):
                    out.extend(group)
                    self.stats.groups_read += 1
                    self.group_seqs[(segment.writer, group[0].group_id)] = segment.seq
            self._pos[segment.writer] = (segment.seq + 1, 0)
            self._current = None
            progressed = True
        self.stats.experiences_read += len(out)
        return out, False, progressed

    def _open_next(self) -> _Segment | None:
        """Load the next segment, taking writers round-robin. The folder is listed at the start
        of each pass, so a writer that joins (an added explorer) is read from the next pass on
        even while others have a long backlog; within a pass, once more when all is consumed."""
        if self._may_scan:
            self._scan()
            self._may_scan = False
        while True:
            writers = sorted(w for w, seqs in self._pending.items() if seqs)
            if not writers:
                return None
            after = [w for w in writers if w > self._last_writer]
            writer = (after or writers)[0]
            seq = self._pending[writer].pop(0)
            self._last_writer = writer
            pos_seq, offset = self._pos.get(writer, (0, 0))
            segment = self._load(writer, seq, offset if seq == pos_seq else 0)
            if segment is not None:  # None: misplaced, skipped
                self._report_gap(writer, seq)
                return segment

    def _scan(self) -> None:
        """Find sealed segments at or after each writer's cursor (new writers included)."""
        self._pending = {}
        for writer in list_writers(self.buffer_dir):
            first = self._pos.get(writer, (0, 0))[0]
            seqs = [
                s
                for s in list_segments(self.buffer_dir / writer)
                if s >= first and (writer, s) not in self._misplaced
            ]
            if seqs:
                self._pending[writer] = seqs

    def _report_gap(self, writer: str, seq: int) -> None:
        """Warn and count when segment ``seq``, just loaded, is past the writer's cursor: the
        seqs between are gone (misplaced ones aside). Only for writers with a position (from
        the cursor or a segment read): where a writer's numbering starts is its own affair
        (explorers number segments by step, from 1)."""
        if writer not in self._pos:
            return
        pos_seq, offset = self._pos[writer]
        missing = [s for s in range(pos_seq, seq) if (writer, s) not in self._misplaced]
        if not missing:
            return
        self.stats.count(writer, "missing_segments", len(missing))
        partly = (
            f" ({offset} lines of seq {pos_seq} had been read)"
            if offset and missing[0] == pos_seq
            else ""
        )
        log.warning(
            "%s: segment seqs %s are missing%s; reading on from %s, their experiences are lost. "
            "Were they deleted by hand, or released by a newer checkpoint than the one the "
            "trainer resumed from?",
            self.buffer_dir / writer,
            format_seqs(missing),
            partly,
            segment_name(seq),
        )

    def _load(self, writer: str, seq: int, offset: int) -> _Segment | None:
        """The segment's whole groups from ``offset`` on; None (and a warning) if misplaced."""
        path = self.buffer_dir / writer / segment_name(seq)
        content = load_segment(path, offset, self.stats)
        if content.misplaced:
            self._misplaced.add((writer, seq))
            self._warn_misplaced(path, content.misplaced)
            return None
        self._verified.add((writer, seq))
        self.stats.segments_read += 1
        return _Segment(writer, seq, whole_groups(path, content, self.stats))

    def _warn_misplaced(self, path: Path, reason: str) -> None:
        """Once per folder (a copied folder holds many such segments); then at debug level."""
        folder = str(path.parent)
        if folder in self._warned_folders:
            log.debug("skipped misplaced segment %s: %s", path, reason)
            return
        self._warned_folders.add(folder)
        log.warning(
            "%s: %s. Skipped, and left in place%s (counted in misplaced_segments; "
            "further ones in %s are skipped without a warning)",
            path,
            reason,
            MISPLACED_ADVICE,
            folder,
        )


def _parse_cursor(cursor: dict[str, Any] | None) -> dict[str, tuple[int, int]]:
    if not cursor:
        return {}
    if "segments" not in cursor:
        raise DataError(
            f"buffer cursor {str(cursor)[:80]} is not a segment-buffer cursor (was the checkpoint "
            "written with another buffer storage_type?); resume with the same storage_type"
        )
    try:
        return {w: (int(p["seq"]), int(p["offset"])) for w, p in cursor["segments"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise DataError(f"damaged buffer cursor {str(cursor)[:80]}: {e}") from e


# --- Trinity's storage_type spellings -----------------------------------------------------
# ``queue`` (alias ``jsonl``) is this buffer, optionally archived to SQLite by the trainer;
# ``sql`` uses SQLite as the transport (rft.buffer.sqlite, one node only).

QUEUE_TYPES = ("queue", "jsonl")


def _check_storage(storage_type: str, path: str) -> None:
    if storage_type not in QUEUE_TYPES + ("sql",):
        raise NotSupportedError(
            f"buffer.trainer_input.experience_buffer.storage_type: {storage_type!r} is not "
            "supported; valid values are 'queue' (sealed JSONL segments, the default) and 'sql'"
        )
    if storage_type == "sql" and not path:
        raise ConfigError(
            "buffer.trainer_input.experience_buffer.path must be sqlite:///<file>.db with "
            "storage_type: sql (or use storage_type: queue, which needs no path)"
        )
    if storage_type in QUEUE_TYPES and path and not path.startswith("sqlite:"):
        raise ConfigError(
            f"buffer.trainer_input.experience_buffer.path: {path!r}: with storage_type: queue the "
            "path is empty or sqlite:///<file>.db (an archive of consumed experiences)"
        )


def open_buffer_writer(
    run_dir: Path | str,
    writer: str,
    storage_type: str = "queue",
    path: str = "",
    name: str = "experience_buffer",
    num_nodes: int | None = None,
) -> SegmentWriter | SqlBufferWriter:
    """The writer for one explorer task (``writer``, e.g. ``explorer-0``)."""
    _check_storage(storage_type, path)
    if storage_type == "sql":
        check_sql_transport(num_nodes)
        return SqlBufferWriter(sqlite_url_path(run_dir, path), check_writer_name(writer), name)
    return SegmentWriter(Path(run_dir) / BUFFER_DIR, writer)


def open_buffer_reader(
    run_dir: Path | str,
    storage_type: str = "queue",
    path: str = "",
    name: str = "experience_buffer",
    cursor: dict[str, Any] | None = None,
    max_staleness_versions: int | None = None,
    drop_stale: bool = True,
    num_nodes: int | None = None,
) -> SegmentReader | SqlBufferReader:
    """The trainer's reader, resumed from ``cursor`` (from its checkpoint) when given."""
    _check_storage(storage_type, path)
    if storage_type == "sql":
        check_sql_transport(num_nodes)
        return SqlBufferReader(
            sqlite_url_path(run_dir, path), name, cursor, max_staleness_versions, drop_stale
        )
    return SegmentReader(Path(run_dir) / BUFFER_DIR, cursor, max_staleness_versions, drop_stale)


def open_archive(
    run_dir: Path | str,
    storage_type: str = "queue",
    path: str = "",
    name: str = "experience_buffer",
) -> SqliteArchive | None:
    """The trainer's SQLite archive of consumed experiences (queue + sqlite:// path), or None."""
    _check_storage(storage_type, path)
    if storage_type == "sql" or not path:
        return None
    return SqliteArchive(sqlite_url_path(run_dir, path), name)
