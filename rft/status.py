"""``rft-status RUN_DIR``: where a run stands, read from its files only (no SLURM query).

Reads the trainer's metrics, the weights pointer, the explorers' heartbeats, the newest full
checkpoint and, per buffer writer, its sealed segments (by file name: none is opened), how far
the checkpoint's cursor consumed them and the fault counters the trainer's reader logged, and
per explorer its workflow runs that failed (from its metrics). Prints where the pipeline waits (trainer on experiences, explorers on weights) and which side to
scale; a weights pointer no explorer can follow is an ``error:`` and exit code 2. Writes nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rft import atomic
from rft.buffer.experience import parse_writer_stat_key
from rft.buffer.segment_file import format_seqs, list_segments, list_writers
from rft.config.schema import ExplorerConfig
from rft.entry import run_command
from rft.errors import EXIT_OK, EXIT_USER_ERROR, RftError
from rft.monitor import (
    EPISODE_ERRORS,
    EPISODE_FAILED,
    EPISODE_TIMEOUTS,
    EPISODES,
    EXPLORER_STEP_S,
    EXPLORER_WAIT_S,
    READ_TIME_S,
    STEP_TIME_S,
    SYNC_BROADCAST_OK,
    SYNC_GENERATION,
    SYNC_MEMBERS,
    TOKENS_PER_S,
    WEIGHTS_VERSION,
    read_metrics,
)
from rft.rundir import (
    BUFFER_DIR,
    CHECKPOINT_POINTER,
    CONFIG_FILE,
    MONITOR_DIR,
    TRAINER_META,
    WEIGHTS_POINTER,
    step_dir,
)
from rft.sync.failures import ExplorerFailure, read_failures
from rft.sync.heartbeat import (
    EVALUATING_FIELD,
    LOADED_FIELD,
    STEPS_FIELD,
    read_heartbeats,
    starting_explorers,
)
from rft.sync.versions import pointer_fault, trainer_state


@dataclass
class WriterStatus:
    """One buffer writer (explorer task), from its segment file names and the trainer's files."""

    name: str
    sealed: list[int]  # seqs of its sealed segments present (consumed ones are released)
    next_seq: int | None  # the checkpoint cursor's segment to read next (None: not read yet)
    offset: int  # record lines of next_seq consumed
    counters: dict[str, int] = field(default_factory=dict)  # the reader's, from metrics.jsonl

    @property
    def backlog(self) -> int:
        """Sealed segments not consumed yet."""
        return sum(1 for seq in self.sealed if seq >= (self.next_seq or 0))

    @property
    def missing(self) -> list[int]:
        """Seqs absent between the cursor (or the oldest segment) and the newest segment."""
        if not self.sealed:
            return []
        present = set(self.sealed)
        start = self.sealed[0] if self.next_seq is None else self.next_seq
        return [seq for seq in range(start, self.sealed[-1]) if seq not in present]


@dataclass
class RunStatus:
    """Facts about a run directory."""

    run_dir: Path
    trainer_step: int | None  # newest step with trainer metrics
    tokens_per_s: float | None  # trainer throughput at that step
    weights_version: int | None  # the trainer's newest (its metrics; else the folder pointer)
    checkpoint_step: int | None  # newest complete full checkpoint
    explorers: list  # rft.sync.heartbeat.ExplorerStatus
    backlog_segments: int  # sealed segments after the checkpoint's cursor
    explorer_steps: dict[str, int]  # newest explored step per explorer monitor
    writers: list[WriterStatus] = field(default_factory=list)  # buffer writer folders
    trainer_idle: float | None = None  # share of recent trainer time waiting for experiences
    explorer_idle: dict[str, float] = field(
        default_factory=dict
    )  # monitor -> share waiting for weights
    broadcast: dict[str, float] = field(default_factory=dict)  # the last step's sync/* (nccl)
    trainer: str = ""  # what the trainer's lease says (running or not, host, pid, heartbeat)
    pointer: tuple[str, bool] | None = None  # rft.sync.versions.pointer_fault: (message, fatal)
    starting: list[str] = field(default_factory=list)  # explorers with a lease, no heartbeat yet
    episodes: dict[str, EpisodeTotals] = field(default_factory=dict)  # monitor -> its runs
    stopped: list[ExplorerFailure] = field(default_factory=list)  # explorers stopped on failures


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


