"""Weight sync latency: from "the trainer has new weights" to "the explorer generates with them",
through a checkpoint folder (``sync_method: checkpoint``) and by broadcast (``sync_method: nccl``;
gloo on CPU).

One process, one vLLM engine (:class:`rft.explorer.engine.Engine`), one model. Each version is
the model's own ``model.safetensors`` with small noise (a CPU state dict, as the trainer's
``gather_weights`` returns it; made untimed). A trial times, with ``time.perf_counter``, from
right before the trainer side starts to right after a greedy 1-token generate on a short prompt
returns:

* ``checkpoint``: :class:`rft.sync.publisher.WeightsPublisher` ``.publish`` writes ``weights/v<version>/``
  the way the trainer writes a gathered state dict (config, generation config, the weights through
  :mod:`rft.safetensors_io`, the tokenizer files; the table below was measured when it still
  called ``save_pretrained``; with the writer, one run of ``--trials 3``: checkpoint 1.05 s,
  nccl 0.75 s, 1.40x),
  then the explorer side's
  :class:`rft.sync.watcher.WeightsWatcher` ``.poll()`` sees it and ``.load(version, engine.reload)``
  reloads the engine in place, then the generate. The explorer's poll interval
  (``WEIGHTS_POLL_S``) is not counted: the poll comes right after the publish.
* ``nccl``: :class:`rft.sync.broadcaster.WeightBroadcaster` ``.broadcast`` runs on a thread
  (it returns when every explorer confirmed the load) while
  :class:`rft.sync.receiver.BroadcastReceiver` ``.poll`` runs until it returns the version,
  then the generate. Both ends are in this process (on CPU the engine too), so they share the
  cores; the group is formed by an untimed warm-up version, as it is once per run.

Parts: ``trainer s`` is the publish or the broadcast call; ``explorer s`` is the
``WeightsWatcher.load`` (engine reload from the folder) or the receiver's ``receive_s``
(receive, load in place, confirm); for ``nccl`` the two overlap, so parts do not add up to the
total. Methods alternate (checkpoint, nccl, checkpoint, ...) after one untimed warm-up each, so
drift hits both. Prints median and min per method and the ratio of medians.

On GPUs the broadcaster sends from the last GPU over NCCL and the engine runs on the first:
NCCL refuses two ranks of a group on one device, so a 1-GPU machine cannot run the ``nccl``
side (the GPU path is written but was not run: this machine has none). Usage::

    HF_HUB_OFFLINE=1 python -m benchmarks.sync_bench --trials 3

``--delta``: full folders against delta folders (``synchronizer.delta_sync``), no vLLM. The
quick start's model (SmolLM2-135M-Instruct) takes ``--steps`` real AdamW steps (fp32 master
weights, ``--lr``, a fixed arithmetic batch); after each, the weights are published as fp32 and
as bf16 (the master cast, as a bf16 trainer holds them) to four run directories: full and delta
per dtype, each through :class:`rft.sync.local.StreamedFolder` as the trainer streams its
gathers (a delta codes each tensor against the anchor in RAM; no full file is written). Per
sync: bytes written (the version folder), bytes read (folder, plus the anchor when an explorer
copies it), publish s, load s (``WeightsWatcher.load``: the in-place local rebuild for deltas,
then every tensor copied into tensors allocated once, as an engine reload copies into its
parameters; ``load_file`` alone maps the file and reads nothing). Then each version's publish +
load, and the codec alone on the last version in RAM (where a delta's time goes). Usage::

    HF_HUB_OFFLINE=1 python -m benchmarks.sync_bench --delta --steps 5

Before the trials, an untimed check: the same weights loaded by folder and by broadcast give
the same greedy log-prob, unlike the base model's.

Measured on this machine: ``benchmarks/results/2026-11-23-sync_bench.md`` and ``benchmarks/results/2026-11-26-sync_bench.md``.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import sys
import tempfile
import threading
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
from rft.sync.heartbeat import Heartbeat
from rft.sync.publisher import WeightsPublisher
from rft.sync.watcher import WeightsWatcher

EXPLORER = "explorer-0"  # the receiver's and the heartbeat's name
PROMPT = "What is 2 + 3?"
NOISE = 0.01  # noise per element, relative to the tensor's mean absolute value
TIMEOUT_S = 300.0


@dataclass
class Trial:
    method: str
    version: int
    total_s: float
    trainer_s: float  # publish, or broadcast
    explorer_s: float  # folder load (engine reload), or receive + load + confirm
    generate_s: float


def log(msg: str) -> None:
    print(f"[sync_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def noisy(base: dict[str, torch.Tensor], version: int) -> dict[str, torch.Tensor]:
    """The base weights plus small noise seeded by ``version`` (CPU, the base dtypes)."""
    gen = torch.Generator().manual_seed(version)
    return {
        k: v + (NOISE * v.float().abs().mean() * torch.randn(v.shape, generator=gen)).to(v.dtype)
        for k, v in base.items()
    }


def trainer_device() -> torch.device:
    """Where the broadcaster sends from: the CPU (gloo), or the last GPU (NCCL) while the
    engine takes the first; NCCL refuses two ranks of one group on the same GPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if count < 2:
        raise SystemExit(
            "sync_bench: the nccl side needs 2 GPUs (NCCL refuses the trainer's and "
            "the explorer's ranks on one device); run it on a node with 2 GPUs, or "
            "with CUDA_VISIBLE_DEVICES= on the CPU"
        )
    return torch.device(f"cuda:{count - 1}")


