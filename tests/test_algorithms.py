"""Advantages, policy/KL/entropy losses, aggregation and off-policy correction weights against
hand-computed values.

Every expected number is worked out in the comment beside it; tolerances are 1e-5 unless the
test is about exactness.
"""

from __future__ import annotations

import math

import pytest
import torch

from rft.algo import registry
from rft.algo.advantages import discounted_returns, token_level_rewards
from rft.algo.correction import (
    IS_CAPPED_FRAC,
    IS_RATIO_MAX,
    IS_RATIO_MEAN,
    IS_WEIGHT_MEAN,
    CorrectionSums,
    correction_weights,
)
from rft.algo.logprobs import token_entropy, token_logprobs
from rft.algo.losses import (
    CLIP_FRAC,
    CLIP_FRAC_LOWER,
    ENTROPY,
    ENTROPY_LOSS_FNS,
    KL_FNS,
    LOSS_AGG_MODES,
    MU,
    PPO_KL,
    _ratio_and_kl,
    aggregate,
    chord_mu,
    kl,
)
from rft.algo.registry import POLICY_LOSS_FNS
from rft.config import names
from rft.errors import ConfigError

T = torch.tensor


def close(actual, expected, tol: float = 1e-5) -> None:
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float32),
        torch.as_tensor(expected, dtype=torch.float32),
        rtol=0,
        atol=tol,
    )


# ----------------------------------------------------------------------------- advantages


def test_grpo_one_group_unbiased_std_broadcast_and_masked():
    # mean 0.5; unbiased std = sqrt(4 * 0.25 / 3) = sqrt(1/3) = 0.5773503
    # advantage = +-0.5 / (0.5773503 + 1e-6) = +-0.8660239
    mask = T([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]])
    adv, metrics = registry.get_advantage_fn("grpo")(
        T([1.0, 0.0, 0.0, 1.0]), ["q", "q", "q", "q"], mask
    )
    a = 0.8660239
    close(adv, [[a, a, 0], [-a, 0, 0], [-a, -a, -a], [a, a, 0]])
    close(metrics["reward_mean"], 0.5)
    close(metrics["group_std_mean"], 0.5773503)


def test_grpo_several_groups_singleton_passes_its_reward_and_constant_group_gets_zero():
    # group 0: [2, 4] mean 3, std sqrt(2) -> -+1/1.4142146 = -+0.7071065
    # group 1: [5] alone -> Trinity's mean 0, std 1: 5 / (1 + 1e-6) = 4.999995
    # group 2: [1, 1] std 0 -> (1-1)/eps = 0
    rewards = T([2.0, 4.0, 5.0, 1.0, 1.0])
    adv, metrics = registry.get_advantage_fn("grpo")(rewards, T([0, 0, 1, 2, 2]), torch.ones(5, 1))
    close(adv[:, 0], [-0.7071065, 0.7071065, 4.999995, 0.0, 0.0])
    close(metrics["zero_advantage_group_frac"], 0.0)  # no group skipped without std_threshold


def test_grpo_batch_std_and_rank_penalty_as_trinity():
    # std_cal_level batch: [0, 1 | 3, 3, 4 | 9]: group means 0.5, 3.3333333, (single) 0;
    # batch unbiased std of all six = 3.1411251
    rewards, groups = T([0.0, 1.0, 3.0, 3.0, 4.0, 9.0]), [0, 0, 1, 1, 1, 2]
    adv, _ = registry.get_advantage_fn("grpo", {"std_cal_level": "batch"})(
        rewards, groups, torch.ones(6, 1)
    )
    std = 3.1411251 + 1e-6
    expected = [-0.5 / std, 0.5 / std, -1 / 3 / std, -1 / 3 / std, 2 / 3 / std, 9 / std]
    close(adv[:, 0], expected)
    # rank_penalty 0.5, one group [1, 1, 0] with mean log-probs [-0.1, -0.3, -0.2]: ranks
    # [2, 0, 1] / 3 -> penalised [1 x (1 - 1/3), 1 x 1, 0] = [0.6666667, 1, 0]: mean 0.5555556,
    # std 0.5091751; the advantage reads the raw reward: (1 - 0.5555556) / 0.5091761 = 0.8728698,
    # (0 - 0.5555556) / 0.5091761 = -1.0910873
    fn = registry.get_advantage_fn("grpo", {"rank_penalty": 0.5})
    adv, _ = fn(
        T([1.0, 1.0, 0.0]), [0, 0, 0], torch.ones(3, 1), logprob_means=T([-0.1, -0.3, -0.2])
    )
    close(adv[:, 0], [0.8728698, 0.8728698, -1.0910873])


