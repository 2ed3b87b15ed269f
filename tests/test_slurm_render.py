"""Job rendering and the launch-side logic that needs no cluster: golden sbatch script, node
group sizing, SLURM environment translation, rft-status on a hand-made run directory."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rft.config.load import config_to_yaml, load_config
from rft.errors import ConfigError
from rft.launch import slurm
from rft.placement import first_host, torch_env_from_slurm
from rft.rundir import prepare
from rft.status import collect, format_status

REPO = Path(__file__).resolve().parent.parent


def test_dry_run_matches_golden_script():
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bin" / "rft-launch"),
            "--config",
            "configs/grpo_gsm8k.yaml",
            "--dry-run",
            "--partition",
            "gpu",
            "--time",
            "12:00:00",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout.replace(f"{REPO}/.venv/bin/python", "$PYTHON").replace(
        sys.executable, "$PYTHON"
    )
    text = text.replace(str(REPO), "$REPO")
    assert text == (REPO / "tests" / "golden" / "grpo_gsm8k.sbatch").read_text()


@pytest.mark.parametrize(
    "overrides,expected",
    [
        ([], [("explorer", 1, 1, 1), ("trainer", 1, 1, 1)]),  # 2 GPUs: 1 engine + 1 rank
        (
            [
                "cluster.node_num=2",
                "cluster.gpu_per_node=8",
                "explorer.rollout_model.engine_num=4",
                "explorer.rollout_model.tensor_parallel_size=2",
            ],
            [("explorer", 1, 4, 2), ("trainer", 1, 8, 1)],
        ),
        (
            ["cluster.node_num=3", "cluster.gpu_per_node=4", "explorer.rollout_model.engine_num=2"],
            [("explorer", 1, 2, 1), ("trainer", 3, 10, 1)],
        ),
    ],
)
def test_group_sizes(overrides, expected):
    cfg = load_config(REPO / "configs" / "grpo_gsm8k.yaml", overrides)
    got = [(g.role, g.nodes, g.ntasks, g.gpus_per_task) for g in slurm.groups(cfg)]
    assert got == expected


def test_async_jobs_have_one_component():
    cfg = load_config(REPO / "configs" / "async" / "trainer.yaml")
    text = slurm.render(cfg, Path("/c.yaml"), [], python="py", workdir=Path("/w"))
    assert "hetjob" not in text and "--het-group" not in text
    assert "#SBATCH --nodes=1 --ntasks=4 --gpus-per-task=1  # trainer" in text
    assert "srun py -m rft.launch.worker trainer --config /c.yaml &" in text


def test_sbatch_errors_are_explained():
    assert "slurm.partition" in slurm.explain_sbatch_error(
        "sbatch: error: invalid partition specified: nope"
    )
    assert "slurm.account" in slurm.explain_sbatch_error(
        "error: Invalid account or account/partition combination"
    )


def test_time_limit_in_minutes():
    assert slurm._minutes("24:00:00") == 1440
    assert slurm._minutes("1-02:30:00") == 1590
    assert slurm._minutes("90") == 90
    assert slurm._minutes("00:10:30") == 11


def test_torch_env_from_srun_variables():
    env = {
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": "1",
        "SLURM_STEP_NODELIST": "localhost",
        "SLURM_JOB_ID": "1234",
    }
    assert torch_env_from_slurm(env) == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "localhost",
        "MASTER_PORT": "21234",
    }
    assert torch_env_from_slurm({**env, "RANK": "0"}) == {}  # torchrun already set them
    assert first_host("gpu[07-09],cpu1") in ("gpu07", "gpu7")


def test_relaunch_with_a_different_model_is_refused(tmp_path):
    base = ["model.model_path=/models/a", f"checkpoint_root_dir={tmp_path}"]
    first = load_config(REPO / "configs" / "grpo_gsm8k.yaml", base)
    prepare(first.run_dir, config_to_yaml(first), "trainer")
    again = load_config(REPO / "configs" / "grpo_gsm8k.yaml", base)
    prepare(again.run_dir, config_to_yaml(again), "explorer")  # same run: fine
    other = load_config(
        REPO / "configs" / "grpo_gsm8k.yaml",
        ["model.model_path=/models/b", f"checkpoint_root_dir={tmp_path}"],
    )
    with pytest.raises(ConfigError, match="was started with a different config.*model.model_path"):
        prepare(other.run_dir, config_to_yaml(other), "trainer")


def test_status_of_a_run_directory(tmp_path):
    run = tmp_path / "run"
    (run / "explorers").mkdir(parents=True)
    (run / "monitor" / "trainer").mkdir(parents=True)
    (run / "monitor" / "trainer" / "metrics.jsonl").write_text(
        json.dumps({"step": 7, "tokens_per_s": 1234.5}) + "\n"
    )
    (run / "latest_state_dict_iteration.txt").write_text("6\n")
    now = time.time()
    for name, age in (("explorer-0", 1), ("explorer_new-0", 1000)):
        (run / "explorers" / f"{name}.json").write_text(
            json.dumps(
                {
                    "name": name,
                    "time": now - age,
                    "host": "gpu01",
                    "loaded_version": 6,
                    "steps_done": 9,
                    "evaluating": True,
                }
            )
        )
    for seq in (1, 2, 3):
        (run / "buffer" / "explorer-0").mkdir(parents=True, exist_ok=True)
        (run / "buffer" / "explorer-0" / f"seg-{seq:06d}.jsonl").write_text("")
    text = format_status(collect(run, live_threshold_s=120))
    assert "trainer step    7, 1234 tokens/s" in text or "trainer step    7, 1235 tokens/s" in text
    assert "weights version 6" in text
    assert "buffer backlog  3 sealed segment(s)" in text
    assert "explorer-0" in text and "live" in text
    assert "explorer_new-0" in text and "DEAD" in text
    evaluating = [line for line in text.splitlines() if line.endswith(", evaluating")]
    assert len(evaluating) == 1 and "explorer-0 " in evaluating[0]  # a dead one says nothing
    # without --dead-after-s: the run's explorer.heartbeat_timeout_s (default 120 s, then 5000 s)
    assert [e.live for e in collect(run).explorers] == [True, False]
    (run / "config.yaml").write_text("explorer:\n  heartbeat_timeout_s: 5000\n")
    assert [e.live for e in collect(run).explorers] == [True, True]


def test_status_shows_who_waits_and_advises_whom_to_scale(tmp_path):
    from rft.status import idle_fraction, pipeline_advice

    rows = [{"step": s, "time/read_s": 6.0, "time/step_s": 10.0} for s in range(1, 8)]
    rows[0]["time/read_s"] = 0.0  # older than the last 5 steps: not counted
    assert idle_fraction(rows, "time/read_s", "time/step_s") == pytest.approx(0.6)
    assert idle_fraction([{"step": 1}], "time/read_s", "time/step_s") is None
    assert pipeline_advice(0.2, {"explorer_explorer": 0.1}) == []
    assert "rft-add-explorer" in pipeline_advice(0.6, {})[0]
    assert "sync_offset" in pipeline_advice(None, {"explorer_explorer": 0.7})[0]
    run = tmp_path / "run"
    for role, row in (
        ("trainer", {"step": 3, "time/read_s": 7.0, "time/step_s": 10.0}),
        ("explorer_explorer", {"step": 3, "wait_time_s": 0.5, "step_time_s": 10.0}),
    ):
        (run / "monitor" / role).mkdir(parents=True)
        (run / "monitor" / role / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    (run / "explorers").mkdir()
    (run / "explorers" / "explorer-0.json").write_text(
        json.dumps({"name": "explorer-0", "time": time.time(), "loaded_version": 2})
    )
    (run / "latest_state_dict_iteration.txt").write_text("3\n")
    text = format_status(collect(run, live_threshold_s=120))
    assert (
        "pipeline        trainer waits 70% for experiences; explorer_explorer waits 5% for "
        "weights; explorers 1 version(s) behind the trainer's newest weights"
    ) in text, text
    assert "advice          trainer idle 70% waiting for experiences" in text


def test_status_with_weights_by_broadcast(tmp_path):
    """sync_method nccl: the folder pointer lags (folders only at checkpoints); the newest
    version and the explorers' lag come from the trainer's metrics, with the group's size."""
    run = tmp_path / "run"
    (run / "monitor" / "trainer").mkdir(parents=True)
    (run / "monitor" / "trainer" / "metrics.jsonl").write_text(
        json.dumps(
            {
                "step": 9,
                "weights_version": 9,
                "sync/broadcast_ok": 1,
                "sync/members": 2,
                "sync/generation": 3,
            }
        )
        + "\n"
    )
    (run / "latest_state_dict_iteration.txt").write_text("5\n")
    (run / "explorers").mkdir()
    for name in ("explorer-0", "explorer-1"):
        (run / "explorers" / f"{name}.json").write_text(
            json.dumps({"name": name, "time": time.time(), "loaded_version": 8})
        )
    text = format_status(collect(run, live_threshold_s=120))
    assert "weights version 9" in text
    assert "weight sync     broadcast to 2 explorer(s), group generation 3" in text
    assert "explorers 1 version(s) behind the trainer's newest weights" in text


