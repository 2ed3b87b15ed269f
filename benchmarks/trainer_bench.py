"""Trainer throughput: rft's DeepSpeed step vs a plain single-process torch loop, same run.

Both sides train the same model on the same batch of synthetic experiences (GRPO advantages,
PPO loss, old log-probs recomputed by one no-grad forward pass, AdamW): rft through
``rft.trainer.step.train_step`` on a DeepSpeed ZeRO engine (one process, gloo), the baseline
as a hand-written loop over the same micro-batches and the same forward function (so the
difference is DeepSpeed's engine, ZeRO bookkeeping and rft's batching). Prints a table of tokens/s and the ratio.

    DS_ACCELERATOR=cpu OMP_NUM_THREADS=2 .venv/bin/python benchmarks/trainer_bench.py \\
        --model .cache/models/smollm2-135m-instruct --precision bf16
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))

import torch  # noqa: E402

from rft.buffer.experience import Experience  # noqa: E402


def make_batch(groups: int, repeat: int, prompt_len: int, response_len: int, vocab: int) -> list[Experience]:
    rng = random.Random(0)
    out = []
    for g in range(groups):
        prompt = [rng.randrange(10, vocab) for _ in range(prompt_len)]
        for k in range(repeat):
            resp = [rng.randrange(10, vocab) for _ in range(response_len - rng.randrange(0, response_len // 4))]
            out.append(Experience(task_id=f"t{g}", group_id=f"g{g}", prompt_ids=prompt, response_ids=resp,
                                  logprobs=[-1.0] * len(resp), reward=float(rng.random() < 0.5)))
    return out


def bench_config(args: argparse.Namespace):
    from rft.config.load import config_from_dict

    return config_from_dict({
        "mode": "train", "checkpoint_root_dir": "/tmp/rft-bench",
        "algorithm": {"algorithm_type": "grpo", "repeat_times": args.repeat, "kl_loss_fn": "none",
                      "optimizer": {"lr": 1e-6}},
        "model": {"model_path": str(args.model)},
        "buffer": {"batch_size": args.groups, "total_steps": args.steps},
        "trainer": {"zero_stage": args.zero_stage, "precision": args.precision,
                    "gradient_checkpointing": args.gradient_checkpointing,
                    "use_dynamic_bsz": True, "max_token_len_per_gpu": args.max_token_len},
    })


def time_rft(cfg, batch, steps: int) -> tuple[float, int]:
    from rft.algo.registry import build_loss_fns
    from rft.trainer import engine as dse
    from rft.trainer.step import train_step

    info = dse.init_distributed()
    actor = dse.build_actor(cfg, info, steps + 1)
    fns = build_loss_fns(cfg.algorithm)
    train_step(actor, None, batch, cfg, fns, info, 0, 0)  # warm-up
    t0 = time.perf_counter()
    for step in range(steps):
        metrics = train_step(actor, None, batch, cfg, fns, info, step + 1, 0)
    return time.perf_counter() - t0, int(metrics["batch_tokens"])


def time_plain(cfg, batch, steps: int) -> float:
    """The baseline: same micro-batches, recompute pass, PPO loss, AdamW, no DeepSpeed."""
    from transformers import AutoModelForCausalLM

    from rft.algo.advantages import grpo_advantages
    from rft.algo.losses import ppo_loss
    from rft.trainer import engine as dse
    from rft.trainer.batching import (
        batch_totals,
        collate,
        micro_loss_scale,
        plan_micro_batches,
        rows_from_experiences,
    )

    dtype = torch.bfloat16 if cfg.trainer.precision == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(cfg.model.model_path, dtype=dtype)
    if cfg.trainer.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01)
    rows = rows_from_experiences(batch)
    lengths = [len(x) for x in rows.input_ids]
    micros = plan_micro_batches(range(len(rows)), lengths, use_dynamic_bsz=True,
                                max_token_len=cfg.trainer.max_token_len_per_gpu, micro_batch_size=1)
    adv, _ = grpo_advantages(rows.rewards, rows.group_ids, rows.response_mask)
    totals = batch_totals(rows.response_mask)

    def logprobs(micro, entropy: bool = False):
        # the same forward as rft's (LM head on the response window, entropy as a metric)
        return dse.forward_logprobs(model, micro, with_entropy=entropy, entropy_grad=False)[0]

    def one_step() -> None:
        old = torch.zeros_like(rows.response_mask)
        with torch.no_grad():
            for m in micros:
                micro = collate(rows, m, adv, old)
                old[m, :micro.response_mask.shape[1]] = logprobs(micro)
        for m in micros:
            micro = collate(rows, m, adv, old)
            loss, _ = ppo_loss(logprobs(micro, entropy=True), micro.old_logprobs, micro.advantages, micro.response_mask)
            (loss * micro_loss_scale(micro.response_mask, totals, "token-mean", 1)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    one_step()  # warm-up
    t0 = time.perf_counter()
    for _ in range(steps):
        one_step()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=str(REPO / ".cache" / "models" / "smollm2-135m-instruct"))
    p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--zero-stage", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--repeat", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--response-len", type=int, default=128)
    p.add_argument("--max-token-len", type=int, default=1024)
    p.add_argument("--gradient-checkpointing", action="store_true")
    args = p.parse_args()
    cfg = bench_config(args)
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(args.model).vocab_size
    batch = make_batch(args.groups, args.repeat, args.prompt_len, args.response_len, vocab)
    torch.manual_seed(0)
    plain_s = time_plain(cfg, batch, args.steps)
    rft_s, tokens = time_rft(cfg, batch, args.steps)
    rows = [("plain torch loop (1 process)", plain_s), (f"rft trainer (DeepSpeed ZeRO-{args.zero_stage}, 1 rank)", rft_s)]
    print(f"\nmodel={Path(args.model).name} precision={args.precision} batch={len(batch)} seqs, "
          f"{tokens} tokens/step, steps={args.steps}, threads={torch.get_num_threads()}, "
          f"grad_ckpt={args.gradient_checkpointing}")
    print(f"| {'loop':44} | {'s/step':>7} | {'tokens/s':>9} | {'vs plain':>8} |")
    print(f"|{'-' * 46}|{'-' * 9}|{'-' * 11}|{'-' * 10}|")
    for name, seconds in rows:
        per_step = seconds / args.steps
        print(f"| {name:44} | {per_step:7.2f} | {tokens / per_step:9.0f} | {plain_s / seconds:8.2f} |")
    from rft.trainer import engine as dse

    sys.stdout.flush()
    dse.teardown(0)


if __name__ == "__main__":
    main()