def test_grpo_std_threshold_and_mean_only():
    # group a: [0, 1] std 0.7071 > 0.5 -> kept: -+0.5/0.7071078 = -+0.7071058
    # group b: [0, 0.4] std 0.2828 <= 0.5 -> zero
    rewards, groups = T([0.0, 1.0, 0.0, 0.4]), ["a", "a", "b", "b"]
    adv, _ = registry.get_advantage_fn("grpo", {"std_threshold": 0.5})(
        rewards, groups, torch.ones(4, 1)
    )
    close(adv[:, 0], [-0.7071058, 0.7071058, 0.0, 0.0])
    # Dr.GRPO-like: r - mean only -> [-0.5, 0.5, -0.2, 0.2]
    adv, _ = registry.get_advantage_fn("grpo", {"std_normalize": False})(
        rewards, groups, torch.ones(4, 1)
    )
    close(adv[:, 0], [-0.5, 0.5, -0.2, 0.2])


def test_grpo_token_level_rewards_are_summed_over_the_mask():
    # row sums: 0 + 0 + 1 = 1 and 0 (the 7 is off the mask) -> +-0.5/0.7071078
    token_rewards = T([[0.0, 0.0, 1.0], [0.0, 0.0, 7.0]])
    mask = T([[1, 1, 1], [1, 1, 0]])
    adv, _ = registry.get_advantage_fn("grpo")(token_rewards, [0, 0], mask)
    close(adv, [[0.7071058] * 3, [-0.7071058, -0.7071058, 0.0]])


def test_rloo_leave_one_out():
    # [1, 0, 0, 1]: r=1 -> 1 - (0+0+1)/3 = 2/3; r=0 -> 0 - (1+0+1)/3 = -2/3
    # [2, 6]: -4, +4;  [3] alone -> 0
    rewards = T([1.0, 0.0, 0.0, 1.0, 2.0, 6.0, 3.0])
    adv, _ = registry.get_advantage_fn("rloo")(rewards, [0, 0, 0, 0, 1, 1, 2], torch.ones(7, 1))
    close(adv[:, 0], [2 / 3, -2 / 3, -2 / 3, 2 / 3, -4.0, 4.0, 0.0])


def test_reinforce_plain_and_whitened():
    rewards, mask = T([1.0, 0.0, 3.0]), T([[1, 1], [1, 0], [1, 1]])
    adv, _ = registry.get_advantage_fn("reinforce")(rewards, [0, 1, 2], mask)
    close(adv, [[1, 1], [0, 0], [3, 3]])
    # mean 4/3; unbiased var = (1/9 + 16/9 + 25/9) / 2 = 7/3; std 1.5275252
    # (1 - 4/3)/std = -0.2182178, (0 - 4/3)/std = -0.8728716, (3 - 4/3)/std = 1.0910895
    adv, _ = registry.get_advantage_fn("reinforce", {"whiten": True})(rewards, [0, 1, 2], mask)
    close(adv[:, 0], [-0.2182178, -0.8728716, 1.0910895])


def test_reinforceplusplus_returns_and_global_whitening():
    # rewards on the last response token: row0 [0, 0, 1], row1 [0, 0] (+ pad)
    # gamma 1 returns: row0 [1, 1, 1], row1 [0, 0]; over 5 tokens mean 0.6,
    # unbiased var = (3 * 0.16 + 2 * 0.36) / 4 = 0.3 -> 0.4/sqrt(0.3) = 0.7302967, -0.6/sqrt(0.3) = -1.0954451
    mask = T([[1, 1, 1], [1, 1, 0]])
    adv, _ = registry.get_advantage_fn("reinforceplusplus")(T([1.0, 0.0]), [0, 1], mask)
    close(adv, [[0.7302967] * 3, [-1.0954451, -1.0954451, 0.0]], tol=1e-5)


def test_discounted_returns_skip_off_mask_tokens():
    # gamma 0.5, row [0, 0, 1]: t2 = 1, t1 = 0.5, t0 = 0.25
    close(discounted_returns(T([[0.0, 0.0, 1.0]]), T([[1, 1, 1]]), 0.5), [[0.25, 0.5, 1.0]])
    # off-mask middle token neither earns (its 5 is ignored) nor discounts: t2 = 2, t0 = 0.5 * 2 = 1
    close(discounted_returns(T([[0.0, 5.0, 2.0]]), T([[1, 0, 1]]), 0.5), [[1.0, 0.0, 2.0]])


def test_opmd_mean_and_logavgexp_baselines():
    adv, _ = registry.get_advantage_fn("opmd")(T([1.0, 0.0, 0.0, 1.0]), [0] * 4, torch.ones(4, 1))
    close(adv[:, 0], [0.5, -0.5, -0.5, 0.5])
    # tau 1, rewards [0, 1]: b = log((e^0 + e^1)/2) = log(1.8591409) = 0.6201145
    fn = registry.get_advantage_fn("opmd", {"opmd_baseline": "logavgexp", "tau": 1.0})
    adv, _ = fn(T([0.0, 1.0, 4.0]), [0, 0, 1], torch.ones(3, 1))
    close(adv[:, 0], [-0.6201145, 0.3798855, 0.0])  # the singleton group gets 0
    # tau 0.1: b = 0.1 * log((e^0 + e^10)/2) = 1 + 0.1 * log((1 + e^-10)/2) = 0.9306876 (near the max)
    fn = registry.get_advantage_fn("opmd", {"opmd_baseline": "logavgexp", "tau": 0.1})
    adv, _ = fn(T([0.0, 1.0]), [0, 0], torch.ones(2, 1))
    close(adv[:, 0], [-0.9306876, 0.0693124])


