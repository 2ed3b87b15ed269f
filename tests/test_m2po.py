"""M2PO (``algorithm_type: m2po``): the keep-mask and the loss against hand-computed values, its
arguments and preset in the config, and one train_step on a fake one-process engine whose mask
spans micro-batches. The runs on real DeepSpeed ranks are in ``test_m2po_trainer.py``.

Every expected number is worked out in the comment beside it.
"""

from __future__ import annotations

import math

import pytest
import torch

from rft.algo import registry
from rft.algo.losses import PPO_KL
from rft.algo.m2po import (
    M2_AFTER,
    M2_BEFORE,
    MASKED_FRACTION,
    RATIO_MEAN,
    TRUST_REGION_FRACTION,
    dropped_by_m2,
    m2po_loss,
    m2po_mask,
    trust_region,
)
from rft.config.load import config_from_dict
from rft.errors import ConfigError
from rft.trainer.m2po import MASK_TIME_S, check_deterministic, random_parts, rank_span

# ----------------------------------------------------------------------------- the mask


def test_the_largest_trust_region_value_goes_until_the_mean_is_within_the_threshold():
    log_ratio = torch.tensor([[0.1, 0.2, 0.3]])  # squares .01 .04 .09: mean .0467 > .04
    ones = torch.ones_like(log_ratio)
    keep, metrics = m2po_mask(log_ratio, ones, ones, 0.04)
    # sorted prefix means .01, .025, .0467: the first two stay
    assert keep.tolist() == [[True, True, False]]
    assert metrics[M2_BEFORE] == pytest.approx(0.14 / 3)
    assert metrics[M2_AFTER] == pytest.approx(0.025)
    assert metrics[MASKED_FRACTION] == pytest.approx(1 / 3)
    assert metrics[TRUST_REGION_FRACTION] == pytest.approx(1.0)


