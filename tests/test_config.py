"""Config loading: every shipped config, each kind of bad input, overrides, derived values,
presets, stages, veRL-style keys, and the YAML round trip."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from rft.config.load import config_from_dict, config_to_yaml, load_config, stage_config
from rft.config.schema import Config
from rft.errors import ConfigError, NotSupportedError

REPO = Path(__file__).resolve().parent.parent
CONFIGS = sorted((REPO / "configs").rglob("*.yaml"))
TRINITY = REPO / "tests" / "fixtures" / "trinity"


def write(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def minimal(**sections) -> dict:
    """A small valid config as a dict; keyword sections replace the defaults."""
    data = {
        "model": {"model_path": "/models/m"},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 4},
        "buffer": {"batch_size": 2, "explorer_input": {"taskset": {"path": "/data/t"}}},
        "cluster": {"node_num": 1, "gpu_per_node": 2},
    }
    data.update(sections)
    return data


def load_dict(tmp_path: Path, data: dict, *overrides: str) -> Config:
    return load_config(write(tmp_path, yaml.safe_dump(data)), list(overrides))


def test_shipped_configs_exist():
    names = {p.relative_to(REPO / "configs").as_posix() for p in CONFIGS}
    for seed in (
        "grpo_gsm8k.yaml",
        "async/explorer.yaml",
        "async/trainer.yaml",
        "async/explorer_new.yaml",
        "sft_warmup.yaml",
        "verl_ppo.yaml",
        "verl_grpo.yaml",
        "chord.yaml",
        "lora_gsm8k.yaml",
    ):
        assert seed in names
        assert f"cpu/{seed}" in names, f"{seed} has no tiny CPU twin"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_shipped_config_loads_and_round_trips(path: Path, tmp_path: Path):
    cfg = load_config(path)
    again = load_config(write(tmp_path, config_to_yaml(cfg)))
    assert again == cfg
    for index in range(len(cfg.stages)):
        stage_config(cfg, index)


def test_quick_start_values_and_derived_batch():
    cfg = load_config(REPO / "configs" / "grpo_gsm8k.yaml")
    assert cfg.algorithm.repeat_times == 8
    assert cfg.buffer.train_batch_size == 128 * 8  # derived: batch_size x repeat_times
    assert cfg.algorithm.optimizer.lr == pytest.approx(1e-5)  # "1e-5" is a string in YAML 1.1
    assert cfg.buffer.explorer_input.taskset.format.prompt_key == "question"
    assert cfg.buffer.explorer_input.eval_tasksets[0].split == "test"
    assert cfg.model.max_prompt_tokens == 2048 - 1024  # derived from max_model_len
    assert cfg.run_dir == (Path("checkpoints") / "grpo_gsm8k" / "qwen2.5-1.5b-instruct").absolute()


def test_user_set_train_batch_size_is_kept():
    cfg = load_config(REPO / "configs" / "async" / "trainer.yaml")
    assert cfg.buffer.train_batch_size == 512


def test_train_batch_size_must_hold_whole_groups(tmp_path):
    data = minimal()
    data["buffer"]["train_batch_size"] = 6  # repeat_times 4
    with pytest.raises(ConfigError, match="not a multiple of algorithm.repeat_times=4"):
        load_dict(tmp_path, data)


def test_unknown_key_at_depth_three_names_path_and_nearest(tmp_path):
    data = minimal()
    data["buffer"]["explorer_input"]["taskset"]["fromat"] = {"prompt_key": "q"}
    with pytest.raises(ConfigError) as e:
        load_dict(tmp_path, data)
    msg = str(e.value)
    assert "buffer.explorer_input.taskset.fromat" in msg
    assert "Did you mean 'buffer.explorer_input.taskset.format'" in msg


def test_unknown_key_inside_list_item(tmp_path):
    data = minimal()
    data["buffer"]["explorer_input"]["eval_tasksets"] = [{"path": "/d", "splitt": "test"}]
    with pytest.raises(ConfigError, match=r"eval_tasksets\[0\]\.splitt'.*'.*split'"):
        load_dict(tmp_path, data)


@pytest.mark.parametrize(
    "section,key,value,expected",
    [
        ("buffer", "batch_size", "eight", "buffer.batch_size: expected an integer, got 'eight'"),
        ("buffer", "batch_size", 0, "buffer.batch_size: 0 is out of range; it must be >= 1"),
        ("model", "temperature", "hot", "model.temperature: expected a number"),
        (
            "explorer",
            "eval_on_startup",
            "yes please",
            "explorer.eval_on_startup: expected true or false",
        ),
        ("trainer", "zero_stage", 4, "trainer.zero_stage: 4 is out of range; it must be <= 3"),
    ],
)
def test_wrong_types_and_ranges(tmp_path, section, key, value, expected):
    data = minimal()
    data.setdefault(section, {})[key] = value
    with pytest.raises(ConfigError) as e:
        load_dict(tmp_path, data)
    assert expected in str(e.value)


def test_group_is_a_folder_of_the_run_directory(tmp_path):
    """Trinity's Config.get_checkpoint_job_dir (trinity/common/config.py at 1d7fae4):
    os.path.join(checkpoint_root_dir, project, group, name); an empty group adds no folder."""
    cfg = load_dict(
        tmp_path, minimal(project="p", group="g", name="n"), f"checkpoint_root_dir={tmp_path}"
    )
    assert cfg.run_dir == tmp_path / "p" / "g" / "n" and cfg.run_label == "p/g/n"
    cfg = load_dict(tmp_path, minimal(project="p", name="n"), f"checkpoint_root_dir={tmp_path}")
    assert cfg.run_dir == tmp_path / "p" / "n" and cfg.run_label == "p/n"


def test_env_defaults_take_the_fields_type(tmp_path, monkeypatch):
    """``${oc.env:VAR,default}`` always yields text; Trinity's load_config merges the YAML into
    its structured Config (trinity/common/config.py load_config: OmegaConf.merge(schema, yaml)),
    where OmegaConf's IntegerNode / FloatNode / BooleanNode convert text to the field's type."""
    monkeypatch.delenv("RFT_TEST_UNSET", raising=False)
    monkeypatch.setenv("RFT_TEST_OFF", "off")
    text = """