# ----------------------------------------------------------------------------- aggregation


def test_agg_modes_on_ragged_mask():
    loss_mat = T([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [7.0, 7.0, 7.0]])
    mask = T([[1, 1, 1], [1, 0, 0], [0, 0, 0]])  # the 9s and the empty third row do not count
    close(aggregate(loss_mat, mask, "token-mean"), 2.5)  # (1+2+3+4)/4
    close(aggregate(loss_mat, mask, "seq-mean-token-mean"), 3.0)  # mean(6/3, 4/1)
    close(aggregate(loss_mat, mask, "seq-mean-token-sum"), 5.0)  # mean(6, 4)
    close(aggregate(loss_mat, mask, "seq-mean-token-sum-norm"), 10.0 / 3)  # (6 + 4) / L=3
    close(aggregate(loss_mat, torch.zeros(3, 3), "token-mean"), 0.0)
    close(aggregate(loss_mat, torch.zeros(3, 3), "seq-mean-token-sum-norm"), 0.0)


def test_seq_mean_token_sum_norm_is_the_total_sum_over_l_as_verl_and_trinity():
    # veRL agg_loss / Trinity: sum of all 8 counted tokens / L=4 = 2.0 (a mean over the 2
    # sequences first would give 1.0)
    close(aggregate(torch.ones(2, 4), torch.ones(2, 4), "seq-mean-token-sum-norm"), 2.0)
    close(
        aggregate(torch.ones(2, 4), T([[1, 1, 0, 0], [1, 0, 0, 0]]), "seq-mean-token-sum-norm"),
        0.75,
    )  # 3 tokens / L=4: the constant is the padded width, not a length


# ----------------------------------------------------------------------------- policy losses


def _logs(ratios):
    return torch.log(T(ratios, dtype=torch.float32))


def test_ppo_clips_both_sides():
    # clip 0.2. r=1.5,A=+1: max(-1.5, -1.2) = -1.2 (clipped); r=0.5,A=+1: max(-0.5, -0.8) = -0.5
    # r=0.5,A=-1: max(0.5, 0.8) = 0.8 (clipped); r=1.5,A=-1: max(1.5, 1.2) = 1.5
    # token-mean = (-1.2 - 0.5 + 0.8 + 1.5)/4 = 0.15, clipfrac 2/4
    logprob = _logs([[1.5, 0.5, 0.5, 1.5]]).requires_grad_()
    adv, mask = T([[1.0, 1.0, -1.0, -1.0]]), torch.ones(1, 4)
    loss, m = registry.get_policy_loss_fn("ppo")(logprob, torch.zeros(1, 4), adv, mask)
    close(loss, 0.15)
    close(m[CLIP_FRAC], 0.5)
    close(m[CLIP_FRAC_LOWER], 0.0)
    loss.backward()
    # clipped tokens get no gradient; others d(-A r)/dlogprob / 4 = -A r / 4
    close(logprob.grad, [[0.0, -0.125, 0.0, 0.375]])


def test_ppo_asymmetric_clip():
    # low 0.1, high 0.3: r=1.5,A=+1 -> -1.3; r=0.5,A=-1 -> 0.9; mean = -0.2
    fn = registry.get_policy_loss_fn("ppo", {"clip_range_low": 0.1, "clip_range_high": 0.3})
    loss, _ = fn(_logs([[1.5, 0.5]]), torch.zeros(1, 2), T([[1.0, -1.0]]), torch.ones(1, 2))
    close(loss, -0.2)


