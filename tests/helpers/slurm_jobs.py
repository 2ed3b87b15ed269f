"""Jobs on the local SLURM cluster (for the ``slurm`` tests): overrides that shrink a CPU config,
``sbatch`` with rft's environment, waiting for a job's end or for a condition, a requeue that
starts again at once, and the logs of a job that failed."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from rft.launch.slurm import job_state
from rft.monitor import read_metrics
from tests.helpers.runs import DATA, REPO

CPU = REPO / "configs" / "cpu"
JOB_TIMEOUT_S = 900


def run_overrides(model: Path, root: Path, *extra: str) -> list[str]:
    return [
        f"model.model_path={model}",
        f"checkpoint_root_dir={root}",
        f"buffer.explorer_input.taskset.path={DATA}",
        "model.max_response_tokens=8",
        "explorer.eval_interval=0",
        "trainer.zero_stage=2",
        "trainer.precision=fp32",
        *extra,
    ]


def submit(
    env: dict, script: Path, config: Path, overrides: list[str], *sbatch_args: str, **extra_env: str
) -> str:
    job_env = dict(
        env,
        RFT_HOME=str(REPO),
        RFT_PYTHON=sys.executable,
        RFT_CONFIG=str(config),
        RFT_OVERRIDES=" ".join(overrides),
        OMP_NUM_THREADS="1",
        RFT_LOCAL_TRAINER_RANKS="1",
        **extra_env,
    )
    out = subprocess.run(
        [
            "sbatch",
            "--parsable",
            f"--output={extra_env.get('OUT', '%x-%j.out')}",
            *sbatch_args,
            str(script),
        ],
        env=job_env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(";")[0]


def wait_job(env: dict, job: str, timeout_s: float = JOB_TIMEOUT_S) -> str:
    deadline = time.time() + timeout_s
    state = None
    while time.time() < deadline:
        state = job_state(job, env)
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            return state
        time.sleep(2)
    subprocess.run(["scancel", job], env=env)
    raise AssertionError(f"job {job} still {state} after {timeout_s} s")


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def requeue_now(env: dict, job: str) -> None:
    """Requeue a running job and let it start again at once."""
    subprocess.run(["scontrol", "requeue", job], env=env, check=True, timeout=30)
    start_requeued_now(env, job)


def start_requeued_now(env: dict, job: str) -> None:
    """Once ``job`` is pending again after a requeue, let it start at once: SLURM otherwise holds
    a requeued job back for a while (about 150 s here, measured 2026-11-29)."""
    wait_until(lambda: job_state(job, env) == "PENDING", 60, "the requeued job")
    # A heterogeneous job's components are requeued one after the other, each held as it is
    # (seen 2026-11-29: the second, requeued 0.6 s after the lift, held the job 2 minutes): lift
    # the hold until the job runs again.
    deadline = time.monotonic() + 60
    while job_state(job, env) == "PENDING" and time.monotonic() < deadline:
        subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], env=env, timeout=30)
        time.sleep(2)


def run_requeued(
    env: dict, config: Path, overrides: list[str], run_dir: Path, out: Path, after_steps: int = 2
) -> None:
    """The heterogeneous job on ``config``, requeued once ``after_steps`` trainer steps are
    logged; returns when it completed (the job's and the roles' logs shown otherwise)."""
    job = submit(env, REPO / "jobs" / "grpo_gsm8k.sbatch", config, overrides, OUT=str(out))
    wait_until(
        lambda: len(trainer_steps(run_dir)) >= after_steps,
        JOB_TIMEOUT_S,
        f"{after_steps} trainer steps",
    )
    requeue_now(env, job)
    state = wait_job(env, job)
    assert state == "COMPLETED", show_logs(out, run_dir)


def trainer_steps(run_dir: Path) -> list[int]:
    return [row["step"] for row in read_metrics(run_dir, "trainer")]


def show_logs(out: Path, run_dir: Path) -> str:
    logs = [out] + sorted((run_dir / "log").glob("*")) if run_dir.exists() else [out]
    return "\n".join(
        f"== {p}\n{p.read_text(errors='replace')[-3000:]}" for p in logs if p.is_file()
    )
