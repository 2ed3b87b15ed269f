"""Every config that Trinity-RFT's documents print (``tests/fixtures/trinity/``, kept as printed)
loads in rft with only its paths set (the last refusal, CHORD's sequence parallelism, went with
rft.trainer.sequence_parallel).

Paths reach the configs the way their users set them: the ``${oc.env:TRINITY_*}`` variables
the configs read, and ``key=value`` overrides for paths written out in the file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rft.config.gpus import split_gpus
from rft.config.load import load_config
from rft.launch.cli import run_main
from rft.trainer.algorithm import build_loss_fns

REPO = Path(__file__).resolve().parent.parent
TRINITY = REPO / "tests" / "fixtures" / "trinity"
ARITHMETIC = REPO / "data" / "arithmetic"


FIXTURES = sorted(p.name for p in TRINITY.glob("*.yaml"))


# Paths written out in a file (the rest come from the TRINITY_* variables, see trinity_env).
PATHS: dict[str, list[str]] = {
    "ppo_example.yaml": [
        "model.model_path=/models/Qwen2-7B-Instruct",  # ${oc.env:HOME}/models/..
        "model.critic_model_path=/models/Qwen2-7B-Instruct",
        "explorer.auxiliary_models.0.model_path=/models/FsfairX-LLaMA3-RM-v0.1",
        "buffer.explorer_input.tasksets.0.path=/data/gsm8k",
        "buffer.explorer_input.tasksets.1.path=/data/math",
        "buffer.explorer_input.eval_tasksets.0.path=/data/gsm8k",
        "buffer.explorer_input.eval_tasksets.1.path=/data/math",
    ],
    "grpo_example.yaml": [
        "model.model_path=/models/deepseek-llm-7b-chat",  # a hub id there
        "buffer.explorer_input.tasksets.0.path=/data/gsm8k",
        "buffer.explorer_input.eval_tasksets.0.path=/data/gsm8k",
    ],
    "sft_warmup.yaml": ["stages.0.buffer.trainer_input.experience_buffer.path=/data/sft"],
}
ROOT_WRITTEN_OUT = ("ppo_example.yaml", "grpo_example.yaml")  # checkpoint_root_dir: ./checkpoints


def path_overrides(name: str, tmp_path: Path) -> list[str]:
    """The ``key=value`` overrides that set the fixture's written-out paths (root -> tmp)."""
    root = [f"checkpoint_root_dir={tmp_path}"] if name in ROOT_WRITTEN_OUT else []
    return PATHS.get(name, []) + root


