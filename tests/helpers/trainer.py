"""Trainer helpers only tests need: a batch's loss denominators, a LoRA model's trainable names."""

from __future__ import annotations

import torch

from rft.trainer.batching import BatchTotals


def batch_totals(mask: torch.Tensor) -> BatchTotals:
    """Totals of a ``[N, R]`` response mask, as if the whole batch were one source."""
    return BatchTotals(int(mask.sum().item()), int((mask.sum(-1) > 0).sum().item()), mask.shape[-1])


def trainable_names(module: torch.nn.Module) -> list[str]:
    """The parameter names in ``module`` that train (a LoRA model's: the adapter's)."""
    return [name for name, p in module.named_parameters() if p.requires_grad]
