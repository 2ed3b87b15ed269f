"""Fencing (``faults``): a role instance frozen past its lease's expiry while another instance
takes the run over writes nothing once it wakes, and exits with the lease-lost line: a trainer
frozen while writing weights, inside a checkpoint's finish and just before it, an explorer with
its heartbeat thread. Fast checks of the fence in the monitor, the archive, the readers of
heartbeats and checkpoints, and the cleanup of other hosts' weights temporaries."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rft import atomic
from rft.errors import LeaseError
from rft.lease import Lease
from rft.rundir import (
    ACTOR_DIR,
    CHECKPOINT_POINTER,
    EXPLORERS_DIR,
    TRAINER_LEASE,
    TRAINER_META,
    WEIGHTS_DIR,
    WEIGHTS_POINTER,
)
from rft.sync.heartbeat import Heartbeat, read_heartbeats
from rft.sync.publisher import WeightsPublisher
from rft.sync.versions import list_versions
from rft.trainer.state import finish_checkpoint, newest_complete, staging_dir

WORKER = Path(__file__).resolve().parent / "fence_worker.py"
STALE_S = 1.5


def start(mode: str, run_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(WORKER), mode, str(run_dir), str(STALE_S)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_stopped(proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """Until ``proc`` is stopped (state T): it froze itself at its point."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "T":
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError("the worker never froze")


def take_over(run_dir: Path, name: str = TRAINER_LEASE) -> Lease:
    """The new instance: once the frozen one's claim is stale."""
    time.sleep(STALE_S + 0.5)
    lease = Lease.acquire(run_dir, name, 0.1, STALE_S, env={})
    assert "heartbeat was" in lease.claim["took_over"]["why"]
    return lease


def resume(proc: subprocess.Popen) -> str:
    """SIGCONT; the one line it printed (its stderr) once it exited with code 2."""
    os.kill(proc.pid, signal.SIGCONT)
    _, err = proc.communicate(timeout=60)
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 2, err
    assert len(lines) == 1, err
    return lines[0]


def snapshot(run_dir: Path) -> dict[str, bytes]:
    """Every file others can see in the run directory: not the leases (the new owner's
    heartbeat moves) nor temporaries (the frozen one's own are its to remove)."""
    return {
        str(p.relative_to(run_dir)): p.read_bytes()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and "leases" not in p.parts and ".tmp." not in str(p.relative_to(run_dir))
    }


def new_checkpoint(run_dir: Path, lease: Lease, step: int) -> None:
    tmp = staging_dir(run_dir, step)
    (tmp / ACTOR_DIR / "shard.pt").write_bytes(f"new owner's step {step}".encode())
    finish_checkpoint(run_dir, tmp, step, {"lease_generation": lease.gen}, 2, lease)


@pytest.mark.faults
def test_a_trainer_frozen_while_publishing_weights_writes_nothing_when_it_wakes(tmp_path):
    old = start("publish", tmp_path)
    wait_stopped(old)
    lease = take_over(tmp_path)
    publisher = WeightsPublisher(tmp_path, 2, heartbeat_live_s=STALE_S, fence=lease)
    for version in (5, 6):
        publisher.publish(version, lambda d, v=version: (d / "w").write_text(f"new {v}"))
    before = snapshot(tmp_path)
    line = resume(old)
    assert line.startswith(f"error: this trainer lost its lease on {tmp_path} to host ")
    assert line.endswith(
        "stopping before publishing weights version 4, so the new owner's files are not overwritten"
    )
    assert atomic.read_pointer(tmp_path / WEIGHTS_POINTER) == 6
    assert list_versions(tmp_path) == [5, 6]
    assert snapshot(tmp_path) == before
    assert not list((tmp_path / WEIGHTS_DIR).glob("*.tmp.*"))  # its own v4 temporary: removed
    lease.release()


@pytest.mark.faults
@pytest.mark.parametrize("mode", ["finish", "before"])
def test_a_trainer_frozen_in_or_before_a_checkpoints_finish_leaves_the_new_owners_alone(
    tmp_path, mode
):
    """Inside the finish (its staged metadata being written) or just before it; in the second
    case the new owner has removed the frozen trainer's staging folder (as a new owner on
    another host does): the old one still says it lost its lease, no FileNotFoundError."""
    old = start(mode, tmp_path)
    wait_stopped(old)
    lease = take_over(tmp_path)
    if mode == "before":
        for staged in tmp_path.glob("global_step_3.tmp.*"):
            shutil.rmtree(staged)
    new_checkpoint(tmp_path, lease, 6)
    before = snapshot(tmp_path)
    line = resume(old)
    assert line.startswith(f"error: this trainer lost its lease on {tmp_path} to host ")
    assert "stopping before finishing checkpoint global_step_3" in line or (
        "stopping before moving checkpoint global_step_3 into place" in line
    )
    assert atomic.read_pointer(tmp_path / CHECKPOINT_POINTER) == 6
    assert json.loads((tmp_path / TRAINER_META).read_text())["step"] == 6
    assert not (tmp_path / "global_step_3").exists()
    assert snapshot(tmp_path) == before
    lease.release()


