"""Where a CPU trainer rank's memory goes: the resident memory a forward + backward of the model
adds per token (the activations kept for the backward), and its seconds, at several micro-batch
sizes, with one thread and with all the cores. The figures behind rft.launch.memory's
``ACTIVATION_BYTES`` and the CPU trainer's rank and thread defaults (docs/performance.md#memory).

Each size runs in its own process (resident memory only grows within one), twice (the second is
reported: allocator and thread pools warm); ``--rows`` sequences of ``tokens / rows`` tokens each,
SDPA attention, float32, no gradient checkpointing.

    python -m benchmarks.activation_bench --model .cache/models/SmolLM2-135M-Instruct
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from benchmarks.common import REPO, print_table, run_recorded

_CHILD = """
import json, sys, time, psutil, torch
from transformers import AutoModelForCausalLM
model_dir, tokens, rows, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
proc = psutil.Process()
ids = torch.randint(0, model.config.vocab_size, (rows, tokens // rows))
for _ in range(2):
    base = proc.memory_info().rss
    start = time.perf_counter()
    out = model(input_ids=ids, use_cache=False, logits_to_keep=1)
    held = proc.memory_info().rss - base
    out.logits.sum().backward()
    seconds = time.perf_counter() - start
    del out
    model.zero_grad(set_to_none=True)
layers, hidden = model.config.num_hidden_layers, model.config.hidden_size
print(json.dumps({"held": held, "seconds": seconds, "layers": layers, "hidden": hidden}))
"""


def measure(model: str, tokens: int, rows: int, threads: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, model, str(tokens), str(rows), str(threads)],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, OMP_NUM_THREADS=str(threads)),
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(REPO / ".cache/models/SmolLM2-135M-Instruct"))
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--rows", type=int, default=8, help="sequences per micro-batch")
    args = parser.parse_args(argv)
    cores = os.cpu_count() or 1
    rows, slopes = [], []
    for tokens in args.tokens:
        one, every = (measure(args.model, tokens, args.rows, t) for t in (1, cores))
        per_unit = one["held"] / (tokens * one["layers"] * one["hidden"])
        slopes.append(per_unit)
        rows.append(
            [
                tokens,
                f"{one['held'] / 2**30:.2f}",
                f"{per_unit:.0f}",
                f"{one['seconds']:.1f}",
                f"{every['seconds']:.1f}",
                f"{one['seconds'] / every['seconds']:.2f}x",
            ]
        )
    header = ["tokens", "activations GB", "bytes/(token x layer x hidden)", "s, 1 thread"]
    print_table([*header, f"s, {cores} threads", "speed-up"], rows)
    print(f"\nbytes per token x layer x hidden unit, largest size: {slopes[-1]:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(run_recorded("activation_bench", main))
