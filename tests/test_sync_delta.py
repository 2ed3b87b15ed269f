"""Delta sync: the XOR+zstd encoding on hand-made tensors, delta folders published and rebuilt
node-locally, and the faults (a publisher killed mid-delta, a corrupt tensor, a deleted anchor)
that must never end in a mixed or partial load."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rft.rundir import weights_dir
from rft.sync.delta import (
    DELTA_PAYLOAD,
    DeltaError,
    apply_folder,
    checksum,
    decode_tensor,
    encode_tensor,
)
from rft.sync.heartbeat import Heartbeat
from rft.sync.local import ANCHOR_DIR, DeltaPolicy, LocalCopy
from rft.sync.publisher import WeightsPublisher
from rft.sync.versions import (
    DELTA_INDEX,
    delta_base,
    is_complete,
    list_versions,
    read_weights_pointer,
)
from rft.sync.watcher import WeightsWatcher

sys.path.insert(0, str(Path(__file__).parent))
from sync_worker import delta_weights, write_delta_weights  # noqa: E402

WORKER = str(Path(__file__).parent / "sync_worker.py")
SPECIALS = [0.0, -0.0, 1.0, -2.5, float("inf"), float("-inf"), float("nan"), 1e-38, 3.4e38]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_is_bit_exact(dtype):
    base = torch.tensor(SPECIALS * 3, dtype=dtype).reshape(3, 9)
    new = base.clone()
    new[0, 2] = 1.0078125  # one mantissa bit up in both dtypes
    new[2] = torch.tensor(SPECIALS[::-1], dtype=dtype)
    frame, crc = encode_tensor(new, base)
    out = decode_tensor(frame, base, crc)
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[dtype]
    assert out.dtype == dtype and out.shape == new.shape
    assert torch.equal(out.view(ints), new.view(ints))  # bits, NaN and -0.0 included


def test_the_xor_is_of_the_bit_patterns():
    import zstandard

    base, new = torch.tensor([1.0, 3.0]), torch.tensor([2.0, 3.0])
    frame, crc = encode_tensor(new, base)
    xor = torch.frombuffer(
        bytearray(zstandard.ZstdDecompressor().decompress(frame)), dtype=torch.int32
    )
    assert xor.tolist() == [0x3F800000 ^ 0x40000000, 0]  # 1.0 ^ 2.0; equal floats give 0
    assert crc == checksum(new.numpy().tobytes())


def test_a_corrupt_frame_or_another_base_is_detected():
    base = torch.randn(256, generator=torch.Generator().manual_seed(1)).bfloat16()
    new = base + 0.01
    frame, crc = encode_tensor(new, base)
    damaged = bytearray(frame)
    damaged[len(damaged) // 2] ^= 0xFF
    with pytest.raises(DeltaError):
        decode_tensor(bytes(damaged), base, crc)
    with pytest.raises(DeltaError, match="checksum"):
        decode_tensor(frame, base.clone().fill_(1.0), crc)
    with pytest.raises(DeltaError, match="checksum"):
        decode_tensor(frame, base, crc ^ 1)


def delta_publisher(run_dir: Path, local: Path, interval: int = 3, last: int | None = None):
    policy = DeltaPolicy(anchor_interval=interval, local_dir=str(local), last_version=last)
    return WeightsPublisher(run_dir, keep_versions=1, delta=policy)


def publish(publisher: WeightsPublisher, version: int, numel: int = 4096) -> None:
    publisher.publish(version, lambda folder: _write(folder, version, numel))


def _write(folder: Path, version: int, numel: int) -> None:
    from safetensors.torch import save_file

    (folder / "config.json").write_text('{"model_type": "llama"}')
    save_file(delta_weights(version, numel), folder / "model.safetensors")


class Engine:
    """Loads a folder's tensors; records the versions they are (by comparing to the truth)."""

    def __init__(self) -> None:
        self.loaded: list[int] = []
        self.numel = 4096

    def reload(self, folder: Path) -> None:
        tensors = load_file(folder / "model.safetensors")
        for version in range(0, 64):
            truth = delta_weights(version, self.numel)
            if all(torch.equal(tensors[k], truth[k]) for k in truth):
                self.loaded.append(version)
                return
        raise AssertionError(f"{folder} holds weights of no version: a mix")


