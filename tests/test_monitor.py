"""Monitor: metrics.jsonl lines, TensorBoard events, disabled ranks, torn lines; the real wandb
(offline) and MLflow (file store) packages writing under the run directory, several at once."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
import torch

from rft.errors import ConfigError
from rft.monitor import (
    BUFFER_BACKLOG,
    BUFFER_STATS_PREFIX,
    EXPLORER_WAIT_S,
    PROGRESS_KEYS,
    READ_TIME_S,
    MlflowSink,
    Monitor,
    check_packages,
    format_metrics,
    metrics_path,
    mlflow_uri,
    read_metrics,
    tensorboard_dir,
    wandb_dir,
    wandb_mode,
)


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    """wandb and MLflow never reach the network, nor write outside tmp_path."""
    for key, value in {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_ERROR_REPORTING": "false",
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }.items():
        monkeypatch.setenv(key, value)
    for key in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(key, str(tmp_path / "wandb-home" / key))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def test_monitor_writes_jsonl_and_tensorboard(tmp_path):
    with Monitor(tmp_path, "trainer") as mon:
        mon.log(1, {"pg_loss": torch.tensor(0.5), "lr": 1e-5, "note": "warm"})
        mon.log(2, {"pg_loss": 0.25}, prefix="actor/")
    rows = read_metrics(tmp_path, "trainer")
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["pg_loss"] == 0.5 and rows[0]["note"] == "warm"
    assert rows[1]["actor/pg_loss"] == 0.25
    events = list(tensorboard_dir(tmp_path, "trainer").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    assert not wandb_dir(tmp_path).exists() and not (tmp_path / "monitor" / "mlflow").exists()


def test_disabled_monitor_writes_nothing(tmp_path):
    Monitor(tmp_path, "trainer", enabled=False).log(1, {"x": 1.0})
    assert not (tmp_path / "monitor").exists()


def test_torn_last_line_is_skipped(tmp_path):
    with Monitor(tmp_path, "explorer_a", monitor_type="console") as mon:
        mon.log(1, {"reward_mean": 0.5})
    with metrics_path(tmp_path, "explorer_a").open("a") as f:
        f.write('{"step": 2, "rew')
    assert [r["step"] for r in read_metrics(tmp_path, "explorer_a")] == [1]


def test_format_metrics():
    assert format_metrics({"a": 0.123456, "b": 3, "c": "x"}) == "a=0.1235 b=3 c=x"


def wandb_records(path: Path) -> list:
    """The protobuf records of a ``.wandb`` file: W&B's LevelDB-style log (a 7-byte header, then
    chunks of a 4-byte CRC, a 2-byte length, a 1-byte type: 1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto.wandb_internal_pb2 import Record

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pos, pending = [], 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # the rest of a 32 KiB block is padding
            pos += 32768 - pos % 32768
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if pos + 7 + length > len(data):
            break  # a chunk still being written
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            records.append(Record.FromString(pending))
            pending = b""
    return records


def wandb_history(run_folder: Path, timeout_s: float = 30.0) -> tuple[object, list[dict]]:
    """The run record and the logged rows of one offline run folder, once wandb's service has
    written the run's exit record (it writes the file in the background)."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = wandb_records(next(run_folder.glob("run-*.wandb")))
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            break
        assert time.monotonic() < deadline, f"no exit record in {run_folder} after {timeout_s} s"
        time.sleep(0.1)
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    rows = [
        {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    return run, rows


def mlflow_runs(uri: str, experiment: str) -> dict[str, tuple[object, object]]:
    """run name -> (run, client) of an MLflow experiment, read back with MLflow's own client."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    return {r.info.run_name: (r, client) for r in client.search_runs([found.experiment_id])}


def test_wandb_writes_an_offline_run_under_the_run_dir(tmp_path):
    with Monitor(tmp_path, "trainer", monitor_type="wandb", project="proj", name="exp") as mon:
        mon.log(1, {"pg_loss": torch.tensor(0.5), "note": "warm"})
        mon.log(2, {"pg_loss": 0.25})
    (folder,) = wandb_dir(tmp_path).glob("offline-run-*")
    run, rows = wandb_history(folder)
    assert (run.project, run.display_name, run.run_group, list(run.tags)) == (
        "proj",
        "exp_trainer",
        "exp",
        ["trainer"],
    )
    assert [(r["_step"], r["pg_loss"]) for r in rows] == [(1, 0.5), (2, 0.25)]
    assert all("note" not in r for r in rows)  # text goes to metrics.jsonl only
    assert read_metrics(tmp_path, "trainer")[0]["note"] == "warm"


