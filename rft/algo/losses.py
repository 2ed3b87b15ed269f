"""Policy, KL and entropy losses and their aggregation over tokens (pure torch, no rft imports).

Data in: per-token tensors ``[B, L]`` of one micro-batch (log-probs, advantages, a mask of the
tokens the loss counts). Data out: a 0-dim loss that carries the graph and a dict of Python-float
metrics under the names below. Registries map Trinity-RFT/veRL names to the functions;
``rft.algo.registry`` checks names and arguments. The policy loss's own value is named by the
trainer (``rft.monitor.POLICY_LOSS``), which this module must not import.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

Metrics = dict[str, float]
LossOut = tuple[torch.Tensor, Metrics]

# exp() of a log-ratio beyond this overflows float16/bfloat16 ratios into inf; veRL clamps too.
MAX_LOG_RATIO = 20.0

# Metric names the losses write (each defined here only; the trainer logs them as they come).
CLIP_FRAC = "pg_clipfrac"  # share of counted tokens where the clipped PPO term is the larger
CLIP_FRAC_LOWER = "pg_clipfrac_lower"  # share where the dual clip capped a negative advantage
PPO_KL = "ppo_kl"  # masked mean of log(pi_old / pi): how far the update moved from the old policy
SFT_LOSS = "sft_loss"  # negative log-likelihood of the SFT (expert) tokens
MU = "mu"  # mix_chord: the step's SFT weight (chord_mu)
OPMD_LOSS = "opmd_loss"  # opmd: agg(-A * logprob) / (1 + tau)
KL_LOSS = "kl_loss"  # agg(kl) before kl_coef, the KL term of the loss
KL_PENALTY = "kl_penalty"  # masked mean KL subtracted (times kl_coef) from the token rewards
KL_COEF = "kl_coef"  # the coefficient of either KL use
ENTROPY = "entropy"  # agg(entropy) of the policy over the counted tokens
ROLLOUT_PART = "usual/"  # mix_chord: prefix of the PPO part's metrics (rollout rows)
EXPERT_PART = "expert/"  # mix_chord: prefix of the SFT part's metrics (expert rows)
# mix_chord: the PPO part's loss before its (1 - mu) weight; the whole loss is the trainer's.
ROLLOUT_PART_LOSS = f"{ROLLOUT_PART}pg_loss"


# ----------------------------------------------------------------------------- aggregation


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over positions where ``mask`` is 1 (0 when the mask is empty)."""
    return (values * mask).sum() / mask.sum().clamp(min=1)


