"""Keys of Trinity-RFT's newer schema (trinity/common/config.py at 1d7fae4) that act in rft:
model.repetition_penalty / rope_scaling / rope_theta / chat_template_path, the rollout
engine's enable_expert_parallel / extra_engine_args / data_parallel_size, the per-side sync
intervals, explorer.max_inflight_batches and Trinity's own trainer.* spellings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rft.config.load import config_from_dict
from rft.errors import ConfigError, NotSupportedError
from rft.explorer.engine import _params, engine_kwargs
from rft.explorer.tasksets import SamplingArgs, sampling_defaults


def cfg_of(model_dir: Path | str = "/models/m", **sections: Any):
    data: dict[str, Any] = {
        "model": {"model_path": str(model_dir), "max_model_len": 256},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 2},
        "buffer": {"batch_size": 3, "explorer_input": {"taskset": {"path": "/data/t"}}},
        "cluster": {"node_num": 1, "gpu_per_node": 2},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return config_from_dict(data)


def test_repetition_penalty_is_every_calls_default_unless_the_call_sets_it():
    """Trinity's InferenceModelConfig.repetition_penalty: the chat/generate default."""
    from vllm import SamplingParams

    cfg = cfg_of(model={"repetition_penalty": 1.3})
    defaults = sampling_defaults(cfg)
    assert defaults == {"repetition_penalty": 1.3}
    assert _params(SamplingParams, SamplingArgs(), 1, defaults).repetition_penalty == 1.3
    own = SamplingArgs(extra=(("repetition_penalty", 1.1),))
    assert _params(SamplingParams, own, 1, defaults).repetition_penalty == 1.1
    assert sampling_defaults(cfg_of()) == {}


def test_engine_options_reach_vllm():
    cfg = cfg_of(
        explorer={
            "rollout_model": {
                "enable_expert_parallel": True,
                "extra_engine_args": {"max_num_seqs": 64, "swap_space": 2},
            }
        }
    )
    kwargs = engine_kwargs(cfg, on_cpu=True)
    assert kwargs["enable_expert_parallel"] is True
    assert (kwargs["max_num_seqs"], kwargs["swap_space"]) == (64, 2)
    taken = cfg_of(explorer={"rollout_model": {"extra_engine_args": {"seed": 3}}})
    with pytest.raises(ConfigError, match=r"extra_engine_args sets \['seed'\].*set them there"):
        engine_kwargs(taken, on_cpu=True)


def test_rope_overrides_reach_the_engine_and_the_trainer(tiny_model_dir):
    """One dict for both sides: vLLM's hf_overrides and the trainer's loaded config."""
    import torch

    from rft.trainer.engine import _load_model

    rope = {"rope_type": "linear", "factor": 2.0}
    cfg = cfg_of(tiny_model_dir, model={"rope_scaling": rope, "rope_theta": 20000.0})
    overrides = engine_kwargs(cfg, on_cpu=True)["hf_overrides"]
    params = overrides["rope_parameters"]  # transformers >= 5 spells them as one dict
    assert params["rope_type"] == "linear" and params["factor"] == 2.0
    assert params["rope_theta"] == 20000.0
    zero2 = {"zero_optimization": {"stage": 2}}
    model, _ = _load_model(str(tiny_model_dir), torch.float32, zero2, overrides=overrides)
    assert model.config.rope_parameters["factor"] == 2.0
    assert model.config.rope_parameters["rope_theta"] == 20000.0
    assert "hf_overrides" not in engine_kwargs(cfg_of(tiny_model_dir), on_cpu=True)


def test_chat_template_path_is_read_unless_a_template_is_written(tmp_path):
    """Trinity's ModelConfigValidator: the file fills custom_chat_template when that is None."""
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages[0]['content'] }}")
    cfg = cfg_of(model={"chat_template_path": str(template)})
    assert cfg.model.custom_chat_template == "{{ messages[0]['content'] }}"
    written = cfg_of(model={"chat_template_path": str(template), "custom_chat_template": "x"})
    assert written.model.custom_chat_template == "x"
    with pytest.raises(ConfigError, match="model.chat_template_path=.*cannot read"):
        cfg_of(model={"chat_template_path": str(tmp_path / "missing.jinja")})


