"""Every name Trinity-RFT's registries and enums accept (rft.config.known_names.
TRINITY_REGISTRIES: algorithm types, loss/advantage/KL/entropy functions, sample strategies,
workflows, rewards, experience operators, task selectors, monitors, priority functions, storage
types, sync methods and styles, modes, prompt types), put where a Trinity config puts it: rft
acts on it, or refuses it by name as "Trinity's `X` is not supported by rft: <what to do>".
None is ever answered with a "did you mean" another name, nor called an invalid choice."""

from __future__ import annotations

import copy
from typing import Any, Callable

import pytest

from rft.config.known_names import TRINITY_NAMES, TRINITY_REGISTRIES
from rft.config.load import config_from_dict
from rft.errors import ConfigError, NotSupportedError, did_you_mean
from rft.explorer.tasksets import taskset_workflow

BASE: dict[str, Any] = {
    "model": {"model_path": "/models/m", "max_model_len": 256},
    "algorithm": {"algorithm_type": "grpo", "repeat_times": 2},
    "buffer": {"batch_size": 2, "explorer_input": {"taskset": {"path": "/data/t"}}},
    "cluster": {"node_num": 1, "gpu_per_node": 2},
}


def put(path: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    section = data
    for part in parents:
        section = section.setdefault(part, {})
    section[last] = value
    return data


def load_with_workflows(data: dict[str, Any]) -> None:
    cfg = config_from_dict(data)
    for label, taskset in cfg.labelled_tasksets():
        taskset_workflow(cfg, taskset, label, is_eval=False)


# registry -> how a Trinity config writes one of its names
PLACES: dict[str, Callable[[str], dict[str, Any]]] = {
    "algorithm_type": lambda n: put("algorithm.algorithm_type", n),
    "policy_loss_fn": lambda n: put("algorithm.policy_loss_fn", n),
    "advantage_fn": lambda n: put("algorithm.advantage_fn", n),
    "kl_fn": lambda n: put("algorithm.kl_loss_fn", n),
    "entropy_loss_fn": lambda n: put("algorithm.entropy_loss_fn", n),
    "sample_strategy": lambda n: put("algorithm.sample_strategy", n),
    "workflow": lambda n: put("buffer.explorer_input.default_workflow_type", n),
    "reward_fn": lambda n: put("buffer.explorer_input.default_reward_fn_type", n),
    "experience_operator": lambda n: put(
        "data_processor.experience_pipeline.operators", [{"name": n}]
    ),
    "selector": lambda n: put(
        "buffer.explorer_input.taskset", {"path": "/data/t", "data_selector": {"selector_type": n}}
    ),
    "monitor": lambda n: put("monitor.monitor_type", n),
    "priority_fn": lambda n: put(
        "buffer.trainer_input.experience_buffer",
        {"replay_buffer": {"enable": True, "priority_fn": n, "priority_fn_args": {}}},
    ),
    "storage_type": lambda n: put("buffer.trainer_input.experience_buffer.storage_type", n),
    "sync_method": lambda n: put("synchronizer.sync_method", n),
    "sync_style": lambda n: put("synchronizer.sync_style", n),
    "prompt_type": lambda n: put("buffer.explorer_input.taskset.format.prompt_type", n),
    "save_strategy": lambda n: put("trainer.save_strategy", n),
    "mode": lambda n: put("mode", n),
}
CASES = [(kind, name) for kind, names in TRINITY_REGISTRIES.items() for name in names]


def test_every_registry_has_a_place_and_names():
    assert set(TRINITY_REGISTRIES) == set(PLACES)
    assert len(CASES) > 150


@pytest.mark.parametrize("kind, name", CASES, ids=[f"{k}:{n}" for k, n in CASES])
def test_a_trinity_name_is_read_or_refused_by_name(kind, name):
    try:
        load_with_workflows(PLACES[kind](name))
    except NotSupportedError as e:
        assert "is not supported by rft: " in str(e)
        assert "Did you mean" not in str(e)
    except ConfigError as e:  # another key of the example it comes from is needed
        message = str(e)
        assert "Did you mean" not in message, message
        assert "is not a valid choice" not in message, message
        assert "unknown config key" not in message, message
        assert f"{name!r} is not" not in message, message


def test_did_you_mean_never_points_a_trinity_name_elsewhere():
    """The names' callers pass TRINITY_NAMES as ``exclude``; a typo still gets its hint."""
    options = ["grpo", "gspo", "frozen_lake_workflow", "accuracy_reward"]
    for name in TRINITY_NAMES:
        assert did_you_mean(name, options, TRINITY_NAMES) == ""
    assert did_you_mean("gigpo", ["gspo"]) == " Did you mean 'gspo'?"  # without the list
    assert did_you_mean("grpoo", ["grpo", "gspo"], TRINITY_NAMES) == " Did you mean 'grpo'?"
