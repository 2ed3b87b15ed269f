"""Trinity-RFT's prioritized replay buffer (``experience_buffer.replay_buffer``), trainer side.

Pure and clock-free: callers pass ``now`` (seconds, as ``time.time()``). Data in: whole groups
(Trinity's queue items) with where they live in the buffer (``ref``). Data out: the
highest-priority groups for a step's batch; a drawn group comes back ``reuse_cooldown_time``
seconds later with its use count raised, until its priority function retires it.
:meth:`ReplayBuffer.state` / :meth:`ReplayBuffer.restore` carry all but the experiences
(reloaded by ``ref``) through the trainer's checkpoint. No filesystem, no torch.
The specification: trinity/buffer/storage/queue.py (AsyncPriorityQueue, PriorityFunction).
"""

from __future__ import annotations

import bisect
import heapq
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from rft.buffer.experience import Experience, check_group_fits
from rft.config.schema import PRIORITY_FN_NAMES, ReplayBufferConfig
from rft.errors import ConfigError

# (model_version, use_count) -> (priority, put back into the queue)
PriorityFn = Callable[[int, int], tuple[float, bool]]
Ref = tuple[str, int, str]  # (writer, seq, group_id): the group's sealed segment

REPLAY_PREFIX = "replay/"  # the trainer's metrics of the replay buffer: replay/<name>
REUSED_SHARE = "replay/reused_share"  # experiences of the batch drawn before / all drawn


def linear_decay(decay: float) -> PriorityFn:
    """Trinity's ``linear_decay``: ``model_version - decay * use_count``; always put back."""

    def priority(model_version: int, use_count: int) -> tuple[float, bool]:
        return float(model_version - decay * use_count), True

    return priority


def decay_limit_randomization(
    decay: float, use_count_limit: int, sigma: float, rng: random.Random
) -> PriorityFn:
    """Trinity's ``decay_limit_randomization``: linear decay plus Gaussian noise of std
    ``sigma``; put back only while ``use_count < use_count_limit`` (a limit <= 0: always)."""

    def priority(model_version: int, use_count: int) -> tuple[float, bool]:
        value = float(model_version - decay * use_count)
        if sigma > 0.0:
            value += rng.gauss(0.0, sigma)
        return value, use_count < use_count_limit if use_count_limit > 0 else True

    return priority


# name -> (builder, its arguments' defaults): Trinity's default_config() of each class
PRIORITY_FNS: dict[str, tuple[Callable[..., PriorityFn], dict[str, float]]] = {
    "linear_decay": (linear_decay, {"decay": 2.0}),
    "decay_limit_randomization": (
        decay_limit_randomization,
        {"decay": 2.0, "use_count_limit": 3, "sigma": 0.0},
    ),
}
PRIORITY_FNS["linear_decay_use_count_control_randomization"] = PRIORITY_FNS[
    "decay_limit_randomization"
]
assert set(PRIORITY_FNS) == set(PRIORITY_FN_NAMES), "rft.config.schema.PRIORITY_FN_NAMES drifted"


def build_priority_fn(
    name: str, args: Mapping[str, Any], rng: random.Random | None = None
) -> PriorityFn:
    """The priority function ``name`` with Trinity's defaults updated by ``args``."""
    builder, defaults = PRIORITY_FNS[name]
    unknown = sorted(set(args) - set(defaults))
    if unknown:
        raise ConfigError(
            f"replay_buffer.priority_fn_args {unknown} are not arguments of {name!r}; valid "
            f"arguments are {sorted(defaults)}"
        )
    kwargs: dict[str, Any] = {}
    for key, default in {**defaults, **args}.items():
        if isinstance(default, bool) or not isinstance(default, (int, float)):
            raise ConfigError(
                f"replay_buffer.priority_fn_args.{key} must be a number, not {default!r}"
            )
        kwargs[key] = int(default) if key == "use_count_limit" else float(default)
    if name != "linear_decay":
        kwargs["rng"] = rng or random.Random()
    return builder(**kwargs)


@dataclass
class ReplayItem:
    """One queue item: a whole group and its bookkeeping."""

    experiences: list[Experience]
    ref: Ref | None = None  # where it can be reloaded from after a restart (None: nowhere)
    use_count: int = 0  # times drawn into a batch
    priority: float = 0.0  # computed when (re)entering the queue
    ready_at: float = 0.0  # cooling: when it goes back into the queue
    serial: int = 0  # order of (re)entry: first in, first out among equal priorities

    @property
    def model_version(self) -> int:
        return self.experiences[0].model_version  # Trinity reads item[0]'s model_version


