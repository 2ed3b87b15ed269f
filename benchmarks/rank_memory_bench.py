"""A CPU trainer rank's peak memory and step time by layout: ZeRO stage, micro-batch token budget.

Each setting runs in its own fresh process (resident memory never shrinks within one): one
DeepSpeed rank on gloo with all the cores' threads builds the actor from ``--model``, runs
``--steps`` GRPO steps (``rft.trainer.step.train_step``) on the same seeded batch of ``--rows``
rows (groups of 4, lengths uniform in ``--min-len``..``--max-len`` tokens), then writes a
weights folder and a DeepSpeed checkpoint as the end of a run does. A thread samples the
resident memory every 20 ms; the table has the peak of the engine build, of the steps, and of
the save, and the mean seconds of the steps after the first. The baseline is the former
default's trainer: ZeRO-2 and one micro-batch for the whole share.

    python -m benchmarks.rank_memory_bench --model .cache/models/SmolLM2-135M-Instruct
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from benchmarks.common import REPO, print_table, run_recorded

_CHILD = r"""
import json, os, random, shutil, sys, tempfile, threading, time
from pathlib import Path
import psutil
proc, phase, peaks = psutil.Process(), ["start"], {}

def sample():
    while True:
        peaks[phase[0]] = max(peaks.get(phase[0], 0.0), proc.memory_info().rss / 2**30)
        time.sleep(0.02)

threading.Thread(target=sample, daemon=True).start()
from rft.buffer.experience import Experience
from rft.config.load import config_from_dict
from rft.trainer import engine
from rft.trainer.algorithm import build_loss_fns
from rft.trainer.step import train_step

args = json.loads(sys.argv[1])
out = Path(tempfile.mkdtemp(prefix="rank-memory-"))
cfg = config_from_dict({
    "mode": "train", "checkpoint_root_dir": str(out),
    "algorithm": {"algorithm_type": "grpo", "repeat_times": 4, "kl_loss_fn": "none"},
    "model": {"model_path": args["model"], "max_model_len": args["max_len"]},
    "buffer": {"batch_size": args["rows"] // 4, "total_steps": args["steps"]},
    "trainer": {"precision": "fp32", "gradient_checkpointing": False,
                "zero_stage": args["zero_stage"], "max_token_len_per_gpu": args["budget"]},
})
info = engine.init_distributed()
phase[0] = "build"
actor = engine.build_actor(cfg, info, args["steps"] + 1)
fns = build_loss_fns(cfg.algorithm)
rng = random.Random(0)
batch = []
for g in range(args["rows"] // 4):
    prompt = [rng.randrange(10, 30000) for _ in range(args["min_len"] // 2)]
    for _ in range(4):
        n = rng.randrange(args["min_len"], args["max_len"]) - len(prompt)
        batch.append(Experience(task_id=f"t{g}", group_id=f"g{g}", prompt_ids=prompt,
                                response_ids=[rng.randrange(10, 30000) for _ in range(n)],
                                logprobs=[-1.0] * n, reward=float(rng.random() < 0.5)))
phase[0] = "steps"
seconds = []
for step in range(args["steps"]):
    start = time.perf_counter()
    metrics = train_step(actor, None, batch, cfg, fns, info, step + 1, 0)
    seconds.append(time.perf_counter() - start)
phase[0] = "save"
engine.stream_hf_folder(actor, out / "weights")
engine.save_checkpoint(actor, out / "checkpoint", "global_step_1")
time.sleep(0.1)
shutil.rmtree(out, ignore_errors=True)
print(json.dumps({"peaks": peaks, "seconds": seconds, "micro_batches": metrics["micro_batches"],
                  "tokens": metrics["batch_tokens"]}))
"""


def measure(args: argparse.Namespace, zero_stage: int, budget: int) -> dict:
    settings = dict(
        model=args.model,
        rows=args.rows,
        min_len=args.min_len,
        max_len=args.max_len,
        steps=args.steps,
        zero_stage=zero_stage,
        budget=budget,
    )
    cores = str(os.cpu_count() or 1)
    env = dict(os.environ, OMP_NUM_THREADS=cores)  # a group of one (rft.trainer.engine)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(settings)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
    )
    if done.returncode != 0:
        raise SystemExit(
            f"setting ZeRO-{zero_stage}, budget {budget} failed:\n{done.stderr[-3000:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(REPO / ".cache/models/SmolLM2-135M-Instruct"))
    parser.add_argument("--rows", type=int, default=32, help="rows of the step (groups of 4)")
    parser.add_argument("--min-len", type=int, default=60)
    parser.add_argument("--max-len", type=int, default=200)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--budgets", type=int, nargs="+", default=[512, 1024])
    args = parser.parse_args(argv)
    settings = [(2, 10**6)] + [(0, b) for b in args.budgets]  # the baseline first
    table = []
    for zero_stage, budget in settings:
        r = measure(args, zero_stage, budget)
        timed = r["seconds"][1:] or r["seconds"]
        peaks = r["peaks"]
        name = "one micro-batch (baseline)" if budget == 10**6 else f"{budget} tokens"
        table.append(
            [
                f"ZeRO-{zero_stage}",
                name,
                r["micro_batches"],
                f"{peaks.get('build', 0):.2f}",
                f"{peaks.get('steps', 0):.2f}",
                f"{peaks.get('save', 0):.2f}",
                f"{sum(timed) / len(timed):.1f}",
            ]
        )
    header = ["ZeRO", "micro-batches", "count", "after build GB", "steps GB", "save GB", "s/step"]
    print(
        f"{args.rows} rows of {args.min_len}-{args.max_len} tokens, one rank, {os.cpu_count()} threads"
    )
    print_table(header, table)
    return 0


if __name__ == "__main__":
    sys.exit(run_recorded("rank_memory_bench", main))