model: {model_path: /models/m}
algorithm: {algorithm_type: grpo, repeat_times: '${oc.env:RFT_TEST_UNSET,4}'}
buffer:
  batch_size: ${oc.env:RFT_TEST_UNSET,2}
  explorer_input: {taskset: {path: /data/t}}
explorer:
  eval_on_startup: ${oc.env:RFT_TEST_OFF,true}
  first_task_check: ${oc.env:RFT_TEST_UNSET,1}
cluster: {node_num: 1, gpu_per_node: 2}
"""
    cfg = load_config(write(tmp_path, text))
    assert (cfg.algorithm.repeat_times, cfg.buffer.batch_size) == (4, 2)
    assert cfg.explorer.eval_on_startup is False and cfg.explorer.first_task_check is True
    with pytest.raises(ConfigError, match="buffer.batch_size: expected an integer, got '2.5'"):
        load_dict(tmp_path, minimal(), "buffer.batch_size='2.5'")


def test_bad_enum_value_suggests(tmp_path):
    data = minimal()
    data["algorithm"]["algorithm_type"] = "grpoo"
    with pytest.raises(
        ConfigError,
        match="algorithm.algorithm_type: 'grpoo' is not a valid choice. Did you mean 'grpo'",
    ):
        load_dict(tmp_path, data)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_env_var_without_default_is_an_error(tmp_path, monkeypatch):
    monkeypatch.delenv("RFT_TEST_UNSET_VAR", raising=False)
    text = yaml.safe_dump(minimal()).replace("/models/m", "${oc.env:RFT_TEST_UNSET_VAR}")
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, text))
    assert "RFT_TEST_UNSET_VAR" in str(e.value)
    assert "model.model_path" in str(e.value)


def test_env_var_and_default(tmp_path, monkeypatch):
    text = yaml.safe_dump(minimal()).replace("/models/m", "${oc.env:RFT_TEST_MODEL,/default/m}")
    path = write(tmp_path, text)
    monkeypatch.delenv("RFT_TEST_MODEL", raising=False)
    assert load_config(path).model.model_path == "/default/m"
    monkeypatch.setenv("RFT_TEST_MODEL", "/from/env")
    assert load_config(path).model.model_path == "/from/env"


def test_overrides(tmp_path):
    cfg = load_dict(
        tmp_path,
        minimal(),
        "buffer.batch_size=3",
        "algorithm.optimizer.lr=2e-6",
        "explorer.name=second",
        "trainer.zero_stage=3",
    )
    assert cfg.buffer.batch_size == 3
    assert cfg.buffer.train_batch_size == 12  # re-derived from the overridden batch size
    assert cfg.algorithm.optimizer.lr == pytest.approx(2e-6)
    assert cfg.explorer.name == "second"
    assert cfg.trainer.zero_stage == 3


def test_override_with_unknown_key_and_bad_syntax(tmp_path):
    path = write(tmp_path, yaml.safe_dump(minimal()))
    with pytest.raises(ConfigError, match="Did you mean 'buffer.batch_size'"):
        load_config(path, ["buffer.batchsize=3"])
    with pytest.raises(ConfigError, match="must look like key.path=value"):
        load_config(path, ["buffer.batch_size"])


def test_resolved_config_round_trips_through_yaml(tmp_path):
    cfg = load_config(REPO / "configs" / "cpu" / "verl_grpo.yaml")
    text = config_to_yaml(cfg)
    assert "${" not in text
    assert load_config(write(tmp_path, text)) == cfg


def test_presets_fill_only_unset_functions(tmp_path):
    cfg = load_dict(tmp_path, minimal())
    assert (cfg.algorithm.advantage_fn, cfg.algorithm.policy_loss_fn) == ("grpo", "ppo")
    assert cfg.algorithm.loss_agg_mode == "token-mean"
    data = minimal()
    data["algorithm"].update(kl_loss_fn="low_var_kl", policy_loss_fn="gspo")
    cfg = load_dict(tmp_path, data)
    assert (cfg.algorithm.kl_loss_fn, cfg.algorithm.policy_loss_fn) == ("low_var_kl", "gspo")


@pytest.mark.parametrize(
    "section,refused",
    [
        ({"synchronizer": {"sync_method": "memory"}}, "synchronizer.sync_method: memory"),
        ({"model": {"model_path": "/m", "tinker": {"enable": True}}}, "model.tinker"),
        (
            {
                "buffer": {
                    "explorer_input": {"taskset": {"path": "/t", "format": {"image_key": "i"}}}
                }
            },
            "buffer.explorer_input.taskset.format.image_key",
        ),
        ({"synchronizer": {"sync_iteration_interval": 2}}, "synchronizer.sync_iteration_interval"),
        ({"mode": "serve"}, "mode: serve"),
        (
            {
                "trainer": {
                    "trainer_config": {"actor_rollout_ref": {"actor": {"strategy": "megatron"}}}
                }
            },
            "trainer.trainer_config.actor_rollout_ref.actor.strategy",
        ),
    ],
)
def test_trinity_names_rft_does_not_act_on_are_refused_by_name(tmp_path, section, refused):
    """A real Trinity/veRL key or choice gets "Trinity's `X` is not supported by rft: <what to
    do>", never a guess at a similar rft key."""
    with pytest.raises(NotSupportedError) as e:
        load_dict(tmp_path, minimal(**section))
    message = str(e.value)
    assert message.startswith(f"Trinity's `{refused}` is not supported by rft: "), message
    assert "Did you mean" not in message


