"""Pure batching for the trainer: experiences -> per-rank micro-batches of padded tensors.

Data in: the ``train_batch_size`` :class:`~rft.buffer.experience.Experience` records of one
step (the same list on every rank). Data out, per rank: a list of :class:`MicroBatch` plus the
loss weight of each, so that gradient accumulation and data-parallel averaging give exactly the
loss of the whole batch under ``loss_agg_mode``. Order: :func:`rows_from_experiences`,
:func:`split_for_ranks`, :func:`plan_micro_batches`, :func:`collate`, :func:`micro_loss_scale`.
Torch and the stdlib only: no distributed calls, and every rank computes the same plan.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Sequence

import torch

from rft.buffer.experience import ENV_STEP_KEY, RUN_KEY, Experience
from rft.config.queries import scoring_temperature
from rft.errors import DataError
from rft.monitor import POLICY_LOSS

# Compiled decoder layers (trainer.compile_layers) see the sequence dim of every micro-batch
# padded to a multiple of this: few shapes, and the divisibility guards torch.compile places on
# sizes (alignment for its kernels) hold for all of them, so none recompiles after warm-up.
COMPILED_LENGTH_MULTIPLE = 64


@dataclass
class Rows:
    """One step's batch as a table: token tensors per row plus response-aligned tensors
    ``[N, R]`` (R = the longest response of the batch)."""

    input_ids: list[torch.Tensor]  # [L] int32 per row: prompt + response
    prompt_lens: list[int]
    group_ids: list[str]
    runs: list[tuple[int, int]]  # (run of its task, env step): workflow runs with several steps
    rewards: torch.Tensor  # [N] float32
    response_mask: torch.Tensor  # [N, R] 1 on response tokens
    rollout_logprobs: torch.Tensor  # [N, R] from vLLM (0 where absent)
    has_logprobs: torch.Tensor  # [N] bool: the row came with rollout logprobs
    expert: torch.Tensor  # [N] bool: source == "expert"
    model_versions: list[int]
    temperatures: torch.Tensor  # [N] float: the logits of each row are divided by it
    # [N, R] a teacher's log-probs of the response tokens (on-policy distillation; 0 where absent)
    teacher_logprobs: torch.Tensor | None = None
    has_teacher: torch.Tensor | None = None  # [N] bool: the row came with teacher_logprobs
    infos: list[dict] = field(default_factory=list)  # each record's info (GiGPO reads it)

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def response_lens(self) -> list[int]:
        return [len(ids) - p for ids, p in zip(self.input_ids, self.prompt_lens)]


def rows_from_experiences(
    exps: Sequence[Experience], default_temperature: float | None = 1.0
) -> Rows:
    """Tabulate a batch; DataError for an empty response (nothing to train on).

    Each row's scoring temperature: 1 for expert rows (data, not samples), else that of the
    temperature the rollout records (:func:`~rft.config.queries.scoring_temperature`), else
    ``default_temperature`` (records of an earlier rft; None: DataError, none can be told)."""
    response_lens = [exp.array_len("response_ids") for exp in exps]
    for exp, length in zip(exps, response_lens):
        if not length:
            raise DataError(
                f"experience {exp.experience_id} has no response tokens; the "
                "explorer must not write empty responses (min_response_tokens >= 1)"
            )
    n = len(exps)
    width = max(response_lens, default=1)
    mask = torch.zeros(n, width)  # [N, R]
    logprobs = torch.zeros(n, width)  # [N, R]
    has_logprobs = torch.zeros(n, dtype=torch.bool)  # [N]
    teacher = torch.zeros(n, width)  # [N, R]
    has_teacher = torch.zeros(n, dtype=torch.bool)  # [N]
    for i, (exp, length) in enumerate(zip(exps, response_lens)):
        mask[i, :length] = 1.0
        if exp.array_len("action_mask"):  # multi-turn: tokens the model did not generate
            mask[i, :length] = packed_tensor(exp.array_bytes("action_mask"), torch.int32).float()
        if num_logprobs := exp.array_len("logprobs"):
            logprobs[i, :num_logprobs] = packed_tensor(exp.array_bytes("logprobs"), torch.float32)
            has_logprobs[i] = True
        if num_teacher := exp.array_len("teacher_logprobs"):
            teacher[i, :num_teacher] = packed_tensor(
                exp.array_bytes("teacher_logprobs"), torch.float32
            )
            has_teacher[i] = True
    return Rows(
        input_ids=[
            packed_tensor(e.array_bytes("prompt_ids") + e.array_bytes("response_ids"), torch.int32)
            for e in exps
        ],
        prompt_lens=[e.array_len("prompt_ids") for e in exps],
        group_ids=[e.group_id for e in exps],
        runs=[(int(e.info.get(RUN_KEY, 0)), int(e.info.get(ENV_STEP_KEY, 0))) for e in exps],
        rewards=torch.tensor([float(e.reward) for e in exps], dtype=torch.float32),  # [N]
        response_mask=mask,
        rollout_logprobs=logprobs,
        has_logprobs=has_logprobs,
        expert=torch.tensor([e.source == "expert" for e in exps], dtype=torch.bool),  # [N]
        model_versions=[e.model_version for e in exps],
        temperatures=torch.tensor(
            [_row_temperature(e, default_temperature) for e in exps], dtype=torch.float32
        ),  # [N]
        teacher_logprobs=teacher,
        has_teacher=has_teacher,
        infos=[e.info for e in exps],
    )


def packed_tensor(raw: bytes, dtype: torch.dtype) -> torch.Tensor:
    """A record's packed native-order values (:meth:`Experience.array_bytes`) as a 1-D tensor
    of ``dtype`` (int32 or float32), copied: no Python number is made on the way."""
    if not raw:
        return torch.empty(0, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=dtype)  # [L]


def _row_temperature(exp: Experience, default: float | None) -> float:
    if exp.source == "expert":
        return 1.0
    if exp.temperature is not None:
        return scoring_temperature(exp.temperature)
    if default is None:
        raise DataError(
            f"experience {exp.experience_id} records no sampling temperature (written "
            "by an earlier rft) and the training tasksets sample at different "
            "temperatures, so it cannot be scored: give the tasksets one "
            "rollout_args.temperature while such experiences remain in the buffer"
        )
    return default


def split_mini_batches(
    group_ids: Sequence[str], expert: torch.Tensor, count: int
) -> list[list[int]]:
    """Row indices of ``count`` mini-batches: the rollout groups in batch order, whole and as
    even as possible (8 groups in 3 -> 3, 3, 2), and the expert rows (CHORD) spread the same way.

    Pure and deterministic, so every rank computes the same split.
    """
    groups: dict[str, list[int]] = {}
    expert_rows = []
    for i, gid in enumerate(group_ids):
        if bool(expert[i]):
            expert_rows.append(i)
        else:
            groups.setdefault(gid, []).append(i)
    minis: list[list[int]] = [[] for _ in range(count)]
    for units in (list(groups.values()), [[i] for i in expert_rows]):
        for index, unit in enumerate(units):
            minis[index * count // max(len(units), 1)].extend(unit)
    return [sorted(mini) for mini in minis if mini]


def split_for_ranks(
    group_ids: Sequence[str], lengths: Sequence[int], world_size: int
) -> list[list[int]]:
    """Row indices per rank: whole groups, largest first, each to the least-loaded rank.

    Deterministic (ties go to the lower rank), so every rank computes the same split. Within a
    rank, rows keep their batch order.
    """
    groups: dict[str, list[int]] = {}
    for i, gid in enumerate(group_ids):
        groups.setdefault(gid, []).append(i)
    order = sorted(groups.values(), key=lambda rows: (-sum(lengths[i] for i in rows), rows[0]))
    load = [0] * world_size
    shares: list[list[int]] = [[] for _ in range(world_size)]
    for rows in order:
        rank = min(range(world_size), key=lambda r: (load[r], r))
        shares[rank].extend(rows)
        load[rank] += sum(lengths[i] for i in rows)
    return [sorted(share) for share in shares]


def plan_micro_batches(
    rows: Sequence[int],
    lengths: Sequence[int],
    *,
    use_dynamic_bsz: bool,
    max_token_len: int,
    micro_batch_size: int,
    packed: bool = False,
) -> list[list[int]]:
    """Group a rank's rows into micro-batches.

    Dynamic: rows sorted by length (less padding), added while the micro-batch's size stays
    within ``max_token_len``: rows * longest padded, the sum of lengths ``packed`` (see
    :func:`collate`); a single row longer than the budget gets a micro-batch of its own.
    Fixed: chunks of ``micro_batch_size`` rows in batch order.
    """
    if not use_dynamic_bsz:
        return [list(rows[i : i + micro_batch_size]) for i in range(0, len(rows), micro_batch_size)]
    micros: list[list[int]] = []
    current: list[int] = []
    longest = total = 0
    for i in sorted(rows, key=lambda r: (-lengths[r], r)):
        grown = max(longest, lengths[i])
        size = total + lengths[i] if packed else grown * (len(current) + 1)
        if current and size > max_token_len:
            micros.append(current)
            current, grown, total = [], lengths[i], 0
        current.append(i)
        longest, total = grown, total + lengths[i]
    if current:
        micros.append(current)
    return micros


@dataclass
class MicroBatch:
    """Tensors of one micro-batch, padded or packed; response tensors are aligned with the
    response (``[B, R]``, right-padded) either way.

    Padded: ``input_ids`` ``[B, T]`` right-padded with ``attention_mask``. Packed: the B
    sequences back to back in one row ``[1, S]``, ``position_ids`` restarting at 0 with each
    (the model's attention keeps sequences apart from them: no mask is passed), and
    ``logit_positions`` index into that row.
    """

    input_ids: torch.Tensor  # [B, T] right-padded, or [1, S] packed
    attention_mask: torch.Tensor  # [B, T] (packed: [1, S] of ones)
    logit_positions: torch.Tensor  # [B, R] position whose logits predict each response token
    response_ids: torch.Tensor  # [B, R]
    response_mask: torch.Tensor  # [B, R] 1 on response tokens that count
    advantages: torch.Tensor  # [B, R]
    old_logprobs: torch.Tensor  # [B, R]
    expert: torch.Tensor  # [B] bool
    rows: list[int]  # indices into the step's Rows (empty for a padding micro-batch)
    ref_logprobs: torch.Tensor | None = None  # [B, R], filled when KL needs it
    is_weights: torch.Tensor | None = None  # [B, R] off-policy correction weights, when on
    temperature: torch.Tensor | float = (
        1.0  # [B] logits are divided by it, per row (Rows.temperatures)
    )
    position_ids: torch.Tensor | None = None  # [1, S] when packed

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum().item())

    @property
    def packed(self) -> bool:
        return self.position_ids is not None

    def model_inputs(self, length_multiple: int = 1) -> dict[str, torch.Tensor]:
        """Keyword arguments of the model's forward for these tokens, the sequence dim padded at
        its end to a multiple of ``length_multiple``: masked columns, or packed, one more
        sequence (positions from 0, so attention keeps it apart) that nothing reads."""
        extra = -self.input_ids.shape[1] % length_multiple
        input_ids = torch.nn.functional.pad(self.input_ids, (0, extra))  # [B, T + extra]
        if self.position_ids is not None:
            tail = torch.arange(extra, device=self.position_ids.device).unsqueeze(0)  # [1, extra]
            return {
                "input_ids": input_ids,
                "position_ids": torch.cat([self.position_ids, tail], dim=1),  # [1, S + extra]
            }
        mask = torch.nn.functional.pad(self.attention_mask, (0, extra))  # [B, T + extra]
        return {"input_ids": input_ids, "attention_mask": mask}

    def sequence_index(self) -> torch.Tensor:
        """``[B, 1]``: the row of ``input_ids`` that holds each sequence (all 0 when packed),
        to index per-position model outputs with ``logit_positions``."""
        return _sequence_rows(self.logit_positions.shape[0], self.packed).to(
            self.logit_positions.device
        )

    def to(self, device: torch.device | str) -> "MicroBatch":
        moved = {
            k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in vars(self).items()
        }
        return MicroBatch(**moved)


def _sequence_rows(b: int, packed: bool) -> torch.Tensor:
    """``[B, 1]``: the row of ``input_ids`` that holds each of B sequences."""
    return (torch.zeros(b, dtype=torch.long) if packed else torch.arange(b)).unsqueeze(-1)


def collate(
    batch: Rows,
    rows: Sequence[int],
    advantages: torch.Tensor,
    old_logprobs: torch.Tensor,
    pad_id: int = 0,
    *,
    packed: bool = False,
) -> MicroBatch:
    """The chosen rows padded to the micro-batch's own longest sequence (padding only inside
    it), or ``packed`` into one row without padding (``trainer.padding_free``: position ids
    restart per sequence); responses padded to the micro-batch's longest.

    ``advantages`` and ``old_logprobs`` are the batch's ``[N, R_batch]`` tensors.
    """
    lengths = [len(batch.input_ids[i]) for i in rows]
    resp_len = max(batch.response_lens[i] for i in rows)
    b = len(rows)
    if packed:
        input_ids = torch.cat([batch.input_ids[i].long() for i in rows]).unsqueeze(0)  # [1, S]
        attention = torch.ones_like(input_ids)  # [1, S]
        position_ids = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)  # [1, S]
        starts = [0, *itertools.accumulate(lengths[:-1])]  # each sequence's offset in the row
    else:
        input_ids = torch.full((b, max(lengths)), pad_id, dtype=torch.long)  # [B, T]
        attention = torch.zeros(b, max(lengths), dtype=torch.long)  # [B, T]
        position_ids, starts = None, [0] * b
        for j, i in enumerate(rows):
            input_ids[j, : lengths[j]] = batch.input_ids[i]
            attention[j, : lengths[j]] = 1
    positions = torch.zeros(b, resp_len, dtype=torch.long)  # [B, R]
    for j, i in enumerate(rows):
        p, n_resp = batch.prompt_lens[i], lengths[j] - batch.prompt_lens[i]
        # logits at position t predict token t + 1; a response at p.. is predicted from p - 1..
        positions[j, :n_resp] = torch.arange(p - 1, p - 1 + n_resp) + starts[j]
        positions[j, n_resp:] = starts[j]  # padding: any position inside the row
    index = torch.tensor(list(rows), dtype=torch.long)  # [B]
    resp_ids = input_ids[
        _sequence_rows(b, packed), (positions + 1).clamp(max=input_ids.shape[1] - 1)
    ]  # [B, R]
    mask = batch.response_mask[index, :resp_len]  # [B, R]
    return MicroBatch(
        input_ids=input_ids,
        attention_mask=attention,
        logit_positions=positions,
        response_ids=resp_ids * mask.long(),
        response_mask=mask,
        advantages=advantages[index, :resp_len].float(),  # [B, R]
        old_logprobs=old_logprobs[index, :resp_len].float(),  # [B, R]
        expert=batch.expert[index],
        rows=list(rows),
        temperature=batch.temperatures[index],  # [B]
        position_ids=position_ids,
    )


def padding_micro(pad_id: int = 0) -> MicroBatch:
    """A zero-weight micro-batch (two tokens, empty mask) that keeps ranks in lockstep: a rank
    with fewer micro-batches than the others runs these, so every rank issues the same
    collectives."""
    zeros = torch.zeros(1, 1)  # [1, 1]
    return MicroBatch(
        input_ids=torch.full((1, 2), pad_id, dtype=torch.long),
        attention_mask=torch.ones(1, 2, dtype=torch.long),
        logit_positions=torch.zeros(1, 1, dtype=torch.long),
        response_ids=torch.zeros(1, 1, dtype=torch.long),
        response_mask=zeros,
        advantages=zeros.clone(),
        old_logprobs=zeros.clone(),
        expert=torch.zeros(1, dtype=torch.bool),
        rows=[],
    )


@dataclass(frozen=True)
class BatchTotals:
    """Counts over the whole step's batch (all ranks): the denominators of the batch loss."""

    tokens: int  # response tokens that count
    sequences: int  # rows with at least one such token
    response_width: int  # R of the whole batch (the seq-mean-token-sum-norm constant)


