"""The pass rates each step's tasks scored, shared by an explorer's tasks through the run
directory, for the ``difficulty_based`` selector (:mod:`rft.explorer.difficulty`).

Data in: at each seal, an explorer task posts what its slots of that step scored (every
experience's reward, by taskset row) to ``pass_rates/<explorer>/step-NNNNNN/<writer>.json``,
before the segment itself, written once (a step generated again after a crash keeps the first
post, so every task reads the same rates). Data out: a step's rows and mean rewards, once the
posts cover all its slots (:meth:`PassRateBoard.complete`); every explorer task reads the same
posts, so they all compute the same task order, as with the other selectors.

When the feedback is read: Trinity's explorer hands a step's pass rates to its selector when it
collects the step, at each weight sync (every ``synchronizer.sync_interval`` steps), before it
reads the next step's tasks; so the tasks of step s follow the rates of steps up to
:meth:`PassRateBoard.through` (s), the last sync point before s.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable, Iterable

from rft import atomic
from rft.errors import DataError
from rft.rundir import PASS_RATES_DIR

log = logging.getLogger(__name__)

POLL_S = 0.5  # how often a waiting explorer task looks for the other tasks' posts
REPORT_S = 60.0  # how often it says that it is still waiting

# (taskset index, row) -> the rewards of that row's experiences in one step
Scores = dict[tuple[int, int], list[float]]


def scores_of(ids: dict[str, tuple[int, int]], exps: Iterable) -> Scores:
    """The rewards of ``exps`` by (taskset index, row), through ``ids`` (task id -> that pair,
    the step's tasks); a task whose episodes all failed has none (Trinity's pass rates come
    from the experiences too)."""
    scores: Scores = {key: [] for key in ids.values()}
    for exp in exps:
        key = ids.get(exp.task_id)
        if key is None:  # a workflow rewrote its task's id: its rewards cannot be placed
            log.warning("pass rates: experience of unknown task %r left out", exp.task_id)
            continue
        scores[key].append(float(exp.reward))
    return scores


class PassRateBoard:
    """The posts of one explorer (``explorer.name``): ``batch_size`` slots a step, feedback
    read at every ``interval``-th step."""

    def __init__(self, run_dir: Path | str, explorer: str, batch_size: int, interval: int):
        self.folder = Path(run_dir) / PASS_RATES_DIR / explorer
        self.batch_size, self.interval = batch_size, max(1, interval)
        self._complete: set[int] = set()  # steps seen complete (posts are never rewritten)
        self._looked: dict[int, float] = {}  # incomplete step -> when its posts were last read

    def through(self, step: int) -> int:
        """The last step whose rates the tasks of ``step`` follow (0: none)."""
        return self.interval * ((step - 1) // self.interval)

    def _step_dir(self, step: int) -> Path:
        return self.folder / f"step-{step:06d}"

    def post(self, writer: str, step: int, slots: Iterable[int], scores: Scores) -> None:
        """``writer``'s slots of ``step`` and their rewards (kept if already posted)."""
        body = {
            "slots": sorted(slots),
            "rows": [[ts, row, rewards] for (ts, row), rewards in sorted(scores.items())],
        }
        folder = self._step_dir(step)
        folder.mkdir(parents=True, exist_ok=True)
        try:
            atomic.write_bytes(folder / f"{writer}.json", json.dumps(body).encode(), False)
        except FileExistsError:
            log.info(
                "%s: pass rates of step %d already posted; the first post stands", writer, step
            )

    def _posts(self, step: int) -> list[dict]:
        folder = self._step_dir(step)
        posts = []
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            if atomic.is_tmp(path):
                continue
            try:
                posts.append(json.loads(path.read_text()))
            except (OSError, ValueError) as e:
                raise DataError(
                    f"{path}: unreadable pass-rate post ({e}); delete it and restart the "
                    "explorer task that wrote it (its step is generated again)"
                ) from e
        return posts

    def complete(self, step: int) -> bool:
        """Whether the posts of ``step`` cover every slot (an incomplete step's posts are read
        again at most every POLL_S: the explorer loop asks between engine steps)."""
        if step in self._complete:
            return True
        now = time.monotonic()
        if now - self._looked.get(step, -POLL_S) < POLL_S:
            return False
        self._looked[step] = now
        slots = {slot for post in self._posts(step) for slot in post["slots"]}
        if slots >= set(range(self.batch_size)):
            self._complete.add(step)
            self._looked.pop(step, None)
            return True
        return False

    def rates(self, step: int) -> dict[int, tuple[list[int], list[float]]]:
        """Per taskset index: the rows ``step`` ran (that left experiences) and their mean
        rewards, rows in increasing order."""
        scores: Scores = defaultdict(list)
        for post in self._posts(step):
            for ts, row, rewards in post["rows"]:
                scores[(int(ts), int(row))].extend(float(r) for r in rewards)
        out: dict[int, tuple[list[int], list[float]]] = {}
        for (ts, row), rewards in sorted(scores.items()):
            if rewards:
                rows, means = out.setdefault(ts, ([], []))
                rows.append(row)
                means.append(sum(rewards) / len(rewards))
        return out

    def wait(self, step: int, check: Callable[[], None] = lambda: None) -> None:
        """Until the posts of ``step`` are complete; ``check`` runs at each poll (the lease)."""
        start = last = time.monotonic()
        while not self.complete(step):
            check()
            now = time.monotonic()
            if now - last >= REPORT_S:
                log.info(
                    "difficulty_based: waiting %.0f s for the pass rates of step %d from the "
                    "other explorer tasks (%s)",
                    now - start,
                    step,
                    self._step_dir(step),
                )
                last = now
            time.sleep(POLL_S)