class Bench:
    """The engine, both sync paths on one run directory, and the timed trials."""

    def __init__(self, model: Path, run_dir: Path, device: torch.device):
        from transformers import AutoModelForCausalLM

        from rft.explorer.engine import Engine
        from rft.sync.broadcaster import WeightBroadcaster
        from rft.sync.receiver import BroadcastReceiver

        self.model = model
        cfg = config_from_dict(
            {
                "model": {"model_path": str(model), "max_model_len": 256},
                "mode": "train",
                "cluster": {"gpu_per_node": 0},
            }
        )
        start = time.perf_counter()
        self.engine = Engine(cfg)
        log(f"engine ready in {time.perf_counter() - start:.1f}s")
        self.prompt = self.engine.tokenizer.encode(PROMPT)
        # the trainer's module, for its config files (the weights come from the state dict)
        self.hf_model = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.bfloat16)
        self.base = load_file(str(model / "model.safetensors"))
        self.heartbeat = Heartbeat(run_dir, EXPLORER, interval_s=1).start()
        self.publisher = WeightsPublisher(run_dir)
        self.watcher = WeightsWatcher(run_dir, loaded_version=0, heartbeat=self.heartbeat)
        self.broadcaster = WeightBroadcaster(
            run_dir, device, timeout_s=TIMEOUT_S, heartbeat_live_s=600
        )
        self.receiver = BroadcastReceiver(run_dir, EXPLORER, self.engine, tp=1, timeout_s=TIMEOUT_S)

    def close(self) -> None:
        self.receiver.close()
        self.broadcaster.close()
        self.heartbeat.stop()

    def generate(self) -> float:
        """Seconds of one greedy 1-token generate; its log-prob is kept in ``last_logprob``."""
        start = time.perf_counter()
        from rft.explorer.engine import complete

        out = complete(self.engine, [self.prompt], [SamplingArgs(temperature=0.0, max_tokens=1)])
        seconds = time.perf_counter() - start
        self.last_logprob = out[0][0].logprobs[0]
        return seconds

    def write_fn(self, state: dict[str, torch.Tensor]):
        """What ``rft.trainer.engine.save_hf_folder`` writes for a gathered state dict."""
        from rft.safetensors_io import SINGLE_FILE, TensorSpec, write_safetensors

        def write(folder: Path) -> None:
            self.hf_model.config.save_pretrained(folder)
            if getattr(self.hf_model, "generation_config", None) is not None:
                self.hf_model.generation_config.save_pretrained(folder)
            specs = [TensorSpec(name, tuple(t.shape), t.dtype) for name, t in state.items()]
            write_safetensors(folder / SINGLE_FILE, specs, lambda spec: state[spec.name])

        return write

    def checkpoint(self, version: int, state: dict[str, torch.Tensor]) -> Trial:
        start = time.perf_counter()
        self.publisher.publish(
            version, self.write_fn(state), extra_files=tokenizer_files(self.model)
        )
        published = time.perf_counter()
        latest = self.watcher.poll()
        assert latest is not None and latest[0] == version, (latest, version)
        load_start = time.perf_counter()
        assert self.watcher.load(version, self.engine.reload), "the folder changed while loading"
        loaded = time.perf_counter()
        generate_s = self.generate()
        return Trial(
            "checkpoint",
            version,
            time.perf_counter() - start,
            published - start,
            loaded - load_start,
            generate_s,
        )

    def nccl(self, version: int, state: dict[str, torch.Tensor], retry: bool = False) -> Trial:
        """Broadcast ``version`` from a thread, receive it here. ``retry``: broadcast again
        while nobody registered (the warm-up); otherwise a failed broadcast is an error."""
        sent: list[float] = []

        def train() -> None:
            deadline = time.monotonic() + TIMEOUT_S
            while time.monotonic() < deadline:
                begin = time.perf_counter()
                if self.broadcaster.broadcast(version, state):
                    sent.append(time.perf_counter() - begin)
                    return
                if not retry:
                    return
                time.sleep(0.2)

        start = time.perf_counter()
        thread = threading.Thread(target=train, name="trainer-broadcast")
        thread.start()
        deadline = time.monotonic() + TIMEOUT_S
        got = None
        while got != version:
            got = self.receiver.poll(1.0)
            if time.monotonic() > deadline or (got is None and not thread.is_alive() and not sent):
                thread.join()
                raise SystemExit(
                    f"sync_bench: weights version {version} did not arrive by "
                    "broadcast (see the log above)"
                )
        self.watcher.loaded_by_broadcast(version)
        generate_s = self.generate()
        total_s = time.perf_counter() - start
        thread.join()
        assert sent, f"the broadcast of version {version} failed"
        return Trial("nccl", version, total_s, sent[0], self.receiver.receive_s, generate_s)