def micro_loss_scale(mask: torch.Tensor, totals: BatchTotals, mode: str, world_size: int) -> float:
    """Multiplier for a micro-batch loss aggregated with ``mode`` over its own ``[B, R]`` mask.

    Sum over all ranks' micro-batches of scale * micro_loss, divided by ``world_size`` (the
    data-parallel gradient average: DeepSpeed divides summed gradients by the world size),
    equals the loss of the whole batch: for token-mean the
    micro mean is weighted by its token share; the seq-mean modes by their sequence share;
    seq-mean-token-sum-norm (a total token sum / the padded width, no mean) by R_micro / R_batch
    alone, which swaps the micro-batch's width for the batch's.
    """
    if mode == "token-mean":
        share = mask.sum().item() / max(totals.tokens, 1)
    elif mode == "seq-mean-token-sum-norm":
        share = mask.shape[-1] / max(totals.response_width, 1)
    else:
        share = (mask.sum(-1) > 0).sum().item() / max(totals.sequences, 1)
    return share * world_size


def split_by_source(rows: Sequence[int], expert: torch.Tensor) -> list[list[int]]:
    """A rank's rows as [rollout rows, expert rows] (each in order, empty parts left out): with
    expert rows in the batch (CHORD), rollout and expert rows never share a micro-batch."""
    parts = [[i for i in rows if not bool(expert[i])], [i for i in rows if bool(expert[i])]]
    return [part for part in parts if part]