def list_buffer(run_dir: Path) -> dict[str, list[int]]:
    """Writer -> sealed segment seqs (file names only)."""
    buffer_dir = run_dir / BUFFER_DIR
    if not buffer_dir.is_dir():
        return {}
    return {writer: list_segments(buffer_dir / writer) for writer in list_writers(buffer_dir)}


def writer_statuses(
    listing: dict[str, list[int]], cursor: dict, trainer_row: dict
) -> list[WriterStatus]:
    """Each writer's segments, consumed position and the trainer reader's counters for it."""
    positions = cursor.get("segments")
    positions = (
        {w: p for w, p in positions.items() if isinstance(p, dict)}
        if isinstance(positions, dict)
        else {}
    )  # another storage_type's cursor, or a damaged one
    counters: dict[str, dict[str, int]] = {}
    for key, value in trainer_row.items():
        parsed = parse_writer_stat_key(key)
        if parsed:
            counters.setdefault(parsed[0], {})[parsed[1]] = value
    out = []
    for writer in sorted(set(listing) | set(positions)):
        pos = positions.get(writer, {})
        out.append(
            WriterStatus(
                writer,
                listing.get(writer, []),
                pos.get("seq"),
                pos.get("offset", 0),
                counters.get(writer, {}),
            )
        )
    return out


# ----------------------------------------------------------------------------- episodes


@dataclass
class EpisodeTotals:
    """An explorer's workflow runs (episodes) over the run, summed from its metrics rows."""

    episodes: int = 0  # runs
    failed: int = 0  # runs that raised
    timeouts: int = 0  # runs stopped at explorer.max_timeout
    errors: Counter[str] = field(default_factory=Counter)  # error line -> runs that failed so


def episode_totals(rows: list[dict]) -> EpisodeTotals | None:
    """The episode counts of an explorer's metrics rows; None when no row has any (no step ran
    a workflow class). Rows written before ``episodes/errors`` existed add counts only."""
    rows = [r for r in rows if EPISODES in r]
    if not rows:
        return None
    totals = EpisodeTotals()
    for row in rows:
        totals.episodes += _count(row.get(EPISODES))
        totals.failed += _count(row.get(EPISODE_FAILED))
        totals.timeouts += _count(row.get(EPISODE_TIMEOUTS))
        errors = row.get(EPISODE_ERRORS)
        if isinstance(errors, dict):
            totals.errors.update({str(e): _count(n) for e, n in errors.items() if _count(n) > 0})
    return totals


def _count(value: object) -> int:
    """A count from a metrics row; 0 for anything else (absent, NaN, a string)."""
    ok = isinstance(value, (int, float)) and math.isfinite(value)
    return int(value) if ok else 0


def format_episodes(t: EpisodeTotals) -> str:
    """``episodes: 12 of 64 failed (18.8%), 2 timed out; most frequent error (9x): ...``."""
    share = f" ({t.failed / t.episodes:.1%})" if t.episodes else ""
    line = f"episodes: {t.failed} of {t.episodes} failed{share}"
    if t.timeouts:
        line += f", {t.timeouts} timed out"
    if t.errors:
        error, n = t.errors.most_common(1)[0]
        line += f"; most frequent error ({n}x): {error}"
    return line


# ----------------------------------------------------------------------------- pipeline

IDLE_ADVICE_FRAC = 0.5  # a side waiting this share of its recent wall time gets advice
RECENT_STEPS = 5  # steps the idle shares are averaged over


def idle_fraction(
    rows: list[dict], wait_key: str, step_key: str, last_n: int = RECENT_STEPS
) -> float | None:
    """Share of the last ``last_n`` steps' wall time spent waiting (None without timings)."""
    timed = [
        r
        for r in rows
        if isinstance(r.get(wait_key), (int, float)) and isinstance(r.get(step_key), (int, float))
    ][-last_n:]
    total = sum(r[step_key] for r in timed)
    return sum(r[wait_key] for r in timed) / total if total > 0 else None