@dataclass
class ReplayCounts:
    """Cumulative counts since the trainer started (they restart with it)."""

    evicted: int = 0  # lowest-priority groups pushed out by a better one (queue full)
    rejected: int = 0  # groups not admitted: the queue was full of better ones
    retired: int = 0  # groups the priority function did not put back (use_count_limit)
    stale: int = 0  # queued groups dropped as older than trainer.max_staleness_versions


@dataclass
class ReplayBuffer:
    """Trinity's AsyncPriorityQueue as a plain structure: ``capacity`` groups in the queue (the
    cooling ones are outside it), the highest priority drawn first, first in first out among
    equals; full, a new group replaces the lowest (the oldest of them) unless every queued one
    has a higher priority. ``reuse_cooldown_s`` None: a drawn group is never put back."""

    capacity: int
    reuse_cooldown_s: float | None
    priority_fn: PriorityFn
    counts: ReplayCounts = field(default_factory=ReplayCounts)
    closed: bool = False  # the input ended: drawn groups are no longer put back
    _levels: dict[float, deque[ReplayItem]] = field(default_factory=dict)
    _priorities: list[float] = field(default_factory=list)  # ascending keys of _levels
    _cooling: list[tuple[float, int, ReplayItem]] = field(default_factory=list)  # a heap
    _size: int = 0
    _serial: int = 0

    @classmethod
    def from_config(
        cls, cfg: ReplayBufferConfig, capacity: int, rng: random.Random | None = None
    ) -> ReplayBuffer:
        fn = build_priority_fn(cfg.priority_fn, cfg.priority_fn_args, rng)
        return cls(capacity, cfg.reuse_cooldown_time, fn)

    def __len__(self) -> int:
        return self._size

    @property
    def cooling(self) -> int:
        return len(self._cooling)

    def put(self, item: ReplayItem) -> bool:
        """Admit ``item`` (new, or back from cooling) at its priority; False if not admitted."""
        if not item.experiences:
            return False
        item.priority, keep = self.priority_fn(item.model_version, item.use_count)
        if not keep:
            self.counts.retired += 1
            return False
        if self._size >= self.capacity:
            lowest = self._priorities[0]
            if lowest > item.priority:
                self.counts.rejected += 1
                return False
            self._pop(lowest)  # the oldest of the lowest, even at an equal priority (as Trinity)
            self.counts.evicted += 1
        self._serial += 1
        item.serial = self._serial
        self._insert(item)
        return True

    def draw(
        self, max_experiences: int, now: float, min_version: int | None = None
    ) -> list[ReplayItem]:
        """The highest-priority groups that fit ``max_experiences`` together, ``use_count``
        raised; queued groups older than ``min_version`` are dropped on the way (as Trinity's
        ``min_model_version``). Hand the batch's groups to :meth:`settle` once it is complete."""
        self.refill(now)
        drawn: list[ReplayItem] = []
        total = 0
        while self._size:
            best = self._levels[self._priorities[-1]][0]
            if min_version is not None and best.model_version < min_version:
                self._pop(self._priorities[-1])
                self.counts.stale += 1
                continue
            if total + len(best.experiences) > max_experiences:
                if not drawn:
                    check_group_fits(best.experiences, max_experiences)
                break  # priority order: a smaller, lower group does not jump the queue
            item = self._pop(self._priorities[-1])
            item.use_count += 1
            drawn.append(item)
            total += len(item.experiences)
        return drawn

    def settle(self, drawn: list[ReplayItem], now: float) -> None:
        """The batch of ``drawn`` went to the trainer at ``now``: each group cools down for
        ``reuse_cooldown_s`` before it is put back (never within the batch it is in), or is
        dropped when reuse is off or the buffer is closed."""
        if self.reuse_cooldown_s is None or self.closed:
            return
        for item in drawn:
            item.ready_at = now + self.reuse_cooldown_s
            heapq.heappush(self._cooling, (item.ready_at, item.serial, item))

    def refill(self, now: float) -> None:
        """Put back the groups whose cooldown ended by ``now``, in the order it ended."""
        while self._cooling and self._cooling[0][0] <= now:
            self.put(heapq.heappop(self._cooling)[2])

    def close(self, now: float) -> None:
        """The input ended (Trinity's close): the groups cooled down by ``now`` are put back, then
        no group is any more, so the queue drains and the input ends (Trinity stops once its
        queue is empty, groups still cooling or not)."""
        if not self.closed:
            self.refill(now)
        self.closed = True
        self._cooling.clear()

    def state(self) -> dict[str, Any]:
        """JSON-serialisable bookkeeping of every group with a ``ref`` (not the experiences)."""
        queued = sorted((i for q in self._levels.values() for i in q), key=lambda i: i.serial)
        cooling = [i for _, _, i in sorted(self._cooling, key=lambda c: (c[0], c[1]))]
        return {
            "queued": [_entry(i) for i in queued if i.ref is not None],
            "cooling": [_entry(i) for i in cooling if i.ref is not None],
        }

    def restore(self, state: Mapping[str, Any], groups: Mapping[Ref, list[Experience]]) -> int:
        """Rebuild from :meth:`state` with the groups reloaded by ref (priorities as saved, so
        noise is not redrawn); returns how many saved groups were not found in ``groups``."""
        missing = 0
        for kind in ("queued", "cooling"):
            for entry in state.get(kind, []):
                ref = tuple(entry["ref"])
                if ref not in groups:
                    missing += 1
                    continue
                item = ReplayItem(
                    groups[ref],
                    ref,  # type: ignore[arg-type]
                    int(entry["use_count"]),
                    float(entry["priority"]),
                    float(entry.get("ready_at", 0.0)),
                )
                self._serial += 1
                item.serial = self._serial
                if kind == "cooling":
                    heapq.heappush(self._cooling, (item.ready_at, item.serial, item))
                elif self._size < self.capacity:  # a smaller capacity now: the newest stay out
                    self._insert(item)
                else:
                    self.counts.evicted += 1
        return missing

    def refs(self) -> set[Ref]:
        """Where every held group lives (their segments must not be released)."""
        held = [i for q in self._levels.values() for i in q] + [c[2] for c in self._cooling]
        return {i.ref for i in held if i.ref is not None}

    def _insert(self, item: ReplayItem) -> None:
        level = self._levels.get(item.priority)
        if level is None:
            level = self._levels[item.priority] = deque()
            bisect.insort(self._priorities, item.priority)
        level.append(item)
        self._size += 1

    def _pop(self, priority: float) -> ReplayItem:
        level = self._levels[priority]
        item = level.popleft()
        if not level:
            del self._levels[priority]
            self._priorities.pop(bisect.bisect_left(self._priorities, priority))
        self._size -= 1
        return item


