"""Where a CPU trainer rank's memory goes: the bytes of the activations a forward keeps for the
backward, per token, at several micro-batch sizes and row lengths, counted exactly (every tensor
autograd saves, by storage, the parameters left out), beside the resident memory the same
forward adds (the baseline: what the 2026-11-28 figure measured), and the seconds of a forward +
backward with one thread and with all the cores. The figures behind rft.launch.memory's
``ACTIVATION_BYTES`` and the CPU trainer's rank, thread and micro-batch defaults
(docs/performance.md#memory).

Each size runs in its own fresh process, ``--rows`` sequences of ``tokens / rows`` tokens each,
SDPA attention, float32, no gradient checkpointing. The resident memory a warm forward adds
undercounts the activations (the allocator reuses what the previous step freed): this is why
the saved bytes are counted.

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
params = {p.untyped_storage().data_ptr() for p in model.parameters()}
proc = psutil.Process()
ids = torch.randint(0, model.config.vocab_size, (rows, tokens // rows))
for _ in range(2):
    saved = {}

    def keep(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    base = proc.memory_info().rss
    start = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        out = model(input_ids=ids, use_cache=False, logits_to_keep=1)
    rss = proc.memory_info().rss - base
    out.logits.sum().backward()
    seconds = time.perf_counter() - start
    del out
    model.zero_grad(set_to_none=True)
layers, hidden = model.config.num_hidden_layers, model.config.hidden_size
print(json.dumps({"saved": sum(saved.values()), "rss": rss, "seconds": seconds,
                  "layers": layers, "hidden": hidden}))
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
    parser.add_argument(
        "--rows", type=int, nargs="+", default=[8], help="sequences per micro-batch"
    )
    args = parser.parse_args(argv)
    cores = os.cpu_count() or 1
    table, slopes = [], []
    for rows in args.rows:
        for tokens in args.tokens:
            one, every = (measure(args.model, tokens, rows, t) for t in (1, cores))
            units = tokens * one["layers"] * one["hidden"]
            slopes.append(one["saved"] / units)
            table.append(
                [
                    tokens,
                    rows,
                    f"{one['saved'] / 2**30:.2f}",
                    f"{one['saved'] / units:.1f}",
                    f"{one['rss'] / units:.0f}",
                    f"{one['seconds']:.1f}",
                    f"{every['seconds']:.1f}",
                    f"{one['seconds'] / every['seconds']:.2f}x",
                ]
            )
    header = ["tokens", "rows", "saved GB", "saved bytes/(token x layer x hidden)"]
    header += ["warm RSS growth, same unit (baseline)", "s, 1 thread", f"s, {cores} threads"]
    print_table([*header, "speed-up"], table)
    print(f"\nsaved bytes per token x layer x hidden unit: {min(slopes):.1f}-{max(slopes):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(run_recorded("activation_bench", main))
