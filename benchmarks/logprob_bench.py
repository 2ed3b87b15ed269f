"""Token log-probs + entropies, forward and backward: the full log-softmax vs rft's chunks.

For an LM head of ``--hidden`` x ``--vocab`` (default Qwen2.5-1.5B's 1,536 x 151,936) and
``--tokens`` response tokens, three ways of computing each token's log-prob and entropy (at a
sampling temperature) and the gradient of a loss of both into the hidden states and the head:

* ``full`` (the baseline): ``logits = hidden @ weight.T``, then ``logits.float().log_softmax``
  (what a straightforward trainer does; autograd keeps the float32 ``[tokens, vocab]`` copy);
* ``chunked logits``: the same logits, then :func:`rft.algo.logprobs.logprobs_from_logits`
  (float32 one chunk at a time, recomputed in the backward: rft's path for ZeRO-3);
* ``from hidden``: :func:`rft.algo.logprobs.logprobs_from_hidden` (no logits tensor at all:
  rft's path for Llama/Qwen/Mistral models with ZeRO 0-2).

Each method runs in its own process (so peak memory is its own): CUDA reports
``max_memory_allocated`` above the inputs, CPU the peak resident memory above what the process
held once the inputs were built (built in place, so that no earlier high-water mark hides it).
Prints the median seconds of ``--trials`` timed runs after a warm-up, the peak, and both
relative to ``full``.

    OMP_NUM_THREADS=2 .venv/bin/python -m benchmarks.logprob_bench --tokens 1024 --dtype fp32
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch

from benchmarks.common import REPO, module_cmd, print_table, run_recorded

METHODS = ("full", "chunked logits", "from hidden")


def peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def current_bytes(device: torch.device) -> int:
    """Memory held now: CUDA's allocated bytes, or the process's resident set (Linux)."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def run_one(method: str, args: argparse.Namespace) -> dict[str, float]:
    """One method in this process: median seconds of forward + backward, and peak bytes above
    what the inputs hold."""
    from rft.algo.logprobs import logprobs_from_hidden, logprobs_from_logits

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    g = torch.Generator().manual_seed(0)
    # built in place: no transient second copy of the head raises the process's high-water mark
    hidden = (
        torch.randn(args.tokens, args.hidden, generator=g)
        .mul_(0.5)
        .to(device, dtype)
        .requires_grad_()
    )
    weight = (
        torch.randn(args.vocab, args.hidden, generator=g)
        .mul_(0.02)
        .to(device, dtype)
        .requires_grad_()
    )
    labels = torch.randint(0, args.vocab, (args.tokens,), generator=g).to(device)
    temps = torch.full((args.tokens,), 0.8, device=device)

    def step() -> None:
        if method == "from hidden":
            lp, ent = logprobs_from_hidden(
                hidden, weight, labels, temperature=temps, with_entropy=True
            )
        elif method == "chunked logits":
            lp, ent = logprobs_from_logits(
                hidden @ weight.T, labels, temperature=temps, with_entropy=True
            )
        else:
            logsm = ((hidden @ weight.T).float() / temps.unsqueeze(-1)).log_softmax(-1)  # [N, V]
            lp = logsm.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
            ent = -(logsm.exp() * logsm).sum(-1)
        (lp.sum() - 0.01 * ent.sum()).backward()
        hidden.grad = weight.grad = None

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    base = current_bytes(device)  # the inputs (and, on CPU, the interpreter and libraries)
    if device.type == "cpu" and peak_bytes(device) > base + (64 << 20):
        raise SystemExit(
            "the process's peak memory is already above what it holds: the CPU peak "
            "would be understated; build the inputs without temporaries"
        )
    step()  # warm-up, and the peak
    sync()
    peak = peak_bytes(device) - base
    times = []
    for _ in range(args.trials):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    return {"seconds": statistics.median(times), "peak_bytes": max(peak, 0)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=1536)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument(
        "--dtype", choices=["bf16", "fp32"], default="bf16" if torch.cuda.is_available() else "fp32"
    )
    p.add_argument("--trials", type=int, default=3)
    p.add_argument(
        "--method", choices=METHODS, help=argparse.SUPPRESS
    )  # a child process's one method
    args = p.parse_args()
    if args.method:
        print(json.dumps(run_one(args.method, args)))
        return
    results = {}
    for method in METHODS:
        cmd = [
            *module_cmd("logprob_bench"),
            "--method",
            method,
            "--tokens",
            str(args.tokens),
            "--hidden",
            str(args.hidden),
            "--vocab",
            str(args.vocab),
            "--dtype",
            args.dtype,
            "--trials",
            str(args.trials),
        ]
        out = subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, text=True).stdout
        results[method] = json.loads(out.strip().splitlines()[-1])
        print(f"{method}: {results[method]}", file=sys.stderr)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    full = results["full"]
    print(
        f"\ntokens={args.tokens} hidden={args.hidden} vocab={args.vocab} dtype={args.dtype} device={device} "
        f"threads={torch.get_num_threads()} trials={args.trials} (median)"
    )
    header = ["method", "s (fwd+bwd)", "speed vs full", "peak MiB above inputs", "peak vs full"]
    rows = [
        [
            method,
            f"{r['seconds']:.3f}",
            f"{full['seconds'] / r['seconds']:.2f}x",
            f"{r['peak_bytes'] / 2**20:.0f}",
            f"{r['peak_bytes'] / max(full['peak_bytes'], 1):.2f}x",
        ]
        for method, r in results.items()
    ]
    print_table(header, rows, align="lllll")


if __name__ == "__main__":
    sys.exit(run_recorded("logprob_bench", main))
