"""Calibration of the pipeline simulator (``benchmarks/pipeline_sim.py``): a synchronous run's
per-step records -> the solo :class:`~pipeline_sim.Costs` of each side.

Least squares with non-negative coefficients of explorer busy time on (1, sum of lengths, max
length) and of trainer compute time on (1, tokens); publish and load times are means. In a
synchronous run each side works while the other waits, so these are solo costs. Standard
library only (a few columns: every subset of them is fitted and the best non-negative one kept).
"""

from __future__ import annotations

import itertools
import math
import statistics
from typing import Sequence

from benchmarks.pipeline_sim import Costs, StepRecord


def nonnegative_least_squares(rows: Sequence[Sequence[float]], y: Sequence[float]) -> list[float]:
    """argmin ||A x - y|| subject to x >= 0, for a few columns: the best of the least-squares
    fits on every subset of columns whose coefficients are all >= 0 (exact for few columns).
    A column that does not vary (max length always at the limit) or that the others explain
    drops out with coefficient 0 instead of getting a meaningless negative one."""
    k = len(rows[0])
    best: tuple[float, list[float]] = (math.inf, [0.0] * k)
    for size in range(1, k + 1):
        for cols in itertools.combinations(range(k), size):
            x = _least_squares([[r[c] for c in cols] for r in rows], y)
            if x is None or min(x) < 0:
                continue
            full = [0.0] * k
            for c, v in zip(cols, x):
                full[c] = v
            err = sum((sum(a * b for a, b in zip(r, full)) - t) ** 2 for r, t in zip(rows, y))
            if err < best[0] - 1e-12:
                best = (err, full)
    return best[1]


def _least_squares(rows: Sequence[Sequence[float]], y: Sequence[float]) -> list[float] | None:
    """Normal equations by Gaussian elimination with pivoting; None when singular."""
    k = len(rows[0])
    scale = [max(abs(r[c]) for r in rows) or 1.0 for c in range(k)]  # conditioning
    a = [
        [sum(r[i] * r[j] for r in rows) / (scale[i] * scale[j]) for j in range(k)]
        + [sum(r[i] * t for r, t in zip(rows, y)) / scale[i]]
        for i in range(k)
    ]
    for col in range(k):
        pivot = max(range(col, k), key=lambda i: abs(a[i][col]))
        if abs(a[pivot][col]) < 1e-9:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for i in range(k):
            if i != col:
                f = a[i][col] / a[col][col]
                a[i] = [u - f * v for u, v in zip(a[i], a[col])]
    return [a[i][k] / a[i][i] / scale[i] for i in range(k)]


def calibrate(records: Sequence[StepRecord], skip_first: int = 1) -> Costs:
    """Solo costs from a synchronous run's per-step records (the first ``skip_first`` steps,
    which carry warm-up, left out): explorer busy time ~ (1, sum of lengths, max length) and
    trainer compute time ~ (1, tokens) by non-negative least squares; ``publish_s`` the mean of
    steps that published, ``load_s`` of steps that loaded. The trainer is one node: divide
    ``train_s_per_token`` by nothing; a shape with M trainers divides by M."""
    recs = list(records[skip_first:]) or list(records)
    gen = nonnegative_least_squares(
        [(1.0, r.gen_tokens, r.max_len) for r in recs], [r.explore_s for r in recs]
    )
    train = nonnegative_least_squares(
        [(1.0, r.train_tokens) for r in recs], [r.train_s for r in recs]
    )
    publishes = [r.publish_s for r in recs if r.publish_s > 0]
    loads = [r.load_s for r in recs if r.load_s > 0]
    return Costs(
        gen_overhead_s=gen[0],
        gen_s_per_token=gen[1],
        gen_s_per_decode_step=gen[2],
        train_overhead_s=train[0],
        train_s_per_token=train[1],
        publish_s=statistics.fmean(publishes) if publishes else 0.0,
        load_s=statistics.fmean(loads) if loads else 0.0,
    )
