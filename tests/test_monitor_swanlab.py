"""Monitor with the real SwanLab package: offline runs under <run>/monitor/swanlab/ (the mode a
node without a SwanLab login gets), read back with SwanLab's own record reader; the mode rule."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch

from rft.errors import ConfigError
from rft.monitor import Monitor, SwanlabSink, check_packages, swanlab_dir, swanlab_mode


@pytest.fixture(autouse=True)
def _no_login(monkeypatch, tmp_path):
    """No SwanLab key or login, so the sink decides offline; nothing written outside tmp_path
    (SwanLab also reads ./.env and ./.swanlab, hence the chdir)."""
    for key in ("SWANLAB_MODE", "SWANLAB_API_KEY", "SWANLAB_API_HOST", "SWANLAB_LOG_DIR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SWANLAB_ROOT", str(tmp_path / "swanlab-root"))
    monkeypatch.chdir(tmp_path)


def swanlab_records(run_folder: Path) -> list:
    """The records of one run folder's ``run-<id>.swanlab`` file, as ``swanlab sync`` reads them."""
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    reader = DataStoreReader()
    reader.open(next(run_folder.glob("run-*.swanlab")))
    try:
        return [Record.FromString(data) for data in reader]
    finally:
        reader.close()


def swanlab_run(run_folder: Path) -> tuple[object, list[tuple[str, int, float]], str | None]:
    """The start record, the (key, step, value) scalars and the final state of a run folder."""
    from swanlab.proto.swanlab.run.v1.run_pb2 import RunState

    records = swanlab_records(run_folder)
    kinds = [r.WhichOneof("record_type") for r in records]
    start = records[kinds.index("start")].start
    finish = (
        RunState.Name(records[kinds.index("finish")].finish.state) if "finish" in kinds else None
    )
    scalars = [
        (r.scalar.key, r.scalar.step, r.scalar.value.number)
        for r in records
        if r.HasField("scalar")
    ]
    return start, scalars, finish


def test_swanlab_writes_an_offline_run_under_the_run_dir(tmp_path, caplog):
    caplog.set_level("INFO", logger="rft.monitor")
    with Monitor(tmp_path, "trainer", monitor_type="swanlab", project="proj", name="exp") as mon:
        mon.log(1, {"pg_loss": torch.tensor(0.5), "note": "warm"})
        mon.log(2, {"pg_loss": 0.25, "reward/mean": 1.0})
    (folder,) = swanlab_dir(tmp_path).glob("run-*")
    start, scalars, state = swanlab_run(folder)
    assert (start.project, start.name, start.group, list(start.tags)) == (
        "proj",
        "exp_trainer",
        "exp",
        ["trainer", "exp"],
    )
    assert scalars == [("pg_loss", 1, 0.5), ("pg_loss", 2, 0.25), ("reward/mean", 2, 1.0)]
    assert state == "RUN_STATE_FINISHED"
    assert "run_dir" in (folder / "files" / "config.yaml").read_text()
    assert f"upload later: swanlab sync {swanlab_dir(tmp_path)}/run-*" in caplog.text


def test_swanlab_beside_tensorboard_for_two_roles_in_turn(tmp_path):
    for role, value in (("trainer", 1.0), ("explorer_a", 2.0)):
        kinds = ["tensorboard", "swanlab"]
        with Monitor(tmp_path, role, monitor_type=kinds, project="proj", name="exp") as mon:
            mon.log(3, {"x": value})
    runs = {}
    for folder in swanlab_dir(tmp_path).glob("run-*"):
        start, scalars, _ = swanlab_run(folder)
        runs[start.name] = scalars
    assert runs == {"exp_trainer": [("x", 3, 1.0)], "exp_explorer_a": [("x", 3, 2.0)]}


def test_swanlab_mode_decides_offline_without_a_key_or_a_reachable_host(tmp_path):
    assert swanlab_mode({"SWANLAB_MODE": "local"}) == (None, "SWANLAB_MODE=local")
    root = {"HOME": str(tmp_path), "SWANLAB_ROOT": str(tmp_path / "root")}  # no .netrc there
    assert swanlab_mode(root)[0] == "offline"
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        assert swanlab_mode({**root, "SWANLAB_API_KEY": "k", "SWANLAB_API_HOST": url})[0] == (
            "online"
        )
        # what `swanlab login` writes: machine = API host, login = web host, password = key
        (tmp_path / "root").mkdir()
        (tmp_path / "root" / ".netrc").write_text(f"machine {url} login {url} password k\n")
        assert swanlab_mode(root) == ("online", f"127.0.0.1:{url.rsplit(':', 1)[1]} reachable")
    mode, why = swanlab_mode({**root, "SWANLAB_API_KEY": "k"})  # the logged-in host, now closed
    assert mode == "offline" and "not reachable" in why


def test_a_missing_swanlab_is_named(tmp_path, monkeypatch):
    check_packages(["tensorboard", "swanlab"])
    monkeypatch.setattr(SwanlabSink, "module", "rft_no_such_module")
    with pytest.raises(ConfigError, match="'swanlab' needs the swanlab package"):
        check_packages("swanlab")
    with pytest.raises(ConfigError, match="swanlab package"):
        Monitor(tmp_path, "trainer", monitor_type=["tensorboard", "swanlab"])
    assert not swanlab_dir(tmp_path).exists()
