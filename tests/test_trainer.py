"""Trainer tests. Unmarked: pure batching, loss normalisation, lr schedule, checkpoint pointer
logic, the staleness histogram, and one train_step on a fake one-process engine (temperature and
off-policy correction). ``integration``: real DeepSpeed on CPU (2 gloo ranks under torchrun,
tiny Llama): ZeRO-2 and ZeRO-3 runs on hand-made experiences, a SIGUSR1 stop + resume compared
with an uninterrupted run, published weights against the DeepSpeed checkpoint, and a
single-process SFT run; vLLM's sampled log-probs against the trainer's at a temperature. The
DeepSpeed runs are shared between assertions (module-scoped fixtures)."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
import torch

from rft.algo.losses import aggregate
from rft.buffer.experience import Experience
from rft.trainer.batching import (
    collate,
    micro_loss_scale,
    plan_micro_batches,
    rows_from_experiences,
    split_for_ranks,
    split_mini_batches,
)
from rft.trainer.lr_schedule import lr_multiplier, warmup_steps
from tests.helpers.fake_engine import (
    TEMPERATURE,
    TWO_GROUPS,
    BigramLM,
    FakeEngine,
    SGDEngine,
    step_on_one_rank,
    tempered_logprobs,
)
from tests.helpers.trainer import batch_totals
from tests.helpers.trainer_runs import (
    PY,
    REPO,
    STEPS,
    make_batch,
    metrics,
    objective,
    run_interrupted,
    run_ok,
    torchrun_cmd,
    trainer_env,
    write_config,
    write_segments,
)

# ----------------------------------------------------------------------------- pure batching


def test_split_for_ranks_keeps_groups_and_balances_tokens():
    groups = ["a", "a", "b", "b", "c", "c", "d", "d"]
    lengths = [10, 12, 3, 3, 7, 7, 5, 6]
    shares = split_for_ranks(groups, lengths, 2)
    assert sorted(shares[0] + shares[1]) == list(range(8))
    for share in shares:
        assert {groups[i] for i in share}.isdisjoint(
            {groups[i] for i in set(range(8)) - set(share)}
        )
    loads = [sum(lengths[i] for i in s) for s in shares]
    assert loads == [28, 25]  # a(22)->0, c(14)->1, d(11)->1, b(6)->0
    assert shares == split_for_ranks(groups, lengths, 2)  # deterministic
    assert split_for_ranks(["a"], [4], 3) == [[0], [], []]


def test_split_mini_batches_keeps_groups_whole_and_even():
    exps = make_batch(1, groups=8)  # 8 groups of 2
    rows = rows_from_experiences(exps)
    minis = split_mini_batches(rows.group_ids, rows.expert, 3)
    assert [len(m) for m in minis] == [6, 6, 4]  # 3 + 3 + 2 groups
    assert sorted(r for m in minis for r in m) == list(range(16))
    for mini in minis:
        assert {rows.group_ids[i] for i in mini}.isdisjoint(
            {rows.group_ids[i] for other in minis if other is not mini for i in other}
        )
    expert = torch.tensor([False] * 12 + [True] * 4)  # CHORD: expert rows spread the same way
    assert [
        sum(bool(expert[i]) for i in m) for m in split_mini_batches(rows.group_ids, expert, 2)
    ] == [2, 2]
    assert split_mini_batches(rows.group_ids, rows.expert, 1) == [list(range(16))]


@pytest.mark.parametrize(
    "mode, train_batch_size, epochs, updates",
    [("both", None, 1, 1), ("both", 4, 1, 2), ("both", 6, 2, 4), ("train", 4, 1, 1)],
)
def test_updates_per_step_follow_train_batch_size(
    tmp_path, mode, train_batch_size, epochs, updates
):
    from rft.config.batches import updates_per_step
    from rft.config.load import load_config

    buffer = (
        {"batch_size": 4}
        if train_batch_size is None
        else {"batch_size": 4, "train_batch_size": train_batch_size}
    )
    config = write_config(
        tmp_path, "u", tmp_path, mode=mode, buffer=buffer, trainer={"ppo_epochs": epochs}
    )
    assert updates_per_step(load_config(config)) == updates  # 4 groups of 2 per step


def test_train_batch_size_counts_experiences_so_multi_turn_runs_make_more_updates(tmp_path):
    """buffer.train_batch_size counts experiences, as Trinity's trainer reads them (its
    BufferConfigValidator gives the experience buffer batch_size = train_batch_size): a step of
    4 groups x 2 runs x 3 turns (24 experiences) with train_batch_size 8 trains 4 updates of
    one whole group each, where 4 groups of single-turn runs (8 experiences) train one."""
    from rft.config.batches import groups_per_update_of, mini_batch_count
    from rft.config.load import load_config

    config = write_config(tmp_path, "u", tmp_path, buffer={"batch_size": 4, "train_batch_size": 8})
    cfg = load_config(config)  # repeat_times 2
    assert groups_per_update_of(cfg, experiences=8, groups=4) == 4
    assert mini_batch_count(4, groups_per_update_of(cfg, experiences=8, groups=4)) == 1
    assert groups_per_update_of(cfg, experiences=24, groups=4) == 1
    assert mini_batch_count(4, groups_per_update_of(cfg, experiences=24, groups=4)) == 4
    assert groups_per_update_of(cfg, experiences=12, groups=4) == 2  # 2 turns: 2 groups each


def test_train_batch_size_larger_than_the_step_is_refused(tmp_path):
    from rft.config.batches import check_train_batch_size
    from rft.config.load import load_config
    from rft.errors import ConfigError

    config = write_config(
        tmp_path, "big", tmp_path, buffer={"batch_size": 4, "train_batch_size": 16}
    )
    cfg = load_config(config)  # the dry run checks it when every run gives one experience
    with pytest.raises(ConfigError, match="exceeds a step's batch_size x repeat_times = 4 x 2 = 8"):
        check_train_batch_size(cfg)


def test_async_input_ends_only_when_every_joined_explorer_finished(tmp_path):
    """mode train: a live (unfinished) explorer keeps the trainer waiting; once every explorer
    that joined says finished and the buffer is drained, the input ends by itself."""
    from rft.config.load import load_config
    from rft.sync.heartbeat import Heartbeat
    from rft.trainer.inputs import BufferSource

    config = write_config(
        tmp_path,
        "async",
        tmp_path,
        mode="train",
        buffer={"batch_size": 4, "train_batch_size": 4},
        synchronizer={"sync_timeout": 3600},
    )
    cfg = load_config(config)
    write_segments(cfg.run_dir, [1])  # 8 experiences
    first, added = Heartbeat(cfg.run_dir, "explorer-0"), Heartbeat(cfg.run_dir, "explorer_new-0")
    first.beat(finished=True)
    added.beat()
    source = BufferSource(cfg, cfg.run_dir, None)
    assert len(source.next_batch(1, 0)) == len(source.next_batch(2, 0)) == 4
    polls = []

    def stop_after_two_polls() -> bool:
        polls.append(1)
        return len(polls) > 2

    assert source.next_batch(3, 0, stop_after_two_polls) is None
    assert len(polls) > 2  # still waiting for explorer_new-0 when the stop came
    added.beat(finished=True)
    assert source.next_batch(3, 0, lambda: False) is None  # ends by itself: nothing left, all done


def test_plan_micro_batches_token_budget_and_fixed():
    lengths = [10, 4, 8, 3, 9]
    micros = plan_micro_batches(
        range(5), lengths, use_dynamic_bsz=True, max_token_len=20, micro_batch_size=1
    )
    assert sorted(i for m in micros for i in m) == list(range(5))
    for m in micros:
        assert len(m) * max(lengths[i] for i in m) <= 20 or len(m) == 1
    assert micros == [[0, 4], [2, 1], [3]]
    assert plan_micro_batches(
        [0, 1, 2], lengths, use_dynamic_bsz=False, max_token_len=1, micro_batch_size=2
    ) == [[0, 1], [2]]


def test_collate_aligns_response_tokens_and_pads_inside_micro_batch():
    exps = make_batch(1)
    rows = rows_from_experiences(exps)
    adv = torch.arange(rows.response_mask.numel(), dtype=torch.float32).reshape(
        rows.response_mask.shape
    )
    micro = collate(rows, [0, 5], adv, torch.zeros_like(adv), pad_id=7)
    assert micro.input_ids.shape == (2, max(len(rows.input_ids[0]), len(rows.input_ids[5])))
    for j, i in enumerate([0, 5]):
        n = len(exps[i].response_ids)
        assert micro.response_ids[j, :n].tolist() == exps[i].response_ids
        assert micro.response_mask[j].sum() == n
        # the logits at logit_positions predict the response: position p-1+k holds token p-1+k
        p = len(exps[i].prompt_ids)
        assert micro.logit_positions[j, 0] == p - 1
        assert micro.input_ids[j, micro.logit_positions[j, :n] + 1].tolist() == exps[i].response_ids
    assert micro.advantages[1, 0] == adv[5, 0]
    assert micro.input_ids[0, len(rows.input_ids[0]) :].eq(7).all()


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
)
def test_micro_loss_scale_reproduces_whole_batch_loss(mode):
    """Sum over ranks and micro-batches of scale * micro_loss / world == the batch's loss."""
    gen = torch.Generator().manual_seed(0)
    lens = [3, 7, 1, 5, 4, 6]
    width = max(lens)
    mask = torch.zeros(6, width)
    for i, n in enumerate(lens):
        mask[i, :n] = 1
    loss_mat = torch.randn(6, width, generator=gen)
    totals = batch_totals(mask)
    world = 2
    micros = [[0, 1], [2], [3, 4, 5]]  # rank 0: first two, rank 1: the last
    total = 0.0
    for rows in micros:
        w = max(lens[i] for i in rows)
        m, lm = mask[rows, :w], loss_mat[rows, :w]
        total += micro_loss_scale(m, totals, mode, world) * aggregate(lm, m, mode).item()
    assert total / world == pytest.approx(aggregate(loss_mat, mask, mode).item(), abs=1e-6)