def _entry(item: ReplayItem) -> dict[str, Any]:
    return {
        "ref": list(item.ref or ()),
        "use_count": item.use_count,
        "priority": item.priority,
        "ready_at": item.ready_at,
    }


def reused_share(drawn: list[ReplayItem]) -> float:
    """Of the experiences drawn, the share drawn before (use_count > 1 after this draw)."""
    total = sum(len(i.experiences) for i in drawn)
    again = sum(len(i.experiences) for i in drawn if i.use_count > 1)
    return again / total if total else 0.0


def split_groups(experiences: list[Experience]) -> list[list[Experience]]:
    """Consecutive records of one (writer, group_id) as one group each (a read's order)."""
    groups: list[list[Experience]] = []
    for exp in experiences:
        last = groups[-1][0] if groups else None
        if last is not None and (last.writer, last.group_id) == (exp.writer, exp.group_id):
            groups[-1].append(exp)
        else:
            groups.append([exp])
    return groups


def stats(buffer: ReplayBuffer) -> dict[str, float]:
    """The replay buffer's metrics for the step's log (counts are since the trainer started)."""
    counts = buffer.counts
    return {
        REPLAY_PREFIX + "queued": len(buffer),
        REPLAY_PREFIX + "cooling": buffer.cooling,
        REPLAY_PREFIX + "evicted": counts.evicted,
        REPLAY_PREFIX + "rejected": counts.rejected,
        REPLAY_PREFIX + "retired": counts.retired,
        REPLAY_PREFIX + "stale_dropped": counts.stale,
    }