def test_misspelt_names_still_get_the_nearest_name(tmp_path):
    with pytest.raises(ConfigError, match="Did you mean 'explorer.max_timeout'") as e:
        load_dict(tmp_path, minimal(explorer={"max_timout": 60}))
    assert not isinstance(e.value, NotSupportedError)


def test_sequence_parallelism_of_the_critic_is_refused_not_ignored(tmp_path):
    """The policy's sequences split across a group (tests/test_sequence_parallel.py); the
    critic's are not: > 1 there is refused (never a warning); 1 loads."""
    section = {"trainer_config": {"critic": {"ulysses_sequence_parallel_size": 2}}}
    with pytest.raises(NotSupportedError) as e:
        load_dict(tmp_path, minimal(trainer=section))
    key = "trainer.trainer_config.critic.ulysses_sequence_parallel_size: 2"
    assert f"Trinity's `{key}` is not supported by rft" in str(e.value)
    assert load_dict(tmp_path, minimal(trainer={"ulysses_sequence_parallel_size": 1}))


def test_log_prob_passes_take_verls_rollout_and_ref_batching(tmp_path):
    """veRL's rollout.log_prob_* (old log-probs) and ref.log_prob_* (reference) batch rft's one
    log-prob pass: the smaller token budget, dynamic when either is; unset: the actor's."""
    cfg = load_dict(tmp_path, minimal(trainer={"max_token_len_per_gpu": 8192}))
    assert (cfg.trainer.log_prob_max_token_len_per_gpu, cfg.trainer.log_prob_use_dynamic_bsz) == (
        8192,
        True,
    )
    arr = {
        "rollout": {"log_prob_max_token_len_per_gpu": 16384, "log_prob_use_dynamic_bsz": False},
        "ref": {"log_prob_max_token_len_per_gpu": 12000, "log_prob_use_dynamic_bsz": True},
    }
    cfg = load_dict(tmp_path, minimal(trainer={"trainer_config": {"actor_rollout_ref": arr}}))
    assert cfg.trainer.log_prob_max_token_len_per_gpu == 12000
    assert cfg.trainer.log_prob_use_dynamic_bsz is True
    with pytest.raises(ConfigError, match="contradicts trainer.log_prob_max_token_len_per_gpu"):
        load_dict(
            tmp_path,
            minimal(
                trainer={
                    "log_prob_max_token_len_per_gpu": 4096,
                    "trainer_config": {"actor_rollout_ref": arr},
                }
            ),
        )


