"""Benchmark: rft-convert vs DeepSpeed's zero_to_fp32 on the same ZeRO checkpoints.

Builds (once, cached under REPO/.cache/bench) SmolLM2-135M checkpoints trained one step with
real DeepSpeed on CPU: ZeRO-2 and ZeRO-3, two gloo ranks, bf16 (fp32 master weights in the
optimizer shards). Then, per checkpoint and repetition, runs each converter in a fresh
subprocess and records its wall time and peak RSS (``ru_maxrss`` of that child only):

  rft-convert            bin/rft-convert --dtype fp32 --force (streams tensor by tensor)
  ds get_fp32+save_file  DeepSpeed's get_fp32_state_dict_from_zero_checkpoint, tied aliases
                         dropped, safetensors save_file (what DeepSpeed users do for safetensors,
                         because zero_to_fp32 --safe_serialization fails on tied embeddings)
  ds zero_to_fp32 CLI    convert_zero_checkpoint_to_fp32_state_dict(safe_serialization=True),
                         DeepSpeed's own lazy path (reported even when it fails)

Outputs are checked to hold identical tensors. Usage::

    python -m benchmarks.convert_bench [--reps 2] [--stages 2,3]
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
from pathlib import Path

from benchmarks.common import REPO, print_table, run_recorded

CACHE = REPO / ".cache" / "bench"
PY = sys.executable

DS_SAVE_FILE = """
import sys, os
from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
from safetensors.torch import save_file
sd = get_fp32_state_dict_from_zero_checkpoint(sys.argv[1])
seen = {}
for k in list(sd):
    key = (sd[k].data_ptr(), tuple(sd[k].shape))
    if key in seen:
        del sd[k]  # tied alias: safetensors refuses shared tensors
    seen.setdefault(key, k)
os.makedirs(sys.argv[2], exist_ok=True)
save_file({k: v.contiguous() for k, v in sd.items()}, os.path.join(sys.argv[2], "model.safetensors"),
          metadata={"format": "pt"})
"""

DS_CLI = """
import sys
from deepspeed.utils.zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict
convert_zero_checkpoint_to_fp32_state_dict(sys.argv[1], sys.argv[2], safe_serialization=True)
"""


def measure(cmd: list[str], env: dict[str, str]) -> dict:
    """Run ``cmd`` in a fresh wrapper process; return wall and CPU seconds, peak RSS (MiB), exit code."""
    wrapper = (
        "import json, resource, subprocess, sys, time; t = time.monotonic(); "
        "rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode; "
        "ru = resource.getrusage(resource.RUSAGE_CHILDREN); "
        "print(json.dumps({'wall_s': time.monotonic() - t, 'rc': rc, 'cpu_s': ru.ru_utime + ru.ru_stime, "
        "'peak_mib': ru.ru_maxrss / 1024}))"
    )
    out = subprocess.run(
        [PY, "-c", wrapper, *cmd], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def build_checkpoint(model_dir: Path, stage: int, env: dict[str, str]) -> Path:
    step = CACHE / f"smollm2-zero{stage}-lr1e-5" / "global_step_1"
    if (step / "reference_logits.pt").is_file():
        return step
    shutil.rmtree(step, ignore_errors=True)
    print(f"training SmolLM2-135M one step with ZeRO-{stage} on 2 ranks ...", flush=True)
    subprocess.run(
        [
            PY,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(REPO / "tests" / "helpers" / "make_ds_checkpoint.py"),
            "--model-dir",
            str(model_dir),
            "--step-dir",
            str(step),
            "--stage",
            str(stage),
            "--bf16",
            "--train-steps",
            "1",
            "--lr",
            "1e-5",
            "--hf-files",
        ],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return step


def warm_page_cache(folder: Path) -> None:
    for p in folder.rglob("*.pt"):
        with open(p, "rb") as f:
            while f.read(1 << 24):
                pass


def same_tensors(a: Path, b: Path) -> bool:
    from safetensors.torch import load_file

    ta, tb = load_file(a), load_file(b)
    return ta.keys() == tb.keys() and all(ta[k].equal(tb[k]) for k in ta)


def bench_stage(model_dir: Path, stage: int, reps: int, env: dict[str, str]) -> list[dict]:
    step = build_checkpoint(model_dir, stage, env)
    actor = step / "actor"
    out_ds, out_cli = CACHE / "out-ds", CACHE / "out-cli"
    tools = {
        "rft-convert": [
            PY,
            str(REPO / "bin" / "rft-convert"),
            "--checkpoint-dir",
            str(step),
            "--dtype",
            "fp32",
            "--force",
        ],
        "ds get_fp32+save_file": [PY, "-c", DS_SAVE_FILE, str(actor), str(out_ds)],
        "ds zero_to_fp32 CLI": [PY, "-c", DS_CLI, str(actor), str(out_cli)],
    }
    warm_page_cache(step)
    runs: dict[str, list[dict]] = {name: [] for name in tools}
    for _ in range(reps):
        for name, cmd in tools.items():  # interleaved, so drift hits every tool alike
            shutil.rmtree(out_cli, ignore_errors=True)
            runs[name].append(measure(cmd, env))
    ok = same_tensors(actor / "huggingface" / "model.safetensors", out_ds / "model.safetensors")
    rows = []
    for name, rs in runs.items():
        rows.append(
            {
                "stage": stage,
                "tool": name,
                "rc": max(r["rc"] for r in rs),
                "wall_s": statistics.median(r["wall_s"] for r in rs),
                "cpu_s": statistics.median(r["cpu_s"] for r in rs),
                "peak_mib": statistics.median(r["peak_mib"] for r in rs),
                "same": ok,
            }
        )
    return rows


def show(rows: list[dict]) -> None:
    table = []
    for stage in sorted({r["stage"] for r in rows}):
        group = [r for r in rows if r["stage"] == stage]
        rft = next(r for r in group if r["tool"] == "rft-convert")
        for r in group:
            note = (
                "FAILED (exit %d)" % r["rc"]
                if r["rc"]
                else ("outputs identical" if r["same"] else "OUTPUTS DIFFER")
            )
            table.append(
                [
                    stage,
                    r["tool"],
                    f"{r['wall_s']:.2f}",
                    f"{r['cpu_s']:.2f}",
                    f"{r['peak_mib']:.0f}",
                    f"{r['wall_s'] / rft['wall_s']:.2f}x",
                    f"{r['cpu_s'] / rft['cpu_s']:.2f}x",
                    f"{r['peak_mib'] / rft['peak_mib']:.2f}x",
                    note,
                ]
            )
    header = ["ZeRO", "tool", "wall s", "CPU s", "peak RSS MiB", "wall vs rft", "CPU vs rft"]
    print()
    print_table([*header, "mem vs rft", "note"], table, align="rlrrrrrrl")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--stages", default="2,3")
    args = p.parse_args()
    env = {
        **os.environ,
        "DS_ACCELERATOR": "cpu",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    from rft.devtools import materialize_smollm2

    model_dir = materialize_smollm2(REPO / ".cache" / "models" / "smollm2-135m-instruct")
    start = time.monotonic()
    rows = [
        row
        for s in args.stages.split(",")
        for row in bench_stage(model_dir, int(s), args.reps, env)
    ]
    show(rows)
    print(
        f"\n(median of {args.reps} runs each; SmolLM2-135M, fp32 output; {time.monotonic() - start:.0f}s total)"
    )


if __name__ == "__main__":
    sys.exit(run_recorded("convert_bench", main))