def check_same_weights(base: float, by_folder: float, by_broadcast: float) -> None:
    """Both paths loaded the same weights (the same log-prob), and not the base model's."""
    log(
        f"greedy token log-prob: base model {base:.6f}, the warm-up weights by folder "
        f"{by_folder:.6f}, by broadcast {by_broadcast:.6f}"
    )
    if abs(by_folder - by_broadcast) > 1e-4 or by_folder == base:
        raise SystemExit(
            "sync_bench: the two methods loaded different weights (or none): "
            "the timings would not compare like with like"
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
    parser.add_argument("--trials", type=int, default=3, help="timed trials per method")
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="run directory for weights/ and the rendezvous (default: a temp dir)",
    )
    parser.add_argument("--delta", action="store_true", help="full vs delta folders, no vLLM")
    parser.add_argument("--steps", type=int, default=5, help="--delta: training steps")
    parser.add_argument("--lr", type=float, default=1e-6, help="--delta: AdamW learning rate")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.delta:
        model = args.model or materialize_smollm2(
            REPO / ".cache" / "models" / "smollm2-135m-instruct"
        )
        return delta_rows(Path(model), args.steps, args.lr, args.run_dir)
    device = trainer_device()
    model = args.model or materialize_smollm2(REPO / ".cache" / "models" / "smollm2-135m-instruct")
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="rft-sync-bench-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    log(f"model {model}, run dir {run_dir}, broadcaster on {device}")
    bench = Bench(Path(model), run_dir, device)
    trials: list[Trial] = []
    try:
        bench.generate()
        base_logprob = bench.last_logprob
        log("warm-up: checkpoint version 1")
        warm = noisy(bench.base, 1)
        bench.checkpoint(1, warm)
        by_folder = bench.last_logprob
        bench.receiver.poll(0.0)  # connects and registers for the broadcast
        log("warm-up: nccl version 2, the same weights (forms the group)")
        bench.nccl(2, warm, retry=True)
        check_same_weights(base_logprob, by_folder, bench.last_logprob)
        version = 2
        for i in range(args.trials):
            for method in ("checkpoint", "nccl"):
                version += 1
                state = noisy(bench.base, version)
                trial = getattr(bench, method)(version, state)
                trials.append(trial)
                log(
                    f"trial {i + 1}/{args.trials} {method} v{version}: total {trial.total_s:.2f}s "
                    f"(trainer {trial.trainer_s:.2f}s, explorer {trial.explorer_s:.2f}s, "
                    f"generate {trial.generate_s:.3f}s)"
                )
        weights_mb = sum(t.numel() * t.element_size() for t in bench.base.values()) / 2**20
        print_trials(args, model, device, weights_mb, trials)
    finally:
        bench.close()
        if args.run_dir is None:
            shutil.rmtree(run_dir, ignore_errors=True)


