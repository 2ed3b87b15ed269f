"""Trinity-RFT's prioritized replay buffer (experience_buffer.replay_buffer) in rft: the priority
math and queue order against hand-computed values, reuse and cooldown, the config as Trinity's
YAML writes it, and the trainer input (BufferSource) that restores it from a checkpoint cursor.

The specification, read at these commits (no code copied):
  Q = modelscope/Trinity-RFT trinity/buffer/storage/queue.py @ 110495cb30849f8a9d62d9e78b3550490540b3fa
  T = modelscope/Trinity-RFT tests/buffer/queue_test.py @ ae39f06b15f462c3f21c03f193b717b29a87cbc6
  C = agentscope-ai/Trinity-RFT trinity/common/config.py @ 1d7fae4a63f5e3a30e1927559d28a348a2167dd6
  R = modelscope/Trinity-RFT trinity/buffer/storage/__init__.py @ 5a4234ec3d38159b69ef07fb12644ab42949c8b1
  E = yanxi-chen/Trinity-RFT examples/ppo_countdown_exp_replay/countdown.yaml @ 0afd252b22032331a10e628d45efe17c11199669
"""

from __future__ import annotations

import json
import random

import pytest

from rft.buffer.experience import Experience
from rft.buffer.replay import (
    ReplayBuffer,
    ReplayItem,
    build_priority_fn,
    reused_share,
    split_groups,
)
from rft.errors import ConfigError, DataError


def group(version: int, size: int = 2, tag: str = "") -> list[Experience]:
    gid = f"g{tag}{version}"
    return [
        Experience(
            task_id=gid,
            group_id=gid,
            experience_id=f"{gid}-{k}",
            prompt_ids=[1, 2],
            response_ids=[3, 4],
            logprobs=[-0.5, -0.25],
            model_version=version,
            writer="explorer-0",
        )
        for k in range(size)
    ]


def buffer(capacity: int, cooldown: float | None, fn: str, **args) -> ReplayBuffer:
    return ReplayBuffer(capacity, cooldown, build_priority_fn(fn, args))


def step(buf: ReplayBuffer, n: int, now: float) -> list[tuple[int, int]]:
    """One batch of ``n`` experiences at time ``now``: (model_version, use_count) per group."""
    drawn = buf.draw(n, now)
    buf.settle(drawn, now)
    return [(i.model_version, i.use_count) for i in drawn]


# --- the priority functions ---------------------------------------------------------------


def test_linear_decay_is_version_minus_decay_times_use_count():
    # Q LinearDecayPriority.__call__: model_version - decay * use_count, always put back;
    # its default_config and C's ReplayBufferConfig.priority_fn_args: decay 2.0
    assert build_priority_fn("linear_decay", {})(5, 2) == (1.0, True)
    assert build_priority_fn("linear_decay", {"decay": 0.6})(4, 1) == (pytest.approx(3.4), True)
    assert build_priority_fn("linear_decay", {"decay": 0.6})(3, 0) == (3.0, True)


def test_decay_limit_randomization_limits_use_count_and_adds_noise():
    # Q LinearDecayUseCountControlPriority.__call__: put back only while use_count <
    # use_count_limit (a limit <= 0: always); default_config decay 2.0, limit 3, sigma 0.0
    fn = build_priority_fn("decay_limit_randomization", {})
    assert fn(10, 2) == (6.0, True)
    assert fn(10, 3) == (4.0, False)
    assert build_priority_fn("decay_limit_randomization", {"use_count_limit": 0})(1, 99)[1]
    noisy = build_priority_fn("decay_limit_randomization", {"sigma": 0.5}, random.Random(0))
    expected = 10.0 - 2.0 + random.Random(0).gauss(0.0, 0.5)
    assert noisy(10, 1) == (pytest.approx(expected), True)
    # R registers it as decay_limit_randomization; T and Trinity's docs use the earlier name
    alias = build_priority_fn("linear_decay_use_count_control_randomization", {"decay": 1.2})
    assert alias(4, 1) == (pytest.approx(2.8), True)


def test_unknown_or_non_numeric_priority_fn_args_are_refused():
    with pytest.raises(ConfigError, match=r"\['sigma'\] are not arguments of 'linear_decay'"):
        build_priority_fn("linear_decay", {"sigma": 1.0})
    with pytest.raises(ConfigError, match="decay must be a number"):
        build_priority_fn("linear_decay", {"decay": "fast"})


# --- the queue: order, capacity, reuse, cooldown -----------------------------------------


