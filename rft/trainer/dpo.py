"""DPO in ``mode: train``: preference pairs from a dataset, one policy update per step and epoch.

Data in: ``buffer.trainer_input.experience_buffer`` (``storage_type: file``; the row shape of
``format.prompt_type`` with ``chosen_key``/``rejected_key``, :func:`rft.data.preference_messages`)
read by :class:`DpoSource` on rank 0, ``train_batch_size`` pairs per step, each pair two
adjacent expert experiences (chosen, then rejected) with one ``group_id``. :func:`dpo_step`
keeps pairs whole across ranks and micro-batches, scores them under the frozen reference
model, and trains on ``algorithm.policy_loss_fn: dpo`` (:mod:`rft.algo.dpo`) plus the
configured KL and entropy terms. Data out: the updated actor and the step's metrics.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import torch

from rft.buffer.experience import Experience
from rft.config.schema import Config, ExperienceBufferConfig
from rft.data import pair_columns, preference_messages
from rft.errors import DataError
from rft.monitor import BATCH_EXPERIENCES, BATCH_PAIRS, BATCH_TOKENS, UPDATES
from rft.trainer.algorithm import LossFns
from rft.trainer.batching import (
    MetricSums,
    MicroBatch,
    Rows,
    collate,
    micro_loss_scale,
    padding_micro,
    rows_from_experiences,
    source_totals,
    split_for_ranks,
)
from rft.trainer.sft import load_rows, reply_ids

if TYPE_CHECKING:
    from rft.trainer import engine

PAIR_WRITER = "dpo"  # the writer name the pairs' experiences carry


# ----------------------------------------------------------------------------- data


def fit_pair(
    prompt: list[int], chosen: list[int], rejected: list[int], max_model_len: int | None
) -> tuple[list[int], list[int], list[int]]:
    """Cut a pair to ``max_model_len`` per sequence: each reply's tail first (one token kept),
    then the shared prompt's head, by as much as the longer reply needs."""
    if max_model_len is None or len(prompt) + max(len(chosen), len(rejected)) <= max_model_len:
        return prompt, chosen, rejected
    room = max(1, max_model_len - len(prompt))
    chosen, rejected = chosen[:room], rejected[:room]
    return prompt[-(max_model_len - max(len(chosen), len(rejected))) :], chosen, rejected


def tokenize_pair(
    tokenizer: Any,
    row: Mapping[str, Any],
    buf: ExperienceBufferConfig,
    index: int,
    max_model_len: int | None,
) -> tuple[Experience, Experience]:
    """One dataset row -> (chosen, rejected) expert experiences sharing the templated prompt."""
    try:
        prompt, chosen, rejected = preference_messages(row, buf.format)
        prompt_ids, chosen_ids = reply_ids(tokenizer, prompt, chosen, buf.format)
        _, rejected_ids = reply_ids(tokenizer, prompt, rejected, buf.format)
    except DataError as e:
        raise DataError(f"{buf.path} row {index}: {e}") from e
    prompt_ids, chosen_ids, rejected_ids = fit_pair(
        prompt_ids, chosen_ids, rejected_ids, max_model_len
    )
    return tuple(  # type: ignore[return-value]
        Experience(
            task_id=f"dpo-{index}",
            group_id=f"dpo-{index}",
            prompt_ids=prompt_ids,
            response_ids=reply,
            source="expert",
            writer=PAIR_WRITER,
        )
        for reply in (chosen_ids, rejected_ids)
    )