def test_checkpoint_contents(tmp_path, caplog):
    """veRL's checkpoint.save_contents / load_contents: hf_model writes a Hugging Face folder at
    each checkpoint; a save list without the optimizer is warned about (rft's checkpoints are
    resumable); load_contents decides what a resume restores."""
    from rft.config.trinity_rules import resumed_parts

    def contents(**ckpt):
        actor = {"checkpoint": ckpt}
        return minimal(trainer={"trainer_config": {"actor_rollout_ref": {"actor": actor}}})

    cfg = load_dict(tmp_path, contents(save_contents=["model", "optimizer", "extra", "hf_model"]))
    assert cfg.trainer.save_hf_checkpoint == "always"
    assert resumed_parts(cfg) == {"model", "optimizer", "extra"}
    cfg = load_dict(tmp_path, contents(save_contents=["model"], load_contents=["model"]))
    assert "also hold optimizer and extra" in caplog.text
    assert resumed_parts(cfg) == {"model"}  # a resume starts a fresh optimizer and schedule
    with pytest.raises(ConfigError, match="leaves out the model"):
        load_dict(tmp_path, contents(load_contents=["optimizer"]))
    zero3 = contents(load_contents=["model"])
    zero3["trainer"]["zero_stage"] = 3
    with pytest.raises(NotSupportedError, match="without optimizer under trainer.zero_stage: 3"):
        load_dict(tmp_path, zero3)
    with pytest.raises(ConfigError, match="unknown parts \\['weights'\\]"):
        load_dict(tmp_path, contents(save_contents=["weights"]))


def test_delta_keys_refuse_a_relative_folder_and_say_where_they_have_no_effect(tmp_path, caplog):
    with pytest.raises(ConfigError, match="delta_local_dir='scratch' is relative"):
        load_dict(
            tmp_path, minimal(synchronizer={"delta_sync": True, "delta_local_dir": "scratch"})
        )
    cfg = load_dict(tmp_path, minimal(synchronizer={"delta_local_dir": "$TMPDIR/rft"}))
    assert cfg.synchronizer.delta_local_dir == "$TMPDIR/rft"  # expanded on each node
    assert "delta_local_dir has no effect without synchronizer.delta_sync" in caplog.text
    assert "delta_anchor_interval" not in caplog.text  # not set: not warned about
    caplog.clear()
    lora = [{"lora_rank": 8, "lora_alpha": 16}]
    load_dict(
        tmp_path,
        minimal(
            synchronizer={"delta_sync": True}, model={"model_path": "/m", "lora_configs": lora}
        ),
    )
    assert "delta_sync has no effect with model.lora_configs" in caplog.text


