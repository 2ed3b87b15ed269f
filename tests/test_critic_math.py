"""PPO's critic math on hand-computed values: GAE on a 4-token response with a terminal reward,
skipped off-mask tokens, whitening, the clipped value loss and explained variance."""

from __future__ import annotations

import math

import pytest
import torch

from rft.algo.critic import (
    ADVANTAGE_RAW_MEAN,
    VALUE_MEAN,
    explained_variance,
    gae,
    gae_advantages,
    value_loss,
    whiten,
)

V = torch.tensor([[0.5, 0.6, 0.7, 0.8, 9.0]])  # the last token is padding: its value is unused
R = torch.tensor([[0.0, 0.0, 0.0, 1.0, 5.0]])  # terminal reward on the last response token
M = torch.tensor([[1, 1, 1, 1, 0]])


def test_gae_four_tokens_terminal_reward():
    # gamma 0.9, lam 0.5, by hand, from the end:
    # t3: delta = 1 - 0.8 = 0.2;              A3 = 0.2
    # t2: delta = 0.9 * 0.8 - 0.7 = 0.02;     A2 = 0.02 + 0.45 * 0.2 = 0.11
    # t1: delta = 0.9 * 0.7 - 0.6 = 0.03;     A1 = 0.03 + 0.45 * 0.11 = 0.0795
    # t0: delta = 0.9 * 0.6 - 0.5 = 0.04;     A0 = 0.04 + 0.45 * 0.0795 = 0.075775
    adv, ret = gae(R, V, M, gamma=0.9, lam=0.5)
    assert adv.tolist()[0] == pytest.approx([0.075775, 0.0795, 0.11, 0.2, 0.0])
    assert ret.tolist()[0] == pytest.approx([0.575775, 0.6795, 0.81, 1.0, 0.0])


def test_gae_with_lam_1_gamma_1_is_return_minus_value():
    adv, ret = gae(R, V, M, gamma=1.0, lam=1.0)
    assert ret.tolist()[0] == pytest.approx([1.0, 1.0, 1.0, 1.0, 0.0])
    assert adv.tolist()[0] == pytest.approx([0.5, 0.4, 0.3, 0.2, 0.0])


def test_gae_skips_an_off_mask_token_inside_the_response():
    """A tool token at t1 (mask 0): t0 bootstraps from t2's value and advantage, as if t1 were
    not there; t1 gets 0."""
    values = torch.tensor([[0.5, 7.0, 0.7, 0.8]])
    rewards = torch.tensor([[0.0, 3.0, 0.0, 1.0]])  # t1's reward is not the policy's: ignored
    mask = torch.tensor([[1, 0, 1, 1]])
    adv, _ = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    # t3: 0.2; t2: 0.11 (as above); t0: delta = 0.9 * 0.7 - 0.5 = 0.13, A0 = 0.13 + 0.45 * 0.11
    assert adv.tolist()[0] == pytest.approx([0.13 + 0.45 * 0.11, 0.0, 0.11, 0.2])


def test_gae_advantages_are_whitened_over_masked_tokens_returns_are_not():
    adv, ret, metrics = gae_advantages(R, V, M, gamma=1.0, lam=1.0)
    raw = torch.tensor([0.5, 0.4, 0.3, 0.2])  # mean 0.35, unbiased std sqrt(0.05/3)
    expect = (raw - 0.35) / math.sqrt(0.05 / 3 + 1e-8)
    assert adv.tolist()[0][:4] == pytest.approx(expect.tolist(), rel=1e-5) and adv[0, 4] == 0
    assert ret.tolist()[0] == pytest.approx([1.0, 1.0, 1.0, 1.0, 0.0])
    assert metrics[ADVANTAGE_RAW_MEAN] == pytest.approx(0.35)
    assert metrics[VALUE_MEAN] == pytest.approx(0.65)
    assert whiten(torch.tensor([[2.0, 4.0]]), torch.tensor([[1, 1]])).tolist()[0] == pytest.approx(
        [-1 / math.sqrt(2), 1 / math.sqrt(2)], rel=1e-5
    )


def test_value_loss_clips_against_the_old_values():
    old = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    new = torch.tensor([[1.5, 0.9, 3.0, 7.0]])
    returns = torch.tensor([[2.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, clip_frac = value_loss(new, old, returns, mask, cliprange_value=0.2)
    # t0: new 1.5 -> clipped 1.2; (1.5-2)^2 = 0.25, (1.2-2)^2 = 0.64 -> 0.64 (clipped larger)
    # t1: new 0.9 inside the range: both 0.81 -> 0.81 (not counted as clipped)
    # t2: new 3.0 -> clipped 1.2; 9.0 vs 1.44 -> 9.0 (unclipped larger)
    assert loss.item() == pytest.approx(0.5 * (0.64 + 0.81 + 9.0) / 3)
    assert clip_frac == pytest.approx(1 / 3)
    new_g = new.clone().requires_grad_()
    value_loss(new_g, old, returns, mask, cliprange_value=0.2)[0].backward()
    # t0's larger term is the clipped one, whose clamp is saturated: no gradient reaches t0
    assert new_g.grad.tolist()[0] == pytest.approx([0.0, 0.9 / 3, 3.0 / 3, 0.0])


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0, 99.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(returns, 2.0), returns, mask) == pytest.approx(0.0)
    # residuals (0, 1, 0): var 2/9 over var(returns) 2/3 -> 1 - 1/3
    values = torch.tensor([[1.0, 1.0, 3.0, 0.0]])
    assert explained_variance(values, returns, mask) == pytest.approx(2 / 3)
    assert math.isnan(explained_variance(returns, torch.ones_like(returns), mask))
