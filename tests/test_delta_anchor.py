"""A delta whose anchor folder was deleted (synchronizer.delta_sync): an explorer that cannot
rebuild it stops within seconds with a DeltaError naming the delta, the anchor and what to do,
never after synchronizer.sync_timeout and never blaming the trainer; it waits only for a trainer
started since (whose first version is full), and loads the delta once the anchor is back."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rft.errors import DeltaError, SyncTimeoutError
from rft.lease import Lease
from rft.rundir import TRAINER_LEASE, weights_dir
from rft.sync import explorer_side, watcher
from rft.sync.explorer_side import WeightsIn
from rft.sync.local import DeltaPolicy, LocalCopy
from rft.sync.publisher import WeightsPublisher
from rft.sync.versions import COMPLETE_MARKER, DELTA_INDEX, anchor_loss, delta_base
from rft.sync.watcher import WeightsWatcher

NUMEL = 4096
SYNC_TIMEOUT_S = 3600  # synchronizer.sync_timeout's default: never reached here


def weights(version: int) -> dict[str, torch.Tensor]:
    """Version ``version``'s tensors: a few elements move with the version (a sparse delta)."""
    w = torch.linspace(-1, 1, NUMEL)
    w[:8] += version * 1e-3
    return {"w": w}


def publish(publisher: WeightsPublisher, version: int) -> None:
    def write(folder: Path) -> None:
        (folder / "config.json").write_text('{"model_type": "llama"}')
        save_file(weights(version), folder / "model.safetensors")

    publisher.publish(version, write)


def delta_publisher(run: Path, local: Path) -> WeightsPublisher:
    """A trainer process's publisher: its first version is full, the next ones deltas."""
    policy = DeltaPolicy(anchor_interval=8, local_dir=str(local / "trainer"))
    return WeightsPublisher(run, keep_versions=2, delta=policy)


class Engine:
    """Records the version of every folder it loads (checked tensor by tensor)."""

    def __init__(self) -> None:
        self.loaded: list[int] = []

    def reload(self, folder: Path) -> float:
        got = load_file(folder / "model.safetensors")["w"]
        version = next(v for v in range(100) if torch.equal(got, weights(v)["w"]))
        self.loaded.append(version)
        return 0.0


def fresh_explorer(run: Path, local: Path, timeout_s: float = SYNC_TIMEOUT_S) -> WeightsIn:
    """A (re)started explorer: holds version 0, no local copy of any anchor."""
    watch = WeightsWatcher(run, 0, local=LocalCopy(run, local / "explorer-0"))
    return WeightsIn(watch, Engine(), timeout_s)


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(watcher, "ANCHOR_GRACE_S", 0.5)
    monkeypatch.setattr(explorer_side, "WEIGHTS_POLL_S", 0.05)


@pytest.fixture
def trainer(tmp_path):
    """The trainer process's publisher, which published weights/v000001 in full (the anchor)
    and v000002 as a delta against it."""
    publisher = delta_publisher(tmp_path / "run", tmp_path / "local")
    publish(publisher, 1)
    publish(publisher, 2)
    assert delta_base(weights_dir(tmp_path / "run", 2)) == 1
    return publisher


@pytest.fixture
def run_with_delta(tmp_path, trainer):
    """(run, local) of :func:`trainer`."""
    return tmp_path / "run", tmp_path / "local"


def lost_anchor_message(run: Path, what: str = "is gone (deleted outside rft?)") -> str:
    return (
        f"weights/v000002 is a delta against weights/v000001, which {what}; the explorer "
        f"cannot load it: restore {weights_dir(run, 1)}, or restart the run from its newest "
        "checkpoint (a restarted trainer publishes its first version in full, and explorers "
        "wait for it)"
    )


@pytest.mark.parametrize("trainer_state", ["gone", "still running"])
def test_a_deleted_anchor_stops_a_waiting_explorer_within_seconds(
    run_with_delta, quick, trainer_state
):
    run, local = run_with_delta
    held = None
    if trainer_state == "still running":  # the one that published the delta: it cannot help
        held = Lease.acquire(run, TRAINER_LEASE, 1.0, 60.0).start()
        held.claim["start_time"] = 0.0  # it started before it published the delta
        held.beat()
    shutil.rmtree(weights_dir(run, 1))
    weights_in = fresh_explorer(run, local)
    start = time.monotonic()
    try:
        with pytest.raises(DeltaError) as info:
            weights_in.wait_for(2)
    finally:
        if held is not None:
            held.release()
    assert time.monotonic() - start < 10  # the grace (0.5 s here, 30 s by default), not 3600 s
    assert str(info.value) == lost_anchor_message(run)
    assert "trainer running" not in str(info.value)
    assert weights_in.engine.loaded == [] and weights_in.loaded_version == 0