def test_ppo_dual_clip():
    # r=5, A=-1: max(5, 1.2) = 5, capped at -A * 3 = 3; r=5, A=+1: max(-5, -1.2) = -1.2
    logprob, adv = _logs([[5.0, 5.0]]), T([[-1.0, 1.0]])
    loss, m = registry.get_policy_loss_fn("ppo")(logprob, torch.zeros(1, 2), adv, torch.ones(1, 2))
    close(loss, 0.9)  # (3 - 1.2) / 2
    close(m[CLIP_FRAC_LOWER], 0.5)
    loss, _ = registry.get_policy_loss_fn("ppo", {"clip_ratio_c": None})(
        logprob, torch.zeros(1, 2), adv, torch.ones(1, 2)
    )
    close(loss, 1.9)  # (5 - 1.2) / 2 without dual clip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ratio_is_exactly_one_when_old_logprob_is_recomputed(dtype):
    logprob = (torch.randn(3, 7) - 2).to(dtype)
    ratio, ppo_kl = _ratio_and_kl(logprob, logprob.clone(), torch.ones(3, 7))
    assert torch.equal(ratio, torch.ones_like(ratio))
    assert ppo_kl.item() == 0.0
    adv, mask = torch.randn(3, 7), (torch.rand(3, 7) > 0.3).float()
    loss, m = registry.get_policy_loss_fn("ppo")(
        logprob.float(), logprob.float().clone(), adv, mask
    )
    assert m[CLIP_FRAC] == 0.0 and m[PPO_KL] == 0.0
    close(loss, -(adv * mask).sum() / mask.sum(), tol=1e-6)


def test_gspo_sequence_ratio_and_clip():
    # row0 log-ratios [0.2, 0.4, (9 masked)] -> s = exp(0.3) = 1.3498588, A=+1
    # row1 log-ratios [-0.1]*3 -> s = exp(-0.1) = 0.9048374, A=-1
    old = torch.zeros(2, 3)
    logprob = T([[0.2, 0.4, 9.0], [-0.1, -0.1, -0.1]]).requires_grad_()
    adv, mask = T([[1.0] * 3, [-1.0] * 3]), T([[1, 1, 0], [1, 1, 1]])
    # no clipping (range 1): per-token loss = -A s; seq-mean-token-mean = (-1.3498588 + 0.9048374)/2
    loss, _ = registry.get_policy_loss_fn("gspo", {"clip_range": 1.0})(logprob, old, adv, mask)
    close(loss, (-1.3498588 + 0.9048374) / 2)
    loss.backward()
    # gradient equals that of the sequence objective: d(-A s)/dlp_t = -A s / n_tokens, / 2 sequences
    close(logprob.grad, [[-1.3498588 / 4, -1.3498588 / 4, 0.0], [0.9048374 / 6] * 3])
    # clip 0.05: s0 -> 1.05 (max(-1.3499, -1.05) = -1.05); s1 -> max(0.9048, 0.95) = 0.95
    loss, m = registry.get_policy_loss_fn("gspo", {"clip_range": 0.05})(logprob, old, adv, mask)
    close(loss, (-1.05 + 0.95) / 2)
    close(m[CLIP_FRAC], 1.0)


def test_sft_loss_is_masked_nll():
    logprob, mask = T([[-1.0, -2.0], [-3.0, -50.0]]), T([[1, 1], [1, 0]])
    loss, m = registry.get_policy_loss_fn("sft")(logprob, None, None, mask)
    close(loss, 2.0)  # (1 + 2 + 3)/3
    loss, _ = registry.get_policy_loss_fn("sft", {"loss_agg_mode": "seq-mean-token-mean"})(
        logprob, None, None, mask
    )
    close(loss, 2.25)  # mean(1.5, 3)


@pytest.mark.parametrize(
    "step, expected",
    [(0, 0.0), (5, 0.25), (10, 0.5), (20, 0.3), (30, 0.1), (100, 0.1)],
    # warm-up 10 to peak 0.5: step 5 -> 0.25; cosine over 20 steps to 0.1:
    # step 20 is halfway: 0.1 + 0.4 * 0.5 * (1 + cos(pi/2)) = 0.3; from step 30 on: 0.1
)
def test_chord_mu_schedule(step, expected):
    close(chord_mu(step, 10, 20, 0.5, 0.1), expected)


def test_chord_mu_constant_by_default():
    assert chord_mu(0, 0, 0, 0.1, 0.1) == 0.1


def test_mix_chord_mixes_ppo_on_rollouts_and_sft_on_expert_rows():
    # row0: rollout, ratio 1, A=2 -> ppo = -2; row1: expert, p = 0.5 on both tokens
    # phi = 0.5 * 0.5 = 0.25 -> sft = ln2 * 0.25 = 0.1732868; plain sft = ln2 = 0.6931472
    # mu = 0.1 (defaults): loss = 0.9 * -2 + 0.1 * sft
    logprob = T([[0.0, 0.0], [math.log(0.5), math.log(0.5)]]).requires_grad_()
    old, adv, mask = T([[0.0, 0.0], [0.0, 0.0]]), T([[2.0, 2.0], [0.0, 0.0]]), torch.ones(2, 2)
    expert = T([False, True])
    loss, m = registry.get_policy_loss_fn("mix_chord")(
        logprob, old, adv, mask, step=0, expert_mask=expert
    )
    close(loss, -1.8 + 0.01732868)
    close(m[MU], 0.1)
    loss.backward()
    # phi carries no gradient: d(0.1 * -lp * 0.25 / 2)/dlp = -0.0125; ppo rows: 0.9 * -A r / 2 = -0.9
    close(logprob.grad, [[-0.9, -0.9], [-0.0125, -0.0125]])
    fn = registry.get_policy_loss_fn("mix_chord", {"enable_phi_function": False})
    loss, _ = fn(logprob, old, adv, mask, step=0, expert_mask=expert)
    close(loss, -1.8 + 0.06931472)
    # expert rows only: loss = mu * sft; step 5 of a 10-step warm-up to 0.4 -> mu 0.2
    fn = registry.get_policy_loss_fn(
        "mix_chord", {"mu_warmup_steps": 10, "mu_peak": 0.4, "enable_phi_function": False}
    )
    loss, _ = fn(logprob[1:], old[1:], adv[1:], mask[1:], step=5, expert_mask=T([True]))
    close(loss, 0.2 * 0.6931472)


