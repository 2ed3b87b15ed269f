"""Concurrent multi-turn episodes against one engine vs the same episodes one by one.

Runs the same tasks of an agentic config (default: the calculator quick start on SmolLM2-135M,
several model turns and a subprocess tool call per episode) through the explorer's rollout
twice in one process, on one vLLM engine: ``explorer.runner_per_model=1`` (one episode at a
time: the baseline) and ``--concurrency`` (episodes in flight, their model calls sharing the
engine's batches). Same
seed, same tasks; prints episodes/s, generated tokens/s and model calls per
episode for each, and the speed-up.

    python -m benchmarks.agent_bench --tasks 16 --concurrency 32
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from benchmarks.common import REPO, run_recorded

os.chdir(REPO)

from rft.config.load import load_config  # noqa: E402
from rft.explorer import tasksets  # noqa: E402
from rft.explorer.engine import Engine  # noqa: E402
from rft.explorer.steps import run_tasks  # noqa: E402
from rft.monitor import EPISODE_TURNS, GENERATED_TOKENS  # noqa: E402


def measure(cfg, engine, sets, tasks: int, concurrency: int) -> dict[str, float]:
    cfg.explorer.runner_per_model = concurrency
    items = [(i, tasksets.Task(0, i, 1)) for i in range(tasks)]
    start = time.monotonic()
    exps, stats = run_tasks(cfg, engine, sets, items, 1, 0, "bench")
    seconds = time.monotonic() - start
    return {
        "seconds": seconds,
        "episodes": len(exps),
        "episodes_per_s": len(exps) / seconds,
        "tokens_per_s": stats[GENERATED_TOKENS] / seconds,
        "calls": stats[EPISODE_TURNS],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/agent_calculator_cpu.yaml")
    parser.add_argument("--tasks", type=int, default=16, help="tasks (each repeat_times episodes)")
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    cfg = load_config(args.config)
    sets = tasksets.training_tasksets(cfg)
    engine = Engine(cfg)
    measure(cfg, engine, sets, 2, args.concurrency)  # warm-up: the first generates are slow
    rows = [
        ("one by one (baseline)", measure(cfg, engine, sets, args.tasks, 1)),
        (f"{args.concurrency} in flight", measure(cfg, engine, sets, args.tasks, args.concurrency)),
    ]
    print(
        f"{args.tasks} tasks x {cfg.algorithm.repeat_times} episodes, {args.config}, "
        f"{os.cpu_count()} CPUs"
    )
    print(f"{'mode':<24} {'seconds':>8} {'episodes/s':>11} {'tokens/s':>9} {'calls/ep':>9}")
    for label, m in rows:
        print(
            f"{label:<24} {m['seconds']:>8.1f} {m['episodes_per_s']:>11.2f} "
            f"{m['tokens_per_s']:>9.1f} {m['calls']:>9.2f}"
        )
    print(f"speed-up: {rows[1][1]['episodes_per_s'] / rows[0][1]['episodes_per_s']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(run_recorded("agent_bench", main))