def test_a_replaced_anchor_is_named_too(run_with_delta, quick):
    run, local = run_with_delta
    marker = weights_dir(run, 1) / COMPLETE_MARKER
    marker.write_text(marker.read_text().replace('"id": "', '"id": "another-'))
    with pytest.raises(DeltaError) as info:
        fresh_explorer(run, local).wait_for(2)
    assert str(info.value) == lost_anchor_message(run, "was replaced by another copy")


def test_an_explorer_with_weights_to_go_on_keeps_them(run_with_delta, quick, monkeypatch):
    """wait_for(0) (an asynchronous explorer between steps) never waits: it keeps generating
    with what it holds, and stops only once it must wait for the lost version."""
    run, local = run_with_delta
    shutil.rmtree(weights_dir(run, 1))
    weights_in = fresh_explorer(run, local)
    monkeypatch.setattr(watcher, "ANCHOR_GRACE_S", 0.0)
    assert weights_in.wait_for(0)[0] == 0
    assert weights_in.wait_for(0)[0] == 0 and weights_in.engine.loaded == []
    with pytest.raises(DeltaError, match="is a delta against weights/v000001, which is gone"):
        weights_in.wait_for(1)


def test_a_restored_anchor_is_loaded(run_with_delta, quick, tmp_path):
    run, local = run_with_delta
    backup = tmp_path / "backup"
    shutil.copytree(weights_dir(run, 1), backup)
    shutil.rmtree(weights_dir(run, 1))
    weights_in = fresh_explorer(run, local, timeout_s=0.2)
    with pytest.raises(SyncTimeoutError, match="which is gone"):  # under the grace: a timeout
        weights_in.wait_for(2)
    shutil.copytree(backup, weights_dir(run, 1))
    assert weights_in.wait_for(2)[0] == 2 and weights_in.engine.loaded == [2]


def test_a_trainer_started_after_the_delta_is_waited_for(run_with_delta, quick):
    """A restarted trainer publishes its first version in full: the explorer waits for it
    (the timeout names the lost anchor, not the trainer), then loads it."""
    run, local = run_with_delta
    shutil.rmtree(weights_dir(run, 1))
    time.sleep(0.01)  # the claim starts after the delta's marker was written
    lease = Lease.acquire(run, TRAINER_LEASE, 1.0, 60.0).start()
    try:
        weights_in = fresh_explorer(run, local, timeout_s=1.0)
        with pytest.raises(SyncTimeoutError) as info:
            weights_in.wait_for(2)
        message = str(info.value)
        assert "weights/v000002 is a delta against weights/v000001, which is gone" in message
        assert "Waiting: the trainer is running" in message
        assert "started after weights/v000002 was published" in message
        assert "is the trainer running?" not in message
        publish(delta_publisher(run, local), 2)  # the restarted trainer's first: full
        assert delta_base(weights_dir(run, 2)) is None
        assert weights_in.wait_for(2)[0] == 2 and weights_in.engine.loaded == [2]
    finally:
        lease.release()


def test_a_live_explorer_with_its_local_copy_is_not_affected(run_with_delta, quick, trainer):
    run, local = run_with_delta
    weights_in = fresh_explorer(run, local)
    assert weights_in.wait_for(2)[0] == 2  # fetched the anchor into its node-local folder
    shutil.rmtree(weights_dir(run, 1))
    publish(trainer, 3)  # the trainer notices: v000003 is full, the new anchor
    assert delta_base(weights_dir(run, 3)) is None
    assert weights_in.wait_for(3)[0] == 3 and weights_in.engine.loaded == [2, 3]


def test_anchor_loss_only_for_a_readable_delta(run_with_delta):
    run, _local = run_with_delta
    assert anchor_loss(run, 1) is None  # a full folder
    assert anchor_loss(run, 2) is None  # its anchor is there
    shutil.rmtree(weights_dir(run, 1))
    assert anchor_loss(run, 2) == (
        "weights/v000002 is a delta against weights/v000001, which is gone (deleted outside rft?)"
    )
    (weights_dir(run, 2) / DELTA_INDEX).write_text("{damaged")
    assert anchor_loss(run, 2) is None  # a damaged delta: not a lost anchor


def test_a_trainer_whose_anchor_was_deleted_publishes_its_next_version_in_full(tmp_path):
    """No delta ever names a folder that is gone: the next version is the new anchor."""
    run = tmp_path / "run"
    publisher = delta_publisher(run, tmp_path / "local")
    publish(publisher, 1)
    publish(publisher, 2)
    assert delta_base(weights_dir(run, 2)) == 1
    shutil.rmtree(weights_dir(run, 1))
    publish(publisher, 3)
    assert delta_base(weights_dir(run, 3)) is None  # full
    publish(publisher, 4)
    assert delta_base(weights_dir(run, 4)) == 3