def test_opmd_policy_loss():
    # -A * lp = [1, 2 | -0.5] -> token-mean 2.5/3 = 0.8333333, / (1 + tau=1) = 0.4166667
    logprob, adv, mask = (
        T([[-1.0, -2.0], [-0.5, -9.0]]),
        T([[1.0, 1.0], [-1.0, -1.0]]),
        T([[1, 1], [1, 0]]),
    )
    loss, _ = registry.get_policy_loss_fn("opmd")(logprob, logprob, adv, mask)
    close(loss, 0.4166667)


# ----------------------------------------------------------------------------- off-policy correction

# pi_prox / pi_behav per token: row0 [0.5/0.5, 0.2/0.4] = [1, 0.5]; row1 [0.9/0.3, 0.3/0.03]
# = [3, 10], the 10 off the mask (it must not reach any metric).
PROX, BEHAV = _logs([[0.5, 0.2], [0.9, 0.3]]), _logs([[0.5, 0.4], [0.3, 0.03]])
CMASK = T([[1, 1], [1, 0]])


@pytest.mark.parametrize(
    "mode, args, weights, weight_mean, capped_frac",
    [
        ("none", {}, [[1, 1], [1, 1]], 1.0, 0.0),
        # min(r, 2): [1, 0.5 | 2]; mean (1 + 0.5 + 2)/3 = 1.1666667; the 3 is truncated: 1/3
        ("tis", {"rollout_is_threshold": 2.0}, [[1, 0.5], [2, 2]], 3.5 / 3, 1 / 3),
        # r unbounded: mean (1 + 0.5 + 3)/3 = 1.5, nothing dropped
        ("decoupled", {}, [[1, 0.5], [3, 10]], 1.5, 0.0),
        # r > 2 dropped (weight 0): [1, 0.5 | 0]; mean 1.5/3 = 0.5; 1/3 dropped
        ("decoupled", {"behav_imp_weight_cap": 2.0}, [[1, 0.5], [0, 0]], 0.5, 1 / 3),
    ],
)
def test_correction_weights_and_metrics(mode, args, weights, weight_mean, capped_frac):
    w, sums = correction_weights(
        PROX, BEHAV, CMASK, mode=mode, **{"rollout_is_threshold": 2.0, **args}
    )
    close(w, weights, tol=1e-5)
    m = sums.metrics()
    close(m[IS_RATIO_MEAN], 1.5)  # (1 + 0.5 + 3)/3: the raw ratio, before truncation
    close(m[IS_RATIO_MAX], 3.0)
    close(m[IS_WEIGHT_MEAN], weight_mean)
    close(m[IS_CAPPED_FRAC], capped_frac)


def test_correction_sums_merge_over_ranks():
    # rank A: 3 tokens, ratios sum 4.5, max 3, 1 capped; rank B: 1 token, ratio 0.5
    a = correction_weights(PROX, BEHAV, CMASK, mode="tis", rollout_is_threshold=2.0)[1]
    b = correction_weights(PROX, BEHAV, T([[0, 1], [0, 0]]), mode="tis", rollout_is_threshold=2.0)[
        1
    ]
    a.merge(b)
    m = a.metrics()
    close(m[IS_RATIO_MEAN], 5.0 / 4)
    close(m[IS_RATIO_MAX], 3.0)
    close(m[IS_CAPPED_FRAC], 0.25)
    assert CorrectionSums().metrics() == {}  # no counted token: no metric


