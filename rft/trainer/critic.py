"""The critic's part of a training step (``advantage_fn: ppo``): its values, then its own updates.

Data in: the step's :class:`~rft.trainer.plan.Plan`, the critic engine, the old values and the GAE
returns ``[N, R]``. Data out: every rank's values before any update (veRL's ``compute_values``),
the critic updated once per mini-batch and epoch, and its metrics (``rft.monitor``'s ``critic/``
names). The math stays in :mod:`rft.algo.critic`.
"""

from __future__ import annotations

import torch

from rft.algo.critic import explained_variance, value_loss
from rft.monitor import (
    CRITIC_GRAD_NORM,
    CRITIC_LR,
    EXPLAINED_VARIANCE,
    VALUE_CLIP_FRAC,
    VALUE_LOSS,
    VALUES_MEAN,
)
from rft.trainer import engine
from rft.trainer.batching import MetricSums, micro_loss_scale
from rft.trainer.plan import Plan, gather_rows, local_pass, micro_batch


def old_values(critic: engine.Actor, plan: Plan, pad_id: int, device: torch.device) -> torch.Tensor:
    """The critic's values ``[N, R]`` of every row, before this step's update (no grad; each
    rank computes its rows, then all ranks share them: GAE whitens over the whole batch)."""
    local = local_pass(lambda m: engine.forward_values(critic.engine, m), plan, pad_id, device)
    return gather_rows(plan, local)


def value_metrics(
    values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """How well the old values predicted the returns (over ``mask``, the rollout tokens)."""
    n = mask.sum().clamp(min=1)
    return {
        EXPLAINED_VARIANCE: explained_variance(values, returns, mask),
        VALUES_MEAN: float((values * mask).sum() / n),
    }


def update_critic(
    critic: engine.Actor,
    plan: Plan,
    values: torch.Tensor,
    returns: torch.Tensor,
    *,
    epochs: int,
    cliprange_value: float,
    pad_id: int,
    info: engine.DistInfo,
) -> dict[str, float]:
    """One optimizer update per mini-batch and epoch on the rollout rows; the metrics of the
    step over all ranks (value loss and clip fraction token-weighted, grad norm averaged)."""
    sums, grad_norms = MetricSums(), []
    zeros = torch.zeros_like(values)
    updates = epochs * len(plan.minis)
    for _epoch in range(epochs):
        for mini in plan.minis:
            totals = mini.totals[False]  # rollout rows of the mini-batch, all ranks
            for rows in mini.critic_rows:
                micro = micro_batch(plan, rows, zeros, zeros, pad_id, info.device)
                mask = micro.response_mask  # [B, R_micro]
                width = mask.shape[1]
                new = engine.forward_values(critic.engine, micro)  # [B, R_micro]
                old = values[rows, :width].to(info.device) if rows else torch.zeros_like(mask)
                target = returns[rows, :width].to(info.device) if rows else torch.zeros_like(mask)
                loss, clip_frac = value_loss(
                    new, old, target, mask, cliprange_value=cliprange_value
                )
                scale = micro_loss_scale(mask, totals, "token-mean", info.world_size)
                engine.backward(critic, loss * scale)
                sums.add(
                    {VALUE_LOSS: loss.item(), VALUE_CLIP_FRAC: clip_frac},
                    scale / info.world_size / updates,
                    1.0,
                )
            grad_norms.append(engine.optimizer_step(critic))
    total = MetricSums()
    for part in engine.all_gather_objects(sums):
        total.merge(part)
    return {
        **total.result(),
        CRITIC_GRAD_NORM: sum(grad_norms) / len(grad_norms),
        CRITIC_LR: engine.current_lr(critic),
    }
