"""Weights by broadcast (``sync_method: nccl``; gloo here): the bucket plan, the rendezvous file,
and the protocol between the trainer's :class:`WeightBroadcaster` and explorer processes running
the real receiver and worker methods around a torch module (``tests/broadcast_worker.py``; the
vLLM engine's side is in ``test_broadcast_engine.py``): members join and leave by generation, a
late joiner is taken in, a requeued trainer is found again, an explorer SIGKILLed in the middle
of a broadcast costs one folder and nothing more."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rft.monitor import SYNC_MEMBERS
from rft.rundir import WEIGHTS_GROUP
from rft.sync import broadcast as B
from rft.sync.broadcaster import WeightBroadcaster

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from broadcast_worker import make_module  # noqa: E402

# ----------------------------------------------------------------------------- pure parts


def test_buckets_group_by_dtype_in_order_and_a_large_tensor_goes_alone():
    specs = [
        ("a", "float32", (2, 3)),
        ("b", "bfloat16", (4,)),
        ("c", "float32", (5,)),
        ("big", "float32", (100,)),
        ("d", "float32", (1,)),
    ]
    buckets = B.plan_buckets(specs, bucket_bytes=64)  # 16 float32
    got = [(b.dtype, b.numel, [(t.name, t.offset) for t in b.tensors]) for b in buckets]
    assert got == [
        ("float32", 11, [("a", 0), ("c", 6)]),  # 6 + 5 = 11 <= 16; big closes it
        ("float32", 100, [("big", 0)]),  # larger than a bucket: alone
        ("bfloat16", 4, [("b", 0)]),
        ("float32", 1, [("d", 0)]),
    ]
    assert B.buckets_from_json(json.loads(json.dumps(B.buckets_to_json(buckets)))) == buckets


def test_pack_then_unpack_gives_back_every_tensor():
    state = {
        "w": torch.arange(6.0).view(2, 3),
        "v": torch.tensor([7.0, 8.0]),
        "h": torch.ones(3, dtype=torch.bfloat16),
    }
    out = {}
    for bucket in B.plan_for(state, bucket_bytes=1 << 20):
        flat = B.pack(bucket, state, torch.device("cpu"))
        out.update((name, t.clone()) for name, t in B.unpack(bucket, flat))
    assert out.keys() == state.keys()
    for name, tensor in state.items():
        assert torch.equal(out[name], tensor) and out[name].dtype == tensor.dtype


def test_rendezvous_round_trip_and_a_damaged_file_says_what_to_do(tmp_path):
    assert B.read_rendezvous(tmp_path) is None
    rv = B.Rendezvous("node1", 1234, "s1", "gloo", 42, 1.0)
    B.write_rendezvous(tmp_path, rv)
    assert B.read_rendezvous(tmp_path) == rv
    (tmp_path / WEIGHTS_GROUP).write_text('{"host": "node1"')
    with pytest.raises(B.BroadcastError, match="delete it"):
        B.read_rendezvous(tmp_path)


def test_a_store_port_in_use_says_what_to_do():
    first = B.open_store("127.0.0.1", 0, 5)
    with pytest.raises(B.BroadcastError, match="unset RFT_SYNC_PORT or choose a free port"):
        B.open_store("127.0.0.1", int(first.port), 5)


def test_ranks_follow_the_trainer_and_count_tensor_parallel_workers():
    regs = [
        B.Registration("explorer-1", "t1", 2, 1, "h"),
        B.Registration("explorer-0", "t0", 1, 1, "h"),
    ]
    members, world = B.assign_ranks(regs)
    assert [(m.name, m.rank) for m in members] == [("explorer-0", 1), ("explorer-1", 2)]
    assert world == 4  # trainer + 1 + 2


def test_a_registration_slot_never_written_is_skipped_not_waited_for_again():
    """An explorer killed between counting its registration and writing it leaves a hole:
    read once, skipped, and the next read starts after it."""
    from datetime import timedelta

    store = torch.distributed.TCPStore(
        "127.0.0.1", 0, None, True, timedelta(seconds=5), wait_for_workers=False
    )
    store.add("joins", 1)  # counted, never written
    B.register(store, B.Registration("explorer-1", "t1", 1, 1, "h"))
    regs, next_index = B.read_registrations(store, 0, wait_s=0.2)
    assert [r.name for r in regs] == ["explorer-1"] and next_index == 2
    assert B.read_registrations(store, next_index, wait_s=0.2) == ([], 2)


# ----------------------------------------------------------------------------- the protocol


def weights(version: int) -> dict[str, torch.Tensor]:
    """The test module's weights, every element ``version / 1000``."""
    return {k: torch.full_like(v, version / 1000) for k, v in make_module().state_dict().items()}


def weights_sum(version: int) -> float:
    return sum(float(t.sum()) for t in weights(version).values())


def start_explorer(run_dir: Path, name: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            str(REPO / "tests" / "broadcast_worker.py"),
            str(run_dir),
            name,
            "120",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )


def received(proc: subprocess.Popen) -> list[tuple[int, float]]:
    """Stop an explorer (if still running) and list the versions it received, with sums."""
    if proc.poll() is None:
        proc.terminate()
    out, err = proc.communicate(timeout=30)
    return [(r["version"], round(r["sum"], 3)) for r in map(json.loads, out.splitlines())]