def test_add_explorer_fills_its_nodes_and_refuses_synchronous_runs():
    launch = [sys.executable, str(REPO / "bin" / "rft-add-explorer")]
    proc = subprocess.run(
        [
            *launch,
            "--config",
            "configs/async/explorer_new.yaml",
            "--name",
            "extra",
            "--nodes",
            "2",
            "--dry-run",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --nodes=2 --ntasks=16 --gpus-per-task=1  # explorer" in proc.stdout
    assert "explorer.name=extra" in proc.stdout and "hetjob" not in proc.stdout
    proc = subprocess.run(
        [*launch, "--config", "configs/grpo_gsm8k.yaml", "--name", "x", "--dry-run"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "joins asynchronous runs only" in proc.stderr


def test_a_staged_config_is_one_job_holding_every_stages_roles(tmp_path):
    from rft.launch.submit import launch_mode

    staged = REPO / "configs" / "cpu" / "sft_warmup.yaml"
    cfg = load_config(staged, [f"checkpoint_root_dir={tmp_path}"])
    assert launch_mode(cfg) == "both"  # SFT (trainer) then GRPO (explorer and trainer)
    script = slurm.render(cfg, staged, [], mode="both")
    assert "#   stages[0] (sft_warmup): mode train (trainer), from model.model_path" in script
    assert (
        "#   stages[1] (rft): mode both (explorer and trainer), from the previous stage's final weights"
        in script
    )
    assert script.count(" -m rft.launch.worker ") == 2  # the workers run the stages themselves
    with pytest.raises(ConfigError, match=r"stages\[0\] \(sft_warmup\) changes the cluster"):
        launch_mode(load_config(staged, ["stages.0.cluster={node_num: 1, gpu_per_node: 4}"]))
    sft_only = load_config(
        staged,
        [
            "stages=[{stage_name: a, mode: train, algorithm: {algorithm_type: sft},"
            " buffer: {trainer_input: {experience_buffer: {path: data/arithmetic/sft,"
            " format: {prompt_key: question, response_key: answer}}}}}]"
        ],
    )
    assert launch_mode(sft_only) == "train"


def test_submitit_job_keeps_memory_cpus_and_extra_sbatch_lines(tmp_path):
    """rft-launch's default path (submitit) asks for what the rendered script asks for."""
    cfg = load_config(
        REPO / "configs" / "grpo_gsm8k.yaml",
        [
            f"checkpoint_root_dir={tmp_path}",
            "slurm.mem=64G",
            "slurm.cpus_per_gpu=8",
            "slurm.extra_sbatch_args=['--exclusive', '--comment=rft']",
        ],
    )
    executor = slurm.submitit_executor(cfg, "both")
    text = executor._make_submission_file_text("python -c pass", "uid")
    head, _, tail = text.partition("#SBATCH hetjob")
    assert "#SBATCH --mem=64G" in head and "#SBATCH --cpus-per-gpu=8" in head
    assert "#SBATCH --exclusive" in head and "#SBATCH --comment=rft" in head  # the job head
    assert "--mem=64G" in tail and "--cpus-per-gpu=8" in tail  # the trainer component
    rendered = slurm.render(cfg, REPO / "configs" / "grpo_gsm8k.yaml", [])
    assert "#SBATCH --exclusive" in rendered.partition("#SBATCH hetjob")[0]


def test_compile_caches_go_to_node_local_storage_under_slurm():
    """Under SLURM a worker points the JIT/compile caches a user left unset at $TMPDIR (the
    defaults in $HOME sit on the shared filesystem, where nodes race building one op); a
    user's own setting and runs outside SLURM are left alone."""
    import os

    from rft.launch.worker import cache_env

    assert cache_env({}) == {}
    env = cache_env({"SLURM_JOB_ID": "7", "TMPDIR": "/local", "TRITON_CACHE_DIR": "/mine"})
    root = f"/local/rft-cache-{os.getuid()}"
    assert env == {
        "TORCH_EXTENSIONS_DIR": f"{root}/torch_extensions",
        "TORCHINDUCTOR_CACHE_DIR": f"{root}/inductor",
    }
    assert cache_env({"SLURM_JOB_ID": "7"})["TRITON_CACHE_DIR"].startswith("/tmp/rft-cache-")
