"""Clip-B (Trinity's ``advantage_fn: clipb``): GRPO's advantages, then the negative-advantage
tokens whose entropy signal S = p (H + log p) lies more than mu standard deviations below the
batch's mean are left out of the loss. The filter by hand, and one train_step on a fake
one-process engine whose loss counts only the kept tokens."""

from __future__ import annotations

import math

import pytest
import torch
import yaml

from rft.algo import registry
from rft.algo.entropy_clip import clipb_keep
from rft.buffer.experience import Experience
from rft.config.load import config_from_dict, load_config
from rft.errors import ConfigError, DataError
from tests.helpers.fake_engine import (
    TEMPERATURE,
    TWO_GROUPS,
    BigramLM,
    FakeEngine,
    step_on_one_rank,
)


def test_clipb_advantages_are_grpo_as_trinity():
    # groups [1, 0] and a group of one (mean 0, std 1: r / (1 + eps)); mu is the filter's
    fn = registry.get_advantage_fn("clipb", {"mu": 3.0, "epsilon": 1e-6})
    adv, _ = fn(torch.tensor([1.0, 0.0, 2.0]), ["a", "a", "b"], torch.ones(3, 2))
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert adv[:, 0].tolist() == pytest.approx([a, -a, 2.0 / (1 + 1e-6)], abs=1e-6)
    with pytest.raises(ConfigError, match="std_threshold: not an argument"):
        registry.get_advantage_fn("clipb", {"std_threshold": 0.1})
    with pytest.raises(ConfigError, match="mu: got -1, expected a number >= 0"):
        registry.get_advantage_fn("clipb", {"mu": -1})


def test_clipb_drops_low_signal_tokens_of_negative_advantage_only():
    # log p = 0 (p = 1) gives S = H; log p = -2 with H = 1 gives S = e^-2 (1 - 2) = -0.1353353
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    lp = torch.tensor([[0.0, -2.0, 0.0], [0.0, -2.0, 0.0], [-2.0, 0.0, 0.0]])
    ent = torch.ones(3, 3)
    # S over the 8 masked tokens: five 1s and three -0.1353353: mean 0.5742493,
    # population std 0.5496476; mu 1: below 0.0246017 is low: the three -0.135 tokens
    keep, metrics = clipb_keep(adv, mask, lp, ent, mu=1.0)
    # kept: the positive row's and the zero row's low tokens; dropped: the negative row's
    assert keep.tolist() == [[1, 1, 1], [1, 0, 1], [1, 1, 0]]
    assert metrics["clipb_frac_clipped"] == pytest.approx(1 / 8)
    assert metrics["clipb_frac_clipped_neg"] == pytest.approx(1 / 3)
    assert metrics["clipb_frac_clipped_pos"] == 0.0
    assert metrics["clipb_signal_mean"] == pytest.approx(0.5742493, abs=1e-6)
    assert metrics["clipb_signal_var"] == pytest.approx(0.3021061, abs=1e-6)
    # a wider mu keeps it; a constant signal keeps everything
    assert clipb_keep(adv, mask, lp, ent, mu=2.0)[0].tolist() == mask.tolist()
    flat = clipb_keep(adv, mask, torch.zeros(3, 3), ent, mu=0.0)[0]
    assert flat.tolist() == mask.tolist()


def _entropy(model: BigramLM, prev: int) -> float:
    p = torch.softmax(model.table.detach()[prev] / TEMPERATURE, dim=-1)
    return float(-(p * p.log()).sum())