def test_trinity_spellings_set_rft_keys(tmp_path):
    """Older or veRL spellings in Trinity's examples reach the rft key they name."""
    verl = {
        "actor_rollout_ref": {
            "hybrid_engine": True,
            "actor": {
                "use_dynamic_bsz": False,
                "ppo_max_token_len_per_gpu": 8192,
                "optim": {"lr": 3e-6},
                "engine": {"optimizer_offload": True},
                "checkpoint": {"load_contents": ["model"], "save_contents": ["model"]},
            },
            "ref": {"log_prob_use_dynamic_bsz": False, "log_prob_max_token_len_per_gpu": 8192},
        },
        "critic": {"ppo_max_token_len_per_gpu": 1, "forward_max_token_len_per_gpu": 1},
        "trainer": {"balance_batch": True, "max_actor_ckpt_to_keep": 3},
    }
    cfg = load_dict(tmp_path, minimal(trainer={"trainer_config": verl}))
    t = cfg.trainer
    assert (t.use_dynamic_bsz, t.max_token_len_per_gpu, t.optimizer_offload) == (False, 8192, True)
    assert cfg.algorithm.optimizer.lr == 3e-6 and t.max_checkpoints_to_keep == 3
    cfg = load_dict(
        tmp_path,
        minimal(
            trainer={"ppo_max_token_len_per_gpu": 4096},
            algorithm={"algorithm_type": "grpo", "optimizer": {"lr_scheduler_type": "cosine"}},
            buffer={
                "batch_size": 2,
                "total_steps": 10,
                "max_retry_times": 3,
                "explorer_input": {"taskset": {"path": "/t", "enable_progress_bar": True}},
            },
        ),
    )
    assert cfg.trainer.max_token_len_per_gpu == 4096
    assert cfg.algorithm.optimizer.warmup_style == "cosine"
    with pytest.raises(ConfigError, match="contradicts trainer.max_token_len_per_gpu=1000"):
        load_dict(
            tmp_path,
            minimal(trainer={"ppo_max_token_len_per_gpu": 4096, "max_token_len_per_gpu": 1000}),
        )
    with pytest.raises(ConfigError, match="max_critic_ckpt_to_keep=2 differs"):
        load_dict(
            tmp_path,
            minimal(
                trainer={
                    "trainer_config": {
                        "trainer": {"max_actor_ckpt_to_keep": 3, "max_critic_ckpt_to_keep": 2}
                    }
                }
            ),
        )
    # veRL's older switch (Trinity 0.5 reads it): keep the newest checkpoint only
    older = {"trainer_config": {"trainer": {"remove_previous_ckpt_in_save": True}}}
    assert load_dict(tmp_path, minimal(trainer=older)).trainer.max_checkpoints_to_keep == 1
    older["trainer_config"]["trainer"]["max_actor_ckpt_to_keep"] = 3
    with pytest.raises(ConfigError, match="remove_previous_ckpt_in_save: true keeps one"):
        load_dict(tmp_path, minimal(trainer=older))


def test_explorer_env_vars_and_chunked_prefill_are_read(tmp_path):
    from rft.explorer.engine import engine_kwargs

    data = minimal(
        explorer={
            "env_vars": {"ALFWORLD_DATA": "/data/alf"},
            "rollout_model": {"enable_chunked_prefill": True},
        }
    )
    cfg = load_dict(tmp_path, data)
    assert cfg.explorer.env_vars == {"ALFWORLD_DATA": "/data/alf"}
    assert engine_kwargs(cfg, on_cpu=True)["enable_chunked_prefill"] is True
    assert "enable_chunked_prefill" not in engine_kwargs(load_dict(tmp_path, minimal()), True)


