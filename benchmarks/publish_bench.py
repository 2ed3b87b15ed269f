"""Publishing weights: how close to the disk's speed is a ``weights/vN`` folder written?

One process, one DeepSpeed engine (ZeRO stage of ``--zero-stage``, CPU + gloo here, CUDA when
torch sees a GPU) on ``--model``. Three ways of writing the same weights into a fresh folder of
the run directory's filesystem, alternating over ``--trials`` (median and min):

* ``raw``: the baseline, ``open/write/fsync`` of as many bytes as the weights hold, from memory
  already prepared (what the disk allows);
* ``gather + save_pretrained``: what rft did before: the whole 16-bit state dict gathered
  (``gather_weights``), then Hugging Face's ``save_pretrained`` (it copies each tensor into the
  serialiser, writes, no fsync: fsync is added to compare like with like);
* ``streamed``: what the trainer does now (:func:`rft.trainer.engine.stream_hf_folder`): each
  tensor written as it is gathered, straight from the parameter's memory, then fsynced.

Prints seconds and the ratio to ``raw`` (issue 18's target: publish within 1.3x of a raw write).

    DS_ACCELERATOR=cpu OMP_NUM_THREADS=2 .venv/bin/python -m benchmarks.publish_bench \\
        --model .cache/models/smollm2-135m-instruct --zero-stage 2 --trials 5

Measured on this machine: ``benchmarks/results/2026-11-23-publish_bench.md``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, print_table, run_recorded

os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))


def fsync_folder(folder: Path) -> None:
    for path in folder.iterdir():
        with open(path, "rb+") as f:
            os.fsync(f.fileno())


def raw_write(folder: Path, payload: bytes) -> None:
    with open(folder / "model.bin", "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model", type=Path, default=REPO / ".cache" / "models" / "smollm2-135m-instruct"
    )
    parser.add_argument("--zero-stage", type=int, default=2, choices=(0, 1, 2, 3))
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to write (default: a temp dir)"
    )
    args = parser.parse_args()

    from rft.config.load import config_from_dict
    from rft.trainer import engine as dse

    cfg = config_from_dict(
        {
            "mode": "train",
            "model": {"model_path": str(args.model)},
            "trainer": {"zero_stage": args.zero_stage, "precision": args.precision},
            "buffer": {"total_steps": 1},
        }
    )
    info = dse.init_distributed()
    actor = dse.build_actor(cfg, info, 1)
    state = dse.gather_weights(actor)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    payload = os.urandom(1 << 20) * (nbytes >> 20) + os.urandom(nbytes & ((1 << 20) - 1))
    del state
    root = Path(tempfile.mkdtemp(prefix="publish-bench-", dir=args.dir))

    def old_way(folder: Path) -> None:
        gathered = dse.gather_weights(actor)
        actor.module.save_pretrained(folder, state_dict=gathered, safe_serialization=True)
        fsync_folder(folder)

    methods = {
        "raw": lambda folder: raw_write(folder, payload),
        "gather + save_pretrained": old_way,
        "streamed": lambda folder: dse.stream_hf_folder(actor, folder),
    }
    times: dict[str, list[float]] = {name: [] for name in methods}
    for trial in range(args.trials + 1):  # trial 0: warm-up, not counted
        for name, write in methods.items():
            folder = root / f"{trial}-{name.split()[0]}"
            folder.mkdir()
            start = time.perf_counter()
            write(folder)
            seconds = time.perf_counter() - start
            shutil.rmtree(folder)
            if trial:
                times[name].append(seconds)
                print(f"trial {trial} {name}: {seconds:.3f}s", file=sys.stderr, flush=True)
    shutil.rmtree(root, ignore_errors=True)

    raw = statistics.median(times["raw"])
    print(
        f"{args.model.name}: {nbytes / 2**20:.0f} MiB of weights, ZeRO-{args.zero_stage}, "
        f"{args.precision}, {info.device}, {args.trials} trials, written under {root.parent}"
    )
    rows = []
    for name, values in times.items():
        median = statistics.median(values)
        rows.append([name, f"{median:.3f}", f"{min(values):.3f}", f"{median / raw:.2f}x"])
    print_table(["method", "median s", "min s", "median / raw"], rows)
    dse.teardown(0)


if __name__ == "__main__":
    sys.exit(run_recorded("publish_bench", main))
