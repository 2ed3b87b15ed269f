"""The streaming explorer (``explorer.partial_rollout``): the engine stays full across steps.

In asynchronous runs the tasks of the next steps enter the engine as earlier requests finish
(up to ``explorer.max_inflight_samples`` samples, and never past the weights a step may be
generated with), new weights load between two engine steps with the requests kept (vLLM labels
every token with the version that produced it), each group is scored and spooled
(:mod:`rft.explorer.spool`) as it completes, and step s is sealed as segment s once all its groups
are in, in step order: the buffer, cursor and trainer protocols stay those of the plain loop.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

from rft.buffer.experience import Experience
from rft.config.schema import Config
from rft.explorer import cursor as C
from rft.explorer import tasksets as T
from rft.explorer.engine import Engine, Sample
from rft.explorer.reward_model import RewardModel
from rft.explorer.rollout import PromptJob, build_prompts, group_records, score_all, task_id
from rft.explorer.spool import GroupSpool, group_key
from rft.explorer.teacher import add_teacher_logprobs
from rft.monitor import (
    EXPLORER_RELOAD_S,
    EXPLORER_STEP_S,
    EXPLORER_WAIT_S,
    GENERATE_TIME_S,
    GENERATE_TOKENS_PER_S,
    GENERATED_TOKENS,
    LOOP_TOKENS_PER_S,
    ROLLOUT_INFLIGHT,
    ROLLOUT_SPAN_MEAN,
    ROLLOUT_SPAN_SHARE,
    ROLLOUT_TOKENS_DISCARDED,
    WEIGHTS_VERSION,
)
from rft.sync.explorer_side import WeightsIn
from rft.sync.schedule import required_version

log = logging.getLogger(__name__)

WEIGHTS_POLL_S = 1.0  # how often new weights are looked for between engine steps
# seal(step, experiences, slots sealed, step metrics, the task cursor after the step) -> whether
# the periodic evaluation is due after it
Seal = Callable[[int, list[Experience], C.Share, dict[str, float], T.Cursor], bool]


def inflight_limit(cfg: Config) -> int:
    """While fewer samples are in flight, the next step is admitted:
    ``explorer.max_inflight_samples``, else one step's (``batch_size x repeat_times``)."""
    return cfg.explorer.max_inflight_samples or cfg.buffer.batch_size * cfg.algorithm.repeat_times


@dataclass
class OpenStep:
    """An admitted step: its groups in flight and finished."""

    step: int
    share: C.Share  # (slot, task) pairs sealed with this step (carried slots included)
    cursor: T.Cursor  # the task stream after this step (saved when it is sealed)
    version: int  # weights loaded when it was admitted
    pending: dict[str, tuple[PromptJob, int]] = field(default_factory=dict)  # key -> (job, ids)
    done: dict[str, list[Experience]] = field(default_factory=dict)  # key -> its experiences
    resumed: set[str] = field(default_factory=set)  # keys taken from the spool (not generated)
    stats: dict[str, float] = field(default_factory=dict)


@dataclass
class Totals:
    """What happened since the last sealed step (its metrics)."""

    since: float = field(default_factory=time.monotonic)
    reload_s: float = 0.0
    wait_s: float = 0.0
    discarded: int = 0  # response tokens of groups dropped by explorer.max_version_span


def stream_steps(
    cfg: Config,
    engine: Engine,
    tasksets: list[T.Taskset],
    plan: C.RankPlan,
    stream: T.TaskStream,
    weights: WeightsIn,
    seal: Seal,
    *,
    writer: str,
    lead: int | None,
    max_steps: int | None = None,
    reward_models: Sequence[RewardModel] = (),
    evaluate: Callable[[int], None] | None = None,
) -> None:
    """Generate and seal steps until the task stream ends (or ``max_steps`` more are sealed).

    ``lead``: how many steps the explorer may run ahead of the weights (None: unbounded).
    ``evaluate(step)`` runs after the steps ``seal`` says, once the engine is drained (an
    evaluation generates with the engine alone); meanwhile no step is admitted."""
    cursor = plan.cursor
    spool = GroupSpool(cfg.run_dir, writer)
    spool.drop(cursor.step)  # groups of steps sealed before a restart
    limit = inflight_limit(cfg)
    interval = cfg.synchronizer.sync_interval
    open_steps: deque[OpenStep] = deque()
    totals = Totals()
    admitted = 0
    eval_at: int | None = None
    polled = -WEIGHTS_POLL_S  # the newest weights load before the first step (a resume)

    def load(need: int) -> None:
        """Load the newest weights (waiting for ``need``) between two engine steps."""
        with engine.paused():
            version, reload_s, wait_s = weights.wait_for(need)
            engine.label_version(version)
        totals.reload_s += reload_s
        totals.wait_s += wait_s

    def admissible() -> bool:
        more = max_steps is None or admitted < max_steps
        room = engine.in_flight < limit
        return eval_at is None and more and room and not plan.finished(stream)

    while True:
        if time.monotonic() - polled >= WEIGHTS_POLL_S:
            load(0)
            polled = time.monotonic()
        while admissible():
            step = cursor.step + 1
            need = 0 if lead is None else required_version(step, lead, interval)
            if (weights.loaded_version or 0) < need:
                if engine.in_flight:
                    break  # the engine works meanwhile; the weights are looked for again
                load(need)
            carried, share = plan.take(step, stream.next_batch(cursor))
            version = weights.loaded_version or 0
            open_steps.append(
                admit(cfg, engine, tasksets, spool, step, share, carried, cursor, version)
            )
            admitted += 1
        if engine.in_flight:
            for key, samples in engine.step():
                finish(cfg, open_steps, spool, key, samples, totals, writer, reward_models)
        while open_steps and not open_steps[0].pending:
            done = open_steps.popleft()
            due = seal(done.step, *sealed_step(done, totals, engine.in_flight), done.cursor)
            spool.drop(done.step)
            totals = Totals()
            if due and evaluate is not None and eval_at is None:
                eval_at = done.step
        if eval_at is not None and not open_steps:
            evaluate(eval_at)  # drained: the engine generates for the evaluation alone
            eval_at = None
        if not open_steps and not admissible():
            if eval_at is None and (plan.finished(stream) or admitted == max_steps):
                return


