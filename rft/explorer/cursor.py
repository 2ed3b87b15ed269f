"""Explorer task cursors (``explorer_meta.json``) that survive a change of the explorer count.

A :class:`Layout` deals each step's task slots to ``count`` ranks (at first: slots r, r + count,
... to rank r). A launch with another count records a new layout once, from what each old rank
sealed (its cursor, or its writer's newest segment): ``start`` (steps complete) and the ``done``
slots of later steps; each step's missing slots are dealt among the ranks whose writer can still
seal that step (if none can, they go with a rank's first segment). So every slot is generated
once, and a rank that starts later follows the recorded layout instead of replaying.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rft import atomic
from rft.buffer.segment_file import list_segments
from rft.errors import ConfigError, DataError
from rft.explorer.tasksets import Cursor, Task, TaskStream
from rft.rundir import BUFFER_DIR, EXPLORER_META, writer_name

log = logging.getLogger(__name__)

SAVE_TRIES = 5  # rewrites of explorer_meta.json when a concurrent writer replaced our entry
Newest = Callable[[int], int]  # rank -> newest segment seq its writer sealed (0: none)
Share = list[tuple[int, Task]]  # (slot, task) pairs of one step


@dataclass(frozen=True)
class Layout:
    """How ``count`` ranks share the task slots of the steps after ``start``."""

    id: int  # 0 for the first launch's count, +1 at each change of count
    count: int  # ranks (explorer tasks of this explorer name)
    start: int  # every slot of the steps <= start was generated before this layout
    cursor: Cursor  # the task stream after step ``start``
    done: dict[int, frozenset[int]] = field(default_factory=dict)  # later steps: slots generated
    floors: tuple[int, ...] = ()  # per rank: newest seq its writer had sealed (0: none)

    def able(self, step: int) -> list[int]:
        """Ranks whose writer can seal segment ``step`` (all when none can: they fold it)."""
        able = [r for r in range(self.count) if self.floors[r] < step]
        return able or list(range(self.count))

    def slots(self, step: int, rank: int, size: int) -> list[int]:
        """The slots of ``step`` (``size`` per step) that ``rank`` generates: the step's missing
        slots dealt round-robin among :meth:`able` ranks."""
        able = self.able(step)
        if step <= self.start or rank not in able:
            return []
        missing = [i for i in range(size) if i not in self.done.get(step, ())]
        return missing[able.index(rank) :: len(able)]

    def seal_seq(self, step: int, rank: int) -> int:
        """The segment seq holding ``rank``'s slots of ``step`` (seqs <= its floor are sealed)."""
        return max(step, self.floors[rank] + 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "count": self.count,
            "start": self.start,
            "cursor": self.cursor.to_dict(),
            "done": {str(s): sorted(slots) for s, slots in sorted(self.done.items())},
            "floors": list(self.floors),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Layout":
        try:
            done = {int(s): frozenset(int(i) for i in v) for s, v in d["done"].items()}
            layout = cls(
                int(d["id"]),
                int(d["count"]),
                int(d["start"]),
                Cursor.from_dict(d["cursor"]),
                done,
                tuple(int(f) for f in d["floors"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise DataError(
                f"{EXPLORER_META}: malformed explorer layout {d!r} ({e}); {_ADVICE}"
            ) from e
        if len(layout.floors) != layout.count:
            raise DataError(f"{EXPLORER_META}: layout {d!r} has floors for another count")
        return layout


_ADVICE = "delete the explorer's entry to restart its tasks from the beginning"


def first_layout(count: int, cursor: Cursor) -> Layout:
    """The layout of a run's first count: rank r takes slots r, r + count, ... of every step."""
    return Layout(0, count, 0, cursor, {}, (0,) * count)


def advance(stream: TaskStream, cursor: Cursor, step: int) -> Cursor:
    """A copy of ``cursor`` moved forward to ``step`` (the stream is the same on every rank)."""
    out = Cursor.from_dict(cursor.to_dict())
    while out.step < step:
        stream.next_batch(out)
    return out


def covered(layout: Layout, progress: list[int], step: int, size: int) -> set[int]:
    """Slots of ``step`` generated once each rank r of ``layout`` sealed up to ``progress[r]``."""
    if step <= layout.start:
        return set(range(size))
    got = set(layout.done.get(step, ()))
    for rank, sealed in enumerate(progress):
        if layout.seal_seq(step, rank) <= sealed:
            got.update(layout.slots(step, rank, size))
    return got


def next_layout(
    old: Layout,
    progress: list[int],
    saved: list[Cursor],
    count: int,
    floors: tuple[int, ...],
    stream: TaskStream,
) -> Layout:
    """The layout for ``count`` ranks after ``old`` stopped with rank r's segments sealed up to
    ``progress[r]``; ``saved``: cursors the old ranks saved (places to replay the stream from),
    ``floors``: each new rank's newest sealed seq."""
    size = stream.batch_size
    last = max([old.start, *progress, *old.done])
    start = old.start
    while start < last and len(covered(old, progress, start + 1, size)) == size:
        start += 1
    done = {}
    for step in range(start + 1, last + 1):
        got = covered(old, progress, step, size)
        if got:
            done[step] = frozenset(got)
    base = max((c for c in [old.cursor, *saved] if c.step <= start), key=lambda c: c.step)
    return Layout(old.id + 1, count, start, advance(stream, base, start), done, floors)


# ----------------------------------------------------------------------------- a rank's plan


def pairs(layout: Layout, step: int, rank: int, batch: list[Task], size: int) -> Share:
    """``rank``'s (slot, task) pairs of ``step``; slots are dealt out of ``size``
    (``buffer.batch_size``) on every step, so a short last batch leaves some slots empty."""
    return [(i, batch[i]) for i in layout.slots(step, rank, size) if i < len(batch)]


@dataclass
class RankPlan:
    """What one rank generates: per step, its slots under ``layout``, from ``cursor`` on."""

    layout: Layout
    rank: int
    cursor: Cursor  # after the last step this rank sealed (or skipped)
    size: int  # slots per step (buffer.batch_size)
    last_step: int  # the stream's last step (a carried-only segment may come after it)
    carried: dict[int, Share] = field(default_factory=dict)  # earlier steps' pairs

    def take(self, step: int, batch: list[Task]) -> tuple[dict[int, Share], Share]:
        """(earlier steps' (slot, task) pairs sealed with this step's, this step's pairs): the
        rank's next segment, seq ``step``; ``batch`` is the stream's batch of ``step``."""
        carried, self.carried = self.carried, {}
        mine = (
            pairs(self.layout, step, self.rank, batch, self.size) if step <= self.last_step else []
        )
        return carried, mine

    def finished(self, stream: TaskStream) -> bool:
        return stream.finished(self.cursor) and not self.carried


def sealed_seq(run_dir: Path | str, name: str, rank: int) -> int:
    """The newest segment seq the writer of ``rank`` sealed in the buffer (0: none, or SQL)."""
    seqs = list_segments(Path(run_dir) / BUFFER_DIR / writer_name(name, rank))
    return seqs[-1] if seqs else 0


def resume(run_dir: Path | str, name: str, rank: int, count: int, stream: TaskStream) -> RankPlan:
    """This rank's plan: the current layout (a new one if the explorer count changed) and its
    cursor in it: its saved one moved past segments it sealed after saving, else the layout's
    start with the slots of steps its writer can no longer seal carried to its first segment."""
    newest: Newest = lambda r: sealed_seq(run_dir, name, r)  # noqa: E731
    layout, entries = current_layout(run_dir, name, count, stream, newest)
    mine, floor = entries.get(rank), layout.floors[rank]
    sealed = max(mine.step if mine else 0, newest(rank))
    plan = RankPlan(layout, rank, layout.cursor, stream.batch_size, stream.total_steps)
    if sealed > floor:  # sealed under this layout: carried slots went with its first segment
        base = mine if mine and mine.step >= layout.start else layout.cursor
        plan.cursor = advance(stream, base, max(sealed, layout.start))
        return plan
    plan.cursor = advance(stream, layout.cursor, layout.start)  # a copy
    while plan.cursor.step < floor:
        step = plan.cursor.step + 1
        share = pairs(layout, step, rank, stream.next_batch(plan.cursor), stream.batch_size)
        if share:
            plan.carried[step] = share
    return plan


def current_layout(
    run_dir: Path | str, name: str, count: int, stream: TaskStream, newest: Newest
) -> tuple[Layout, dict[int, Cursor]]:
    """The layout of ``count`` ranks and the cursors its ranks saved in it. When the recorded
    layout has another count, a new one is made from the old ranks' records and recorded: ranks
    starting together compute the same one, and the file is read again just before writing, so
    a rank that starts later adopts the recorded layout instead of making its own."""
    path = Path(run_dir) / EXPLORER_META
    for _ in range(SAVE_TRIES):
        layout, entries = _recorded(read_meta(path).get(name), count, stream)
        if layout.count == count:
            return layout, entries
        if stream.adaptive:
            raise ConfigError(
                f"{path}: {name} ran {layout.count} explorer tasks and this launch has {count}; "
                "with data_selector difficulty_based each step's pass rates are posted by the "
                f"tasks that ran its slots, so relaunch with {layout.count} explorer tasks "
                "(explorer.rollout_model.engine_num)"
            )
        progress = [
            max(entries[r].step if r in entries else 0, newest(r)) for r in range(layout.count)
        ]
        floors = tuple(newest(r) for r in range(count))
        new = next_layout(layout, progress, list(entries.values()), count, floors, stream)
        meta = read_meta(path)
        if _recorded(meta.get(name), count, stream)[0].count == count:
            continue  # another rank recorded it meanwhile
        log.warning(
            "%s: %s runs %d explorer tasks, %d before: steps <= %d are complete, %d later ones "
            "partly; their missing task slots are dealt among the %d",
            path,
            name,
            count,
            layout.count,
            new.start,
            len(new.done),
            count,
        )
        meta.setdefault(name, {})["layout"] = new.to_dict()
        atomic.write_json(path, meta)
    layout, entries = _recorded(read_meta(path).get(name), count, stream)
    if layout.count != count:
        raise DataError(f"{path}: could not record the layout of {count} explorers of {name}")
    return layout, entries


def _recorded(entry: Any, count: int, stream: TaskStream) -> tuple[Layout, dict[int, Cursor]]:
    """The recorded layout (files without one: the first layout, of the count the newest rank
    record ran with) and the cursors each rank saved under it."""
    entry = entry if isinstance(entry, dict) else {}
    ranks = entry.get("ranks", {})
    if not isinstance(ranks, dict) or not all(isinstance(r, dict) for r in ranks.values()):
        raise DataError(f"{EXPLORER_META}: malformed rank records {ranks!r}; {_ADVICE}")
    if "layout" in entry:
        layout = Layout.from_dict(entry["layout"])
    else:
        newest = max(ranks.values(), key=lambda r: r.get("time", 0), default={})
        layout = first_layout(int(newest.get("count", count)), stream.new_cursor())
    entries = {}
    for rank, record in ranks.items():
        if record.get("layout", 0) == layout.id and record.get("count") == layout.count:
            entries[int(rank)] = Cursor.from_dict(record.get("cursor", {}))
        elif "layout" not in entry:
            log.warning(
                "%s: ignored the cursor of rank %s, saved under %s explorers (files written "
                "before layouts were recorded keep one count)",
                EXPLORER_META,
                rank,
                record.get("count"),
            )
    for cursor in [layout.cursor, *entries.values()]:
        if len(cursor.positions) != len(stream.selectors):
            raise ConfigError(
                f"{EXPLORER_META}: a task cursor has {len(cursor.positions)} tasksets but the "
                f"config has {len(stream.selectors)}; {_ADVICE}"
            )
    return layout, entries


def save_cursor(run_dir: Path | str, name: str, rank: int, layout: Layout, cursor: Cursor) -> None:
    """Record this rank's cursor under ``explorer_meta.json[name]["ranks"][rank]`` (atomic).

    Several tasks rewrite the same file without locks: each re-reads after writing and
    rewrites if a concurrent writer replaced its entry (a resumed task also checks its buffer
    segments, so a lost update costs nothing but a replay of the stream).
    """
    path = Path(run_dir) / EXPLORER_META
    record = {
        "cursor": cursor.to_dict(),
        "count": layout.count,
        "layout": layout.id,
        "time": time.time(),
    }
    for _ in range(SAVE_TRIES):
        meta = read_meta(path)
        entry = meta.setdefault(name, {})
        entry.setdefault("layout", layout.to_dict())
        entry.setdefault("ranks", {})[str(rank)] = record
        atomic.write_json(path, meta)
        if read_meta(path).get(name, {}).get("ranks", {}).get(str(rank)) == record:
            return
    log.warning(
        "%s: could not confirm the cursor of %s rank %d (concurrent writers)", path, name, rank
    )


def read_meta(path: Path) -> dict[str, Any]:
    """``explorer_meta.json`` as a dict ({} when absent); DataError when damaged."""
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except ValueError as e:
        raise DataError(f"{path} is not valid JSON ({e}); delete it to restart task cursors") from e
    if not isinstance(meta, dict):
        raise DataError(f"{path} must hold a JSON object; delete it to restart task cursors")
    return meta
