"""Policy losses of the form agg(-sg(w) * A * logprob): a detached per-token weight w (a clipped,
gated or masked importance ratio) times the REINFORCE term, Trinity-RFT's topr, cispo, sapo,
sppo and rec (pure torch). Data in/out as :mod:`rft.algo.losses`: ``[B, L]`` tensors of one
micro-batch -> (0-dim loss, metrics). ``WEIGHTED_PG_LOSSES`` maps the names to the functions;
every one honours ``loss_agg_mode`` (the trainer scales micro-batches by it).
"""

from __future__ import annotations

from typing import Callable

import torch

from rft.algo.losses import (
    CLIP_FRAC,
    MAX_LOG_RATIO,
    PPO_KL,
    LossOut,
    aggregate,
    masked_mean,
)

RATIO_MEAN = "ratio_mean"  # masked mean of pi/pi_old over the counted tokens
WEIGHT_MEAN = "weight_mean"  # masked mean of the detached per-token weight w
REC_CLIP_MODES = ("none", "one-side", "gspo-one-side", "two-side", "ring")
REC_WEIGHTS = ("none", "importance_sampling", "gspo_importance_sampling", "advantage")
REC_REGULARIZERS = ("none", "k2", "forward-kl")


def _log_ratio(logprob: torch.Tensor, old_logprob: torch.Tensor) -> torch.Tensor:
    """log(pi/pi_old) ``[B, L]``, detached and clamped so exp() cannot overflow."""
    return (logprob - old_logprob).detach().clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)


def _weighted_pg(
    weight: torch.Tensor,
    advantages: torch.Tensor,
    logprob: torch.Tensor,
    mask: torch.Tensor,
    loss_agg_mode: str,
    ratio: torch.Tensor,
    old_logprob: torch.Tensor,
) -> LossOut:
    """agg(-w * A * logprob) and the metrics every loss here shares."""
    mask_f = mask.to(logprob.dtype)
    loss = aggregate(-weight.detach() * advantages * logprob, mask, loss_agg_mode)
    return loss, {
        WEIGHT_MEAN: masked_mean(weight, mask_f).item(),
        RATIO_MEAN: masked_mean(ratio, mask_f).item(),
        PPO_KL: masked_mean(-(logprob - old_logprob).detach(), mask_f).item(),
    }


def topr_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    step: int = 0,
    expert_mask: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
    advantage_threshold: float = 0.0,
) -> LossOut:
    """TOPR (trinity/algorithm/policy_loss_fn/topr_policy_loss.py, arXiv 2503.14286): w = 1
    where A > ``advantage_threshold`` (keep pushing good responses up at full weight), else
    w = clip(pi/pi_old, 0, 1) (truncated importance sampling for the rest)."""
    ratio = torch.exp(_log_ratio(logprob, old_logprob))  # [B, L]
    weight = torch.where(
        advantages <= advantage_threshold, ratio.clamp(0.0, 1.0), torch.ones_like(ratio)
    )  # [B, L]
    return _weighted_pg(weight, advantages, logprob, mask, loss_agg_mode, ratio, old_logprob)


def cispo_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    step: int = 0,
    expert_mask: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
    clip_range_low: float | None = 1.0,
    clip_range_high: float | None = 0.28,
    enable_mask_clip: bool = False,
    mask_clip_range_low: float = 1.0,
    mask_clip_range_high: float = 0.28,
) -> LossOut:
    """CISPO (trinity/algorithm/policy_loss_fn/cispo_policy_loss.py, arXiv 2506.13585): w =
    clip(pi/pi_old, 1 - low, 1 + high) (the weight is clipped, the token keeps its gradient);
    with ``enable_mask_clip`` w = 0 where the ratio left [1 - mask_low, 1 + mask_high] in the
    advantage's direction. Defaults (low 1, high 0.28) as the paper: no lower bound."""
    low = 1.0 if clip_range_low is None else clip_range_low
    high = 0.28 if clip_range_high is None else clip_range_high
    ratio = torch.exp(_log_ratio(logprob, old_logprob))  # [B, L]
    weight = ratio.clamp(1.0 - low, 1.0 + high)  # [B, L]
    if enable_mask_clip:
        off = ((ratio > 1.0 + mask_clip_range_high) & (advantages > 0)) | (
            (ratio < 1.0 - mask_clip_range_low) & (advantages < 0)
        )  # [B, L]
        weight = torch.where(off, torch.zeros_like(weight), weight)
    loss, metrics = _weighted_pg(
        weight, advantages, logprob, mask, loss_agg_mode, ratio, old_logprob
    )
    zeroed = (weight == 0).to(logprob.dtype)  # [B, L]
    metrics["masked_frac"] = masked_mean(zeroed, mask.to(logprob.dtype)).item()
    return loss, metrics


def sapo_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    step: int = 0,
    expert_mask: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> LossOut:
    """SAPO (trinity/algorithm/policy_loss_fn/sapo_policy_loss.py, arXiv 2511.20347): a soft
    gate instead of a hard clip, w = sigmoid(tau (r - 1)) * 4 / tau, tau = ``tau_pos`` where
    A > 0 else ``tau_neg`` (>= tau_pos: negative updates fade faster). At r = 1, w = 2 / tau
    (Trinity's scale, kept: it multiplies the learning rate)."""
    ratio = torch.exp(_log_ratio(logprob, old_logprob))  # [B, L]
    tau = torch.where(
        advantages > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg)
    )  # [B, L]
    weight = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)  # [B, L]
    return _weighted_pg(weight, advantages, logprob, mask, loss_agg_mode, ratio, old_logprob)