def test_full_queue_evicts_the_lowest_and_draws_the_highest_first():
    # T test_priority_queue_capacity: capacity 8, twelve single-experience items of versions
    # 0..11, no reuse: versions 4..11 stay (Q _put: full -> replace the lowest unless every
    # queued item is higher), drawn highest first (Q get: peekitem(-1)), each once
    buf = buffer(8, None, "linear_decay", decay=0.6)
    for v in range(12):
        assert buf.put(ReplayItem(group(v, size=1)))
    assert len(buf) == 8 and buf.counts.evicted == 4
    assert step(buf, 8, now=0.0) == [(v, 1) for v in range(11, 3, -1)]
    assert len(buf) == 0 and buf.cooling == 0
    assert step(buf, 8, now=100.0) == []  # reuse_cooldown_time None: nothing comes back


def test_a_new_group_lower_than_a_full_queue_is_not_admitted():
    # Q _put: `if lowest_priority > priority: return`; an equal priority replaces the oldest
    buf = buffer(2, None, "linear_decay")
    buf.put(ReplayItem(group(5, tag="a")))
    buf.put(ReplayItem(group(5, tag="b")))
    assert not buf.put(ReplayItem(group(4)))
    assert buf.counts.rejected == 1
    assert buf.put(ReplayItem(group(5, tag="c")))  # evicts a (the oldest of the lowest)
    assert [i.experiences[0].group_id for i in buf.draw(4, 0.0)] == ["gb5", "gc5"]


def test_reuse_with_linear_decay_follows_trinitys_sequence():
    # T test_priority_queue_buffer_reuse: capacity 4, groups of 2, decay 0.6, cooldown 0.5 s,
    # batches of 4 one second apart; versions 0..4 written (4 evicts 0). The comments are T's
    # table after each batch (priority = version - 0.6 * use_count, Q LinearDecayPriority).
    buf = buffer(4, 0.5, "linear_decay", decay=0.6)
    for v in range(5):
        buf.put(ReplayItem(group(v)))
    assert step(buf, 4, 0.0) == [(4, 1), (3, 1)]  # then 3.4 2.4 2.0 1.0
    assert step(buf, 4, 1.0) == [(4, 2), (3, 2)]  # then 2.8 1.8 2.0 1.0
    assert step(buf, 4, 2.0) == [(4, 3), (2, 1)]  # then 2.2 1.8 1.4 1.0
    assert step(buf, 4, 3.0) == [(4, 4), (3, 3)]  # then 1.6 1.2 1.4 1.0
    assert step(buf, 4, 4.0) == [(4, 5), (2, 2)]  # then 1.0 1.2 0.8 1.0
    # 1.2 first; then the tie at 1.0: version 1 queued before version 4 came back (FIFO)
    assert step(buf, 4, 5.0) == [(3, 4), (1, 1)]


def test_use_count_limit_retires_groups():
    # T test_priority_queue_reuse_count_control: decay 1.2, use_count_limit 2, sigma 0
    buf = buffer(4, 0.5, "linear_decay_use_count_control_randomization", decay=1.2,
                 use_count_limit=2, sigma=0.0)  # fmt: skip
    for v in range(5):
        buf.put(ReplayItem(group(v)))
    assert step(buf, 4, 0.0) == [(4, 1), (3, 1)]  # then 2.8 1.8 2.0 1.0, all queued
    buf.refill(1.0)
    assert len(buf) == 4
    assert step(buf, 4, 1.0) == [(4, 2), (2, 1)]  # version 4 reached the limit: retired
    buf.refill(2.0)
    assert len(buf) == 3 and buf.counts.retired == 1
    assert step(buf, 4, 2.0) == [(3, 2), (1, 1)]  # 1.8, 1.0; version 3 retired
    buf.refill(3.0)
    assert len(buf) == 2 and buf.counts.retired == 2


def test_a_group_comes_back_only_after_its_cooldown_and_never_twice_in_a_batch():
    buf = buffer(10, 30.0, "linear_decay")
    buf.put(ReplayItem(group(3)))
    assert step(buf, 8, 100.0) == [(3, 1)]  # one group, even with room for four
    assert step(buf, 8, 129.9) == [] and buf.cooling == 1
    assert step(buf, 8, 130.0) == [(3, 2)]
    buf.close(140.0)  # the input ended: no more reuse, cooling groups dropped (Trinity's close)
    assert buf.cooling == 0 and step(buf, 8, 1e9) == []


def test_zero_cooldown_reuses_at_the_next_batch():
    buf = buffer(10, 0.0, "linear_decay", decay=1.0)
    buf.put(ReplayItem(group(5)))
    assert [step(buf, 2, t) for t in (0.0, 0.0, 0.0)] == [[(5, 1)], [(5, 2)], [(5, 3)]]


def test_groups_are_drawn_whole_in_priority_order():
    buf = buffer(10, None, "linear_decay")
    buf.put(ReplayItem(group(9, size=4)))
    buf.put(ReplayItem(group(8, size=2)))
    assert step(buf, 5, 0.0) == [(9, 1)]  # version 8 would not fit: it waits for the next
    assert step(buf, 5, 0.0) == [(8, 1)]
    buf.put(ReplayItem(group(7, size=4)))
    with pytest.raises(DataError, match="has 4 experiences but the read asked for at most 3"):
        buf.draw(3, 0.0)