def print_trials(args, model, device, weights_mb: float, trials: list[Trial]) -> None:
    print(
        f"\n{Path(model).name}: {weights_mb:.0f} MiB of weights, {args.trials} trials per method "
        f"(alternating), broadcaster on {device}, OMP_NUM_THREADS="
        f"{os.environ.get('OMP_NUM_THREADS')}"
    )
    medians, table = {}, []
    for method, trainer, explorer in (
        ("checkpoint", "publish", "reload"),
        ("nccl", "broadcast", "receive"),
    ):
        rows = [t for t in trials if t.method == method]
        medians[method] = statistics.median(t.total_s for t in rows)
        table.append(
            [
                method,
                f"{medians[method]:.2f}",
                f"{min(t.total_s for t in rows):.2f}",
                f"{statistics.median(t.trainer_s for t in rows):.2f} ({trainer})",
                f"{statistics.median(t.explorer_s for t in rows):.2f} ({explorer})",
                f"{statistics.median(t.generate_s for t in rows):.3f}",
            ]
        )
    header = ["method", "median total s", "min total s", "median trainer s", "median explorer s"]
    print_table([*header, "median generate s"], table)
    print(f"\ncheckpoint / nccl (median total): {medians['checkpoint'] / medians['nccl']:.2f}x")


class DeltaSide:
    """One run directory: a publisher (full or delta) and a watcher that loads every version."""

    def __init__(self, root: Path, name: str, delta: bool):
        from rft.sync.local import DeltaPolicy, LocalCopy

        self.name, self.run_dir = name, root / name
        policy = DeltaPolicy(anchor_interval=8, local_dir=str(root / "local")) if delta else None
        self.publisher = WeightsPublisher(self.run_dir, keep_versions=2, delta=policy)
        local = LocalCopy(self.run_dir, policy.scratch(self.run_dir, EXPLORER)) if delta else None
        self.watcher = WeightsWatcher(self.run_dir, loaded_version=0, local=local)
        self.rows: list[dict] = []
        self.loaded: dict[str, torch.Tensor] = {}  # the "engine's" weights, allocated once

    def reload(self, folder: Path) -> None:
        """Copy every tensor of ``folder`` into :attr:`loaded`, as an engine reload copies into
        its parameters (``load_file`` alone maps the file and reads nothing)."""
        from safetensors import safe_open

        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            for name in f.keys():
                tensor = f.get_tensor(name)
                self.loaded.setdefault(name, torch.empty_like(tensor)).copy_(tensor)

    def sync(self, version: int, write) -> None:
        from rft.sync.versions import delta_base

        start = time.perf_counter()
        folder = self.publisher.publish(version, write)
        published = time.perf_counter()
        ok = self.watcher.load(version, self.reload)
        assert ok and self.loaded, f"{self.name}: version {version} not loaded"
        written = sum(p.stat().st_size for p in folder.iterdir())
        base = delta_base(folder)
        self.rows.append(
            {
                "version": version,
                "kind": "full" if base is None else "delta",
                "written": written,
                "read": written,  # a delta's anchor was copied when it was published (full)
                "publish_s": published - start,
                "load_s": time.perf_counter() - published,
            }
        )


