"""CHORD mixing tests (``sample_strategy: mix``). Unmarked: per-step counts and config errors,
the batch a :class:`~rft.trainer.mix.MixSource` serves (rollouts + expert rows, epochs, cursor,
resume), single-source micro-batches whose scaled losses add up to ``mix_chord`` of the whole
batch, metric reduction, advantages. ``integration``: a 2-step single-process DeepSpeed run
on the tiny model (mu follows its schedule, expert loss present) resumed for a third step."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from rft.algo import losses
from rft.algo.losses import chord_mu
from rft.buffer.experience import Experience
from rft.buffer.segments import SegmentWriter
from rft.config.batches import mini_batches_per_step, updates_per_step
from rft.config.load import load_config
from rft.config.mix import expert_buffer, expert_samples_per_step, mix_counts
from rft.errors import ConfigError
from rft.monitor import POLICY_LOSS, STALENESS_MEAN
from rft.trainer.batching import (
    MetricSums,
    collate,
    micro_loss_scale,
    micro_source,
    plan_micro_batches,
    rows_from_experiences,
    source_fractions,
    source_totals,
    split_by_source,
    split_for_ranks,
)
from rft.trainer.mix import MixSource, split_cursor
from tests.helpers.synthetic import rollout_groups

REPO = Path(__file__).resolve().parent.parent
CPU_CHORD = REPO / "configs" / "cpu" / "chord.yaml"
EXPERT_QUESTIONS = [f"What is {a} + {a}?" for a in (1, 2, 3)]


def chord_cfg(*overrides: str):
    return load_config(CPU_CHORD, list(overrides))


def rollouts(step: int, groups: int = 2, repeat: int = 2) -> list[Experience]:
    """``groups`` groups of ``repeat`` rollouts (rewards 0..repeat-1, logprobs -1)."""
    return rollout_groups(step, groups, repeat, seed=step, prompt_tokens=4)


def write_expert_data(path: Path) -> Path:
    rows = [
        {
            "messages": [
                {"role": "user", "content": q},
                {"role": "assistant", "content": f"{q[8:-1]} = {2 * int(q.split()[2])}"},
            ]
        }
        for q in EXPERT_QUESTIONS
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_segments(run_dir: Path, steps) -> None:
    writer = SegmentWriter(run_dir / "buffer", "explorer-0")
    for step in steps:
        writer.write(rollouts(step), seq=step)


# ----------------------------------------------------------------------------- counts, config


def test_counts_of_the_shipped_configs():
    assert mix_counts(chord_cfg()).rollout == 4 and mix_counts(chord_cfg()).expert == 2
    gpu = mix_counts(load_config(REPO / "configs" / "chord.yaml"))
    assert (gpu.rollout, gpu.expert, gpu.total) == (256, 64, 320)
    # Trinity's MixSampleStrategy: expert_batch_size = ceil(expert_data_ratio * tot_batch_size)
    # (agentscope-ai/Trinity-RFT trinity/algorithm/sample_strategy/mix_sample_strategy.py)
    assert [expert_samples_per_step(n, 0.25) for n in (6, 10, 12)] == [2, 3, 3]
    assert expert_samples_per_step(10, 0.21) == 3  # rounding would give 2
    assert expert_samples_per_step(864, 0.11) == 96  # mix_chord_toolace: 768 rollouts = 96 x 8


def test_mode_both_splits_the_explorers_step_into_mini_batches():
    from rft.config.batches import check_train_batch_size

    with pytest.raises(ConfigError) as e:  # 2 expert + 6 rollouts, the explorer's step has 4
        check_train_batch_size(chord_cfg("buffer.train_batch_size=8"))
    assert (
        "(its rollout part: 6 rollouts per update) exceeds a step's batch_size x repeat_times "
        "= 2 x 2 = 4 rollouts" in str(e.value)
    )
    gpu = load_config(
        REPO / "configs" / "chord.yaml",
        ["algorithm.sample_strategy_args={expert_data_ratio: 0.25}"],
    )
    counts = mix_counts(gpu)
    assert (counts.rollout, counts.expert) == (240, 80)  # 30 of the step's 32 groups per update
    assert mini_batches_per_step(gpu) == 2 and updates_per_step(gpu) == 2
    mix_counts(chord_cfg("buffer.train_batch_size=8", "mode=train"))  # async: 6 rollouts is fine


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["algorithm.sample_strategy_args={expert_data_ratio: 1.0}"], r"in \(0, 1\)"),
        (
            ["algorithm.sample_strategy_args={expert_ratio: 0.2}"],
            "Did you mean 'expert_data_ratio'",
        ),
        (
            [
                "mode=train",
                "buffer.train_batch_size=8",
                "algorithm.sample_strategy_args={expert_data_ratio: 0.3}",
            ],
            "leaves 5 rollouts per step, not a positive multiple",
        ),
        (["algorithm.policy_loss_fn=ppo"], "only policy_loss_fn 'mix_chord'"),
    ],
)
def test_config_errors_name_what_to_change(overrides, match):
    with pytest.raises(ConfigError, match=match):
        mix_counts(chord_cfg(*overrides))


def test_one_expert_dataset(tmp_path):
    cfg = chord_cfg()
    cfg.buffer.trainer_input.auxiliary_buffers["other"] = (
        cfg.buffer.trainer_input.auxiliary_buffers["sft_dataset"]
    )
    with pytest.raises(ConfigError, match="exactly one"):
        mix_counts(cfg)


# ----------------------------------------------------------------------------- batch composition


@pytest.fixture
def mix_setup(tmp_path, smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    data = write_expert_data(tmp_path / "expert.jsonl")
    cfg = chord_cfg(
        f"buffer.trainer_input.auxiliary_buffers.sft_dataset.path={data}",
        f"checkpoint_root_dir={tmp_path}",
        "synchronizer.sync_timeout=5",
    )
    run_dir = cfg.run_dir
    write_segments(run_dir, [1, 2, 3])
    return cfg, run_dir, AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)


def expert_questions(tokenizer, batch: list[Experience]) -> list[str]:
    return [
        next(q for q in EXPERT_QUESTIONS if q in tokenizer.decode(e.prompt_ids))
        for e in batch
        if e.source == "expert"
    ]


def test_each_step_is_the_explorers_rollouts_then_expert_rows_cycling(mix_setup):
    cfg, run_dir, tok = mix_setup
    source = MixSource(cfg, run_dir, None, tokenizer=tok)
    first = source.next_batch(1, 0)
    assert [e.source for e in first] == ["rollout"] * 4 + ["expert"] * 2
    assert [e.response_ids for e in first[:4]] == [e.response_ids for e in rollouts(1)]
    for e in first[4:]:
        assert e.logprobs == [] and e.reward == 0.0 and e.response_ids
    second = source.next_batch(2, 0)
    assert expert_questions(tok, first) == EXPERT_QUESTIONS[:2]
    assert expert_questions(tok, second) == [EXPERT_QUESTIONS[2], EXPERT_QUESTIONS[0]]  # next epoch
    cursor = source.cursor()
    assert cursor["expert"] == {"row": 4} and cursor["segments"]["explorer-0"]["seq"] == 3
    assert split_cursor(cursor) == ({"segments": cursor["segments"]}, {"row": 4})
    assert source.stats()["expert_rows_served"] == 4


def test_the_expert_datas_total_epochs_ends_the_input(mix_setup, caplog):
    """auxiliary_buffers.<name>.total_epochs: that many passes over the expert rows, then the
    trainer's input ends (Trinity's trainer stops when an auxiliary buffer runs out)."""
    cfg, run_dir, tok = mix_setup
    expert_buffer(cfg).total_epochs = 1  # 3 rows, 2 per step
    source = MixSource(cfg, run_dir, None, tokenizer=tok)
    assert expert_questions(tok, source.next_batch(1, 0)) == EXPERT_QUESTIONS[:2]
    assert source.next_batch(2, 0) is None  # 1 row left, a step takes 2
    assert "the expert data is used up (2 rows served of 1 passes" in caplog.text


def test_resume_from_a_cursor_serves_what_an_uninterrupted_source_would(mix_setup):
    cfg, run_dir, tok = mix_setup
    whole = MixSource(cfg, run_dir, None, tokenizer=tok)
    whole.next_batch(1, 0)
    saved = whole.cursor()
    expected = whole.next_batch(2, 0)
    resumed = MixSource(cfg, run_dir, json.loads(json.dumps(saved)), tokenizer=tok)
    got = resumed.next_batch(2, 0)
    assert [(e.prompt_ids, e.response_ids, e.source) for e in got] == [
        (e.prompt_ids, e.response_ids, e.source) for e in expected
    ]
    resumed.release(resumed.cursor())  # the expert key is not the buffer's: release ignores it
    assert (run_dir / "buffer" / "explorer-0" / "seg-000003.jsonl").is_file()


def test_mode_train_reads_the_rollout_share_in_whole_groups(mix_setup):
    cfg, run_dir, tok = mix_setup
    cfg.mode = "train"
    batch = MixSource(cfg, run_dir, None, tokenizer=tok).next_batch(1, 3)
    assert [e.source for e in batch].count("rollout") == 4 and len(batch) == 6


# ----------------------------------------------------------------------------- loss and metrics


def mixed_batch() -> list[Experience]:
    batch = rollouts(1, groups=3)
    rng = random.Random(7)
    for i, n in enumerate([5, 2, 7]):
        batch.append(
            Experience(
                task_id=f"sft-{i}",
                group_id=f"sft-{i}",
                prompt_ids=[11] * (3 + i),
                response_ids=[rng.randrange(10, 99) for _ in range(n)],
                source="expert",
            )
        )
    return batch


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
)
def test_single_source_micro_batches_add_up_to_mix_chord_of_the_whole_batch(mode):
    from rft.algo.registry import get_policy_loss_fn

    fn = get_policy_loss_fn(
        "mix_chord", {"mu_warmup_steps": 2, "mu_peak": 0.6, "loss_agg_mode": mode}
    )
    rows = rows_from_experiences(mixed_batch())
    gen = torch.Generator().manual_seed(0)
    shape = rows.response_mask.shape
    logprob = -torch.rand(shape, generator=gen)  # [N, R]
    old = logprob + 0.1 * torch.randn(shape, generator=gen)
    adv = torch.randn(shape, generator=gen)
    whole, whole_metrics = fn(
        logprob, old, adv, rows.response_mask, step=1, expert_mask=rows.expert
    )
    lengths = [len(ids) for ids in rows.input_ids]
    totals = source_totals(rows.response_mask, rows.expert)
    fractions = source_fractions(totals, mode)
    world, total, sums = 2, 0.0, MetricSums()
    for mine in split_for_ranks(rows.group_ids, lengths, world):
        for part in split_by_source(mine, rows.expert):
            for micro_rows in plan_micro_batches(
                part, lengths, use_dynamic_bsz=True, max_token_len=24, micro_batch_size=1
            ):
                micro = collate(rows, micro_rows, adv, old)
                w = micro.response_mask.shape[1]
                source = micro_source(micro)
                loss, metrics = fn(
                    logprob[micro_rows, :w],
                    micro.old_logprobs,
                    micro.advantages,
                    micro.response_mask,
                    step=1,
                    expert_mask=micro.expert,
                )
                scale = micro_loss_scale(micro.response_mask, totals[source], mode, world)
                total += scale * loss.item()
                sums.add({**metrics, POLICY_LOSS: loss.item()}, scale / world, fractions[source])
    assert total / world == pytest.approx(whole.item(), abs=1e-6)
    result = sums.result()
    assert result[POLICY_LOSS] == pytest.approx(whole.item(), abs=1e-6)
    assert result[losses.MU] == pytest.approx(0.3)
    for key in (
        (losses.ROLLOUT_PART_LOSS, losses.EXPERT_PART + losses.SFT_LOSS)
        if mode != "seq-mean-token-sum-norm"
        else ()
    ):
        assert result[key] == pytest.approx(whole_metrics[key], abs=1e-6), key


def test_metric_sums_match_the_plain_weighted_mean_without_expert_rows():
    sums = MetricSums()
    sums.add({"pg_loss": 2.0, "entropy": 1.0}, 0.25, 1.0)
    sums.add({"pg_loss": 4.0, "entropy": 3.0}, 0.5, 1.0)
    other = MetricSums()
    other.add({"pg_loss": 4.0, "entropy": 3.0}, 0.25, 1.0)  # another rank
    other.add({"pg_loss": float("nan"), "entropy": 9.0}, 0.0, 1.0)  # zero-weight padding
    sums.merge(other)
    assert sums.result() == {"pg_loss": 3.5, "entropy": 2.5}  # sum of value x share


def test_expert_rows_get_zero_advantage_and_leave_rollout_advantages_alone():
    from rft.trainer.algorithm import build_loss_fns
    from rft.trainer.plan import MiniPlan, Plan
    from rft.trainer.step import _advantages

    fns = build_loss_fns(chord_cfg().algorithm)

    def advantages(batch: list[Experience]) -> torch.Tensor:
        rows = rows_from_experiences(batch)
        everything = [list(range(len(rows)))]
        plan = Plan(
            rows,
            [MiniPlan(everything, source_totals(rows.response_mask, rows.expert))],
            everything,
            0,
        )
        return _advantages(plan, fns, None, rows.rollout_logprobs, None)[0]  # [N, R]

    mixed, alone = advantages(mixed_batch()), advantages(rollouts(1, groups=3))
    expert = rows_from_experiences(mixed_batch()).expert
    assert mixed[expert].abs().sum() == 0
    assert torch.equal(mixed[~expert][:, : alone.shape[1]], alone)
    assert alone.abs().sum() > 0


# ----------------------------------------------------------------------------- DeepSpeed run

MU = {"mu_warmup_steps": 2, "mu_decay_steps": 2, "mu_peak": 0.6, "mu_valley": 0.05}


@pytest.fixture(scope="module")
def chord_run(tmp_path_factory, tiny_model_dir):
    """Two mix steps in one process, then a resumed third step."""
    from tests.helpers.trainer_runs import PY, metrics, run_ok, write_config

    root = tmp_path_factory.mktemp("chord")
    data = write_expert_data(root / "expert.jsonl")
    config = write_config(
        root,
        "chord",
        tiny_model_dir,
        algorithm={
            "algorithm_type": "mix_chord",
            "repeat_times": 2,
            "optimizer": {"lr": 1e-3},
            "policy_loss_fn_args": {**MU, "enable_phi_function": False},
            "sample_strategy_args": {"expert_data_ratio": 0.25},
        },
        buffer={
            "batch_size": 2,
            "train_batch_size": 6,
            "total_steps": 2,
            "explorer_input": {"taskset": {"path": "unused-by-the-trainer"}},
            "trainer_input": {
                "auxiliary_buffers": {
                    "sft_dataset": {
                        "name": "sft_dataset",
                        "storage_type": "file",
                        "path": str(data),
                        "format": {"messages_key": "messages"},
                    }
                }
            },
        },
        trainer={
            "zero_stage": 2,
            "precision": "fp32",
            "save_interval": 0,
            "use_dynamic_bsz": True,
            "max_token_len_per_gpu": 512,
        },
        synchronizer={"sync_interval": 1, "sync_timeout": 60},
    )
    run_dir = root / "t" / "chord"
    write_segments(run_dir, [1, 2])
    run_ok([PY, "-m", "rft.trainer", "--config", str(config)], root / "chord.log")
    after_two = json.loads((run_dir / "trainer_meta.json").read_text())
    write_segments(run_dir, [3])
    run_ok(
        [PY, "-m", "rft.trainer", "--config", str(config), "buffer.total_steps=3"],
        root / "chord.resume.log",
    )
    return {"metrics": metrics(run_dir), "after_two": after_two, "run_dir": run_dir}


@pytest.mark.integration
def test_mix_run_follows_the_mu_schedule_with_expert_loss(chord_run):
    rows = chord_run["metrics"]
    assert sorted(rows) == [1, 2, 3]
    for step, row in rows.items():
        assert row["mu"] == pytest.approx(chord_mu(step, 2, 2, 0.6, 0.05)), step
        assert row["batch_experiences"] == 6 and row["batch_expert_samples"] == 2
        assert row["expert/sft_loss"] > 0 and "usual/pg_loss" in row
        # pg_loss is the loss of the whole batch: (1 - mu) PPO(rollouts) + mu SFT(expert)
        want = (1 - row["mu"]) * row["usual/pg_loss"] + row["mu"] * row["expert/sft_loss"]
        assert row["pg_loss"] == pytest.approx(want, abs=1e-5)
    assert [rows[s]["mu"] for s in (1, 2, 3)] == pytest.approx([0.3, 0.6, 0.325])
    assert rows[1]["advantages_mean"] == pytest.approx(0.0, abs=1e-6)  # GRPO over rollouts only
    assert STALENESS_MEAN in rows[1]


@pytest.mark.integration
def test_resume_continues_the_expert_cursor(chord_run):
    assert chord_run["after_two"]["buffer_cursor"]["expert"] == {"row": 4}
    meta = json.loads((chord_run["run_dir"] / "trainer_meta.json").read_text())
    assert meta["step"] == 3
    assert meta["buffer_cursor"]["expert"] == {"row": 6}
    assert meta["buffer_cursor"]["segments"]["explorer-0"]["seq"] == 4
