"""The learning report: rows -> per-step reward and per-version held-out accuracy, the summary's
numbers by hand, and a real PNG from matplotlib."""

from __future__ import annotations

import json

import pytest

from rft.monitor import metrics_path
from rft.report import (
    CURVE_FILE,
    build_report,
    edge_means,
    format_summary,
    write_report,
)

ROWS = [
    {"step": 0, "time": 1.0, "eval/weights_version": 0, "eval/qs/mean@1": 0.25, "eval/time_s": 3.0},
    {"step": 1, "time": 2.0, "reward/mean": 0.1, "accuracy": 0.1, "weights_version": 0},
    {"step": 2, "time": 3.0, "reward/mean": 0.2, "accuracy": 0.15, "weights_version": 1},
    {"step": 2, "time": 4.0, "eval/weights_version": 1, "eval/qs/mean@1": 0.3},
    {"step": 3, "time": 5.0, "reward/mean": 0.4, "accuracy": 0.35, "weights_version": 2},
    {"step": 4, "time": 6.0, "reward/mean": 0.6, "accuracy": 0.5, "weights_version": 3},
    {"step": 4, "time": 7.0, "eval/weights_version": 4, "eval/qs/mean@1": 0.45},
]


def test_report_reads_train_steps_and_evaluations_by_version():
    report = build_report(ROWS)
    assert report.reward == {1: 0.1, 2: 0.2, 3: 0.4, 4: 0.6}
    assert report.accuracy == {1: 0.1, 2: 0.15, 3: 0.35, 4: 0.5}
    # The final evaluation shares step 4 with that step's row but measured weights v4.
    assert report.held_out == {"eval/qs/mean@1": {0: 0.25, 1: 0.3, 4: 0.45}}


def test_edge_means_use_at_most_half_of_the_steps_at_each_end():
    assert edge_means({1: 0.1, 2: 0.2, 3: 0.4, 4: 0.6}, n=3) == pytest.approx((0.15, 0.5))
    assert edge_means({s: float(s) for s in range(1, 11)}, n=3) == pytest.approx((2.0, 9.0))
    assert edge_means({1: 0.5}) is None


def test_summary_states_before_after_and_the_gain_in_points():
    text = format_summary(build_report(ROWS))
    assert "held-out qs (mean@1): 0.250 (weights v0) -> 0.450 (weights v4), +20.0 points" in text
    assert (
        "train reward: 0.150 (mean of the first 2 steps) -> 0.500 (mean of the last 2 steps)"
        in text
    )


def test_summary_without_evaluation_says_how_to_get_one():
    text = format_summary(build_report([r for r in ROWS if "eval/weights_version" not in r]))
    assert "no evaluation" in text and "eval_tasksets" in text


def test_write_report_plots_a_png_into_the_run_dir(tmp_path):
    path = metrics_path(tmp_path, "explorer_explorer")
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS) + '{"step": 5, "rew')  # torn tail
    summary = write_report(tmp_path, "explorer", title="t")
    png = tmp_path / CURVE_FILE
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert summary is not None and f"learning curve: {png}" in summary
    assert not list(tmp_path.glob(".*tmp*"))
    assert write_report(tmp_path / "empty", "explorer") is None