@pytest.fixture
def trinity_env(monkeypatch, tmp_path):
    """The environment variables Trinity's configs read, pointing at local paths."""
    for var, value in (
        ("TRINITY_MODEL_PATH", "/models/model"),
        ("TRINITY_TASKSET_PATH", "/data/tasks"),
        ("TRINITY_SFT_DATASET_PATH", "/data/sft"),
        ("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path)),
    ):
        monkeypatch.setenv(var, value)


def load_fixture(name: str, tmp_path: Path, *extra: str):
    cfg = load_config(TRINITY / name, path_overrides(name, tmp_path) + list(extra))
    build_loss_fns(cfg.algorithm)  # the *_args checks the trainer makes (part of --dry-run)
    return cfg


def test_every_fixture_has_its_source_in_a_header():
    for name in FIXTURES:
        text = (TRINITY / name).read_text()
        assert text.startswith("#") and "/work/shared/seeds/" in text.split("\n\n")[0], name


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_loads(name, tmp_path, trinity_env):
    cfg = load_fixture(name, tmp_path)
    assert cfg.run_dir.is_relative_to(tmp_path)


def test_placeholder_names_are_used_as_printed(tmp_path, trinity_env):
    """``<project_name>``/``<experiment_name>`` are accepted as written: the run directory is
    literally ``<root>/<project_name>/<experiment_name>``."""
    cfg = load_fixture("explorer.yaml", tmp_path)
    assert cfg.run_dir == tmp_path / "<project_name>" / "<experiment_name>"


def test_async_pair_and_added_explorer_share_one_run(tmp_path, trinity_env):
    explorer, trainer, added = (
        load_fixture(n, tmp_path) for n in ("explorer.yaml", "trainer.yaml", "explorer_new.yaml")
    )
    assert explorer.run_dir == trainer.run_dir == added.run_dir
    assert (explorer.mode, trainer.mode, added.mode) == ("explore", "train", "explore")
    assert added.explorer.name == "explorer_new" != explorer.explorer.name
    assert split_gpus(explorer).explorer == 4 and split_gpus(trainer).trainer == 4
    assert trainer.buffer.train_batch_size == 512


def test_dry_run_of_the_async_explorer(tmp_path, monkeypatch, smollm2_dir, capsys):
    """``bin/rft-run --config explorer.yaml --dry-run`` with a local model and taskset."""
    monkeypatch.setenv("TRINITY_MODEL_PATH", str(smollm2_dir))
    monkeypatch.setenv("TRINITY_TASKSET_PATH", str(ARITHMETIC))
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path))
    code = run_main(["--config", str(TRINITY / "explorer.yaml"), "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "'explorer': 4 vLLM task(s) x TP 1 = 4 GPU(s); 64 tasks x 8 samples per step" in out
    assert "256 rows, columns question, answer" in out
    assert "dry run: config and inputs are valid" in out
    assert "asynchronous explorer job (never waits for the trainer)" in out
    code = run_main(
        ["--config", str(TRINITY / "explorer.yaml"), "--dry-run", "synchronizer.max_lead_steps=2"]
    )
    assert (
        code == 0
        and "at most 2 step(s) ahead of the weights: synchronizer.max_lead_steps"
        in capsys.readouterr().out
    )


def test_max_lead_steps_is_said_to_have_no_effect_in_mode_both(tmp_path, trinity_env, caplog):
    load_fixture("explorer.yaml", tmp_path, "synchronizer.max_lead_steps=1")  # bounds it
    assert "max_lead_steps" not in caplog.text
    load_fixture(
        "explorer.yaml",
        tmp_path,
        "mode=both",
        "synchronizer.max_lead_steps=1",
        "cluster.gpu_per_node=8",
    )
    assert "synchronizer.max_lead_steps has no effect in mode both" in caplog.text
    caplog.clear()
    load_fixture(
        "explorer.yaml", tmp_path, "synchronizer.max_lead_steps=1", "buffer.train_batch_size=1024"
    )  # two explorer steps per trainer step
    assert "raise buffer.batch_size to >= 128 tasks" in caplog.text


def test_dry_run_of_the_sft_warmup_stages(tmp_path, monkeypatch, smollm2_dir, capsys):
    """The quick start's SFT warm-up with a local SFT dataset, as printed (sync_method nccl)."""
    sft = tmp_path / "sft.jsonl"
    sft.write_text('{"prompt": "What is 1 + 2?", "response": "<answer>3</answer>"}\n')
    monkeypatch.setenv("TRINITY_MODEL_PATH", str(smollm2_dir))
    monkeypatch.setenv("TRINITY_TASKSET_PATH", str(ARITHMETIC))
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path))
    code = run_main(
        [
            "--config",
            str(TRINITY / "sft_warmup.yaml"),
            "--dry-run",
            f"stages.0.buffer.trainer_input.experience_buffer.path={sft}",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "stages[0] (sft_warmup): mode train" in out and "stages[1] (rft): mode both" in out
    assert "weights via 'nccl' (broadcast from trainer rank 0" in out
    assert "10 (buffer.total_steps)" in out  # the SFT stage's total_steps
    assert f"experience_buffer  {sft} [json]: 1 rows, columns prompt, response" in out


def test_dry_run_of_the_ppo_example_with_a_critic_and_a_reward_model(
    tmp_path, smollm2_dir, tiny_reward_model_dir, capsys
):
    """Trinity's ppo_example.yaml as printed, its ``$HOME`` paths pointed at local folders:
    the dry run checks the critic and reward-model folders and plans the 8 GPUs."""
    data = tmp_path / "gsm8k"
    data.mkdir()
    for split in ("train", "test"):
        (data / f"{split}.jsonl").write_text('{"prompt": "What is 2 + 3?", "answer": "#### 5"}\n')
    paths = {
        "model.model_path": smollm2_dir,
        "model.critic_model_path": smollm2_dir,
        "explorer.auxiliary_models.0.model_path": tiny_reward_model_dir,
        "buffer.explorer_input.tasksets.0.path": data,
        "buffer.explorer_input.tasksets.1.path": data,
        "buffer.explorer_input.eval_tasksets.0.path": data,
        "buffer.explorer_input.eval_tasksets.1.path": data,
        "checkpoint_root_dir": tmp_path,
    }
    args = ["--config", str(TRINITY / "ppo_example.yaml"), "--dry-run"]
    code = run_main(args + [f"{key}={value}" for key, value in paths.items()])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "'explorer': 2 vLLM task(s) x TP 1 + 2 for auxiliary models = 4 GPU(s)" in out
    assert "4 DeepSpeed rank(s)" in out
    assert f"critic            {smollm2_dir} + a value head" in out
    assert "reward part 'reward_model'" in out
    # a reward model without a score head is refused at the dry run, naming the key
    code = run_main(
        args
        + [
            f"{key}={smollm2_dir if key.startswith('explorer') else value}"
            for key, value in paths.items()
        ]
    )
    assert code == 2 and "explorer.auxiliary_models[0].model_path" in capsys.readouterr().err
