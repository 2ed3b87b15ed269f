"""A second ``rft-run`` on a run directory that a live run holds is refused before it writes
anything there: the live run's config record (``log/run-<tag>-<mode>.yaml``) and role logs stay
as they were. ``--take-over`` and stale or released holders go through, as the roles decide."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from rft.config.load import config_from_dict
from rft.config.schema import Config
from rft.errors import LeaseError
from rft.launch import local
from rft.lease import TAKE_OVER_ENV, Lease
from rft.rundir import LOG_DIR, TRAINER_LEASE, writer_name

STALE_S = 60.0  # explorer.heartbeat_timeout_s of the configs below


def config(root: Path, mode: str = "both", engines: int = 1) -> Config:
    return config_from_dict(
        {
            "project": "p",
            "name": "n",
            "mode": mode,
            "checkpoint_root_dir": str(root),
            "model": {"model_path": str(root / "model")},
            "algorithm": {"algorithm_type": "grpo", "repeat_times": 2},
            "buffer": {
                "batch_size": 2,
                "total_steps": 3,
                "explorer_input": {"taskset": {"path": "/data/t"}},
            },
            "explorer": {
                "heartbeat_timeout_s": STALE_S,
                "rollout_model": {"engine_num": engines},
            },
        }
    )


class Started(Exception):
    """Raised in place of starting processes: the launch got past its checks."""


@pytest.fixture
def no_processes(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise Started

    monkeypatch.setattr(local, "start_processes", refuse)
    monkeypatch.delenv(TAKE_OVER_ENV, raising=False)


def live_run_files(run_dir: Path) -> dict[str, bytes]:
    """The first run's config record and role logs, written with known content."""
    log_dir = run_dir / LOG_DIR
    log_dir.mkdir(parents=True)
    for name in ("run-main-both.yaml", "trainer.log", "explorer-0.log", "explorer-1.log"):
        (log_dir / name).write_bytes(f"the live run's {name}\n".encode())
    return snapshot(run_dir)


def snapshot(run_dir: Path) -> dict[str, bytes]:
    """Every file of the run directory but the leases (the holder beats in its claim)."""
    return {
        str(p.relative_to(run_dir)): p.read_bytes()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and "leases" not in p.parts
    }


@pytest.mark.parametrize(
    ("mode", "held"),
    [("both", TRAINER_LEASE), ("train", TRAINER_LEASE), ("both", writer_name("explorer", 1))],
)
def test_a_refused_second_run_writes_nothing(tmp_path, no_processes, mode, held):
    cfg = config(tmp_path, mode, engines=2)
    before = live_run_files(cfg.run_dir)
    lease = Lease.acquire(cfg.run_dir, held, 1.0, STALE_S).start()  # the live run: this process
    try:
        with pytest.raises(LeaseError) as info:
            local.run_stage(cfg, "main")
    finally:
        lease.release()
    message = str(info.value)
    assert message.startswith(f"{cfg.run_dir} is in use: its {held} lease is held by host ")
    assert "start with --take-over to take it over now" in message
    assert snapshot(cfg.run_dir) == before  # neither the config record nor a log was touched


def test_the_cli_prints_the_refusal_and_exits_2(tmp_path, no_processes, capsys, monkeypatch):
    from rft.launch import cli

    cfg = config(tmp_path)
    before = live_run_files(cfg.run_dir)
    monkeypatch.setattr(cli, "load_config", lambda *_args: cfg)
    monkeypatch.setattr(cli, "preflight", lambda *_args: None)  # no model folder here
    lease = Lease.acquire(cfg.run_dir, TRAINER_LEASE, 1.0, STALE_S).start()
    try:
        assert cli.run_main(["--config", "unused.yaml"]) == 2
    finally:
        lease.release()
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {cfg.run_dir} is in use: its trainer lease is held by host ")
    assert len(err.splitlines()) == 1
    assert snapshot(cfg.run_dir) == before


def test_take_over_and_released_or_stale_holders_go_through(tmp_path, no_processes, monkeypatch):
    cfg = config(tmp_path)
    lease = Lease.acquire(cfg.run_dir, TRAINER_LEASE, 1.0, STALE_S)  # live, not beating on
    with pytest.raises(LeaseError):
        local.run_stage(cfg, "main")
    monkeypatch.setenv(TAKE_OVER_ENV, "1")  # what --take-over sets
    with pytest.raises(Started):
        local.run_stage(cfg, "main")
    monkeypatch.delenv(TAKE_OVER_ENV)
    claim = json.loads(lease.path.read_text())
    lease.path.write_text(json.dumps(dict(claim, heartbeat_time=time.time() - STALE_S - 1)))
    with pytest.raises(Started):  # its heartbeat is stale
        local.run_stage(cfg, "main")
    lease.path.write_text(json.dumps(claim))
    with pytest.raises(LeaseError):
        local.run_stage(cfg, "main")
    lease.release()
    with pytest.raises(Started):
        local.run_stage(cfg, "main")
