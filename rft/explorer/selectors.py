"""Task selectors: Trinity-RFT's ``data_selector`` types as pure functions of a position.

Data in: one training taskset's ``DataSelectorConfig``, its row count, its feature columns
(``offline_easy2hard``, ``difficulty_based``) and the rows drawn at a time (``random``,
``difficulty_based``). Data out: :meth:`TaskSelector.row`, position (tasks taken from the
taskset, 0-based) -> (row, epoch). The position is the whole state, as Trinity's selectors keep
only ``current_index``: it lives in ``Cursor.positions`` and :mod:`rft.explorer.cursor` saves it
in ``explorer_meta.json``, so a restarted or added explorer task computes the same order.
:class:`DifficultySelector` also follows the pass rates earlier steps scored, which every
explorer task reads from the same posts (:mod:`rft.explorer.pass_rates`) before a step's draw.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from rft.config.schema import DataSelectorConfig
from rft.errors import ConfigError, DataError
from rft.explorer import difficulty
from rft.explorer.pass_rates import PassRateBoard

# Trinity-RFT's semantics, followed from agentscope-ai/Trinity-RFT trinity/buffer/selector/
# selector.py (as in pan-x-c/Trinity-RFT@35722db36c92) and checked against the orders its
# tests/buffer/task_scheduler_test.py expects:
#   sequential         row = position mod rows (every epoch the same order)
#   shuffle            epoch e reads np.random.default_rng(seed + e).permutation(rows)
#   random             a draw of k rows without replacement from default_rng(seed + position of
#                      the draw's first task), k = rows the reader asks for at a time
#   offline_easy2hard  rows sorted by their feature_keys values, highest first (ties: higher
#                      row first), read in that order every epoch
BUILT = ("sequential", "shuffle", "random", "offline_easy2hard")


class TaskSelector:
    """Row order of one taskset (``data_selector.selector_type``, see :data:`BUILT`)."""

    def __init__(
        self,
        kind: str,
        seed: int,
        num_rows: int,
        *,
        draw_size: int = 1,
        features: Sequence[Sequence[float]] | None = None,
    ):
        if kind not in BUILT:
            raise DataError(f"data_selector.selector_type {kind!r}: use one of {', '.join(BUILT)}")
        assert num_rows > 0 and draw_size > 0, "a taskset has rows and a draw takes some"
        self.kind, self.seed, self.num_rows, self.draw_size = kind, seed, num_rows, draw_size
        self._cache: tuple[int, list[int]] | None = None  # (epoch or draw start, row list)
        self._sorted: list[int] = []
        if kind == "offline_easy2hard":
            assert features is not None and len(features) == num_rows, "one feature row per row"
            # Trinity sorts [features..., row] ascending and reverses it: descending by the
            # features, then by the row index.
            self._sorted = sorted(range(num_rows), key=lambda i: (*features[i], i), reverse=True)

    def row(self, position: int) -> tuple[int, int]:
        """(row index, epoch) of the task at ``position``; an epoch is ``num_rows`` tasks
        (``random`` has none in Trinity: its epochs only count tasks for total_epochs)."""
        epoch, offset = divmod(position, self.num_rows)
        if self.kind == "sequential":
            return offset, epoch
        if self.kind == "offline_easy2hard":
            return self._sorted[offset], epoch
        if self.kind == "shuffle":
            return self._rows(epoch, self._permutation)[offset], epoch
        start = position - position % self.draw_size
        return self._rows(start, self._draw)[position - start], epoch

    def _rows(self, key: int, make) -> list[int]:
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, make(key))
        return self._cache[1]

    def _permutation(self, epoch: int) -> list[int]:
        return np.random.default_rng(self.seed + epoch).permutation(self.num_rows).tolist()

    def _draw(self, start: int) -> list[int]:
        rng = np.random.default_rng(self.seed + start)
        return rng.choice(self.num_rows, self.draw_size, replace=False).tolist()


class DifficultySelector:
    """``difficulty_based``: each draw of ``draw_size`` rows scored from the pass-rate beliefs
    (:mod:`rft.explorer.difficulty`) after the steps :meth:`feed` has read."""

    def __init__(
        self,
        config: DataSelectorConfig,
        num_rows: int,
        draw_size: int,
        features: Sequence[Sequence[float]],
        taskset: int,
    ):
        assert len(features) == num_rows and draw_size <= num_rows, "checked by build()"
        self.args = config.difficulty_args()
        self.seed, self.num_rows, self.draw_size, self.taskset = (
            config.seed,
            num_rows,
            draw_size,
            taskset,
        )
        self.features = np.asarray(features, dtype=float)  # [rows, 2]
        self.beliefs = difficulty.PassRateBeliefs.initial(num_rows, self.args)
        self.fed = 0  # steps whose pass rates are in the beliefs
        self._draw: tuple[int, list[int]] | None = None  # (first position, rows)

    def ready(self, board: PassRateBoard, step: int) -> bool:
        """Whether the pass rates the draw of ``step`` follows are all posted."""
        return all(board.complete(s) for s in range(self.fed + 1, board.through(step) + 1))

    def feed(self, board: PassRateBoard, step: int, check: Callable[[], None]) -> None:
        """Read the pass rates of the steps the draw of ``step`` follows (waiting for their
        posts), in step order, as Trinity feeds each collected step."""
        for s in range(self.fed + 1, board.through(step) + 1):
            board.wait(s, check)
            rows, rates = board.rates(s).get(self.taskset, ([], []))
            self.beliefs = difficulty.update(self.beliefs, self.features, self.args, rows, rates)
            self.fed = s

    def row(self, position: int) -> tuple[int, int]:
        start = position - position % self.draw_size
        if self._draw is None or self._draw[0] != start:
            rows = difficulty.choose(self.beliefs, self.args, self.seed, start, self.draw_size)
            self._draw = (start, rows)
        return self._draw[1][position - start], position // self.num_rows


Selector = TaskSelector | DifficultySelector


def draw_size(batch_size: int, num_tasksets: int) -> int:
    """Rows a ``random`` selector draws at a time: Trinity's reader asks each taskset for its
    share of a step, all of ``buffer.batch_size`` with one taskset; rft deals several tasksets
    round-robin, so each gets about batch_size / tasksets per step."""
    return math.ceil(batch_size / num_tasksets)


def build(
    config: DataSelectorConfig, num_rows: int, rows: object, label: str, draw: int, index: int = 0
) -> Selector:
    """The selector of the taskset ``label`` (the ``index``-th training taskset; ``rows``: its
    datasets.Dataset, read for the feature columns); ConfigError for what Trinity would fail on
    at run time."""
    kind = config.selector_type
    if kind in ("random", "difficulty_based") and draw > num_rows:
        raise ConfigError(
            f"{label}.data_selector: {kind} draws {draw} distinct rows at a time (a step's "
            f"share of buffer.batch_size) but the taskset has {num_rows}; use shuffle, or a "
            "smaller buffer.batch_size"
        )
    if kind == "difficulty_based":
        features = feature_rows(rows, config.feature_keys, label)
        return DifficultySelector(config, num_rows, draw, features, index)
    features = feature_rows(rows, config.feature_keys, label) if config.feature_keys else None
    return TaskSelector(kind, config.seed, num_rows, draw_size=draw, features=features)


def feature_rows(rows: object, keys: Sequence[str], label: str) -> list[tuple[float, ...]]:
    """Per row, the values of the ``keys`` columns as floats (DataError if not numbers)."""
    columns = []
    for key in keys:
        try:
            values = [float(v) for v in rows[key]]  # type: ignore[index]
        except (TypeError, ValueError) as e:
            raise DataError(
                f"{label}.data_selector.feature_keys: column {key!r} must hold numbers ({e})"
            ) from e
        if any(math.isnan(v) for v in values):
            raise DataError(
                f"{label}.data_selector.feature_keys: column {key!r} has NaN values; fill them "
                "(the easy-to-hard order would depend on where they fall)"
            )
        columns.append(values)
    return list(zip(*columns))
