"""Evaluation: every row of the eval tasksets, generated and scored by the explorer loop's path
with the weights loaded; mean@k, pass@k and reward per taskset, and its episodes' and tool calls'
counts (failed, timed out), to the monitor only (never to the buffer).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Sequence

from rft.buffer.experience import Experience
from rft.config.schema import Config
from rft.explorer import tasksets as T
from rft.explorer.engine import Engine
from rft.explorer.open_steps import accuracy_of
from rft.explorer.reward_model import RewardModel
from rft.explorer.steps import run_tasks
from rft.monitor import EVAL_WEIGHTS_VERSION, Monitor

# The run's health beside the scores: failed episodes and tool calls that errored or timed out
# (a tool timeout scores a right answer 0; without these an eval's drop has no visible cause).
EVAL_HEALTH_PREFIXES = ("episodes/", "tools/")


def eval_taskset_metrics(
    name: str, k: int, groups: list[list[Experience]], detailed: bool = False
) -> dict[str, float]:
    """mean@k (mean accuracy over all samples) and pass@k (tasks with an accurate sample);
    ``detailed`` (Trinity's monitor.detailed_stats): also the std, max and min over the tasks
    of each task's mean accuracy and mean reward."""
    samples = [e for g in groups for e in g]
    if not samples:
        return {f"eval/{name}/tasks": 0}
    spread: dict[str, float] = {}
    if detailed:
        for what, of in (("accuracy", accuracy_of), ("reward", lambda e: e.reward)):
            per_task = [statistics.fmean(map(of, g)) for g in groups if g]
            spread[f"eval/{name}/{what}/std"] = statistics.pstdev(per_task)
            spread[f"eval/{name}/{what}/max"] = max(per_task)
            spread[f"eval/{name}/{what}/min"] = min(per_task)
    return spread | {
        f"eval/{name}/mean@{k}": statistics.fmean(map(accuracy_of, samples)),
        f"eval/{name}/pass@{k}": statistics.fmean(
            float(any(accuracy_of(e) >= 1.0 for e in g)) for g in groups
        ),
        f"eval/{name}/reward_mean": statistics.fmean(e.reward for e in samples),
        f"eval/{name}/response_length_mean": statistics.fmean(len(e.response_ids) for e in samples),
        f"eval/{name}/tasks": len(groups),
    }


def eval_metrics(
    cfg: Config,
    engine: Engine,
    eval_sets: list[T.Taskset],
    step: int,
    version: int,
    writer: str = "eval",
    reward_models: Sequence[RewardModel] = (),
) -> dict[str, Any]:
    """Every row of every eval taskset with its rollout_args, generated with weights version
    ``version`` (the engine's, nothing else in flight) by the explorer loop's path
    (:func:`rft.explorer.steps.run_tasks`; ``writer`` names the groups); their metrics per
    taskset (:func:`eval_taskset_metrics`)."""
    metrics: dict[str, Any] = {}
    for ts in eval_sets:
        items = [(i, T.Task(0, i, 0)) for i in range(len(ts))]
        exps, ran = run_tasks(cfg, engine, [ts], items, step, version, writer, reward_models)
        groups = [
            [e for e in exps if e.group_id == g] for g in dict.fromkeys(e.group_id for e in exps)
        ]
        metrics.update(
            eval_taskset_metrics(ts.name, ts.sampling.n, groups, cfg.monitor.detailed_stats)
        )
        metrics.update(
            (f"eval/{ts.name}/{key}", value)
            for key, value in ran.items()
            if key.startswith(EVAL_HEALTH_PREFIXES)
        )
    return metrics


def evaluate(
    cfg: Config,
    engine: Engine,
    eval_sets: list[T.Taskset],
    monitor: Monitor,
    step: int,
    version: int,
    reward_models: Sequence[RewardModel] = (),
) -> dict[str, Any]:
    """:func:`eval_metrics` of weights ``version`` with the time it took, logged at ``step`` to
    the monitor only."""
    start = time.monotonic()
    metrics = eval_metrics(cfg, engine, eval_sets, step, version, "eval", reward_models)
    metrics = {EVAL_WEIGHTS_VERSION: version, **metrics, "eval/time_s": time.monotonic() - start}
    monitor.log(step, metrics)
    return metrics
