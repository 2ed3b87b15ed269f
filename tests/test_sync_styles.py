"""Trinity's ``synchronizer.sync_style`` values in rft (rft.sync.schedule): which steps wait for
which weights, when the trainer publishes and when an explorer takes newer weights.

Trinity's names: trinity/common/constants.py SyncStyle (agentscope-ai/Trinity-RFT at 1c35a79:
fixed, trainer_driven, explorer_driven; SyncStyleEnumMeta.name_aliases maps dynamic_by_explorer
and dynamic_by_trainer to them); their meaning: docs/sphinx_doc/source/tutorial/synchronizer.md
("Synchronization Styles")."""

from __future__ import annotations

import pytest

from rft.config.load import config_from_dict
from rft.errors import ConfigError
from rft.sync.requests import RequestWatcher, request_weights
from rft.sync.schedule import (
    explorer_lead,
    publishes_weights,
    required_version,
    syncs_at,
    takes_weights,
)


def config(**synchronizer) -> dict:
    return {
        "mode": "both",
        "model": {"model_path": "/models/m"},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 2},
        "buffer": {"batch_size": 2, "explorer_input": {"taskset": {"path": "/data/t"}}},
        "cluster": {"node_num": 1, "gpu_per_node": 2},
        "synchronizer": synchronizer,
    }


@pytest.mark.parametrize(
    "written, read",
    [
        ("fixed", "fixed"),
        ("explorer_driven", "explorer_driven"),
        ("trainer_driven", "trainer_driven"),
        ("dynamic_by_explorer", "explorer_driven"),  # Trinity's older names
        ("dynamic_by_trainer", "trainer_driven"),
    ],
)
def test_trinity_sync_style_names_load(written, read):
    cfg = config_from_dict(config(sync_style=written))
    assert cfg.synchronizer.sync_style == read


def test_an_unknown_style_lists_trinitys_names():
    with pytest.raises(ConfigError) as e:
        config_from_dict(config(sync_style="sometimes"))
    assert "explorer_driven" in str(e.value) and "trainer_driven" in str(e.value)


def test_fixed_waits_for_the_version_sync_offset_allows():
    # tutorial: interval=10, offset=0 syncs every 10 steps; step s needs the trainer's s-1.
    assert explorer_lead("both", 0, None, "fixed") == (0, "synchronizer.sync_offset")
    assert [required_version(s, 0, 1) for s in (1, 2, 3)] == [0, 1, 2]
    assert [required_version(s, 1, 2) for s in (1, 2, 3, 4, 5)] == [0, 0, 0, 2, 2]
    assert [publishes_weights(s, 2, 5) for s in (1, 2, 3, 4, 5)] == [0, 1, 0, 1, 1]
    assert all(takes_weights(s, "fixed", 3) for s in range(1, 7))


@pytest.mark.parametrize("style", ["explorer_driven", "trainer_driven"])
def test_dynamic_styles_never_wait_unless_max_lead_steps_bounds_them(style):
    assert explorer_lead("both", 1, None, style) == (None, "synchronizer.max_lead_steps")
    assert explorer_lead("both", 0, 3, style) == (3, "synchronizer.max_lead_steps")
    assert explorer_lead("explore", 0, None, style) == (None, "synchronizer.max_lead_steps")


def test_trainer_driven_publishes_every_interval_and_the_explorer_takes_them_at_once():
    # "Every sync_interval steps, the Trainer decides to request synchronization ... The Explorer
    # detects this request during its normal loop and responds by performing synchronization."
    assert [publishes_weights(s, 3, 7, "trainer_driven") for s in range(1, 8)] == [
        0,
        0,
        1,
        0,
        0,
        1,
        1,
    ]
    assert all(takes_weights(s, "trainer_driven", 3) for s in range(1, 8))


def test_explorer_driven_asks_every_interval_and_the_trainer_publishes_when_asked(tmp_path):
    # "After completing sync_interval steps, the Explorer sends a request ... The Trainer detects
    # this request in its next loop iteration and performs the synchronization."
    assert [syncs_at(s, "explorer_driven", 3) for s in range(1, 8)] == [1, 0, 0, 1, 0, 0, 1]
    assert not any(syncs_at(s, "fixed", 1) for s in range(1, 4))
    assert [takes_weights(s, "explorer_driven", 3) for s in range(1, 5)] == [1, 0, 0, 1]
    # a broadcast, which it asked for, is taken at any step (the trainer waits for every member)
    assert all(takes_weights(s, "explorer_driven", 3, "nccl") for s in range(1, 5))
    assert [publishes_weights(s, 3, 9, "explorer_driven") for s in (1, 2, 9)] == [0, 0, 1]
    assert publishes_weights(2, 3, 9, "explorer_driven", requested=True)
    watcher = RequestWatcher(tmp_path)
    assert not watcher.pending()
    request_weights(tmp_path, "explorer-0", 1)
    assert watcher.pending()
    watcher.answered()
    assert not watcher.pending()  # answered: no new ask
    request_weights(tmp_path, "explorer-1", 1)  # another explorer's first ask
    assert watcher.pending()
    watcher.answered()
    request_weights(tmp_path, "explorer-0", 4)
    assert watcher.pending()


def test_dynamic_styles_stream_and_their_lead_bound_acts(caplog):
    """A dynamic style is asynchronous: partial_rollout streams in mode both and
    max_lead_steps is not warned as having no effect there."""
    from rft.config.queries import streams

    cfg = config_from_dict(config(sync_style="explorer_driven", max_lead_steps=2))
    cfg.explorer.partial_rollout = True
    assert streams(cfg)
    assert "max_lead_steps has no effect" not in caplog.text
    fixed = config_from_dict(config(sync_style="fixed"))
    fixed.explorer.partial_rollout = True
    assert not streams(fixed)