class DpoSource:
    """The trainer's input for DPO (rank 0): ``train_batch_size`` pairs per step in dataset
    order, wrapping across epochs; the cursor ``{"row": n}`` (rows served) resumes it."""

    def __init__(self, cfg: Config, cursor: dict[str, Any] | None):
        from transformers import AutoTokenizer

        self.buf = cfg.buffer.trainer_input.experience_buffer
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model.model_path)
        self.max_model_len = cfg.model.max_model_len
        self.pairs_per_step = cfg.buffer.train_batch_size
        self.rows = load_rows(self.buf, pair_columns)
        if not self.rows:
            raise DataError(f"{self.buf.path} (split {self.buf.split!r}) has no pairs to train on")
        self.served = int((cursor or {}).get("row", 0))

    def next_batch(
        self, step: int, current_version: int, stop: Callable[[], bool] = lambda: False
    ) -> list[Experience]:
        out: list[Experience] = []
        for _ in range(self.pairs_per_step):
            index = self.served % len(self.rows)
            out += tokenize_pair(
                self.tokenizer, self.rows[index], self.buf, index, self.max_model_len
            )
            self.served += 1
        return out

    def cursor(self) -> dict[str, Any]:
        return {"row": self.served}

    def release(self, cursor: dict[str, Any]) -> None:
        pass  # a dataset is never consumed

    def stats(self) -> dict[str, int]:
        return {"rows_served": self.served}


# ----------------------------------------------------------------------------- batching


