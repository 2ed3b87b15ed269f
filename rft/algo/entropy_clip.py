"""Clip-B (Trinity's ``advantage_fn: clipb``, "On the Entropy Dynamics in Reinforcement
Fine-Tuning of Large Language Models", arXiv 2602.03392): GRPO's advantages, then a token
filter that drops from the loss the negative-advantage tokens whose entropy signal
``S = p (H + log p)`` lies far below the batch's mean.

Data in: the rollout rows' advantages, loss mask, rollout log-probs (``log p`` of each sampled
token, vLLM's) and the policy's per-token entropy ``H`` before the update (the trainer's
old-log-prob pass), each ``[B, R]``. Data out: the mask of kept tokens ``[B, R]`` and metrics.
Pure tensor math; the trainer applies the mask (:mod:`rft.trainer.step`).
"""

from __future__ import annotations

import torch

from rft.algo.advantages import AdvantageOut, GroupIds, grpo_advantages

CLIPB_MU = 2.5  # Trinity's default: how many standard deviations below the mean S is clipped
STD_FLOOR = 1e-12  # below this spread of S every token is kept (as Trinity)


def clipb_advantages(
    rewards: torch.Tensor,
    group_ids: GroupIds,
    mask: torch.Tensor,
    *,
    epsilon: float = 1e-6,
    mu: float = CLIPB_MU,
) -> AdvantageOut:
    """The advantages of Clip-B: GRPO's, (r_i - mean_g) / (std_g + epsilon), a group of one
    having mean 0 and std 1. ``mu`` is the token filter's (:func:`clipb_keep`), applied by the
    trainer with the entropies of its old-log-prob pass."""
    del mu
    return grpo_advantages(rewards, group_ids, mask, epsilon=epsilon)


def clipb_keep(
    advantages: torch.Tensor,
    mask: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    entropy: torch.Tensor,
    *,
    mu: float = CLIPB_MU,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The tokens Clip-B keeps ``[B, R]`` (0/1, within ``mask``) and its metrics.

    ``S = exp(lp) * (H + lp)`` per token; its mean and population std over the masked tokens of
    the whole batch; a token with a negative advantage is dropped when ``S - mean < -mu * std``;
    tokens with a positive or zero advantage are all kept; every token is kept when the std is
    below :data:`STD_FLOOR`.
    """
    m = mask.float()  # [B, R]
    lp = rollout_logprobs.float()
    s = lp.exp() * (entropy.float() + lp)  # [B, R]
    n = m.sum().clamp(min=1.0)
    mean = (s * m).sum() / n
    var = ((s - mean) ** 2 * m).sum() / n
    std = var.sqrt()
    adv = advantages.float()
    if float(std) < STD_FLOOR:
        keep = torch.ones_like(m)
    else:
        clipped = (adv < 0) & (s - mean < -(mu * std))  # [B, R]
        keep = (~clipped).float()
    kept = m * keep  # [B, R]
    pos, neg = (adv > 0).float() * m, (adv < 0).float() * m
    metrics = {
        "clipb_frac_clipped": 1.0 - float(kept.sum() / n),
        "clipb_frac_clipped_pos": 1.0 - float((kept * pos).sum() / pos.sum().clamp(min=1.0)),
        "clipb_frac_clipped_neg": 1.0 - float((kept * neg).sum() / neg.sum().clamp(min=1.0)),
        "clipb_signal_mean": float(mean),
        "clipb_signal_var": float(var),
    }
    return kept, metrics
