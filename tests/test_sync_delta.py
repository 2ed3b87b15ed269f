"""Delta sync: the XOR+zstd encoding on hand-made tensors, delta folders published and rebuilt
node-locally, and the faults (a publisher killed mid-delta, a corrupt tensor, a deleted anchor)
that must never end in a mixed or partial load."""

from __future__ import annotations

import json
import os
import random
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from rft.rundir import weights_dir
from rft.safetensors_io import TensorSpec
from rft.sync.delta import (
    SPARSE,
    XOR,
    DeltaError,
    Frame,
    apply,
    checksum,
    decode_tensor,
    encode_tensor,
    tensor_bytes,
)
from rft.sync.delta_files import DELTA_PAYLOAD, FileMaps, apply_folder
from rft.sync.heartbeat import Heartbeat
from rft.sync.local import ANCHOR_DIR, DeltaPolicy, LocalCopy, StreamedFolder
from rft.sync.publisher import WeightsPublisher
from rft.sync.versions import (
    COMPLETE_MARKER,
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
    out = decode_tensor(encode_tensor(new, base), base)
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[dtype]
    assert out.dtype == dtype and out.shape == new.shape
    assert torch.equal(out.view(ints), new.view(ints))  # bits, NaN and -0.0 included


def _bits(t: torch.Tensor) -> list[int]:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()]).tolist()


