"""Submitting to SLURM from the login node: which job a config makes, submission, waiting.

Input: a checked config; output: a job id, then (``--wait``) its end and its log's tail. The job
is :mod:`rft.launch.slurm`'s, submitted through submitit (the default) or as the rendered script,
after :func:`rft.rundir.prepare` made sure no other experiment owns the run directory.
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

from rft import stages
from rft.config.load import config_to_yaml, stage_label
from rft.config.schema import Config
from rft.errors import EXIT_FAILED, EXIT_OK, ConfigError, SlurmError
from rft.launch import slurm
from rft.monitor import mlflow_uri, monitor_names, tensorboard_dir, wandb_dir
from rft.rundir import prepare, recorded_mode, tail_log


def launch_mode(cfg: Config) -> str:
    """The job ``rft-launch`` submits for ``cfg``: the mode (both, explore or train) whose roles
    it holds. A staged config's job holds every stage's roles, sized by the base config; its
    workers run the stages in order (:func:`rft.launch.worker.run_stages`)."""
    if "bench" in stages.modes(cfg):
        raise ConfigError("mode 'bench' runs on one node: use bin/rft-run")
    mode = stages.job_mode(cfg)
    wanted = slurm.groups(cfg, mode)
    for index in range(len(cfg.stages)):
        stage = stages.resolve(cfg, index, chain=False)
        if slurm.groups(stage, mode) != wanted:
            raise ConfigError(
                f"{stage_label(cfg, index)} changes the cluster or "
                "explorer.rollout_model sizes; one SLURM job runs every stage on "
                "the same nodes, so set cluster and rollout_model in the base "
                "config only"
            )
    return mode


def explorer_mode(cfg: Config) -> str:
    """``rft-add-explorer`` joins asynchronous runs only, with a mode 'explore' config."""
    if "both" in (cfg.mode, recorded_mode(cfg.run_dir)):
        raise ConfigError(
            "an explorer joins asynchronous runs only: in mode 'both' the trainer "
            "waits for a fixed set of explorers each step. Run the explorer and "
            "trainer as separate jobs (mode explore / mode train, configs/async/)"
        )
    if cfg.mode != "explore":
        raise ConfigError(
            f"rft-add-explorer needs a mode 'explore' config, not '{cfg.mode}' "
            "(see configs/async/explorer_new.yaml)"
        )
    return "explore"


def tunnel_hint(cfg: Config) -> str:
    """Where to read the run's metrics: a line per chosen monitor (none for console)."""
    host = socket.getfqdn()
    kinds = monitor_names(cfg.monitor.monitor_type)
    lines = []
    if "tensorboard" in kinds:
        logdir = tensorboard_dir(cfg.run_dir)
        lines.append(
            f"TensorBoard: on {host} run `tensorboard --logdir {logdir} --port 6006`, then "
            f"on your laptop `ssh -N -L 6006:localhost:6006 {host}` and open "
            "http://localhost:6006"
        )
    if "wandb" in kinds:
        lines.append(
            f"wandb: {wandb_dir(cfg.run_dir)}; upload offline runs with `wandb sync "
            f"{wandb_dir(cfg.run_dir)}`"
        )
    if "mlflow" in kinds:
        lines.append(f"MLflow: {mlflow_uri(cfg.run_dir)} (unless MLFLOW_TRACKING_URI is set)")
    return "\n".join(lines)


def submit(
    cfg: Config, config_path: Path, overrides: list[str], mode: str, *, use_sbatch: bool
) -> str:
    """Prepare the run directory and submit the job for ``mode``; returns the job id."""
    prepare(cfg.run_dir, config_to_yaml(cfg), f"launch-{mode}")
    if use_sbatch:
        return slurm.sbatch(slurm.render(cfg, config_path, overrides, mode=mode))
    from rft.launch.worker import het_task

    executor = slurm.submitit_executor(cfg, mode)
    roles = [g.role for g in slurm.groups(cfg, mode)]
    try:
        job = executor.submit(het_task, roles, ["--config", str(config_path), *overrides])
    except Exception as e:  # submitit wraps sbatch's refusal in its own error types
        raise SlurmError(slurm.explain_sbatch_error(str(e).strip())) from e
    return str(job.job_id)


def job_log(cfg: Config, job_id: str, use_sbatch: bool) -> Path:
    """The log file of a submitted job."""
    return slurm.sbatch_log(cfg, job_id) if use_sbatch else slurm.submitit_log(cfg, job_id)


def wait_for(job_id: str, cfg: Config, use_sbatch: bool, poll_s: float = 5.0) -> int:
    """Block until the job ends; EXIT_OK if it completed, else EXIT_FAILED with its log's tail."""
    ended = (
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
    )
    state = slurm.job_state(job_id)
    while state is not None and state.split()[0] not in ended:
        time.sleep(poll_s)
        state = slurm.job_state(job_id)
    if state == "COMPLETED":
        print(f"job {job_id} completed")
        return EXIT_OK
    log = job_log(cfg, job_id, use_sbatch)
    print(
        f"error: job {job_id} ended {state or 'and is no longer known to SLURM'}; the last "
        f"lines of {log}:\n{tail_log(log)}",
        file=sys.stderr,
    )
    return EXIT_FAILED
