"""Trinity's DAPO experience operators (``data_processor.experience_pipeline``) in rft: the pure
operators on hand-made groups, their config (typed arguments, refusals by name), and the
trainer's buffer read that applies them (refilling in mode train, not in mode both)."""

from __future__ import annotations

import pytest

from rft.buffer.experience import Experience
from rft.config.load import load_config
from rft.config.schema import DynamicSamplingArgs, RewardThresholdArgs
from rft.errors import ConfigError, NotSupportedError
from rft.trainer.batching import rows_from_experiences
from rft.trainer.experience_ops import (
    DROPPED_ALL_CORRECT,
    DROPPED_ALL_WRONG,
    DROPPED_GROUPS,
    EXPERIENCE_COUNT,
    FILTERED,
    MASKED_TRUNCATED,
    ExperiencePipeline,
    dapo_dynamic_sampling,
    invalid_reward_filter,
    mask_response_truncated,
    reward_filter,
    reward_std_filter,
)
from tests.helpers.trainer_runs import write_config

DAPO_OPS = [{"name": "mask_response_truncated"}, {"name": "dapo_dynamic_sampling"}]


def group(gid: str, accuracies, truncated=(), parts: bool = True) -> list[Experience]:
    """One task's responses: response i has 2 + i tokens, accuracy ``accuracies[i]`` (a reward
    part when ``parts``) and reward 2 * accuracy - 1 (DAPO's +1 / -1)."""
    return [
        Experience(
            task_id=gid,
            group_id=gid,
            prompt_ids=[1, 2, 3],
            response_ids=[7] * (2 + i),
            logprobs=[-1.0] * (2 + i),
            reward=2.0 * acc - 1.0,
            reward_parts={"accuracy": float(acc)} if parts else {},
            truncated=i in truncated,
        )
        for i, acc in enumerate(accuracies)
    ]


def groups_of(exps: list[Experience]) -> list[str]:
    return list(dict.fromkeys(e.group_id for e in exps))


# ----------------------------------------------------------------------------- pure operators


def test_dynamic_sampling_keeps_only_groups_with_some_right_answers():
    exps = [
        *group("all_right", [1, 1]),
        *group("mixed", [1, 0, 0]),
        *group("all_wrong", [0, 0, 0]),
        *group("alone", [1]),  # a group of one has no spread: dropped, counted as filtered only
        *group("mixed_too", [0, 1]),
    ]
    kept, counts = dapo_dynamic_sampling(exps, DynamicSamplingArgs())
    assert groups_of(kept) == ["mixed", "mixed_too"] and len(kept) == 5
    assert counts == {
        FILTERED: 2 + 3 + 1,
        DROPPED_ALL_CORRECT: 2,
        DROPPED_ALL_WRONG: 3,
        DROPPED_GROUPS: 3,
    }


def test_dynamic_sampling_judges_by_the_metric_part_else_the_reward():
    # no accuracy part: the total reward decides (1 > 0 right, -1 wrong)
    by_reward = [*group("mixed", [1, 0], parts=False), *group("wrong", [0, 0], parts=False)]
    kept, _ = dapo_dynamic_sampling(by_reward, DynamicSamplingArgs())
    assert groups_of(kept) == ["mixed"]
    # accuracy 0.4 and 0.6: both right above 0, one right above 0.5
    shaped = group("g", [0.4, 0.6])
    assert dapo_dynamic_sampling(shaped, DynamicSamplingArgs())[0] == []
    assert dapo_dynamic_sampling(shaped, DynamicSamplingArgs(correct_threshold=0.5))[0] == shaped
    # another part named: format_score is absent, so the reward (2 * 0.4 - 1 < 0) decides
    assert dapo_dynamic_sampling(shaped, DynamicSamplingArgs(metric_key="format_score"))[0] == (
        shaped
    )


def test_truncated_responses_get_a_zero_loss_mask_and_stay_in_their_group():
    exps = group("g", [1, 0, 0], truncated=(1,))
    exps[2].action_mask = [1, 0, 1, 1]  # multi-turn: a tool's token in the middle
    out, counts = mask_response_truncated(exps)
    assert out is exps and counts == {MASKED_TRUNCATED: 1}
    assert exps[1].action_mask == [0, 0, 0]  # 3 response tokens
    assert exps[0].action_mask == [] and exps[2].action_mask == [1, 0, 1, 1]
    rows = rows_from_experiences(exps)  # what the trainer's loss mask becomes
    assert rows.response_mask.sum(-1).tolist() == [2.0, 0.0, 3.0]
    assert rows.rewards.tolist() == [1.0, -1.0, -1.0]  # the baseline still sees its reward


