"""A training step's plan: the batch table, its mini-batches over ranks, and the micro-batches.

Data in: the step's experiences (identical on every rank), the config and this rank's place.
Data out: a :class:`Plan` (this rank's micro-batches per mini-batch, the critic's, and those of
the no-grad passes), and the helpers that run a no-grad pass over this rank's rows
(:func:`local_pass`) and share its result with every rank (:func:`gather_rows`). Every
micro-batch list has the same length on every rank (padded with zero-weight ``[]`` entries).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from rft.buffer.experience import Experience
from rft.config.batches import groups_per_update_of, mini_batch_count
from rft.config.queries import uses_critic
from rft.config.schema import Config
from rft.errors import DataError
from rft.trainer import engine
from rft.trainer.batching import (
    BatchTotals,
    MicroBatch,
    Rows,
    collate,
    padding_micro,
    plan_micro_batches,
    rows_from_experiences,
    source_totals,
    split_by_source,
    split_for_ranks,
    split_mini_batches,
)


@dataclass
class MiniPlan:
    """One optimizer update: this rank's micro-batches of a mini-batch, and its loss denominators."""

    micro_rows: list[list[int]]  # row indices per micro-batch; [] = zero-weight padding
    totals: dict[bool, BatchTotals]  # per source (is expert), over the mini-batch on all ranks
    critic_rows: list[list[int]] = field(
        default_factory=list
    )  # the critic's micro-batches (rollout rows)
    batch_rows: list[int] = field(default_factory=list)  # the mini-batch's rows on all ranks


@dataclass
class Plan:
    """This rank's part of a step: the batch table, its mini-batches and the log-prob passes."""

    rows: Rows
    minis: list[MiniPlan]  # one optimizer update each, every epoch
    logprob_rows: list[
        list[int]
    ]  # this rank's rows (of all minis) per no-grad log-prob micro-batch
    num_tokens: int  # prompt + response tokens of the whole batch (all ranks)
    packed: bool = False  # micro-batches packed into one row each (trainer.padding_free)

    @property
    def local_rows(self) -> list[int]:
        """This rank's rows of all mini-batches, in batch order."""
        return sorted({r for micro in self.logprob_rows for r in micro})


def rank_micro_batches(
    rows: Rows,
    mine: Sequence[int],
    lengths: Sequence[int],
    cfg: Config,
    micro_batch_size: int,
    log_prob_pass: bool = False,
) -> list[list[int]]:
    """This rank's rows ``mine`` in micro-batches of ``micro_batch_size`` rows or, with
    ``trainer.use_dynamic_bsz``, a token budget (rollout and expert rows apart), padded with
    [] to the same count on every rank (a collective). ``log_prob_pass``: batched by
    ``trainer.log_prob_use_dynamic_bsz`` and ``log_prob_max_token_len_per_gpu`` instead."""
    t = cfg.trainer
    dynamic = t.log_prob_use_dynamic_bsz if log_prob_pass else t.use_dynamic_bsz
    budget = t.log_prob_max_token_len_per_gpu if log_prob_pass else t.max_token_len_per_gpu
    micros = [
        micro
        for part in split_by_source(mine, rows.expert)
        for micro in plan_micro_batches(
            part,
            lengths,
            use_dynamic_bsz=bool(dynamic),
            max_token_len=budget or t.max_token_len_per_gpu,
            micro_batch_size=micro_batch_size,
            packed=cfg.trainer.padding_free,
        )
    ]
    count = engine.all_reduce_max(len(micros))
    return micros + [[] for _ in range(count - len(micros))]


