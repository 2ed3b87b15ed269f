"""``trainer.trainer_config_path`` (a veRL file read in as ``trainer.trainer_config``) and the
veRL keys that have no effect: Trinity's rules for which wins and where the file is found, the
same checks as an inline section, and one clear error for a missing file."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from rft.config.load import config_from_dict, load_config, stage_config
from rft.errors import ConfigError, NotSupportedError

REPO = Path(__file__).resolve().parent.parent
ASYNC_VERL = REPO / "tests/fixtures/trinity_examples/examples/async_gsm8k/verl_config.yaml"

VERL = {
    "actor_rollout_ref": {
        "model": {"use_remove_padding": True, "external_lib": None, "override_config": {}},
        "actor": {
            "ppo_micro_batch_size_per_gpu": 3,
            "grad_clip": 0.5,
            "ppo_mini_batch_size": 999,  # Trinity overwrites it: no effect
            "strategy": "fsdp",
            "optim": {"lr": 2e-6, "beta1": 0.8, "beta2": 0.9},
        },
    },
    "trainer": {"balance_batch": True, "nnodes": 7, "default_hdfs_dir": None},
}


def config(**sections) -> dict:
    data = {
        "model": {"model_path": "/models/m"},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 4},
        "buffer": {"batch_size": 2, "explorer_input": {"taskset": {"path": "/data/t"}}},
        "cluster": {"node_num": 1, "gpu_per_node": 2},
    }
    data.update(sections)
    return data


def write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


def test_file_acts_like_the_inline_section(tmp_path):
    write(tmp_path / "verl" / "train.yaml", VERL)
    from_file = load_config(
        write(tmp_path / "run.yaml", config(trainer={"trainer_config_path": "verl/train.yaml"}))
    )
    inline = config_from_dict(config(trainer={"trainer_config": VERL}))
    for cfg in (from_file, inline):
        assert cfg.trainer.padding_free is True
        assert cfg.trainer.micro_batch_size_per_gpu == 3
        assert cfg.trainer.grad_clip == 0.5  # actor.grad_clip acts
        assert cfg.algorithm.optimizer.lr == 2e-6
        assert cfg.algorithm.optimizer.betas == [0.8, 0.9]  # veRL's older beta1/beta2
    assert from_file.trainer == inline.trainer


def test_relative_path_is_found_from_the_config_folder_or_above(tmp_path, monkeypatch):
    """Trinity's examples name ``examples/<x>/<file>`` from its repository root."""
    monkeypatch.chdir(tmp_path / "..")
    write(tmp_path / "examples" / "x" / "train.yaml", VERL)
    run = write(
        tmp_path / "examples" / "x" / "run.yaml",
        config(trainer={"trainer_config_path": "examples/x/train.yaml"}),
    )
    assert load_config(run).trainer.micro_batch_size_per_gpu == 3


def test_missing_file_is_one_error_naming_the_path(tmp_path):
    run = write(tmp_path / "run.yaml", config(trainer={"trainer_config_path": "nope/train.yaml"}))
    with pytest.raises(ConfigError) as e:
        load_config(run)
    message = str(e.value)
    assert "trainer.trainer_config_path: veRL file 'nope/train.yaml' not found" in message
    assert str(tmp_path) in message
    missing = str(tmp_path / "gone.yaml")
    with pytest.raises(ConfigError, match=f"veRL file not found: {missing}"):
        config_from_dict(config(trainer={"trainer_config_path": missing}))


def test_inline_section_wins_and_explore_mode_reads_no_file(tmp_path, caplog):
    """Trinity reads the file only when trainer_config is empty, and only in modes that train."""
    missing = str(tmp_path / "gone.yaml")
    with caplog.at_level(logging.WARNING):
        cfg = config_from_dict(
            config(
                trainer={
                    "trainer_config_path": missing,
                    "trainer_config": {"actor_rollout_ref": {"actor": {"ppo_epochs": 2}}},
                }
            )
        )
    assert cfg.trainer.ppo_epochs == 2
    assert "trainer_config_path" in caplog.text and "has no effect" in caplog.text
    explore = config_from_dict(config(mode="explore", trainer={"trainer_config_path": missing}))
    assert explore.trainer.micro_batch_size_per_gpu == 1


def test_keys_from_the_file_are_refused_by_name_with_the_file(tmp_path):
    verl = {"actor_rollout_ref": {"model": {"external_lib": "my_models"}}}  # asks for something
    path = write(tmp_path / "train.yaml", verl)
    with pytest.raises(NotSupportedError) as e:
        config_from_dict(config(trainer={"trainer_config_path": str(path)}))
    message = str(e.value)
    assert message.startswith(
        "Trinity's `trainer.trainer_config.actor_rollout_ref.model.external_lib` is not "
        "supported by rft: "
    )
    assert f"(read from trainer.trainer_config_path {path})" in message