@pytest.mark.parametrize(
    "mode, whole",
    [
        ("token-mean", 1.0),
        ("seq-mean-token-mean", 1.0),
        ("seq-mean-token-sum", 8 / 3),
        ("seq-mean-token-sum-norm", 2.0),
    ],
)
def test_micro_loss_scale_splits_ones_over_ranks_and_micro_batches(mode, whole):
    """Loss 1 on every token, lengths [4, 1, 3] (L=4): sum-norm is 8 tokens / 4 = 2.0 (veRL's
    agg_loss); rank 0 runs [0] and [1] (widths 4, 1), rank 1 runs [2] (width 3). Each micro-batch's
    own sum-norm is 1, scaled by 2 x R_micro / R: (2 + 0.5 + 1.5) / 2 = 2.0."""
    lens = [4, 1, 3]
    mask = torch.zeros(3, 4)
    for i, n in enumerate(lens):
        mask[i, :n] = 1
    totals = batch_totals(mask)
    assert aggregate(torch.ones(3, 4), mask, mode).item() == pytest.approx(whole)
    total = 0.0
    for rows in ([0], [1], [2]):
        m = mask[rows, : max(lens[i] for i in rows)]
        total += (
            micro_loss_scale(m, totals, mode, 2) * aggregate(torch.ones_like(m), m, mode).item()
        )
    assert total / 2 == pytest.approx(whole)