def plan_step(exps: Sequence[Experience], cfg: Config, info: engine.DistInfo) -> Plan:
    """This rank's plan of the step (a collective: micro-batch counts are agreed on)."""
    rows = rows_from_experiences(exps)
    lengths = [len(ids) for ids in rows.input_ids]
    t = cfg.trainer
    for key, dynamic, budget in (
        ("max_token_len_per_gpu", t.use_dynamic_bsz, t.max_token_len_per_gpu),
        (
            "log_prob_max_token_len_per_gpu",
            t.log_prob_use_dynamic_bsz,
            t.log_prob_max_token_len_per_gpu,
        ),
    ):
        too_long = [n for n in lengths if budget is not None and n > budget]
        if dynamic and too_long:
            raise DataError(
                f"a sequence of {max(too_long)} tokens exceeds trainer.{key}={budget}; raise it "
                "to at least model.max_model_len"
            )
    rollout_rows = [g for g, e in zip(rows.group_ids, rows.expert.tolist()) if not e]
    rollout_groups = len(set(rollout_rows))
    per_update = groups_per_update_of(cfg, len(rollout_rows), rollout_groups)
    count = mini_batch_count(rollout_groups, per_update)
    critic_size = cfg.trainer.trainer_config.critic.ppo_micro_batch_size_per_gpu
    minis, mine = [], []
    for subset in split_mini_batches(rows.group_ids, rows.expert, count):
        shares = split_for_ranks(
            [rows.group_ids[i] for i in subset], [lengths[i] for i in subset], info.dp_size
        )
        share = [subset[i] for i in shares[info.dp_rank]]  # whole groups of this mini-batch
        micros = rank_micro_batches(rows, share, lengths, cfg, cfg.trainer.micro_batch_size_per_gpu)
        mini = MiniPlan(micros, source_totals(rows.response_mask[subset], rows.expert[subset]))
        mini.batch_rows = list(subset)
        if uses_critic(cfg):  # values are learned on rollouts only
            rollout = [i for i in share if not bool(rows.expert[i])]
            mini.critic_rows = rank_micro_batches(rows, rollout, lengths, cfg, critic_size)
        minis.append(mini)
        mine += share
    logprob_size = cfg.trainer.log_prob_micro_batch_size_per_gpu
    return Plan(
        rows,
        minis,
        rank_micro_batches(rows, sorted(mine), lengths, cfg, logprob_size, log_prob_pass=True),
        sum(lengths),
        packed=cfg.trainer.padding_free,
    )


def micro_batch(
    plan: Plan,
    rows: list[int],
    adv: torch.Tensor,
    old: torch.Tensor,
    pad_id: int,
    device: torch.device,
) -> MicroBatch:
    """The tensors of ``rows`` (a zero-weight micro-batch for ``[]``) on ``device``, packed
    with ``trainer.padding_free``."""
    micro = (
        collate(plan.rows, rows, adv, old, pad_id, packed=plan.packed)
        if rows
        else padding_micro(pad_id)
    )
    return micro.to(device)


def narrow_mask(plan: Plan, mask: torch.Tensor) -> None:
    """Train on the tokens of ``mask`` ``[N, R]`` only (within the rows' response mask, e.g.
    Clip-B's filter): the rows' mask replaced and each mini-batch's loss denominators recounted."""
    plan.rows.response_mask = mask
    for mini in plan.minis:
        mini.totals = source_totals(mask[mini.batch_rows], plan.rows.expert[mini.batch_rows])


@torch.no_grad()
def local_passes(
    fn: Callable[[MicroBatch], tuple[torch.Tensor, ...]],
    plan: Plan,
    pad_id: int,
    device: torch.device,
) -> tuple[torch.Tensor, ...]:
    """``[N, R]`` each of ``fn``'s tensors (e.g. log-probs and entropies) on this rank's rows
    (others 0), one micro-batch at a time."""
    outs: list[torch.Tensor] = []
    zeros = torch.zeros_like(plan.rows.response_mask)  # [N, R]
    for rows in plan.logprob_rows:
        micro = micro_batch(plan, rows, zeros, zeros, pad_id, device)
        for k, part in enumerate(fn(micro)):
            if k == len(outs):
                outs.append(torch.zeros_like(zeros))
            values = part.float().cpu()  # [B, R_micro]
            for j, row in enumerate(rows):
                outs[k][row, : values.shape[1]] = values[j]
    return tuple(outs)


def local_pass(
    fn: Callable[[MicroBatch], torch.Tensor], plan: Plan, pad_id: int, device: torch.device
) -> torch.Tensor:
    """``[N, R]`` of ``fn`` (log-probs, or the critic's values) on this rank's rows (others 0),
    one micro-batch at a time."""
    outs = local_passes(lambda micro: (fn(micro),), plan, pad_id, device)
    return outs[0] if outs else torch.zeros_like(plan.rows.response_mask)


def gather_rows(plan: Plan, local: torch.Tensor) -> torch.Tensor:
    """``[N, R]`` with every rank's rows of ``local`` (a :func:`local_pass` result) filled in."""
    mine = plan.local_rows
    out = torch.zeros_like(local)  # [N, R]
    for rows, part in engine.all_gather_objects((mine, local[mine])):
        out[rows] = part
    return out
