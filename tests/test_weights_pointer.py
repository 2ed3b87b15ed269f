"""A weights pointer that names a missing or incomplete version, seen at the first look.

Without a running trainer (its lease, :mod:`rft.lease`) nothing will repair it: explorers of
every mode stop at their first poll with the exact fault (not after synchronizer.sync_timeout,
and never silently on version 0), and ``rft-status`` says so and exits 2. With a running
trainer it may be mid-publish: a warning naming the trainer's last heartbeat, then the wait.
"""

from __future__ import annotations

import logging
import time

import pytest

from rft import atomic
from rft.errors import EXIT_OK, EXIT_USER_ERROR, CheckpointError
from rft.lease import Lease
from rft.rundir import TRAINER_LEASE, WEIGHTS_POINTER, weights_dir
from rft.status import main as status_main
from rft.sync.explorer_side import WeightsIn
from rft.sync.publisher import WeightsPublisher
from rft.sync.versions import COMPLETE_MARKER, pointer_fault
from rft.sync.watcher import WeightsWatcher
from tests.helpers.weights import NullEngine, write_tiny

MISSING = f"{WEIGHTS_POINTER} names version 7 but weights/v000007 is missing or incomplete"


@pytest.fixture
def broken_run(tmp_path):
    """v5 and v6 published, then the pointer moved to a v7 that is not there."""
    publisher = WeightsPublisher(tmp_path)
    for version in (5, 6):
        publisher.publish(version, write_tiny)
    atomic.write_pointer(tmp_path / WEIGHTS_POINTER, 7)
    return tmp_path


def trainer_lease(run_dir, stale_s: float = 60.0) -> Lease:
    return Lease.acquire(run_dir, TRAINER_LEASE, interval_s=0.05, stale_s=stale_s, env={})


@pytest.mark.parametrize("need", [7, 0], ids=["mode-both-waiting-for-it", "mode-explore"])
def test_without_a_trainer_the_first_poll_fails_with_the_fault(broken_run, need):
    watcher = WeightsWatcher(broken_run, loaded_version=0)
    start = time.monotonic()
    with pytest.raises(CheckpointError) as info:
        WeightsIn(watcher, NullEngine(), 20).wait_for(need)
    assert time.monotonic() - start < 5  # not synchronizer.sync_timeout later
    message = str(info.value)
    assert MISSING in message and "write 6" in message  # what is wrong and how to repair it
    assert "no trainer has claimed the run directory" in message
    assert watcher.loaded_version == 0


def test_a_partial_copy_is_caught_the_same_way(broken_run):
    atomic.write_pointer(broken_run / WEIGHTS_POINTER, 6)
    (weights_dir(broken_run, 6) / COMPLETE_MARKER).unlink()
    with pytest.raises(CheckpointError, match="names version 6 but .* write 5"):
        WeightsWatcher(broken_run, loaded_version=0).poll()


def test_a_trainer_that_exited_or_stopped_beating_cannot_repair_it(broken_run):
    lease = trainer_lease(broken_run)
    lease.release()
    with pytest.raises(CheckpointError, match="the last trainer exited \\(host .* pid "):
        WeightsWatcher(broken_run, loaded_version=0).poll()
    trainer_lease(broken_run, stale_s=60)  # a new claim, never refreshed
    time.sleep(0.3)
    watcher = WeightsWatcher(broken_run, loaded_version=0, trainer_live_s=0.2)
    with pytest.raises(CheckpointError, match="the last trainer stopped beating .*heartbeat"):
        watcher.poll()


def test_with_a_running_trainer_it_is_a_warning_and_the_wait_goes_on(broken_run, caplog):
    lease = trainer_lease(broken_run).start()
    try:
        watcher = WeightsWatcher(broken_run, loaded_version=0, trainer_live_s=30)
        with caplog.at_level(logging.WARNING, logger="rft.sync"):
            assert WeightsIn(watcher, NullEngine(), 20).wait_for(0)[0] == 0
            assert watcher.poll() is None and watcher.poll() is None
        warnings = [r.getMessage() for r in caplog.records if MISSING in r.getMessage()]
        assert len(warnings) == 1, warnings  # once per pointer value, not once per poll
        assert "Waiting: the trainer is running (host " in warnings[0]
        assert "heartbeat 0 s ago" in warnings[0]
        WeightsPublisher(broken_run).publish(7, write_tiny)  # the publish it was in the middle of
        assert watcher.poll() == (7, weights_dir(broken_run, 7))
        assert pointer_fault(broken_run, 30) is None
    finally:
        lease.release()


def test_rft_status_says_what_is_wrong_and_exits_2(broken_run, capsys):
    assert status_main([str(broken_run)]) == EXIT_USER_ERROR
    out, err = capsys.readouterr()
    assert "trainer lease   no trainer has claimed the run directory" in out  # status printed
    assert err.startswith(f"error: {MISSING}") and err.count("\n") == 1, err
    assert "write 6" in err


def test_rft_status_with_a_running_trainer_warns_and_exits_0(broken_run, capsys):
    lease = trainer_lease(broken_run)
    try:
        assert status_main([str(broken_run)]) == EXIT_OK
        out, err = capsys.readouterr()
        assert "trainer lease   the trainer is running (host " in out
        assert f"warning         {MISSING}" in out and "may be publishing it" in out
        assert not err
    finally:
        lease.release()


def test_rft_status_of_a_healthy_run_exits_0(tmp_path, capsys):
    WeightsPublisher(tmp_path).publish(3, write_tiny)
    assert status_main([str(tmp_path)]) == EXIT_OK
    out, err = capsys.readouterr()
    assert "weights version 3" in out and "warning" not in out and not err