def sppo_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    step: int = 0,
    expert_mask: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
    epsilon: float = 0.3,
) -> LossOut:
    """sPPO (trinity/algorithm/policy_loss_fn/sppo_loss_fn.py, arXiv 2108.05828):
    agg(-A * log(pi/pi_old) * 1[1/(1+eps) <= pi/pi_old <= 1+eps]): tokens whose ratio left the
    (log-symmetric) trust region give no gradient. Its value is 0 on-policy; the gradient is
    the REINFORCE one on the in-range tokens."""
    ratio = torch.exp(_log_ratio(logprob, old_logprob))  # [B, L]
    in_range = ((ratio >= 1.0 / (1.0 + epsilon)) & (ratio <= 1.0 + epsilon)).to(logprob.dtype)
    mask_f = mask.to(logprob.dtype)
    loss = aggregate(-advantages * (logprob - old_logprob) * in_range, mask, loss_agg_mode)
    return loss, {
        CLIP_FRAC: masked_mean(1.0 - in_range, mask_f).item(),
        RATIO_MEAN: masked_mean(ratio, mask_f).item(),
        PPO_KL: masked_mean(-(logprob - old_logprob).detach(), mask_f).item(),
    }


def _rec_in_range(
    ratio: torch.Tensor,
    seq_ratio: torch.Tensor,
    advantages: torch.Tensor,
    clip_mode: str,
    low: float,
    high: float,
    low_prime: float,
    high_prime: float,
) -> torch.Tensor:
    """REC's bool ``[B, L]`` of the tokens that keep their gradient under ``clip_mode``."""
    up, down = advantages >= 0, advantages <= 0
    if clip_mode == "two-side":
        return (ratio >= 1 - low) & (ratio <= 1 + high)
    if clip_mode == "one-side":
        return (up & (ratio <= 1 + high)) | (down & (ratio >= 1 - low))
    if clip_mode == "gspo-one-side":
        return (up & (seq_ratio <= 1 + high)) | (down & (seq_ratio >= 1 - low))
    if clip_mode == "ring":
        inner = (ratio >= 1 - low) & (ratio <= 1 + high)
        return inner | (up & (ratio <= 1 - low_prime)) | (down & (ratio >= 1 + high_prime))
    return torch.ones_like(ratio, dtype=torch.bool)


def rec_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    step: int = 0,
    expert_mask: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    epsilon_low_prime: float = 0.6,
    epsilon_high_prime: float = 2.0,
    clip_mode: str = "none",
    weight: str = "none",
    regularizer: str = "none",
    regularizer_coef: float = 0.0,
    temp: float = 1.0,
) -> LossOut:
    """REC (trinity/algorithm/policy_loss_fn/rec_policy_loss.py; defaults its default_args):
    agg(-A' * logprob * in_range) + regulariser. ``clip_mode`` picks in_range from the token
    ratio r (none, one-side, two-side, ring) or the sequence ratio exp(mean log r)
    (gspo-one-side); ``weight``: A' = A (none), A r (importance_sampling), A s
    (gspo_importance_sampling), A exp(A / temp) (advantage); ``regularizer``: + coef (log r)^2
    (k2) or - coef logprob (forward-kl). Trinity forces seq-mean-token-mean for gspo-one-side;
    here the run's ``loss_agg_mode`` always applies."""
    log_ratio = _log_ratio(logprob, old_logprob)  # [B, L]
    ratio = torch.exp(log_ratio)  # [B, L]
    mask_f = mask.to(logprob.dtype)
    seq_log = (log_ratio * mask_f).sum(-1) / mask_f.sum(-1).clamp(min=1)  # [B]
    seq_ratio = torch.exp(seq_log).unsqueeze(-1)  # [B, 1]
    in_range = _rec_in_range(
        ratio,
        seq_ratio,
        advantages,
        clip_mode,
        epsilon_low,
        epsilon_high,
        epsilon_low_prime,
        epsilon_high_prime,
    )  # [B, L]
    weighted = {
        "none": advantages,
        "importance_sampling": advantages * ratio,
        "gspo_importance_sampling": advantages * seq_ratio,
        "advantage": advantages * torch.exp(advantages / temp),
    }[weight]  # [B, L]
    per_token = -weighted * logprob * in_range.to(logprob.dtype)  # [B, L]
    if regularizer == "forward-kl":
        per_token = per_token - regularizer_coef * logprob
    elif regularizer == "k2":  # Kimi's 1/2 absorbed into the coefficient, as Trinity
        per_token = per_token + regularizer_coef * (logprob - old_logprob).square()
    loss = aggregate(per_token, mask, loss_agg_mode)
    return loss, {
        CLIP_FRAC: masked_mean((~in_range).to(logprob.dtype), mask_f).item(),
        RATIO_MEAN: masked_mean(ratio, mask_f).item(),
        PPO_KL: masked_mean(-log_ratio, mask_f).item(),
    }


WEIGHTED_PG_LOSSES: dict[str, Callable[..., LossOut]] = {
    "topr": topr_loss,
    "cispo": cispo_loss,
    "sapo": sapo_loss,
    "sppo": sppo_loss,
    "rec": rec_loss,
}
