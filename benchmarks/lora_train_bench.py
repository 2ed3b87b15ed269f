"""Trainer memory and speed with a LoRA adapter vs full fine-tuning, same run, same batch.

Each side runs in its own process (on CPU the peak resident memory only grows, so sharing a
process would hide the smaller side): the DeepSpeed engine of ``rft.trainer.engine.build_actor``
(ZeRO-2, one rank) and ``rft.trainer.step.train_step`` on the synthetic batch of
``benchmarks/trainer_bench.py`` (GRPO, one update per step), with a KL loss so the reference
model is in play: a second model copy for full fine-tuning, the base with the adapter disabled
for LoRA. Reports trainable parameters, the optimizer's state (bytes held by AdamW's moments and
fp32 master copies, counted from the engine's optimizer), the peak memory (CUDA:
``max_memory_allocated``; CPU: the process's peak resident set), seconds per step, and what a
publish writes (the full state dict vs the adapter).

    DS_ACCELERATOR=cpu OMP_NUM_THREADS=2 .venv/bin/python -m benchmarks.lora_train_bench \\
        --model .cache/models/smollm2-135m-instruct --rank 16

Measured figures: docs/performance.md, "LoRA".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import REPO, module_cmd, print_table, run_recorded

os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))

SIDES = ("full", "lora")


def optimizer_state_bytes(engine) -> int:
    """Bytes of every tensor the engine's optimizer holds (moments, fp32 partitions)."""
    import torch

    seen, total = set(), 0
    opt = engine.optimizer
    inner = getattr(opt, "optimizer", opt)
    tensors = [
        t for state in inner.state.values() for t in state.values() if isinstance(t, torch.Tensor)
    ]
    tensors += list(getattr(opt, "single_partition_of_fp32_groups", []))
    for t in tensors:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def run_side(args: argparse.Namespace) -> dict:
    """One side, in this process: build, warm up, time ``args.steps`` steps."""
    from benchmarks.trainer_bench import (
        bench_config,
        make_batch,
        peak_memory_gib,
        reset_peak,
        sync,
    )
    from rft.trainer import engine as dse
    from rft.trainer.algorithm import build_loss_fns
    from rft.trainer.step import train_step

    args.gradient_checkpointing = True
    cfg = bench_config(args)
    cfg.algorithm.kl_loss_fn = "k2"
    if args.side == "lora":
        from rft.config.schema import LoRAConfig

        cfg.model.lora_configs = [LoRAConfig(lora_rank=args.rank, lora_alpha=args.rank)]
        cfg.algorithm.optimizer.lr = 1e-4
    info = dse.init_distributed()
    reset_peak(info.device)
    actor = dse.build_actor(cfg, info, args.steps + 1)
    ref = dse.build_reference(cfg, info, actor)
    fns = build_loss_fns(cfg.algorithm)
    vocab = (
        actor.module.config.vocab_size
        if args.side == "full"
        else actor.module.base_model.model.config.vocab_size
    )
    batch = make_batch(args.groups, args.repeat, args.prompt_len, args.response_len, vocab)
    train_step(actor, ref, batch, cfg, fns, info, 0, 0)  # warm-up (creates the optimizer state)
    sync(info.device)
    start = time.perf_counter()
    for step in range(args.steps):
        train_step(actor, ref, batch, cfg, fns, info, step + 1, 0)
    sync(info.device)
    step_s = (time.perf_counter() - start) / args.steps
    state = dse.gather_adapter(actor) if actor.lora else dse.gather_weights(actor)
    return {
        "side": args.side,
        "trainable": sum(p.numel() for p in actor.module.parameters() if p.requires_grad),
        "optimizer_mib": optimizer_state_bytes(actor.engine) / 2**20,
        "published_mib": sum(t.numel() * t.element_size() for t in state.values()) / 2**20,
        "peak_gib": peak_memory_gib(info.device),
        "step_s": step_s,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=str(REPO / ".cache" / "models" / "smollm2-135m-instruct"))
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--precision", choices=["bf16", "fp32"], default="fp32")
    p.add_argument("--zero-stage", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--repeat", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--response-len", type=int, default=128)
    p.add_argument("--max-token-len", type=int, default=1024)
    p.add_argument("--side", choices=SIDES, default=None, help=argparse.SUPPRESS)  # a child process
    args = p.parse_args()
    if args.side is not None:
        print("RESULT " + json.dumps(run_side(args)), flush=True)
        return
    rows = []
    for side in SIDES:  # full first, then LoRA: each in a fresh process
        cmd = [*module_cmd("lora_train_bench"), *sys.argv[1:], "--side", side]
        proc = subprocess.run(
            cmd,
            cwd=REPO,
            capture_output=True,
            text=True,
            env=dict(os.environ, DS_ACCELERATOR=os.environ.get("DS_ACCELERATOR", "cpu")),
        )
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            sys.exit(f"lora_train_bench: the {side} side failed:\n{proc.stderr[-3000:]}")
        rows.append(json.loads(lines[-1][len("RESULT ") :]))
    print(
        f"\n{Path(args.model).name}, {args.precision}, ZeRO-{args.zero_stage}, one rank, "
        f"{args.groups}x{args.repeat} samples of {args.prompt_len}+{args.response_len} tokens, "
        f"KL loss on, gradient checkpointing, LoRA rank {args.rank} on all linear layers, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}"
    )
    header = ["side", "trainable params", "optimizer state MiB", "peak memory GiB", "s/step"]
    print_table(
        [*header, "published MiB"],
        [
            [
                r["side"],
                f"{r['trainable']:,}",
                f"{r['optimizer_mib']:.1f}",
                f"{r['peak_gib']:.2f}",
                f"{r['step_s']:.2f}",
                f"{r['published_mib']:.1f}",
            ]
            for r in rows
        ],
    )
    full, lora = rows
    print(
        f"\nfull / lora: peak memory {full['peak_gib'] / lora['peak_gib']:.2f}x, step time "
        f"{full['step_s'] / lora['step_s']:.2f}x, optimizer state "
        f"{full['optimizer_mib'] / max(lora['optimizer_mib'], 1e-9):.0f}x"
    )


if __name__ == "__main__":
    sys.exit(run_recorded("lora_train_bench", main))
