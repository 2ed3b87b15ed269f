"""One owner per run directory (rft.lease): claims raced by many processes, refusal naming the
holder, stale expiry, --take-over, a SLURM requeue taking its own lease back, a trainer that
lost its lease stopping before it writes, dead writers' temporaries removed at start; real
trainers on one run directory (integration) and two SLURM jobs on one (slurm)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rft import atomic
from rft.errors import LeaseError
from rft.lease import Lease, newest_claim, remove_dead_tmp, takeover_reason
from rft.rundir import CHECKPOINT_POINTER, EXPLORER_META, TRAINER_META, lease_file

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
HOST = socket.gethostname()

# A role instance in miniature: claims argv[2] in run dir argv[1] (stale after argv[3] s),
# beats every 0.1 s and checks its lease like a trainer before each save; exit 3 once lost.
HOLDER = """
import sys, time
from rft.lease import Lease
lease = Lease.acquire(sys.argv[1], sys.argv[2], 0.1, float(sys.argv[3])).start()
print("held", lease.gen, flush=True)
while True:
    message = lease.lost_message("saving")
    if message:
        print("lost:", message, flush=True)
        sys.exit(3)
    time.sleep(0.05)
"""

# One of many processes started together: claims at the same instant, says whether it won,
# and stays alive a while (so the others see a live holder, as with real roles).
RACER = """
import sys, time
from rft.errors import LeaseError
from rft.lease import Lease
start = float(sys.argv[3])
while time.time() < start:
    pass
try:
    lease = Lease.acquire(sys.argv[1], sys.argv[2], 0.1, 60.0)
    print("won", lease.gen, flush=True)
except LeaseError as e:
    print("refused", e, flush=True)
