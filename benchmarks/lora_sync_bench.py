"""LoRA sync latency: publish + load of an adapter vs of the full model, in the same run.

One process, one vLLM engine with LoRA enabled (:class:`rft.explorer.engine.Engine`, the
config's ``model.lora_configs``), one model. Methods alternate after one untimed warm-up each:

* ``full``: what a full fine-tuning run does each sync (``sync_method: checkpoint``):
  :class:`rft.sync.publisher.WeightsPublisher` ``.publish`` writes ``weights/v<version>/`` (config and
  the whole state dict through :mod:`rft.safetensors_io`, tokenizer files), then
  :class:`rft.sync.watcher.WeightsWatcher` ``.load(version, engine.reload)`` reloads the engine's
  weights in place;
* ``adapter``: what a LoRA run does (:mod:`rft.trainer.lora`): the publish writes the adapter
  folder (``adapter_config.json`` + ``adapter_model.safetensors``), and ``engine.reload``
  registers it with vLLM as a new adapter (eagerly read) and drops the previous one; the base
  stays.

Each trial ends with a greedy 1-token generate (with the adapter for ``adapter``), timed apart.
The weights are CPU tensors made before the timer starts (the trainer's gather is not timed:
ZeRO-3 gathers the full model for ``full`` and only the adapter for ``adapter``, so the
difference there is larger still). Prints median and min per method and the ratio of medians.

Usage::

    HF_HUB_OFFLINE=1 python -m benchmarks.lora_sync_bench --trials 5 [--rank 16]

Measured on this 2-core CPU machine: see docs/performance.md ("LoRA") for the table of the last run.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import REPO, print_table, run_recorded

os.environ.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))

import torch
from safetensors.torch import load_file

from rft.config.load import config_from_dict
from rft.devtools import materialize_smollm2
from rft.explorer.tasksets import SamplingArgs
from rft.models import tokenizer_files
from rft.sync.publisher import WeightsPublisher
from rft.sync.watcher import WeightsWatcher

PROMPT = "What is 2 + 3?"
METHODS = ("full", "adapter")


@dataclass
class Trial:
    method: str
    version: int
    total_s: float
    publish_s: float
    load_s: float
    generate_s: float


def log(msg: str) -> None:
    print(f"[lora_sync_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def folder_mib(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) / 2**20


class Bench:
    def __init__(self, model: Path, run_dir: Path, rank: int):
        from transformers import AutoModelForCausalLM

        from rft.config.schema import LoRAConfig
        from rft.explorer.engine import Engine
        from rft.trainer.lora import wrap

        self.model = model
        cfg = config_from_dict(
            {
                "model": {
                    "model_path": str(model),
                    "max_model_len": 256,
                    "lora_configs": [{"lora_rank": rank, "lora_alpha": rank}],
                },
                "mode": "train",
                "cluster": {"gpu_per_node": 0},
            }
        )
        start = time.perf_counter()
        self.engine = Engine(cfg)
        log(f"engine (LoRA enabled, rank {rank}) ready in {time.perf_counter() - start:.1f}s")
        self.prompt = self.engine.tokenizer.encode(PROMPT)
        self.base = load_file(str(model / "model.safetensors"))
        self.peft = wrap(
            AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.bfloat16),
            LoRAConfig(lora_rank=rank, lora_alpha=rank),
            str(model),
        )
        self.publisher = WeightsPublisher(run_dir, keep_versions=2)
        self.watcher = WeightsWatcher(run_dir, loaded_version=0)

    def adapter_state(self, version: int) -> dict[str, torch.Tensor]:
        """The adapter with B drawn from a seeded normal: a trained adapter's outputs move."""
        gen = torch.Generator().manual_seed(version)
        return {
            name: (torch.randn(p.shape, generator=gen) * 0.01).to(p.dtype)
            if ".lora_B." in name
            else p.detach().clone()
            for name, p in self.peft.named_parameters()
            if p.requires_grad
        }

    def full_state(self, version: int) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(version)
        return {
            k: v + (1e-3 * torch.randn(v.shape, generator=gen)).to(v.dtype)
            for k, v in self.base.items()
        }

    def write_full(self, state: dict[str, torch.Tensor]):
        from rft.safetensors_io import SINGLE_FILE, TensorSpec, write_safetensors

        def write(folder: Path) -> None:
            self.peft.base_model.model.config.save_pretrained(folder)
            specs = [TensorSpec(name, tuple(t.shape), t.dtype) for name, t in state.items()]
            write_safetensors(folder / SINGLE_FILE, specs, lambda spec: state[spec.name])

        return write

    def write_adapter(self, state: dict[str, torch.Tensor]):
        from rft.trainer.lora import save_adapter_folder

        return lambda folder: save_adapter_folder(self.peft, state, folder)

    def trial(self, method: str, version: int) -> Trial:
        if method == "full":
            write, extra = self.write_full(self.full_state(version)), tokenizer_files(self.model)
        else:
            write, extra = self.write_adapter(self.adapter_state(version)), []
        start = time.perf_counter()
        self.publisher.publish(version, write, extra_files=extra)
        published = time.perf_counter()
        latest = self.watcher.poll()
        assert latest is not None and latest[0] == version, (latest, version)
        assert self.watcher.load(version, self.engine.reload), "the folder changed while loading"
        loaded = time.perf_counter()
        from rft.explorer.engine import complete

        out = complete(self.engine, [self.prompt], [SamplingArgs(temperature=0.0, max_tokens=1)])
        done = time.perf_counter()
        assert out[0][0].response_ids
        self.last_folder = latest[1]
        return Trial(
            method, version, done - start, published - start, loaded - published, done - loaded
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help="HF model folder (default: SmolLM2-135M-Instruct, materialized "
        "under .cache/models/smollm2-135m-instruct)",
    )
    parser.add_argument("--trials", type=int, default=5, help="timed trials per method")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank (all linear layers)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    model = Path(
        args.model or materialize_smollm2(REPO / ".cache" / "models" / "smollm2-135m-instruct")
    )
    run_dir = Path(tempfile.mkdtemp(prefix="rft-lora-sync-bench-"))
    bench = Bench(model, run_dir, args.rank)
    sizes: dict[str, float] = {}
    trials: list[Trial] = []
    try:
        version = 0
        for method in METHODS:  # untimed warm-up of each path
            version += 1
            bench.trial(method, version)
            sizes[method] = folder_mib(bench.last_folder)
        for i in range(args.trials):
            for method in METHODS:
                version += 1
                trial = bench.trial(method, version)
                trials.append(trial)
                log(
                    f"trial {i + 1}/{args.trials} {method} v{version}: total {trial.total_s:.3f}s "
                    f"(publish {trial.publish_s:.3f}s, load {trial.load_s:.3f}s)"
                )
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    print(
        f"\n{model.name}, LoRA rank {args.rank} on all linear layers, {args.trials} trials per "
        f"method (alternating), OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}"
    )
    medians, table = {}, []
    for method in METHODS:
        rows = [t for t in trials if t.method == method]
        medians[method] = statistics.median(t.total_s for t in rows)
        table.append(
            [
                method,
                f"{sizes[method]:.1f}",
                f"{medians[method]:.3f}",
                f"{min(t.total_s for t in rows):.3f}",
                f"{statistics.median(t.publish_s for t in rows):.3f}",
                f"{statistics.median(t.load_s for t in rows):.3f}",
                f"{statistics.median(t.generate_s for t in rows):.3f}",
            ]
        )
    header = ["method", "folder MiB", "median total s", "min total s", "median publish s"]
    print_table([*header, "median load s", "median generate s"], table)
    print(f"\nfull / adapter (median total): {medians['full'] / medians['adapter']:.1f}x")


if __name__ == "__main__":
    sys.exit(run_recorded("lora_sync_bench", main))