def test_gpu_optimizer_is_torchs_fused_adamw_unless_states_are_offloaded(tmp_path):
    """No JIT-compiled optimizer op on a GPU job's first step: torch's fused AdamW through
    DeepSpeed's ``torch_adam``; offloaded optimizer states keep DeepSpeed's CPU Adam; CPU runs
    take torch's AdamW unfused."""
    from rft.config.load import config_from_dict
    from rft.trainer.engine import ds_config

    def params(on_cpu: bool, **trainer) -> dict:
        cfg = config_from_dict(
            {
                "mode": "train",
                "checkpoint_root_dir": str(tmp_path),
                "model": {"model_path": str(tmp_path)},
                "trainer": trainer,
            }
        )
        return ds_config(cfg, 1, on_cpu)["optimizer"]["params"]

    assert params(on_cpu=False)["torch_adam"] and params(on_cpu=False)["fused"]
    assert not params(on_cpu=False, optimizer_offload=True)["torch_adam"]
    cpu = params(on_cpu=True, optimizer_offload=True)
    assert cpu["torch_adam"] and "fused" not in cpu


def test_lr_schedule_warmup_constant_and_cosine():
    assert warmup_steps(-1, 0.25, 8) == 2 and warmup_steps(3, 0.5, 8) == 3
    f = lr_multiplier("constant", 2, None, 0.0)
    assert [f(s) for s in range(4)] == [0.5, 1.0, 1.0, 1.0]
    g = lr_multiplier("cosine", 0, 10, 0.1)
    assert g(0) == pytest.approx(1.0) and g(10) == pytest.approx(0.1)
    assert g(5) == pytest.approx(0.1 + 0.9 * 0.5)


def test_checkpoint_pointer_written_last_and_pruning(tmp_path):
    from rft.trainer import state as ts

    for step in (1, 2, 3):
        tmp = ts.staging_dir(tmp_path, step)
        (tmp / "actor" / "x").write_text("shard")
        assert ts.newest_complete(tmp_path) == (step - 1 if step > 1 else None)
        ts.finish_checkpoint(tmp_path, tmp, step, {"buffer_cursor": {}, "world_size": 1}, keep=2)
    assert ts.newest_complete(tmp_path) == 3
    assert ts.list_checkpoints(tmp_path) == [2, 3]
    assert ts.read_meta(tmp_path, 3)["step"] == 3
    assert json.loads((tmp_path / "trainer_meta.json").read_text())["step"] == 3


def test_staleness_histogram_counts_rollouts_per_age():
    from rft.monitor import STALENESS_COUNT, STALENESS_MAX, STALENESS_MEAN
    from rft.trainer.loop import staleness_metrics

    # trainer at version 3; rollouts from versions 3, 3, 1, 0 -> ages 0, 0, 2, 3 (expert: none)
    batch = make_batch(1, groups=2)
    for exp, version in zip(batch, (3, 3, 1, 0)):
        exp.model_version = version
    batch.append(Experience("e", "e", [1], [2], source="expert", model_version=-7))
    m = staleness_metrics(batch, 3)
    assert m[STALENESS_MEAN] == 1.25 and m[STALENESS_MAX] == 3.0
    assert {k: v for k, v in m.items() if k.startswith("staleness/count_")} == {
        STALENESS_COUNT.format(versions=age): n for age, n in ((0, 2), (1, 0), (2, 1), (3, 1))
    }


# ----------------------------------------------------------------------------- one step, fake engine