def admit(
    cfg: Config,
    engine: Engine,
    tasksets: list[T.Taskset],
    spool: GroupSpool,
    step: int,
    share: C.Share,
    carried: dict[int, C.Share],
    cursor: T.Cursor,
    version: int,
) -> OpenStep:
    """Step ``step`` opened: its slots' requests in the engine, except groups the spool kept
    from before a restart; the carried slots of earlier steps keep their own step in ids."""
    opened = OpenStep(step, [], T.Cursor.from_dict(cursor.to_dict()), version)
    kept = spool.take(step)
    filtered = 0
    for group_step, items in [*sorted(carried.items()), (step, share)]:
        opened.share += items
        for _, task in items:  # a row's own workflow column may name a class
            ts = tasksets[task.taskset]
            T.check_streamable(cfg, ts.label, ts.workflow_of(ts.rows[task.index]))
        jobs, counts = build_prompts(cfg, engine.tokenizer, items, tasksets)
        filtered += counts["prompts_filtered"]
        for job in jobs:
            key = group_key(group_step, job.slot)
            exps = kept.get(key)
            if exps and all(e.task_id == task_id(job.taskset, job.task) for e in exps):
                opened.done[key] = exps
                opened.resumed.add(key)
                continue
            opened.pending[key] = (job, group_step)
            engine.add(f"{step}:{key}", job.ids, job.taskset.sampling)
    opened.stats["prompts_filtered"] = filtered
    opened.stats["groups_resumed"] = len(opened.resumed)
    return opened


def finish(
    cfg: Config,
    open_steps: deque[OpenStep],
    spool: GroupSpool,
    request: str,
    samples: list[Sample],
    totals: Totals,
    writer: str,
    reward_models: Sequence[RewardModel],
) -> None:
    """A finished request: its group scored, kept in the spool and marked done in its step; a
    group spanning more than ``explorer.max_version_span`` versions is dropped (counted)."""
    step_text, key = request.split(":", 1)
    opened = next(o for o in open_steps if o.step == int(step_text))
    job, group_step = opened.pending.pop(key)
    span = max((s.versions[-1] - s.versions[0] for s in samples if s.versions), default=0)
    max_span = cfg.explorer.max_version_span
    if max_span is not None and span > max_span:
        totals.discarded += sum(len(s.response_ids) for s in samples)
        opened.done[key] = []
        return
    rewards, stats = score_all([job], [samples], reward_models)
    exps = group_records(job, samples, rewards[0], group_step, opened.version, writer)
    add_teacher_logprobs(cfg, exps)  # on-policy distillation only
    for name, value in stats.items():  # the reward models' seconds and truncations
        opened.stats[name] = opened.stats.get(name, 0.0) + value
    spool.put(opened.step, key, exps)
    opened.done[key] = exps


def sealed_step(
    opened: OpenStep, totals: Totals, in_flight: int
) -> tuple[list[Experience], C.Share, dict[str, float]]:
    """The step's experiences (groups adjacent, in slot order) and its metrics."""
    keys = sorted(opened.done, key=lambda k: tuple(int(part) for part in k.split(".")))
    exps = [e for key in keys for e in opened.done[key]]
    seconds = time.monotonic() - totals.since
    tokens = sum(
        len(e.response_ids) for k in keys if k not in opened.resumed for e in opened.done[k]
    )
    spans = [
        max(e.response_versions) - min(e.response_versions) for e in exps if e.response_versions
    ]
    return (
        exps,
        opened.share,
        {
            **opened.stats,
            "tasks": len(opened.share),
            GENERATED_TOKENS: tokens,
            GENERATE_TIME_S: seconds,
            GENERATE_TOKENS_PER_S: tokens / seconds if seconds > 0 else 0.0,
            EXPLORER_STEP_S: seconds,  # since the previous step was sealed: steps overlap
            LOOP_TOKENS_PER_S: tokens / seconds if seconds > 0 else 0.0,
            WEIGHTS_VERSION: opened.version,
            EXPLORER_RELOAD_S: totals.reload_s,
            EXPLORER_WAIT_S: totals.wait_s,
            ROLLOUT_SPAN_SHARE: len(spans) / len(exps) if exps else 0.0,
            ROLLOUT_SPAN_MEAN: sum(spans) / len(spans) if spans else 0.0,
            ROLLOUT_TOKENS_DISCARDED: totals.discarded,
            ROLLOUT_INFLIGHT: in_flight,
        },
    )