def test_ppo_loss_multiplies_each_token_by_its_weight():
    # r = [1, 1, 1.5], A = [1, -1, 1], w = [2, 0.5, 3], clip 0.2:
    # per-token loss [-1, 1, max(-1.5, -1.2) = -1.2] -> weighted [-2, 0.5, -3.6]; mean -5.1/3 = -1.7
    logprob = _logs([[1.0, 1.0, 1.5]]).requires_grad_()
    adv, mask, w = T([[1.0, -1.0, 1.0]]), torch.ones(1, 3), T([[2.0, 0.5, 3.0]])
    fn = registry.get_policy_loss_fn("ppo")
    loss, m = fn(logprob, torch.zeros(1, 3), adv, mask, is_weights=w)
    close(loss, -1.7)
    close(m[CLIP_FRAC], 1 / 3)  # clipping is the ratio's, the weight does not change it
    loss.backward()
    # d(-A w r)/dlogprob / 3 = -A w r / 3 = [-2/3, 0.5/3]; the clipped token gets none
    close(logprob.grad, [[-2 / 3, 0.5 / 3, 0.0]])
    ones, _ = fn(logprob, torch.zeros(1, 3), adv, mask, is_weights=torch.ones(1, 3))
    close(ones, fn(logprob, torch.zeros(1, 3), adv, mask)[0])  # weight 1 is today's loss


def test_decoupled_ppo_clips_around_the_proximal_policy_and_weights_by_behaviour():
    # AReaL's loss on one token: behaviour 0.25, proximal 0.5 -> w = 2; current 0.6 -> r = 1.2
    # (around the proximal 0.5, not the behaviour 0.25, which would give 2.4 and clip);
    # A = +1, clip 0.1: max(-1.2, -1.1) = -1.1 (clipped); weighted -2.2
    from rft.config.schema import RolloutCorrectionConfig
    from rft.trainer.algorithm import get_correction_fn

    correct = get_correction_fn(RolloutCorrectionConfig(mode="decoupled", behav_imp_weight_cap=5.0))
    w, _ = correct(_logs([[0.5]]), _logs([[0.25]]), torch.ones(1, 1))
    loss, _ = registry.get_policy_loss_fn("ppo", {"clip_range": 0.1})(
        _logs([[0.6]]), _logs([[0.5]]), T([[1.0]]), torch.ones(1, 1), is_weights=w
    )
    close(loss, -2.2)
    assert get_correction_fn(RolloutCorrectionConfig()) is None  # mode none: no weights


def test_weights_reach_gspo_opmd_and_only_chord_rollout_rows():
    # gspo, ratio 1, A = [1, 1], w = [2, 4]: per-token -A w = [-2, -4]; seq-mean-token-mean -3
    loss, _ = registry.get_policy_loss_fn("gspo")(
        torch.zeros(1, 2),
        torch.zeros(1, 2),
        T([[1.0, 1.0]]),
        torch.ones(1, 2),
        is_weights=T([[2.0, 4.0]]),
    )
    close(loss, -3.0)
    # opmd: -A lp w = [1 * 0.5, 2 * 2] -> mean 2.25, / (1 + tau=1) = 1.125
    loss, _ = registry.get_policy_loss_fn("opmd")(
        T([[-1.0, -2.0]]), None, T([[1.0, 1.0]]), torch.ones(1, 2), is_weights=T([[0.5, 2.0]])
    )
    close(loss, 1.125)
    # CHORD (as test_mix_chord_...): rollout row weighted 0.5 -> ppo -1; expert row ignores its 100
    logprob = T([[0.0, 0.0], [math.log(0.5), math.log(0.5)]])
    loss, _ = registry.get_policy_loss_fn("mix_chord")(
        logprob,
        torch.zeros(2, 2),
        T([[2.0, 2.0], [0.0, 0.0]]),
        torch.ones(2, 2),
        step=0,
        expert_mask=T([False, True]),
        is_weights=T([[0.5, 0.5], [100.0, 100.0]]),
    )
    close(loss, 0.9 * -1.0 + 0.01732868)


def test_is_weights_come_from_the_trainer_not_the_config():
    with pytest.raises(ConfigError, match="is_weights"):
        registry.get_policy_loss_fn("ppo", {"is_weights": 1.0})


# ----------------------------------------------------------------------------- KL and entropy


def test_kl_variants_on_known_values():
    # pi = 0.5, pi_ref = 0.25: d = log pi - log pi_ref = ln 2 = 0.6931472
    lp, ref, mask = T([[math.log(0.5), -1.0]]), T([[math.log(0.25), 0.0]]), T([[1, 0]])
    expected = {
        "none": 0.0,
        "k1": 0.6931472,
        "abs": 0.6931472,
        "k2": 0.2402265,  # 0.5 * ln2^2
        "k3": 0.1931472,  # r = pi_ref/pi = 0.5: r - 1 - log r = 0.5 - 1 + ln2
        "low_var_kl": 0.1931472,
    }
    for name, value in expected.items():
        close(kl(name, lp, ref, mask), [[value, 0.0]])
    # k1 is negative where pi < pi_ref, abs is not: d = -ln2
    close(kl("k1", ref, lp, mask)[0, 0], -0.6931472)
    close(kl("abs", ref, lp, mask)[0, 0], 0.6931472)


def test_low_var_kl_is_clamped_k3_is_not():
    lp, ref, mask = T([[-30.0]]), T([[0.0]]), T([[1]])
    close(kl("low_var_kl", lp, ref, mask), [[10.0]])
    assert kl("k3", lp, ref, mask).item() > 1e12  # e^30 - 31


