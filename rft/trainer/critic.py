"""The critic's part of a training step (``advantage_fn: ppo``): values, then its own updates.

Data in: the step's :class:`~rft.trainer.plan.Plan`, the critic (a DeepSpeed engine built by
:func:`rft.trainer.engine.build_critic`) and, for the update, the old values and the GAE
returns ``[N, R]`` of the step's rollout rows. Data out: the values every rank needs for GAE
(:func:`old_values`, before any update, as veRL's ``compute_values``) and the critic updated
once per mini-batch and epoch, in micro-batches of ``critic.ppo_micro_batch_size_per_gpu``,
with the clipped value loss of :mod:`rft.algo.critic` (a token mean over the mini-batch's
response tokens, ``critic.cliprange_value`` around the old values), and its metrics under
``critic/``. The math is pure and lives in :mod:`rft.algo.critic`.
"""

from __future__ import annotations

import torch

from rft.algo.critic import explained_variance, value_loss
from rft.monitor import CRITIC_PREFIX, EXPLAINED_VARIANCE, VALUES_MEAN
from rft.trainer import engine as dse
from rft.trainer.batching import MetricSums, micro_loss_scale
from rft.trainer.plan import Plan, gather_rows, local_pass, micro_batch

GRAD_NORM = f"{CRITIC_PREFIX}grad_norm"
LR = f"{CRITIC_PREFIX}lr"


def old_values(critic: dse.Actor, plan: Plan, pad_id: int, device: torch.device) -> torch.Tensor:
    """The critic's values ``[N, R]`` of every row, before this step's update (no grad; each
    rank computes its rows, then all ranks share them: GAE whitens over the whole batch)."""
    local = local_pass(lambda m: dse.forward_values(critic.engine, m), plan, pad_id, device)
    return gather_rows(plan, local)


def value_metrics(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """How well the old values predicted the returns (over ``mask``, the rollout tokens)."""
    n = mask.sum().clamp(min=1)
    return {EXPLAINED_VARIANCE: explained_variance(values, returns, mask),
            VALUES_MEAN: float((values * mask).sum() / n)}


def update_critic(critic: dse.Actor, plan: Plan, values: torch.Tensor, returns: torch.Tensor,
                  *, epochs: int, cliprange_value: float, pad_id: int,
                  info: dse.DistInfo) -> dict[str, float]:
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
                new = dse.forward_values(critic.engine, micro)  # [B, R_micro]
                old = values[rows, :width].to(info.device) if rows else torch.zeros_like(mask)
                target = returns[rows, :width].to(info.device) if rows else torch.zeros_like(mask)
                loss, metrics = value_loss(new, old, target, mask, cliprange_value=cliprange_value)
                scale = micro_loss_scale(mask, totals, "token-mean", info.world_size)
                dse.backward(critic, loss * scale)
                sums.add(metrics, scale / info.world_size / updates, 1.0)
            grad_norms.append(dse.optimizer_step(critic))
    total = MetricSums()
    for part in dse.all_gather_objects(sums):
        total.merge(part)
    return {**total.result(), GRAD_NORM: sum(grad_norms) / len(grad_norms), LR: dse.current_lr(critic)}