def test_monitor_type_is_one_name_or_a_list(tmp_path):
    for kind in ("wandb", "mlflow", "console"):
        assert (
            load_dict(tmp_path, minimal(monitor={"monitor_type": kind})).monitor.monitor_type
            == kind
        )
    assert load_dict(tmp_path, minimal()).monitor.monitor_type == "tensorboard"
    cfg = load_dict(tmp_path, minimal(), "monitor.monitor_type=[tensorboard,wandb,mlflow]")
    assert cfg.monitor.monitor_type == ["tensorboard", "wandb", "mlflow"]
    assert load_config(write(tmp_path, config_to_yaml(cfg), "again.yaml")) == cfg
    with pytest.raises(
        ConfigError, match=r"monitor.monitor_type\[1\]: 'wandbb' .* Did you mean 'wandb'"
    ):
        load_dict(tmp_path, minimal(monitor={"monitor_type": ["tensorboard", "wandbb"]}))
    with pytest.raises(ConfigError, match="monitor.monitor_type: 'tensorbord' .* Did you mean"):
        load_dict(tmp_path, minimal(monitor={"monitor_type": "tensorbord"}))
    for bad in ([], ["wandb", "wandb"]):
        with pytest.raises(ConfigError, match="must name each monitor once"):
            load_dict(tmp_path, minimal(monitor={"monitor_type": bad}))


def test_sql_transport_refused_on_several_nodes(tmp_path):
    data = minimal(cluster={"node_num": 2, "gpu_per_node": 4})
    data["buffer"]["trainer_input"] = {
        "experience_buffer": {"storage_type": "sql", "path": "sqlite:///x.db"}
    }
    with pytest.raises(ConfigError, match="Use storage_type: queue"):
        load_dict(tmp_path, data)
    data["cluster"]["node_num"] = 1
    assert load_dict(tmp_path, data).buffer.trainer_input.experience_buffer.storage_type == "sql"


def test_gpu_split_leaves_gpus_for_the_trainer(tmp_path):
    data = minimal(explorer={"rollout_model": {"engine_num": 2}})
    with pytest.raises(ConfigError, match="leaving none of cluster.node_num x gpu_per_node = 2"):
        load_dict(tmp_path, data)


def test_verl_trainer_config_maps_and_conflicts(tmp_path):
    verl = {
        "trainer_config": {
            "actor_rollout_ref": {
                "actor": {"ppo_micro_batch_size_per_gpu": 4, "fsdp_config": {"param_offload": True}}
            }
        }
    }
    cfg = load_dict(tmp_path, minimal(trainer=dict(verl, zero_stage=3)))
    assert cfg.trainer.micro_batch_size_per_gpu == 4
    assert cfg.trainer.param_offload is True
    with pytest.raises(ConfigError, match="contradicts trainer.param_offload=False"):
        load_dict(tmp_path, minimal(trainer={**verl, "zero_stage": 3, "param_offload": False}))
    misplaced = {
        "trainer_config": {"actor_rollout_ref": {"model": {"fsdp_config": {"param_offload": True}}}}
    }
    with pytest.raises(
        ConfigError,
        match="unknown config key 'trainer.trainer_config.actor_rollout_ref.model.fsdp_config'",
    ):  # veRL has it under actor/ref only
        load_dict(tmp_path, minimal(trainer=misplaced))


def test_length_limits_are_derived_and_checked(tmp_path):
    cfg = load_dict(
        tmp_path,
        minimal(model={"model_path": "/m", "max_prompt_tokens": 100, "max_response_tokens": 28}),
    )
    assert cfg.model.max_model_len == 128
    assert cfg.explorer.rollout_model.max_model_len == 128
    with pytest.raises(ConfigError, match="exceeds model.max_model_len=100"):
        load_dict(
            tmp_path,
            minimal(
                model={
                    "model_path": "/m",
                    "max_prompt_tokens": 90,
                    "max_response_tokens": 20,
                    "max_model_len": 100,
                }
            ),
        )


def test_stages_merge_onto_the_base_and_switch_algorithm():
    cfg = load_config(REPO / "configs" / "sft_warmup.yaml")
    assert [s.stage_name for s in cfg.stages] == ["sft_warmup", "rft"]
    sft = stage_config(cfg, 0)
    assert sft.mode == "train"
    assert sft.algorithm.algorithm_type == "sft"
    assert sft.algorithm.policy_loss_fn == "sft"  # the preset's, not the base's "ppo"
    assert sft.algorithm.advantage_fn is None
    assert sft.buffer.total_steps == 10
    assert sft.buffer.trainer_input.experience_buffer.storage_type == "file"  # inferred from path
    assert sft.model.model_path == cfg.model.model_path  # inherited
    rft = stage_config(cfg, 1)
    assert rft.algorithm.algorithm_type == "grpo" and rft.mode == "both"
    assert (sft.run_dir, rft.run_dir) == (cfg.run_dir / "sft_warmup", cfg.run_dir / "rft")


