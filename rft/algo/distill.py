"""On-policy distillation (pure torch): a teacher's per-token log-probs of the student's own
samples -> token-level advantages, and the plain importance-sampling loss Trinity pairs them with.

Data in: ``old_logprobs`` (the student's, ``[B, L]``), ``teacher_logprobs`` ``[B, L]`` (the
explorer's teacher pass, :mod:`rft.explorer.teacher`) and ``mask`` ``[B, L]``. Data out:
``(advantages [B, L], metrics)``, zero off the mask; rewards are not used.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from rft.algo.losses import MAX_LOG_RATIO, PPO_KL, LossOut, aggregate, masked_mean
from rft.algo.weighted_pg import RATIO_MEAN

Metrics = dict[str, float]
AdvantageOut = tuple[torch.Tensor, Metrics]


def _row_stats(per_token: torch.Tensor, mask: torch.Tensor, name: str) -> Metrics:
    """Mean and std over the rows of each row's masked token sum (Trinity's ``<name>/mean``)."""
    sums = (per_token * mask).sum(dim=-1)  # [B]
    std = float(sums.std()) if sums.numel() > 1 else 0.0
    return {f"{name}_mean": float(sums.mean()) if sums.numel() else 0.0, f"{name}_std": std}


def on_policy_distill_advantages(
    rewards: torch.Tensor,
    group_ids: object,
    mask: torch.Tensor,
    *,
    old_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    kl_coef: float = 1.0,
) -> AdvantageOut:
    """A_t = kl_coef * (log p_teacher(y_t) - log p_student(y_t)): the negative reverse-KL
    estimate per token (trinity/algorithm/advantage_fn/on_policy_distill_advantage.py)."""
    mask = mask.float()
    gap = teacher_logprobs.float() - old_logprobs.float()  # [B, L]
    advantages = kl_coef * gap * mask  # [B, L]
    return advantages, _row_stats(-gap, mask, "distill_kl")


def jsd_per_token(
    student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, lambda_coef: float
) -> torch.Tensor:
    """Trinity's per-token JSD of the sampled token ``[B, L]``
    (agentscope-ai/Trinity-RFT trinity/algorithm/advantage_fn/jsd_advantage.py): with
    m = lambda * p_t + (1 - lambda) * p_s, JSD = lambda * p_t (log p_t - log m) +
    (1 - lambda) * p_s (log p_s - log m); 0 when lambda is 0 or 1 (one distribution only)."""
    if lambda_coef <= 0 or lambda_coef >= 1:
        return torch.zeros_like(student_logprobs, dtype=torch.float32)
    s, t = student_logprobs.float(), teacher_logprobs.float()
    log_m = torch.logsumexp(
        torch.stack([s + math.log(1 - lambda_coef), t + math.log(lambda_coef)]), dim=0
    )  # [B, L]
    kl_teacher = torch.exp(t) * (t - log_m)
    kl_student = torch.exp(s) * (s - log_m)
    return lambda_coef * kl_teacher + (1 - lambda_coef) * kl_student  # [B, L]


def jsd_advantages(
    rewards: torch.Tensor,
    group_ids: object,
    mask: torch.Tensor,
    *,
    old_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    kl_coef: float = 1.0,
    lambda_coef: float = 0.5,
) -> AdvantageOut:
    """A_t = -kl_coef * JSD_t (:func:`jsd_per_token`): a token the teacher agrees with less
    is pushed down more."""
    mask = mask.float()
    jsd = jsd_per_token(old_logprobs, teacher_logprobs, lambda_coef)  # [B, L]
    return -kl_coef * jsd * mask, _row_stats(jsd, mask, "jsd")


def importance_sampling_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    is_weights: torch.Tensor | None = None,
) -> LossOut:
    """loss = agg(-A * r), r = exp(logprob - old_logprob) unclipped (its log clamped to +-20);
    trinity/algorithm/policy_loss_fn/importance_sampling_policy_loss.py. ``is_weights``
    (rollout correction) multiply the per-token loss, as in every rft loss."""
    log_ratio = (logprob - old_logprob).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # [B, L]
    ratio = torch.exp(log_ratio)  # [B, L]
    loss_mat = -advantages * ratio  # [B, L]
    if is_weights is not None:
        loss_mat = loss_mat * is_weights.detach().to(loss_mat.dtype)
    mask_f = mask.to(ratio.dtype)
    metrics = {
        RATIO_MEAN: masked_mean(ratio.detach(), mask_f).item(),
        PPO_KL: masked_mean(-log_ratio.detach(), mask_f).item(),
    }
    return aggregate(loss_mat, mask, loss_agg_mode), metrics


# advantage_fn names that read the teacher's log-probs (rft.config.names.NEEDS_TEACHER).
DISTILL_ADVANTAGE_FNS: dict[str, Callable[..., AdvantageOut]] = {
    "on_policy_distill": on_policy_distill_advantages,
    "jsd": jsd_advantages,
}
DISTILL_LOSSES: dict[str, Callable[..., LossOut]] = {
    "importance_sampling": importance_sampling_loss,
}
