"""Ulysses sequence parallelism (``trainer.ulysses_sequence_parallel_size``): the config's
rules (one layout for the policy and its reference, a size that divides the trainer's GPUs and
the model's heads, refused for what it does not split), and, on two gloo ranks, the split
forward against the whole one: the same log-probs, loss and summed gradients
(``tests/sp_worker.py``), and the same DeepSpeed step as two data-parallel ranks."""

from __future__ import annotations

import json
import logging
import subprocess

import pytest

from rft.config.load import config_from_dict, load_config
from rft.errors import ConfigError, NotSupportedError
from rft.launch.cli import dry_run
from rft.launch.preflight import check_config
from rft.models import check_sequence_parallel_heads
from rft.placement import Devices, sequence_group_layout
from tests.helpers.dry_run import CPU_CONFIG, overrides
from tests.helpers.trainer_runs import (
    PY,
    REPO,
    metrics,
    run_ok,
    torchrun_cmd,
    trainer_env,
    write_config,
    write_segments,
)


def raw(**trainer) -> dict:
    return {
        "model": {"model_path": "/m"},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 2},
        "cluster": {"node_num": 1, "gpu_per_node": 8},
        "explorer": {"rollout_model": {"engine_num": 4}},
        "buffer": {"batch_size": 2, "explorer_input": {"taskset": {"path": "/d"}}},
        "trainer": trainer,
    }


def test_sequence_group_layout():
    # 4 ranks in groups of 2: ranks 0, 1 take data share 0; ranks 2, 3 share 1
    assert [sequence_group_layout(r, 4, 2) for r in range(4)] == [
        (0, 2, 0),
        (0, 2, 1),
        (1, 2, 0),
        (1, 2, 1),
    ]
    with pytest.raises(ConfigError, match="must divide the trainer's 3 ranks"):
        sequence_group_layout(0, 3, 2)


def test_config_accepts_a_size_and_the_veRL_spelling(caplog):
    cfg = config_from_dict(raw(ulysses_sequence_parallel_size=2))
    assert cfg.trainer.ulysses_sequence_parallel_size == 2
    verl = {
        "actor_rollout_ref": {
            "actor": {"ulysses_sequence_parallel_size": 4},
            "ref": {"ulysses_sequence_parallel_size": 4},
        }
    }
    cfg = config_from_dict(raw(trainer_config=verl))
    assert cfg.trainer.ulysses_sequence_parallel_size == 4
    with caplog.at_level(logging.WARNING, logger="rft"):
        cfg = config_from_dict(raw(ulysses_sequence_parallel_size=2, padding_free=True))
    assert cfg.trainer.padding_free is False
    assert "trainer.padding_free has no effect with trainer.ulysses_sequence_parallel_size=2" in (
        caplog.text
    )


def test_config_refusals():
    verl = {"actor_rollout_ref": {"ref": {"ulysses_sequence_parallel_size": 4}}}
    with pytest.raises(ConfigError, match="ref.ulysses_sequence_parallel_size=4 contradicts"):
        config_from_dict(raw(ulysses_sequence_parallel_size=2, trainer_config=verl))
    data = raw(ulysses_sequence_parallel_size=2)
    data["algorithm"] = {"algorithm_type": "ppo", "repeat_times": 2}
    data["model"]["critic_model_path"] = "/m"
    with pytest.raises(NotSupportedError, match="not those of a critic"):
        config_from_dict(data)
    critic = {"critic": {"ulysses_sequence_parallel_size": 2}}
    with pytest.raises(NotSupportedError, match="critic.ulysses_sequence_parallel_size: 2"):
        config_from_dict(raw(trainer_config=critic))