def test_mlflow_writes_a_file_store_under_the_run_dir(tmp_path):
    with Monitor(tmp_path, "explorer_a", monitor_type="mlflow", project="proj", name="exp") as mon:
        mon.log(0, {"eval/gsm8k/mean@4": 0.25})
        mon.log(1, {"reward/mean": 0.5})
        mon.log(2, {"reward/mean": 0.75})
    assert mlflow_uri(tmp_path).startswith("file:") and (tmp_path / "monitor" / "mlflow").is_dir()
    run, client = mlflow_runs(mlflow_uri(tmp_path), "proj")["exp_explorer_a"]
    assert run.info.status == "FINISHED" and run.data.tags["role"] == "explorer_a"
    history = client.get_metric_history(run.info.run_id, "reward/mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.5), (2, 0.75)]
    history = client.get_metric_history(run.info.run_id, "eval/gsm8k/mean_at_4")
    assert [(m.step, m.value) for m in history] == [(0, 0.25)]


def test_mlflow_tracking_uri_from_the_environment_wins(tmp_path, monkeypatch):
    elsewhere = (tmp_path / "elsewhere").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", elsewhere)
    with Monitor(tmp_path / "run", "trainer", monitor_type="mlflow", project="p", name="n") as mon:
        mon.log(1, {"pg_loss": 1.0})
    assert not (tmp_path / "run" / "monitor" / "mlflow").exists()
    assert list(mlflow_runs(elsewhere, "p")) == ["n_trainer"]


def test_several_monitors_at_once(tmp_path):
    kinds = ["tensorboard", "wandb", "mlflow"]
    for role, value in (("trainer", 1.0), ("explorer_a", 2.0)):
        with Monitor(tmp_path, role, monitor_type=kinds, project="proj", name="exp") as mon:
            mon.log(3, {"x": value})
        assert list(tensorboard_dir(tmp_path, role).glob("events.out.tfevents.*"))
        assert read_metrics(tmp_path, role)[0]["x"] == value
    names = {}
    for folder in wandb_dir(tmp_path).glob("offline-run-*"):
        run, rows = wandb_history(folder)
        names[run.display_name] = [(r["_step"], r["x"]) for r in rows]
    assert names == {"exp_trainer": [(3, 1.0)], "exp_explorer_a": [(3, 2.0)]}
    runs = mlflow_runs(mlflow_uri(tmp_path), "proj")  # one experiment, a run per role
    assert {
        name: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "x")]
        for name, (run, client) in runs.items()
    } == names


def test_wandb_mode_decides_offline_without_a_key_or_a_reachable_host(tmp_path):
    assert wandb_mode({"WANDB_MODE": "disabled"}) == (None, "WANDB_MODE=disabled")
    home = {"HOME": str(tmp_path)}  # no ~/.netrc there
    assert wandb_mode(home)[0] == "offline"
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        assert wandb_mode({**home, "WANDB_API_KEY": "k", "WANDB_BASE_URL": url})[0] == "online"
        (tmp_path / ".netrc").write_text("machine 127.0.0.1 login user password k\n")
        assert wandb_mode({**home, "WANDB_BASE_URL": url})[0] == "online"
    mode, why = wandb_mode({**home, "WANDB_API_KEY": "k", "WANDB_BASE_URL": url})  # port closed
    assert mode == "offline" and "not reachable" in why


def test_a_missing_package_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(MlflowSink, "module", "rft_no_such_module")
    check_packages(["tensorboard", "wandb", "console"])
    with pytest.raises(ConfigError, match="'mlflow' needs the mlflow-skinny package"):
        check_packages(["tensorboard", "mlflow"])
    with pytest.raises(ConfigError, match="mlflow-skinny"):
        Monitor(tmp_path, "trainer", monitor_type=["tensorboard", "mlflow"])


def test_launch_prints_where_each_chosen_monitor_writes(tmp_path):
    from types import SimpleNamespace

    from rft.launch.submit import tunnel_hint

    cfg = SimpleNamespace(run_dir=tmp_path, monitor=SimpleNamespace(monitor_type="tensorboard"))
    assert tunnel_hint(cfg).startswith("TensorBoard: ")
    cfg.monitor.monitor_type = ["wandb", "mlflow"]
    assert tunnel_hint(cfg).splitlines() == [
        f"wandb: {wandb_dir(tmp_path)}; upload offline runs with `wandb sync {wandb_dir(tmp_path)}`",
        f"MLflow: {mlflow_uri(tmp_path)} (unless MLFLOW_TRACKING_URI is set)",
    ]


def test_the_per_step_line_shows_both_sides_waits_and_the_backlog_under_the_names_logged():
    """rft-run's per-step line names metrics that the trainer, explorer and reader really log:
    the backlog key is the reader's counter under the trainer's buffer prefix."""
    from rft.buffer.experience import ReaderStats

    stats = {
        f"{BUFFER_STATS_PREFIX}{k}": v for k, v in ReaderStats(backlog_segments=3).as_dict().items()
    }
    assert stats[BUFFER_BACKLOG] == 3
    assert {READ_TIME_S, EXPLORER_WAIT_S, BUFFER_BACKLOG} <= set(PROGRESS_KEYS)


@pytest.mark.parametrize("explorer_row", [True, False])
def test_the_per_step_line_merges_the_explorers_step_only_in_mode_both(
    tmp_path, capsys, explorer_row
):
    """rft-run's line for trainer step s carries the explorer's step s where the two are one
    batch (mode both); an asynchronous trainer's step s trains whatever was sealed, so another
    process's step s is not shown beside it."""
    from rft.launch.local import ProgressPrinter

    def write(role: str, rows: list[dict]) -> None:
        path = metrics_path(tmp_path, role)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    write("explorer_e", [{"step": 1, "reward/mean": 0.75, "wait_time_s": 2.0}])
    printer = ProgressPrinter(tmp_path, "trainer", "explorer_e" if explorer_row else None, 4)
    write("trainer", [{"step": 1, "pg_loss": 0.5, "time/read_s": 1.0}])
    printer.poll()
    line = capsys.readouterr().out.strip()
    assert line.startswith("[rft] trainer step 1/4 pg_loss=0.5") and "time/read_s=1" in line
    assert ("reward/mean=0.75" in line and "wait_time_s=2" in line) == explorer_row