def test_only_the_quadrants_where_ppo_would_clip_are_constrained():
    log_ratio = torch.tensor([[1.0, -1.0, 1.0, -1.0, 0.5]])
    adv = torch.tensor([[-1.0, 1.0, 1.0, -1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])  # the last token does not count
    assert trust_region(log_ratio, adv, mask).tolist() == [[False, False, True, True, False]]
    keep, metrics = m2po_mask(log_ratio, adv, mask, 0.1)  # squares 1, 1: both go
    assert keep.tolist() == [[True, True, False, False, False]]
    assert metrics[MASKED_FRACTION] == pytest.approx(2 / 4)
    assert metrics[M2_AFTER] == 0.0  # nothing of the trust region is left


def test_within_the_threshold_nothing_is_dropped_and_zero_advantages_are_free():
    log_ratio = torch.tensor([[0.1, -0.1, 3.0]])
    adv = torch.tensor([[1.0, -1.0, 0.0]])  # the big ratio has no advantage: outside
    keep, metrics = m2po_mask(log_ratio, adv, torch.ones_like(adv), 0.04)
    assert keep.all() and metrics[MASKED_FRACTION] == 0.0
    assert metrics[M2_BEFORE] == metrics[M2_AFTER] == pytest.approx(0.01)


def test_sorted_drops_equal_the_papers_one_at_a_time_loop():
    for seed in range(20):
        gen = torch.Generator().manual_seed(seed)
        values = (0.5 * torch.randn(40, generator=gen)).square()
        threshold = 0.04 * (1 + seed % 4)
        active = list(range(len(values)))  # Algorithm 1: drop the largest while mean > bound
        while active and float(values[active].mean()) > threshold:
            active.remove(max(active, key=lambda i: float(values[i])))
        expected = torch.ones(len(values), dtype=torch.bool)
        expected[active] = False
        assert torch.equal(dropped_by_m2(values, threshold), expected), seed


def test_the_mask_of_the_whole_mini_batch_is_not_the_mask_of_its_parts():
    """Trinity's example: squares .01 .09 .05 together keep .01 and .05 (prefix means .01, .03,
    .05); split as [.01 .09] [.05] each part drops its largest, .05 too."""
    values = torch.tensor([0.01, 0.09, 0.05])
    assert dropped_by_m2(values, 0.04).tolist() == [False, True, False]
    parts = [values[:2], values[2:]]
    local = torch.cat([dropped_by_m2(p, 0.04) for p in parts])
    assert local.tolist() == [False, True, True]
    # the trainer gathers the parts (rank order) and takes its slice of the whole decision
    whole = dropped_by_m2(torch.cat(parts), 0.04)
    assert whole[rank_span(parts, 1)].tolist() == [False]
    assert rank_span(parts, 0) == slice(0, 2) and rank_span(parts, 1) == slice(2, 3)


def test_empty_trust_region_and_zero_threshold():
    assert dropped_by_m2(torch.zeros(0), 0.04).tolist() == []
    assert dropped_by_m2(torch.tensor([0.5, 1e-8]), 0.0).tolist() == [True, True]
    _, metrics = m2po_mask(torch.zeros(1, 2), torch.ones(1, 2), torch.zeros(1, 2), 0.04)
    assert metrics == {
        M2_BEFORE: 0.0,
        M2_AFTER: 0.0,
        MASKED_FRACTION: 0.0,
        TRUST_REGION_FRACTION: 0.0,
    }


# ----------------------------------------------------------------------------- the loss


def test_dropped_tokens_count_in_the_denominator_and_get_no_gradient():
    logprob = torch.tensor([[0.0, 1.0]], requires_grad=True)
    ones = torch.ones(1, 2)
    loss, metrics = m2po_loss(
        logprob, torch.zeros(1, 2), ones, ones, m2po_mask=torch.tensor([[True, False]])
    )
    loss.backward()
    assert loss.item() == pytest.approx(-0.5)  # (-1 * e^0 + 0) / 2 tokens
    assert logprob.grad.tolist() == [[pytest.approx(-0.5), 0.0]]  # d(-e^lp / 2) at lp = 0
    assert metrics[PPO_KL] == pytest.approx(-0.5)  # mean of -log ratio: (0 - 1) / 2
    assert metrics[RATIO_MEAN] == pytest.approx((1 + math.e) / 2)


def test_the_clamp_bounds_the_value_but_keeps_the_gradient():
    logprob = torch.tensor([[25.0]], requires_grad=True)
    ones = torch.ones(1, 1)
    loss, _ = m2po_loss(
        logprob, torch.zeros(1, 1), -ones, ones, m2po_mask=ones.bool(), log_ratio_clip=20.0
    )
    loss.backward()
    assert loss.item() == pytest.approx(math.exp(20.0), rel=1e-6)  # -(-1) * e^min(25, 20)
    assert logprob.grad.item() == pytest.approx(math.exp(20.0), rel=1e-6)  # straight through


def test_the_loss_refuses_to_run_without_the_mini_batchs_mask():
    ones = torch.ones(1, 1)
    with pytest.raises(AssertionError, match="mini-batch's mask"):
        m2po_loss(ones, ones, ones, ones)


def test_arguments_are_checked_by_name_and_value():
    fn = registry.get_policy_loss_fn("m2po", {"m2_threshold": 0.1, "log_ratio_clip": 5.0})
    ones = torch.ones(1, 1)
    assert fn(ones, ones, ones, ones, m2po_mask=ones.bool())[0].item() == pytest.approx(-1.0)
    for args, match in [
        ({"m2_threshold": -0.01}, "finite number >= 0"),
        ({"m2_threshold": float("nan")}, "finite number >= 0"),
        ({"log_ratio_clip": float("inf")}, "finite number > 0"),
        ({"log_ratio_clip": 0}, "finite number > 0"),
        ({"loss_agg_mode": "seq-mean-token-mean"}, "must be 'token-mean'"),
        ({"clip_range": 0.2}, "not an argument of policy_loss_fn 'm2po'"),
    ]:
        with pytest.raises(ConfigError, match=match):
            registry.get_policy_loss_fn("m2po", args)
    assert registry.valid_args("policy_loss_fn", "m2po") == [
        "loss_agg_mode",
        "m2_threshold",
        "log_ratio_clip",
    ]


# ----------------------------------------------------------------------------- the config


def _config(**algorithm) -> dict:
    return {
        "model": {"model_path": "/models/m"},
        "algorithm": {"algorithm_type": "m2po", "repeat_times": 4, **algorithm},
        "buffer": {"batch_size": 2, "explorer_input": {"taskset": {"path": "/data/t"}}},
        "cluster": {"node_num": 1, "gpu_per_node": 2},
    }


def test_the_preset_takes_the_rollouts_log_probs_as_the_old_ones():
    algo = config_from_dict(_config()).algorithm
    got = (algo.advantage_fn, algo.policy_loss_fn, algo.kl_loss_fn, algo.entropy_loss_fn)
    assert got == ("grpo", "m2po", "none", "none")
    assert algo.old_logprobs == "rollout" and algo.loss_agg_mode == "token-mean"
    assert config_from_dict(_config(bypass_old_logprobs=True)).algorithm.old_logprobs == "rollout"


def test_bypass_old_logprobs_is_trinitys_spelling_of_old_logprobs():
    grpo = {"algorithm_type": "grpo"}
    assert config_from_dict(_config(**grpo, bypass_old_logprobs=True)).algorithm.old_logprobs == (
        "rollout"
    )
    off = config_from_dict(_config(**grpo, bypass_old_logprobs=False)).algorithm
    assert off.old_logprobs == "recompute"
    with pytest.raises(ConfigError, match="bypass_old_logprobs=True contradicts"):
        config_from_dict(_config(**grpo, bypass_old_logprobs=True, old_logprobs="recompute"))


@pytest.mark.parametrize(
    "algorithm,match",
    [
        ({"bypass_old_logprobs": False}, "set algorithm.bypass_old_logprobs: true"),
        ({"old_logprobs": "recompute"}, "set algorithm.bypass_old_logprobs: true"),
        ({"policy_loss_fn": "ppo"}, "algorithm_type m2po needs policy_loss_fn m2po"),
        ({"rollout_correction": {"mode": "tis"}}, "old_logprobs is 'rollout'"),
        ({"loss_agg_mode": "seq-mean-token-sum"}, None),  # refused when the loss is built
    ],
)
def test_what_m2po_cannot_do_is_refused(algorithm, match):
    from rft.trainer.algorithm import build_loss_fns

    if match is None:
        with pytest.raises(ConfigError, match="must be 'token-mean'"):
            build_loss_fns(config_from_dict(_config(**algorithm)).algorithm)
        return
    with pytest.raises(ConfigError, match=match):
        config_from_dict(_config(**algorithm))


def test_a_random_forward_is_refused_before_the_mask_pass():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1), torch.nn.Dropout(0.0))
    assert random_parts(model) == ["1: Dropout(p=0.1)"]
    small = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=32, attention_dropout=0.1, **small))
    assert random_parts(llama) == ["config.json attention_dropout=0.1"]
    with pytest.raises(ConfigError, match="attention_dropout=0.1"):
        check_deterministic(llama)
    check_deterministic(LlamaForCausalLM(LlamaConfig(vocab_size=32, **small)))