time.sleep(3)
"""


def py_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RFT_TAKE"))}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return {**env, **extra}


def start_holder(run_dir: Path, name: str = "trainer", stale_s: float = 60.0, **env: str):
    proc = subprocess.Popen(
        [PY, "-c", HOLDER, str(run_dir), name, str(stale_s)],
        env=py_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    first = proc.stdout.readline()
    assert first.startswith("held"), first + proc.stdout.read()
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)


def claim_of(run_dir: Path, name: str = "trainer") -> dict:
    return newest_claim(run_dir, name)[1]


# ----------------------------------------------------------------------------- the rules


def test_takeover_reasons_by_hand():
    now = 1000.0
    me = {"host": "a", "pid": 10, "slurm_job_id": "7", "slurm_restart_count": 1}
    live = {"host": "b", "pid": 20, "slurm_job_id": "6", "heartbeat_time": 990.0}

    def reason(holder: dict, take_over: bool = False, alive: bool = True) -> str | None:
        return takeover_reason(holder, me, now, 120.0, take_over, lambda pid: alive)

    assert reason(live) is None  # 10 s old, another host, another job: refused
    assert reason(dict(live, heartbeat_time=879.0)) is not None  # 121 s > 120 s: stale
    assert reason(dict(live, heartbeat_time=880.0)) is None  # exactly 120 s: still live
    assert "released" in reason(dict(live, released=True))
    assert "--take-over" in reason(live, take_over=True)
    assert reason(dict(live, host="a"), alive=True) is None  # this host, its pid runs
    assert "gone" in reason(dict(live, host="a"), alive=False)
    assert "this process" in reason(dict(live, host="a", pid=10))
    # The same SLURM job: its previous run (lower restart count) yields at once; the same run
    # (equal count: another step or task of this incarnation) does not.
    assert "requeue" in reason(dict(live, slurm_job_id="7", slurm_restart_count=0))
    assert reason(dict(live, slurm_job_id="7", slurm_restart_count=1)) is None
    assert reason(dict(live, slurm_job_id=None), alive=True) is None


def test_take_over_flag_reaches_every_process_through_the_environment(monkeypatch):
    """``--take-over`` on the commands and the worker entry sets RFT_TAKE_OVER (inherited by
    the roles, torchrun ranks and SLURM tasks) and is not mistaken for a config override."""
    from rft.entry import config_parser
    from rft.launch import worker

    # setenv first: it records that the variable was unset, so the test leaves it unset (a
    # delenv of an unset variable records nothing, and the flag below would leak into the
    # trainers the later tests start).
    monkeypatch.setenv("RFT_TAKE_OVER", "0")
    monkeypatch.delenv("RFT_TAKE_OVER")
    args = config_parser("rft-run", "x", take_over=True).parse_args(["--config", "c.yaml", "a=1"])
    assert not args.take_over and "RFT_TAKE_OVER" not in os.environ
    known, overrides = worker._parse(["--config", "c.yaml", "--take-over", "a=1"])
    assert known.take_over and overrides == ["a=1"] and os.environ["RFT_TAKE_OVER"] == "1"
    monkeypatch.delenv("RFT_TAKE_OVER")
    args = config_parser("x", "x", stage=True, take_over=True).parse_args(
        ["--config", "c.yaml", "--take-over"]
    )
    assert args.take_over and os.environ["RFT_TAKE_OVER"] == "1"


# ----------------------------------------------------------------------------- real processes


@pytest.mark.parametrize("stale_first", [False, True])
def test_many_processes_claiming_at_once_exactly_one_wins(tmp_path, stale_first):
    """12 processes claim one name at the same instant, on a fresh run directory and on one
    whose claim went stale: exactly one wins, the others are refused naming it."""
    if stale_first:
        old = Lease.acquire(tmp_path, "trainer", 0.1, 60.0, env={})
        claim = dict(old.claim, host="gone-host", heartbeat_time=time.time() - 3600)
        atomic.write_bytes(old.path, json.dumps(claim).encode())
    start = time.time() + 4.0
    procs = [
        subprocess.Popen(
            [PY, "-c", RACER, str(tmp_path), "trainer", str(start)],
            env=py_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for _ in range(12)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]  # the verdict: the last line
    outs = [o.strip().splitlines()[-1] if o.strip() else "" for o in outs]
    winners = [o for o in outs if o.startswith("won")]
    assert len(winners) == 1, outs
    assert all(o.startswith("refused") and "is in use" in o for o in outs if o not in winners)
    gen = 2 if stale_first else 1
    assert winners == [f"won {gen}"]
    winner_pid = claim_of(tmp_path)["pid"]
    assert winner_pid in [p.pid for p in procs]
    assert all(f"pid {winner_pid}" in o for o in outs if o not in winners)


def test_second_claim_is_refused_naming_the_holder_then_taken_over(tmp_path):
    holder = start_holder(tmp_path, SLURM_JOB_ID="4242")
    try:
        with pytest.raises(LeaseError) as refused:
            Lease.acquire(tmp_path, "trainer", 0.1, 60.0, env={})
        message = str(refused.value)
        assert f"host {HOST} pid {holder.pid} (SLURM job 4242)" in message
        assert "heartbeat 0 s ago" in message and "--take-over" in message and "60 s" in message
        assert holder.poll() is None  # the holder is unaffected by a refused claim
        lease = Lease.acquire(tmp_path, "trainer", 0.1, 60.0, env={"RFT_TAKE_OVER": "1"})
        out = holder.communicate(timeout=30)[0]
        assert holder.returncode == 3, out
        assert f"to host {HOST} pid {os.getpid()}" in out and "--take-over was given" in out
        assert lease.lost() is None
        assert claim_of(tmp_path)["took_over"]["pid"] == holder.pid
    finally:
        stop(holder)


def test_a_stale_claim_expires(tmp_path):
    """A holder that stopped beating (SIGSTOP: alive, silent) keeps its claim until its
    heartbeat is older than the stale time; then a new instance takes it, and the old one,
    resumed, finds it lost."""
    holder = start_holder(tmp_path, stale_s=1.5)
    try:
        os.kill(holder.pid, signal.SIGSTOP)
        with pytest.raises(LeaseError, match="is in use"):
            Lease.acquire(tmp_path, "trainer", 0.1, 1.5, env={})
        time.sleep(2.0)
        lease = Lease.acquire(tmp_path, "trainer", 0.1, 1.5, env={})
        assert "heartbeat was" in lease.claim["took_over"]["why"]
        os.kill(holder.pid, signal.SIGCONT)
        out = holder.communicate(timeout=30)[0]
        assert holder.returncode == 3 and "lost:" in out, out
        assert lease.lost() is None  # the resumed holder wrote nothing over the new claim
        assert claim_of(tmp_path)["token"] == lease.claim["token"]
    finally:
        stop(holder)


def test_a_dead_holder_on_this_host_is_taken_over_at_once(tmp_path):
    holder = start_holder(tmp_path)
    holder.kill()
    holder.wait()
    lease = Lease.acquire(tmp_path, "trainer", 0.1, 3600.0, env={})
    assert "process is gone" in lease.claim["took_over"]["why"]


def test_a_requeued_slurm_job_takes_its_own_lease_back(tmp_path):
    """The holder runs as SLURM job 4242 (first run). Its requeue (restart count 1) takes the
    trainer lease at once; another job, or the same run of the same job, is refused. The
    explorer of that job holds a different lease, untouched by the trainer's requeue."""
    holder = start_holder(tmp_path, SLURM_JOB_ID="4242")
    explorer = start_holder(tmp_path, "explorer-0", SLURM_JOB_ID="4242")
    try:
        for env in (
            {"SLURM_JOB_ID": "4242"},  # the same run of the job: a duplicate, not a requeue
            {"SLURM_JOB_ID": "4243", "SLURM_RESTART_COUNT": "1"},  # another job
        ):
            with pytest.raises(LeaseError, match="SLURM job 4242"):
                Lease.acquire(tmp_path, "trainer", 0.1, 3600.0, env=env)
        requeued = {"SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "1"}
        lease = Lease.acquire(tmp_path, "trainer", 0.1, 3600.0, env=requeued)
        assert "requeue" in lease.claim["took_over"]["why"]
        assert holder.wait(timeout=30) == 3
        assert explorer.poll() is None  # its explorer-0 lease is another name
        assert claim_of(tmp_path, "explorer-0")["pid"] == explorer.pid
    finally:
        stop(holder)
        stop(explorer)


def test_lost_lease_check_names_the_new_owner_and_writes_nothing(tmp_path):
    first = Lease.acquire(tmp_path, "trainer", 0.1, 60.0, env={})
    second = Lease.acquire(tmp_path, "trainer", 0.1, 60.0, env={"RFT_TAKE_OVER": "1"})
    with pytest.raises(LeaseError, match="lost its lease .* stopping before writing step 3"):
        first.check("writing step 3")
    before = first.path.read_bytes()
    first.beat()
    first.release()
    assert first.path.read_bytes() == before  # a displaced holder never writes again
    second.release()
    assert claim_of(tmp_path)["released"]
    third = Lease.acquire(tmp_path, "trainer", 0.1, 60.0, env={})
    assert third.claim["took_over"]["why"] == "the holder released it"
    assert not lease_file(tmp_path, "trainer", 1).exists()  # older claims pruned


def test_start_removes_dead_writers_temporaries_only(tmp_path):
    """Temporaries of the role's files are removed when their writer is dead: on this host its
    pid is gone; on another host it holds no live claim. A live writer's, another file's, and
    one of another host's live holder stay."""
    dead = subprocess.Popen([PY, "-c", "pass"])
    dead.wait()
    live_elsewhere = Lease.acquire(tmp_path, "explorer-1", 0.1, 60.0, env={})
    claim = dict(live_elsewhere.claim, host="node7", pid=456)
    atomic.write_bytes(live_elsewhere.path, json.dumps(claim).encode())
    names = {
        f"{EXPLORER_META}.tmp.{HOST}.{dead.pid}": False,
        f"{EXPLORER_META}.tmp.{HOST}.{os.getppid()}": True,  # alive
        f"{EXPLORER_META}.tmp.node7.123": False,  # no live claim names it
        f"{EXPLORER_META}.tmp.node7.456": True,  # a live holder's
        f"{TRAINER_META}.tmp.{HOST}.{dead.pid}": True,  # not an explorer's file
        f"config.yaml.tmp.{HOST}.{dead.pid}": True,
    }
    for name in names:
        (tmp_path / name).write_text("{}")
    removed = remove_dead_tmp(tmp_path, (EXPLORER_META,), 60.0)
    assert sorted(p.name for p in removed) == sorted(n for n, kept in names.items() if not kept)
    assert all((tmp_path / n).exists() == kept for n, kept in names.items())
    from rft.trainer.state import temporary_prefixes

    removed = remove_dead_tmp(tmp_path, temporary_prefixes(), 60.0)
    assert [p.name for p in removed] == [f"{TRAINER_META}.tmp.{HOST}.{dead.pid}"]


# ----------------------------------------------------------------------------- real roles


def trainer_cfg(root: Path, name: str, model_dir: Path) -> Path:
    from tests.helpers.trainer_runs import write_config

    return write_config(
        root,
        name,
        model_dir,
        project="lease",
        buffer={"total_steps": 3},
        trainer={"save_interval": 1},
        synchronizer={"sync_interval": 1, "sync_timeout": 300},
    )


def start_trainer(config: Path, log: Path, *args: str) -> subprocess.Popen:
    from tests.helpers.trainer_runs import trainer_env

    with log.open("a") as out:
        return subprocess.Popen(
            [PY, "-m", "rft.trainer", "--config", str(config), *args],
            cwd=REPO,
            env={k: v for k, v in trainer_env().items() if not k.startswith("SLURM_")},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def wait_for(predicate, proc: subprocess.Popen, log: Path, timeout_s: float = 300) -> None:
    deadline = time.time() + timeout_s
    while not predicate():
        assert proc.poll() is None, log.read_text()[-4000:]
        assert time.time() < deadline, log.read_text()[-4000:]
        time.sleep(0.5)


def trained_steps(run_dir: Path) -> list[int]:
    from rft.monitor import read_metrics

    return [row["step"] for row in read_metrics(run_dir, "trainer")]


@pytest.mark.integration
def test_a_second_trainer_is_refused_and_the_first_finishes(tmp_path, tiny_model_dir):
    """Two real trainers on one run directory: the second is refused at start with one error
    line naming the first; the first, waiting for experiences meanwhile, then trains every
    step exactly once."""
    from tests.helpers.trainer_runs import write_segments

    config = trainer_cfg(tmp_path, "two", tiny_model_dir)
    run_dir = tmp_path / "lease" / "two"
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    first = start_trainer(config, first_log)
    try:
        wait_for(lambda: lease_file(run_dir, "trainer", 1).exists(), first, first_log)
        second = start_trainer(config, second_log)
        assert second.wait(timeout=300) == 2, second_log.read_text()[-4000:]
        errors = [line for line in second_log.read_text().splitlines() if "error:" in line]
        assert len(errors) == 1 and f"pid {first.pid}" in errors[0], second_log.read_text()
        assert "its trainer lease is held by" in errors[0] and "--take-over" in errors[0]
        write_segments(run_dir, [1, 2, 3])
        assert first.wait(timeout=300) == 0, first_log.read_text()[-4000:]
    finally:
        stop(first)
    assert trained_steps(run_dir) == [1, 2, 3]
    assert atomic.read_pointer(run_dir / CHECKPOINT_POINTER) == 3
    assert claim_of(run_dir)["pid"] == first.pid and claim_of(run_dir)["released"]


@pytest.mark.integration
def test_a_trainer_that_lost_its_lease_stops_before_it_writes(tmp_path, tiny_model_dir):
    """A real trainer checkpoints step 1 and waits for step 2's experiences; another trainer
    takes the run directory over (--take-over); given step 2, the first trains it and stops
    with an error before publishing or checkpointing anything of it."""
    from tests.helpers.trainer_runs import write_segments

    config = trainer_cfg(tmp_path, "lost", tiny_model_dir)
    run_dir = tmp_path / "lease" / "lost"
    log = tmp_path / "trainer.log"
    write_segments(run_dir, [1])
    trainer = start_trainer(config, log)
    try:
        wait_for(lambda: atomic.read_pointer(run_dir / CHECKPOINT_POINTER) == 1, trainer, log, 300)
        new_owner = Lease.acquire(run_dir, "trainer", 1.0, 120.0, env={"RFT_TAKE_OVER": "1"})
        write_segments(run_dir, [2])
        assert trainer.wait(timeout=300) == 2, log.read_text()[-4000:]
    finally:
        stop(trainer)
    text = log.read_text()
    assert f"lost its lease on {run_dir} to host {HOST} pid {os.getpid()}" in text, text[-4000:]
    assert "stopping before publishing weights version 2" in text
    assert trained_steps(run_dir) == [1]  # step 2's metrics are logged after its publish
    assert atomic.read_pointer(run_dir / CHECKPOINT_POINTER) == 1
    assert not (run_dir / "global_step_2").exists()
    assert not (run_dir / "weights" / "v000002").exists()
    assert atomic.read_pointer(run_dir / "latest_state_dict_iteration.txt") == 1
    assert new_owner.lost() is None


@pytest.mark.integration
def test_a_second_explorer_of_one_writer_name_is_refused_before_it_writes(tmp_path, tiny_model_dir):
    holder = start_holder(tmp_path / "lease" / "explore", "explorer-0")
    config = tmp_path / "explore.yaml"
    config.write_text(
        json.dumps(
            {
                "project": "lease",
                "name": "explore",
                "mode": "explore",
                "checkpoint_root_dir": str(tmp_path),
                "model": {"model_path": str(tiny_model_dir)},
                "buffer": {"batch_size": 2, "explorer_input": {"taskset": {"path": "missing"}}},
            }
        )
    )
    try:
        proc = subprocess.run(
            [PY, "-m", "rft.explorer", "--config", str(config)],
            env=py_env(RFT_EXPLORER_RANK="0", RFT_EXPLORER_COUNT="1"),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 2, proc.stderr[-4000:]
        assert f"its explorer-0 lease is held by host {HOST} pid {holder.pid}" in proc.stderr
        run_dir = tmp_path / "lease" / "explore"
        assert not (run_dir / "explorers" / "explorer-0.json").exists()
        assert holder.poll() is None
    finally:
        stop(holder)


@pytest.mark.slurm
def test_a_second_slurm_job_on_a_run_directory_is_refused_while_the_first_runs(
    slurm_cluster, tiny_model_dir, tmp_path
):
    """Two trainer jobs on one run directory (a resubmission while the first runs): the second
    fails with one error naming the first's job; the first runs on. Requeued, the first's new
    run holds the lease again, with SLURM's restart count in its claim (the requeue rule's
    input)."""
    from rft.launch.slurm import job_state
    from tests.helpers.slurm_jobs import (
        CPU,
        requeue_now,
        run_overrides,
        submit,
        wait_job,
        wait_until,
    )

    overrides = run_overrides(tiny_model_dir, tmp_path, "synchronizer.sync_timeout=600")
    run_dir = tmp_path / "async_gsm8k_cpu" / "smollm2-135m"
    outs = [tmp_path / "first.out", tmp_path / "second.out"]

    def submit_trainer(out: Path) -> str:
        script, config = REPO / "jobs" / "async_trainer.sbatch", CPU / "async" / "trainer.yaml"
        return submit(slurm_cluster, script, config, overrides, "--ntasks=1", OUT=str(out))

    def claim() -> dict:
        return claim_of(run_dir) or {} if (run_dir / "leases").is_dir() else {}

    first = submit_trainer(outs[0])
    try:
        wait_until(lambda: claim().get("slurm_job_id") == first, 300, "the first job's lease")
        second = submit_trainer(outs[1])
        assert wait_job(slurm_cluster, second, 300) == "FAILED", outs[1].read_text()
        errors = [line for line in outs[1].read_text().splitlines() if line.startswith("error:")]
        assert len(errors) == 1, outs[1].read_text()  # (and srun's own "srun: error:" line)
        assert f"its trainer lease is held by host {HOST}" in errors[0]
        assert f"(SLURM job {first} step 0)" in errors[0] and "--take-over" in errors[0]
        assert job_state(first, slurm_cluster) == "RUNNING", outs[0].read_text()
        assert claim()["slurm_job_id"] == first and not claim()["released"]
        requeue_now(slurm_cluster, first)
        wait_until(
            lambda: claim().get("slurm_restart_count") == 1 and not claim().get("released"),
            300,
            "the requeued job's lease",
        )
        assert claim()["slurm_job_id"] == first
    finally:
        subprocess.run(["scancel", first], env=slurm_cluster, timeout=30)
