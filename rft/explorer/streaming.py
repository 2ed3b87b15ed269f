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
from typing import Callable, Sequence

from rft.buffer.experience import Experience
from rft.config.schema import Config
from rft.explorer import cursor as C
from rft.explorer import tasksets as T
from rft.explorer.engine import Engine, Sample
from rft.explorer.episodes import BATCH_WAIT_S
from rft.explorer.reward_model import RewardModel
from rft.explorer.rollout import (
    build_prompts,
    episode_records,
    episode_slots,
    group_records,
    model_tokens,
    score_all,
    task_id,
)
from rft.explorer.spool import GroupSpool, group_key
from rft.explorer.stream_episodes import EpisodeGroup, StreamedEpisodes
from rft.explorer.stream_steps import OpenStep, Totals, add_stats, sealed_steps
from rft.explorer.teacher import TEACHER_KL, add_teacher_logprobs
from rft.lease import NO_FENCE, Fence
from rft.sync.explorer_side import ExplorerSync
from rft.sync.requests import request_weights
from rft.sync.schedule import required_version, syncs_at, takes_weights

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


def stream_steps(
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
    """Generate and seal steps until the task stream ends (or ``max_steps`` more are sealed).

    ``lead``: how many steps the explorer may run ahead of the weights (None: unbounded).
    ``evaluate(step)`` runs after the steps ``seal`` says, once the engine is drained (an
    evaluation generates with the engine alone); meanwhile no step is admitted."""
    cursor = plan.cursor
    spool = GroupSpool(cfg.run_dir, writer, fence)
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

    sync = cfg.synchronizer
    # explorer_driven: a sync step asked for weights; it stays due until they are loaded
    sync_due = False
    while True:
        due = sync_due or takes_weights(
            cursor.step + 1, sync.sync_style, interval, sync.sync_method
        )
        if due and time.monotonic() - polled >= WEIGHTS_POLL_S and engine.may_reload():
            load(0)
            polled = time.monotonic()
            sync_due = False
        while admissible():
            step = cursor.step + 1
            if syncs_at(step, sync.sync_style, interval):
                request_weights(cfg.run_dir, writer, step)
                sync_due = True
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
        done = []
        while open_steps and not open_steps[0].pending:
            done.append(open_steps.popleft())
        for opened, (exps, share, metrics) in zip(
            done, sealed_steps(done, totals, engine.in_flight)
        ):
            due = seal(opened.step, exps, share, metrics, opened.cursor)
            spool.drop(opened.step)
            if due and evaluate is not None and eval_at is None:
                eval_at = opened.step
        if done:
            totals = Totals()
        if eval_at is not None and not open_steps:
            episodes.calls.drain()  # calls of ended episodes leave the engine
            assert engine.in_flight == 0, f"{engine.in_flight} samples still in the engine"
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
    scores them in one call; its seconds shared out to their steps by samples) and kept
    (:func:`keep_groups`)."""
    scored = []
    for request, samples in finished:
        step_text, key = request.split(":", 1)
        opened = next(o for o in open_steps if o.step == int(step_text))
        job, group_step = opened.prompts.pop(key), opened.pending.pop(key)
        if too_wide(cfg, [s.versions for s in samples]):
            totals.discarded += sum(len(s.response_ids) for s in samples)
            opened.done[key] = []
        else:
            scored.append((opened, key, job, group_step, samples))
    if not scored:
        return
    rewards, stats = score_all([g[2] for g in scored], [g[4] for g in scored], reward_models)
    groups = []
    total = sum(len(g[4]) for g in scored)
    for (opened, key, job, group_step, samples), group_rewards in zip(scored, rewards):
        add_stats(opened, stats, len(samples) / total)
        exps = group_records(job, samples, group_rewards, group_step, opened.version, writer)
        groups.append((opened, key, exps))
    keep_groups(cfg, spool, groups)


def finish_episodes(
    cfg: Config,
    open_steps: deque[OpenStep],
    spool: GroupSpool,
    group: EpisodeGroup,
    totals: Totals,
    writer: str,
) -> None:
    """A task whose episodes all ended: the experiences of those that ended well, kept
    (:func:`keep_groups`); the episodes counted in its step's metrics."""
    opened = next(o for o in open_steps if o.step == group.sealed_with)
    opened.pending.pop(group.key)
    opened.episodes += group.results
    exps = episode_records(
        group.results, group.taskset, group.task, group.step, group.slot, opened.version, writer
    )
    # a record spanning no versions has its tokens' one version as model_version
    if too_wide(cfg, [e.response_versions or [e.model_version] for e in exps]):
        totals.discarded += model_tokens(group.results)
        opened.done[group.key] = []
        return
    keep_groups(cfg, spool, [(opened, group.key, exps)])


def too_wide(cfg: Config, versions: Sequence[Sequence[int]]) -> bool:
    """A group whose samples (their per-token ``versions``; empty: unlabelled) span more weights
    versions, from the earliest token of any to the latest, than ``explorer.max_version_span``."""
    labelled = [v for v in versions if v]
    if cfg.explorer.max_version_span is None or not labelled:
        return False
    span = max(v[-1] for v in labelled) - min(v[0] for v in labelled)
    return span > cfg.explorer.max_version_span


def keep_groups(
    cfg: Config, spool: GroupSpool, groups: list[tuple[OpenStep, str, list[Experience]]]
) -> None:
    """Complete groups (open step, key, experiences): teacher log-probs added (on-policy
    distillation, one call; its seconds shared out to their steps), kept in the spool, marked
    done in their step."""
    exps = [e for _, _, group in groups for e in group]
    stats = add_teacher_logprobs(cfg, exps)
    stats.pop(TEACHER_KL, None)  # per step, from its experiences (sealed_steps)
    for opened, key, group in groups:
        add_stats(opened, stats, len(group) / max(len(exps), 1))
        spool.put(opened.step, key, group)
        opened.done[key] = group
