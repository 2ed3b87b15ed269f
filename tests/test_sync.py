"""Weight sync through version folders and the pointer file, and explorer heartbeats, on real
files, a publisher process killed mid-write, and explorer processes loading slowly while a
publisher prunes and republishes under them."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from rft import atomic
from rft.errors import CheckpointError
from rft.rundir import WEIGHTS_POINTER, weights_dir
from rft.sync import publisher as publisher_module
from rft.sync.explorer_side import WeightsIn, open_weights_in
from rft.sync.heartbeat import (
    EVALUATING_FIELD,
    LOADED_FIELD,
    LOADING_FIELD,
    Heartbeat,
    evaluating_explorers,
    read_heartbeats,
)
from rft.sync.publisher import WeightsPublisher
from rft.sync.versions import (
    COMPLETE_MARKER,
    is_complete,
    latest_weights,
    list_versions,
    read_marker,
)
from rft.sync.watcher import WeightsWatcher
from tests.helpers.faults import fault_seed

WORKER = str(Path(__file__).parent / "sync_worker.py")
SIZE_MB = 8


def live_explorers(run_dir: Path, live_threshold_s: float) -> list[str]:
    return [s.name for s in read_heartbeats(run_dir, live_threshold_s) if s.live]


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
    assert sorted(os.listdir(folder)) == sorted(
        [COMPLETE_MARKER, "config.json", "model.safetensors", "tokenizer.json"]
    )
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
    with pytest.raises(CheckpointError, match="v000002 is missing or incomplete"):  # no trainer
        WeightsWatcher(tmp_path).poll()  # (with a running one: None, tests/test_weights_pointer)
    publisher.publish(3, write_tiny)
    (weights_dir(tmp_path, 3) / "model.safetensors").write_bytes(b"\0" * 10)  # truncated
    assert not is_complete(weights_dir(tmp_path, 3)) and latest_weights(tmp_path) is None


def test_publisher_killed_mid_write_never_exposes_an_incomplete_folder(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    rng, watcher, seen, interrupted = random.Random(0), WeightsWatcher(tmp_path), set(), 0
    for round_ in range(8):
        cmd = [
            sys.executable,
            WORKER,
            "publish",
            str(tmp_path),
            str(3 * round_ + 1),
            "3",
            str(SIZE_MB),
        ]
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


def test_a_launcher_sees_which_live_explorers_are_evaluating(tmp_path):
    """A finished trainer's explorers are stopped after a grace period unless a live heartbeat
    says an evaluation runs (the final weights' evaluation can outlast it)."""
    from rft.launch.local import EXPLORER_GRACE_S, explorers_overdue

    Heartbeat(tmp_path, "explorer-0").beat(**{EVALUATING_FIELD: True})
    Heartbeat(tmp_path, "explorer-1").beat()
    gone = Heartbeat(tmp_path, "explorer-2")
    gone.beat(**{EVALUATING_FIELD: True})
    gone.stop()  # exited: not evaluating any more, whatever it last said
    assert Heartbeat(tmp_path, "explorer-3").fields[EVALUATING_FIELD] is False
    assert evaluating_explorers(tmp_path, live_threshold_s=10) == ["explorer-0"]
    done = 1000.0
    assert not explorers_overdue(done, done + EXPLORER_GRACE_S - 1, [])  # within the grace
    assert explorers_overdue(done, done + EXPLORER_GRACE_S + 1, [])
    assert not explorers_overdue(done, done + 10 * EXPLORER_GRACE_S, ["explorer-0"])
    assert not explorers_overdue(None, done, [])  # the trainer still runs


# ----------------------------------------------------------------------------- faults under load


def shards(content: str) -> Callable[[Path], None]:
    """A write_fn: two shard files holding ``content``, the identity of one copy."""

    def write(folder: Path) -> None:
        for i in range(2):
            (folder / f"shard-{i}.bin").write_text(content)

    return write


class ShardEngine:
    """An engine stand-in: reload() reads the shards one by one; ``between()`` runs once
    after the first shard (the trainer acting meanwhile)."""

    def __init__(self, between: Callable[[], object] | None = None):
        self.between = between
        self.loads: list[list[str]] = []  # shard contents of every reload that returned

    def reload(self, folder: Path) -> float:
        read = [(folder / "shard-0.bin").read_text()]
        if self.between is not None:
            between, self.between = self.between, None
            between()
        read.append((folder / "shard-1.bin").read_text())
        self.loads.append(read)
        return 0.0


def late_publisher(run_dir: Path, keep_versions: int = 2) -> WeightsPublisher:
    """A publisher acting on heartbeats read before the explorer announced its load."""
    publisher = WeightsPublisher(run_dir, keep_versions)
    publisher.explorers_naming = lambda *args, **kwargs: []
    return publisher


def heartbeat_fields(heartbeat: Heartbeat) -> tuple:
    fields = json.loads(heartbeat.path.read_text())
    return fields[LOADED_FIELD], fields[LOADING_FIELD]


def test_republish_never_replaces_a_version_a_live_explorer_names(tmp_path):
    publisher = WeightsPublisher(tmp_path)
    publisher.publish(4, shards("4:old"))
    old_marker = read_marker(weights_dir(tmp_path, 4))
    loading = Heartbeat(tmp_path, "explorer-0")
    loading.beat(**{LOADING_FIELD: 4})
    publisher.publish(4, shards("4:new"))  # a resumed trainer, while explorer-0 reads v4
    assert read_marker(weights_dir(tmp_path, 4)) == old_marker
    loading.beat(**{LOADED_FIELD: 4, LOADING_FIELD: None})
    publisher.publish(4, shards("4:new"))
    assert (weights_dir(tmp_path, 4) / "shard-1.bin").read_text() == "4:old"
    assert atomic.read_pointer(tmp_path / WEIGHTS_POINTER) == 4
    assert not [p for p in (tmp_path / "weights").iterdir() if atomic.is_tmp(p)]
    loading.stop()  # exited: nothing names v4 any more
    publisher.publish(4, shards("4:new"))
    assert (weights_dir(tmp_path, 4) / "shard-1.bin").read_text() == "4:new"


def test_prune_decides_each_removal_from_heartbeats_read_right_before_it(tmp_path, monkeypatch):
    publisher = WeightsPublisher(tmp_path, keep_versions=3)
    for version in range(1, 4):
        publisher.publish(version, write_tiny)
    heartbeat = Heartbeat(tmp_path, "explorer-0")
    remove = publisher_module.remove_version

    def remove_then_announce(folder: Path) -> None:  # explorer-0 starts loading v2 meanwhile
        remove(folder)
        heartbeat.beat(**{LOADING_FIELD: 2})

    monkeypatch.setattr(publisher_module, "remove_version", remove_then_announce)
    publisher.keep_versions = 1
    assert publisher.prune() == [1]
    assert list_versions(tmp_path) == [2, 3]


def test_a_copy_replaced_mid_load_is_voided_then_loaded_whole(tmp_path):
    publisher = late_publisher(tmp_path)
    publisher.publish(5, shards("5:old"))
    heartbeat = Heartbeat(tmp_path, "explorer-0")
    watcher = WeightsWatcher(tmp_path, loaded_version=0, heartbeat=heartbeat)
    engine = ShardEngine(between=lambda: publisher.publish(5, shards("5:new")))
    assert watcher.load(5, engine.reload) is False
    assert engine.loads == [["5:old", "5:new"]]  # the mix that must not count as version 5
    assert watcher.loaded_version is None and heartbeat_fields(heartbeat) == (None, None)
    assert watcher.poll() == (5, weights_dir(tmp_path, 5))
    assert watcher.load(5, engine.reload) and engine.loads[-1] == ["5:new", "5:new"]
    assert heartbeat_fields(heartbeat) == (5, None) and watcher.poll() is None


def test_wait_for_retries_with_the_newest_when_a_folder_is_pruned_mid_load(tmp_path):
    publisher = late_publisher(tmp_path, keep_versions=1)
    publisher.publish(1, shards("1:a"))
    watcher = WeightsWatcher(tmp_path, loaded_version=0, heartbeat=Heartbeat(tmp_path, "e-0"))
    engine = ShardEngine(between=lambda: publisher.publish(2, shards("2:a")))  # prunes v1
    version, _reload_s, _wait_s = WeightsIn(watcher, engine, 10).wait_for(1)
    assert version == 2 and engine.loads == [["2:a", "2:a"]]  # v1's load hit a missing shard
    assert list_versions(tmp_path) == [2]


def test_a_load_error_on_an_intact_folder_is_raised(tmp_path):
    WeightsPublisher(tmp_path).publish(3, write_tiny)
    heartbeat = Heartbeat(tmp_path, "explorer-0")
    watcher = WeightsWatcher(tmp_path, loaded_version=0, heartbeat=heartbeat)

    def broken(folder: Path) -> None:
        raise ValueError("size mismatch for lm_head.weight")

    with pytest.raises(ValueError, match="size mismatch"):
        watcher.load(3, broken)
    assert watcher.loaded_version is None and heartbeat_fields(heartbeat) == (None, None)


def test_an_explorer_follows_a_republished_copy_of_its_version(tmp_path):
    publisher = WeightsPublisher(tmp_path)
    publisher.publish(3, shards("3:old"))
    watcher, engine = WeightsWatcher(tmp_path, loaded_version=0), ShardEngine()
    assert watcher.load(3, engine.reload) and watcher.poll() is None
    publisher.publish(3, shards("3:new"))  # no heartbeat named v3 when the trainer looked
    assert watcher.poll() == (3, weights_dir(tmp_path, 3))


def test_explorers_never_load_a_mix_nor_a_vanishing_folder_unnoticed(tmp_path):
    """Two explorer processes load every new version slowly (pointer read up to 0.3 s before
    the load, shards read with sleeps) while a publisher process publishes, republishes and
    prunes (keep 1), acting on heartbeats 50 ms after reading them."""
    seed = fault_seed("weights sync")  # timing still varies between replays
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    run = [sys.executable, WORKER]
    explorers = [
        subprocess.Popen(
            run + ["explore", str(tmp_path), f"explorer-{i}", str(seed + i), "4.5", "0.3"],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    subprocess.run(
        run + ["churn", str(tmp_path), str(seed), "4", "0.05"], env=env, check=True, timeout=60
    )
    loads = []
    for proc in explorers:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, "an explorer crashed (see its stderr above)"
        loads += [json.loads(line) for line in out.splitlines()]
    taken = [load for load in loads if load["ok"]]
    for load in taken:  # one whole copy of the version it was loaded as
        assert len(load["read"]) == 3 and len(set(load["read"])) == 1, load
        assert load["read"][0].startswith(f"{load['version']}:"), load
    noticed = [load for load in loads if not load["ok"]]
    print(
        f"{len(taken)} loads taken, {len(noticed)} voided or skipped "
        f"({sum(bool(load['read']) for load in noticed)} after reading shards)"
    )
    assert len(taken) >= 10
    assert noticed, "no folder vanished under an explorer: the test did not test the race"


def test_wait_for_zero_loads_the_newest_at_once_and_never_waits(tmp_path):
    """The streaming explorer polls with ``wait_for(0)`` between engine steps: no sleep."""
    engine = ShardEngine()
    weights = WeightsIn(WeightsWatcher(tmp_path, loaded_version=0), engine, timeout_s=30)
    start = time.monotonic()
    assert weights.wait_for(0)[0] == 0 and engine.loads == []  # nothing published yet
    publisher = WeightsPublisher(tmp_path)
    publisher.publish(1, shards("1:a"))
    publisher.publish(2, shards("2:a"))
    version, reload_s, wait_s = weights.wait_for(0)
    assert (version, engine.loads) == (2, [["2:a", "2:a"]])  # the newest only, v1 skipped
    assert weights.wait_for(0)[0] == 2 and len(engine.loads) == 1  # loaded already: no reload
    assert time.monotonic() - start < 0.9  # WEIGHTS_POLL_S is 1 s: no poll slept
    assert reload_s >= 0.0 and wait_s >= 0.0


def test_open_weights_in_wires_folders_deltas_and_broadcasts_from_the_config(tmp_path):
    from rft.config.load import load_config
    from rft.sync.local import DeltaPolicy

    config = Path(__file__).resolve().parent.parent / "configs" / "sft_warmup.yaml"
    local = tmp_path / "local"
    cfg = load_config(
        config,
        [
            f"checkpoint_root_dir={tmp_path}",
            "synchronizer.delta_sync=true",
            f"synchronizer.delta_local_dir={local}",
        ],
    )
    heartbeat = Heartbeat(cfg.run_dir, "explorer-0")
    weights = open_weights_in(cfg, "explorer-0", ShardEngine(), heartbeat)
    expected = DeltaPolicy(8, str(local)).scratch(cfg.run_dir, "explorer-0")
    assert weights.watcher.local is not None and weights.watcher.local.root == expected
    assert weights.receiver is None and not weights.watcher.newer_only  # sync_method checkpoint
    assert weights.watcher.heartbeat is heartbeat and weights.loaded_version == 0
    weights.close()


def test_explorer_sync_writes_the_loops_heartbeat_and_waits_for_weights(tmp_path):
    from rft.config.load import load_config
    from rft.sync.explorer_side import open_explorer_sync

    config = Path(__file__).resolve().parent.parent / "configs" / "sft_warmup.yaml"
    cfg = load_config(config, [f"checkpoint_root_dir={tmp_path}"])

    def beat() -> dict:
        (status,) = read_heartbeats(cfg.run_dir, 60)
        return status.fields

    engine = ShardEngine()  # started with the model path: version 0
    sync = open_explorer_sync(cfg, "explorer-0", engine, steps_done=4)  # a resume after step 4
    assert (beat()["steps_done"], beat()["finished"], beat()[LOADED_FIELD]) == (4, False, 0)
    assert sync.loaded_version == 0
    sync.sealed(5, tasks=3, finished=False)
    sync.sealed(6, tasks=2, finished=True)  # the last step: a trainer may end
    assert (beat()["steps_done"], beat()["tasks_done"], beat()["finished"]) == (6, 5, True)
    late_publisher(cfg.run_dir).publish(1, shards("1:a"))
    with sync.evaluating(need=1) as version:  # loads v1 first, then says it evaluates
        assert version == 1 and beat()[EVALUATING_FIELD] is True
        assert engine.loads == [["1:a", "1:a"]]
    assert beat()[EVALUATING_FIELD] is False and beat()[LOADED_FIELD] == 1
    with pytest.raises(RuntimeError):  # an evaluation that fails still clears the field
        with sync.evaluating():
            raise RuntimeError("eval failed")
    assert beat()[EVALUATING_FIELD] is False
    sync.close()
    assert beat()["exited"] and not read_heartbeats(cfg.run_dir, 60)[0].live
    done = open_explorer_sync(cfg, "explorer-0", engine, steps_done=6, finished=True)
    assert beat()["finished"] and beat()["steps_done"] == 6 and not beat()["exited"]
    done.close()


def test_a_released_lease_is_an_exited_explorer_and_a_lease_alone_one_starting(tmp_path):
    from rft.lease import Lease
    from rft.status import collect, format_status
    from rft.sync.heartbeat import explorers_finished, starting_explorers

    starting = Lease.acquire(tmp_path, "explorer-1", 5.0, 60.0)  # its engine is starting
    trainer = Lease.acquire(tmp_path, "trainer", 5.0, 60.0)  # not an explorer
    done = Lease.acquire(tmp_path, "explorer-0", 5.0, 60.0)
    Heartbeat(tmp_path, "explorer-0").beat(finished=True)
    assert starting_explorers(tmp_path, 60) == ["explorer-1"]
    assert not explorers_finished(tmp_path, 60)  # explorer-1 has not even begun
    assert "explorer explorer-1     starting" in format_status(collect(tmp_path, 60))
    starting.release()  # it died before its heartbeat: no longer waited for
    assert starting_explorers(tmp_path, 60) == [] and explorers_finished(tmp_path, 60)
    (status,) = read_heartbeats(tmp_path, 60)
    assert status.live and not status.exited
    done.release(blocking=False)  # what a signal's exit writes, and nothing else
    (status,) = read_heartbeats(tmp_path, 60)
    assert not status.live and status.exited and not status.fields["exited"]
    assert "explorer explorer-0     exited" in format_status(collect(tmp_path, 60))
    assert explorers_finished(tmp_path, 60)
    time.sleep(0.01)
    again = Lease.acquire(tmp_path, "explorer-0", 5.0, 60.0)  # restarted: its old beat said done
    assert starting_explorers(tmp_path, 60) == ["explorer-0"] and not explorers_finished(
        tmp_path, 60
    )
    Heartbeat(tmp_path, "explorer-0").beat()  # the new instance's engine runs
    assert starting_explorers(tmp_path, 60) == [] and not explorers_finished(tmp_path, 60)
    again.release()
    trainer.release()


def test_a_delta_local_dir_reads_this_nodes_variables(tmp_path, monkeypatch):
    from rft.errors import ConfigError
    from rft.sync.local import DeltaPolicy

    monkeypatch.setenv("RFT_TEST_SCRATCH", str(tmp_path / "node"))
    scratch = DeltaPolicy(8, "$RFT_TEST_SCRATCH/rft").scratch(tmp_path / "run", "explorer-0")
    assert scratch.parent == tmp_path / "node" / "rft"
    assert scratch.name.startswith("rft-weights-") and scratch.name.endswith("-explorer-0")
    with pytest.raises(ConfigError, match="RFT_TEST_UNSET.* names a variable unset on"):
        DeltaPolicy(8, "$RFT_TEST_UNSET/rft").scratch(tmp_path / "run", "explorer-0")


def test_a_damaged_explorer_lease_never_fails_a_reader_of_heartbeats(tmp_path, caplog):
    from rft.lease import Lease
    from rft.rundir import lease_file
    from rft.sync.heartbeat import explorers_finished, starting_explorers

    Lease.acquire(tmp_path, "explorer-0", 5.0, 60.0)
    Heartbeat(tmp_path, "explorer-0").beat(finished=True)
    lease_file(tmp_path, "explorer-0", 1).write_text("{half a claim")  # the trainer reads on
    (status,) = read_heartbeats(tmp_path, 60)
    assert status.live and not status.exited  # the heartbeat alone decides
    assert starting_explorers(tmp_path, 60) == [] and explorers_finished(tmp_path, 60)
    assert "judged by its heartbeat alone" in caplog.text