@pytest.mark.parametrize("key", ["data_parallel_size", "pipeline_parallel_size"])
def test_parallelism_inside_one_engine_is_refused_above_one(key):
    assert cfg_of(explorer={"rollout_model": {key: 1}})
    with pytest.raises(NotSupportedError, match=f"explorer.rollout_model.{key}: 2.*engine_num"):
        cfg_of(explorer={"rollout_model": {key: 2}})


def test_per_side_sync_intervals_must_equal_sync_interval():
    assert cfg_of(synchronizer={"sync_interval": 2, "explorer_sync_interval": 2})
    with pytest.raises(NotSupportedError, match="synchronizer.trainer_sync_interval: 3"):
        cfg_of(synchronizer={"sync_interval": 2, "trainer_sync_interval": 3})


def test_max_inflight_batches_sets_the_streaming_explorers_samples(caplog):
    streaming = cfg_of(explorer={"partial_rollout": True, "max_inflight_batches": 2})
    assert streaming.explorer.max_inflight_samples == 2 * 3 * 2  # batches x batch x repeat
    cfg_of(explorer={"max_inflight_batches": 2})
    assert "max_inflight_batches=2 has no effect without explorer.partial_rollout" in caplog.text


def test_trinitys_trainer_spellings():
    cfg = cfg_of(trainer={"use_remove_padding": True, "trainer_strategy": "fsdp2"})
    assert cfg.trainer.padding_free is True
    with pytest.raises(ConfigError, match="use_remove_padding=True contradicts"):
        cfg_of(trainer={"use_remove_padding": True, "padding_free": False})
    with pytest.raises(NotSupportedError, match="trainer.trainer_strategy: megatron"):
        cfg_of(trainer={"trainer_strategy": "megatron"})
    with pytest.raises(ConfigError, match="critic_warmup=2 needs a critic"):
        cfg_of(trainer={"critic_warmup": 2})


def test_max_read_timeout_is_how_long_the_trainer_waits_for_experiences(tmp_path, caplog):
    """Trinity's experience_buffer.max_read_timeout (its queue's read timeout, default 1800 s):
    the trainer's input ends when nothing arrives within it (null: synchronizer.sync_timeout)."""
    import time

    from rft.config.queries import read_timeout
    from rft.trainer.inputs import BufferSource

    assert read_timeout(cfg_of()) == (3600.0, "synchronizer.sync_timeout")
    cfg = cfg_of(buffer={"trainer_input": {"experience_buffer": {"max_read_timeout": 0.5}}})
    key = "buffer.trainer_input.experience_buffer.max_read_timeout"
    assert read_timeout(cfg) == (0.5, key)
    cfg.mode = "train"
    source = BufferSource(cfg, tmp_path / "run", None)
    start = time.monotonic()
    assert source.next_batch(1, 0) is None and source.timed_out
    assert time.monotonic() - start < 30
    assert f"no experiences arrived in {key}=" in caplog.text


def test_a_trainer_buffers_data_selector_reads_in_order_only():
    """Trinity's ExperienceBufferConfig.data_selector (its file reader's order): rft reads SFT
    and expert rows in dataset order, so sequential loads and the others are refused."""
    sft = {
        "mode": "train",
        "algorithm": {"algorithm_type": "sft"},
        "buffer": {
            "train_batch_size": 2,
            "trainer_input": {
                "experience_buffer": {
                    "path": "/d",
                    "storage_type": "file",
                    "data_selector": {"selector_type": "sequential"},
                }
            },
        },
    }
    assert cfg_of(**sft)
    sft["buffer"]["trainer_input"]["experience_buffer"]["data_selector"] = {
        "selector_type": "shuffle"
    }
    with pytest.raises(NotSupportedError, match="experience_buffer.data_selector.selector_type"):
        cfg_of(**sft)