def pipeline_advice(trainer_idle: float | None, explorer_idle: dict[str, float]) -> list[str]:
    """Who the bottleneck is, as advice, when one side idles above IDLE_ADVICE_FRAC."""
    advice = []
    if trainer_idle is not None and trainer_idle >= IDLE_ADVICE_FRAC:
        advice.append(
            f"trainer idle {trainer_idle:.0%} waiting for experiences: the explorers "
            "are the bottleneck; add explorers with rft-add-explorer (asynchronous "
            "runs) or raise explorer.rollout_model.engine_num"
        )
    waiting = {name: f for name, f in explorer_idle.items() if f >= IDLE_ADVICE_FRAC}
    if waiting:
        worst = max(waiting.values())
        advice.append(
            f"explorer(s) {', '.join(sorted(waiting))} idle up to {worst:.0%} waiting "
            "for weights: the trainer is the bottleneck; raise synchronizer.sync_offset "
            "(train one step behind) or give the trainer more GPUs"
        )
    return advice


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
        raise RftError(
            f"{run_dir} is not a run directory (expected <checkpoint_root_dir>/<project>/<name>)"
        )
    live_s = live_threshold_s or heartbeat_timeout_s(run_dir)
    listing = list_buffer(run_dir)  # before the cursor: a release in between fakes no gap
    rows = read_metrics(run_dir, "trainer")
    last = rows[-1] if rows else {}
    checkpoint = atomic.read_pointer(run_dir / CHECKPOINT_POINTER)
    writers = writer_statuses(listing, _cursor(run_dir, checkpoint), last)
    monitors = run_dir / MONITOR_DIR
    explorer_steps, explorer_idle, episodes = {}, {}, {}
    for folder in sorted(monitors.glob("explorer_*")) if monitors.is_dir() else []:
        explored = read_metrics(run_dir, folder.name)
        if explored:
            explorer_steps[folder.name] = explored[-1].get("step")
            idle = idle_fraction(explored, EXPLORER_WAIT_S, EXPLORER_STEP_S)
            if idle is not None:
                explorer_idle[folder.name] = idle
            totals = episode_totals(explored)
            if totals is not None:
                episodes[folder.name] = totals
    # With sync_method nccl the folder pointer moves only at checkpoints and faults: the
    # trainer's metrics know its newest version.
    versions = [
        v
        for v in (last.get(WEIGHTS_VERSION), atomic.read_pointer(run_dir / WEIGHTS_POINTER))
        if isinstance(v, int)
    ]
    return RunStatus(
        run_dir,
        last.get("step"),
        last.get(TOKENS_PER_S),
        max(versions) if versions else None,
        checkpoint,
        read_heartbeats(run_dir, live_s),
        sum(w.backlog for w in writers),
        explorer_steps,
        writers,
        idle_fraction(rows, READ_TIME_S, STEP_TIME_S),
        explorer_idle,
        {k: last[k] for k in (SYNC_BROADCAST_OK, SYNC_MEMBERS, SYNC_GENERATION) if k in last},
        trainer_state(run_dir, live_s)[1],
        pointer_fault(run_dir, live_s),
        starting_explorers(run_dir, live_s),
        episodes,
        read_failures(run_dir),
    )


