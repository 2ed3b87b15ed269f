"""A discrete-event simulator of rft's explorer/trainer pipeline: steps/min of synchronous,
one-step-off and asynchronous runs, for shapes this machine cannot run.

Pure and deterministic (the standard library and rft's own sync rules, ``rft.sync.schedule``): the same
arguments give the same numbers.

The model
---------
A **step** is ``batch_size`` tasks x ``repeat_times`` samples. With N explorers, explorer ``r``
generates slots r, r+N, ... of each step's tasks (``rft.explorer.tasksets.rank_share``), as one
vLLM batch, and seals them as one segment. Every cost below is in seconds of *solo* work: the
time it takes when the actor has its resources to itself.

- Explorer, one share: ``gen_overhead_s + gen_s_per_token * sum(lengths) +
  gen_s_per_decode_step * max(lengths)``: a throughput term (every generated token costs
  batch compute) and a tail term (continuous batching ends a batch when its longest sample
  ends, and each decode step has a latency floor however few samples are left).
- Explorer, new weights: ``load_s`` each time it loads a newer published version, between
  steps (rft reloads in place, never mid-batch).
- Trainer, one step: ``train_overhead_s + train_s_per_token * tokens / M`` over the batch's
  prompt + response tokens, M trainer nodes in data parallel; then ``publish_s`` when it
  publishes (every ``sync_interval`` steps and after the last, ``rft.sync.schedule.publishes_weights``).

**Modes** (the rules of ``rft.sync.schedule`` and ``rft.trainer.inputs``):

- ``both`` with ``sync_offset`` k: explorer step s starts once it can load weights version
  >= ``((s-1-k)//sync_interval)*sync_interval`` (``required_version``); trainer step s takes
  the segments of step s of *every* explorer (the cross-explorer barrier). k=0 is synchronous
  (nothing overlaps), k=1 one-step-off (step s+1 generates while step s trains).
- ``async`` (``mode: explore`` + ``mode: train``): explorers never wait for weights (they load
  the newest version between their own steps) unless ``max_lead_steps`` bounds them (the same
  rule with it for ``sync_offset``, ``rft.sync.schedule.explorer_lead``), and run their steps
  independently; the trainer takes the first ``batch_size`` groups sealed, whoever sealed them.
  An explorer's step may hold ``explorer_batch_factor`` trainer steps' worth of tasks (its own
  ``buffer.batch_size``). Staleness is the trainer's newest published version minus the version
  a group was generated with, as the trainer logs it.
- ``async`` with ``partial_rollout`` (``explorer.partial_rollout: true``): a streaming engine.
  Each engine step decodes one token of every sample in flight and costs
  ``gen_s_per_decode_step + gen_s_per_token * in_flight`` (the share formula above, step by
  step); the next step's samples enter while fewer than ``max_inflight_samples`` (default one
  step's) are in flight and the lead bound allows it, paying ``gen_overhead_s``; a step is
  sealed once all its samples have finished, in step order.
  New weights load as soon as published (``load_s``, requests kept: no token discarded); a
  group's version is its admission's, and ``span_share`` counts samples that spanned versions.

**Resources.** ``disjoint`` (a cluster): explorers and trainer on separate nodes, no
contention. ``shared`` (this machine): the explorers and the trainer share the same cores,
modelled as processor sharing: while the trainer and at least one explorer are busy (loads
and publishes count), each busy actor progresses at rate ``share`` of its solo speed; alone,
at full speed. ``share=0.5`` conserves work (two jobs on the cores take as long as one after the
other); above 0.5 the two sides leave cores idle when alone (e.g. a one-thread explorer and a
two-rank trainer on two cores: ``share_from_cores`` gives 2/3).

**Lengths** (``benchmarks/pipeline_workload.py``; per sample, lognormal around a median,
capped, seeded per step and task so every mode and shape sees the same samples): ``gsm8k-like``
and ``long-tail`` (``LENGTHS``), or the per-step totals and per-sample lengths of a measured run
(:class:`ReplayWorkload`).

**Output** (:class:`Result`): steps/min between the first and the last trainer step end (the
first step, start-up included, is not counted), the trainer's idle share (waiting for its batch,
as ``time/read_s / time/step_s``), the explorers' idle share (waiting for weights, as
``wait_time_s / step_time_s``), both over steps 2.., and the mean staleness of trained samples.

Left out: start-up (every actor starts at t=0), evaluation, full checkpoints, polling delays
(explorers look for weights every 1 s and the trainer for segments every 0.5 s: about 0.75 s
per synchronous step), ``trainer.max_staleness_versions`` and ``explorer.max_version_span``
(nothing is dropped), and engine steps are fluid (new weights may land mid-step). Without
``max_lead_steps``, over a long run an asynchronous explorer's lead, and the staleness, grow
when it is faster than the trainer.

**Calibration** (``benchmarks/pipeline_fit.py``) turns a synchronous run's per-step records
(:class:`StepRecord`) into :class:`Costs`.

    python -m benchmarks.pipeline_sim --explorers 4 --trainers 2 --lengths long-tail
"""

