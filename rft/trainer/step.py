"""One training step of the policy on this rank's share of a batch (data-parallel over ranks).

Data in: the step's experiences (identical on every rank), the :class:`~rft.trainer.engine.Actor`,
an optional reference model, and the algorithm's pure functions (:class:`LossFns`). Data out:
the model updated ``trainer.ppo_epochs`` times (one optimizer step per pass over the batch) and
a metrics dict averaged over the whole batch (meaningful on rank 0).

Order of work: tabulate rows -> split whole groups over ranks -> micro-batches (same count on
every rank, padded with zero-weight ones; rollout and expert rows apart) -> reference log-probs
(if a KL term is on) -> old log-probs (rollout's, or one forward pass before the first update:
``recompute``) -> advantages over the batch's rollout rows (KL-in-reward first, gathered from
all ranks; expert rows get 0) -> per epoch, per micro-batch: forward, loss x its share of its
source's loss, backward; then one optimizer step.

CHORD (``sample_strategy: mix``): expert rows (``source: "expert"``) reach the loss as
``expert_mask``, with the step number for ``mix_chord``'s mu schedule.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from rft.algo.registry import LossFns, token_level_rewards
from rft.buffer.experience import Experience
from rft.config.schema import Config
from rft.errors import DataError
from rft.trainer import engine as dse
from rft.trainer.batching import (
    BatchTotals,
    MetricSums,
    MicroBatch,
    Rows,
    collate,
    micro_loss_scale,
    micro_source,
    padding_micro,
    plan_micro_batches,
    rows_from_experiences,
    source_fractions,
    source_totals,
    split_by_source,
    split_for_ranks,
)


@dataclass
class Plan:
    """This rank's part of a step: the batch table, its micro-batches and the step's totals."""

    rows: Rows
    micro_rows: list[list[int]]  # row indices per micro-batch; [] = zero-weight padding
    num_tokens: int  # prompt + response tokens of the whole batch (all ranks)
    totals: dict[bool, BatchTotals]  # per source (is expert): the loss denominators


def plan_step(exps: Sequence[Experience], cfg: Config, info: dse.DistInfo) -> Plan:
    rows = rows_from_experiences(exps)
    lengths = [len(ids) for ids in rows.input_ids]
    budget = cfg.trainer.max_token_len_per_gpu
    too_long = [n for n in lengths if n > budget]
    if cfg.trainer.use_dynamic_bsz and too_long:
        raise DataError(f"a sequence of {max(too_long)} tokens exceeds trainer.max_token_len_per_gpu="
                        f"{budget}; raise it to at least model.max_model_len")
    mine = split_for_ranks(rows.group_ids, lengths, info.world_size)[info.rank]
    micro_rows = [micro for part in split_by_source(mine, rows.expert)
                  for micro in plan_micro_batches(part, lengths, use_dynamic_bsz=cfg.trainer.use_dynamic_bsz,
                                                  max_token_len=budget,
                                                  micro_batch_size=cfg.trainer.micro_batch_size_per_gpu)]
    count = dse.all_reduce_max(len(micro_rows))
    micro_rows += [[] for _ in range(count - len(micro_rows))]
    return Plan(rows, micro_rows, sum(lengths), source_totals(rows.response_mask, rows.expert))


def _micro(plan: Plan, index: int, adv: torch.Tensor, old: torch.Tensor, pad_id: int,
           device: torch.device) -> MicroBatch:
    rows = plan.micro_rows[index]
    micro = collate(plan.rows, rows, adv, old, pad_id) if rows else padding_micro(pad_id)
    return micro.to(device)


@torch.no_grad()
def _local_logprobs(fn: Callable[[MicroBatch], torch.Tensor], plan: Plan, pad_id: int,
                    device: torch.device) -> torch.Tensor:
    """``[N, R]`` log-probs of this rank's rows (others 0), one micro-batch at a time."""
    out = torch.zeros_like(plan.rows.response_mask)  # [N, R]
    zeros = torch.zeros_like(out)
    for i, rows in enumerate(plan.micro_rows):
        micro = _micro(plan, i, zeros, zeros, pad_id, device)
        values = fn(micro).float().cpu()  # [B, R_micro]
        for j, row in enumerate(rows):
            out[row, :values.shape[1]] = values[j]
    return out


def _advantages(plan: Plan, fns: LossFns, ref: torch.Tensor | None, old: torch.Tensor,
                info: dse.DistInfo) -> tuple[torch.Tensor, dict[str, float]]:
    """Advantages ``[N, R]`` of the rollout rows; expert rows (CHORD) get 0."""
    rows, mask = plan.rows, plan.rows.response_mask
    adv = torch.zeros_like(mask)  # [N, R]
    rollout = [i for i in range(len(rows)) if not bool(rows.expert[i])]
    if fns.advantage is None or not rollout:
        return adv, {}
    metrics: dict[str, float] = {}
    rewards: torch.Tensor = rows.rewards  # [N]
    if fns.kl_penalty is not None:
        assert ref is not None
        mine = sorted({r for micro in plan.micro_rows for r in micro})
        local, metrics = fns.kl_penalty(token_level_rewards(rows.rewards, mask)[mine],
                                        old[mine], ref[mine], mask[mine])  # [n, R]
        rewards = torch.zeros_like(mask)  # [N, R]
        for part_rows, part in dse.all_gather_objects((mine, local)):
            rewards[part_rows] = part
    part, adv_metrics = fns.advantage(rewards[rollout], [rows.group_ids[i] for i in rollout],
                                      mask[rollout])  # [n, R]
    adv[rollout] = part
    return adv, {**metrics, **adv_metrics}


