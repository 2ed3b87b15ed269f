"""Monitor: metrics.jsonl lines, TensorBoard events, disabled ranks, torn lines."""

from __future__ import annotations

import torch

from rft.monitor import (
    Monitor,
    format_metrics,
    metrics_path,
    read_metrics,
    tensorboard_dir,
)


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
