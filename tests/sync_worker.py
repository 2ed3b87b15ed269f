"""Processes for the sync tests: a weights publisher (killed mid-write, or churning versions
under explorers) and an explorer that loads every new version slowly.

    python tests/sync_worker.py publish RUN_DIR FIRST_VERSION COUNT SIZE_MB
    python tests/sync_worker.py churn RUN_DIR SEED SECONDS DELAY_S
    python tests/sync_worker.py explore RUN_DIR NAME SEED SECONDS DELAY_S
    python tests/sync_worker.py delta RUN_DIR FIRST_VERSION COUNT LOCAL_DIR

``publish`` writes versions FIRST_VERSION.. with a model.safetensors of SIZE_MB written slowly
in 1 MiB chunks, so a kill at a random moment usually lands inside a write.

``churn`` is a trainer that often resumes from an earlier step: it publishes the next version,
or republishes the newest or an older one (a new copy), keeps one version, and acts on
heartbeats DELAY_S after reading them (a shared filesystem shows them late). Every shard of a
copy holds ``<version>:<copy token>``.

``delta`` publishes versions FIRST_VERSION.. as deltas (an anchor every 3), each version's
tensors :func:`delta_weights` (so a reader can check every byte), killed at a random moment.

``explore`` is an explorer (Heartbeat + WeightsWatcher) that loads each new version, up to
DELAY_S after it read the pointer, with a loader reading the shards one by one with sleeps
between them, and prints one JSON line per load: ``{"version", "ok", "read"}`` (``read``: the shard contents it got before it stopped).
"""

from __future__ import annotations

import json
import logging
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rft.lease import Lease  # noqa: E402
from rft.rundir import TRAINER_LEASE  # noqa: E402
from rft.sync.heartbeat import Heartbeat  # noqa: E402
from rft.sync.local import DeltaPolicy  # noqa: E402
from rft.sync.publisher import WeightsPublisher  # noqa: E402
from rft.sync.watcher import WeightsWatcher  # noqa: E402

CHUNK = b"\x01" * (1 << 20)
SHARDS = 3
SHARD_READ_DELAY_S = 0.02  # most sleep before each shard file is opened


def write_weights(folder: Path, size_mb: int) -> None:
    (folder / "config.json").write_text('{"model_type": "llama"}')
    with open(folder / "model.safetensors", "wb") as f:
        for _ in range(size_mb):
            f.write(CHUNK)
            time.sleep(0.005)


def write_shards(folder: Path, content: str) -> None:
    for i in range(SHARDS):
        (folder / f"shard-{i}.bin").write_text(content)


def read_shards(folder: Path, rng: random.Random, read: list[str]) -> None:
    for i in range(SHARDS):
        time.sleep(rng.uniform(0, SHARD_READ_DELAY_S))
        read.append((folder / f"shard-{i}.bin").read_text())


class LateSightPublisher(WeightsPublisher):
    """Acts on heartbeats ``delay_s`` after reading them."""

    def __init__(self, *args, delay_s: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.delay_s = delay_s

    def explorers_naming(self, *args, **kwargs):
        names = super().explorers_naming(*args, **kwargs)
        time.sleep(self.delay_s)
        return names


def publish(run_dir: str, first: int, count: int, size_mb: int) -> None:
    publisher = WeightsPublisher(run_dir, keep_versions=2)
    print("started", flush=True)  # the test's kill timer starts here, not at interpreter start
    for version in range(first, first + count):
        publisher.publish(version, lambda folder: write_weights(folder, size_mb))


def delta_weights(version: int, numel: int = 1 << 21) -> dict:
    """Version ``version``'s tensors: fixed random weights, the first 1% moved by the version."""
    import torch

    w = torch.randn(numel, generator=torch.Generator().manual_seed(0))
    w[: numel // 100] += version * 1e-3
    return {"w": w, "h": w[: numel // 4].bfloat16()}


def write_delta_weights(folder: Path, version: int) -> None:
    from safetensors.torch import save_file

    (folder / "config.json").write_text('{"model_type": "llama"}')
    save_file(delta_weights(version), folder / "model.safetensors")


def publish_deltas(run_dir: str, first: int, count: int, local_dir: str) -> None:
    policy = DeltaPolicy(anchor_interval=3, local_dir=local_dir)
    publisher = WeightsPublisher(run_dir, keep_versions=2, delta=policy)
    print("started", flush=True)
    for version in range(first, first + count):
        publisher.publish(version, lambda folder: write_delta_weights(folder, version))


def churn(run_dir: str, seed: int, seconds: float, delay_s: float) -> None:
    rng = random.Random(seed)
    # a running trainer holds its lease: watchers then wait out a republish's gap (rft.sync)
    Lease.acquire(run_dir, TRAINER_LEASE, interval_s=0.5, stale_s=60.0, env={}).start()
    publisher = LateSightPublisher(run_dir, keep_versions=1, delay_s=delay_s)
    version, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        if version == 0 or rng.random() < 0.7:
            version += 1
        else:  # resumed from an earlier step: republish the newest version or an older one
            version = max(1, version - rng.randrange(3))
        content = f"{version}:{rng.getrandbits(64):016x}"
        publisher.publish(version, lambda folder: write_shards(folder, content))
        time.sleep(rng.uniform(0, 0.02))


def explore(run_dir: str, name: str, seed: int, seconds: float, delay_s: float) -> None:
    rng = random.Random(seed)
    heartbeat = Heartbeat(run_dir, name, interval_s=0.5).start()
    watcher = WeightsWatcher(run_dir, heartbeat=heartbeat)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = watcher.poll()
        if found is None:
            time.sleep(0.002)
            continue
        time.sleep(rng.uniform(0, delay_s))  # the pointer it read is that old when it loads
        read: list[str] = []
        ok = watcher.load(found[0], lambda folder: read_shards(folder, rng, read))
        print(json.dumps({"version": found[0], "ok": ok, "read": read}), flush=True)
    heartbeat.stop()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(relativeCreated)d %(name)s %(message)s")
    role, args = sys.argv[1], sys.argv[2:]
    if role == "publish":
        publish(args[0], *map(int, args[1:4]))
    elif role == "churn":
        churn(args[0], int(args[1]), float(args[2]), float(args[3]))
    elif role == "delta":
        publish_deltas(args[0], int(args[1]), int(args[2]), args[3])
    elif role == "explore":
        explore(args[0], args[1], int(args[2]), float(args[3]), float(args[4]))
    else:
        sys.exit(f"unknown role {role!r}: publish, churn or explore")