def test_pipeline_applies_operators_in_order_and_sums_a_step():
    from rft.config.schema import ExperiencePipelineConfig, OperatorConfig

    cfg = ExperiencePipelineConfig(operators=[OperatorConfig(**op) for op in DAPO_OPS])
    pipeline = ExperiencePipeline.from_config(cfg)
    evaluation = group("eval", [1, 0])
    for e in evaluation:
        e.eval = True
    first = pipeline.apply([*group("a", [1, 0], truncated=(0,)), *group("b", [1, 1]), *evaluation])
    second = pipeline.apply(group("c", [0, 0], truncated=(0, 1)))
    assert groups_of(first) == ["a"] and second == []
    assert pipeline.counts == {
        MASKED_TRUNCATED: 3,  # truncated ones are masked before dynamic sampling drops "c"
        FILTERED: 4,
        DROPPED_ALL_CORRECT: 2,
        DROPPED_ALL_WRONG: 2,
        DROPPED_GROUPS: 2,
        EXPERIENCE_COUNT: 2,
    }
    pipeline.start_step()
    assert pipeline.counts == {}
    untouched = group("x", [1, 1])  # no operators: only the evaluation samples leave
    assert ExperiencePipeline.from_config(None).apply([*untouched, *evaluation]) == untouched


# ----------------------------------------------------------------------------- config


def _load(tmp_path, operators=DAPO_OPS, **sections):
    data_processor = sections.pop(
        "data_processor", {"experience_pipeline": {"operators": operators}}
    )
    return load_config(
        write_config(tmp_path, "ops", tmp_path, data_processor=data_processor, **sections)
    )


def test_reward_filters_follow_trinitys():
    # rewards 2 * accuracy - 1: all_right (1, 1), mixed (1, -1, -1), alone (1,)
    exps = [*group("all_right", [1, 1]), *group("mixed", [1, 0, 0]), *group("alone", [1])]
    kept, counts = reward_filter(list(exps), RewardThresholdArgs(0.0))  # reward >= 0
    assert [e.reward for e in kept] == [1.0, 1.0, 1.0, 1.0] and counts == {FILTERED: 2}
    kept, counts = reward_std_filter(list(exps), RewardThresholdArgs(0.0))
    assert groups_of(kept) == ["mixed"] and counts == {FILTERED: 3, DROPPED_GROUPS: 2}
    # mixed's population std is sqrt(8/9) = 0.943: a threshold above it drops the group too
    assert reward_std_filter(list(exps), RewardThresholdArgs(0.95))[0] == []
    assert groups_of(reward_std_filter(list(exps), RewardThresholdArgs(0.94))[0]) == ["mixed"]
    nan = group("nan", [1, 1])
    nan[1].reward = float("nan")  # what a custom reader could let through
    kept, counts = invalid_reward_filter(nan)
    assert kept == nan[:1] and counts == {FILTERED: 1}


def test_operators_and_their_arguments_load_typed(tmp_path):
    ops = [*DAPO_OPS[:1], {"name": "dapo_dynamic_sampling", "args": {"correct_threshold": "0.5"}}]
    cfg = _load(tmp_path, ops)
    pipeline = cfg.data_processor.experience_pipeline
    assert [op.name for op in pipeline.operators] == ["mask_response_truncated", "dapo_dynamic_sampling"]  # fmt: skip
    assert pipeline.operators[1].typed_args() == DynamicSamplingArgs("accuracy", 0.5)
    assert pipeline.save_input is True  # Trinity's default; no effect here
    cfg = _load(tmp_path, [{"name": "reward_std_filter", "args": {"threshold": 0.1}}])
    [op] = cfg.data_processor.experience_pipeline.operators
    assert op.typed_args() == RewardThresholdArgs(0.1)


@pytest.mark.parametrize(
    "ops,error,message",
    [
        (
            [{"name": "reward_shaping_mapper"}],
            NotSupportedError,
            "Trinity's `data_processor.experience_pipeline.operators[0].name: "
            "reward_shaping_mapper` is not supported by rft: ",
        ),
        (
            [{"name": "dapo_dynamic_samplng"}],
            ConfigError,
            "Did you mean 'dapo_dynamic_sampling'?",
        ),
        (
            [{"name": "dapo_dynamic_sampling", "args": {"metric_kye": "accuracy"}}],
            ConfigError,
            "unknown config key 'data_processor.experience_pipeline.operators[0].args.metric_kye'"
            ". Did you mean 'data_processor.experience_pipeline.operators[0].args.metric_key'?",
        ),
        (
            [{"name": "mask_response_truncated", "args": {"threshold": 1}}],
            ConfigError,
            "unknown config key 'data_processor.experience_pipeline.operators[0].args.threshold'",
        ),
        ([{"args": {}}], ConfigError, "operators[0].name is missing: name one of "),
    ],
)
def test_operator_mistakes_are_refused_with_the_key(tmp_path, ops, error, message):
    with pytest.raises(error) as e:
        _load(tmp_path, ops)
    assert message in str(e.value)


