"""One buffer segment file and the buffer's folder layout (no reader or writer state).

Layout: ``buffer/<writer>/seg-<seq:06d>.jsonl``, one folder per explorer task. A sealed segment's
first line is its header ``{"format", "writer", "seq", "num_records"}``, every other line one
record (:func:`rft.buffer.experience.encode_record`). :func:`load_segment` reads a file into its
valid records and the lines it lost; :func:`whole_groups` keeps the groups a trainer may use.
Nothing here writes or deletes a segment.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from rft import atomic
from rft.buffer.experience import Experience, ReaderStats, decode_line, read_group
from rft.errors import ConfigError, DataError

log = logging.getLogger(__name__)


SEGMENT_FORMAT = 1  # bump when a reader of the old format could misread the new one
_HEADER_LINES = 1  # file lines before the first record
_SEGMENT_RE = re.compile(r"^seg-(\d{6,})\.jsonl$")
_WRITER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def segment_name(seq: int) -> str:
    return f"seg-{seq:06d}.jsonl"


def format_seqs(seqs: Sequence[int]) -> str:
    """Ascending seqs as ranges: [3, 4, 5, 9] -> '3-5, 9'."""
    runs: list[list[int]] = []
    for seq in seqs:
        if runs and runs[-1][1] == seq - 1:
            runs[-1][1] = seq
        else:
            runs.append([seq, seq])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def check_writer_name(writer: str) -> str:
    """Writer names become folder names: letters, digits, ``_.-``; no temporary marker."""
    if not _WRITER_RE.match(writer) or atomic.is_tmp(writer):
        raise ConfigError(
            f"buffer writer name {writer!r} must be letters, digits, '_', '.', '-' (not starting "
            f"with '.', not containing '{atomic.TMP_MARK}'), e.g. 'explorer-0'"
        )
    return writer


def list_folder(folder: Path) -> list[str]:
    """Names in ``folder``; DataError naming it when it is unreadable or not a folder."""
    try:
        return sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    except NotADirectoryError as e:
        raise DataError(f"{folder} is not a folder; the buffer needs a folder there") from e
    except PermissionError as e:
        raise DataError(f"cannot list {folder} (permission denied); fix its permissions") from e


def _ignored(name: str) -> bool:
    """Hidden files (e.g. NFS ``.nfsXXXX`` debris) and other writers' temporaries."""
    return name.startswith(".") or atomic.is_tmp(name)


def list_segments(writer_dir: Path) -> list[int]:
    """Sealed segment seqs in one writer folder, ascending; DataError on foreign files."""
    seqs = []
    for name in list_folder(writer_dir):
        match = _SEGMENT_RE.match(name)
        if match:
            seqs.append(int(match.group(1)))
        elif not _ignored(name):
            raise DataError(
                f"{writer_dir / name} is not a buffer segment (seg-NNNNNN.jsonl); a writer "
                "folder holds only segments: move the file out of the run directory"
            )
    return sorted(seqs)


def list_writers(buffer_dir: Path) -> list[str]:
    """Writer folders in the buffer, sorted; DataError on anything else found there."""
    writers = []
    for name in list_folder(buffer_dir):
        if _ignored(name):
            continue
        if not (buffer_dir / name).is_dir() or not _WRITER_RE.match(name):
            raise DataError(
                f"{buffer_dir / name} is not a writer folder; {buffer_dir} holds one folder per "
                "explorer task: move it out of the run directory"
            )
        writers.append(name)
    return writers


def unsealed_writers(buffer_dir: Path | str, writers: Iterable[str], step: int) -> list[str]:
    """The writers whose segment for ``step`` (seq == step) is not sealed yet."""
    buffer_dir = Path(buffer_dir)
    return [w for w in writers if not (buffer_dir / w / segment_name(step)).exists()]


MISPLACED_ADVICE = (
    ": a copy of another writer's segments (e.g. a backup folder) in the buffer "
    "would be trained on twice; move copies out of the run directory"
)


@dataclass
class SegmentContent:
    """What :func:`load_segment` found in one segment file."""

    records: list[tuple[Experience, int]]  # valid records from the offset on, with line index
    damaged: list[int]  # record line indices lost (corrupt; the first missing one if cut short)
    num_lines: int  # record lines present
    misplaced: str | None = None  # why the header does not match the path (then nothing read)