def _token_mean(loss_mat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_mean(loss_mat, mask)


def _seq_sums(loss_mat: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence token sums and the mask of sequences with at least one counted token."""
    sums = (loss_mat * mask).sum(dim=-1)  # [B]
    has_tokens = (mask.sum(dim=-1) > 0).to(loss_mat.dtype)  # [B]
    return sums, has_tokens


def _seq_mean_token_mean(loss_mat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    sums, has_tokens = _seq_sums(loss_mat, mask)
    per_seq = sums / mask.sum(dim=-1).clamp(min=1)  # [B]
    return masked_mean(per_seq, has_tokens)


def _seq_mean_token_sum(loss_mat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    sums, has_tokens = _seq_sums(loss_mat, mask)
    return masked_mean(sums, has_tokens)


def _seq_mean_token_sum_norm(loss_mat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # Dr.GRPO as veRL's agg_loss and Trinity: the TOTAL token sum (no mean over sequences)
    # divided by a constant, the padded response width L, not by each length or the row count.
    return (loss_mat * mask).sum() / mask.shape[-1]


LOSS_AGG_MODES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "token-mean": _token_mean,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum": _seq_mean_token_sum,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}


def aggregate(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean") -> torch.Tensor:
    """Reduce a per-token loss ``[B, L]`` to a scalar with ``mode`` (a ``LOSS_AGG_MODES`` key).

    token-mean: sum over all counted tokens / their count; seq-mean-token-mean: mean over
    sequences of each sequence's token mean; seq-mean-token-sum: mean over sequences of token
    sums; seq-mean-token-sum-norm: the sum over all counted tokens of the batch divided by ``L``
    (not a mean over sequences: ``ones(2, 4)`` gives 2). Sequences with no counted token are
    left out of the sequence means; an all-zero mask gives 0.
    """
    assert mode in LOSS_AGG_MODES, (
        f"unknown loss_agg_mode {mode!r} (validated in rft.algo.registry)"
    )
    mask = mask.to(loss_mat.dtype)  # [B, L]
    return LOSS_AGG_MODES[mode](loss_mat, mask)


# ----------------------------------------------------------------------------- policy losses


def _ratio_and_kl(
    logprob: torch.Tensor, old_logprob: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Importance ratio ``pi/pi_old`` ``[B, L]`` and the masked-mean k1 estimate of KL(old||new)."""
    log_ratio = (logprob - old_logprob).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # [B, L]
    ratio = torch.exp(log_ratio)  # [B, L]; exactly 1 where logprob == old_logprob
    ppo_kl = masked_mean(-log_ratio.detach(), mask.to(log_ratio.dtype))
    return ratio, ppo_kl


def _clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    low: float,
    high: float,
    clip_ratio_c: float | None,
) -> tuple[torch.Tensor, Metrics]:
    """Per-token PPO loss ``[B, L]`` with asymmetric clipping and optional dual clip.

    loss = max(-A * r, -A * clip(r, 1 - low, 1 + high)); for A < 0 the loss is further capped
    at -A * clip_ratio_c (dual clip: bounds the push-down of tokens whose ratio exploded).
    """
    mask_f = mask.to(ratio.dtype)
    unclipped = -advantages * ratio  # [B, L]
    clipped = -advantages * ratio.clamp(1.0 - low, 1.0 + high)  # [B, L]
    loss = torch.maximum(unclipped, clipped)  # [B, L]
    metrics = {CLIP_FRAC: masked_mean((clipped > unclipped).to(ratio.dtype), mask_f).item()}
    lower_frac = 0.0
    if clip_ratio_c is not None:
        cap = -advantages * clip_ratio_c  # [B, L]
        negative = advantages < 0  # [B, L]
        lower_frac = masked_mean(((loss > cap) & negative).to(ratio.dtype), mask_f).item()
        loss = torch.where(negative, torch.minimum(loss, cap), loss)  # [B, L]
    metrics[CLIP_FRAC_LOWER] = lower_frac
    return loss, metrics


def _weighted(loss_mat: torch.Tensor, is_weights: torch.Tensor | None) -> torch.Tensor:
    """Per-token loss ``[B, L]`` times the off-policy correction weights, when there are any."""
    return loss_mat if is_weights is None else loss_mat * is_weights.detach().to(loss_mat.dtype)


def _clip_bounds(
    clip_range: float | None,
    clip_range_low: float | None,
    clip_range_high: float | None,
    default: tuple[float, float],
) -> tuple[float, float]:
    """(low, high): each side's own arg if given, else ``clip_range`` if given, else ``default``."""
    low = clip_range_low if clip_range_low is not None else clip_range
    high = clip_range_high if clip_range_high is not None else clip_range
    return (default[0] if low is None else low), (default[1] if high is None else high)


def ppo_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    step: int = 0,
    expert_mask: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
    clip_range: float | None = 0.2,
    clip_range_low: float | None = None,
    clip_range_high: float | None = None,
    clip_ratio_c: float | None = 3.0,
) -> LossOut:
    """PPO clipped surrogate: ratio r = exp(logprob - old_logprob) per token, clipped to
    [1 - clip_range_low, 1 + clip_range_high] (each defaults to ``clip_range``), dual clip at
    ``clip_ratio_c`` (> 1, or None to disable) for negative advantages; the per-token loss is
    then multiplied by ``is_weights`` (off-policy correction), when given."""
    ratio, ppo_kl = _ratio_and_kl(logprob, old_logprob, mask)  # [B, L]
    low, high = _clip_bounds(clip_range, clip_range_low, clip_range_high, (0.2, 0.2))
    loss_mat, metrics = _clipped_surrogate(ratio, advantages, mask, low, high, clip_ratio_c)
    loss = aggregate(_weighted(loss_mat, is_weights), mask, loss_agg_mode)
    metrics[PPO_KL] = ppo_kl.item()
    return loss, metrics