def test_kl_loss_and_penalty_scale_by_kl_coef():
    lp, ref, mask = (
        T([[math.log(0.5), math.log(0.5)]]),
        T([[math.log(0.25), math.log(0.5)]]),
        T([[1, 1]]),
    )
    loss, m = registry.get_kl_loss_fn("k1", {"kl_coef": 0.1})(lp, ref, mask)
    close(loss, 0.1 * 0.6931472 / 2)  # token-mean of [ln2, 0], times 0.1
    rewards, m = registry.get_kl_penalty_fn("k1", {"kl_coef": 0.1})(T([[0.0, 1.0]]), lp, ref, mask)
    close(rewards, [[-0.06931472, 1.0]])


def test_entropy_of_uniform_is_log_vocab_and_known_distribution():
    close(token_entropy(torch.zeros(2, 3, 7)), torch.full((2, 3), math.log(7)))
    # p = [0.5, 0.25, 0.25]: H = 0.5 ln2 + 2 * 0.25 ln4 = 1.0397208
    logits = torch.log(T([[[0.5, 0.25, 0.25]]])) + 3.0  # a shift must not matter
    close(token_entropy(logits), [[1.0397208]])


def test_entropy_loss_default_and_none():
    entropy, mask = T([[1.0, 2.0], [3.0, 8.0]]), T([[1, 1], [1, 0]])
    loss, m = registry.get_entropy_loss_fn("default", {"entropy_coef": 0.01})(entropy, mask)
    close(loss, -0.02)  # -0.01 * mean(1, 2, 3)
    close(m[ENTROPY], 2.0)
    loss, _ = registry.get_entropy_loss_fn("none")(entropy, mask)
    close(loss, 0.0)


def test_token_logprobs_and_entropy_at_a_sampling_temperature():
    # logits [2 ln2, 0]: T=1 -> softmax [0.8, 0.2], log 0.8 = -0.2231436;
    # T=2 -> [ln2, 0] -> [2/3, 1/3]: log(2/3) = -0.4054651, entropy ln3 - (2/3) ln2 = 0.6365142
    logits, label = T([[[2 * math.log(2.0), 0.0]]]), torch.zeros(1, 1, dtype=torch.long)
    close(token_logprobs(logits, label), [[-0.2231436]])
    close(token_logprobs(logits, label, temperature=2.0), [[-0.4054651]])
    close(token_entropy(logits, temperature=2.0), [[0.6365142]])
    close(
        token_logprobs(logits.bfloat16(), label, temperature=2.0, max_chunk_elems=1),
        [[-0.4054651]],
        tol=2e-3,
    )


def test_a_temperature_per_row_scores_each_row_at_its_own():
    # Row 0 at T=2, row 1 at T=1, on the same logits [2 ln2, 0]: log(2/3) and log 0.8, chunked
    # one position at a time (chunks cross rows); entropy ln3 - (2/3) ln2, and at T=1
    # -(0.8 ln 0.8 + 0.2 ln 0.2) = 0.5004024.
    logits = T([[[2 * math.log(2.0), 0.0]] * 2] * 2)  # [2, 2, 2]
    labels = torch.zeros(2, 2, dtype=torch.long)
    temps = T([2.0, 1.0])
    for chunk in (1, 1 << 20):
        close(
            token_logprobs(logits, labels, temperature=temps, max_chunk_elems=chunk),
            [[-0.4054651] * 2, [-0.2231436] * 2],
        )
        close(
            token_entropy(logits, temperature=temps, max_chunk_elems=chunk),
            [[0.6365142] * 2, [0.5004024] * 2],
        )


def test_chunked_token_logprobs_and_entropy_match_naive():
    torch.manual_seed(0)
    logits = (torch.randn(2, 5, 11) * 4).requires_grad_()
    labels = torch.randint(0, 11, (2, 5))
    chunked = token_logprobs(logits, labels, max_chunk_elems=33)  # 3 rows per chunk, 10 rows
    naive = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    close(chunked, naive, tol=1e-5)
    (grad_chunked,) = torch.autograd.grad(chunked.sum(), logits)
    (grad_naive,) = torch.autograd.grad(naive.sum(), logits)
    close(grad_chunked, grad_naive, tol=1e-5)
    probs = torch.softmax(logits, -1)
    close(token_entropy(logits, max_chunk_elems=33), -(probs * torch.log(probs)).sum(-1), tol=1e-5)
    bf16 = token_logprobs(logits.detach().bfloat16(), labels)
    assert bf16.dtype == torch.float32
    close(bf16, naive.detach(), tol=0.15)  # bf16 logits carry ~3 significant digits
    assert token_logprobs(torch.zeros(0, 4, 3), torch.zeros(0, 4, dtype=torch.long)).shape == (0, 4)