from __future__ import annotations

import argparse
import heapq
import math
import statistics
import sys
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Sequence

from benchmarks.common import markdown_table
from benchmarks.pipeline_workload import (  # noqa: F401 (the samples; re-exported)
    LENGTHS,
    LengthModel,
    ReplayWorkload,
    SampledWorkload,
    Share,
    StepRecord,
    Workload,
)
from rft.sync.schedule import explorer_lead, publishes_weights, required_version

# ----------------------------------------------------------------------------- costs, shape, run


@dataclass(frozen=True)
class Costs:
    """Solo costs in seconds (see the module docstring for the formulas)."""

    gen_overhead_s: float = 3.0  # per explorer share: prefill, reward scoring, sealing
    gen_s_per_token: float = 1 / 60_000  # per generated token: an explorer's batch throughput
    gen_s_per_decode_step: float = 0.012  # per decode step of the share's longest sample
    train_overhead_s: float = 4.0  # per trainer step: reading, broadcasting, optimizer step
    train_s_per_token: float = 1 / 40_000  # per prompt + response token, on one trainer node
    publish_s: float = 5.0  # trainer: gather + write (or broadcast) one weights version
    load_s: float = 2.0  # explorer: load a new weights version in place

    def gen_s(self, share: Share) -> float:
        return (
            self.gen_overhead_s
            + self.gen_s_per_token * share.gen_tokens
            + self.gen_s_per_decode_step * share.max_len
        )

    def train_s(self, tokens: float, trainers: int) -> float:
        return self.train_overhead_s + self.train_s_per_token * tokens / trainers


# The reference cluster: a 1.5B model; an explorer is one node of vLLM engines (~60k generated
# tokens/s at full batch, 12 ms per decode step), a trainer node trains ~40k tokens/s (ZeRO-2,
# old log-probs recomputed); publishing 5 s (README: 4-6 s for 1.5B on an H100 node), loading
# 2 s. Assumptions, not measurements: every number is a flag of the CLI.
CLUSTER_COSTS = Costs()


@dataclass(frozen=True)
class Shape:
    """Where the actors run."""

    explorers: int = 1  # explorer tasks (engine_num)
    trainers: int = 1  # trainer nodes (data parallel)
    shared: bool = False  # explorers and trainer on the same cores (processor sharing)
    share: float = 0.5  # shared: the rate of each busy actor while both sides are busy