def load_segment(path: Path, offset: int, stats: ReaderStats) -> SegmentContent:
    """Read a sealed segment's records from record line ``offset`` on.

    Corrupt lines are counted in ``stats`` and logged with file, line number and reason; a
    segment of a newer format is a DataError (this rft cannot know what changed). Of a
    misplaced segment only the header line is read; it is counted, the caller reports it.
    """
    writer = path.parent.name
    try:
        with open(path, "rb") as f:
            head = f.readline()
            header = _parse_header(path, head.rstrip(b"\n"))
            misplaced = misplaced_reason(path, header or {})
            rest = b"" if misplaced else f.read()
    except OSError as e:
        raise _read_error(path, e) from e
    if misplaced:
        stats.count(writer, "misplaced_segments")
        return SegmentContent([], [], 0, misplaced=misplaced)
    if not head:
        log.warning(
            "%s is empty (0 bytes): a sealed segment always has a header line, so the file "
            "was damaged (an interrupted copy, a full disk?); counted as corrupt",
            path,
        )
        stats.count(writer, "corrupt_records")
        return SegmentContent([], [], 0)
    damaged: list[int] = []
    if header is None:
        log.warning(
            "skipped corrupt header %s line 1: the records are read without checking the "
            "segment's writer and seq",
            path,
        )
        stats.count(writer, "corrupt_records")
        damaged.append(-1)  # record 0 may be torn into it (a lost newline): its group goes too
        header = {}
    body = rest.split(b"\n")
    if body[-1] == b"":
        body.pop()
    records = []
    for index in range(offset, len(body)):
        try:
            records.append((decode_line(body[index]), index))
        except DataError as e:
            stats.count(writer, "corrupt_records")
            damaged.append(index)
            log.warning("skipped corrupt record %s line %d: %s", path, index + _HEADER_LINES + 1, e)
    declared = header.get("num_records")
    if isinstance(declared, int) and len(body) < declared:
        log.warning("%s is truncated: %d of %d records present", path, len(body), declared)
        stats.count(writer, "corrupt_records", declared - max(len(body), offset))
        damaged.append(len(body))
    return SegmentContent(records, damaged, len(body))


def whole_groups(
    path: Path, content: SegmentContent, stats: ReaderStats
) -> deque[tuple[list[Experience], int]]:
    """Consecutive records of one group_id form a group; a group that may have lost a record
    (a damaged line inside it or next to it) is dropped, counted and logged. Each group kept
    comes with the line offset to resume from once it is consumed: the start of the next group
    kept, so the damage between is stepped over (and reported) once."""
    spans: list[list] = []  # [records, first line, last line]
    for rec, line in content.records:
        if spans and spans[-1][0][0].group_id == rec.group_id:
            spans[-1][0].append(rec)
            spans[-1][2] = line
        else:
            spans.append([[rec], line, line])
    unique = [read_group(g, str(path)) for g, _, _ in spans]  # copies out; None: an id clash
    damaged = content.damaged
    hurt = [
        u is None or any(lo - 1 <= d <= hi + 1 for d in damaged)
        for u, (_, lo, hi) in zip(unique, spans)
    ]
    kept = [(u, lo) for u, (_, lo, _), bad in zip(unique, spans, hurt) if not bad]
    if len(kept) < len(spans):
        dropped = [g[0].group_id for (g, _, _), bad in zip(spans, hurt) if bad]
        stats.count(path.parent.name, "incomplete_groups", len(dropped))
        log.warning(
            "%s: dropped %d group(s) next to damaged lines %s (any of them may lack a "
            "sample, which would skew its advantages): %s%s",
            path,
            len(dropped),
            [d + _HEADER_LINES + 1 for d in damaged],
            ", ".join(dropped[:5]),
            " ..." if len(dropped) > 5 else "",
        )
    ends = [lo for _, lo in kept[1:]] + [content.num_lines]
    return deque((g, end) for (g, _), end in zip(kept, ends))


def _read_error(path: Path, e: OSError) -> DataError:
    if isinstance(e, PermissionError):
        return DataError(f"cannot read {path} (permission denied); fix its permissions")
    return DataError(f"cannot read {path}: {e}")


def read_header(path: Path) -> dict[str, Any]:
    """The header of a segment, reading its first line only ({} if none, or the file is gone)."""
    try:
        with open(path, "rb") as f:
            head = f.readline()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise _read_error(path, e) from e
    return _parse_header(path, head.rstrip(b"\n")) or {}


def _parse_header(path: Path, line: bytes) -> dict[str, Any] | None:
    """The header on a segment's first line; None if that line is damaged (or empty)."""
    try:
        header = json.loads(line)
    except ValueError:
        return None
    if not isinstance(header, dict) or "format" not in header:
        return None
    version = header["format"]
    if not isinstance(version, int) or version > SEGMENT_FORMAT:
        raise DataError(
            f"{path} has segment format {version!r}, written by a newer rft (this one reads "
            f"format {SEGMENT_FORMAT}); upgrade rft to read this buffer"
        )
    return header


def misplaced_reason(path: Path, header: dict[str, Any]) -> str | None:
    """Why a segment's header does not belong at ``path`` (its writer must be the folder's
    name, its seq the file's), or None. A header field that is absent is not checked."""
    match = _SEGMENT_RE.match(path.name)
    expected = {"writer": path.parent.name, "seq": int(match.group(1)) if match else None}
    wrong = [k for k, v in expected.items() if k in header and v is not None and header[k] != v]
    if not wrong:
        return None
    return (
        f"its header says it was written by {header.get('writer')!r} as seq "
        f"{header.get('seq')!r}, but it lies in {path.parent.name}/ as seq {expected['seq']}"
    )