def explorer(run_dir: Path, local: Path, name: str = "explorer-0") -> WeightsWatcher:
    heartbeat = Heartbeat(run_dir, name)
    return WeightsWatcher(run_dir, 0, heartbeat, local=LocalCopy(run_dir, local / name))


def sync(watcher: WeightsWatcher, engine: Engine) -> int | None:
    found = watcher.poll()
    if found is not None:
        watcher.load(found[0], engine.reload)
    return watcher.loaded_version


def test_deltas_between_anchors_rebuild_every_version_and_prune_keeps_the_anchor(tmp_path):
    run, local = tmp_path / "run", tmp_path / "local"
    publisher, watcher, engine = delta_publisher(run, local, last=6), None, Engine()
    watcher = explorer(run, local)
    for version in range(1, 7):
        publish(publisher, version)
        assert sync(watcher, engine) == version
    kinds = {v: delta_base(weights_dir(run, v)) for v in list_versions(run)}
    assert engine.loaded == [1, 2, 3, 4, 5, 6]
    # anchors at 1 and 4 (every 3), 6 is the last step: full; v4 went once nothing named v1-3
    assert kinds == {4: None, 5: 4, 6: None}
    full = (weights_dir(run, 6) / "model.safetensors").stat().st_size
    delta = (weights_dir(run, 5) / DELTA_PAYLOAD).stat().st_size
    assert delta < full / 2, (delta, full)  # 1% of the weights moved


def test_prune_never_removes_the_anchor_of_a_kept_delta(tmp_path):
    run, local = tmp_path / "run", tmp_path / "local"
    publisher = delta_publisher(run, local, interval=8)
    for version in range(1, 5):
        publish(publisher, version)
    assert list_versions(run) == [1, 4]  # keep_versions=1, and v4's anchor
    assert delta_base(weights_dir(run, 4)) == 1


def corrupt_one_tensor(folder: Path) -> None:
    index = json.loads((folder / DELTA_INDEX).read_text())
    _name, _a, _b, _size, offset, length, _crc = index["files"]["model.safetensors"]["tensors"][0]
    payload = bytearray((folder / DELTA_PAYLOAD).read_bytes())
    payload[offset + length // 2] ^= 0x55  # same size: the completion marker still holds
    (folder / DELTA_PAYLOAD).write_bytes(bytes(payload))


def test_a_corrupt_delta_is_never_loaded_and_the_run_goes_on(tmp_path):
    run, local = tmp_path / "run", tmp_path / "local"
    publisher, engine = delta_publisher(run, local, interval=8), Engine()
    publish(publisher, 1)
    publish(publisher, 2)
    corrupt_one_tensor(weights_dir(run, 2))
    fresh = explorer(run, local, "explorer-1")  # holds version 0: falls back to the anchor
    fresh_engine = Engine()
    assert sync(fresh, fresh_engine) == 0 and fresh_engine.loaded == []  # refused, untouched
    assert sync(fresh, fresh_engine) == 1 and fresh_engine.loaded == [1]  # the anchor
    assert sync(fresh, fresh_engine) == 1  # not the corrupt copy again
    publish(publisher, 3)
    assert sync(fresh, fresh_engine) == 3 and fresh_engine.loaded == [1, 3]
    assert not list((local / "explorer-1").glob("v*.tmp*"))  # no half-built folder left
    assert engine.loaded == []


def test_a_deleted_anchor_under_a_live_explorer(tmp_path):
    import shutil

    run, local = tmp_path / "run", tmp_path / "local"
    publisher, engine = delta_publisher(run, local, interval=8), Engine()
    watcher = explorer(run, local)
    publish(publisher, 1)
    assert sync(watcher, engine) == 1
    shutil.rmtree(weights_dir(run, 1))  # its local copy carries on
    publish(publisher, 2)
    assert sync(watcher, engine) == 2
    late = explorer(run, local, "explorer-1")  # no local copy, no anchor: nothing it can load
    late_engine = Engine()
    assert sync(late, late_engine) == 0 and late_engine.loaded == []
    shutil.rmtree(local / "explorer-0" / ANCHOR_DIR)  # and a local copy gone too
    publish(publisher, 3)
    assert sync(watcher, engine) == 2 and engine.loaded == [1, 2]  # keeps v2, whole
    assert sync(late, late_engine) == 0


def test_a_local_anchor_that_does_not_rebuild_is_fetched_again(tmp_path):
    run, local = tmp_path / "run", tmp_path / "local"
    publisher, engine = delta_publisher(run, local, interval=8), Engine()
    watcher = explorer(run, local)
    publish(publisher, 1)
    assert sync(watcher, engine) == 1
    anchor_file = local / "explorer-0" / ANCHOR_DIR / "model.safetensors"
    data = bytearray(anchor_file.read_bytes())
    data[-3] ^= 0x01  # bit rot on the node's disk
    anchor_file.write_bytes(bytes(data))
    publish(publisher, 2)
    assert sync(watcher, engine) == 2 and engine.loaded == [1, 2]


def test_apply_leaves_nothing_when_a_checksum_fails(tmp_path):
    run, local = tmp_path / "run", tmp_path / "local"
    publisher = delta_publisher(run, local, interval=8)
    publish(publisher, 1)
    publish(publisher, 2)
    corrupt_one_tensor(weights_dir(run, 2))
    with pytest.raises(DeltaError):
        apply_folder(weights_dir(run, 2), weights_dir(run, 1), tmp_path / "out")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("out")]