def test_bad_stage_is_reported_with_its_index(tmp_path):
    data = minimal(stages=[{"stage_name": "warm", "buffer": {"batch_size": -1}}])
    with pytest.raises(ConfigError, match=r"stages\[0\] \(warm\): buffer.batch_size: -1"):
        load_dict(tmp_path, data)


def test_runner_num_is_an_alias(tmp_path):
    cfg = load_dict(tmp_path, minimal(explorer={"runner_num": 4}))
    assert cfg.explorer.runner_per_model == 4
    with pytest.raises(ConfigError, match="contradicts explorer.runner_per_model"):
        load_dict(tmp_path, minimal(explorer={"runner_num": 4, "runner_per_model": 8}))


def test_config_from_dict_requires_a_model():
    with pytest.raises(ConfigError, match="model.model_path is empty"):
        config_from_dict({"buffer": {"explorer_input": {"taskset": {"path": "/d"}}}})


def test_unquoted_time_limit_is_refused_and_override_kept_as_text(tmp_path):
    text = yaml.safe_dump(minimal()) + "slurm:\n  time: 12:00:00\n"
    with pytest.raises(ConfigError, match="slurm.time: expected text, got 43200"):
        load_config(write(tmp_path, text))
    cfg = load_dict(tmp_path, minimal(), "slurm.time=12:00:00")
    assert cfg.slurm.time == "12:00:00"


def test_trainer_and_sampling_options_that_cannot_work(tmp_path, caplog):
    with pytest.raises(
        ConfigError,
        match="param_offload needs trainer.zero_stage=3, but trainer.zero_stage=2 is set",
    ):
        load_dict(tmp_path, minimal(trainer={"param_offload": True, "zero_stage": 2}))
    assert load_dict(tmp_path, minimal(trainer={"param_offload": True})).trainer.zero_stage == 3
    verl = {"actor_rollout_ref": {"actor": {"fsdp_config": {"param_offload": True}}}}
    assert load_dict(tmp_path, minimal(trainer={"trainer_config": verl})).trainer.zero_stage == 3
    assert load_dict(tmp_path, minimal()).trainer.zero_stage == 2  # the default otherwise
    with caplog.at_level(logging.WARNING, logger="rft"):
        assert load_dict(tmp_path, minimal(model={"model_path": "/m", "logprobs": 5}))
    assert "model.logprobs / rollout_args.logprobs > 0 has no effect" in caplog.text
    data = minimal()
    data["explorer"] = {"rollout_model": {"enable_auto_tool_choice": True}}
    with pytest.raises(ConfigError, match="needs explorer.rollout_model.tool_call_parser"):
        load_dict(tmp_path, data)


