"""Metrics out: one ``key=value`` log line per step, TensorBoard, and a ``metrics.jsonl``.

Each role (``trainer``, ``explorer_<name>``) owns a :class:`Monitor` writing under the run
directory (``rft.rundir.MONITOR_DIR``)::

    monitor/tensorboard/<role>/   TensorBoard event files (read through an SSH tunnel)
    monitor/<role>/metrics.jsonl  one JSON object per step: {"step", "time", <metrics>}

Only rank 0 of a role writes; other ranks get a monitor that does nothing. The JSONL file is
appended by its single writer and flushed per line, so a reader sees whole lines (a torn last
line after a crash is skipped by :func:`read_metrics`).

Metric names that one module writes and another reads (the progress line of ``rft-run``,
``rft-status``, tests) are the constants below; writer and readers both import them.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from rft.rundir import MONITOR_DIR

log = logging.getLogger("rft.monitor")

POLICY_LOSS = "pg_loss"  # trainer: the policy loss of the step
REWARD_MEAN = "reward/mean"  # explorer: mean reward of the step's experiences
ACCURACY = "accuracy"  # explorer: mean accuracy part (or reward) of the step's experiences
TOKENS_PER_S = "tokens_per_s"  # trainer: batch tokens per second of training compute
WEIGHTS_VERSION = "weights_version"  # both: weights version in use after the step
STALENESS_MEAN = "staleness/mean"  # trainer: mean weights versions between rollout and update
STALENESS_MAX = "staleness/max"  # trainer: largest such gap in the step
STEP_TIME_S = "time/step_s"  # trainer: wall time of the step (read, update, publish)
READ_TIME_S = "time/read_s"  # trainer: waiting for and reading the step's experiences
PUBLISH_TIME_S = "time/publish_s"  # trainer: gathering and publishing weights
# What rft-run prints per step (the trainer's row merged with the explorer's of that step).
PROGRESS_KEYS = (POLICY_LOSS, REWARD_MEAN, ACCURACY, TOKENS_PER_S, WEIGHTS_VERSION,
                 STALENESS_MEAN, STEP_TIME_S)


def metrics_path(run_dir: Path | str, role: str) -> Path:
    return Path(run_dir) / MONITOR_DIR / role / "metrics.jsonl"


def tensorboard_dir(run_dir: Path | str, role: str | None = None) -> Path:
    """A role's TensorBoard folder, or (no role) the folder to point ``tensorboard --logdir`` at."""
    root = Path(run_dir) / MONITOR_DIR / "tensorboard"
    return root / role if role else root


class Monitor:
    """Writes a role's per-step metrics to the log, TensorBoard and metrics.jsonl."""

    def __init__(self, run_dir: Path | str, role: str, *, monitor_type: str = "tensorboard",
                 enabled: bool = True, flush_interval_s: float = 10.0):
        self.role = role
        self.enabled = enabled
        self._tb = None
        self._jsonl = None
        if not enabled:
            return
        path = metrics_path(run_dir, role)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._jsonl = path.open("a", encoding="utf-8")
        if monitor_type == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(tensorboard_dir(run_dir, role)),
                                     flush_secs=max(1, int(flush_interval_s)))

    def log(self, step: int, metrics: dict[str, Any], prefix: str = "") -> None:
        """Record ``metrics`` (numbers; others are skipped in TensorBoard) for ``step``."""
        if not self.enabled:
            return
        clean = {f"{prefix}{k}": _plain(v) for k, v in metrics.items()}
        assert self._jsonl is not None
        self._jsonl.write(json.dumps({"step": step, "time": time.time(), **clean}) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            for key, value in clean.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(key, value, step)
        log.info("%s step=%d %s", self.role, step, format_metrics(clean))

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None

    def __enter__(self) -> "Monitor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _plain(value: Any) -> Any:
    """Tensors and numpy scalars to Python numbers; NaN/inf kept as floats."""
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    return value


def format_metrics(metrics: dict[str, Any]) -> str:
    """``key=value`` pairs, numbers shortened to 4 significant digits."""
    parts = []
    for key, value in metrics.items():
        if isinstance(value, float) and math.isfinite(value):
            value = f"{value:.4g}"
        parts.append(f"{key}={value}")
    return " ".join(parts)


def read_metrics(run_dir: Path | str, role: str) -> list[dict[str, Any]]:
    """All complete lines of a role's metrics.jsonl (a torn last line is skipped)."""
    path = metrics_path(run_dir, role)
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            log.warning("%s: skipping a torn metrics line", path)
    return rows