def test_a_publisher_killed_mid_delta_leaves_whole_versions_only(tmp_path):
    run, local = tmp_path / "run", tmp_path / "local"
    left: list[str] = []  # temporaries the killed publisher left: it died inside a publish
    for seed in range(3):
        proc = subprocess.Popen(
            [sys.executable, WORKER, "delta", str(run), str(1 + 20 * seed), "20", str(local)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout.readline().strip() == "started"
        deadline = time.monotonic() + 120
        while (read_weights_pointer(run) or 0) < 1 + 20 * seed and time.monotonic() < deadline:
            time.sleep(0.01)  # its first version is out (a loaded machine may take seconds)
        time.sleep(random.Random(seed).uniform(0.0, 1.0))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        pointer = read_weights_pointer(run)
        assert pointer is not None and is_complete(weights_dir(run, pointer))
        engine = Engine()
        engine.numel = 1 << 21
        watcher = explorer(run, local, f"explorer-{seed}")
        assert sync(watcher, engine) == pointer and engine.loaded == [pointer]
        left += [p.name for p in (run / "weights").iterdir() if ".tmp" in p.name]
        publisher = WeightsPublisher(run, keep_versions=2, delta=DeltaPolicy(3, str(local)))
        assert not [p for p in (run / "weights").iterdir() if ".tmp" in p.name]
        publisher.publish(pointer + 1, lambda folder: write_delta_weights(folder, pointer + 1))
        assert sync(watcher, engine) == pointer + 1 and engine.loaded == [pointer, pointer + 1]
    assert left, "no kill landed inside a publish"


def test_a_next_stage_never_starts_from_a_delta(tmp_path):
    from rft.config.load import load_config, stage_config
    from rft.errors import ConfigError
    from rft.stages import resolve

    config = Path(__file__).resolve().parent.parent / "configs" / "sft_warmup.yaml"
    cfg = load_config(config, [f"checkpoint_root_dir={tmp_path}"])
    first = stage_config(cfg, 0).run_dir
    publisher = delta_publisher(first, tmp_path / "local", interval=8)
    publish(publisher, 1)
    assert resolve(cfg, 1).model.model_path == str(weights_dir(first, 1))
    publish(publisher, 2)  # the stage stopped here: its pointer names a delta
    with pytest.raises(ConfigError, match="a delta folder"):
        resolve(cfg, 1)