@pytest.mark.faults
def test_an_explorer_frozen_with_its_heartbeat_thread_never_overwrites_the_new_ones(tmp_path):
    old = start("explorer", tmp_path)
    assert old.stdout.readline().strip() == "beating"
    os.kill(old.pid, signal.SIGSTOP)  # main thread and heartbeat thread alike
    lease = take_over(tmp_path, "explorer-0")
    mine = Heartbeat(tmp_path, "explorer-0", 0.1, lease)
    mine.beat(steps_done=99)
    written = (tmp_path / EXPLORERS_DIR / "explorer-0.json").read_bytes()
    line = resume(old)
    assert line.startswith(f"error: this explorer-0 lost its lease on {tmp_path} to host ")
    assert "stopping before sealing segment" in line
    assert (tmp_path / EXPLORERS_DIR / "explorer-0.json").read_bytes() == written
    [status] = read_heartbeats(tmp_path)
    assert status.fields["steps_done"] == 99 and status.fields["pid"] == os.getpid()
    lease.release()


# ----------------------------------------------------------------------------- fast checks


def displaced(run_dir: Path, name: str = TRAINER_LEASE) -> tuple[Lease, Lease]:
    """(the old instance's lease, the new one's): the new one took it over by --take-over."""
    old = Lease.acquire(run_dir, name, 0.1, 3600.0, env={})
    new = Lease.acquire(run_dir, name, 0.1, 3600.0, env={"RFT_TAKE_OVER": "1"})
    return old, new


def test_a_displaced_trainer_writes_no_metrics_and_no_tensorboard(tmp_path):
    from rft.monitor import Monitor, metrics_path

    old, new = displaced(tmp_path)
    monitor = Monitor(tmp_path, "trainer", monitor_type="tensorboard", fence=old)
    with pytest.raises(LeaseError, match="stopping before writing the trainer metrics of step 3"):
        monitor.log(3, {"pg_loss": 1.0})
    monitor.close()
    assert metrics_path(tmp_path, "trainer").read_text() == ""
    events = list((tmp_path / "monitor" / "tensorboard").rglob("events.*"))
    assert all(b"pg_loss" not in p.read_bytes() for p in events)
    Monitor(tmp_path, "trainer", monitor_type="console", fence=new).log(3, {"pg_loss": 1.0})
    assert '"pg_loss": 1.0' in metrics_path(tmp_path, "trainer").read_text()


def test_a_displaced_trainer_archives_nothing(tmp_path):
    from rft.buffer.segments import SegmentWriter
    from rft.config.load import config_from_dict
    from rft.trainer.inputs import BufferSource
    from tests.helpers.synthetic import rollout_groups

    cfg = config_from_dict(
        {
            "mode": "both",
            "checkpoint_root_dir": str(tmp_path),
            "model": {"model_path": str(tmp_path / "model")},
            "buffer": {
                "batch_size": 2,
                "explorer_input": {"taskset": {"path": "unused"}},
                "trainer_input": {"experience_buffer": {"path": "sqlite:///archive.db"}},
            },
        }
    )
    SegmentWriter(cfg.run_dir / "buffer", "explorer-0").write(
        rollout_groups(1, 2, 2, seed=0, prompt_tokens=5), seq=1
    )
    old, _ = displaced(cfg.run_dir)
    source = BufferSource(cfg, cfg.run_dir, None, fence=old)
    with pytest.raises(LeaseError, match="stopping before archiving the experiences of step 1"):
        source.next_batch(1, 0)


def test_heartbeat_readers_skip_a_displaced_explorers_heartbeat(tmp_path):
    old, new = displaced(tmp_path, "explorer-0")
    path = tmp_path / EXPLORERS_DIR / "explorer-0.json"
    Heartbeat(tmp_path, "explorer-0", 1.0, new).beat(steps_done=5)
    fields = json.loads(path.read_text())
    atomic.write_json(path, {**fields, "lease_generation": old.gen, "steps_done": 1})
    assert read_heartbeats(tmp_path) == []  # the old instance's write, slipped past its fence
    atomic.write_json(path, fields)
    assert [s.fields["steps_done"] for s in read_heartbeats(tmp_path)] == [5]
    with pytest.raises(LeaseError):
        Heartbeat(tmp_path, "explorer-0", 1.0, old).beat()


def test_a_checkpoint_pointer_moved_back_by_a_displaced_trainer_is_not_followed(tmp_path):
    old, new = displaced(tmp_path)
    new_checkpoint(tmp_path, new, 6)
    stale = staging_dir(tmp_path, 4)  # what a displaced trainer slipped past its fence
    (stale / ACTOR_DIR / "shard.pt").write_bytes(b"old")
    finish_checkpoint(tmp_path, stale, 4, {"lease_generation": old.gen}, None)
    assert atomic.read_pointer(tmp_path / CHECKPOINT_POINTER) == 4
    assert newest_complete(tmp_path) == 6


def test_weights_temporaries_of_dead_publishers_on_other_hosts_are_removed(tmp_path):
    root = tmp_path / WEIGHTS_DIR
    dead = root / "v000004.tmp.node17.4242"
    live = root / "v000005.tmp.node18.77"
    for folder in (dead, live):
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"x")
    holder = tmp_path / "leases" / TRAINER_LEASE / "000001.json"
    holder.parent.mkdir(parents=True)
    claim = {"host": "node18", "pid": 77, "heartbeat_time": time.time(), "released": False}
    holder.write_text(json.dumps(claim))
    assert socket.gethostname() not in ("node17", "node18")
    WeightsPublisher(tmp_path, 2)
    assert not dead.exists() and live.exists()  # node18 pid 77 still holds a live claim