def gspo_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_agg_mode: str = "seq-mean-token-mean",
    step: int = 0,
    expert_mask: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
    clip_range: float | None = None,
    clip_range_low: float | None = None,
    clip_range_high: float | None = None,
) -> LossOut:
    """GSPO: the ratio is per sequence, s = exp(mean over its tokens of log(pi/pi_old)),
    clipped to [1 - low, 1 + high], by default [1 - 3e-4, 1 + 4e-4] (a sequence ratio moves far
    less than a token ratio); ``clip_range`` sets both sides, ``clip_range_low/high`` one each. Written in the token form s_t = sg(s) * pi_t / sg(pi_t), whose value is s on
    every token and whose gradient equals the sequence-level one when advantages are constant
    along a sequence. No dual clip. ``is_weights`` multiply the per-token loss, as in ``ppo``."""
    mask_f = mask.to(logprob.dtype)
    log_ratio = logprob - old_logprob  # [B, L]
    seq_log_ratio = (log_ratio * mask_f).sum(-1) / mask_f.sum(-1).clamp(min=1)  # [B]
    seq_log_ratio = seq_log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    token_log_ratio = logprob - logprob.detach() + seq_log_ratio.detach().unsqueeze(-1)  # [B, L]
    ratio = torch.exp(token_log_ratio)  # [B, L]
    low, high = _clip_bounds(clip_range, clip_range_low, clip_range_high, (3e-4, 4e-4))
    loss_mat, metrics = _clipped_surrogate(ratio, advantages, mask, low, high, None)
    loss = aggregate(_weighted(loss_mat, is_weights), mask, loss_agg_mode)
    ppo_kl = masked_mean(-log_ratio.detach(), mask_f)
    metrics[PPO_KL] = ppo_kl.item()
    return loss, metrics


def sft_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor | None,
    advantages: torch.Tensor | None,
    mask: torch.Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    step: int = 0,
    expert_mask: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
) -> LossOut:
    """Negative log-likelihood of the masked tokens (``old_logprob``/``advantages``/``is_weights``
    unused: SFT rows are data, not samples)."""
    loss = aggregate(-logprob, mask, loss_agg_mode)
    return loss, {SFT_LOSS: loss.item()}


def _phi_sft_loss(logprob: torch.Tensor, mask: torch.Tensor, loss_agg_mode: str) -> LossOut:
    """CHORD-phi: NLL weighted per token by phi = p (1 - p), p = exp(logprob) (no gradient
    through phi), which down-weights tokens the model already finds certain or hopeless."""
    prob = torch.exp(logprob.detach())  # [B, L]
    loss = aggregate(-logprob * prob * (1.0 - prob), mask, loss_agg_mode)
    return loss, {SFT_LOSS: loss.item()}


def chord_mu(
    step: int, mu_warmup_steps: int, mu_decay_steps: int, mu_peak: float, mu_valley: float
) -> float:
    """CHORD's SFT weight at ``step``: linear from 0 to ``mu_peak`` over ``mu_warmup_steps``,
    cosine from ``mu_peak`` down to ``mu_valley`` over the next ``mu_decay_steps``, then
    ``mu_valley``. With no warm-up and no decay it is ``mu_valley`` from step 0."""
    if step < mu_warmup_steps:
        return mu_peak * step / mu_warmup_steps
    into_decay = step - mu_warmup_steps
    if into_decay >= mu_decay_steps:
        return mu_valley
    cosine = 0.5 * (1.0 + math.cos(math.pi * into_decay / mu_decay_steps))
    return mu_valley + (mu_peak - mu_valley) * cosine


