"""Off-policy correction of rollouts: per-token importance weights and their metrics (pure torch).

Data in: the sampled tokens' ``proximal`` log-probs (the trainer's, before the step's first
update) and ``behaviour`` log-probs (vLLM's), ``[B, L]``. Data out: weights the policy losses
multiply into the per-token loss (``is_weights``, no gradient) and :class:`CorrectionSums`, whose
metric names are defined here only. Modes: ``none``; ``tis`` (veRL's truncated IS,
``min(ratio, rollout_is_threshold)``); ``decoupled`` (AReaL: the ratio, tokens over
``behav_imp_weight_cap`` dropped).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from rft.algo.losses import MAX_LOG_RATIO

IS_RATIO_MEAN = "rollout_correction/is_ratio_mean"  # mean pi_prox / pi_behav over counted tokens
IS_RATIO_MAX = "rollout_correction/is_ratio_max"  # its largest value in the step
IS_WEIGHT_MEAN = "rollout_correction/is_weight_mean"  # mean weight after truncation / dropping
IS_CAPPED_FRAC = (
    "rollout_correction/capped_frac"  # share of tokens truncated (tis) or dropped (decoupled)
)

Weights = tuple[torch.Tensor, torch.Tensor]  # (weights [B, L], capped [B, L] bool)


def _none(ratio: torch.Tensor, threshold: float, cap: float | None) -> Weights:
    return torch.ones_like(ratio), torch.zeros_like(ratio, dtype=torch.bool)


def _tis(ratio: torch.Tensor, threshold: float, cap: float | None) -> Weights:
    return ratio.clamp(max=threshold), ratio > threshold


def _decoupled(ratio: torch.Tensor, threshold: float, cap: float | None) -> Weights:
    if cap is None:
        return ratio, torch.zeros_like(ratio, dtype=torch.bool)
    dropped = ratio > cap
    return torch.where(dropped, torch.zeros_like(ratio), ratio), dropped


CORRECTIONS: dict[str, Callable[[torch.Tensor, float, float | None], Weights]] = {
    "none": _none,
    "tis": _tis,
    "decoupled": _decoupled,
}


@dataclass
class CorrectionSums:
    """A step's correction statistics as sums over counted tokens (merge over ranks, then
    :meth:`metrics`)."""

    tokens: float = 0.0  # counted tokens
    ratio_sum: float = 0.0  # sum of pi_prox / pi_behav
    ratio_max: float = 0.0  # largest pi_prox / pi_behav (ratios are > 0)
    weight_sum: float = 0.0  # sum of the weights applied
    capped: float = 0.0  # tokens truncated (tis) or dropped (decoupled)

    def merge(self, other: "CorrectionSums") -> None:
        self.tokens += other.tokens
        self.ratio_sum += other.ratio_sum
        self.ratio_max = max(self.ratio_max, other.ratio_max)
        self.weight_sum += other.weight_sum
        self.capped += other.capped

    def metrics(self) -> dict[str, float]:
        """The step's metrics; none when no token was counted."""
        if not self.tokens:
            return {}
        return {
            IS_RATIO_MEAN: self.ratio_sum / self.tokens,
            IS_RATIO_MAX: self.ratio_max,
            IS_WEIGHT_MEAN: self.weight_sum / self.tokens,
            IS_CAPPED_FRAC: self.capped / self.tokens,
        }


def correction_weights(
    proximal: torch.Tensor,
    behaviour: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: str,
    rollout_is_threshold: float,
    behav_imp_weight_cap: float | None = None,
) -> tuple[torch.Tensor, CorrectionSums]:
    """Per-token weights ``[B, L]`` (float32, no graph) for ``mode`` (a ``CORRECTIONS`` key)
    and the sums of the tokens where ``mask`` is 1. ``proximal`` and ``behaviour`` are the
    sampled tokens' log-probs ``[B, L]``; off the mask the weights are meaningless (the loss
    masks them out)."""
    assert mode in CORRECTIONS, f"unknown correction mode {mode!r} (validated by the config schema)"
    with torch.no_grad():
        log_ratio = (proximal.float() - behaviour.float()).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        ratio = torch.exp(log_ratio)  # [B, L]
        weights, capped = CORRECTIONS[mode](ratio, rollout_is_threshold, behav_imp_weight_cap)
        counted = mask > 0  # [B, L]
        ratios = ratio[counted]  # [n]
        sums = CorrectionSums(
            tokens=float(counted.sum()),
            ratio_sum=float(ratios.sum()),
            ratio_max=float(ratios.max()) if ratios.numel() else 0.0,
            weight_sum=float(weights[counted].sum()),
            capped=float(capped[counted].sum()),
        )
    return weights, sums