def test_clipb_step_trains_on_the_kept_tokens_only(monkeypatch):
    """The old-log-prob pass runs (not skipped) for its entropies; one negative-advantage token
    with a very low signal is dropped: the token-mean PPO loss at ratio 1, -sum(A) / tokens,
    counts the 10 kept tokens of 11, and the step reports the filter's metrics."""
    from rft.trainer import engine

    monkeypatch.setattr(engine, "all_reduce_max", lambda value: value)
    monkeypatch.setattr(engine, "all_gather_objects", lambda obj: [obj])
    model = BigramLM()
    shapes = TWO_GROUPS
    # rollout log-probs 0 (p = 1): S = H, the entropy after the previous token (0.63-1.12);
    # they do not move the PPO ratio (old log-probs recomputed)
    exps = [
        Experience(g, g, p, r, logprobs=[0.0] * len(r), reward=rw, temperature=TEMPERATURE)
        for g, p, r, rw in shapes
    ]
    # the second token of the last (negative) row: log p = -1 - H, S's minimum -e^(-1-H)
    exps[3].logprobs[1] = -1.0 - _entropy(model, 0)  # predicted from token 0
    signal = []
    for e in exps:
        ids = e.prompt_ids + e.response_ids
        for j, lp in enumerate(e.logprobs):
            signal.append(math.exp(lp) * (_entropy(model, ids[len(e.prompt_ids) - 1 + j]) + lp))
    s = torch.tensor(signal)
    mu = 1.5
    low = s < s.mean() - mu * s.std(unbiased=False)
    assert low.tolist() == [False] * 8 + [True, False, False]  # only the token moved (precondition)
    cfg = config_from_dict(
        {
            "model": {"model_path": "/m", "temperature": TEMPERATURE},
            "algorithm": {
                "algorithm_type": "grpo",
                "advantage_fn": "clipb",
                "advantage_fn_args": {"mu": mu},
                "repeat_times": 2,
                "kl_loss_fn": "none",
            },
            "buffer": {"batch_size": 2, "explorer_input": {"taskset": {"path": "/d"}}},
            "trainer": {"precision": "fp32"},
        }
    )
    metrics = step_on_one_rank(FakeEngine(model), exps, cfg)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    # kept advantages: +A x 3, -A x 2, +A x 2, -A x 3 (one of 4 dropped) over 10 tokens
    assert metrics["pg_loss"] == pytest.approx(-(3 - 2 + 2 - 3) * a / 10, abs=1e-6)
    assert metrics["clipb_frac_clipped"] == pytest.approx(1 / 11)
    assert metrics["clipb_frac_clipped_neg"] == pytest.approx(1 / 6)
    assert metrics["old_logprobs_skipped"] == 0
    assert metrics["response_length_mean"] == pytest.approx(11 / 4)  # before the filter
    # a row without rollout log-probs cannot be filtered
    exps[0].logprobs = []
    with pytest.raises(DataError, match="advantage_fn clipb reads the rollout log-probs"):
        step_on_one_rank(FakeEngine(model), exps, cfg)


def test_clipb_needs_the_recomputed_old_logprobs(tmp_path):
    raw = {
        "model": {"model_path": "/m"},
        "algorithm": {"algorithm_type": "grpo", "advantage_fn": "clipb", "repeat_times": 4},
        "buffer": {"batch_size": 2, "explorer_input": {"taskset": {"path": "/d"}}},
    }
    assert config_from_dict(raw).algorithm.old_logprobs == "recompute"
    raw["algorithm"]["bypass_old_logprobs"] = True
    with pytest.raises(ConfigError, match="set algorithm.old_logprobs: recompute"):
        config_from_dict(raw)
    # Clip-V needs Trinity's patched veRL actor: refused by name, pointing at clipb
    raw["algorithm"] = {"algorithm_type": "grpo", "advantage_fn": "clipv", "repeat_times": 4}
    with pytest.raises(ConfigError, match="use clipb"):
        config_from_dict(raw)


def test_verl_bypass_mode_is_read_as_bypass_old_logprobs(tmp_path):
    """Trinity 0.5's trainer reads veRL's algorithm.rollout_correction.bypass_mode (Clip-B's
    example sets it false); the rest of veRL's algorithm section has no effect."""
    raw = {
        "model": {"model_path": "/m"},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 4},
        "buffer": {"batch_size": 2, "explorer_input": {"taskset": {"path": "/d"}}},
        "trainer": {"trainer_config": {"algorithm": {"rollout_correction": {"bypass_mode": True}}}},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert load_config(path).algorithm.old_logprobs == "rollout"
    raw["algorithm"]["bypass_old_logprobs"] = False
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="bypass_mode=True contradicts algorithm.bypass_old"):
        load_config(path)