def mix_chord_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    step: int = 0,
    expert_mask: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
    mu_warmup_steps: int = 0,
    mu_decay_steps: int = 0,
    mu_peak: float = 0.1,
    mu_valley: float = 0.1,
    enable_phi_function: bool = True,
    clip_range: float | None = 0.2,
    clip_range_low: float | None = None,
    clip_range_high: float | None = None,
    clip_ratio_c: float | None = 3.0,
    sft_loss_agg_mode: str | None = None,
    grpo_loss_agg_mode: str | None = None,
) -> LossOut:
    """CHORD: loss = (1 - mu) * PPO(rollout rows) + mu * SFT(expert rows), mu = ``chord_mu``.

    ``expert_mask`` ``[B]`` marks expert rows (``source: "expert"``); each part is aggregated
    over its own rows, and a part with no rows in this micro-batch contributes 0. The SFT part
    is phi-weighted when ``enable_phi_function`` (CHORD-phi), plain NLL otherwise; ``is_weights``
    reach the PPO part only. Trinity's ``sft_loss_agg_mode`` / ``grpo_loss_agg_mode`` aggregate
    one part each (unset: ``loss_agg_mode``).
    """
    if expert_mask is None:
        expert_mask = torch.zeros(logprob.shape[0], dtype=torch.bool, device=logprob.device)
    expert = expert_mask.to(device=logprob.device, dtype=torch.bool)  # [B]
    mu = chord_mu(step, mu_warmup_steps, mu_decay_steps, mu_peak, mu_valley)
    zero = logprob.sum() * 0.0  # keeps the graph when a part is empty
    metrics: Metrics = {MU: mu}
    ppo_part, sft_part = zero, zero
    if (~expert).any():
        ppo_part, ppo_metrics = ppo_loss(
            logprob[~expert],
            old_logprob[~expert],
            advantages[~expert],
            mask[~expert],
            loss_agg_mode=grpo_loss_agg_mode or loss_agg_mode,
            is_weights=None if is_weights is None else is_weights[~expert],
            clip_range=clip_range,
            clip_range_low=clip_range_low,
            clip_range_high=clip_range_high,
            clip_ratio_c=clip_ratio_c,
        )
        metrics.update({f"{ROLLOUT_PART}{k}": v for k, v in ppo_metrics.items()})
        metrics[ROLLOUT_PART_LOSS] = ppo_part.item()
    if expert.any():
        sft_fn = _phi_sft_loss if enable_phi_function else _plain_sft
        sft_part, sft_metrics = sft_fn(
            logprob[expert], mask[expert], sft_loss_agg_mode or loss_agg_mode
        )
        metrics.update({f"{EXPERT_PART}{k}": v for k, v in sft_metrics.items()})
    return (1.0 - mu) * ppo_part + mu * sft_part, metrics


def _plain_sft(logprob: torch.Tensor, mask: torch.Tensor, loss_agg_mode: str) -> LossOut:
    return sft_loss(logprob, None, None, mask, loss_agg_mode=loss_agg_mode)


def mix_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    step: int = 0,
    expert_mask: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
    mu: float = 0.1,
    clip_range: float | None = 0.2,
    clip_range_low: float | None = None,
    clip_range_high: float | None = None,
    clip_ratio_c: float | None = 3.0,
    sft_loss_agg_mode: str | None = None,
    grpo_loss_agg_mode: str | None = None,
) -> LossOut:
    """MIX (trinity/algorithm/policy_loss_fn/mix_policy_loss.py): (1 - mu) * PPO(rollout rows)
    + mu * NLL(expert rows) with a constant ``mu``: ``mix_chord`` without the schedule and
    without the phi weighting."""
    return mix_chord_loss(
        logprob,
        old_logprob,
        advantages,
        mask,
        loss_agg_mode=loss_agg_mode,
        step=step,
        expert_mask=expert_mask,
        is_weights=is_weights,
        mu_peak=mu,
        mu_valley=mu,
        enable_phi_function=False,
        clip_range=clip_range,
        clip_range_low=clip_range_low,
        clip_range_high=clip_range_high,
        clip_ratio_c=clip_ratio_c,
        sft_loss_agg_mode=sft_loss_agg_mode,
        grpo_loss_agg_mode=grpo_loss_agg_mode,
    )


def opmd_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    step: int = 0,
    expert_mask: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
    tau: float = 1.0,
) -> LossOut:
    """OPMD (Trinity): agg(-A * logprob) / (1 + tau); the 1/(1 + tau) factor is the
    mirror-descent regularisation strength towards the current policy. No ratio, no clip;
    ``is_weights`` multiply the per-token loss."""
    loss = aggregate(_weighted(-advantages * logprob, is_weights), mask, loss_agg_mode) / (
        1.0 + tau
    )
    return loss, {OPMD_LOSS: loss.item()}


# Each: fn(logprob, old_logprob, advantages, mask, *, loss_agg_mode, step, expert_mask, is_weights,
# **algorithm.policy_loss_fn_args) -> (loss, metrics). step (the global step) and expert_mask ([B]
# bool) are mix_chord's; is_weights ([B, L], rft.algo.correction) multiply the per-token loss.
POLICY_LOSS_FNS: dict[str, Callable[..., LossOut]] = {
    "ppo": ppo_loss,
    "gspo": gspo_loss,
    "sft": sft_loss,
    "mix_chord": mix_chord_loss,
    "mix": mix_loss,
    "opmd": opmd_loss,
}


# ----------------------------------------------------------------------------- KL