@pytest.mark.parametrize(
    "sections,name",
    [
        (
            {"data_processor": {"task_pipeline": {"operators": []}}},
            "data_processor.task_pipeline",
        ),
        (
            {"data_processor": {"experience_pipeline": {"input_save_path": "x.jsonl"}}},
            "data_processor.experience_pipeline.input_save_path",
        ),
        ({"mode": "explore"}, "data_processor.experience_pipeline.operators in mode explore"),
    ],
)
def test_trinity_pipeline_keys_rft_lacks_are_refused_by_name(tmp_path, sections, name):
    with pytest.raises(NotSupportedError, match=f"Trinity's `{name}` is not supported by rft: "):
        _load(tmp_path, **sections)


# ----------------------------------------------------------------------------- the trainer's read


def _write(cfg, *segments: list[Experience]) -> None:
    from rft.buffer.segments import SegmentWriter

    writer = SegmentWriter(cfg.run_dir / "buffer", "explorer-0")
    for seq, exps in enumerate(segments, start=1):
        writer.write(exps, seq=seq)


def test_mode_train_reads_more_groups_until_the_batch_is_full(tmp_path):
    """train_batch_size 4 = two kept groups of 2: the reader reads on past dropped groups."""
    from rft.sync.heartbeat import Heartbeat
    from rft.trainer.inputs import BufferSource

    cfg = _load(tmp_path, mode="train", buffer={"batch_size": 4, "train_batch_size": 4})
    _write(
        cfg,
        [*group("right", [1, 1]), *group("mixed1", [1, 0], truncated=(1,))],
        [*group("wrong", [0, 0]), *group("mixed2", [0, 1]), *group("mixed3", [1, 0])],
    )
    Heartbeat(cfg.run_dir, "explorer-0").beat(finished=True)
    source = BufferSource(cfg, cfg.run_dir, None)
    batch = source.next_batch(1, 0)
    assert groups_of(batch) == ["mixed1", "mixed2"]
    assert [e.action_mask for e in batch] == [[], [0, 0, 0], [], []]
    stats = source.stats()
    assert (stats[FILTERED], stats[DROPPED_GROUPS], stats[MASKED_TRUNCATED]) == (4, 2, 1)
    assert stats["experiences_read"] == 8  # what the reader consumed, dropped groups included
    rest = source.next_batch(2, 0)  # the last, partial batch; the counts are this step's
    assert groups_of(rest) == ["mixed3"] and source.stats()[FILTERED] == 0


def test_mode_both_trains_the_step_on_the_groups_kept(tmp_path, caplog):
    """Lockstep: a step reads its own segments only, so dropped groups leave it smaller (the
    config's load says so)."""
    from rft.trainer.inputs import BufferSource

    cfg = _load(tmp_path, buffer={"batch_size": 3, "train_batch_size": 6})
    assert "dapo_dynamic_sampling in mode both" in caplog.text and "no refill" in caplog.text
    _write(cfg, [*group("right", [1, 1]), *group("mixed", [1, 0]), *group("wrong", [0, 0])])
    source = BufferSource(cfg, cfg.run_dir, None)
    assert groups_of(source.next_batch(1, 0)) == ["mixed"]
    assert source.stats()[DROPPED_ALL_CORRECT] == source.stats()[DROPPED_ALL_WRONG] == 2


# ----------------------------------------------------------------------------- the advantage's skip