def train_steps(model_dir: Path, steps: int, lr: float):
    """Yield the fp32 state dict after each of ``steps`` AdamW steps on a fixed batch."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    text = [f"What is {a} + {b}? The answer is {a + b}." for a, b in ((3, 4), (12, 7), (9, 9))]
    batch = tok(text, return_tensors="pt", padding=True)
    optim = torch.optim.AdamW(model.parameters(), lr=lr)
    for step in range(1, steps + 1):
        loss = model(**batch, labels=batch["input_ids"]).loss
        loss.backward()
        optim.step()
        optim.zero_grad()
        log(f"step {step}: loss {loss.item():.4f}")
        yield step, {k: v.detach().clone() for k, v in model.state_dict().items()}


def delta_rows(model_dir: Path, steps: int, lr: float, run_dir: Path | None) -> None:
    from rft.safetensors_io import SINGLE_FILE, TensorSpec
    from rft.sync.local import StreamedFolder

    root = run_dir or Path(tempfile.mkdtemp(prefix="rft-delta-bench-"))
    sides = {
        (dtype, kind): DeltaSide(root, f"{dtype}-{kind}", kind == "delta")
        for dtype in ("fp32", "bf16")
        for kind in ("full", "delta")
    }
    config = (model_dir / "config.json").read_text()
    try:
        for step, state in train_steps(model_dir, steps, lr):
            for (dtype, _kind), side in sides.items():
                tensors = state if dtype == "fp32" else {k: v.bfloat16() for k, v in state.items()}

                def write(folder: Path, write_file, tensors=tensors) -> None:
                    (folder / "config.json").write_text(config)
                    specs = [TensorSpec(k, tuple(t.shape), t.dtype) for k, t in tensors.items()]
                    write_file(folder / SINGLE_FILE, specs, lambda sp: tensors[sp.name])

                side.sync(step, StreamedFolder(write))  # as the trainer streams its gathers
            for dtype in ("fp32", "bf16"):
                full, delta = sides[dtype, "full"].loaded, sides[dtype, "delta"].loaded
                assert all(torch.equal(full[k], delta[k]) for k in full), "delta != full"
        print_delta_table(model_dir, steps, lr, sides)
        for dtype in ("fp32", "bf16"):
            tensors = state if dtype == "fp32" else {k: v.bfloat16() for k, v in state.items()}
            print_phases(dtype, tensors, sides[dtype, "delta"])
    finally:
        if run_dir is None:
            shutil.rmtree(root, ignore_errors=True)


def print_delta_table(model_dir: Path, steps: int, lr: float, sides: dict) -> None:
    print(
        f"\n{model_dir.name}: {steps} AdamW steps at lr {lr:g}, a version after each (v1 is the "
        f"anchor: full both ways); medians over v2..v{steps}; OMP_NUM_THREADS="
        f"{os.environ.get('OMP_NUM_THREADS')}"
    )
    table = []
    for (dtype, kind), side in sides.items():
        rows = [r for r in side.rows if r["version"] > 1]
        med = {
            k: statistics.median(r[k] for r in rows)
            for k in ("written", "read", "publish_s", "load_s")
        }
        total = statistics.median(r["publish_s"] + r["load_s"] for r in rows)
        table.append(
            [
                dtype,
                kind,
                f"{med['written'] / 2**20:.1f}",
                f"{med['read'] / 2**20:.1f}",
                f"{med['publish_s']:.2f}",
                f"{med['load_s']:.2f}",
                f"{total:.2f}",
            ]
        )
    header = ["dtype", "sync", "MiB written", "MiB read", "publish s", "load s", "publish + load s"]
    print_table(header, table, align="llrrrrr")
    for dtype in ("fp32", "bf16"):
        full, delta = (
            statistics.median(r["written"] for r in sides[dtype, k].rows if r["version"] > 1)
            for k in ("full", "delta")
        )
        print(f"{dtype}: delta bytes / full bytes per sync = {delta / full:.3f}")
    for (dtype, kind), side in sides.items():
        each = ", ".join(
            f"v{r['version']} {r['publish_s']:.2f} + {r['load_s']:.2f}"
            for r in side.rows
            if r["version"] > 1
        )
        print(f"{dtype} {kind}, publish + load s per version: {each}")


def print_phases(dtype: str, tensors: dict[str, torch.Tensor], side: DeltaSide) -> None:
    """Where a delta's time goes: the codec alone on the last version, in RAM (no files), each
    timed twice (the second printed: buffers warm, as in a run)."""
    import numpy as np

    from rft.safetensors_io import SINGLE_FILE, TensorSpec, header_bytes
    from rft.sync.delta import apply, encode, tensor_bytes

    writer = side.publisher.delta
    anchor = writer.anchor.files[SINGLE_FILE]
    specs = [TensorSpec(k, tuple(t.shape), t.dtype) for k, t in tensors.items()]
    start, spans = len(header_bytes(specs)), []
    for spec in specs:
        spans.append((start, start + spec.nbytes, tensors[spec.name].element_size()))
        start += spec.nbytes
    news = [tensor_bytes(t) for t in tensors.values()]
    out = anchor.copy()
    equal = np.empty(0, dtype=np.int64)

    def timed(work) -> tuple[float, list]:
        for _ in range(2):
            begin = time.perf_counter()
            result = work()
        return time.perf_counter() - begin, result

    def on_pool(fn, args) -> list:
        return [job.result() for job in [writer._pool.submit(fn, *a) for a in args]]

    coded = [(n, anchor[a:b], i) for n, (a, b, i) in zip(news, spans)]
    encode_s, frames = timed(lambda: on_pool(encode, coded))
    into = [(f, anchor[a:b], out[a:b], i, equal) for f, (a, b, i) in zip(frames, spans)]
    apply_s, _ = timed(lambda: on_pool(apply, into))
    kinds = {k: sum(f.kind == k for f in frames) for k in ("sparse", "xor")}
    print(
        f"{dtype} delta v{side.rows[-1]['version']}, codec alone in RAM: encode {encode_s:.3f} s, "
        f"apply {apply_s:.3f} s ({writer._pool._max_workers} threads, each frame's crc32 "
        f"included); frames {kinds}"
    )


if __name__ == "__main__":
    sys.exit(run_recorded("sync_bench", main))