def _kl_none(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(logprob)


def _kl_k1(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    return logprob - ref_logprob  # log(pi/pi_ref): unbiased, high variance, can be negative


def _kl_abs(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    return (logprob - ref_logprob).abs()


def _kl_k2(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logprob - ref_logprob).square()


def _kl_k3(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    # Schulman's k3: r - 1 - log r with r = pi_ref/pi; unbiased, always >= 0.
    log_r = ref_logprob - logprob
    return torch.exp(log_r) - 1.0 - log_r


def _kl_low_var(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    # k3 clamped so a single token with a huge ratio cannot dominate the batch.
    log_r = (ref_logprob - logprob).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return (torch.exp(log_r) - 1.0 - log_r).clamp(-10.0, 10.0)


KL_FNS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "none": _kl_none,
    "k1": _kl_k1,
    "k2": _kl_k2,
    "k3": _kl_k3,
    "low_var_kl": _kl_low_var,
    "abs": _kl_abs,
}


def kl(
    name: str, logprob: torch.Tensor, ref_logprob: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Per-token KL estimate ``[B, L]`` named ``name`` (a ``KL_FNS`` key), zero off the mask."""
    return KL_FNS[name](logprob, ref_logprob) * mask.to(logprob.dtype)


def kl_loss(
    name: str,
    logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    kl_coef: float = 0.001,
) -> LossOut:
    """KL regulariser added to the policy loss: ``kl_coef * agg(kl)`` (0 for ``none``)."""
    kl_mean = aggregate(kl(name, logprob, ref_logprob, mask), mask, loss_agg_mode)
    return kl_coef * kl_mean, {KL_LOSS: kl_mean.item(), KL_COEF: kl_coef}


def kl_penalty(
    name: str,
    token_rewards: torch.Tensor,
    logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    mask: torch.Tensor,
    *,
    kl_coef: float = 0.001,
) -> tuple[torch.Tensor, Metrics]:
    """KL in the reward: ``token_rewards - kl_coef * kl`` ``[B, L]`` (use before advantages)."""
    with torch.no_grad():
        per_token = kl(name, logprob, ref_logprob, mask)  # [B, L]
        penalised = token_rewards - kl_coef * per_token  # [B, L]
        kl_mean = masked_mean(per_token, mask.to(per_token.dtype))
    return penalised, {KL_PENALTY: kl_mean.item(), KL_COEF: kl_coef}


# ----------------------------------------------------------------------------- entropy


def _entropy_default(
    entropy: torch.Tensor,
    mask: torch.Tensor,
    *,
    expert_mask: torch.Tensor | None = None,
    loss_agg_mode: str = "token-mean",
    entropy_coef: float = 0.0,
) -> LossOut:
    mean_entropy = aggregate(entropy, mask, loss_agg_mode)
    return -entropy_coef * mean_entropy, {ENTROPY: mean_entropy.item()}


def _entropy_mix(
    entropy: torch.Tensor,
    mask: torch.Tensor,
    *,
    expert_mask: torch.Tensor | None = None,
    loss_agg_mode: str = "token-mean",
    entropy_coef: float = 0.0,
) -> LossOut:
    # Trinity's MixEntropyLossFn (entropy_loss_fn.py): the bonus counts rollout rows only, the
    # expert rows being imitated, not explored.
    rollout = torch.ones(entropy.shape[0], dtype=torch.bool, device=entropy.device)  # [B]
    if expert_mask is not None:
        rollout = ~expert_mask.to(device=entropy.device, dtype=torch.bool)
    if not rollout.any():
        return entropy.sum() * 0.0, {}
    mean_entropy = aggregate(entropy[rollout], mask[rollout], loss_agg_mode)
    return -entropy_coef * mean_entropy, {ENTROPY: mean_entropy.item()}


def _entropy_none(
    entropy: torch.Tensor,
    mask: torch.Tensor,
    *,
    expert_mask: torch.Tensor | None = None,
    loss_agg_mode: str = "token-mean",
    entropy_coef: float = 0.0,
) -> LossOut:
    # Accepts (and ignores) the coefficient, as ``kl_coef`` is ignored by KL ``none``.
    return entropy.sum() * 0.0, {}


ENTROPY_LOSS_FNS: dict[str, Callable[..., LossOut]] = {
    "default": _entropy_default,  # term added to the loss: -entropy_coef * agg(entropy)
    "mix": _entropy_mix,  # the same over the rollout rows only (expert_mask [B] marks the rest)
    "none": _entropy_none,
}