@dataclass(frozen=True)
class Schedule:
    """What the run does."""

    mode: str = "both"  # "both" (sync_offset applies) or "async"
    sync_offset: int = 0  # mode both: explorer steps ahead of the weights
    sync_interval: int = 1  # the trainer publishes every N steps (and after the last)
    steps: int = 20  # trainer steps (buffer.total_steps)
    batch_size: int = 8  # tasks per step
    repeat_times: int = 4  # samples per task
    explorer_batch_factor: int = 1  # async: the explorers' batch_size over the trainer's
    max_lead_steps: int | None = None  # async: synchronizer.max_lead_steps (None: unbounded)
    partial_rollout: bool = False  # async: explorer.partial_rollout (a streaming engine)
    max_inflight_samples: int | None = None  # streaming, per explorer (None: one step's samples)

    def explore_batch(self) -> int:
        """Tasks per explorer step: an async explorer job has its own ``buffer.batch_size``,
        which may be a multiple of the trainer's (its longest sample is then waited for once
        per larger batch; the trainer reads each segment over several steps)."""
        return self.batch_size * (self.explorer_batch_factor if self.mode == "async" else 1)


def share_from_cores(explorer_cores: float, trainer_cores: float, cores: float) -> float:
    """Processor sharing on ``cores``: each side, busy alone, keeps ``*_cores`` busy; together
    they get a proportional part, so each runs at ``cores / (explorer + trainer)`` of its solo
    speed (1 when they fit side by side)."""
    return min(1.0, cores / max(explorer_cores + trainer_cores, 1e-9))


# ----------------------------------------------------------------------------- the simulation


@dataclass
class Group:
    """One task's samples in the buffer."""

    version: int  # weights version it was generated with (streaming: its first token's)
    train_tokens: float  # its prompt + response tokens
    spanning: float = 0.0  # streaming: share of its samples whose tokens span versions


@dataclass
class Job:
    """Work in progress: ``left`` solo seconds to go."""

    kind: str  # "load", "gen", "train", "publish"
    left: float


@dataclass
class Explorer:
    """One explorer task as the simulation goes."""

    rank: int
    loaded: int = 0  # weights version in the engine
    done: int = 0  # steps sealed
    job: Job | None = None
    step_start: float = 0.0  # when the current step began (the previous seal)
    waiting_since: float | None = None
    waits: list[float] = field(default_factory=list)  # per step: seconds waiting for weights
    durations: list[float] = field(default_factory=list)  # per step: seal - step start
    # streaming (partial_rollout): samples in flight, each done once ``progress`` (tokens every
    # in-flight sample has decoded) reaches its ``finish_at``
    inflight: list[tuple[float, int, int, int]] = field(default_factory=list)  # heap: (finish_at,
    # step, slot, version at admission)
    progress: float = 0.0
    token_s: float = 0.0  # seconds of the decode job's every engine step (one token each)
    next_step: int = 1  # the step admitted next
    left: dict = field(default_factory=dict)  # (step, group) -> samples unfinished; step -> groups
    spans: dict = field(default_factory=dict)  # (step, group) -> samples spanning versions
    versions: dict = field(default_factory=dict)  # (step, group) -> version at admission


@dataclass
class Trainer:
    """The trainer (all its nodes) as the simulation goes."""

    done: int = 0  # steps finished
    published: int = 0  # newest weights version (0: the initial model)
    job: Job | None = None
    ready_since: float = 0.0  # when it began waiting for the current step's batch
    waits: list[float] = field(default_factory=list)  # per step: seconds waiting for the batch
    ends: list[float] = field(default_factory=list)  # per step: end time (after publishing)
    staleness: list[float] = field(default_factory=list)  # per trained group
    spanning: list[float] = field(default_factory=list)  # per trained group


@dataclass(frozen=True)
class Result:
    """What a simulated run measured, as async_bench.py measures a real one."""

    steps_per_min: float  # steady state: trainer step ends, the first step excluded
    trainer_idle: float  # share of trainer time (steps 2..) waiting for its batch
    explorer_idle: float  # share of explorer time (steps 2..) waiting for weights
    staleness_mean: float  # versions between a trained sample's weights and the trainer's
    step_ends_s: tuple[float, ...]  # trainer step end times
    span_share: float = 0.0  # share of trained samples whose tokens span weights versions


