"""Issue 35's GPU table in one command: rft's trainer in each configuration beside the naive loop.

Writes a random model of a named shape (Qwen2.5-1.5B's config, no download; ``--tiny`` for CPU),
runs each row in its own process with ``trainer_bench.py``'s timers (naive loop, ZeRO-2 eager
with publish vs raw write x3, compiled, packed, ZeRO-3, padded vs packed on a long tail), prints
the table and the issue's targets, and writes both as JSON after every row (``--out``):
``python -m benchmarks.gpu_suite --out /tmp/gpu_suite.json`` (``--tiny`` on CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import trainer_bench
from benchmarks.common import REPO, markdown_table, module_cmd, run_recorded
from rft.atomic import write_text
from rft.buffer.experience import Experience

# Model shapes by name: transformers config fields of a Qwen2 model, random weights.
SHAPES = {
    "qwen2.5-1.5b": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=32768,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    ),
}

# Row name -> (trainer flags, batch): the table, most important first.
ROWS = {
    "naive padded loop": ({}, "even"),
    "ZeRO-2 eager": ({}, "even"),
    "ZeRO-2 compile_layers": ({"compile": True}, "even"),
    "ZeRO-2 padding_free": ({"packed": True}, "even"),
    "ZeRO-3 eager": ({"zero_stage": 3}, "even"),
    "long tail: ZeRO-2 eager": ({}, "long tail"),
    "long tail: ZeRO-2 padding_free": ({"packed": True}, "long tail"),
}
PUBLISH_ROW = "ZeRO-2 eager"  # also times three publishes beside a raw write

# Batch and run sizes: the H200 measurement, and a CPU twin.
SIZES = {
    "gpu": dict(groups=8, repeat=8, prompt_len=256, response_len=512, max_token_len=8192, steps=3),
    "tiny": dict(groups=2, repeat=2, prompt_len=8, response_len=24, max_token_len=96, steps=1),
}


def make_model(shape: str, folder: Path, on_gpu: bool) -> Path:
    """A random-initialised causal LM of ``shape`` saved in ``folder`` (kept if there)."""
    if (folder / "config.json").exists() and any(folder.glob("*.safetensors")):
        return folder
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(**SHAPES[shape])
    torch.manual_seed(0)
    with torch.device("cuda" if on_gpu else "cpu"):  # initialised where it is fastest
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    del model
    if on_gpu:
        torch.cuda.empty_cache()  # the rows run in other processes: leave them the memory
    return folder


def parameter_count(model_dir: Path) -> int:
    """Parameters of the model (tied ones once), counted on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return sum(p.numel() for p in model.parameters())


def long_tail_batch(groups: int, repeat: int, prompt_len: int, response_len: int, vocab: int):
    """Responses mostly short, a few near ``response_len`` (lengths ~ response_len x u^3)."""
    rng = random.Random(1)
    out = []
    for g in range(groups):
        prompt = [rng.randrange(10, vocab) for _ in range(prompt_len)]
        for _ in range(repeat):
            n = max(1, int(response_len * rng.random() ** 3))
            resp = [rng.randrange(10, vocab) for _ in range(n)]
            out.append(
                Experience(
                    task_id=f"t{g}",
                    group_id=f"g{g}",
                    prompt_ids=prompt,
                    response_ids=resp,
                    logprobs=[-1.0] * n,
                    reward=float(rng.random() < 0.5),
                )
            )
    return out


def run_row(name: str, args: argparse.Namespace) -> dict:
    """One row in this process: seconds per step, tokens per step, peak GiB (and extras)."""
    import torch

    flags, batch_kind = ROWS[name]
    sizes = SIZES["tiny" if args.tiny else "gpu"]
    bench_args = argparse.Namespace(
        model=args.model,
        precision=args.precision,
        zero_stage=flags.get("zero_stage", 2),
        steps=sizes["steps"],
        groups=sizes["groups"],
        repeat=sizes["repeat"],
        max_token_len=sizes["max_token_len"],
        gradient_checkpointing=False,
        packed=flags.get("packed", False),
        compile=flags.get("compile", False),
    )
    cfg = trainer_bench.bench_config(bench_args)
    vocab = SHAPES["tiny" if args.tiny else args.shape]["vocab_size"]
    shape = (sizes["groups"], sizes["repeat"], sizes["prompt_len"], sizes["response_len"], vocab)
    make = long_tail_batch if batch_kind == "long tail" else trainer_bench.make_batch
    batch = make(*shape)
    torch.manual_seed(0)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if name == "naive padded loop":
        seconds, peak, _ = trainer_bench.time_plain(cfg, batch, sizes["steps"], device)
        tokens = sum(len(e.prompt_ids) + len(e.response_ids) for e in batch)
        return {"s_per_step": seconds / sizes["steps"], "tokens": tokens, "peak_gib": peak}
    from rft.trainer.engine import attention_implementation

    runs = 3 if name == PUBLISH_ROW else 0
    seconds, tokens, peak, anatomy = trainer_bench.time_rft(cfg, batch, sizes["steps"], runs)
    row = {"s_per_step": seconds / sizes["steps"], "tokens": tokens, "peak_gib": peak}
    row["attention"] = attention_implementation(cfg) or "sdpa"
    if runs:
        row["publish_vs_raw_runs"] = anatomy["publish_vs_raw_runs"]
    return row


