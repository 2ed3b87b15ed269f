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

**Resources.** ``disjoint`` (a cluster): explorers and trainer on separate nodes, no
contention. ``shared`` (this machine): the explorers and the trainer share the same cores,
modelled as processor sharing: while the trainer and at least one explorer are busy (loads
and publishes count), each busy actor progresses at rate ``share`` of its solo speed; alone,
at full speed. ``share=0.5`` conserves work (two jobs on the cores take as long as one after the
other); above 0.5 the two sides leave cores idle when alone (e.g. a one-thread explorer and a
two-rank trainer on two cores: ``share_from_cores`` gives 2/3).

**Lengths** (per sample, lognormal around a median, capped, seeded per step and task so every
mode and shape sees the same samples): ``gsm8k-like`` and ``long-tail`` (``LENGTHS``), or the
per-step totals of a measured run (:class:`ReplayWorkload`).

**Output** (:class:`Result`): steps/min between the first and the last trainer step end (the
first step, start-up included, is not counted), the trainer's idle share (waiting for its batch,
as ``time/read_s / time/step_s``), the explorers' idle share (waiting for weights, as
``wait_time_s / step_time_s``), both over steps 2.., and the mean staleness of trained samples.

Left out: start-up (every actor starts at t=0), evaluation, full checkpoints, polling delays
(explorers look for weights every 1 s and the trainer for segments every 0.5 s: about 0.75 s
per synchronous step) and ``trainer.max_staleness_versions`` (nothing is dropped). Without
``max_lead_steps``, over a long run an asynchronous explorer's lead, and the staleness, grow
when it is faster than the trainer.

**Calibration** (``benchmarks/pipeline_fit.py``) turns a synchronous run's per-step records
(:class:`StepRecord`) into :class:`Costs`.

    python benchmarks/pipeline_sim.py --explorers 4 --trainers 2 --lengths long-tail
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Protocol, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rft.sync.schedule import explorer_lead, publishes_weights, required_version

# ----------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class LengthModel:
    """Response lengths: lognormal with median ``median_tokens`` and log-std ``sigma``, cut at
    ``max_tokens`` (the generation limit), at least 1; every sample has ``prompt_tokens``."""

    name: str
    median_tokens: float
    sigma: float
    max_tokens: int
    prompt_tokens: int

    def sample(self, rng: random.Random, n: int) -> list[int]:
        mu = math.log(self.median_tokens)
        return [
            max(1, min(self.max_tokens, round(rng.lognormvariate(mu, self.sigma))))
            for _ in range(n)
        ]


LENGTHS = {
    # GSM8K chain-of-thought replies of a 1.5B instruct model: median 180 tokens, 95% within
    # 2.1x of it (sigma 0.45), limit 1024 as configs/grpo_gsm8k.yaml; ~150-token prompts.
    "gsm8k-like": LengthModel(
        "gsm8k-like", median_tokens=180, sigma=0.45, max_tokens=1024, prompt_tokens=150
    ),
    # Reasoning-style replies: most a few hundred tokens (median 400), a heavy tail (sigma 1.2:
    # 1 in 20 above 2,900 tokens) up to an 8,192-token limit that a few samples per step reach.
    "long-tail": LengthModel(
        "long-tail", median_tokens=400, sigma=1.2, max_tokens=8192, prompt_tokens=200
    ),
}


@dataclass(frozen=True)
class Share:
    """One explorer's share of one step: what generating and training it cost."""

    gen_tokens: int  # sum of the response lengths
    max_len: int  # the longest response (the batch's tail)
    group_train_tokens: tuple[float, ...]  # prompt + response tokens of each group (task)


class Workload(Protocol):
    def share(
        self, step: int, rank: int, explorers: int, batch_size: int, repeat_times: int
    ) -> Share: ...


@dataclass(frozen=True)
class SampledWorkload:
    """Lengths drawn from a :class:`LengthModel`, seeded by (seed, step, task slot): a step's
    samples are the same whatever the number of explorers or the mode."""

    lengths: LengthModel
    seed: int = 0

    def share(
        self, step: int, rank: int, explorers: int, batch_size: int, repeat_times: int
    ) -> Share:
        groups = [
            self.lengths.sample(random.Random(f"{self.seed}/{step}/{slot}"), repeat_times)
            for slot in range(rank, batch_size, explorers)
        ]
        flat = [n for g in groups for n in g] or [0]
        return Share(
            sum(flat),
            max(flat),
            tuple(float(sum(g) + self.lengths.prompt_tokens * len(g)) for g in groups),
        )


