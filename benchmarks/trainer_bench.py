"""Trainer throughput: rft's DeepSpeed step vs a plain single-process torch loop, same run.

Both sides train the same model on the same batch of synthetic experiences (GRPO advantages,
PPO loss, one update per step so the old log-probs are the training forward's own, detached:
rft skips the no-grad pass there, and so does the baseline; AdamW) on the same device (CUDA
when torch sees a GPU, else CPU): rft through ``rft.trainer.step.train_step`` on a DeepSpeed
ZeRO engine (one process), the baseline as a hand-written loop over the same micro-batches and
the same forward function (so the difference is DeepSpeed's engine, ZeRO bookkeeping and rft's
batching). The baseline runs first and is freed before rft's engine is built. Prints tokens/s,
peak memory (CUDA: ``max_memory_allocated``; CPU: the process's peak resident memory so far,
which only grows, so rft's row includes the baseline's peak) and the ratio, then rft's step
anatomy from its step metrics (``time_*``) and the weights gather of a publish.

    DS_ACCELERATOR=cpu OMP_NUM_THREADS=2 .venv/bin/python benchmarks/trainer_bench.py \\
        --model .cache/models/smollm2-135m-instruct --precision bf16
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import resource
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


ANATOMY = ("time_prepare_s", "time_old_logprobs_s", "time_forward_backward_s", "time_optimizer_s")


def sync(device: torch.device) -> None:
    """Wait for queued kernels so that wall-clock times count them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gib(device: torch.device) -> float:
    """CUDA: peak allocated since :func:`reset_peak`; CPU: the process's peak RSS (Linux: KiB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def time_rft(cfg, batch, steps: int) -> tuple[float, int, float, dict[str, float]]:
    """Seconds for ``steps`` steps, tokens per step, peak memory (GiB) and the mean step anatomy."""
    from rft.algo.registry import build_loss_fns
    from rft.trainer import engine as dse
    from rft.trainer.step import train_step

    info = dse.init_distributed()
    reset_peak(info.device)
    actor = dse.build_actor(cfg, info, steps + 1)
    fns = build_loss_fns(cfg.algorithm)
    train_step(actor, None, batch, cfg, fns, info, 0, 0)  # warm-up
    sync(info.device)
    anatomy = dict.fromkeys(ANATOMY, 0.0)
    t0 = time.perf_counter()
    for step in range(steps):
        metrics = train_step(actor, None, batch, cfg, fns, info, step + 1, 0)
        for key in ANATOMY:
            anatomy[key] += metrics[key] / steps
    sync(info.device)
    seconds = time.perf_counter() - t0
    t1 = time.perf_counter()
    dse.gather_weights(actor)  # what a publish gathers before writing
    sync(info.device)
    anatomy["publish_gather_s"] = time.perf_counter() - t1
    anatomy["old_logprobs_skipped"] = metrics["old_logprobs_skipped"]
    return seconds, int(metrics["batch_tokens"]), peak_memory_gib(info.device), anatomy


def time_plain(cfg, batch, steps: int, device: torch.device) -> tuple[float, float]:
    """The baseline: same micro-batches, PPO loss at ratio 1 (old = this forward, detached),
    AdamW, no DeepSpeed, on ``device``. Seconds for ``steps`` steps and peak memory (GiB)."""
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
    reset_peak(device)
    model = AutoModelForCausalLM.from_pretrained(cfg.model.model_path, dtype=dtype).to(device)
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

    def logprobs(model, micro, entropy: bool = False):
        # the same forward as rft's (LM head on the response window, entropy as a metric)
        return dse.forward_logprobs(model, micro, with_entropy=entropy, entropy_grad=False)[0]

    old = torch.zeros_like(rows.response_mask)  # unused: one update, old = the forward's own

    def one_step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        for m in micros:
            micro = collate(rows, m, adv, old).to(device)
            logprob = logprobs(model, micro, entropy=True)  # [B, R]
            loss, _ = ppo_loss(logprob, logprob.detach(), micro.advantages, micro.response_mask)
            (loss * micro_loss_scale(micro.response_mask, totals, "token-mean", 1)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    one_step(model, opt)  # warm-up
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        one_step(model, opt)
    sync(device)
    seconds = time.perf_counter() - t0
    peak = peak_memory_gib(device)
    del model, opt  # freed before rft's engine is built
    gc.collect()
    reset_peak(device)
    return seconds, peak


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
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    torch.manual_seed(0)
    plain_s, plain_peak = time_plain(cfg, batch, args.steps, device)
    rft_s, tokens, rft_peak, anatomy = time_rft(cfg, batch, args.steps)
    rows = [("plain torch loop (1 process)", plain_s, plain_peak),
            (f"rft trainer (DeepSpeed ZeRO-{args.zero_stage}, 1 rank)", rft_s, rft_peak)]
    memory = "peak alloc GiB" if device.type == "cuda" else "peak RSS GiB"
    print(f"\nmodel={Path(args.model).name} precision={args.precision} device={device} batch={len(batch)} "
          f"seqs, {tokens} tokens/step, steps={args.steps}, threads={torch.get_num_threads()}, "
          f"grad_ckpt={args.gradient_checkpointing}")
    print(f"| {'loop':44} | {'s/step':>7} | {'tokens/s':>9} | {memory:>14} | {'vs plain':>8} |")
    print(f"|{'-' * 46}|{'-' * 9}|{'-' * 11}|{'-' * 16}|{'-' * 10}|")
    for name, seconds, peak in rows:
        per_step = seconds / args.steps
        print(f"| {name:44} | {per_step:7.2f} | {tokens / per_step:9.0f} | {peak:14.2f} | "
              f"{plain_s / seconds:8.2f} |")
    print("rft step anatomy (mean s/step; no buffer read here): "
          + " ".join(f"{k}={v:.3f}" for k, v in anatomy.items()))
    from rft.trainer import engine as dse

    sys.stdout.flush()
    dse.teardown(0)


if __name__ == "__main__":
    main()