def test_one_step_scores_at_the_temperature_and_weights_the_loss(monkeypatch):
    """TIS end to end: the trainer divides its logits by the sampling temperature, so behaviour
    log-probs equal to the model's tempered ones give ratio 1 on every token; two tokens are
    moved: ratio 4 (truncated to 2) and 0.5."""
    from rft.algo.correction import (
        IS_CAPPED_FRAC,
        IS_RATIO_MAX,
        IS_RATIO_MEAN,
        IS_WEIGHT_MEAN,
    )
    from rft.config.load import config_from_dict
    from rft.trainer import engine

    monkeypatch.setattr(
        engine, "all_reduce_max", lambda value: value
    )  # one process: no collectives
    monkeypatch.setattr(engine, "all_gather_objects", lambda obj: [obj])
    model = BigramLM()
    # groups: rewards [1, 0] -> GRPO advantages +-A, A = 0.5 / (std 0.7071068 + 1e-6) = 0.7071063
    shapes = TWO_GROUPS
    exps = [
        Experience(
            g, g, p, r, logprobs=tempered_logprobs(model, p, r), reward=rw, temperature=TEMPERATURE
        )
        for g, p, r, rw in shapes
    ]
    exps[0].logprobs[0] -= math.log(4.0)  # pi_old / pi_behaviour = 4 -> TIS weight 2
    exps[3].logprobs[1] += math.log(2.0)  # 0.5
    cfg = config_from_dict(
        {
            "model": {"model_path": "/m", "temperature": TEMPERATURE},
            "algorithm": {
                "algorithm_type": "grpo",
                "repeat_times": 2,
                "kl_loss_fn": "none",
                "rollout_correction": {"mode": "tis"},
            },
            "buffer": {"batch_size": 2, "explorer_input": {"taskset": {"path": "/d"}}},
            "trainer": {"precision": "fp32"},
        }
    )
    metrics = step_on_one_rank(FakeEngine(model), exps, cfg)
    # 11 tokens: nine ratios 1, one 4, one 0.5
    assert metrics[IS_RATIO_MEAN] == pytest.approx(13.5 / 11, abs=1e-5)
    assert metrics[IS_RATIO_MAX] == pytest.approx(4.0, abs=1e-5)
    assert metrics[IS_WEIGHT_MEAN] == pytest.approx(11.5 / 11, abs=1e-5)
    assert metrics[IS_CAPPED_FRAC] == pytest.approx(1 / 11)
    # ratio 1 (old recomputed), token-mean of -A_row * w: rows +A*(2+1+1), -A*2, +A*2,
    # -A*(1+0.5+1+1) -> -0.5 A / 11 (without weights it would be +A / 11)
    assert metrics["pg_loss"] == pytest.approx(-0.5 * 0.7071063 / 11, abs=1e-6)
    assert metrics["ppo_kl"] == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize("correction", ["none", "tis"])
def test_on_policy_step_skips_the_old_logprob_pass_with_the_same_update(monkeypatch, correction):
    """One update with recomputed old log-probs: the no-grad pass is skipped (old = the training
    forward's log-probs, detached), and loss, gradient, weights and correction metrics equal a
    step that makes the pass, over several micro-batches at a temperature."""
    from rft.config.load import config_from_dict
    from rft.trainer import engine
    from rft.trainer import step as st
    from rft.trainer.algorithm import build_loss_fns

    skippable = st.old_pass_skippable
    monkeypatch.setattr(engine, "all_reduce_max", lambda value: value)
    monkeypatch.setattr(engine, "all_gather_objects", lambda obj: [obj])
    shapes = TWO_GROUPS
    base = tempered_logprobs(BigramLM(), [1, 2], [3, 4, 0])
    cfg = config_from_dict(
        {
            "model": {"model_path": "/m", "temperature": TEMPERATURE},
            "algorithm": {
                "algorithm_type": "grpo",
                "repeat_times": 2,
                "kl_loss_fn": "none",
                "rollout_correction": {"mode": correction},
            },
            "buffer": {"batch_size": 2, "explorer_input": {"taskset": {"path": "/d"}}},
            "trainer": {
                "precision": "fp32",
                "use_dynamic_bsz": False,
                "micro_batch_size_per_gpu": 2,
                "log_prob_micro_batch_size_per_gpu": 3,
            },
        }
    )

    def one_step(skip: bool) -> tuple[dict, torch.Tensor]:
        monkeypatch.setattr(st, "old_pass_skippable", lambda fns, updates: skip)
        model = BigramLM()
        exps = [
            Experience(g, g, p, r, logprobs=[x - 0.3 for x in base[: len(r)]], reward=rw)
            for g, p, r, rw in shapes
        ]
        return step_on_one_rank(SGDEngine(model), exps, cfg), model.table.detach()

    monkeypatch.setattr(st, "local_pass", _counting(st.local_pass))
    skipped, skipped_weights = one_step(True)
    assert _counting.calls == 0
    passed, passed_weights = one_step(False)
    assert _counting.calls == 1
    assert skippable(build_loss_fns(cfg.algorithm), 1) and not skippable(
        build_loss_fns(cfg.algorithm), 2
    )
    assert (skipped["old_logprobs_skipped"], passed["old_logprobs_skipped"]) == (1, 0)
    assert skipped["time_old_logprobs_s"] < 1e-3
    assert skipped["micro_batches"] == 2
    for key in passed:
        if not key.startswith("time_") and key != "old_logprobs_skipped":
            assert skipped[key] == pytest.approx(passed[key], abs=1e-6), key
    assert skipped["ppo_kl"] == pytest.approx(0.0, abs=1e-7) and skipped["pg_clipfrac"] == 0.0
    assert torch.allclose(skipped_weights, passed_weights, atol=1e-6)
    assert not torch.equal(passed_weights, BigramLM().table.detach())  # the step did update


