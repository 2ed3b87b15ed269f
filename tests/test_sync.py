"""Weight sync through version folders and the pointer file, and explorer heartbeats, on real
files and a publisher process killed mid-write."""

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

from rft import atomic
from rft.errors import CheckpointError
from rft.rundir import WEIGHTS_POINTER, weights_dir
from rft.sync import (
    COMPLETE_MARKER,
    Heartbeat,
    WeightsPublisher,
    WeightsWatcher,
    is_complete,
    latest_weights,
    list_versions,
    live_explorers,
    read_heartbeats,
)

WORKER = str(Path(__file__).parent / "sync_worker.py")
SIZE_MB = 8


def write_tiny(folder: Path) -> None:
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"\0" * 1000)


def test_publish_then_watch(tmp_path):
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text("{}")
    watcher = WeightsWatcher(tmp_path)
    assert watcher.poll() is None
    folder = WeightsPublisher(tmp_path).publish(12, write_tiny, extra_files=[tokenizer])
    assert folder == tmp_path / "weights" / "v000012"
    assert sorted(os.listdir(folder)) == sorted([COMPLETE_MARKER, "config.json",
                                                 "model.safetensors", "tokenizer.json"])
    assert (tmp_path / WEIGHTS_POINTER).read_text() == "12\n"
    assert watcher.poll() == (12, folder)
    watcher.finish_load(12)
    assert watcher.poll() is None
    with pytest.raises(CheckpointError, match="empty"):
        WeightsPublisher(tmp_path).publish(13, lambda folder: None)
    assert list_versions(tmp_path) == [12] and atomic.read_pointer(tmp_path / WEIGHTS_POINTER) == 12
    assert not [p for p in (tmp_path / "weights").iterdir() if atomic.is_tmp(p)]


def test_watcher_never_returns_an_incomplete_folder(tmp_path):
    publisher = WeightsPublisher(tmp_path)
    publisher.publish(1, write_tiny)
    folder = weights_dir(tmp_path, 2)  # e.g. copied in by hand, or damaged
    folder.mkdir()
    write_tiny(folder)
    atomic.write_pointer(tmp_path / WEIGHTS_POINTER, 2)
    assert WeightsWatcher(tmp_path).poll() is None
    publisher.publish(3, write_tiny)
    (weights_dir(tmp_path, 3) / "model.safetensors").write_bytes(b"\0" * 10)  # truncated
    assert not is_complete(weights_dir(tmp_path, 3)) and latest_weights(tmp_path) is None


def test_publisher_killed_mid_write_never_exposes_an_incomplete_folder(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    rng, watcher, seen, interrupted = random.Random(0), WeightsWatcher(tmp_path), set(), 0
    for round_ in range(8):
        cmd = [sys.executable, WORKER, str(tmp_path), str(3 * round_ + 1), "3", str(SIZE_MB)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline() == "started\n"
        deadline = time.monotonic() + rng.uniform(0.02, 0.4)
        while time.monotonic() < deadline:
            found = watcher.poll()
            if found:
                version, folder = found
                assert (folder / "model.safetensors").stat().st_size == SIZE_MB << 20
                seen.add(version)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        pointer = atomic.read_pointer(tmp_path / WEIGHTS_POINTER)
        assert pointer is None or is_complete(weights_dir(tmp_path, pointer))
        found = watcher.poll() or latest_weights(tmp_path)
        assert found is None or is_complete(found[1])
        weights = tmp_path / "weights"
        interrupted += any(atomic.is_tmp(p) for p in weights.iterdir()) if weights.exists() else 0
    assert interrupted, "no kill landed inside a write; the test did not test anything"
    assert seen, "the watcher never saw a published version"
    WeightsPublisher(tmp_path).clean_stale_tmp()  # a restarted trainer on this host
    assert not [p for p in tmp_path.rglob("*") if atomic.is_tmp(p)]


def test_keep_k_versions_spares_live_explorers(tmp_path):
    with Heartbeat(tmp_path, "explorer-0", interval_s=0.05) as live:
        live.beat(loaded_version=1)
        dead = Heartbeat(tmp_path, "explorer-1")
        dead.beat(loading_version=2)
        stale = json.loads(dead.path.read_text())
        atomic.write_json(dead.path, {**stale, "time": time.time() - 100})  # stopped beating
        publisher = WeightsPublisher(tmp_path, keep_versions=2, heartbeat_live_s=30)
        for version in range(1, 6):
            publisher.publish(version, write_tiny)
        assert list_versions(tmp_path) == [1, 4, 5]
        live.beat(loaded_version=5)
    publisher.publish(6, write_tiny)
    assert list_versions(tmp_path) == [5, 6]  # explorer-0 exited: nothing protects v1 now


def test_republish_after_resume_replaces_and_prunes_orphans(tmp_path):
    publisher = WeightsPublisher(tmp_path, keep_versions=2)
    for version in range(1, 5):
        publisher.publish(version, write_tiny)
    # the trainer resumes from its step-2 checkpoint: versions 3 and 4 came from a lost future
    publisher.publish(3, lambda folder: (folder / "model.safetensors").write_bytes(b"new"))
    assert list_versions(tmp_path) == [3]  # v2 went when v4 came; v4 is an orphan
    assert (weights_dir(tmp_path, 3) / "model.safetensors").read_bytes() == b"new"
    watcher = WeightsWatcher(tmp_path, loaded_version=4)
    assert watcher.poll() == (3, weights_dir(tmp_path, 3))  # follow the trainer back


def test_watcher_announces_loads_in_its_heartbeat(tmp_path):
    heartbeat = Heartbeat(tmp_path, "explorer-0")
    watcher = WeightsWatcher(tmp_path, heartbeat=heartbeat)
    WeightsPublisher(tmp_path).publish(7, write_tiny)
    version, _folder = watcher.poll()
    assert watcher.begin_load(version) == weights_dir(tmp_path, 7)
    assert json.loads(heartbeat.path.read_text())["loading_version"] == 7
    watcher.finish_load(version)
    fields = json.loads(heartbeat.path.read_text())
    assert (fields["loaded_version"], fields["loading_version"]) == (7, None)
    assert watcher.begin_load(8) is None  # never published


def test_heartbeats_live_and_dead(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    beat = Heartbeat(tmp_path, "explorer-0", interval_s=0.05).start()
    Heartbeat(tmp_path, "explorer-1").beat(steps_done=3)
    first = json.loads(beat.path.read_text())["time"]
    time.sleep(0.3)
    fields = json.loads(beat.path.read_text())
    assert fields["time"] > first, "the background thread keeps beating"
    assert (fields["slurm_job_id"], fields["pid"]) == ("4242", os.getpid())
    assert live_explorers(tmp_path, live_threshold_s=10) == ["explorer-0", "explorer-1"]
    later = time.time() + 20  # explorer-1 stopped beating 20 s ago
    beat.beat()
    statuses = read_heartbeats(tmp_path, live_threshold_s=30, now=later)
    assert [s.live for s in statuses] == [True, True]
    statuses = read_heartbeats(tmp_path, live_threshold_s=10, now=later)
    assert [s.live for s in statuses] == [False, False] and statuses[1].fields["steps_done"] == 3
    beat.stop()
    assert live_explorers(tmp_path, live_threshold_s=10) == ["explorer-1"]  # exited: dead at once
    (tmp_path / "explorers" / "broken.json").write_text("{")
    assert [s.name for s in read_heartbeats(tmp_path) if not s.live] == ["broken", "explorer-0"]