# ----------------------------------------------------------------------------- one train_step


def test_one_step_masks_over_all_micro_batches_and_weights_every_token(monkeypatch):
    """Four rows in four micro-batches at a temperature; rollout log-probs are the model's minus
    d per token, so each log ratio is d. GRPO advantages +A, -A, +A, -A (A = 0.7071063).
    Trust region (d and A of one sign): row 0 all (.01 .04 .09), row 1 its first (.0625),
    row 3 its first (.0025); the others move against their advantage. Mean .041 > .04; sorted
    prefix means .0025 .00625 .0175 .02875 .041: only .09 goes. Row 1 alone (.0625 > .04)
    would have lost its token: it is kept."""
    from rft.buffer.experience import Experience
    from rft.trainer import engine
    from rft.trainer.algorithm import build_loss_fns
    from rft.trainer.step import train_step
    from tests.helpers.fake_engine import TEMPERATURE, BigramLM, FakeEngine, tempered_logprobs

    monkeypatch.setattr(engine, "all_reduce_max", lambda value: value)
    monkeypatch.setattr(engine, "all_gather_objects", lambda obj: [obj])
    model = BigramLM()
    shapes = [
        ("g0", [1, 2], [3, 4, 0], 1.0, [0.1, 0.2, 0.3]),
        ("g0", [1, 2], [2, 2], 0.0, [-0.25, 0.5]),
        ("g1", [4], [1, 3], 1.0, [-0.1, -0.4]),
        ("g1", [4], [0, 1, 2, 3], 0.0, [-0.05, 0.1, 0.2, 0.3]),
    ]
    exps = []  # (exact zeros are avoided: float noise would put them either side of 0)
    for g, prompt, resp, reward, d in shapes:
        current = tempered_logprobs(model, prompt, resp)
        rollout = [lp - x for lp, x in zip(current, d)]
        exps.append(
            Experience(g, g, prompt, resp, logprobs=rollout, reward=reward, temperature=TEMPERATURE)
        )
    cfg = config_from_dict(
        {
            "model": {"model_path": "/m", "temperature": TEMPERATURE},
            "algorithm": {"algorithm_type": "m2po", "repeat_times": 2},
            "buffer": {"batch_size": 2, "explorer_input": {"taskset": {"path": "/d"}}},
            "trainer": {
                "precision": "fp32",
                "use_dynamic_bsz": False,
                "micro_batch_size_per_gpu": 1,
            },
        }
    )
    cpu = torch.device("cpu")
    info = engine.DistInfo(rank=0, world_size=1, local_rank=0, device=cpu, backend="gloo")
    actor = engine.Actor(FakeEngine(model), 2, None)
    metrics = train_step(actor, None, exps, cfg, build_loss_fns(cfg.algorithm), info, 1, 0)
    assert metrics["micro_batches"] == 4
    assert metrics[M2_BEFORE] == pytest.approx(0.205 / 5, abs=1e-6)
    assert metrics[M2_AFTER] == pytest.approx(0.115 / 4, abs=1e-6)
    assert metrics[MASKED_FRACTION] == pytest.approx(1 / 11)
    assert metrics[TRUST_REGION_FRACTION] == pytest.approx(5 / 11)
    assert metrics[MASK_TIME_S] > 0
    a, e = 0.7071063, math.exp
    kept = (
        -a * (e(0.1) + e(0.2))  # row 0, its .3 token dropped
        + a * (e(-0.25) + e(0.5))
        - a * (e(-0.1) + e(-0.4))
        + a * (e(-0.05) + e(0.1) + e(0.2) + e(0.3))
    )
    assert metrics["pg_loss"] == pytest.approx(kept / 11, abs=1e-5)
    assert metrics[PPO_KL] == pytest.approx(-(0.6 + 0.25 - 0.5 + 0.55) / 11, abs=1e-5)
    assert metrics["time_old_logprobs_s"] < 1e-2  # no recompute: the rollout's log-probs