def simulate(schedule: Schedule, shape: Shape, costs: Costs, workload: Workload) -> Result:
    """Run the pipeline until the trainer has finished ``schedule.steps`` steps."""
    assert schedule.mode in ("both", "async"), schedule.mode
    n, steps = shape.explorers, schedule.steps
    # the explorer steps that feed ``steps`` trainer steps (its own buffer.total_steps): past
    # them an explorer stops, and on shared cores stops competing with the trainer
    explorer_steps = -(-steps * schedule.batch_size // schedule.explore_batch())
    shares = {
        (s, r): workload.share(s, r, n, schedule.explore_batch(), schedule.repeat_times)
        for s in range(1, steps + 1)
        for r in range(n)
    }
    explorers = [Explorer(r) for r in range(n)]
    trainer = Trainer()
    sealed: dict[int, list[list[Group]]] = {}  # mode both: step -> each explorer's groups
    queue: list[Group] = []  # async: groups in order of sealing
    streaming = schedule.mode == "async" and schedule.partial_rollout
    # rft.explorer.steps.inflight_limit: the next step enters while fewer samples are in
    # flight than this (default: one step's)
    inflight_limit = (
        schedule.max_inflight_samples or schedule.explore_batch() * schedule.repeat_times
    )
    lead, _key = explorer_lead(
        "both" if schedule.mode == "both" else "explore",
        schedule.sync_offset,
        schedule.max_lead_steps,
    )
    now = 0.0

    def weights_allow(step: int) -> bool:
        """Whether an explorer may start ``step`` with the weights published now."""
        need = 0 if lead is None else required_version(step, lead, schedule.sync_interval)
        return trainer.published >= need

    def wait(e: Explorer, waiting: bool) -> None:
        """Count the time ``e`` waits for weights (from the call with True to one with False)."""
        if waiting and e.waiting_since is None:
            e.waiting_since = now
        elif not waiting and e.waiting_since is not None:
            e.waits[-1] += now - e.waiting_since
            e.waiting_since = None

    def start_explorer(e: Explorer) -> None:
        """Begin e's next piece of work, or wait for weights (mode both)."""
        if streaming:
            return start_streaming(e)
        step = e.done + 1
        if e.job is not None or step > explorer_steps:
            return
        wait(e, not weights_allow(step))
        if e.waiting_since is not None:
            return
        if trainer.published > e.loaded:
            e.job = Job("load", costs.load_s)
            e.loaded = trainer.published  # the newest at the start of the load
        else:
            e.job = Job("gen", costs.gen_s(shares[step, e.rank]))

    def start_streaming(e: Explorer) -> None:
        """The streaming engine's next piece of work (``rft.explorer.steps.run_steps``):
        new weights first (requests kept, no token discarded), then whole steps while fewer
        samples than the limit are in flight (each paying the step's overhead), then decoding
        until the next sample finishes."""
        if e.job is not None and e.job.kind != "decode":
            return
        e.job = None  # a decode job is replanned at every event: its progress is already counted
        if trainer.published > e.loaded:
            e.job = Job("load", costs.load_s)
            e.loaded = trainer.published
            return
        while (
            e.next_step <= explorer_steps
            and len(e.inflight) < inflight_limit
            and weights_allow(e.next_step)
        ):
            step, share = e.next_step, shares[e.next_step, e.rank]
            e.left[step] = len(share.group_lengths)
            for group, lengths in enumerate(share.group_lengths):
                e.left[step, group], e.spans[step, group] = len(lengths), 0
                for n in lengths:
                    heapq.heappush(e.inflight, (e.progress + n, step, group, e.loaded))
            e.next_step += 1
            seal_streamed(e)  # an explorer with no slot in the step
            if costs.gen_overhead_s > 0:
                e.job = Job("overhead", costs.gen_overhead_s)
                break
        wait(e, not e.inflight and e.job is None and e.next_step <= explorer_steps)
        if e.job is None and e.inflight:
            # an engine step decodes one token of every sample in flight
            e.token_s = costs.gen_s_per_decode_step + costs.gen_s_per_token * len(e.inflight)
            e.job = Job("decode", (e.inflight[0][0] - e.progress) * e.token_s)

    def finish_streaming(e: Explorer, job: Job) -> None:
        """Samples that reached their length leave the engine; steps whose groups have all
        finished are sealed, in step order."""
        if job.kind != "decode":
            return
        e.progress = e.inflight[0][0]
        while e.inflight and e.inflight[0][0] <= e.progress + 1e-9:
            _, step, group, version = heapq.heappop(e.inflight)
            e.spans[step, group] += e.loaded != version
            e.left[step, group] -= 1
            if not e.left[step, group]:
                e.left[step] -= 1
                e.versions[step, group] = version
        seal_streamed(e)

    def seal_streamed(e: Explorer) -> None:
        """Seal e's oldest admitted steps whose samples have all finished, in order."""
        while e.done + 1 < e.next_step and not e.left[e.done + 1]:
            e.done += 1
            share = shares[e.done, e.rank]
            queue.extend(
                Group(
                    e.versions[e.done, group],
                    share.group_train_tokens[group],
                    e.spans[e.done, group] / len(lengths),
                )
                for group, lengths in enumerate(share.group_lengths)
            )
            e.durations.append(now - e.step_start)
            e.step_start = now
            e.waits.append(0.0)

    def take_batch() -> list[Group] | None:
        step = trainer.done + 1
        if schedule.mode == "both":
            parts = sealed.get(step, [])
            return [g for part in parts for g in part] if len(parts) == n else None
        if len(queue) < schedule.batch_size:
            return None
        batch = queue[: schedule.batch_size]
        del queue[: schedule.batch_size]
        return batch

    def start_trainer() -> None:
        if trainer.job is not None or trainer.done >= steps:
            return
        batch = take_batch()
        if batch is None:
            return
        trainer.waits.append(now - trainer.ready_since)
        trainer.staleness += [trainer.published - g.version for g in batch]
        trainer.spanning += [g.spanning for g in batch]
        trainer.job = Job(
            "train", costs.train_s(sum(g.train_tokens for g in batch), shape.trainers)
        )

    def finish(actor: Explorer | Trainer) -> None:
        """``actor`` completed its job: the next state."""
        job, actor.job = actor.job, None
        assert job is not None
        if isinstance(actor, Explorer) and streaming:
            finish_streaming(actor, job)
        elif isinstance(actor, Explorer):
            if job.kind == "load":
                actor.job = Job("gen", costs.gen_s(shares[actor.done + 1, actor.rank]))
                return
            actor.done += 1
            share = shares[actor.done, actor.rank]
            groups = [Group(actor.loaded, t) for t in share.group_train_tokens]
            sealed.setdefault(actor.done, []).append(groups)
            queue.extend(groups)
            actor.durations.append(now - actor.step_start)
            actor.step_start = now
            actor.waits.append(0.0)
        elif job.kind == "train" and publishes_weights(
            trainer.done + 1, schedule.sync_interval, steps
        ):
            actor.job = Job("publish", costs.publish_s)
        else:
            if job.kind == "publish":
                actor.published = actor.done + 1
            actor.done += 1
            actor.ends.append(now)
            actor.ready_since = now

    for e in explorers:
        e.waits.append(0.0)
    while trainer.done < steps:
        for e in explorers:
            start_explorer(e)
        start_trainer()
        busy: list[Explorer | Trainer] = [a for a in [*explorers, trainer] if a.job is not None]
        if not busy:
            raise RuntimeError(f"deadlock at t={now:.1f}s: nobody can work ({schedule}, {shape})")
        both = trainer.job is not None and len(busy) > 1
        rate = shape.share if shape.shared and both else 1.0
        left = {id(a): a.job.left / rate for a in busy}  # type: ignore[union-attr]
        dt = min(left.values())
        now += dt
        for a in busy:
            if left[id(a)] <= dt * (1 + 1e-12):
                finish(a)
            else:
                a.job.left -= dt * rate  # type: ignore[union-attr]
                if a.job.kind == "decode":  # type: ignore[union-attr]
                    a.progress += dt * rate / a.token_s  # type: ignore[union-attr]
    return summarize(trainer, explorers)


def summarize(trainer: Trainer, explorers: Sequence[Explorer]) -> Result:
    ends = trainer.ends
    span = ends[-1] - ends[0]
    spm = 60.0 * (len(ends) - 1) / span if span > 0 else math.inf
    periods = sum(b - a for a, b in zip(ends, ends[1:]))
    t_idle = sum(trainer.waits[1:]) / periods if periods > 0 else 0.0
    e_wait = sum(sum(e.waits[1 : len(e.durations)]) for e in explorers)
    e_time = sum(sum(e.durations[1:]) for e in explorers)
    return Result(
        spm,
        t_idle,
        e_wait / e_time if e_time > 0 else 0.0,
        statistics.fmean(trainer.staleness) if trainer.staleness else 0.0,
        tuple(ends),
        statistics.fmean(trainer.spanning) if trainer.spanning else 0.0,
    )


# ----------------------------------------------------------------------------- the modes

MODES = {  # name -> what differs from the base Schedule
    "sync": {"mode": "both", "sync_offset": 0},
    "one-step-off": {"mode": "both", "sync_offset": 1},
    "async": {"mode": "async", "explorer_batch_factor": 1},
    "async-lead1": {"mode": "async", "explorer_batch_factor": 1, "max_lead_steps": 1},
    "async-batch2": {"mode": "async", "explorer_batch_factor": 2},  # explorers' batch x2
    "async-partial": {"mode": "async", "partial_rollout": True},  # a streaming engine
}


def predict(base: Schedule, shape: Shape, costs: Costs, workload: Workload) -> dict[str, Result]:
    """Each of :data:`MODES` on the same shape, costs and samples."""
    return {
        name: simulate(replace(base, **changes), shape, costs, workload)
        for name, changes in MODES.items()
    }


def format_table(results: dict[str, Result]) -> str:
    sync = results["sync"].steps_per_min
    header = ["mode", "steps/min", "speed-up vs sync", "trainer idle", "explorer idle"]
    rows = [
        [
            name,
            f"{r.steps_per_min:.3f}",
            f"{r.steps_per_min / sync:.2f}x",
            f"{r.trainer_idle:.0%}",
            f"{r.explorer_idle:.0%}",
            f"{r.staleness_mean:.2f}",
            f"{r.span_share:.0%}",
        ]
        for name, r in results.items()
    ]
    return markdown_table([*header, "staleness", "spanning"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--explorers", type=int, default=4, help="explorer tasks (engine_num)")
    parser.add_argument("--trainers", type=int, default=2, help="trainer nodes")
    parser.add_argument("--lengths", choices=sorted(LENGTHS), nargs="+", default=sorted(LENGTHS))
    parser.add_argument("--batch-size", type=int, default=128, help="tasks per step")
    parser.add_argument("--repeat-times", type=int, default=8, help="samples per task")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--sync-interval", type=int, default=1)
    parser.add_argument("--shared", action="store_true", help="explorers and trainer share cores")
    parser.add_argument(
        "--share", type=float, default=0.5, help="rate of each side while both work"
    )
    parser.add_argument("--seed", type=int, default=0)
    for f in fields(Costs):
        parser.add_argument(
            f"--{f.name.replace('_', '-')}", type=float, default=getattr(CLUSTER_COSTS, f.name)
        )
    args = parser.parse_args(argv)
    costs = Costs(**{f.name: getattr(args, f.name) for f in fields(Costs)})
    shape = Shape(args.explorers, args.trainers, args.shared, args.share)
    base = Schedule(
        steps=args.steps,
        sync_interval=args.sync_interval,
        batch_size=args.batch_size,
        repeat_times=args.repeat_times,
    )
    print(
        f"shape: {shape}\nrun: {base.batch_size} tasks x {base.repeat_times} samples, "
        f"{base.steps} steps\ncosts: {asdict(costs)}"
    )
    for name in args.lengths:
        print(f"\n{name} lengths ({LENGTHS[name]}):")
        print(format_table(predict(base, shape, costs, SampledWorkload(LENGTHS[name], args.seed))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
