"""M2PO (second-moment trust policy optimisation, https://openreview.net/forum?id=IIgl5MWelz):
the token keep-mask and the masked policy loss, pure torch.

Follows agentscope-ai/Trinity-RFT trinity/algorithm/policy_loss_fn/m2po_policy_loss.py. The mask
is a function of a whole optimizer mini-batch (all micro-batches, all ranks): the trainer
(``rft.trainer.m2po``) gathers the trust-region values and calls :func:`dropped_by_m2`; the loss
takes the finished mask and never builds one from its micro-batch alone.
"""

from __future__ import annotations

import torch

from rft.algo.losses import PPO_KL, LossOut, aggregate, masked_mean

M2_THRESHOLD = 0.04  # the paper's bound on the mean squared log-ratio of kept trust-region tokens
LOG_RATIO_CLIP = 20.0  # |log ratio| bound of the forward value (exp stays finite)

# Metrics of the mask, one value per optimizer mini-batch (Trinity logs them as actor/m2po/*).
M2_BEFORE = "m2po/m2_before"  # mean squared log-ratio over the trust-region tokens
M2_AFTER = "m2po/m2_after"  # the same over the trust-region tokens kept
MASKED_FRACTION = "m2po/masked_fraction"  # dropped tokens / all counted tokens
TRUST_REGION_FRACTION = "m2po/trust_region_fraction"  # trust-region tokens / all counted tokens
RATIO_MEAN = "m2po/ratio_mean"  # masked mean of pi / pi_behaviour over the counted tokens


def trust_region(
    log_ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``[B, L]`` bool: counted tokens where PPO's clip would act, i.e. the ratio moved the way
    the advantage pushes it (A > 0 and ratio > 1, or A < 0 and ratio < 1)."""
    up = (advantages > 0) & (log_ratio > 0)
    down = (advantages < 0) & (log_ratio < 0)
    return mask.bool() & (up | down)


def dropped_by_m2(values: torch.Tensor, threshold: float) -> torch.Tensor:
    """``[K]`` bool over the squared log-ratios ``values`` ``[K]`` of all the mini-batch's
    trust-region tokens: True for those dropped. The largest are dropped, one at a time, until
    the mean of the rest is <= ``threshold`` (Algorithm 1); of equal values the later go first.

    Sorted ascending, the prefix means never decrease, so the kept set is the longest prefix
    whose mean is within the threshold."""
    dropped = torch.zeros(values.shape, dtype=torch.bool, device=values.device)  # [K]
    if values.numel() == 0 or values.double().mean().item() <= threshold:
        return dropped
    ordered, order = torch.sort(values.double(), stable=True)  # [K] each
    counts = torch.arange(1, len(ordered) + 1, dtype=ordered.dtype, device=ordered.device)
    keep = int((torch.cumsum(ordered, 0) / counts <= threshold).sum().item())
    dropped[order[keep:]] = True
    return dropped


def mask_metrics(values: torch.Tensor, dropped: torch.Tensor, counted: int) -> dict[str, float]:
    """The mask's metrics from all trust-region values ``[K]``, their drop flags ``[K]`` and the
    number of counted tokens of the mini-batch (0 gives fractions 0)."""
    kept = values[~dropped]
    return {
        M2_BEFORE: float(values.double().mean()) if values.numel() else 0.0,
        M2_AFTER: float(kept.double().mean()) if kept.numel() else 0.0,
        MASKED_FRACTION: int(dropped.sum()) / counted if counted else 0.0,
        TRUST_REGION_FRACTION: values.numel() / counted if counted else 0.0,
    }


def m2po_mask(
    log_ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, threshold: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """The keep-mask ``[B, L]`` (bool, inside ``mask``) and metrics of a mini-batch held in one
    tensor; the trainer does the same over micro-batches and ranks."""
    region = trust_region(log_ratio, advantages, mask)  # [B, L]
    values = log_ratio.detach().float()[region].square()  # [K] in row-major order
    dropped = dropped_by_m2(values, threshold)  # [K]
    keep = mask.bool().clone()  # [B, L]
    keep[region] = ~dropped
    return keep, mask_metrics(values, dropped, int(mask.bool().sum()))


def m2po_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    m2po_mask: torch.Tensor | None = None,
    loss_agg_mode: str = "token-mean",
    m2_threshold: float = M2_THRESHOLD,
    log_ratio_clip: float = LOG_RATIO_CLIP,
    step: int = 0,
    expert_mask: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
) -> LossOut:
    """token-mean over ``mask`` of ``-A * ratio`` on the tokens ``m2po_mask`` keeps (0 on the
    dropped ones, which still count in the denominator: the paper's footnote 2).

    ``old_logprob`` is the behaviour policy's (the rollout's log-probs). The ratio's forward
    value uses the log-ratio clamped to +-``log_ratio_clip``, its gradient the unclamped one
    (a straight-through clamp: a huge ratio keeps its gradient). ``m2_threshold`` is the mask's
    (applied by the trainer before this call); ``loss_agg_mode`` must be token-mean (checked in
    ``rft.algo.registry``)."""
    assert m2po_mask is not None, "m2po needs the mini-batch's mask (rft.trainer.m2po)"
    assert is_weights is None, "a rollout correction with m2po is refused by rft.config.rules"
    log_ratio = logprob - old_logprob  # [B, L]
    clamped = log_ratio.clamp(-log_ratio_clip, log_ratio_clip)  # [B, L]
    straight = log_ratio + (clamped - log_ratio).detach()  # value clamped, gradient not
    ratio = torch.exp(straight)  # [B, L]
    per_token = torch.where(m2po_mask.bool(), -advantages * ratio, torch.zeros_like(ratio))
    loss = aggregate(per_token, mask, loss_agg_mode)
    mask_f = mask.to(ratio.dtype)
    return loss, {
        PPO_KL: masked_mean(-straight.detach(), mask_f).item(),
        RATIO_MEAN: masked_mean(ratio.detach(), mask_f).item(),
    }