def format_status(st: RunStatus) -> str:
    tps = f", {st.tokens_per_s:.0f} tokens/s" if st.tokens_per_s else ""
    lines = [
        f"run directory   {st.run_dir}",
        f"trainer step    {st.trainer_step if st.trainer_step is not None else '-'}{tps}",
        f"weights version {st.weights_version if st.weights_version is not None else '-'}",
        f"checkpoint      {st.checkpoint_step if st.checkpoint_step is not None else '-'}",
        f"trainer lease   {st.trainer}",
        *format_broadcast(st.broadcast),
        f"buffer backlog  {st.backlog_segments} sealed segment(s) not yet consumed",
    ]
    lines += [format_writer(w) for w in st.writers]
    for name, step in st.explorer_steps.items():
        lines.append(f"{name:<15} explored step {step}")
        if name in st.episodes:
            lines.append(f"{name:<15} {format_episodes(st.episodes[name])}")
    for ex in st.explorers:
        state = "live" if ex.live else ("exited" if ex.exited else "DEAD")
        f = ex.fields
        lines.append(
            f"explorer {ex.name:<14} {state:<6} heartbeat {ex.age_s:.0f}s ago, "
            f"host {f.get('host', '?')}, job {f.get('slurm_job_id') or '-'}, "
            f"version {f.get(LOADED_FIELD, '-')}, steps {f.get(STEPS_FIELD, '-')}"
            + (", evaluating" if ex.live and f.get(EVALUATING_FIELD) else "")
        )
    for name in st.starting:
        lines.append(
            f"explorer {name:<14} starting (holds its lease; no heartbeat until its engine runs)"
        )
    if not st.explorers and not st.starting:
        lines.append("explorers       none have written a heartbeat")
    lines += [f"stopped         {failure.message}" for failure in st.stopped]
    lines += format_pipeline(st)
    if st.pointer is not None and not st.pointer[1]:
        lines.append(f"warning         {st.pointer[0]}")
    return "\n".join(lines)


def format_broadcast(sync: dict[str, float]) -> list[str]:
    """The weight-sync group at the trainer's last step (``sync_method: nccl``), if any."""
    if not sync:
        return []
    if not sync.get(SYNC_BROADCAST_OK):
        return [
            "weight sync     broadcast: the last version went to a folder (no explorer "
            "registered, or one failed: see the trainer's log)"
        ]
    return [
        f"weight sync     broadcast to {sync.get(SYNC_MEMBERS, 0):.0f} explorer(s), group "
        f"generation {sync.get(SYNC_GENERATION, 0):.0f}"
    ]


def format_pipeline(st: RunStatus) -> list[str]:
    """Where each side waits (last RECENT_STEPS steps), the weights lag, and advice."""
    parts = []
    if st.trainer_idle is not None:
        parts.append(f"trainer waits {st.trainer_idle:.0%} for experiences")
    parts += [f"{name} waits {f:.0%} for weights" for name, f in st.explorer_idle.items()]
    loaded = [ex.fields.get(LOADED_FIELD) for ex in st.explorers if ex.live]
    loaded = [v for v in loaded if isinstance(v, int)]
    if loaded and st.weights_version is not None:
        parts.append(
            f"explorers {st.weights_version - min(loaded)} version(s) behind the trainer's "
            "newest weights"
        )
    lines = [f"pipeline        {'; '.join(parts)} (last {RECENT_STEPS} steps)"] if parts else []
    return lines + [
        f"advice          {a}" for a in pipeline_advice(st.trainer_idle, st.explorer_idle)
    ]


def format_writer(w: WriterStatus) -> str:
    """``writer explorer-0  sealed 3 (newest seq 9), consumed seqs < 8 + 4 lines, ...``."""
    newest = f" (newest seq {w.sealed[-1]})" if w.sealed else ""
    consumed = "nothing" if w.next_seq is None else f"seqs < {w.next_seq}"
    if w.offset:
        consumed += f" + {w.offset} lines of seq {w.next_seq}"
    line = f"writer {w.name:<16} sealed {len(w.sealed)}{newest}, consumed {consumed}"
    if w.missing:
        line += f", MISSING seqs {format_seqs(w.missing)}"
    counters = " ".join(f"{k}={v}" for k, v in sorted(w.counters.items()) if v)
    return line + (f", trainer reader: {counters}" if counters else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rft-status", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", help="<checkpoint_root_dir>/<project>/<name>")
    parser.add_argument(
        "--dead-after-s",
        type=float,
        default=None,
        help="a heartbeat older than this marks an explorer dead (default: the "
        "run's explorer.heartbeat_timeout_s)",
    )
    args = parser.parse_args(argv)

    def body() -> int:
        st = collect(Path(args.run_dir), args.dead_after_s)
        print(format_status(st), flush=True)
        if st.pointer is not None and st.pointer[1]:  # no explorer can start or go on
            print(f"error: {st.pointer[0]}", file=sys.stderr, flush=True)
            return EXIT_USER_ERROR
        return EXIT_OK

    return run_command(body)