def source_totals(mask: torch.Tensor, expert: torch.Tensor) -> dict[bool, BatchTotals]:
    """Totals per source (key: is expert) of a ``[N, R]`` mask; an absent source counts 0.

    ``response_width`` stays the whole batch's R, as when the loss sees the whole batch.
    ``mix_chord`` aggregates its PPO part over rollout rows and its SFT part over expert rows,
    so with single-source micro-batches the scaled sum is exactly ``mix_chord`` of the batch.
    """
    out = {}
    for is_expert in (False, True):
        part = mask[expert == is_expert]  # [n, R]
        out[is_expert] = BatchTotals(
            int(part.sum().item()), int((part.sum(-1) > 0).sum().item()), mask.shape[-1]
        )
    return out


def source_fractions(totals: dict[bool, BatchTotals], mode: str) -> dict[bool, float]:
    """Each source's share of the batch in ``mode``'s unit (tokens for token-mean, else rows)."""
    sizes = {k: float(t.tokens if mode == "token-mean" else t.sequences) for k, t in totals.items()}
    whole = sum(sizes.values())
    return {k: (v / whole if whole else 0.0) for k, v in sizes.items()}


def micro_source(micro: MicroBatch) -> bool:
    """True for an expert micro-batch (micro-batches hold one source; padding counts as rollout)."""
    expert = micro.expert
    assert bool(expert.all()) or not bool(expert.any()), (
        "a micro-batch mixes rollout and expert rows"
    )
    return bool(expert.any())