def _zstd(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor(level=1).compress(data)  # as the codec: no zstd checksum


def _unzstd(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdDecompressor().decompress(data)


def test_a_sparse_frame_holds_gaps_and_xored_values():
    base = torch.zeros(4096, dtype=torch.bfloat16)
    new = base.clone()
    # bf16 bits 0x3F80, 0x3F00 and 0xC000; the base's are 0. 3 and 5 are in one 8-byte word
    # (elements 0-3 and 4-7 are the words compared), 1000 in another
    new[3], new[5], new[1000] = 1.0, 0.5, -2.0
    frame = encode_tensor(new, base)
    assert frame.kind == SPARSE and frame.crc == checksum(frame.data)
    raw = _unzstd(frame.data)
    assert struct.unpack("<3I3H", raw) == (3, 2, 995, 0x3F80, 0x3F00, 0xC000)  # gaps, values


def test_an_xor_frame_is_of_the_bit_patterns():
    base, new = torch.tensor([1.0, 3.0]), torch.tensor([2.0, 3.0])
    frame = encode_tensor(new, base)  # 1 of 2 changed: a sparse frame would be 8 bytes raw
    assert frame.kind == XOR
    xor = struct.unpack("<2I", _unzstd(frame.data))
    assert xor == (0x3F800000 ^ 0x40000000, 0)  # 1.0 ^ 2.0; equal floats give 0
    assert frame.crc == checksum(frame.data)


def _sparse_size(new: torch.Tensor, base: torch.Tensor) -> int:
    a, b = (torch.tensor(_bits(t), dtype=torch.int64) for t in (new, base))
    positions = torch.nonzero(a != b).flatten()
    gaps = torch.diff(positions, prepend=torch.tensor([0]))
    values = [(x ^ y) & 0xFFFF for x, y in zip(a[positions].tolist(), b[positions].tolist())]
    raw = struct.pack(f"<{len(gaps)}I{len(values)}H", *gaps.tolist(), *values)
    return len(_zstd(raw))


@pytest.mark.parametrize("changed", ["block", "scattered"])
def test_the_smaller_kind_is_kept(changed):
    """1300 of 4096 bf16 elements flip their last bit: sparse would be 7800 bytes raw, past
    1/16 of the tensor, so both are coded. In one block the XOR is a run (zstd: a few bytes);
    scattered, the gaps and values code smaller than the XOR's zero runs."""
    base = (torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 0.02).bfloat16()
    if changed == "block":
        positions = torch.arange(1300)
    else:
        positions = torch.randperm(4096, generator=torch.Generator().manual_seed(1))[:1300]
    new = base.clone()
    new.view(torch.int16)[positions] ^= 1
    xor = torch.tensor(_bits(new)) ^ torch.tensor(_bits(base))
    sizes = {
        XOR: len(_zstd(xor.to(torch.int16).numpy().tobytes())),
        SPARSE: _sparse_size(new, base),
    }
    frame = encode_tensor(new, base)
    assert len(frame.data) == min(sizes.values()) and sizes[frame.kind] == len(frame.data)
    assert frame.kind == (XOR if changed == "block" else SPARSE), sizes
    assert torch.equal(decode_tensor(frame, base).view(torch.int16), new.view(torch.int16))


@pytest.mark.parametrize("share", [0.001, 0.3, 1.0])
@pytest.mark.parametrize(
    "dtype,numel",
    [
        (torch.bfloat16, 3000),
        (torch.bfloat16, 3001),
        (torch.float32, 1000),
        (torch.float32, 1001),
        (torch.uint8, 3001),
    ],
)
def test_round_trip_at_every_density(share, dtype, numel):
    """Byte sizes that are whole 8-byte words (compared a word at a time) and that are not."""
    g = torch.Generator().manual_seed(2)
    base = (torch.randn(numel, generator=g) * 50).to(dtype)
    new = base.clone()
    moved = torch.rand(numel, generator=g) < share
    new[moved] = (torch.randn(int(moved.sum()), generator=g) * 50).to(dtype)
    frame = encode_tensor(new, base)
    assert _bits(decode_tensor(frame, base)) == _bits(new), frame.kind


@pytest.mark.parametrize("moved", [3, 4096])  # a sparse frame, an XOR frame
def test_a_corrupt_frame_is_detected_before_anything_is_written(moved):
    base = torch.randn(4096, generator=torch.Generator().manual_seed(1)).bfloat16()
    new = base.clone()
    new[:moved] += 0.01
    frame = encode_tensor(new, base)
    assert frame.kind == (SPARSE if moved == 3 else XOR)
    damaged = bytearray(frame.data)
    damaged[len(damaged) // 2] ^= 0x01  # one bit
    out = np.full(base.numel() * 2, 0x7F, dtype=np.uint8)
    for bad in (
        Frame(frame.kind, bytes(damaged), frame.crc),
        Frame(frame.kind, frame.data, frame.crc ^ 1),
    ):
        with pytest.raises(DeltaError, match="checksum"):
            apply(bad, tensor_bytes(base), out, 2, None)
        assert (out == 0x7F).all()  # untouched
    assert _bits(decode_tensor(frame, base)) == _bits(new)


def test_a_sparse_frame_naming_an_element_past_the_end_is_refused():
    base = torch.zeros(8, dtype=torch.bfloat16)
    data = _zstd(struct.pack("<IH", 8, 1))  # element 8 of 8
    frame = Frame(SPARSE, data, checksum(data))
    with pytest.raises(DeltaError, match="names element 8 of 8"):
        decode_tensor(frame, base)


def test_apply_in_place_rewrites_the_elements_the_last_version_changed():
    """out holds v1 (elements 1 and 5 moved from the anchor); v2 moved 5 and 9: element 1 must
    go back to the anchor's bits, and an unknown out (None) is rebuilt whole."""
    anchor = torch.zeros(16, dtype=torch.bfloat16)
    v1, v2 = anchor.clone(), anchor.clone()
    v1[1], v1[5] = 1.0, 2.0
    v2[5], v2[9] = 3.0, 4.0
    base = tensor_bytes(anchor)
    out = base.copy()
    dirty = apply(encode_tensor(v1, anchor), base, out, 2, np.empty(0, np.int64))
    assert dirty.tolist() == [1, 5] and _bits(torch.from_numpy(out).view(torch.bfloat16)) == _bits(
        v1
    )
    dirty = apply(encode_tensor(v2, anchor), base, out, 2, dirty)
    assert dirty.tolist() == [5, 9]
    assert _bits(torch.from_numpy(out).view(torch.bfloat16)) == _bits(v2)
    out[:] = 0x7F  # unknown contents
    apply(encode_tensor(v1, anchor), base, out, 2, None)
    assert _bits(torch.from_numpy(out).view(torch.bfloat16)) == _bits(v1)


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
        base = delta_weights(0, self.numel)["w"]
        # the version its first weight says (delta_weights moves it by version * 1e-3), then
        # every byte of every tensor checked against that version's
        version = round(float(tensors["w"][0] - base[0]) / 1e-3)
        truth = delta_weights(version, self.numel)
        if version < 0 or not all(torch.equal(tensors[k], truth[k]) for k in truth):
            raise AssertionError(f"{folder} holds weights of no version: a mix")
        self.loaded.append(version)


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
    _name, _a, _b, _size, offset, length, _crc, _kind = index["files"]["model.safetensors"][
        "tensors"
    ][0]
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


def test_a_damaged_index_that_still_parses_is_never_applied(tmp_path):
    from rft.errors import DeltaError
    from rft.sync.versions import DELTA_INDEX, delta_base, read_index

    run, local = tmp_path / "run", tmp_path / "local"
    publisher = delta_publisher(run, local, interval=8)
    publish(publisher, 1)
    publish(publisher, 2)
    index = weights_dir(run, 2) / DELTA_INDEX
    text = index.read_text()
    at = next(i for i in range(text.index('"files"'), len(text)) if text[i].isdigit())
    digit = int(text[at])
    index.write_text(text[:at] + str(digit + 1 if digit < 9 else digit - 1) + text[at + 1 :])
    with pytest.raises(DeltaError, match="does not match its crc32"):
        read_index(weights_dir(run, 2))  # one offset or size moved: parses, same size
    assert delta_base(weights_dir(run, 2)) is None  # nothing to spare or fall back to
    damaged = index.read_text()
    index.write_text("{not json")  # unreadable: a damaged delta, never a full folder
    with pytest.raises(DeltaError, match="unreadable"):
        read_index(weights_dir(run, 2))
    index.write_text(damaged)
    fresh, fresh_engine = explorer(run, local, "explorer-1"), Engine()
    assert sync(fresh, fresh_engine) == 0 and fresh_engine.loaded == []  # refused, untouched
    publish(publisher, 3)
    assert sync(fresh, fresh_engine) == 3 and fresh_engine.loaded == [3]  # the run goes on


def test_a_deleted_anchor_under_a_live_explorer(tmp_path):
    import shutil

    run, local = tmp_path / "run", tmp_path / "local"
    publisher, engine = delta_publisher(run, local, interval=8), Engine()
    watcher = explorer(run, local)
    publish(publisher, 1)
    assert sync(watcher, engine) == 1
    shutil.rmtree(weights_dir(run, 1))
    publish(publisher, 2)  # the trainer sees its anchor gone: v2 is full, the new anchor
    assert delta_base(weights_dir(run, 2)) is None
    assert sync(watcher, engine) == 2
    late = explorer(run, local, "explorer-1")  # no local copy: v2 is whole anyway
    late_engine = Engine()
    assert sync(late, late_engine) == 2 and late_engine.loaded == [2]
    shutil.rmtree(local / "explorer-0" / ANCHOR_DIR)  # a local copy gone too: fetched again
    publish(publisher, 3)
    assert delta_base(weights_dir(run, 3)) == 2
    assert sync(watcher, engine) == 3 and engine.loaded == [1, 2, 3]
    assert sync(late, late_engine) == 3


def test_a_local_anchor_that_does_not_rebuild_is_fetched_again(tmp_path):
    run, local = tmp_path / "run", tmp_path / "local"
    publisher, engine = delta_publisher(run, local, interval=8), Engine()
    watcher = explorer(run, local)
    publish(publisher, 1)
    assert sync(watcher, engine) == 1
    anchor_file = local / "explorer-0" / ANCHOR_DIR / "model.safetensors"
    anchor_file.write_bytes(anchor_file.read_bytes()[:-3])  # the node's disk filled up
    publish(publisher, 2)
    assert sync(watcher, engine) == 2 and engine.loaded == [1, 2]


def test_apply_leaves_nothing_when_a_checksum_fails_or_the_base_differs(tmp_path):
    run, local = tmp_path / "run", tmp_path / "local"
    publisher = delta_publisher(run, local, interval=8)
    publish(publisher, 1)
    publish(publisher, 2)
    apply_folder(weights_dir(run, 2), weights_dir(run, 1), tmp_path / "ok")
    Engine().reload(tmp_path / "ok")
    other = delta_publisher(tmp_path / "other", local, interval=8)
    publish(other, 1)  # the same weights, another copy: another marker id
    with pytest.raises(DeltaError, match="not the anchor"):
        apply_folder(weights_dir(run, 2), weights_dir(tmp_path / "other", 1), tmp_path / "out")
    corrupt_one_tensor(weights_dir(run, 2))
    with pytest.raises(DeltaError):
        apply_folder(weights_dir(run, 2), weights_dir(run, 1), tmp_path / "out")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("out")]


def test_a_corrupt_delta_after_one_applied_in_place_keeps_the_engine_whole(tmp_path):
    """The explorer's copy holds v2; v3's first tensor is damaged (its other tensor checks out
    and may be written): refused, the engine keeps v2, and v4 loads whole."""
    run, local = tmp_path / "run", tmp_path / "local"
    publisher, engine = delta_publisher(run, local, interval=8), Engine()
    watcher = explorer(run, local)
    for version in (1, 2, 3, 4):
        publish(publisher, version)
        if version == 3:
            corrupt_one_tensor(weights_dir(run, 3))
        sync(watcher, engine)
    assert engine.loaded == [1, 2, 4]


def test_a_rebuild_that_fails_after_writing_is_not_trusted_again(tmp_path, monkeypatch):
    """v3's tensor ``h`` is written in place, then the rebuild fails (a disk error, say; on the
    retry over a fresh anchor copy too): the copy holds a mix, and its record of what differs
    from the anchor no longer holds. v4 carries v1's weights (no element differs from the
    anchor): rebuilt over the mix with that record, h would keep v3's changes."""
    import rft.sync.delta_files as delta_files

    run, local = tmp_path / "run", tmp_path / "local"
    publisher, engine = delta_publisher(run, local, interval=8), Engine()
    watcher = explorer(run, local)
    real_apply, failures = delta_files.apply, []

    def fails_after_writing(frame, base, out, itemsize, dirty):
        result = real_apply(frame, base, out, itemsize, dirty)
        if base.size == 1024 * 2 and engine.loaded == [1, 2] and len(failures) < 2:
            failures.append(True)  # h (1024 bf16) at v3, on both tries
            raise DeltaError("disk error after writing")
        return result

    monkeypatch.setattr(delta_files, "apply", fails_after_writing)
    for version in (1, 2, 3):
        publish(publisher, version)
        sync(watcher, engine)
    publisher.publish(4, lambda folder: _write(folder, 1, 4096))
    sync(watcher, engine)
    assert len(failures) == 2 and engine.loaded == [1, 2, 1]  # v4 read as v1's weights, whole


def test_a_publisher_killed_mid_delta_leaves_whole_versions_only(tmp_path):
    run, local = tmp_path / "run", tmp_path / "local"
    left: list[str] = []  # temporaries the killed publisher left: it died inside a publish
    for seed in range(3):
        first = 1 + 1000 * seed  # more versions than it can publish before the kill
        proc = subprocess.Popen(
            [sys.executable, WORKER, "delta", str(run), str(first), "1000", str(local)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout.readline().strip() == "started"
        deadline = time.monotonic() + 120
        while (read_weights_pointer(run) or 0) < first and time.monotonic() < deadline:
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


def streamed(version: int, numel: int = 4096) -> StreamedFolder:
    """Version ``version`` written as the trainer streams it: each tensor handed to the writer."""
    tensors = delta_weights(version, numel)

    def write(folder: Path, write_file) -> None:
        (folder / "config.json").write_text('{"model_type": "llama"}')
        specs = [TensorSpec(k, tuple(t.shape), t.dtype) for k, t in tensors.items()]
        write_file(folder / "model.safetensors", specs, lambda spec: tensors[spec.name])

    return StreamedFolder(write)


def test_a_streamed_delta_is_coded_from_the_tensors_with_no_full_file(tmp_path):
    run, local = tmp_path / "run", tmp_path / "local"
    publisher, engine = delta_publisher(run, local, interval=8), Engine()
    watcher = explorer(run, local)
    for version in (1, 2, 3, 4):
        publisher.publish(version, streamed(version))
        assert sync(watcher, engine) == version
    assert engine.loaded == [1, 2, 3, 4]  # v3 and v4 rebuilt in place over the last copy
    assert sorted(p.name for p in weights_dir(run, 4).iterdir()) == sorted(
        ["config.json", COMPLETE_MARKER, DELTA_INDEX, DELTA_PAYLOAD]
    )
    assert not list(publisher.delta.scratch.iterdir())  # nothing went through the scratch
    index = json.loads((weights_dir(run, 4) / DELTA_INDEX).read_text())
    # w: 40 of 4096 fp32 moved (raw sparse 320 bytes, under 1/16 of 16 KiB): sparse alone;
    # h: its first 40 of 1024 bf16 (240 bytes, over 1/16 of 2 KiB): both coded, the XOR's one
    # run of changes is the smaller
    kinds = {row[0]: row[7] for row in index["files"]["model.safetensors"]["tensors"]}
    assert kinds == {"w": SPARSE, "h": XOR}
    anchor = load_file(weights_dir(run, 1) / "model.safetensors")  # the full one, streamed
    assert all(torch.equal(anchor[k], t) for k, t in delta_weights(1, 4096).items())


def test_a_file_whose_layout_changed_goes_in_full_inside_the_delta(tmp_path):
    run, local = tmp_path / "run", tmp_path / "local"
    publisher, engine = delta_publisher(run, local, interval=8), Engine()
    watcher = explorer(run, local)
    for version, numel in ((1, 4096), (2, 4096), (3, 2048), (4, 4096)):
        publisher.publish(version, streamed(version, numel))
        engine.numel = numel
        assert sync(watcher, engine) == version
    assert engine.loaded == [1, 2, 3, 4]
    kinds = [delta_base(weights_dir(run, v)) for v in (3, 4)]
    assert kinds == [1, 1]  # both deltas against v1; v3's file went whole
    index = json.loads((weights_dir(run, 3) / DELTA_INDEX).read_text())
    assert index["files"] == {} and (weights_dir(run, 3) / "model.safetensors").is_file()


TRAINER_SCRIPT = """
import filecmp, sys, torch
from pathlib import Path
from rft.buffer.experience import Experience
from rft.config.load import config_from_dict
from rft.rundir import weights_dir
from rft.sync.local import DeltaWriter, LocalCopy
from rft.sync.versions import delta_base
from rft.trainer import engine
from rft.trainer.batching import collate, rows_from_experiences
from rft.trainer.weights_out import WeightsOut

model, root, local = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
cfg = config_from_dict({"mode": "train", "checkpoint_root_dir": str(root),
                        "model": {"model_path": model},
                        "trainer": {"zero_stage": 3, "precision": "fp32"},
                        "synchronizer": {"delta_sync": True, "delta_local_dir": str(local)}})
info = engine.init_distributed()
actor = engine.build_actor(cfg, info, 4)
weights = WeightsOut(cfg, info, None)
explorer = LocalCopy(cfg.run_dir, local / "explorer")
rows = rows_from_experiences([Experience("t", "g", [1, 2, 3], [5, 6, 7], logprobs=[-1.0] * 3)])
micro = collate(rows, [0], torch.zeros_like(rows.response_mask), rows.rollout_logprobs)
def no_scratch(*args):
    raise AssertionError("a delta coded from a full file written to scratch")
DeltaWriter._code_written = no_scratch
for version in (1, 2, 3, 4):
    if version > 1:
        logprob, _ = engine.forward_logprobs(actor.engine, micro, with_entropy=False)
        engine.backward(actor, logprob.sum())
        engine.optimizer_step(actor)
    if version < 4:
        weights.publish(version, actor)
    else:  # sync_method nccl's folder (owed, or a broadcast missed): from the gathered state
        weights._broadcast(version, actor, True)
    full = root / f"full-v{version}"
    full.mkdir()
    engine.stream_hf_folder(actor, full)
    folder = weights_dir(cfg.run_dir, version)
    rebuilt = explorer.folder_for(version, folder)
    same = filecmp.cmp(rebuilt / "model.safetensors", full / "model.safetensors", shallow=False)
    print("version", version, "base", delta_base(folder), "same", same)
weights.close()
engine.teardown(0)
"""


@pytest.mark.integration
def test_the_trainer_streams_deltas_from_its_zero3_gathers(tiny_model_dir, tmp_path):
    """WeightsOut with delta sync on a real ZeRO-3 actor (CPU): v1 in full, v2 and v3 (after
    optimizer steps) coded from each gathered tensor, v4 from the state a broadcast gathered
    (no full file in scratch either way); the explorer's rebuild is byte for byte the file the
    trainer writes in full from the same weights."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            TRAINER_SCRIPT,
            str(tiny_model_dir),
            str(tmp_path / "runs"),
            str(tmp_path / "local"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    logs = out.stdout[-2000:] + out.stderr[-4000:]
    for version, base in ((1, None), (2, 1), (3, 1), (4, 1)):
        assert f"version {version} base {base} same True" in out.stdout, logs


def test_file_maps_are_kept_until_the_file_changes(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x01" * 64)
    maps = FileMaps()
    first = maps.get(path, writable=True)
    first[0] = 7
    assert maps.get(path, writable=True) is first  # kept: writes through it fault no more
    assert path.read_bytes()[0] == 7  # and reach the file
    (tmp_path / "new").write_bytes(b"\x02" * 64)
    os.replace(tmp_path / "new", path)  # another file under the name: mapped again
    assert maps.get(path, writable=False)[0] == 2
    maps.drop(path)
    assert maps.get(path, writable=False) is not first