@pytest.mark.parametrize(
    "verl,refused",
    [
        ({"actor_rollout_ref": {"actor": {"strategy": "megatron"}}}, "actor.strategy"),
        ({"actor_rollout_ref": {"actor": {"shuffle": True}}}, "actor.shuffle"),
        ({"reward_model": {"enable": True}}, "reward_model"),
        ({"custom_reward_function": {"path": "r.py"}}, "custom_reward_function"),
        (
            {"actor_rollout_ref": {"actor": {"alg_type": "opmd", "tau": 0.5}}},
            "actor_rollout_ref.actor.tau",
        ),
    ],
)
def test_veRL_values_that_ask_for_something_are_refused(verl, refused):
    with pytest.raises(NotSupportedError, match=f"trainer.trainer_config.*{refused}"):
        config_from_dict(config(trainer={"trainer_config": verl}))


def test_no_effect_keys_are_accepted_and_named(caplog):
    verl = {
        "data": {"train_batch_size": 5},
        "algorithm": {"gamma": 0.9},
        "actor_rollout_ref": {
            "actor": {"clip_ratio": 0.3, "alg_type": "ppo", "tau": 0.0, "ppo_epochs": 2},
            "rollout": {"n": 8, "gpu_memory_utilization": 0.4},
        },
        "reward_model": {"enable": False, "model": {"path": "~/rm"}},
        "critic": {"ppo_epochs": 2},  # equal to the actor's: one setting in rft
    }
    with caplog.at_level(logging.WARNING):
        cfg = config_from_dict(config(trainer={"trainer_config": verl}))
    assert cfg.trainer.ppo_epochs == 2
    assert cfg.algorithm.policy_loss_fn_args.get("clip_range") is None  # not taken from veRL
    for key in ("data", "algorithm", "actor.clip_ratio", "rollout.n", "gpu_memory_utilization"):
        assert f"{key} has no effect" in caplog.text, key
    with pytest.raises(NotSupportedError, match="critic.ppo_epochs"):
        verl["critic"]["ppo_epochs"] = 3
        config_from_dict(config(trainer={"trainer_config": verl}))


def test_alg_type_must_name_the_loss_in_use():
    actor = {"actor_rollout_ref": {"actor": {"alg_type": "dpo"}}}
    with pytest.raises(ConfigError, match="alg_type='dpo'.*contradicts.*policy_loss_fn='ppo'"):
        config_from_dict(config(trainer={"trainer_config": actor}))
    with pytest.raises(NotSupportedError, match="alg_type: pairwise_opmd"):
        actor["actor_rollout_ref"]["actor"]["alg_type"] = "pairwise_opmd"
        config_from_dict(config(trainer={"trainer_config": actor}))


def test_verl_grad_clip_contradicting_trainer_grad_clip_is_an_error():
    verl = {"actor_rollout_ref": {"actor": {"grad_clip": 0.5}}}
    with pytest.raises(ConfigError, match="grad_clip=0.5 contradicts trainer.grad_clip=2.0"):
        config_from_dict(config(trainer={"grad_clip": 2.0, "trainer_config": verl}))


def test_a_full_verl_file_of_trinitys_examples_loads(tmp_path):
    cfg = config_from_dict(config(trainer={"trainer_config_path": str(ASYNC_VERL)}))
    assert cfg.trainer.use_dynamic_bsz is True and cfg.trainer.max_token_len_per_gpu == 16384
    assert cfg.trainer.micro_batch_size_per_gpu == 4
    assert cfg.trainer.log_prob_micro_batch_size_per_gpu == 4  # rollout's; the ref's: no effect
    assert cfg.algorithm.optimizer.lr == 1e-5


def test_a_stage_reads_its_own_file(tmp_path):
    write(tmp_path / "a.yaml", {"actor_rollout_ref": {"actor": {"ppo_epochs": 2}}})
    write(tmp_path / "b.yaml", {"actor_rollout_ref": {"actor": {"ppo_epochs": 3}}})
    run = config(
        trainer={"trainer_config_path": "a.yaml"},
        stages=[{"stage_name": "s", "trainer": {"trainer_config_path": "b.yaml"}}],
    )
    cfg = load_config(write(tmp_path / "run.yaml", run))
    assert cfg.trainer.ppo_epochs == 2
    assert stage_config(cfg, 0).trainer.ppo_epochs == 3


@pytest.mark.parametrize("n,ok", [(4, True), (8, False)])
def test_rollout_args_n_must_equal_repeat_times(n, ok):
    taskset = {"path": "/data/t", "rollout_args": {"n": n}}
    data = config(buffer={"batch_size": 2, "explorer_input": {"taskset": taskset}})
    if ok:
        assert config_from_dict(data).training_tasksets()[0].rollout_args.n == 4
        return
    with pytest.raises(ConfigError, match="rollout_args.n=8 contradicts algorithm.repeat_times=4"):
        config_from_dict(data)