def _counting(fn):
    """``fn`` counting its calls in ``_counting.calls``."""
    _counting.calls = 0

    def wrapped(*args, **kwargs):
        _counting.calls += 1
        return fn(*args, **kwargs)

    return wrapped


def test_published_state_dict_drops_the_tied_lm_head(tmp_path, tiny_model_dir):
    """ZeRO-1/2 publishing: the live state dict (on a GPU the CPU copy breaks the aliasing)
    loses its tied ``lm_head.weight``; the folder loads in transformers with the same logits."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from rft.trainer.engine import without_tied_duplicates

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    assert model.config.tie_word_embeddings
    live = model.state_dict()
    assert "lm_head.weight" in live
    state = without_tied_duplicates(live)
    assert "lm_head.weight" not in state and set(state) == set(live) - {"lm_head.weight"}
    model.save_pretrained(
        tmp_path, state_dict={k: v.clone() for k, v in state.items()}, safe_serialization=True
    )
    assert "lm_head.weight" not in load_file(str(tmp_path / "model.safetensors"))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 5, 9, 2]])
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


# ----------------------------------------------------------------------------- DeepSpeed runs


@pytest.mark.integration
def test_an_off_policy_correction_over_two_ranks_gives_the_one_rank_step(tmp_path, tiny_model_dir):
    """TIS on two ZeRO-2 ranks: each rank weights its own rows, the ratios' statistics and the
    loss are gathered over ranks, so the step's metrics equal a one-rank run's (the rollouts'
    log-probs, -1 each, are far above the tiny random model's: the weights are far from 1)."""
    extra = {
        "algorithm": {
            "algorithm_type": "grpo",
            "repeat_times": 2,
            "kl_loss_fn": "none",
            "optimizer": {"lr": 1e-3},
            "rollout_correction": {"mode": "tis"},
        },
        "buffer": {
            "batch_size": 4,
            "total_steps": 1,
            "explorer_input": {"taskset": {"path": "unused-by-the-trainer"}},
        },
    }
    rows = {}
    for ranks in (2, 1):
        config = write_config(tmp_path, f"ranks{ranks}", tiny_model_dir, **extra)
        write_segments(tmp_path / "t" / f"ranks{ranks}", [1])
        run_ok(torchrun_cmd(config, ranks=ranks), tmp_path / f"ranks{ranks}.log")
        rows[ranks] = metrics(tmp_path / "t" / f"ranks{ranks}")[1]
    keys = [
        "pg_loss",
        "rollout_correction/is_ratio_mean",
        "rollout_correction/is_ratio_max",
        "rollout_correction/is_weight_mean",
        "rollout_correction/capped_frac",
    ]
    assert rows[1]["rollout_correction/is_weight_mean"] < 0.5  # the weights do act
    for key in keys:
        assert rows[2][key] == pytest.approx(rows[1][key], rel=1e-4, abs=1e-12), key


@pytest.mark.integration
@pytest.mark.parametrize("zero_stage", [2, 3])
def test_packed_micro_batches_give_the_padded_step(tmp_path, tiny_model_dir, zero_stage):
    """``trainer.padding_free`` on two DeepSpeed ranks: the same step's loss, entropy and
    gradient norm as padded micro-batches (ZeRO-2 scores from the hidden states, ZeRO-3 from the
    logits), with micro-batches of several ragged rows."""
    rows = {}
    for packed in (False, True):
        extra = {
            "algorithm": {
                "algorithm_type": "grpo",
                "repeat_times": 2,
                "kl_loss_fn": "none",
                "optimizer": {"lr": 1e-3},
            },
            "buffer": {
                "batch_size": 4,
                "total_steps": 1,
                "explorer_input": {"taskset": {"path": "unused-by-the-trainer"}},
            },
            "trainer": {
                "zero_stage": zero_stage,
                "padding_free": packed,
                "max_token_len_per_gpu": 64,
            },
        }
        name = f"packed{int(packed)}"
        config = write_config(tmp_path, name, tiny_model_dir, **extra)
        write_segments(tmp_path / "t" / name, [1])
        run_ok(torchrun_cmd(config), tmp_path / f"{name}.log")
        rows[packed] = metrics(tmp_path / "t" / name)[1]
    for key in ("pg_loss", "entropy", "grad_norm"):
        assert rows[True][key] == pytest.approx(rows[False][key], rel=1e-4, abs=1e-7), key


@pytest.mark.integration
def test_zero0_on_one_rank_trains_as_zero2(tmp_path, tiny_model_dir):
    """One rank with ``trainer.zero_stage: 0`` (the CPU quick starts: nothing to partition, no
    float32 copy of the weights): every step's loss, entropy and gradient norm (taken before
    the clip, which ZeRO-0 does without keeping it) as ZeRO-2's, over three steps of several
    micro-batches, so accumulation, clipping and zeroing between steps agree too."""
    rows = {}
    for stage in (0, 2):
        extra = {
            "algorithm": {
                "algorithm_type": "grpo",
                "kl_loss_fn": "none",
                "optimizer": {"lr": 1e-3},
            },
            "buffer": {"batch_size": 4, "total_steps": 3},
            "trainer": {"zero_stage": stage, "max_token_len_per_gpu": 40, "grad_clip": 0.5},
        }
        config = write_config(tmp_path, f"zero{stage}", tiny_model_dir, **extra)
        write_segments(tmp_path / "t" / f"zero{stage}", [1, 2, 3])
        run_ok(torchrun_cmd(config, ranks=1), tmp_path / f"zero{stage}.log")
        rows[stage] = metrics(tmp_path / "t" / f"zero{stage}")
    assert rows[0][1]["micro_batches"] > 1
    for step in (1, 2, 3):
        for key in ("pg_loss", "entropy", "grad_norm"):
            assert math.isfinite(rows[0][step][key]), (step, key)
            assert rows[0][step][key] == pytest.approx(rows[2][step][key], rel=1e-4, abs=1e-7), (step, key)  # fmt: skip
    assert rows[0][1]["grad_norm"] > 0.5  # the clip acted: the later steps agree only if both clip


@pytest.fixture(scope="module", params=[2, 3], ids=["zero2", "zero3"])
def ds_runs(request, tmp_path_factory, tiny_model_dir):
    """An uninterrupted run and a stopped-and-resumed one, same config (fp32)."""
    stage = request.param
    root = tmp_path_factory.mktemp(f"zero{stage}")
    extra = {
        "trainer": {
            "zero_stage": stage,
            "precision": "fp32",
            "save_interval": 0,
            "use_dynamic_bsz": True,
            "max_token_len_per_gpu": 40,
        }
    }
    if stage == 3:  # exercise the reference model (partitioned like the actor) and a KL loss
        extra["algorithm"] = {
            "algorithm_type": "grpo",
            "repeat_times": 2,
            "kl_loss_fn": "k2",
            "kl_loss_fn_args": {"kl_coef": 0.01},
            "optimizer": {"lr": 1e-3},
        }
    full = write_config(root, "full", tiny_model_dir, **extra)
    stopped = write_config(root, "stopped", tiny_model_dir, **extra)
    full_dir, stopped_dir = root / "t" / "full", root / "t" / "stopped"
    write_segments(full_dir, range(1, STEPS + 1))
    run_ok(torchrun_cmd(full), root / "full.log")
    run_interrupted(stopped, stopped_dir, root / "stopped.log")
    return {"stage": stage, "full": full_dir, "stopped": stopped_dir, "model": tiny_model_dir}


def hand_pg_loss(exps: list[Experience]) -> float:
    """Token-mean PPO loss at ratio 1: -sum(A_i * len_i) / sum(len_i), GRPO advantages."""
    adv = {}
    for g in {e.group_id for e in exps}:
        members = [e for e in exps if e.group_id == g]
        rewards = torch.tensor([e.reward for e in members])
        mean, std = rewards.mean(), rewards.std()
        for e in members:
            adv[e.experience_id] = float((e.reward - mean) / (std + 1e-6))
    lens = {e.experience_id: len(e.response_ids) for e in exps}
    return -sum(adv[k] * lens[k] for k in adv) / sum(lens.values())


@pytest.mark.integration
def test_first_step_matches_hand_computed_values(ds_runs):
    row = metrics(ds_runs["full"])[1]
    assert row["pg_loss"] == pytest.approx(hand_pg_loss(make_batch(1)), abs=1e-5)
    assert row["ppo_kl"] == pytest.approx(0.0, abs=1e-7)  # recomputed old logprobs: ratio 1
    assert row["pg_clipfrac"] == 0.0
    assert row["advantages_mean"] == pytest.approx(0.0, abs=1e-6)
    assert row["advantages_std"] == pytest.approx(0.5 / math.sqrt(0.5) * math.sqrt(8 / 7), abs=1e-4)
    if ds_runs["stage"] == 3:
        assert row["kl_loss"] == pytest.approx(0.0, abs=1e-7)  # actor == reference at step 1
        assert metrics(ds_runs["full"])[STEPS]["kl_loss"] > 0


def _objective(model_dir: Path) -> float:
    """Advantage-weighted token log-likelihood of the fixed batch (what GRPO increases)."""
    from transformers import AutoModelForCausalLM

    return objective(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval())


@pytest.mark.integration
def test_training_raises_the_objective_and_publishes_loadable_weights(ds_runs):
    from rft.sync.versions import latest_weights

    version, folder = latest_weights(ds_runs["full"])
    assert version == STEPS
    assert sorted(p.name for p in (ds_runs["full"] / "weights").iterdir()) == ["v000002", "v000004"]
    assert _objective(folder) > _objective(ds_runs["model"]) + 1e-3


@pytest.mark.integration
def test_published_weights_equal_the_engines(ds_runs):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from safetensors.torch import load_file

    actor = ds_runs["full"] / f"global_step_{STEPS}" / "actor"
    engine = get_fp32_state_dict_from_zero_checkpoint(str(actor))
    published = load_file(str(ds_runs["full"] / "weights" / f"v{STEPS:06d}" / "model.safetensors"))
    hf = load_file(str(actor / "huggingface" / "model.safetensors"))
    assert set(published) <= set(engine) and len(published) >= len(engine) - 1  # tied lm_head
    assert "lm_head.weight" not in published and "lm_head.weight" not in hf  # no tied duplicate
    for name, tensor in published.items():
        assert torch.equal(tensor, engine[name].to(tensor.dtype)), name
        assert torch.equal(tensor, hf[name]), name
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(
        ds_runs["full"] / "weights" / f"v{STEPS:06d}", dtype=torch.float32
    ).eval()
    trained = AutoModelForCausalLM.from_pretrained(ds_runs["model"], dtype=torch.float32).eval()
    trained.load_state_dict({k: v.float() for k, v in engine.items()}, strict=False)
    ids = torch.tensor([[1, 5, 9, 2]])
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, trained(input_ids=ids).logits)