LOSS_KEYS = frozenset(
    {POLICY_LOSS}
)  # summed with loss shares: each source's part of the batch loss


@dataclass
class MetricSums:
    """A step's metrics accumulated over micro-batches, then summed over ranks (:meth:`merge`).

    A micro-batch adds its metrics with ``loss_share``, its share of its source's loss (over all
    ranks and epochs these sum to 1 per source; under seq-mean-token-sum-norm each is
    R_micro / R_batch and they need not), and its
    source's ``fraction`` of the batch. ``LOSS_KEYS`` are summed with loss shares, so ``pg_loss``
    is the loss of the whole batch (``mix_chord`` micro-batches report their part: (1 - mu) PPO
    or mu SFT). Every other key is the mean weighted by loss share x fraction over the
    micro-batches that report it: a key both sources report (``mu``, ``entropy``) is a
    whole-batch value, ``usual/*`` one over the rollout rows, ``expert/*`` one over the expert
    rows. With token-mean and the seq-mean modes these are the whole batch's values exactly;
    under seq-mean-token-sum-norm a loss part such as ``usual/pg_loss`` (or ``kl_loss``,
    ``entropy``) is the width-weighted mean of the micro-batches' values, each a token sum over
    its own micro-batch / its own width, so it grows with the micro-batch size. Zero-weight (padding)
    micro-batches are skipped.
    """

    sums: dict[str, float] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)

    def add(self, metrics: dict[str, float], loss_share: float, fraction: float) -> None:
        if loss_share == 0:
            return
        for key, value in metrics.items():
            weight = loss_share if key in LOSS_KEYS else loss_share * fraction
            self.sums[key] = self.sums.get(key, 0.0) + value * weight
            self.weights[key] = self.weights.get(key, 0.0) + weight

    def merge(self, other: "MetricSums") -> None:
        for key, value in other.sums.items():
            self.sums[key] = self.sums.get(key, 0.0) + value
            self.weights[key] = self.weights.get(key, 0.0) + other.weights[key]

    def result(self) -> dict[str, float]:
        return {
            key: total if key in LOSS_KEYS else total / self.weights[key]
            for key, total in self.sums.items()
        }