def test_stale_groups_are_dropped_when_drawn():
    buf = buffer(10, 0.0, "linear_decay", decay=0.0)
    buf.put(ReplayItem(group(2)))
    buf.put(ReplayItem(group(6)))
    assert [i.model_version for i in buf.draw(4, 0.0, min_version=4)] == [6]
    assert buf.counts.stale == 1


def test_reused_share_counts_experiences_drawn_before():
    buf = buffer(10, 0.0, "linear_decay", decay=10.0)
    buf.put(ReplayItem(group(1)))
    buf.settle(buf.draw(2, 0.0), 0.0)
    buf.put(ReplayItem(group(0)))  # priority 0 > 1 - 10 * 1
    drawn = buf.draw(4, 0.0)
    assert [(i.model_version, i.use_count) for i in drawn] == [(0, 1), (1, 2)]
    assert reused_share(drawn) == 0.5


def test_state_round_trips_through_json_with_the_same_order():
    buf = buffer(4, 10.0, "decay_limit_randomization", sigma=0.3)
    items = [ReplayItem(group(v), ("explorer-0", v, f"g{v}")) for v in range(4)]
    for item in items:
        buf.put(item)
    buf.settle(buf.draw(2, 50.0), 50.0)
    state = json.loads(json.dumps(buf.state()))
    assert len(state["queued"]) == 3 and len(state["cooling"]) == 1
    assert state["cooling"][0]["ready_at"] == 60.0
    groups = {i.ref: i.experiences for i in items}
    again = buffer(4, 10.0, "decay_limit_randomization", sigma=0.3)
    assert again.restore(state, groups) == 0
    assert again.refs() == buf.refs()
    # the queued groups keep their saved (noisy) priorities and order; noise is not redrawn
    assert [(i.ref, i.use_count, i.priority) for i in again.draw(8, 55.0)] == [
        (i.ref, i.use_count, i.priority) for i in buf.draw(8, 55.0)
    ]
    assert again.cooling == buf.cooling == 1
    lost = buffer(4, 10.0, "linear_decay")
    assert lost.restore(state, {k: v for k, v in groups.items() if k[1] != 0}) == 1


def test_split_groups_by_writer_and_group_id():
    a, b = group(1), group(2)
    assert [len(g) for g in split_groups(a + b + group(1, tag="x"))] == [2, 2, 2]


# --- the config, as Trinity's YAML writes it ----------------------------------------------


def trinity_dict(tmp_path, mode: str = "train", **experience_buffer) -> dict:
    return {
        "project": "t",
        "name": "replay",
        "mode": mode,
        "checkpoint_root_dir": str(tmp_path),
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 2},
        "model": {"model_path": str(tmp_path / "model")},
        "buffer": {
            "batch_size": 2,
            "train_batch_size": 4,
            "explorer_input": {"taskset": {"path": "unused"}},
            "trainer_input": {
                "experience_buffer": {"name": "exp", "storage_type": "queue", **experience_buffer}
            },
        },
        "synchronizer": {"sync_timeout": 2},
    }


def test_trinity_replay_buffer_yaml_loads(tmp_path):
    from rft.config.load import config_from_dict

    # E's trainer_input (priority_fn_args left to the defaults), plus capacity
    cfg = config_from_dict(
        trinity_dict(
            tmp_path,
            capacity=64,
            replay_buffer={
                "enable": True,
                "reuse_cooldown_time": 40,
                "priority_fn": "decay_limit_randomization",
            },
        )
    )
    buf = cfg.buffer.trainer_input.experience_buffer
    assert buf.capacity == 64
    rb = buf.replay_buffer
    assert (rb.enable, rb.reuse_cooldown_time, rb.priority_fn) == (
        True,
        40.0,
        "decay_limit_randomization",
    )
    assert rb.priority_fn_args == {"decay": 2.0}  # C's default, merged over Q's default_config
    # C's defaults, as Trinity's own dumped configs spell them out
    cfg = config_from_dict(
        trinity_dict(
            tmp_path,
            replay_buffer={
                "enable": False,
                "priority_fn": "linear_decay",
                "reuse_cooldown_time": None,
                "priority_fn_args": {"decay": 2.0},
            },
        )
    )
    rb = cfg.buffer.trainer_input.experience_buffer.replay_buffer
    assert (
        rb.enable,
        rb.reuse_cooldown_time,
        cfg.buffer.trainer_input.experience_buffer.capacity,
    ) == (
        False,
        None,
        10000,
    )