def test_rollout_correction_modes_keys_and_conflicts(tmp_path):
    def algo(rc: dict, **more) -> dict:
        return minimal(
            algorithm={
                "algorithm_type": "grpo",
                "repeat_times": 4,
                "rollout_correction": rc,
                **more,
            }
        )

    assert load_dict(tmp_path, minimal()).algorithm.rollout_correction.mode == "none"  # the default
    tis = load_dict(tmp_path, algo({"mode": "tis"})).algorithm.rollout_correction
    assert tis.rollout_is_threshold == 2.0  # filled only for tis (veRL's default)
    assert (
        load_dict(
            tmp_path, algo({"mode": "tis", "rollout_is_threshold": 5})
        ).algorithm.rollout_correction.rollout_is_threshold
        == 5
    )
    cap = load_dict(tmp_path, algo({"mode": "decoupled", "behav_imp_weight_cap": 3.0}))
    assert cap.algorithm.rollout_correction.behav_imp_weight_cap == 3.0
    again = load_config(write(tmp_path, config_to_yaml(cap), "again.yaml"))
    assert again == cap
    with pytest.raises(
        ConfigError,
        match="algorithm.rollout_correction.mode: 'tiss' is not a valid "
        "choice. Did you mean 'tis'.*'none', 'tis', 'decoupled'",
    ):
        load_dict(tmp_path, algo({"mode": "tiss"}))
    with pytest.raises(
        ConfigError, match="rollout_is_threshold: 0.5 is out of range; it must be >= 1"
    ):
        load_dict(tmp_path, algo({"mode": "tis", "rollout_is_threshold": 0.5}))
    with pytest.raises(
        ConfigError,
        match="rollout_is_threshold acts only with "
        "algorithm.rollout_correction.mode: tis, but mode is 'decoupled'",
    ):
        load_dict(tmp_path, algo({"mode": "decoupled", "rollout_is_threshold": 3}))
    with pytest.raises(
        ConfigError,
        match="behav_imp_weight_cap acts only with .*mode: decoupled, but mode is 'none'",
    ):
        load_dict(tmp_path, algo({"behav_imp_weight_cap": 3}))
    with pytest.raises(
        ConfigError, match="needs old log-probs recomputed.*set algorithm.old_logprobs: recompute"
    ):
        load_dict(tmp_path, algo({"mode": "tis"}, old_logprobs="rollout"))
    sft = minimal(
        algorithm={"algorithm_type": "sft", "rollout_correction": {"mode": "decoupled"}},
        mode="train",
        buffer={"trainer_input": {"experience_buffer": {"path": "/data/sft"}}},
    )
    with pytest.raises(ConfigError, match="policy_loss_fn 'sft' trains on data without behaviour"):
        load_dict(tmp_path, sft)


def test_a_tasksets_temperature_and_its_scoring_temperature(tmp_path):
    from rft.config.queries import scoring_temperature, taskset_temperature

    data = minimal(model={"model_path": "/m", "temperature": 0.7})
    cfg = load_dict(tmp_path, data)
    assert taskset_temperature(cfg, cfg.training_tasksets()[0]) == 0.7  # model.temperature
    data["buffer"]["explorer_input"]["taskset"]["rollout_args"] = {"temperature": 0.5}
    cfg = load_dict(tmp_path, data)
    assert taskset_temperature(cfg, cfg.training_tasksets()[0]) == 0.5  # the taskset's own
    assert scoring_temperature(0.5) == 0.5
    assert scoring_temperature(0.0) == 1.0  # greedy: vLLM reports T=1 log-probs


def test_micro_batch_sizes_are_resolved_once(tmp_path):
    cfg = load_dict(tmp_path, minimal(trainer={"micro_batch_size_per_gpu": 3}))
    assert cfg.trainer.log_prob_micro_batch_size_per_gpu == 3
    assert cfg.trainer.trainer_config.critic.ppo_micro_batch_size_per_gpu == 3
    cfg = load_dict(
        tmp_path,
        minimal(trainer={"micro_batch_size_per_gpu": 3, "log_prob_micro_batch_size_per_gpu": 5}),
    )
    assert cfg.trainer.log_prob_micro_batch_size_per_gpu == 5


def test_a_stage_re_derives_what_the_rules_derived_for_the_base(tmp_path):
    """A stage merges onto what the user wrote, not onto the base's derived values."""
    data = minimal(trainer={"micro_batch_size_per_gpu": 2})
    data["stages"] = [
        {"stage_name": "a", "buffer": {"batch_size": 1}, "trainer": {"micro_batch_size_per_gpu": 4}}
    ]
    stage = stage_config(load_dict(tmp_path, data), 0)
    assert stage.buffer.train_batch_size == 4  # 1 task x 4 samples, not the base's 2 x 4
    assert stage.trainer.log_prob_micro_batch_size_per_gpu == 4


def test_preset_keys_are_every_key_a_preset_fills():
    from rft.config.presets import COMMON_DEFAULTS, PRESET_KEYS, PRESETS

    assert set(PRESET_KEYS) == {
        key for preset in (*PRESETS.values(), COMMON_DEFAULTS) for key in preset
    }
    assert {"advantage_fn", "policy_loss_fn", "loss_agg_mode", "sample_strategy"} <= set(
        PRESET_KEYS
    )