@dataclass(frozen=True)
class StepRecord:
    """One step of a measured synchronous run (one explorer), in the simulator's terms."""

    step: int
    gen_tokens: int  # responses' tokens the explorer generated
    max_len: int  # its longest response
    explore_s: float  # explorer busy time: generating, scoring, sealing (not waiting, not loading)
    load_s: float  # explorer reload time of new weights (0: none this step)
    train_tokens: int  # prompt + response tokens the trainer trained on
    train_s: float  # trainer compute time (step time less reading and publishing)
    publish_s: float  # trainer time publishing weights (0: none this step)


@dataclass(frozen=True)
class ReplayWorkload:
    """The per-step totals of a measured run, replayed (split evenly over explorers and groups);
    steps past the end wrap around."""

    records: tuple[StepRecord, ...]
    batch_size: int  # tasks per step of the recorded run

    def share(
        self, step: int, rank: int, explorers: int, batch_size: int, repeat_times: int
    ) -> Share:
        rec = self.records[(step - 1) % len(self.records)]
        groups = len(range(rank, batch_size, explorers))
        per_group = rec.train_tokens / self.batch_size
        return Share(
            round(rec.gen_tokens * groups / self.batch_size), rec.max_len, (per_group,) * groups
        )


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

    version: int  # weights version it was generated with
    train_tokens: float  # its prompt + response tokens


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


@dataclass(frozen=True)
class Result:
    """What a simulated run measured, as async_bench.py measures a real one."""

    steps_per_min: float  # steady state: trainer step ends, the first step excluded
    trainer_idle: float  # share of trainer time (steps 2..) waiting for its batch
    explorer_idle: float  # share of explorer time (steps 2..) waiting for weights
    staleness_mean: float  # versions between a trained sample's weights and the trainer's
    step_ends_s: tuple[float, ...]  # trainer step end times


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
    now = 0.0

    def start_explorer(e: Explorer) -> None:
        """Begin e's next piece of work, or wait for weights (mode both)."""
        step = e.done + 1
        if e.job is not None or step > explorer_steps:
            return
        lead, _key = explorer_lead(
            "both" if schedule.mode == "both" else "explore",
            schedule.sync_offset,
            schedule.max_lead_steps,
        )
        need = 0 if lead is None else required_version(step, lead, schedule.sync_interval)
        if trainer.published < need:
            if e.waiting_since is None:
                e.waiting_since = now
            return
        if e.waiting_since is not None:
            e.waits[-1] += now - e.waiting_since
            e.waiting_since = None
        if trainer.published > e.loaded:
            e.job = Job("load", costs.load_s)
            e.loaded = trainer.published  # the newest at the start of the load
        else:
            e.job = Job("gen", costs.gen_s(shares[step, e.rank]))

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
        trainer.job = Job(
            "train", costs.train_s(sum(g.train_tokens for g in batch), shape.trainers)
        )

    def finish(actor: Explorer | Trainer) -> None:
        """``actor`` completed its job: the next state."""
        job, actor.job = actor.job, None
        assert job is not None
        if isinstance(actor, Explorer):
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
    )


# ----------------------------------------------------------------------------- the modes

MODES = {  # name -> what differs from the base Schedule
    "sync": {"mode": "both", "sync_offset": 0},
    "one-step-off": {"mode": "both", "sync_offset": 1},
    "async": {"mode": "async", "explorer_batch_factor": 1},
    "async-lead1": {"mode": "async", "explorer_batch_factor": 1, "max_lead_steps": 1},
    "async-batch2": {"mode": "async", "explorer_batch_factor": 2},  # explorers' batch x2
}


def predict(base: Schedule, shape: Shape, costs: Costs, workload: Workload) -> dict[str, Result]:
    """Each of :data:`MODES` on the same shape, costs and samples."""
    return {
        name: simulate(replace(base, **changes), shape, costs, workload)
        for name, changes in MODES.items()
    }


def format_table(results: dict[str, Result]) -> str:
    sync = results["sync"].steps_per_min
    lines = [
        "| mode | steps/min | speed-up vs sync | trainer idle | explorer idle | staleness |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r.steps_per_min:.3f} | {r.steps_per_min / sync:.2f}x | "
            f"{r.trainer_idle:.0%} | {r.explorer_idle:.0%} | {r.staleness_mean:.2f} |"
        )
    return "\n".join(lines)


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