@pytest.mark.integration
def test_stop_and_resume_gives_the_uninterrupted_losses(ds_runs):
    full, stopped = metrics(ds_runs["full"]), metrics(ds_runs["stopped"])
    assert sorted(stopped) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        for key in ("pg_loss", "grad_norm", "logprob_mean", "entropy", "lr"):
            assert stopped[step][key] == pytest.approx(full[step][key], abs=1e-5), (step, key)
    meta = json.loads((ds_runs["stopped"] / "trainer_meta.json").read_text())
    assert meta["step"] == STEPS and meta["weights_version"] == STEPS
    assert meta["buffer_cursor"]["segments"]["explorer-0"]["seq"] == STEPS + 1
    assert (ds_runs["stopped"] / "global_step_2" / "trainer_meta.json").is_file()  # the signal's
    segments = sorted(p.name for p in (ds_runs["stopped"] / "buffer" / "explorer-0").iterdir())
    assert segments == [f"seg-{STEPS:06d}.jsonl"]  # consumed ones released after checkpoints


@pytest.mark.integration
def test_a_step_larger_than_train_batch_size_makes_one_update_per_mini_batch(
    tmp_path, tiny_model_dir
):
    config = write_config(
        tmp_path,
        "mini",
        tiny_model_dir,
        buffer={"batch_size": 4, "train_batch_size": 4, "total_steps": 2},
        synchronizer={"sync_interval": 2, "sync_timeout": 60},
    )
    run_dir = tmp_path / "t" / "mini"
    write_segments(run_dir, [1, 2])
    run_ok([PY, "-m", "rft.trainer", "--config", str(config)], tmp_path / "mini.log")
    rows = metrics(run_dir)
    assert [rows[s]["updates"] for s in (1, 2)] == [2, 2]  # 4 groups of 2 in mini-batches of 2
    # old log-probs come from before the step's first update, so the second mini-batch of step 1
    # already sees a changed policy: a PPO ratio away from 1 (one update per step would give 0)
    assert rows[1]["ppo_kl"] != pytest.approx(0.0, abs=1e-9)