# ----------------------------------------------------------------------------- names and args


def test_unknown_arg_names_the_arg_and_the_valid_ones():
    with pytest.raises(ConfigError) as e:
        registry.get_policy_loss_fn("ppo", {"clip_ratio": 0.2})
    msg = str(e.value)
    assert "clip_ratio" in msg and "clip_range_low" in msg and "policy_loss_fn_args" in msg
    with pytest.raises(ConfigError, match="std_threshold"):
        registry.get_advantage_fn("grpo", {"std_treshold": 0.1})


def test_unknown_name_and_bad_values():
    with pytest.raises(ConfigError, match="Did you mean 'grpo'"):
        registry.get_advantage_fn("gpro")
    with pytest.raises(ConfigError, match="clip_ratio_c"):
        registry.get_policy_loss_fn("ppo", {"clip_ratio_c": 0.5})
    with pytest.raises(ConfigError, match="loss_agg_mode"):
        registry.get_policy_loss_fn("ppo", {"loss_agg_mode": "token_mean"})
    with pytest.raises(ConfigError, match="opmd_baseline"):
        registry.get_advantage_fn("opmd", {"opmd_baseline": "max"})
    with pytest.raises(ConfigError, match="step"):
        registry.get_policy_loss_fn("mix_chord", {"step": 3})  # trainer context, not config
    with pytest.raises(ConfigError, match="seq-mean-token-mean"):
        registry.check_loss_agg_mode("seq-mean-token-men")


def test_valid_args_lists_config_arguments():
    assert registry.valid_args("advantage_fn", "grpo") == [
        "epsilon",
        "std_threshold",
        "std_normalize",
        "std_cal_level",
        "rank_penalty",
        "duplicate_experiences",
    ]
    assert registry.valid_args("kl_loss_fn", "k3") == ["loss_agg_mode", "kl_coef"]
    assert "mu_peak" in registry.valid_args("policy_loss_fn", "mix_chord")


def test_call_time_loss_agg_mode_overrides_the_bound_one():
    fn = registry.get_policy_loss_fn("sft", {"loss_agg_mode": "seq-mean-token-mean"})
    logprob, mask = T([[-1.0, -2.0], [-3.0, 0.0]]), T([[1, 1], [1, 0]])
    close(fn(logprob, None, None, mask, loss_agg_mode="token-mean")[0], 2.0)


@pytest.mark.parametrize(
    "kind, declared, registry",
    [
        ("advantage_fn", names.ADVANTAGE_FN_NAMES, registry.ADVANTAGE_FNS),
        ("policy_loss_fn", names.POLICY_LOSS_FN_NAMES, POLICY_LOSS_FNS),
        ("kl_loss_fn", names.KL_FN_NAMES, KL_FNS),
        ("entropy_loss_fn", names.ENTROPY_LOSS_FN_NAMES, ENTROPY_LOSS_FNS),
        ("loss_agg_mode", names.LOSS_AGG_MODES, LOSS_AGG_MODES),
    ],
)
def test_config_accepts_exactly_the_declared_names(kind, declared, registry):
    """The config schema and the registries read one declaration (rft.config.names)."""
    import typing

    from rft.config.load import config_from_dict
    from rft.config.schema import AlgorithmConfig

    accepted = typing.get_args(typing.get_args(typing.get_type_hints(AlgorithmConfig)[kind])[0])
    assert accepted == declared
    assert set(registry) == set(declared) - (
        names.NEEDS_CRITIC if kind == "advantage_fn" else set()
    )
    base = {
        "model": {"model_path": "/m"},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 2},
        "buffer": {"explorer_input": {"taskset": {"path": "/d"}}},
    }
    with pytest.raises(ConfigError, match="Did you mean"):
        config_from_dict({**base, "algorithm": {**base["algorithm"], kind: declared[0] + "x"}})


def test_token_level_rewards_then_kl_penalty_feed_reinforceplusplus():
    # reward 1 on the last response token (index 1 of row 0); k1 penalty 0.1 * [ln2, 0] on row 0
    mask = T([[1, 1, 0], [1, 1, 1]])
    token_rewards = token_level_rewards(T([1.0, 0.0]), mask)
    close(token_rewards, [[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    ref = T(
        [[math.log(0.5), 0.0, 0.0], [0.0, 0.0, 0.0]]
    )  # k1 = log pi - log pi_ref = 0 - ln(0.5) = ln2
    penalised, _ = registry.get_kl_penalty_fn("k1", {"kl_coef": 0.1})(
        token_rewards, torch.zeros(2, 3), ref, mask
    )
    close(penalised, [[-0.06931472, 1.0, 0.0], [0.0, 0.0, 0.0]])
    adv, _ = registry.get_advantage_fn("reinforceplusplus")(penalised, [0, 1], mask)
    assert adv[0, 2] == 0.0 and adv.shape == (2, 3)