def test_std_threshold_drops_groups_as_trinitys_grpo_and_duplicates_kept_ones():
    import random

    from rft.trainer.experience_ops import DUPLICATED_GROUPS, std_threshold_filter

    # rewards 2 * accuracy - 1: mixed (1, -1) std 1.41; flat (-1, -1) std 0; alone (1,)
    exps = [*group("mixed", [1, 0]), *group("flat", [0, 0]), *group("alone", [1])]
    kept, counts = std_threshold_filter(list(exps), threshold=0.0, by_run=False, duplicate=False)
    assert groups_of(kept) == ["mixed"] and counts == {FILTERED: 3, DROPPED_GROUPS: 2}
    # a threshold above the mixed group's std drops it too: nothing is left, nothing duplicated
    kept, counts = std_threshold_filter(list(exps), threshold=1.5, by_run=False, duplicate=True)
    assert kept == [] and counts == {FILTERED: 5, DROPPED_GROUPS: 3}
    # duplicate_experiences: each dropped group's place goes to a copy of a kept one, a group of
    # its own with a new experience id, so the step keeps 3 groups
    kept, counts = std_threshold_filter(
        list(exps), threshold=0.0, by_run=False, duplicate=True, rng=random.Random(0)
    )
    assert groups_of(kept) == ["mixed", "mixed#dup0", "mixed#dup1"]
    assert counts[DUPLICATED_GROUPS] == 2 and counts[FILTERED] == 3
    assert [e.reward for e in kept] == [1.0, -1.0] * 3
    assert len({e.experience_id for e in kept}) == 6 and exps[0].group_id == "mixed"


def test_step_wise_std_threshold_compares_runs_by_their_last_step():
    from rft.buffer.experience import ENV_STEP_KEY, RUN_KEY
    from rft.trainer.experience_ops import std_threshold_filter

    def steps(gid, runs):  # runs: per run, the rewards of its steps in order
        out = []
        for run, rewards in enumerate(runs):
            for step, reward in enumerate(rewards):
                exp = group(gid, [1])[0]
                exp.reward, exp.info = reward, {RUN_KEY: run, ENV_STEP_KEY: step}
                out.append(exp)
        return out

    # "differ": last steps 1 and 0 (kept); "same_last": earlier steps differ, last steps both
    # 1 (dropped: std 0); "one_run": a single run of three steps (dropped)
    exps = [*steps("differ", [[0, 1], [0]]), *steps("same_last", [[0, 1], [1]]),
            *steps("one_run", [[0, 0, 1]])]  # fmt: skip
    kept, counts = std_threshold_filter(exps, threshold=0.0, by_run=True, duplicate=False)
    assert groups_of(kept) == ["differ"] and len(kept) == 3
    assert counts == {FILTERED: 6, DROPPED_GROUPS: 2}


def test_the_advantage_skip_runs_after_the_configured_operators(tmp_path, caplog):
    from rft.trainer.inputs import BufferSource

    cfg = _load(
        tmp_path,
        [{"name": "mask_response_truncated"}],
        buffer={"batch_size": 3, "train_batch_size": 6},
        algorithm={"algorithm_type": "grpo", "advantage_fn_args": {"std_threshold": 0.0}},
    )
    assert "std_threshold (grpo) in mode both" in caplog.text and "no refill" in caplog.text
    assert len(ExperiencePipeline.from_config(None, cfg.algorithm).operators) == 1
    assert ExperiencePipeline.from_config(None, None).operators == []
    _write(cfg, [*group("right", [1, 1]), *group("mixed", [1, 0]), *group("wrong", [0, 0])])
    source = BufferSource(cfg, cfg.run_dir, None)
    assert groups_of(source.next_batch(1, 0)) == ["mixed"]
    assert source.stats()[FILTERED] == 4 and source.stats()[DROPPED_GROUPS] == 2


def test_rank_penalty_reads_each_rows_mean_rollout_logprob(tmp_path):
    from rft.errors import DataError
    from rft.trainer.algorithm import build_loss_fns
    from rft.trainer.step import mean_rollout_logprobs

    cfg = _load(
        tmp_path,
        algorithm={"algorithm_type": "grpo", "advantage_fn_args": {"rank_penalty": 0.5}},
    )
    assert build_loss_fns(cfg.algorithm).advantage_by_logprobs
    exps = group("g", [1, 0])  # response i: 2 + i tokens, each log-prob -1
    exps[1].logprobs = [-0.5, -1.0, -3.0]
    rows = rows_from_experiences(exps)
    assert mean_rollout_logprobs(rows, [0, 1]).tolist() == pytest.approx([-1.0, -1.5])
    exps[1].action_mask = [1, 0, 1]  # a tool's token in the middle: still a response position
    exps[1].logprobs = [-1.0, 0.0, -2.0]
    assert mean_rollout_logprobs(rows_from_experiences(exps), [1]).tolist() == pytest.approx([-1.0])
    exps[0].logprobs = []  # a workflow that recorded none
    with pytest.raises(DataError, match="unset rank_penalty or record them"):
        mean_rollout_logprobs(rows_from_experiences(exps), [0, 1])
    bad = _load(tmp_path, algorithm={"advantage_fn_args": {"std_cal_level": "none"}})
    with pytest.raises(ConfigError, match="std_cal_level: got 'none', expected one of"):
        build_loss_fns(bad.algorithm)  # as rft-run --dry-run does
