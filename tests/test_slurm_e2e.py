"""Runs through a real local SLURM cluster (env/local-slurm.sh): the heterogeneous job script,
asynchronous explorer + trainer jobs with an explorer added mid-run, requeue with resume,
rft-launch through submitit, and an explorer killed mid-run. Tiny model, CPU engines."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rft.monitor import read_metrics
from rft.status import collect
from tests.helpers.runs import REPO
from tests.helpers.slurm_jobs import (
    CPU,
    JOB_TIMEOUT_S,
    requeue_now,
    run_overrides,
    show_logs,
    start_requeued_now,
    submit,
    trainer_steps,
    wait_job,
    wait_until,
)

pytestmark = pytest.mark.slurm


def archived_per_step(run_dir: Path, db: str = "arithmetic.db") -> dict[int, int]:
    """Experiences the trainer archived, counted by the step that consumed them (the archive
    keeps one row per experience id, the step of its newest consumption)."""
    with sqlite3.connect(run_dir / db) as conn:
        rows = conn.execute('select step, count(*) from "arithmetic_buffer" group by step')
        return dict(rows.fetchall())


def test_heterogeneous_job_script_end_to_end(slurm_cluster, vllm_model_dir, tmp_path):
    out = tmp_path / "job.out"
    overrides = run_overrides(
        vllm_model_dir, tmp_path, "buffer.total_steps=3", "trainer.save_interval=2"
    )
    job = submit(
        slurm_cluster,
        REPO / "jobs" / "grpo_gsm8k.sbatch",
        CPU / "grpo_gsm8k.yaml",
        overrides,
        OUT=str(out),
    )
    run_dir = tmp_path / "grpo_gsm8k_cpu" / "smollm2-135m"
    state = wait_job(slurm_cluster, job)
    assert state == "COMPLETED", show_logs(out, run_dir)
    assert trainer_steps(run_dir) == [1, 2, 3]
    assert (run_dir / "latest_state_dict_iteration.txt").read_text().strip() == "3"
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    assert (run_dir / "global_step_2" / "actor").is_dir()
    versions = {row["weights_version"] for row in read_metrics(run_dir, "explorer_explorer")}
    assert max(versions) >= 2 and len(versions) >= 2  # the explorer reloaded published weights
    assert archived_per_step(run_dir) == {1: 4, 2: 4, 3: 4}  # 2 tasks x 2 samples per step


def test_requeue_resumes_without_consuming_twice(slurm_cluster, vllm_model_dir, tmp_path):
    # A step takes about 0.5 s here and the requeue lands a few seconds after the second trainer
    # step: with 16 steps the requeued explorer surely has steps left, so it must rejoin.
    total = 16
    out = tmp_path / "job.out"
    overrides = run_overrides(
        vllm_model_dir, tmp_path, f"buffer.total_steps={total}", "trainer.save_interval=1"
    )
    job = submit(
        slurm_cluster,
        REPO / "jobs" / "grpo_gsm8k.sbatch",
        CPU / "grpo_gsm8k.yaml",
        overrides,
        OUT=str(out),
    )
    run_dir = tmp_path / "grpo_gsm8k_cpu" / "smollm2-135m"
    wait_until(lambda: len(trainer_steps(run_dir)) >= 2, JOB_TIMEOUT_S, "two trainer steps")
    requeue_now(slurm_cluster, job)
    state = wait_job(slurm_cluster, job)
    assert state == "COMPLETED", show_logs(out, run_dir)
    steps = trainer_steps(run_dir)
    assert steps[-1] == total and set(steps) == set(range(1, total + 1)), steps
    # Each step consumed its own 4 experiences: one consumed twice would have moved to a later
    # step (same id, one row) and left a step short.
    assert archived_per_step(run_dir) == {s: 4 for s in range(1, total + 1)}
    # sync_method nccl: the requeued trainer opened a new rendezvous, the explorer joined it.
    log = out.read_text()
    resumed = [int(s) for s in re.findall(r"explorer-0 resumes after step (\d+)", log)]
    assert resumed and resumed[-1] < total, ("the requeue came too late", show_logs(out, run_dir))
    assert log.count("explorers rendezvous at") == 2, show_logs(out, run_dir)
    assert log.rindex("formed with ['explorer-0']") > log.rindex("explorers rendezvous at"), (
        show_logs(out, run_dir)
    )


def test_an_openai_sdk_agent_trains_in_the_heterogeneous_job(
    slurm_cluster, vllm_model_dir, tmp_path
):
    """The endpoint on a SLURM explorer node: the example agent (OpenAI SDK only) is trained
    through it by the heterogeneous job."""
    from tests.helpers.agentic import AGENT_RUN

    out = tmp_path / "job.out"
    overrides = [
        f"model.model_path={vllm_model_dir}",
        f"checkpoint_root_dir={tmp_path}",
        *AGENT_RUN,
    ]
    job = submit(
        slurm_cluster,
        REPO / "jobs" / "grpo_gsm8k.sbatch",
        REPO / "configs" / "agent_openai_cpu.yaml",
        overrides,
        OUT=str(out),
    )
    run_dir = tmp_path / "agent" / "smollm2-135m-openai-agent"
    assert wait_job(slurm_cluster, job) == "COMPLETED", show_logs(out, run_dir)
    assert trainer_steps(run_dir) == [1, 2]
    explored = read_metrics(run_dir, "explorer_explorer")
    assert [m["episodes/failed"] for m in explored] == [0, 0], show_logs(out, run_dir)
    assert "OpenAI-compatible endpoint for agents at http://127.0.0.1:" in out.read_text()


def test_async_jobs_with_an_explorer_added_and_one_killed(slurm_cluster, vllm_model_dir, tmp_path):
    """Explorer and trainer as separate jobs. The first explorer is SIGKILLed after its first
    segment; the trainer asks for more steps than it left behind, so it can only finish on the
    segments of an explorer added while it runs."""
    common = run_overrides(vllm_model_dir, tmp_path, "cluster.gpu_per_node=1")
    trainer_out, explorer_out, new_out = (tmp_path / f"{n}.out" for n in ("t", "e", "n"))
    explorer = submit(
        slurm_cluster,
        REPO / "jobs" / "async_explorer.sbatch",
        CPU / "async" / "explorer.yaml",
        [*common, "buffer.total_steps=100000"],
        "--ntasks=1",
        OUT=str(explorer_out),
    )
    run_dir = tmp_path / "async_gsm8k_cpu" / "smollm2-135m"
    first = run_dir / "buffer" / "explorer-0"
    wait_until(
        lambda: first.is_dir() and any(first.glob("seg-*.jsonl")),
        JOB_TIMEOUT_S,
        "the first explorer's first segment",
    )
    beat = json.loads((run_dir / "explorers" / "explorer-0.json").read_text())
    os.kill(int(beat["pid"]), signal.SIGKILL)  # same host: the first explorer dies hard
    time.sleep(1)
    steps = len(list(first.glob("seg-*.jsonl"))) + 4  # one segment (4 experiences) per step
    trainer = submit(
        slurm_cluster,
        REPO / "jobs" / "async_trainer.sbatch",
        CPU / "async" / "trainer.yaml",
        [
            *common,
            f"buffer.total_steps={steps}",
            "trainer.max_staleness_versions=100",
            "synchronizer.sync_timeout=600",
        ],
        "--ntasks=1",
        OUT=str(trainer_out),
    )
    wait_until(lambda: len(trainer_steps(run_dir)) >= 1, JOB_TIMEOUT_S, "a first trainer step")
    added = submit(
        slurm_cluster,
        REPO / "jobs" / "add_explorer.sbatch",
        CPU / "async" / "explorer_new.yaml",
        [*common, "buffer.explorer_input.taskset.split=test", "buffer.total_steps=100000"],
        "--ntasks=1",
        OUT=str(new_out),
        RFT_EXPLORER_NAME="explorer_new",
    )
    state = wait_job(slurm_cluster, trainer)
    assert state == "COMPLETED", show_logs(trainer_out, run_dir)
    assert trainer_steps(run_dir)[-1] == steps
    consumed = json.loads((run_dir / "trainer_meta.json").read_text())["buffer_cursor"]["segments"]
    assert consumed["explorer_new-0"]["seq"] > 0  # the added explorer's segments were consumed
    status = {e.name: e for e in collect(run_dir, live_threshold_s=30).explorers}
    assert status["explorer_new-0"].live
    wait_until(
        lambda: not {e.name: e for e in collect(run_dir, 30).explorers}["explorer-0"].live,
        90,
        "the killed explorer to show as dead",
    )
    for job in (explorer, added):
        subprocess.run(["scancel", job], env=slurm_cluster, timeout=30)


def test_rft_launch_submits_through_submitit(slurm_cluster, vllm_model_dir, tmp_path):
    overrides = run_overrides(vllm_model_dir, tmp_path, "buffer.total_steps=2")
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bin" / "rft-launch"),
            "--config",
            str(CPU / "grpo_gsm8k.yaml"),
            *overrides,
        ],
        cwd=REPO,
        env=dict(slurm_cluster, OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.split("submitted job ")[1].split()[0]
    assert "ssh -N -L 6006:localhost:6006" in proc.stdout
    run_dir = tmp_path / "grpo_gsm8k_cpu" / "smollm2-135m"
    state = wait_job(slurm_cluster, job)
    assert state == "COMPLETED", show_logs(run_dir / "log" / "submitit", run_dir)
    assert trainer_steps(run_dir) == [1, 2]


def test_submitit_job_checkpoints_and_requeues_on_usr1(slurm_cluster, vllm_model_dir, tmp_path):
    """SLURM's warning signal reaches the trainer inside submitit's task: it checkpoints, exits
    143, the task requeues the job, and the requeued job resumes and finishes."""
    overrides = run_overrides(
        vllm_model_dir, tmp_path, "buffer.total_steps=5", "trainer.save_interval=1"
    )
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bin" / "rft-launch"),
            "--config",
            str(CPU / "grpo_gsm8k.yaml"),
            *overrides,
        ],
        cwd=REPO,
        env=dict(slurm_cluster, OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.split("submitted job ")[1].split()[0]
    run_dir = tmp_path / "grpo_gsm8k_cpu" / "smollm2-135m"
    wait_until(lambda: len(trainer_steps(run_dir)) >= 1, JOB_TIMEOUT_S, "a first trainer step")
    subprocess.run(["scancel", "--signal=USR1", job], env=slurm_cluster, check=True, timeout=30)
    logs = run_dir / "log" / "submitit"
    wait_until(
        lambda: any("(exit code 143)" in p.read_text(errors="replace") for p in logs.glob("*.out")),
        JOB_TIMEOUT_S,
        "the trainer's signal exit",
    )
    start_requeued_now(slurm_cluster, job)  # the trainer's rank 0 requeued it
    state = wait_job(slurm_cluster, job)
    assert state == "COMPLETED", show_logs(run_dir / "log" / "submitit", run_dir)
    steps = trainer_steps(run_dir)
    assert steps[-1] == 5 and set(steps) == set(range(1, 6)), steps
    assert any(
        "resumed from global_step_" in p.read_text(errors="replace") for p in logs.glob("*.out")
    )


def test_launch_errors_are_clear(slurm_cluster, vllm_model_dir, tmp_path):
    overrides = run_overrides(vllm_model_dir, tmp_path)
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bin" / "rft-launch"),
            "--config",
            str(CPU / "grpo_gsm8k.yaml"),
            "--sbatch",
            "--partition",
            "nope",
            *overrides,
        ],
        cwd=REPO,
        env=slurm_cluster,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "sbatch refused the job" in proc.stderr and "slurm.partition" in proc.stderr
    (tmp_path / "empty").mkdir()
    no_slurm = dict(slurm_cluster, PATH=str(tmp_path / "empty"))  # /bin is /usr/bin on Debian
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bin" / "rft-launch"),
            "--config",
            str(CPU / "grpo_gsm8k.yaml"),
            "--sbatch",
            *overrides,
        ],
        cwd=REPO,
        env=no_slurm,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "sbatch is not on PATH" in proc.stderr


def test_failed_job_shows_its_log(slurm_cluster, vllm_model_dir, tmp_path):
    from tests.helpers.runs import broken_model

    broken = broken_model(vllm_model_dir, tmp_path)
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bin" / "rft-launch"),
            "--config",
            str(CPU / "grpo_gsm8k.yaml"),
            "--sbatch",
            "--wait",
            *run_overrides(broken, tmp_path),
        ],
        cwd=REPO,
        env=dict(slurm_cluster, OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "ended FAILED" in proc.stderr and "the last lines of" in proc.stderr


def test_stages_run_in_one_job_and_a_requeue_between_them_resumes_at_the_next(
    slurm_cluster, vllm_model_dir, tmp_path
):
    """The SFT warm-up config through the heterogeneous job script: stage 0 (SFT, trainer only,
    the explorer task waits), a requeue once it is finished, then stage 1 (GRPO) from stage 0's
    final weights; stage 0 is not run again."""
    out = tmp_path / "job.out"
    overrides = run_overrides(vllm_model_dir, tmp_path, "buffer.total_steps=2")
    job = submit(
        slurm_cluster,
        REPO / "jobs" / "grpo_gsm8k.sbatch",
        CPU / "sft_warmup.yaml",
        overrides,
        OUT=str(out),
    )
    run_dir = tmp_path / "grpo_gsm8k_cpu" / "smollm2-135m-sft-warmup"
    sft, rft = run_dir / "sft_warmup", run_dir / "rft"
    wait_until(lambda: (sft / "stage_finished.json").is_file(), JOB_TIMEOUT_S, "the SFT stage")
    requeue_now(slurm_cluster, job)
    state = wait_job(slurm_cluster, job)
    assert state == "COMPLETED", show_logs(out, rft)
    assert trainer_steps(sft) == [1, 2] and "sft_loss" in read_metrics(sft, "trainer")[0]
    assert trainer_steps(rft) == [1, 2] and (rft / "stage_finished.json").is_file()
    recorded = (rft / "config.yaml").read_text()
    assert f"model_path: {sft / 'weights' / 'v000002'}" in recorded  # stage 1 began from stage 0
    assert (
        "stages[0] (sft_warmup) already finished: skipped" in out.read_text()
    )  # after the requeue