def test_replay_config_errors_name_the_fix(tmp_path):
    from rft.config.load import config_from_dict

    with pytest.raises(ConfigError, match="linear_decay"):
        config_from_dict(trinity_dict(tmp_path, replay_buffer={"priority_fn": "linear_decy"}))
    with pytest.raises(ConfigError, match="needs storage_type: queue"):
        config_from_dict(
            trinity_dict(
                tmp_path,
                storage_type="sql",
                path="sqlite:///b.db",
                replay_buffer={"enable": True},
            )
        )


# --- the trainer's input: reuse across steps and across a restart -------------------------


def _source(tmp_path, cursor=None, mode="train", **replay_buffer):
    from rft.config.load import config_from_dict
    from rft.trainer.inputs import BufferSource

    rb = {"enable": True, "reuse_cooldown_time": 0.0, "priority_fn_args": {"decay": 1.0}}
    cfg = config_from_dict(
        trinity_dict(tmp_path, mode, capacity=8, replay_buffer={**rb, **replay_buffer})
    )
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    (cfg.run_dir / "buffer").mkdir(exist_ok=True)
    return cfg, BufferSource(cfg, cfg.run_dir, cursor)


def _write(cfg, seq: int, *versions: int) -> None:
    from rft.buffer.segments import SegmentWriter

    writer = SegmentWriter(cfg.run_dir / "buffer", "explorer-0")
    writer.write([e for v in versions for e in group(v, tag=f"s{seq}")], seq=seq)


def versions_of(batch: list[Experience]) -> list[int]:
    return [e.model_version for e in batch[::2]]


def test_buffer_source_reuses_groups_and_restores_them_after_a_restart(tmp_path):
    from rft.buffer.replay import REUSED_SHARE

    cfg, source = _source(tmp_path)
    _write(cfg, 0, 1, 2)
    assert versions_of(source.next_batch(1, 2)) == [2, 1]  # both new
    assert source.stats()[REUSED_SHARE] == 0.0
    _write(cfg, 1, 3)
    # priorities: new 3 -> 3.0; reused 2 -> 1.0, 1 -> 0.0
    assert versions_of(source.next_batch(2, 3)) == [3, 2]
    assert source.stats()[REUSED_SHARE] == 0.5
    cursor = json.loads(json.dumps(source.cursor()))  # as the checkpoint keeps it
    assert len(cursor["replay"]["queued"]) == 1 and len(cursor["replay"]["cooling"]) == 2
    source.release(cursor)  # segment 0 holds groups still queued: kept
    assert (cfg.run_dir / "buffer" / "explorer-0" / "seg-000000.jsonl").is_file()

    _, resumed = _source(tmp_path, cursor)  # a restarted trainer
    expected = source.next_batch(3, 3)
    batch = resumed.next_batch(3, 3)
    # 3 -> 2.0 back from cooling; the tie at 0.0: 1 (queued) before 2 (back from cooling)
    assert versions_of(batch) == versions_of(expected) == [3, 1]
    assert [e.experience_id for e in batch] == [e.experience_id for e in expected]
    assert resumed.stats()["replay/restored_missing"] == 0


def test_buffer_source_without_reuse_uses_each_group_once_then_ends(tmp_path):
    from rft.sync.heartbeat import Heartbeat

    cfg, source = _source(tmp_path, reuse_cooldown_time=None)
    _write(cfg, 0, 1, 2, 3)
    Heartbeat(cfg.run_dir, "explorer-0").beat(finished=True)
    assert versions_of(source.next_batch(1, 3)) == [3, 2]
    assert versions_of(source.next_batch(2, 3)) == [1]  # the last, partial batch
    assert source.next_batch(3, 3) is None


def test_finished_explorers_close_the_replay_buffer(tmp_path):
    """Trinity's close: once every explorer finished and the buffer is drained, groups are no
    longer put back, so a run without total_steps ends."""
    from rft.sync.heartbeat import Heartbeat

    cfg, source = _source(tmp_path)
    _write(cfg, 0, 1, 2)
    assert versions_of(source.next_batch(1, 2)) == [2, 1]
    Heartbeat(cfg.run_dir, "explorer-0").beat(finished=True)
    assert versions_of(source.next_batch(2, 2)) == [2, 1]  # already queued again: drained
    assert source.next_batch(3, 2) is None


def test_mode_both_an_empty_step_is_skipped_not_the_end(tmp_path):
    """mode both with the replay buffer: a step whose segment holds nothing (every episode
    failed) gives an empty batch, which the trainer skips, never None (the end of the run)."""
    cfg, source = _source(tmp_path, mode="both", reuse_cooldown_time=None)
    _write(cfg, 1)  # step 1's segment, sealed and empty
    assert source.next_batch(1, 0) == []
    _write(cfg, 2, 1)
    assert versions_of(source.next_batch(2, 1)) == [1]
