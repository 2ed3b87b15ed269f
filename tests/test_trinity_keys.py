"""Every key of Trinity-RFT's newest config schema (rft.config.trinity_keys, read from its
trinity/common/config.py) is a key rft reads, or is refused by name with what to do: none gets
the generic unknown-key error or a "did you mean"."""

from __future__ import annotations

import dataclasses

import pytest

import rft.config.schema as schema
from rft.config.known_names import KEYS
from rft.config.load import config_from_dict
from rft.config.trinity_keys import READ_BY_LOADER, SCHEMA, SOURCE
from rft.errors import ConfigError, NotSupportedError

PAIRS = [(trinity, ours, key) for trinity, (ours, keys) in SCHEMA.items() for key in keys]


def test_the_list_names_its_source_and_is_complete_enough():
    assert "1d7fae4a63f5e3a30e1927559d28a348a2167dd6" in SOURCE
    assert len(PAIRS) > 300


@pytest.mark.parametrize("trinity, ours, key", PAIRS, ids=[f"{t}.{k}" for t, _, k in PAIRS])
def test_each_trinity_key_is_read_or_refused_by_name(trinity, ours, key):
    fields = {f.name for f in dataclasses.fields(getattr(schema, ours))}
    refused = KEYS.get(ours, {})
    assert key in fields or key in refused or (ours, key) in READ_BY_LOADER, (
        f"Trinity's {trinity}.{key} is neither a key of rft's {ours} nor refused by name in "
        "rft.config.known_names.KEYS"
    )
    assert not (key in fields and key in refused), f"{ours}.{key} is both read and refused"


def minimal(**sections) -> dict:
    data = {
        "model": {"model_path": "/models/m"},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 2},
        "buffer": {"batch_size": 2, "explorer_input": {"taskset": {"path": "/data/t"}}},
        "cluster": {"node_num": 1, "gpu_per_node": 2},
    }
    data.update(sections)
    return data


@pytest.mark.parametrize(
    "section, key_path",
    [
        ({"cod": {"task_pack_size": 4}}, "cod"),
        (
            {"cluster": {"node_num": 1, "gpu_per_node": 2, "total_gpu_num": 2}},
            "cluster.total_gpu_num",
        ),
        ({"explorer": {"over_rollout": {"ratio": 0.2}}}, "explorer.over_rollout"),
        ({"explorer": {"rollout_model": {"base_port": 8000}}}, "explorer.rollout_model.base_port"),
        ({"trainer": {"megatron": {"tensor_model_parallel_size": 2}}}, "trainer.megatron"),
        ({"synchronizer": {"group_name": "g"}}, "synchronizer.group_name"),
    ],
)
def test_a_refused_key_says_so_by_name(section, key_path):
    with pytest.raises(NotSupportedError) as e:
        config_from_dict(minimal(**section))
    assert f"Trinity's `{key_path}` is not supported by rft: " in str(e.value)
    assert "Did you mean" not in str(e.value)


def test_a_typo_still_gets_the_nearest_key():
    with pytest.raises(ConfigError) as e:
        config_from_dict(minimal(synchronizer={"sync_intervall": 2}))
    assert not isinstance(e.value, NotSupportedError)
    assert "Did you mean 'synchronizer.sync_interval'" in str(e.value)