def test_dry_run_checks_the_ranks_and_heads(vllm_model_dir, monkeypatch):
    """The trainer's ranks (2 CPU ranks here; under SLURM the cluster section's GPUs after the
    explorers') and the model's heads (4 query, 2 key/value) must split into the groups."""
    monkeypatch.setenv("RFT_LOCAL_TRAINER_RANKS", "2")
    cfg = load_config(
        CPU_CONFIG, overrides(vllm_model_dir, "trainer.ulysses_sequence_parallel_size=2")
    )
    check_config(cfg, here=Devices(gpus=0))
    assert "groups of 2 consecutive ranks" in dry_run(cfg, str(CPU_CONFIG))
    monkeypatch.setenv("RFT_LOCAL_TRAINER_RANKS", "3")
    with pytest.raises(ConfigError, match="must divide the trainer's 3 ranks"):
        check_config(cfg, here=Devices(gpus=0))
    slurm = ["cluster.gpu_per_node=4", "explorer.rollout_model.engine_num=1"]
    cfg = load_config(
        CPU_CONFIG, overrides(vllm_model_dir, "trainer.ulysses_sequence_parallel_size=2", *slurm)
    )
    with pytest.raises(ConfigError, match="must divide the trainer's 3 ranks"):
        check_config(cfg)  # the SLURM job's 4 GPUs, 1 for the explorer
    monkeypatch.setenv("RFT_LOCAL_TRAINER_RANKS", "4")
    cfg = load_config(
        CPU_CONFIG, overrides(vllm_model_dir, "trainer.ulysses_sequence_parallel_size=4")
    )
    with pytest.raises(ConfigError, match=r"heads \(4 query, 2 key/value"):
        check_config(cfg, here=Devices(gpus=0))


def test_the_model_heads_must_split_evenly(tiny_model_dir):
    check_sequence_parallel_heads(tiny_model_dir, 2)  # 4 query heads, 2 key/value heads
    with pytest.raises(ConfigError, match=r"heads \(4 query, 2 key/value"):
        check_sequence_parallel_heads(tiny_model_dir, 4)


@pytest.mark.integration
def test_split_forward_equals_the_whole_one(tiny_model_dir, tmp_path):
    out = tmp_path / "diffs.json"
    cmd = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += [str(REPO / "tests" / "sp_worker.py"), str(tiny_model_dir), str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=trainer_env(), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    diffs = json.loads(out.read_text())
    assert diffs["logprob"] < 1e-5 and diffs["entropy"] < 1e-5 and diffs["loss"] < 1e-6
    assert diffs["grad"] < 1e-6 * max(diffs["grad_scale"], 1.0)


@pytest.mark.integration
def test_deepspeed_step_with_a_sequence_group_equals_data_parallel(tmp_path, tiny_model_dir):
    """Two ranks as one sequence group (both score every row, half the positions each) against
    two data-parallel ranks: the same step, with a KL loss (the reference model split too) and
    two updates (the old-log-prob pass split too)."""
    rows = {}
    for size in (1, 2):
        name = f"sp{size}"
        config = write_config(
            tmp_path,
            name,
            tiny_model_dir,
            algorithm={
                "algorithm_type": "grpo",
                "repeat_times": 2,
                "kl_loss_fn": "k2",
                "kl_loss_fn_args": {"kl_coef": 0.01},
                "optimizer": {"lr": 1e-3},
            },
            buffer={
                "batch_size": 4,
                "train_batch_size": 4,
                "total_steps": 1,
                "explorer_input": {"taskset": {"path": "unused-by-the-trainer"}},
            },
            trainer={"ulysses_sequence_parallel_size": size, "save_interval": 0},
        )
        write_segments(tmp_path / "t" / name, [1])
        run_ok(torchrun_cmd(config), tmp_path / f"{name}.log")
        rows[size] = metrics(tmp_path / "t" / name)[1]
    assert rows[2]["updates"] == 2
    for key in ("pg_loss", "kl_loss", "entropy", "grad_norm", "ppo_kl", "logprob_mean"):
        assert rows[2][key] == pytest.approx(rows[1][key], rel=1e-4, abs=1e-6), key


def test_a_model_outside_the_wrapped_kernel_is_refused(monkeypatch):
    """Under a sequence group every model must attend through the wrapped sdpa kernel: an eager
    one would attend over this rank's positions only, without an error."""
    from types import SimpleNamespace

    from rft.trainer import sequence_parallel

    eager = SimpleNamespace(config=SimpleNamespace(_attn_implementation="eager"))
    sequence_parallel.check_attention(eager, "/m")  # no group: anything goes
    monkeypatch.setattr(
        sequence_parallel, "_ACTIVE", sequence_parallel.SequenceParallel(2, 0, None)
    )
    with pytest.raises(ConfigError, match="attention kernel 'eager'"):
        sequence_parallel.check_attention(eager, "/m")
    sdpa = SimpleNamespace(config=SimpleNamespace(_attn_implementation="sdpa"))
    sequence_parallel.check_attention(sdpa, "/m")