def child(name: str, args: argparse.Namespace, timeout_s: float) -> dict:
    """:func:`run_row` in a fresh process; ``{"error": ...}`` if it fails or times out."""
    cmd = [*module_cmd("gpu_suite"), "--row", name, "--model", str(args.model)]
    cmd += ["--precision", args.precision, "--shape", args.shape] + ["--tiny"] * args.tiny
    try:
        out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"error": (out.stderr.strip().splitlines() or ["no output"])[-1][:300]}
    return json.loads(lines[-1])


def targets(rows: dict[str, dict]) -> list[dict]:
    """The issue's targets from the rows measured (a ratio > 1: faster than what it is over)."""

    def speedup(base: str, new: str) -> float | None:
        a, b = rows.get(base, {}), rows.get(new, {})
        if "s_per_step" not in a or "s_per_step" not in b:
            return None
        return a["s_per_step"] / b["s_per_step"]

    out = [
        ("compiled vs eager ZeRO-2", speedup("ZeRO-2 eager", "ZeRO-2 compile_layers"), 1.25),
        ("compiled MFU", rows.get("ZeRO-2 compile_layers", {}).get("mfu"), 0.40),
        (
            "rft (compiled) vs naive loop",
            speedup("naive padded loop", "ZeRO-2 compile_layers"),
            1.3,
        ),
        ("packed vs padded", speedup("ZeRO-2 eager", "ZeRO-2 padding_free"), 1.0),
        (
            "packed vs padded, long tail",
            speedup("long tail: ZeRO-2 eager", "long tail: ZeRO-2 padding_free"),
            1.2,
        ),
        ("ZeRO-3 vs ZeRO-2", speedup("ZeRO-2 eager", "ZeRO-3 eager"), 0.8),
    ]
    result = [
        {"target": n, "value": v, "want": f">= {w}", "met": None if v is None else v >= w}
        for n, v, w in out
    ]
    publish = rows.get(PUBLISH_ROW, {}).get("publish_vs_raw_runs")
    result.append(
        {
            "target": "publish vs raw write, each run",
            "value": publish,
            "want": "<= 1.3",
            "met": None if publish is None else all(r <= 1.3 for r in publish),
        }
    )
    return result


def table(rows: dict[str, dict]) -> str:
    naive = rows.get("naive padded loop", {}).get("s_per_step")
    lines = []
    for name, r in rows.items():
        if "error" in r:
            lines.append([name, f"failed: {r['error']}", "", "", "", ""])
            continue
        label = f"{name} ({r['attention']})" if "padding_free" in name else name
        mfu = f"{r['mfu']:.3f}" if r.get("mfu") is not None else "-"
        vs = f"{naive / r['s_per_step']:.2f}x" if naive else "-"
        rate = r["tokens"] / r["s_per_step"]
        lines.append(
            [label, f"{r['s_per_step']:.3f}", f"{rate:.0f}", mfu, vs, f"{r['peak_gib']:.1f}"]
        )
    header = ["configuration", "s/step", "tokens/s", "MFU", "vs naive loop", "peak GiB"]
    return markdown_table(header, lines, align="llllll")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-1.5b")
    p.add_argument("--tiny", action="store_true", help="the tiny shape and batch (CPU, fp32)")
    p.add_argument("--model", type=Path, help="model folder (default: made under .cache/)")
    p.add_argument("--precision", choices=["bf16", "fp32"], default=None)
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated subset of the rows")
    p.add_argument("--out", type=Path, default=None, help="JSON file of the table and targets")
    p.add_argument("--budget-s", type=float, default=480.0, help="rows left out after this")
    p.add_argument("--row", choices=list(ROWS), help=argparse.SUPPRESS)  # a child's one row
    args = p.parse_args()
    import torch

    on_gpu = torch.cuda.is_available()
    args.shape = "tiny" if args.tiny else args.shape
    args.precision = args.precision or ("bf16" if on_gpu and not args.tiny else "fp32")
    if args.row:
        print(json.dumps(run_row(args.row, args)))
        sys.stdout.flush()
        os._exit(0)  # DeepSpeed's process group: leave without interpreter teardown
    t0 = time.perf_counter()
    args.model = args.model or trainer_bench.REPO / ".cache" / "models" / f"random-{args.shape}"
    make_model(args.shape, args.model, on_gpu)
    params = parameter_count(args.model)
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    peak = trainer_bench.peak_tflops(device, None)
    names = [n.strip() for n in args.rows.split(",") if n.strip()]
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        p.error(f"unknown rows {unknown}; valid rows: {list(ROWS)}")
    report = {
        "device": torch.cuda.get_device_name(0) if on_gpu else "cpu",
        "shape": args.shape,
        "params": params,
        "precision": args.precision,
        "sizes": SIZES["tiny" if args.tiny else "gpu"],
        "rows": {},
    }
    for name in names:
        left = args.budget_s - (time.perf_counter() - t0)
        if left <= 0:
            report["rows"][name] = {"error": "left out: --budget-s spent"}
            continue
        row = child(name, args, left)
        if "s_per_step" in row and peak:
            row["mfu"] = 6 * params * row["tokens"] / row["s_per_step"] / (peak * 1e12)
        report["rows"][name] = row
        report["targets"] = targets(report["rows"])
        report["seconds"] = time.perf_counter() - t0
        if args.out:
            write_text(args.out, json.dumps(report, indent=1))
        print(f"[{report['seconds']:.0f} s] {name}: {row}", file=sys.stderr, flush=True)
    print(f"\n{report['device']}, {args.shape} ({params / 1e6:.0f}M params), {args.precision}")
    print(table(report["rows"]))
    for t in report.get("targets", []):
        print(f"- {t['target']}: {t['value']} (want {t['want']}): {t['met']}")


if __name__ == "__main__":
    sys.exit(run_recorded("gpu_suite", main))
