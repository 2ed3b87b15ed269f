"""``benchmarks/gpu_suite.py`` (issue 35's GPU table in one command): its targets and table from
measured rows, and the whole suite on CPU with the tiny shape (``--tiny``), table and JSON."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from benchmarks.common import RESULTS_DIR_ENV, module_cmd

REPO = Path(__file__).resolve().parent.parent


def test_targets_are_the_issues_ratios_of_the_rows_measured():
    from benchmarks import gpu_suite

    rows = {
        "naive padded loop": {"s_per_step": 3.0},
        "ZeRO-2 eager": {"s_per_step": 2.0, "publish_vs_raw_runs": [0.9, 1.2, 1.4]},
        "ZeRO-2 compile_layers": {"s_per_step": 1.5, "mfu": 0.41},
        "ZeRO-3 eager": {"s_per_step": 2.4},
    }
    got = {t["target"]: (t["value"], t["met"]) for t in gpu_suite.targets(rows)}
    assert got["compiled vs eager ZeRO-2"] == (pytest.approx(2.0 / 1.5), True)
    assert got["compiled MFU"] == (0.41, True)
    assert got["rft (compiled) vs naive loop"] == (2.0, True)
    assert got["ZeRO-3 vs ZeRO-2"] == (pytest.approx(2.0 / 2.4), True)  # 0.83 >= 0.8
    assert got["packed vs padded"] == (None, None)  # not measured: no verdict
    assert got["publish vs raw write, each run"] == ([0.9, 1.2, 1.4], False)  # 1.4 > 1.3


def test_the_table_says_which_row_failed_and_which_attention_packed_rows_used():
    from benchmarks import gpu_suite

    rows = {
        "naive padded loop": {"s_per_step": 2.0, "tokens": 1000, "peak_gib": 1.0},
        "ZeRO-2 padding_free": {
            "s_per_step": 1.0,
            "tokens": 1000,
            "peak_gib": 2.0,
            "mfu": 0.25,
            "attention": "flex_attention",
        },
        "ZeRO-3 eager": {"error": "timed out after 60 s"},
    }
    lines = gpu_suite.table(rows).splitlines()
    assert lines[2] == "| naive padded loop | 2.000 | 500 | - | 1.00x | 1.0 |"
    assert (
        lines[3] == "| ZeRO-2 padding_free (flex_attention) | 1.000 | 1000 | 0.250 | 2.00x | 2.0 |"
    )
    assert lines[4].startswith("| ZeRO-3 eager | failed: timed out after 60 s |")


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("g++") is None, reason="torch.compile on CPU needs a C++ compiler")
def test_the_tiny_suite_runs_every_row_on_cpu_and_writes_the_table_as_json(tmp_path):
    out = tmp_path / "suite.json"
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    env[RESULTS_DIR_ENV] = str(tmp_path / "results")  # the run's record stays out of the repository
    done = subprocess.run(
        [*module_cmd("gpu_suite"), "--tiny", "--model", str(tmp_path / "model")]
        + ["--out", str(out), "--budget-s", "600"],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["shape"] == "tiny" and report["device"] == "cpu" and report["params"] > 0
    from benchmarks import gpu_suite

    assert list(report["rows"]) == list(gpu_suite.ROWS)
    for name, row in report["rows"].items():
        assert "error" not in row, (name, row)
        assert row["s_per_step"] > 0 and row["tokens"] > 0, name
    assert report["rows"]["ZeRO-2 padding_free"]["attention"] == "sdpa"  # CPU: no flex backward
    assert len(report["rows"]["ZeRO-2 eager"]["publish_vs_raw_runs"]) == 3
    assert {t["target"] for t in report["targets"]} >= {"compiled vs eager ZeRO-2"}
    assert all(t["value"] is not None for t in report["targets"] if "MFU" not in t["target"])
    assert "| ZeRO-2 compile_layers |" in done.stdout and "| naive padded loop |" in done.stdout
