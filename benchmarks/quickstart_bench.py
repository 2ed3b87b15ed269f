"""The quick start's learning, measured: held-out accuracy before vs after, per seed, and wall time.

Runs ``bin/rft-run --config configs/quickstart_cpu.yaml`` once per seed (the seed sets vLLM's
sampling and the taskset order), each in its own run directory under ``--out``, one after the
other, and prints a table: held-out accuracy of the starting model (weights v0, the baseline,
measured in the same run) and of the trained model (the final weights), the gain in points,
mean train reward of the first and last steps, the wall time of the whole command (engine
starts and evaluations included), and the peak of the run's memory: every process of it (explorer,
trainer ranks, tool subprocesses) summed, as PSS every 5 s (shared pages split
between their processes: what the run holds) and as summed RSS every 0.5 s (shared pages counted in each),
with each role's share at that peak. Targets: gain >= 10 points on each seed, within
``--target-minutes`` (15 for the quick start, issue 19; 20 for the agentic quick start,
``--config configs/agent_calculator_cpu.yaml --target-minutes 20``, issue 30).

    python -m benchmarks.quickstart_bench --seeds 1 2 3 --out /tmp/quickstart-bench
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import REPO, print_table, run_recorded, sample_memory
from rft.config.load import load_config
from rft.monitor import read_metrics
from rft.report import build_report, edge_means
from rft.rundir import explorer_role

TARGET_POINTS = 10.0


def seed_overrides(seed: int, out: Path) -> list[str]:
    return [
        f"checkpoint_root_dir={out}",
        f"name=seed{seed}",
        f"explorer.rollout_model.seed={seed}",
        f"buffer.explorer_input.taskset.task_selector.seed={seed}",
    ]


def run_seed(config: str, seed: int, out: Path, extra: list[str]) -> dict:
    overrides = [*seed_overrides(seed, out), *extra]
    cfg = load_config(config, overrides)
    log = out / f"seed{seed}.log"
    start = time.monotonic()
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "bin" / "rft-run"), "--config", config, *overrides],
            cwd=REPO,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1"),
        )
        with sample_memory(proc.pid) as memory:
            code = proc.wait()
    minutes = (time.monotonic() - start) / 60
    report = build_report(read_metrics(cfg.run_dir, explorer_role(cfg.explorer.name)))
    held = next(iter(report.held_out.values()), {})
    before = held.get(0)
    after = held.get(max(held)) if held else None
    return {
        "seed": seed,
        "code": code,
        "minutes": minutes,
        "before": before,
        "after": after,
        "final_version": max(held) if held else None,
        "reward": edge_means(report.reward),
        "log": log,
        "memory": memory,
    }


def fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/quickstart_cpu.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--out", type=Path, default=Path("/tmp/rft-quickstart-bench"))
    parser.add_argument(
        "--target-minutes", type=float, default=15.0, help="wall-time target per seed"
    )
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for every seed")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in args.seeds:
        print(f"seed {seed}: running (log {args.out / f'seed{seed}.log'})", flush=True)
        rows.append(run_seed(args.config, seed, args.out, args.overrides))
    table = []
    for r in rows:
        gain = (
            None if r["before"] is None or r["after"] is None else 100 * (r["after"] - r["before"])
        )
        ok = (
            r["code"] == 0
            and gain is not None
            and gain >= TARGET_POINTS
            and r["minutes"] <= args.target_minutes
        )
        first, last = r["reward"] or (None, None)
        table.append(
            [
                r["seed"],
                r["code"],
                f"{r['minutes']:.1f}",
                fmt(r["before"]),
                fmt(r["after"]),
                fmt(gain, "+.1f"),
                fmt(first),
                fmt(last),
                f"{r['memory'].summed_gb:.1f} ({r['memory'].summed_rss_gb:.1f})",
                f"{'met' if ok else 'MISSED'} (>= {TARGET_POINTS:.0f} pts, "
                f"<= {args.target_minutes:.0f} min)",
            ]
        )
    header = ["seed", "exit", "wall min", "held-out v0", "final", "gain pts", "reward first"]
    print()
    print_table([*header, "reward last", "peak GB PSS (RSS)", "target"], table, align="rrrrrrrrrl")
    for r in rows:
        at_peak = ", ".join(f"{k} {v:.1f}" for k, v in sorted(r["memory"].at_peak_gb.items(), key=lambda kv: -kv[1]))  # fmt: skip
        own = ", ".join(f"{k} {v:.1f}" for k, v in sorted(r["memory"].by_role_gb.items(), key=lambda kv: -kv[1]))  # fmt: skip
        print(
            f"seed {r['seed']} resident GB at the summed peak: {at_peak}; each role's own peak: {own}"
        )
    print(
        f"\nheld-out: the accuracy part of the reward, greedy, on {args.config}'s eval taskset; "
        "v0 is the starting model, final the trained weights"
    )
    return 0 if all(r["code"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(run_recorded("quickstart_bench", main))