def wait_for(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def registered(broadcaster: WeightBroadcaster) -> int:
    return broadcaster.store.add("joins", 0)


def test_members_late_joiners_and_a_requeued_trainer(tmp_path):
    trainer = WeightBroadcaster(
        tmp_path, torch.device("cpu"), timeout_s=30, heartbeat_live_s=10, bucket_bytes=4096
    )
    a = start_explorer(tmp_path, "explorer-0")
    try:
        assert not trainer.broadcast(1, weights(1))  # nobody registered yet: a folder instead
        wait_for(lambda: registered(trainer) == 1)
        assert trainer.broadcast(2, weights(2)) and trainer.generation == 1
        assert trainer.broadcast(3, weights(3)) and trainer.generation == 1  # same group
        b = start_explorer(tmp_path, "explorer-1")  # elastic: joins the next generation
        wait_for(lambda: registered(trainer) == 2)
        assert trainer.broadcast(4, weights(4)) and trainer.generation == 2
        assert trainer.last[SYNC_MEMBERS] == 2
        trainer.close()  # requeued: a new trainer, a new store, a new session
        assert not (tmp_path / WEIGHTS_GROUP).exists()
        trainer = WeightBroadcaster(
            tmp_path, torch.device("cpu"), timeout_s=30, heartbeat_live_s=10, bucket_bytes=4096
        )
        wait_for(lambda: registered(trainer) == 2)  # both found the new rendezvous at once
        assert trainer.broadcast(5, weights(5)) and trainer.generation == 1
    finally:
        trainer.close()
        got_a, got_b = received(a), received(b)
    assert got_a == [(v, round(weights_sum(v), 3)) for v in (2, 3, 4, 5)]
    assert got_b == [(v, round(weights_sum(v), 3)) for v in (4, 5)]


def test_an_explorer_killed_mid_broadcast_costs_one_folder(tmp_path):
    trainer = WeightBroadcaster(
        tmp_path, torch.device("cpu"), timeout_s=30, heartbeat_live_s=10, bucket_bytes=4096
    )  # several buckets: the kill lands between two
    a = start_explorer(tmp_path, "explorer-0")
    b = start_explorer(tmp_path, "explorer-1", "--die-in-version", "2")
    try:
        wait_for(lambda: registered(trainer) == 2)
        assert trainer.broadcast(1, weights(1)) and trainer.last[SYNC_MEMBERS] == 2
        start = time.monotonic()
        assert not trainer.broadcast(2, weights(2))  # the trainer goes on: publish a folder
        assert time.monotonic() - start < 25, "waited for the 30 s timeout, not for the error"
        b.wait(timeout=30)
        assert b.returncode == -9
        wait_for(lambda: registered(trainer) == 3)  # the survivor registered again
        assert trainer.broadcast(3, weights(3)) and trainer.generation == 2
        assert trainer.last[SYNC_MEMBERS] == 1  # the dead one's registration was retired
    finally:
        trainer.close()
        got_a, got_b = received(a), received(b)
    # Version 2 reaches the survivor whole or not at all (when the dead one's peer link broke
    # before the last bucket): never a mix.
    assert got_a in (
        [(v, round(weights_sum(v), 3)) for v in versions] for versions in ((1, 3), (1, 2, 3))
    )
    assert got_b == [(1, round(weights_sum(1), 3))]


def test_a_paused_explorer_is_left_out_and_rejoins_and_a_finished_one_is_not_waited_for(tmp_path):
    """A member whose heartbeat stops (SIGSTOP: hung) is cancelled once the heartbeat is stale,
    not after sync_timeout; resumed, it registers again and joins a later generation. An
    explorer that ends withdraws its registration: the next broadcast does not wait for it."""
    import signal

    trainer = WeightBroadcaster(tmp_path, torch.device("cpu"), timeout_s=600, heartbeat_live_s=3)
    a = start_explorer(tmp_path, "explorer-0")
    b = start_explorer(tmp_path, "explorer-1")
    short = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "tests" / "broadcast_worker.py"),
            str(tmp_path),
            "explorer-2",
            "8",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: registered(trainer) == 3)
        assert trainer.broadcast(1, weights(1)) and trainer.last[SYNC_MEMBERS] == 3
        short.wait(timeout=60)  # ran its 8 s and withdrew
        b.send_signal(signal.SIGSTOP)
        start = time.monotonic()
        assert not trainer.broadcast(2, weights(2))  # b never acknowledges: cancelled
        assert time.monotonic() - start < 60, "waited for sync_timeout, not for the heartbeat"
        assert trainer.broadcast(3, weights(3)) and trainer.last[SYNC_MEMBERS] == 1
        b.send_signal(signal.SIGCONT)
        wait_for(lambda: registered(trainer) == 5)  # 3 + the withdrawal + b again
        assert trainer.broadcast(4, weights(4)) and trainer.last[SYNC_MEMBERS] == 2
    finally:
        b.send_signal(signal.SIGCONT)
        trainer.close()
        got_a, got_b = received(a), received(b)
    assert [v for v, _ in got_a] == [1, 3, 4]
    assert [v for v, _ in got_b] == [1, 4]
    assert [json.loads(line)["version"] for line in short.stdout.read().splitlines()] == [1]