def test_ray_keys_have_no_effect_and_the_older_priority_queue_switch_acts():
    """cluster.ray_address and ray_namespace place Trinity's Ray actors (no effect here);
    experience_buffer.use_priority_queue is older Trinity's replay_buffer.enable."""
    cfg = cfg_of(cluster={"ray_address": "auto"}, ray_namespace="ns")
    assert cfg.run_dir.name == "run"  # the run directory is project/group/name, nothing else
    buffer = {"trainer_input": {"experience_buffer": {"use_priority_queue": True}}}
    assert cfg_of(buffer=buffer).buffer.trainer_input.experience_buffer.replay_buffer.enable


def test_the_dry_run_holds_a_mini_batch_to_the_step_only_for_single_turn_recipes(
    tiny_model_dir, tmp_path, caplog
):
    """buffer.train_batch_size counts experiences (Trinity's unit): with a recipe each run
    gives one, so a mini-batch larger than batch_size x repeat_times is refused; a workflow
    class's runs may give one per turn (Trinity's alfworld examples: 7680 for 32 x 8 runs)."""
    from rft.launch.preflight import check_config

    data = Path(__file__).resolve().parent.parent / "data" / "arithmetic"

    def dry(workflow: str, schedule: str = "constant"):
        cfg = cfg_of(
            tiny_model_dir,
            checkpoint_root_dir=str(tmp_path),
            algorithm={"optimizer": {"warmup_style": schedule}},
            buffer={
                "train_batch_size": 16,
                "explorer_input": {
                    "taskset": {
                        "path": str(data),
                        "subset_name": "main",
                        "format": {"prompt_key": "question", "response_key": "answer"},
                    },
                    "default_workflow_type": workflow,
                },
            },
            explorer={"first_task_check": False},
        )
        return check_config(cfg, here=None)

    with pytest.raises(ConfigError, match="exceeds a step's batch_size x repeat_times"):
        dry("math_workflow")
    assert dry("frozen_lake_workflow")  # a multi-turn class: experiences counted at run time
    assert "ends early" not in caplog.text
    dry("frozen_lake_workflow", "cosine")  # its update count per step is known only then
    assert "the warm-up/cosine schedule ends early" in caplog.text


def test_rollout_model_copies_of_model_keys_are_model_keys():
    """Trinity's InferenceModelConfig length and sampling keys default to model.<key>
    (ExplorerConfigValidator's set_if_none): written on the rollout model, rft reads them as
    model.<key> (one value for generation and training); a different model.<key> is an error."""
    cfg = cfg_of(explorer={"rollout_model": {"max_response_tokens": 64, "temperature": 0.7}})
    assert (cfg.model.max_response_tokens, cfg.model.temperature) == (64, 0.7)
    with pytest.raises(ConfigError, match="rollout_model.top_p=0.5 contradicts model.top_p=0.9"):
        cfg_of(model={"top_p": 0.9}, explorer={"rollout_model": {"top_p": 0.5}})


def test_the_dry_run_checks_the_replay_buffers_priority_fn_args(tiny_model_dir, tmp_path):
    from rft.launch.preflight import check_config

    data = Path(__file__).resolve().parent.parent / "data" / "arithmetic"
    cfg = cfg_of(
        tiny_model_dir,
        checkpoint_root_dir=str(tmp_path),
        buffer={
            "explorer_input": {
                "taskset": {
                    "path": str(data),
                    "subset_name": "main",
                    "format": {"prompt_key": "question", "response_key": "answer"},
                },
            },
            "trainer_input": {
                "experience_buffer": {
                    "replay_buffer": {"enable": True, "priority_fn_args": {"decay": 2, "sgima": 1}}
                }
            },
        },
        explorer={"first_task_check": False},
    )
    with pytest.raises(ConfigError, match=r"priority_fn_args \['sgima'\] are not arguments"):
        check_config(cfg, here=None)