def _micro_loss(actor: dse.Actor, micro: MicroBatch, fns: LossFns, step: int) -> tuple[torch.Tensor, dict[str, float]]:
    logprob, entropy = dse.forward_logprobs(actor.engine, micro, with_entropy=True,
                                            entropy_grad=fns.entropy_in_loss)  # [B, R] each
    assert entropy is not None
    mask = micro.response_mask
    loss, metrics = fns.policy(logprob, micro.old_logprobs, micro.advantages, mask,
                               step=step, expert_mask=micro.expert)
    if fns.entropy_in_loss:
        ent_loss, ent_metrics = fns.entropy(entropy, mask)
        loss = loss + ent_loss
        metrics.update(ent_metrics)
    else:
        metrics["entropy"] = float((entropy * mask).sum() / mask.sum().clamp(min=1))
    if fns.kl_loss is not None:
        assert micro.ref_logprobs is not None
        kl_term, kl_metrics = fns.kl_loss(logprob, micro.ref_logprobs, mask)
        loss = loss + kl_term
        metrics.update(kl_metrics)
    metrics["logprob_mean"] = float((logprob.detach() * mask).sum() / mask.sum().clamp(min=1))
    return loss, metrics


def _reduce_metrics(sums: MetricSums) -> dict[str, float]:
    """Combine the metric sums of all ranks into the step's metrics."""
    total = MetricSums()
    for part in dse.all_gather_objects(sums):
        total.merge(part)
    return total.result()


def train_step(actor: dse.Actor, ref: dse.Reference | None, exps: Sequence[Experience], cfg: Config,
               fns: LossFns, info: dse.DistInfo, step: int, pad_id: int) -> dict[str, float]:
    """Prepare and apply one step's updates; return its metrics (timings included)."""
    t0 = time.perf_counter()
    plan = plan_step(exps, cfg, info)
    mask = plan.rows.response_mask  # [N, R]
    ref_lp = None
    if fns.needs_ref:
        assert ref is not None
        ref_lp = _local_logprobs(lambda m: dse.reference_logprobs(ref, m), plan, pad_id, info.device)
    if fns.recompute_old:
        old = _local_logprobs(lambda m: dse.forward_logprobs(actor.engine, m, with_entropy=False)[0],
                              plan, pad_id, info.device)
    else:
        old = plan.rows.rollout_logprobs
        if not fns.sft and not bool((plan.rows.has_logprobs | plan.rows.expert).all()):
            raise DataError("algorithm.old_logprobs is 'rollout' but some experiences carry no "
                            "logprobs; use old_logprobs: recompute")
    adv, metrics = _advantages(plan, fns, ref_lp, old, info)
    t_prep = time.perf_counter() - t0
    fractions = source_fractions(plan.totals, fns.agg_mode)
    sums = MetricSums()
    grad_norms = []
    t_fb = t_opt = 0.0
    for _epoch in range(cfg.trainer.ppo_epochs):
        t1 = time.perf_counter()
        for i in range(len(plan.micro_rows)):
            micro = _micro(plan, i, adv, old, pad_id, info.device)
            if ref_lp is not None:
                micro.ref_logprobs = ref_lp[micro.rows, :micro.response_mask.shape[1]].to(info.device) if micro.rows \
                    else torch.zeros_like(micro.response_mask)
            source = micro_source(micro)
            scale = micro_loss_scale(micro.response_mask, plan.totals[source], fns.agg_mode, info.world_size)
            loss, micro_metrics = _micro_loss(actor, micro, fns, step)
            dse.backward(actor, loss * scale)
            share = scale / info.world_size / cfg.trainer.ppo_epochs
            sums.add(micro_metrics, share, fractions[source])
        t2 = time.perf_counter()
        grad_norms.append(dse.optimizer_step(actor))
        t_fb += t2 - t1
        t_opt += time.perf_counter() - t2
    metrics.update(_reduce_metrics(sums))
    rollout = ~plan.rows.expert  # [N]
    adv_rows = (adv.sum(-1) / mask.sum(-1).clamp(min=1))[rollout]  # [n] per-response advantage
    if bool(plan.rows.expert.any()) and not fns.sft:
        metrics["batch_expert_samples"] = int(plan.rows.expert.sum())
    metrics.update(
        grad_norm=grad_norms[-1], lr=dse.current_lr(actor),
        advantages_mean=float(adv_rows.mean()) if len(adv_rows) else 0.0,
        advantages_std=float(adv_rows.std()) if len(adv_rows) > 1 else 0.0,
        response_length_mean=float(mask.sum(-1).mean()), response_length_max=float(mask.sum(-1).max()),
        batch_experiences=len(exps), batch_tokens=plan.num_tokens, micro_batches=len(plan.micro_rows),
        time_prepare_s=t_prep, time_forward_backward_s=t_fb, time_optimizer_s=t_opt,
    )
    return metrics
