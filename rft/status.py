"""``rft-status RUN_DIR``: where a run stands, read from its files only (no SLURM query needed).

Reads the trainer's ``metrics.jsonl`` (step, throughput), the weights pointer, the explorers'
heartbeats (live or dead by age), the buffer backlog (sealed segments not yet consumed, from
the newest checkpoint's cursor), and the newest full checkpoint.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from rft import atomic
from rft.buffer.segments import list_segments, list_writers
from rft.config.schema import ExplorerConfig
from rft.entry import run_command
from rft.errors import RftError
from rft.monitor import TOKENS_PER_S, read_metrics
from rft.rundir import (
    BUFFER_DIR,
    CHECKPOINT_POINTER,
    CONFIG_FILE,
    MONITOR_DIR,
    TRAINER_META,
    WEIGHTS_POINTER,
    step_dir,
)
from rft.sync import read_heartbeats


@dataclass
class RunStatus:
    """Facts about a run directory."""

    run_dir: Path
    trainer_step: int | None  # newest step with trainer metrics
    tokens_per_s: float | None  # trainer throughput at that step
    weights_version: int | None  # the sync pointer
    checkpoint_step: int | None  # newest complete full checkpoint
    explorers: list  # rft.sync.ExplorerStatus
    backlog_segments: int  # sealed segments after the checkpoint's cursor
    explorer_steps: dict[str, int]  # newest explored step per explorer monitor


def _cursor(run_dir: Path, step: int | None) -> dict:
    if step is None:
        return {}
    meta = step_dir(run_dir, step) / TRAINER_META
    if not meta.is_file():
        meta = run_dir / TRAINER_META
    try:
        return json.loads(meta.read_text()).get("buffer_cursor") or {}
    except (OSError, ValueError):
        return {}


def backlog(run_dir: Path, cursor: dict) -> int:
    """Sealed segments the trainer has not consumed as of ``cursor``."""
    buffer_dir = run_dir / BUFFER_DIR
    if not buffer_dir.is_dir():
        return 0
    positions = cursor.get("segments", {})
    total = 0
    for writer in list_writers(buffer_dir):
        next_seq = positions.get(writer, {}).get("seq", -1)
        total += sum(1 for seq in list_segments(buffer_dir / writer) if seq >= next_seq)
    return total


def heartbeat_timeout_s(run_dir: Path) -> float:
    """The run's ``explorer.heartbeat_timeout_s``, from the config it was started with."""
    try:
        recorded = yaml.safe_load((run_dir / CONFIG_FILE).read_text()) or {}
    except (OSError, yaml.YAMLError):
        recorded = {}
    value = (recorded.get("explorer") or {}).get("heartbeat_timeout_s")
    return float(value) if value is not None else ExplorerConfig().heartbeat_timeout_s


def collect(run_dir: Path, live_threshold_s: float | None = None) -> RunStatus:
    """The run's state; an explorer is dead after ``live_threshold_s`` without a heartbeat
    (default: the run's ``explorer.heartbeat_timeout_s``)."""
    if not run_dir.is_dir():
        raise RftError(f"{run_dir} is not a run directory (expected "
                       "<checkpoint_root_dir>/<project>/<name>)")
    rows = read_metrics(run_dir, "trainer")
    last = rows[-1] if rows else {}
    checkpoint = atomic.read_pointer(run_dir / CHECKPOINT_POINTER)
    monitors = run_dir / MONITOR_DIR
    explorer_steps = {}
    for folder in sorted(monitors.glob("explorer_*")) if monitors.is_dir() else []:
        explored = read_metrics(run_dir, folder.name)
        if explored:
            explorer_steps[folder.name] = explored[-1].get("step")
    return RunStatus(run_dir, last.get("step"), last.get(TOKENS_PER_S),
                     atomic.read_pointer(run_dir / WEIGHTS_POINTER), checkpoint,
                     read_heartbeats(run_dir, live_threshold_s or heartbeat_timeout_s(run_dir)),
                     backlog(run_dir, _cursor(run_dir, checkpoint)), explorer_steps)


def format_status(st: RunStatus) -> str:
    tps = f", {st.tokens_per_s:.0f} tokens/s" if st.tokens_per_s else ""
    lines = [f"run directory   {st.run_dir}",
             f"trainer step    {st.trainer_step if st.trainer_step is not None else '-'}{tps}",
             f"weights version {st.weights_version if st.weights_version is not None else '-'}",
             f"checkpoint      {st.checkpoint_step if st.checkpoint_step is not None else '-'}",
             f"buffer backlog  {st.backlog_segments} sealed segment(s) not yet consumed"]
    for name, step in st.explorer_steps.items():
        lines.append(f"{name:<15} explored step {step}")
    for ex in st.explorers:
        state = "live" if ex.live else ("exited" if ex.fields.get("exited") else "DEAD")
        f = ex.fields
        lines.append(f"explorer {ex.name:<14} {state:<6} heartbeat {ex.age_s:.0f}s ago, "
                     f"host {f.get('host', '?')}, job {f.get('slurm_job_id') or '-'}, "
                     f"version {f.get('loaded_version', '-')}, steps {f.get('steps_done', '-')}")
    if not st.explorers:
        lines.append("explorers       none have written a heartbeat")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rft-status", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", help="<checkpoint_root_dir>/<project>/<name>")
    parser.add_argument("--dead-after-s", type=float, default=None,
                        help="a heartbeat older than this marks an explorer dead (default: the "
                             "run's explorer.heartbeat_timeout_s)")
    args = parser.parse_args(argv)
    return run_command(lambda: print(format_status(collect(Path(args.run_dir), args.dead_after_s))))
