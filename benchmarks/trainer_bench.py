"""Trainer throughput: rft's DeepSpeed step vs a naive padded torch loop, same run, same device.

Both sides train the same model on the same batch of synthetic GRPO experiences (PPO loss,
one update per step, AdamW) on one device (CUDA when torch sees a GPU, else CPU):

* baseline, the straightforward loop: padded micro-batches by the same token budget, a no-grad
  pass for the old log-probs, then forward + backward, log-probs from the full float32
  ``log_softmax`` of the logits, torch's AdamW (fused on CUDA);
* rft: ``rft.trainer.step.train_step`` on a DeepSpeed ZeRO engine (one process) as configured
  by the flags: the old-log-prob pass skipped on-policy, log-probs in float32 chunks from the
  hidden states, ``--packed`` (``trainer.padding_free``), ``--compile``
  (``trainer.compile_layers``), ``--gradient-checkpointing``.

Each side is timed after a warm-up step (which also compiles), with the device synchronised
before every clock read; the baseline is freed before rft's engine is built. Prints tokens/s,
MFU (6 x parameters x tokens/s over the whole step / the device's peak: ``--peak-tflops``, by
default the bf16 dense peak of a recognised GPU, none on CPU), peak memory (CUDA:
``max_memory_allocated`` per side; CPU: the process's peak RSS so far, which only grows), the
ratio to the baseline, and rft's step anatomy (log-prob pass, forward+backward, optimizer, and
a publish: the ``weights/vN`` folder written by the trainer's streaming writer, fsynced, with a
raw write + fsync of the same bytes beside it).

    DS_ACCELERATOR=cpu OMP_NUM_THREADS=2 .venv/bin/python -m benchmarks.trainer_bench \\
        --model .cache/models/smollm2-135m-instruct --precision fp32
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, print_table, run_recorded

os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))

import torch

from rft.buffer.experience import Experience


def make_batch(
    groups: int, repeat: int, prompt_len: int, response_len: int, vocab: int
) -> list[Experience]:
    rng = random.Random(0)
    out = []
    for g in range(groups):
        prompt = [rng.randrange(10, vocab) for _ in range(prompt_len)]
        for k in range(repeat):
            resp = [
                rng.randrange(10, vocab)
                for _ in range(response_len - rng.randrange(0, response_len // 4))
            ]
            out.append(
                Experience(
                    task_id=f"t{g}",
                    group_id=f"g{g}",
                    prompt_ids=prompt,
                    response_ids=resp,
                    logprobs=[-1.0] * len(resp),
                    reward=float(rng.random() < 0.5),
                )
            )
    return out


def bench_config(args: argparse.Namespace):
    from rft.config.load import config_from_dict

    return config_from_dict(
        {
            "mode": "train",
            "checkpoint_root_dir": "/tmp/rft-bench",
            "algorithm": {
                "algorithm_type": "grpo",
                "repeat_times": args.repeat,
                "kl_loss_fn": "none",
                "optimizer": {"lr": 1e-6},
            },
            "model": {"model_path": str(args.model)},
            "buffer": {"batch_size": args.groups, "total_steps": args.steps},
            "trainer": {
                "zero_stage": args.zero_stage,
                "precision": args.precision,
                "gradient_checkpointing": args.gradient_checkpointing,
                "padding_free": args.packed,
                "compile_layers": args.compile,
                "use_dynamic_bsz": True,
                "max_token_len_per_gpu": args.max_token_len,
            },
        }
    )


ANATOMY = ("time_prepare_s", "time_old_logprobs_s", "time_forward_backward_s", "time_optimizer_s")

# bf16 dense peak TFLOP/s of GPUs by the name torch reports (the MFU denominator)
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0, "GH200": 989.0}


def peak_tflops(device: torch.device, given: float | None) -> float | None:
    if given is not None or device.type != "cuda":
        return given
    name = torch.cuda.get_device_name(device)
    return next(
        (v for k, v in sorted(PEAK_TFLOPS.items(), key=lambda kv: -len(kv[0])) if k in name), None
    )


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


def publish_times(actor, device: torch.device) -> tuple[float, float, int]:
    """Seconds of the trainer's publish (streamed ``weights/vN`` folder, fsynced) and of a raw
    write + fsync of as many bytes, in a temporary folder; and the bytes."""
    from rft.trainer import engine as dse

    root = Path(tempfile.mkdtemp(prefix="rft-trainer-bench-"))
    try:
        sync(device)
        t0 = time.perf_counter()
        dse.stream_hf_folder(actor, root / "published")  # what the trainer's publish writes
        for path in (root / "published").iterdir():
            with open(path, "rb+") as f:
                os.fsync(f.fileno())
        published = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in (root / "published").iterdir())
        payload = os.urandom(1 << 20) * (size >> 20)
        t0 = time.perf_counter()
        with open(root / "raw.bin", "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        return published, time.perf_counter() - t0, size
    finally:
        shutil.rmtree(root, ignore_errors=True)


def time_rft(
    cfg, batch, steps: int, publish_runs: int = 1
) -> tuple[float, int, float, dict[str, float]]:
    """Seconds for ``steps`` steps, tokens per step, peak memory (GiB) and the mean step anatomy
    with ``publish_runs`` publishes timed beside a raw write (the last one's figures, and
    ``publish_vs_raw_runs``: each run's ratio)."""
    from rft.trainer import engine as dse
    from rft.trainer.algorithm import build_loss_fns
    from rft.trainer.step import train_step

    info = dse.init_distributed()
    reset_peak(info.device)
    actor = dse.build_actor(cfg, info, steps + 1)
    fns = build_loss_fns(cfg.algorithm)
    # warm-up (and compilation); steps count from 1 as in the trainer's loop: a step 0 would be
    # inside critic_warmup (0) and update nothing, leaving the compilation to the timed steps
    train_step(actor, None, batch, cfg, fns, info, 1, 0)
    sync(info.device)
    anatomy = dict.fromkeys(ANATOMY, 0.0)
    t0 = time.perf_counter()
    for step in range(steps):
        metrics = train_step(actor, None, batch, cfg, fns, info, step + 2, 0)
        for key in ANATOMY:
            anatomy[key] += metrics[key] / steps
    sync(info.device)
    seconds = time.perf_counter() - t0
    peak = peak_memory_gib(info.device)
    anatomy["old_logprobs_skipped"] = metrics["old_logprobs_skipped"]
    ratios = []
    for _ in range(publish_runs):
        published, raw, size = publish_times(actor, info.device)
        ratios.append(published / raw)
        anatomy.update(
            publish_s=published,
            raw_write_s=raw,
            publish_vs_raw=published / raw,
            published_mib=size / 2**20,
        )
    if publish_runs > 1:
        anatomy["publish_vs_raw_runs"] = ratios
    return seconds, int(metrics["batch_tokens"]), peak, anatomy


def time_plain(cfg, batch, steps: int, device: torch.device) -> tuple[float, float, int]:
    """The naive baseline on ``device``: padded micro-batches, a no-grad old-log-prob pass,
    full float32 log-softmax, torch AdamW, no DeepSpeed. Seconds for ``steps`` steps, peak
    memory (GiB) and the model's parameter count."""
    from transformers import AutoModelForCausalLM

    from rft.algo.advantages import grpo_advantages
    from rft.algo.losses import ppo_loss
    from rft.trainer.batching import (
        BatchTotals,
        collate,
        micro_loss_scale,
        plan_micro_batches,
        rows_from_experiences,
    )

    dtype = torch.bfloat16 if cfg.trainer.precision == "bf16" else torch.float32
    reset_peak(device)
    model = AutoModelForCausalLM.from_pretrained(cfg.model.model_path, dtype=dtype).to(device)
    params = sum(p.numel() for p in model.parameters())  # tied weights counted once
    if cfg.trainer.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW(
        model.parameters(), lr=1e-6, weight_decay=0.01, fused=device.type == "cuda"
    )
    rows = rows_from_experiences(batch)
    lengths = [len(x) for x in rows.input_ids]
    plans = plan_micro_batches(
        range(len(rows)),
        lengths,
        use_dynamic_bsz=True,
        max_token_len=cfg.trainer.max_token_len_per_gpu,
        micro_batch_size=1,
    )
    adv, _ = grpo_advantages(rows.rewards, rows.group_ids, rows.response_mask)
    mask = rows.response_mask  # [N, R]: the whole batch is one source here
    totals = BatchTotals(int(mask.sum()), int((mask.sum(-1) > 0).sum()), mask.shape[-1])
    micros = [collate(rows, m, adv, torch.zeros_like(adv)).to(device) for m in plans]

    def logprobs(micro):
        logits = model(
            input_ids=micro.input_ids, attention_mask=micro.attention_mask
        ).logits  # [B, T, V]
        index = torch.arange(len(micro.rows), device=device).unsqueeze(-1)
        logsm = logits[index, micro.logit_positions].float().log_softmax(-1)  # [B, R, V]
        return logsm.gather(-1, micro.response_ids.unsqueeze(-1)).squeeze(-1)  # [B, R]

    def one_step() -> None:
        with torch.no_grad():
            old = [logprobs(micro) for micro in micros]
        for micro, old_lp in zip(micros, old):
            lp = logprobs(micro)
            loss, _ = ppo_loss(lp, old_lp, micro.advantages, micro.response_mask)
            (loss * micro_loss_scale(micro.response_mask, totals, "token-mean", 1)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    one_step()  # warm-up
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        one_step()
    sync(device)
    seconds = time.perf_counter() - t0
    peak = peak_memory_gib(device)
    model = opt = micros = None  # freed before rft's engine is built
    gc.collect()
    reset_peak(device)
    return seconds, peak, params


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
    p.add_argument("--packed", action="store_true", help="trainer.padding_free")
    p.add_argument("--compile", action="store_true", help="trainer.compile_layers")
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="the device's peak (TFLOP/s) for MFU; default: known GPUs' bf16 dense peak",
    )
    args = p.parse_args()
    cfg = bench_config(args)
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(args.model).vocab_size
    batch = make_batch(args.groups, args.repeat, args.prompt_len, args.response_len, vocab)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    peak = peak_tflops(device, args.peak_tflops)
    torch.manual_seed(0)
    plain_s, plain_peak, params = time_plain(cfg, batch, args.steps, device)
    rft_s, tokens, rft_peak, anatomy = time_rft(cfg, batch, args.steps)
    flags = [
        f
        for f, on in (
            ("packed", args.packed),
            ("compiled", args.compile),
            ("grad ckpt", args.gradient_checkpointing),
        )
        if on
    ]
    table = [
        ("naive padded torch loop (1 process)", plain_s, plain_peak),
        (
            f"rft trainer (ZeRO-{args.zero_stage}, 1 rank{', ' if flags else ''}{', '.join(flags)})",
            rft_s,
            rft_peak,
        ),
    ]
    memory = "peak alloc GiB" if device.type == "cuda" else "peak RSS GiB"
    print(
        f"\nmodel={Path(args.model).name} ({params / 1e6:.0f}M params) precision={args.precision} "
        f"device={torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'} "
        f"batch={len(batch)} seqs, {tokens} tokens/step, steps={args.steps}, threads={torch.get_num_threads()}"
    )
    rows = []
    for name, seconds, mem in table:
        per_step = seconds / args.steps
        rate = tokens / per_step
        mfu = f"{6 * params * rate / (peak * 1e12):.3f}" if peak else "-"
        rows.append(
            [name, f"{per_step:.3f}", f"{rate:.0f}", mfu, f"{mem:.2f}", f"{plain_s / seconds:.2f}"]
        )
    print_table(["loop", "s/step", "tokens/s", "MFU", memory, "vs naive"], rows)
    print(
        "rft step anatomy (mean s/step; no buffer read here): "
        + " ".join(f"{k}={v:.3f}" for k, v in anatomy.items())
    )
    from rft.trainer import engine as dse

    sys.stdout.flush()
    dse.teardown(0)


if __name__ == "__main__":
    sys.exit(run_recorded("trainer_bench", main))
