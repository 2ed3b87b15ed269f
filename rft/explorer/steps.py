"""The explorer loop: tasks into one engine, experiences out as sealed steps.

Every step's tasks enter the engine as requests (single-turn recipes) or as episodes whose model
calls are requests (workflow classes, :mod:`rft.explorer.episode_groups`); the loop's thread adds
them, steps the engine, scores each group as it completes and spools it
(:mod:`rft.explorer.spool`), and seals step s as segment s once all its groups are in, in step
order (:class:`StepPipeline`). The admission rule (:func:`run_steps`):

- without overlap (a synchronous run, or ``explorer.partial_rollout`` off): one step is in the
  engine at a time, and the newest weights it needs load before it, never during it;
- with overlap (``explorer.partial_rollout`` in an asynchronous run,
  :func:`rft.config.queries.streams`): the next steps enter as earlier requests finish (up to
  ``explorer.max_inflight_samples`` samples, never past the weights a step may be generated
  with), and new weights load between two engine steps with the requests kept (vLLM labels every
  token with the version that produced it).

Evaluation, ``rft-debug`` and bench mode generate through the same path (:func:`run_tasks`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Callable, Sequence

from rft.buffer.experience import Experience
from rft.config.queries import streams
from rft.config.schema import Config
from rft.explorer import cursor as C
from rft.explorer import tasksets as T
from rft.explorer.calls import CALL_WAIT_S
from rft.explorer.engine import Engine, Sample
from rft.explorer.episode_groups import EpisodeGroup, EpisodeGroups
from rft.explorer.groups import (
    build_prompts,
    episode_records,
    episode_slots,
    group_records,
    model_tokens,
    score_all,
    task_id,
)
from rft.explorer.open_steps import OpenStep, Totals, add_stats, sealed_steps
from rft.explorer.reward_model import RewardModel
from rft.explorer.spool import GroupSpool, group_key
from rft.explorer.teacher import TEACHER_KL, add_teacher_logprobs
from rft.lease import NO_FENCE, Fence
from rft.sync.explorer_side import ExplorerSync
from rft.sync.requests import request_weights
from rft.sync.schedule import required_version, syncs_at, takes_weights

log = logging.getLogger(__name__)

WEIGHTS_POLL_S = 1.0  # with overlap: how often new weights are looked for between engine steps
# seal(step, experiences, slots sealed, step metrics, the task cursor after the step) -> whether
# the periodic evaluation is due after it
Seal = Callable[[int, list[Experience], C.Share, dict[str, float], T.Cursor], bool]
SealedStep = tuple[list[Experience], C.Share, dict[str, float]]


def inflight_limit(cfg: Config) -> int:
    """With overlap, while fewer samples are in flight the next step is admitted:
    ``explorer.max_inflight_samples``, else one step's (``batch_size x repeat_times``). Samples
    in flight: single-turn requests in the engine, and task runs of episodes not ended yet."""
    return cfg.explorer.max_inflight_samples or cfg.buffer.batch_size * cfg.algorithm.repeat_times


class StepPipeline:
    """The open steps of one engine: admitted (:func:`admit`, into :attr:`open`), advanced one
    engine step at a time (:meth:`advance`), the complete ones at the head sealed in order
    (:meth:`seal`)."""

    def __init__(
        self,
        cfg: Config,
        engine: Engine,
        writer: str,
        spool: GroupSpool | None = None,
        reward_models: Sequence[RewardModel] = (),
    ):
        self.cfg, self.engine, self.writer = cfg, engine, writer
        self.spool = spool  # None: groups are not kept across a restart (an evaluation)
        self.reward_models = reward_models
        self.episodes = EpisodeGroups(cfg, engine, writer)
        self.open: deque[OpenStep] = deque()
        self.totals = Totals()  # since the last seal

    @property
    def in_flight(self) -> int:
        """Samples in flight: single-turn requests in the engine, and task runs of episodes not
        ended yet (their calls in the engine not counted twice)."""
        calls = self.episodes.calls.in_engine
        return self.engine.in_flight - calls + self.episodes.runs_in_flight

    def label_version(self, version: int) -> None:
        """Tokens generated from now on are of weights ``version``."""
        self.engine.label_version(version)
        self.episodes.label_version(version)

    def advance(self) -> list[OpenStep]:
        """One round: episodes' calls into the engine, one engine step, its finished requests
        scored, ended episode groups kept; the complete steps at the head, taken out in order."""
        self.episodes.serve(engine_busy=self.engine.in_flight > 0, timeout_s=CALL_WAIT_S)
        if self.engine.in_flight:
            start = time.monotonic()
            out = self.engine.step()
            self.totals.engine_s += time.monotonic() - start
            finished = []
            for key, samples in out:
                if self.episodes.calls.owns(key):
                    self.episodes.calls.resolve(key, samples)
                else:
                    finished.append((key, samples))
            finish(self, finished)
        for group in self.episodes.poll():
            finish_episodes(self, group)
        done = []
        while self.open and not self.open[0].pending:
            done.append(self.open.popleft())
        return done

    def seal(self, done: list[OpenStep]) -> list[SealedStep]:
        """The experiences, share and metrics of the complete steps ``done``; a new window."""
        out = sealed_steps(done, self.totals, self.engine.in_flight)
        self.totals = Totals()
        return out

    def drain(self) -> None:
        """Nothing of this pipeline left in the engine (calls of ended episodes aborted)."""
        self.episodes.calls.drain()
        assert self.engine.in_flight == 0, f"{self.engine.in_flight} samples still in the engine"


class Admission:
    """When the next step enters the engine and when weights load (this module's rule)."""

    def __init__(
        self,
        cfg: Config,
        pipeline: StepPipeline,
        tasksets: list[T.Taskset],
        plan: C.RankPlan,
        stream: T.TaskStream,
        weights: ExplorerSync,
        lead: int | None,
        max_steps: int | None,
    ):
        self.cfg, self.pipeline, self.tasksets = cfg, pipeline, tasksets
        self.plan, self.stream, self.weights = plan, stream, weights
        self.lead, self.max_steps = lead, max_steps
        self.overlap = streams(cfg)
        self.limit = inflight_limit(cfg)
        self.admitted = 0
        self.eval_at: int | None = None  # a step whose evaluation waits for the engine to drain
        self.sync_due = False  # explorer_driven: a sync step asked for weights, not yet loaded
        self.polled = -WEIGHTS_POLL_S  # with overlap the newest weights load before a first step

    def load(self, need: int) -> None:
        """Load the newest weights (waiting for ``need``) between two engine steps."""
        with self.pipeline.engine.paused():
            version, reload_s, wait_s = self.weights.wait_for(need)
            self.pipeline.label_version(version)
        self.pipeline.totals.reload_s += reload_s
        self.pipeline.totals.wait_s += wait_s

    def _takes_weights(self, step: int) -> bool:
        sync = self.cfg.synchronizer
        return takes_weights(step, sync.sync_style, sync.sync_interval, sync.sync_method)

    def poll_weights(self) -> None:
        """With overlap: the newest weights, loaded when due (at most every WEIGHTS_POLL_S)."""
        if not self.overlap:
            return
        due = self.sync_due or self._takes_weights(self.plan.cursor.step + 1)
        recent = time.monotonic() - self.polled < WEIGHTS_POLL_S
        if due and not recent and self.pipeline.engine.may_reload():
            self.load(0)
            self.polled = time.monotonic()
            self.sync_due = False

    def admissible(self) -> bool:
        """Whether the next step may enter now (none during a pending evaluation)."""
        pipeline = self.pipeline
        room = pipeline.in_flight < self.limit if self.overlap else not pipeline.open
        return self.eval_at is None and not self.exhausted() and room

    def exhausted(self) -> bool:
        """The task stream ended, or ``max_steps`` steps were admitted."""
        return self.plan.finished(self.stream) or self.admitted == self.max_steps

    def admit_next(self) -> bool:
        """Admit the next step, its weights loaded first as the rule says; False when it must
        wait for weights (or difficulty_based's pass rates) while other steps run."""
        cfg, step = self.cfg, self.plan.cursor.step + 1
        if self.pipeline.open and not self.stream.ready(step):
            return False  # difficulty_based: the pass rates it follows come as steps seal
        sync = cfg.synchronizer
        if syncs_at(step, sync.sync_style, sync.sync_interval):  # explorer_driven: ask
            request_weights(cfg.run_dir, self.pipeline.writer, step)
            self.sync_due = True
        need = 0 if self.lead is None else required_version(step, self.lead, sync.sync_interval)
        if not self.overlap and (need or self._takes_weights(step)):
            self.load(need)  # the engine is empty
            self.sync_due = False
        elif (self.weights.loaded_version or 0) < need:
            if self.pipeline.open:
                return False  # steps run meanwhile (the trainer may wait for them)
            self.load(need)
        carried, share = self.plan.take(step, self.stream.next_batch(self.plan.cursor))
        version = self.weights.loaded_version or 0
        opened = admit(
            self.pipeline, self.tasksets, step, share, carried, self.plan.cursor, version
        )
        self.pipeline.open.append(opened)
        self.admitted += 1
        return True


def run_steps(
    cfg: Config,
    engine: Engine,
    tasksets: list[T.Taskset],
    plan: C.RankPlan,
    stream: T.TaskStream,
    weights: ExplorerSync,
    seal: Seal,
    *,
    writer: str,
    lead: int | None,
    max_steps: int | None = None,
    reward_models: Sequence[RewardModel] = (),
    evaluate: Callable[[int], None] | None = None,
    fence: Fence = NO_FENCE,
) -> None:
    """Generate and seal steps until the task stream ends (or ``max_steps`` more are sealed),
    by the admission rule of this module's docstring (:class:`Admission`).

    ``lead``: how many steps the explorer may run ahead of the weights (None: unbounded).
    ``evaluate(step)`` runs after the steps ``seal`` says, once the engine is drained (an
    evaluation generates with the engine alone); meanwhile no step is admitted."""
    spool = GroupSpool(cfg.run_dir, writer, fence)
    spool.drop(plan.cursor.step)  # groups of steps sealed before a restart
    pipeline = StepPipeline(cfg, engine, writer, spool, reward_models)
    pipeline.label_version(weights.loaded_version or 0)
    gate = Admission(cfg, pipeline, tasksets, plan, stream, weights, lead, max_steps)
    while True:
        gate.poll_weights()
        while gate.admissible() and gate.admit_next():
            pass
        done = pipeline.advance()
        for opened, (exps, share, metrics) in zip(done, pipeline.seal(done) if done else []):
            due = seal(opened.step, exps, share, metrics, opened.cursor)
            spool.drop(opened.step)
            if due and evaluate is not None and gate.eval_at is None:
                gate.eval_at = opened.step
        if gate.eval_at is not None and not pipeline.open:
            pipeline.drain()
            evaluate(gate.eval_at)  # drained: the engine generates for the evaluation alone
            pipeline.totals = Totals()  # the evaluation is no step's time
            gate.eval_at = None
        if not pipeline.open and gate.exhausted():
            return


def run_tasks(
    cfg: Config,
    engine: Engine,
    tasksets: list[T.Taskset],
    items: list[tuple[int, T.Task]],
    step: int,
    version: int,
    writer: str,
    reward_models: Sequence[RewardModel] = (),
) -> tuple[list[Experience], dict[str, float]]:
    """``items`` (slot, task) generated and scored by the loop's path as one step of their own,
    on an engine with nothing else in flight (an evaluation, ``rft-debug``, bench mode):
    the experiences (groups adjacent, in slot order) and the step's metrics. ``writer`` names
    the groups (``eval``: the workflows' ``is_eval``)."""
    pipeline = StepPipeline(cfg, engine, writer, None, reward_models)
    pipeline.episodes.label_version(version)  # the engine's labels are its loop's
    pipeline.open.append(admit(pipeline, tasksets, step, items, {}, T.Cursor(step), version))
    done: list[OpenStep] = []
    while not done:
        done = pipeline.advance()
    pipeline.drain()
    [(exps, _, metrics)] = pipeline.seal(done)
    return exps, metrics


def admit(
    pipeline: StepPipeline,
    tasksets: list[T.Taskset],
    step: int,
    share: C.Share,
    carried: dict[int, C.Share],
    cursor: T.Cursor,
    version: int,
) -> OpenStep:
    """Step ``step`` opened: its slots' requests in the engine and its episodes started, except
    groups the spool kept from before a restart; the carried slots of earlier steps keep their
    own step in ids."""
    cfg, engine, episodes = pipeline.cfg, pipeline.engine, pipeline.episodes
    opened = OpenStep(step, [], T.Cursor.from_dict(cursor.to_dict()), version)
    kept = pipeline.spool.take(step) if pipeline.spool is not None else {}

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


def finish(pipeline: StepPipeline, finished: list[tuple[str, list[Sample]]]) -> None:
    """The requests one engine step finished: their groups scored together (each reward model
    scores them in one call; its seconds shared out to their steps by samples) and kept
    (:func:`keep_groups`)."""
    scored = []
    for request, samples in finished:
        step_text, key = request.split(":", 1)
        opened = next(o for o in pipeline.open if o.step == int(step_text))
        job, group_step = opened.prompts.pop(key), opened.pending.pop(key)
        if too_wide(pipeline.cfg, [s.versions for s in samples]):
            pipeline.totals.discarded += sum(len(s.response_ids) for s in samples)
            opened.done[key] = []
        else:
            scored.append((opened, key, job, group_step, samples))
    if not scored:
        return
    jobs, samples_of = [g[2] for g in scored], [g[4] for g in scored]
    rewards, stats = score_all(jobs, samples_of, pipeline.reward_models)
    groups = []
    total = sum(len(g[4]) for g in scored)
    for (opened, key, job, group_step, samples), group_rewards in zip(scored, rewards):
        add_stats(opened, stats, len(samples) / total)
        exps = group_records(
            job, samples, group_rewards, group_step, opened.version, pipeline.writer
        )
        groups.append((opened, key, exps))
    keep_groups(pipeline, groups)


def finish_episodes(pipeline: StepPipeline, group: EpisodeGroup) -> None:
    """A task whose episodes all ended: the experiences of those that ended well, kept
    (:func:`keep_groups`); the episodes counted in its step's metrics."""
    opened = next(o for o in pipeline.open if o.step == group.sealed_with)
    opened.pending.pop(group.key)
    opened.episodes += group.results
    exps = episode_records(
        group.results,
        group.taskset,
        group.task,
        group.step,
        group.slot,
        opened.version,
        pipeline.writer,
    )
    # a record spanning no versions has its tokens' one version as model_version
    if too_wide(pipeline.cfg, [e.response_versions or [e.model_version] for e in exps]):
        pipeline.totals.discarded += model_tokens(group.results)
        opened.done[group.key] = []
        return
    keep_groups(pipeline, [(opened, group.key, exps)])


def too_wide(cfg: Config, versions: Sequence[Sequence[int]]) -> bool:
    """A group whose samples (their per-token ``versions``; empty: unlabelled) span more weights
    versions, from the earliest token of any to the latest, than ``explorer.max_version_span``."""
    labelled = [v for v in versions if v]
    if cfg.explorer.max_version_span is None or not labelled:
        return False
    span = max(v[-1] for v in labelled) - min(v[0] for v in labelled)
    return span > cfg.explorer.max_version_span


def keep_groups(
    pipeline: StepPipeline, groups: list[tuple[OpenStep, str, list[Experience]]]
) -> None:
    """Complete groups (open step, key, experiences): teacher log-probs added (on-policy
    distillation, one call: the teacher's one call site; its seconds shared out to their
    steps), kept in the spool, marked done in their step."""
    exps = [e for _, _, group in groups for e in group]
    stats = add_teacher_logprobs(pipeline.cfg, exps)
    stats.pop(TEACHER_KL, None)  # per step, from its experiences (sealed_steps)
    for opened, key, group in groups:
        add_stats(opened, stats, len(group) / max(len(exps), 1))
        if pipeline.spool is not None:
            pipeline.spool.put(opened.step, key, group)
        opened.done[key] = group