@pytest.mark.integration
def test_sft_single_process_lowers_the_loss(tmp_path, tiny_model_dir):
    data = tmp_path / "sft.jsonl"
    rows = [{"question": f"What is {a} + {a}?", "answer": f"{a} + {a} = {2 * a}"} for a in range(4)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = write_config(
        tmp_path,
        "sft",
        tiny_model_dir,
        mode="train",
        algorithm={"algorithm_type": "sft", "optimizer": {"lr": 3e-3}},
        buffer={
            "batch_size": 4,
            "train_batch_size": 4,
            "total_steps": 4,
            "trainer_input": {
                "experience_buffer": {
                    "name": "sft",
                    "path": str(data),
                    "storage_type": "file",
                    "format": {"prompt_key": "question", "response_key": "answer"},
                }
            },
        },
        trainer={
            "zero_stage": 2,
            "precision": "bf16",
            "save_interval": 2,
            "use_dynamic_bsz": False,
            "micro_batch_size_per_gpu": 2,
            "gradient_checkpointing": True,
        },
    )
    run_ok([PY, "-m", "rft.trainer", "--config", str(config)], tmp_path / "sft.log")
    run_dir = tmp_path / "t" / "sft"
    rows = metrics(run_dir)
    assert rows[4]["sft_loss"] < rows[1]["sft_loss"] - 0.05
    assert json.loads((run_dir / "trainer_meta.json").read_text())["buffer_cursor"] == {"row": 16}
    assert (run_dir / "global_step_4" / "actor" / "huggingface" / "model.safetensors").is_file()


@pytest.mark.integration
def test_vllm_and_the_trainer_score_samples_at_the_sampling_temperature(vllm_model_dir):
    """vLLM's log-probs (logprobs_mode processed_logprobs) and the trainer's forward, which
    divides each row's logits by the temperature its rollout records, describe the same
    distribution: equal on every sampled token at temperatures 0.5 and 1.3 in one micro-batch,
    and not equal to the untempered ones."""
    from transformers import AutoModelForCausalLM

    from rft.config.load import config_from_dict
    from rft.explorer.engine import Engine, complete
    from rft.explorer.tasksets import SamplingArgs
    from rft.trainer import engine

    cfg = config_from_dict(
        {
            "mode": "explore",
            "model": {"model_path": str(vllm_model_dir), "max_model_len": 64},
            "cluster": {"gpu_per_node": 0},
            "explorer": {"rollout_model": {"dtype": "float32"}},
            "buffer": {"explorer_input": {"taskset": {"path": "unused"}}},
        }
    )
    temps = (0.5, 1.3)  # two tasksets' temperatures in one micro-batch: each row at its own
    groups = complete(
        Engine(cfg),
        [[1, 2, 3, 4, 5]] * 2,
        [SamplingArgs(n=4, temperature=t, max_tokens=8) for t in temps],
    )
    exps = [
        Experience("t", "g", s.prompt_ids, s.response_ids, logprobs=s.logprobs, temperature=t)
        for t, group in zip(temps, groups)
        for s in group
    ]
    rows = rows_from_experiences(exps)
    micro = collate(
        rows, list(range(len(exps))), torch.zeros_like(rows.response_mask), rows.rollout_logprobs
    )
    assert micro.temperature.tolist() == pytest.approx([0.5] * 4 + [1.3] * 4)
    model = AutoModelForCausalLM.from_pretrained(vllm_model_dir, dtype=torch.float32).eval()
    mask = micro.response_mask > 0
    with torch.no_grad():
        tempered = engine.forward_logprobs(model, micro, with_entropy=False)[0]
        micro.temperature = 1.0
        raw = engine.forward_logprobs(model, micro, with_entropy=False)[0]
    torch.testing.assert_close(tempered[mask], micro.old_logprobs[mask], rtol=0, atol=2e-3)
    assert (raw[mask] - micro.old_logprobs[mask]).abs().max() > 0.05


def test_each_row_is_scored_at_the_temperature_it_was_sampled_at():
    """Rollouts record their sampling temperature (greedy 0 scores at 1); expert rows are data
    (1); records without one (an earlier rft) take the config's, and none can be told when the
    tasksets differ."""
    from rft.errors import DataError

    def exp(temperature, source="rollout"):
        return Experience(
            "t", "g", [1, 2], [3], logprobs=[-1.0], temperature=temperature, source=source
        )

    rows = rows_from_experiences([exp(0.5), exp(0.0), exp(None), exp(0.7, "expert")], 0.9)
    assert rows.temperatures.tolist() == pytest.approx([0.5, 1.0, 0.9, 1.0])
    micro = collate(rows, [2, 0], torch.zeros_like(rows.response_mask), rows.rollout_logprobs)
    assert micro.temperature.tolist() == pytest.approx([0.9, 0.5])
    with pytest.raises(DataError, match="records no sampling temperature"):
        rows_from_experiences([exp(None)], None)


@pytest.mark.integration
def test_a_step_with_no_experiences_is_skipped_and_a_launch_that_trains_on_nothing_fails(
    tiny_model_dir, tmp_path
):
    """mode both, 2 ranks: step 1's segment holds nothing (every episode failed): no update on
    either rank, the weights still published (the explorer's next step waits for them); step 2
    trains. A launch whose every step is empty ends non-zero, saying so."""
    from rft.buffer.segments import SegmentWriter

    extra = {
        "buffer": {"batch_size": 4, "total_steps": 2, "explorer_input": {"taskset": {"path": "x"}}},
        "synchronizer": {"sync_interval": 1, "sync_timeout": 120},
    }
    config = write_config(tmp_path, "gap", tiny_model_dir, **extra)
    writer = SegmentWriter(tmp_path / "t" / "gap" / "buffer", "explorer-0")
    writer.write([], seq=1)
    writer.write(make_batch(2), seq=2)
    run_ok(torchrun_cmd(config), tmp_path / "gap.log")
    rows = metrics(tmp_path / "t" / "gap")
    assert rows[1]["skipped_no_experiences"] == 1 and rows[1]["batch_tokens"] == 0
    assert rows[1]["weights_version"] == 1  # published unchanged
    assert "skipped_no_experiences" not in rows[2] and rows[2]["batch_tokens"] > 0
    assert "step 1: no experiences to train on" in (tmp_path / "gap.log").read_text()

    config = write_config(tmp_path, "nothing", tiny_model_dir, **extra)
    writer = SegmentWriter(tmp_path / "t" / "nothing" / "buffer", "explorer-0")
    for step in (1, 2):
        writer.write([], seq=step)
    log = tmp_path / "nothing.log"
    with log.open("w") as out:
        proc = subprocess.run(
            torchrun_cmd(config, ranks=1),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=trainer_env(),
            cwd=REPO,
            timeout=240,
        )
    assert proc.returncode != 0
    assert "the trainer trained on nothing: each of its 2 steps had no experiences" in (
        log.read_text()
    )


@pytest.mark.integration
def test_an_asynchronous_trainer_that_receives_nothing_fails(tiny_model_dir, tmp_path):
    """mode train, nothing in the buffer for synchronizer.sync_timeout: no step runs, and the
    trainer says it trained on nothing and ends non-zero (it used to end 0)."""
    extra = {
        "mode": "train",
        "buffer": {"batch_size": 4, "total_steps": 2, "explorer_input": {"taskset": {"path": "x"}}},
        "synchronizer": {"sync_interval": 1, "sync_timeout": 3},
    }
    config = write_config(tmp_path, "starved", tiny_model_dir, **extra)
    log = tmp_path / "starved.log"
    with log.open("w") as out:
        proc = subprocess.run(
            torchrun_cmd(config, ranks=1),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=trainer_env(),
            cwd=REPO,
            timeout=240,
        )
    assert proc.returncode != 0
    assert "the trainer trained on nothing: no experiences arrived within " in log.read_text()
    assert metrics(tmp_path / "t" / "starved") == {}
