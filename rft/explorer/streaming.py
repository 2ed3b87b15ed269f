"""The streaming explorer (``explorer.partial_rollout``): the engine stays full across steps.

In asynchronous runs the tasks of the next steps enter the engine as earlier requests finish
(up to ``explorer.max_inflight_samples`` samples, and never past the weights a step may be
generated with), new weights load between two engine steps with the requests kept (vLLM labels
every token with the version that produced it), each group is scored and spooled
(:mod:`rft.explorer.spool`) as it completes, and step s is sealed as segment s once all its groups
are in, in step order: the buffer, cursor and trainer protocols stay those of the plain loop.
Workflow classes run as episodes whose model calls join the same engine
(:mod:`rft.explorer.stream_episodes`).
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
from rft.explorer.episodes import BATCH_WAIT_S, EpisodeResult, episode_metrics
from rft.explorer.reward_model import RewardModel
from rft.explorer.rollout import (
    PromptJob,
    build_prompts,
    episode_records,
    episode_slots,
    generated_tokens,
    group_records,
    model_tokens,
    score_all,
    task_id,
    tool_stats,
)
from rft.explorer.spool import GroupSpool, group_key
from rft.explorer.stream_episodes import EpisodeGroup, StreamedEpisodes
from rft.explorer.teacher import TEACHER_KL, add_teacher_logprobs
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
from rft.workflow import tools

log = logging.getLogger(__name__)

WEIGHTS_POLL_S = 1.0  # how often new weights are looked for between engine steps
# seal(step, experiences, slots sealed, step metrics, the task cursor after the step) -> whether
# the periodic evaluation is due after it
Seal = Callable[[int, list[Experience], C.Share, dict[str, float], T.Cursor], bool]


def inflight_limit(cfg: Config) -> int:
    """While fewer samples are in flight, the next step is admitted:
    ``explorer.max_inflight_samples``, else one step's (``batch_size x repeat_times``). Samples
    in flight: single-turn requests in the engine, and task runs of episodes not ended yet."""
    return cfg.explorer.max_inflight_samples or cfg.buffer.batch_size * cfg.algorithm.repeat_times


@dataclass
class OpenStep:
    """An admitted step: its groups in flight and finished."""

    step: int
    share: C.Share  # (slot, task) pairs sealed with this step (carried slots included)
    cursor: T.Cursor  # the task stream after this step (saved when it is sealed)
    version: int  # weights loaded when it was admitted
    pending: dict[str, int] = field(default_factory=dict)  # key -> the step its group id names
    prompts: dict[str, PromptJob] = field(default_factory=dict)  # of pending single-turn groups
    done: dict[str, list[Experience]] = field(default_factory=dict)  # key -> its experiences
    resumed: set[str] = field(default_factory=set)  # keys taken from the spool (not generated)
    episodes: list[EpisodeResult] = field(default_factory=list)  # of its workflow-class groups
    stats: dict[str, float] = field(default_factory=dict)


@dataclass
class Totals:
    """What happened since the last sealed step (its metrics)."""

    since: float = field(default_factory=time.monotonic)
    reload_s: float = 0.0
    wait_s: float = 0.0
    discarded: int = 0  # response tokens of groups dropped by explorer.max_version_span
    tools: dict[str, int] = field(default_factory=tools.COUNTS.snapshot)  # tool calls so far
    scoring: dict[str, list[float]] = field(default_factory=dict)  # reward models', teacher's

    def add(self, stats: dict[str, float]) -> None:
        """Metrics of one scoring call (reward models, teacher)."""
        for name, value in stats.items():
            self.scoring.setdefault(name, []).append(value)

    def scoring_metrics(self) -> dict[str, float]:
        """The scoring calls' metrics: seconds and counts summed, the teacher's gap averaged."""
        return {
            name: sum(values) / len(values) if name == TEACHER_KL else sum(values)
            for name, values in self.scoring.items()
        }


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
    episodes = StreamedEpisodes(cfg, engine, writer)
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
            episodes.label_version(version)
        totals.reload_s += reload_s
        totals.wait_s += wait_s

    def admissible() -> bool:
        more = max_steps is None or admitted < max_steps
        room = engine.in_flight - episodes.calls.in_engine + episodes.runs_in_flight < limit
        return eval_at is None and more and room and not plan.finished(stream)

    while True:
        if time.monotonic() - polled >= WEIGHTS_POLL_S:
            load(0)
            polled = time.monotonic()
        while admissible():
            step = cursor.step + 1
            need = 0 if lead is None else required_version(step, lead, interval)
            if (weights.loaded_version or 0) < need:
                if open_steps:
                    break  # steps run meanwhile (the trainer may wait for them); polled again
                load(need)
            carried, share = plan.take(step, stream.next_batch(cursor))
            version = weights.loaded_version or 0
            open_steps.append(
                admit(cfg, engine, episodes, tasksets, spool, step, share, carried, cursor, version)
            )
            admitted += 1
        episodes.serve(engine_busy=engine.in_flight > 0, timeout_s=BATCH_WAIT_S)
        if engine.in_flight:
            finished = []
            for key, samples in engine.step():
                if episodes.calls.owns(key):
                    episodes.calls.resolve(key, samples)
                else:
                    finished.append((key, samples))
            finish(cfg, open_steps, spool, finished, totals, writer, reward_models)
        for group in episodes.poll():
            finish_episodes(cfg, open_steps, spool, group, totals, writer)
        while open_steps and not open_steps[0].pending:
            done = open_steps.popleft()
            due = seal(done.step, *sealed_step(done, totals, engine.in_flight), done.cursor)
            spool.drop(done.step)
            totals = Totals()
            if due and evaluate is not None and eval_at is None:
                eval_at = done.step
        if eval_at is not None and not open_steps:
            episodes.calls.pump()  # ended episodes' calls leave the engine
            evaluate(eval_at)  # drained: the engine generates for the evaluation alone
            eval_at = None
        if not open_steps and not admissible():
            if eval_at is None and (plan.finished(stream) or admitted == max_steps):
                return


def admit(
    cfg: Config,
    engine: Engine,
    episodes: StreamedEpisodes,
    tasksets: list[T.Taskset],
    spool: GroupSpool,
    step: int,
    share: C.Share,
    carried: dict[int, C.Share],
    cursor: T.Cursor,
    version: int,
) -> OpenStep:
    """Step ``step`` opened: its slots' requests in the engine and its episodes started, except
    groups the spool kept from before a restart; the carried slots of earlier steps keep their
    own step in ids."""
    opened = OpenStep(step, [], T.Cursor.from_dict(cursor.to_dict()), version)
    kept = spool.take(step)

    def resumed(key: str, expected_task: str) -> bool:
        exps = kept.get(key)
        if exps and all(e.task_id == expected_task for e in exps):
            opened.done[key] = exps
            opened.resumed.add(key)
            return True
        return False

    filtered = 0
    for group_step, items in [*sorted(carried.items()), (step, share)]:
        opened.share += items
        classes = episode_slots(items, tasksets)
        for slot, task in [item for item in items if item[0] in classes]:
            key, ts = group_key(group_step, slot), tasksets[task.taskset]
            if not resumed(key, task_id(ts, task)):
                opened.pending[key] = group_step
                episodes.start(step, key, group_step, slot, ts, task)
        recipes = [item for item in items if item[0] not in classes]
        jobs, counts = build_prompts(cfg, engine.tokenizer, recipes, tasksets)
        filtered += counts["prompts_filtered"]
        for job in jobs:
            key = group_key(group_step, job.slot)
            if not resumed(key, task_id(job.taskset, job.task)):
                opened.pending[key] = group_step
                opened.prompts[key] = job
                engine.add(f"{step}:{key}", job.ids, job.taskset.sampling)
    opened.stats["prompts_filtered"] = filtered
    opened.stats["groups_resumed"] = len(opened.resumed)
    return opened


def finish(
    cfg: Config,
    open_steps: deque[OpenStep],
    spool: GroupSpool,
    finished: list[tuple[str, list[Sample]]],
    totals: Totals,
    writer: str,
    reward_models: Sequence[RewardModel],
) -> None:
    """The requests one engine step finished: their groups scored together (each reward model
    scores them in one call) and kept (:func:`keep_groups`)."""
    scored = []
    for request, samples in finished:
        step_text, key = request.split(":", 1)
        opened = next(o for o in open_steps if o.step == int(step_text))
        job, group_step = opened.prompts.pop(key), opened.pending.pop(key)
        span = max((s.versions[-1] - s.versions[0] for s in samples if s.versions), default=0)
        if too_wide(cfg, span):
            totals.discarded += sum(len(s.response_ids) for s in samples)
            opened.done[key] = []
        else:
            scored.append((opened, key, job, group_step, samples))
    if not scored:
        return
    rewards, stats = score_all([g[2] for g in scored], [g[4] for g in scored], reward_models)
    totals.add(stats)
    groups = [
        (
            opened,
            key,
            group_records(job, samples, group_rewards, group_step, opened.version, writer),
        )
        for (opened, key, job, group_step, samples), group_rewards in zip(scored, rewards)
    ]
    keep_groups(cfg, spool, groups, totals)


def finish_episodes(
    cfg: Config,
    open_steps: deque[OpenStep],
    spool: GroupSpool,
    group: EpisodeGroup,
    totals: Totals,
    writer: str,
) -> None:
    """A task whose episodes all ended: the experiences of those that ended well, kept
    (:func:`keep_group`); the episodes counted in its step's metrics."""
    opened = next(o for o in open_steps if o.step == group.sealed_with)
    opened.pending.pop(group.key)
    opened.episodes += group.results
    exps = episode_records(
        group.results, group.taskset, group.task, group.step, group.slot, opened.version, writer
    )
    span = max(
        (max(e.response_versions) - min(e.response_versions) for e in exps if e.response_versions),
        default=0,
    )
    if too_wide(cfg, span):
        totals.discarded += model_tokens(group.results)
        opened.done[group.key] = []
        return
    keep_groups(cfg, spool, [(opened, group.key, exps)], totals)


def too_wide(cfg: Config, span: int) -> bool:
    """A group whose samples span more weights versions than ``explorer.max_version_span``."""
    return cfg.explorer.max_version_span is not None and span > cfg.explorer.max_version_span


def keep_groups(
    cfg: Config,
    spool: GroupSpool,
    groups: list[tuple[OpenStep, str, list[Experience]]],
    totals: Totals,
) -> None:
    """Complete groups (open step, key, experiences): teacher log-probs added (on-policy
    distillation, one call), kept in the spool, marked done in their step."""
    totals.add(add_teacher_logprobs(cfg, [e for _, _, exps in groups for e in exps]))
    for opened, key, exps in groups:
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
        generated_tokens(e) for k in keys if k not in opened.resumed for e in opened.done[k]
    )
    episodes = (
        {**episode_metrics(opened.episodes), **tool_stats(totals.tools)}
        if (opened.episodes)
        else {}
    )
    spans = [
        max(e.response_versions) - min(e.response_versions) for e in exps if e.response_versions
    ]
    return (
        exps,
        opened.share,
        {
            **opened.stats,
            **totals.scoring_metrics(),
            **episodes,
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