def pair_micro_batches(
    rows: Sequence[int],
    lengths: Sequence[int],
    *,
    use_dynamic_bsz: bool,
    max_token_len: int,
    micro_batch_size: int,
    packed: bool = False,
) -> list[list[int]]:
    """A rank's rows (whole pairs, chosen first) in micro-batches of whole pairs, in order.

    Fixed: ``micro_batch_size`` sequences each, rounded down to whole pairs (one pair at
    least). Dynamic: pairs added while the micro-batch stays within ``max_token_len`` (rows x
    longest padded, the sum of lengths ``packed``); a pair over the budget goes alone.
    """
    pairs = [list(rows[i : i + 2]) for i in range(0, len(rows), 2)]
    if not use_dynamic_bsz:
        per = max(1, micro_batch_size // 2)
        return [sum(pairs[i : i + per], []) for i in range(0, len(pairs), per)]
    micros: list[list[int]] = []
    current: list[int] = []
    for pair in pairs:
        grown = current + pair
        sizes = [lengths[i] for i in grown]
        size = sum(sizes) if packed else max(sizes) * len(grown)
        if current and size > max_token_len:
            micros.append(current)
            grown = pair
        current = grown
    if current:
        micros.append(current)
    return micros


def _rank_micro_batches(rows: Rows, cfg: Config, info: engine.DistInfo) -> list[list[int]]:
    """This rank's micro-batches of whole pairs (each pair one group), padded with ``[]`` to the
    count of the rank with the most (a collective)."""
    from rft.trainer import engine

    lengths = [len(ids) for ids in rows.input_ids]
    share = split_for_ranks(rows.group_ids, lengths, info.world_size)[info.rank]
    micros = pair_micro_batches(
        share,
        lengths,
        use_dynamic_bsz=cfg.trainer.use_dynamic_bsz,
        max_token_len=cfg.trainer.max_token_len_per_gpu,
        micro_batch_size=cfg.trainer.micro_batch_size_per_gpu,
        packed=cfg.trainer.padding_free,
    )
    count = engine.all_reduce_max(len(micros))
    return micros + [[] for _ in range(count - len(micros))]


def _check_pairs(exps: Sequence[Experience]) -> None:
    """Pairs arrive as adjacent rows of one group (what :class:`DpoSource` writes)."""
    assert len(exps) % 2 == 0, "DPO batches hold whole pairs"
    for chosen, rejected in zip(exps[0::2], exps[1::2]):
        assert chosen.group_id == rejected.group_id, (chosen.group_id, rejected.group_id)


# ----------------------------------------------------------------------------- the step


def _micro_loss(
    actor: engine.Actor,
    micro: MicroBatch,
    ref_logprob: torch.Tensor,
    fns: LossFns,
    pair_share: float,
    token_share: float,
    sums: MetricSums,
) -> torch.Tensor:
    """The micro-batch's part of the step's loss: the DPO loss of its pairs x their share of the
    step's pairs, the KL and entropy terms x its share of the tokens (each x world size: the
    data-parallel gradient is averaged over ranks); its metrics go into ``sums``."""
    from rft.trainer import engine

    logprob, entropy = engine.forward_logprobs(
        actor.engine, micro, with_entropy=fns.entropy_in_loss
    )  # [B, R] each
    mask = micro.response_mask  # [B, R]
    if micro.rows:
        loss, metrics = fns.policy(logprob, ref_logprob, mask)
    else:  # a padding micro-batch: same collectives, no weight
        loss, metrics = logprob.sum() * 0.0, {}
    sums.add(metrics, pair_share, 1.0)
    total = loss * pair_share
    if fns.kl_loss is not None:
        kl_term, kl_metrics = fns.kl_loss(logprob, ref_logprob, mask)
        total = total + kl_term * token_share
        sums.add(kl_metrics, token_share, 1.0)
    if fns.entropy_in_loss:
        assert entropy is not None
        ent_term, ent_metrics = fns.entropy(entropy, mask)
        total = total + ent_term * token_share
        sums.add(ent_metrics, token_share, 1.0)
    return total


def dpo_step(
    actor: engine.Actor,
    ref: engine.Reference | None,
    exps: Sequence[Experience],
    cfg: Config,
    fns: LossFns,
    info: engine.DistInfo,
    step: int,
    pad_id: int,
    critic: engine.Actor | None = None,
) -> dict[str, float]:
    """One DPO step over ``exps`` (pairs, chosen first): reference log-probs once, then per
    epoch a forward and backward per micro-batch and one optimizer update. Returns metrics."""
    from rft.trainer import engine  # imports deepspeed: on the trainer's ranks only

    assert ref is not None and critic is None, "DPO trains the policy against its reference"
    _check_pairs(exps)
    t0 = time.perf_counter()
    rows = rows_from_experiences(exps)
    micro_rows = _rank_micro_batches(rows, cfg, info)
    pairs = len(rows) // 2
    totals = source_totals(rows.response_mask, rows.expert)[True]  # every row is data (expert)
    zeros = torch.zeros_like(rows.response_mask)  # [N, R]: no advantages, no old log-probs
    micros = [
        collate(rows, r, zeros, zeros, pad_id, packed=cfg.trainer.padding_free)
        if r
        else padding_micro(pad_id)
        for r in micro_rows
    ]
    with torch.no_grad():
        ref_lps = [engine.reference_logprobs(ref, m.to(info.device)) for m in micros]  # [B, R]
    epochs = cfg.trainer.ppo_epochs
    sums, grad_norms = MetricSums(), []
    t_prep = time.perf_counter() - t0
    for _epoch in range(epochs):
        for micro, ref_lp in zip(micros, ref_lps):
            micro = micro.to(info.device)
            pair_share = len(micro.rows) / 2 / pairs * info.world_size
            token_share = micro_loss_scale(
                micro.response_mask, totals, fns.agg_mode, info.world_size
            )
            loss = _micro_loss(actor, micro, ref_lp, fns, pair_share, token_share, sums)
            engine.backward(actor, loss)
        grad_norms.append(engine.optimizer_step(actor))
    # weighted means over the pairs (DPO) and tokens (KL, entropy)
    metrics = engine.reduce_metric_sums(sums)
    mask = rows.response_mask
    metrics.update(
        {
            UPDATES: epochs,
            BATCH_PAIRS: pairs,
            BATCH_EXPERIENCES: len(exps),
            BATCH_TOKENS: sum(len(ids) for ids in rows.input_ids),
            "grad_norm": sum(grad_norms) / len(grad_norms),
            "lr": engine.current_lr(actor),
            "response_length_mean": float(mask.sum(-1).mean()),
            "micro_batches": len(micros),
            "time_prepare_s": t_prep,
        }
    )
    return metrics
