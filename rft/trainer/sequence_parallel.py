"""Ulysses sequence parallelism (``trainer.ulysses_sequence_parallel_size``, veRL's and
Trinity's key): the tokens of each micro-batch split across the ``size`` ranks of a group, so no
GPU holds a whole long sequence's activations.

Layout: trainer ranks ``[g*size, (g+1)*size)`` form sequence group g (data-parallel rank g of
``world / size``). Every rank of a group takes the same rows; rank p of the group feeds the
model positions ``[p*t, (p+1)*t)`` of the (padded) rows, t = T / size, with their global
position ids. Attention is the one place that needs the whole sequence: there an all-to-all
trades the sequence split for a split of the heads (each rank attends over all T positions
with ``heads / size`` heads, causally), and a second all-to-all trades back (DeepSpeed-Ulysses,
arXiv 2309.14509). Rows are right-padded and attention is causal, so no padding mask is needed:
a real token never sees the padding after it.

Each rank scores the counted tokens of its own positions; :func:`gather_tokens` sums the
``[B, R]`` log-probs (and entropies) over the group, differentiably, so every rank computes the
micro-batch's whole loss as without sequence parallelism. Its backward sums the (identical)
upstream gradients of the group, which with DeepSpeed's average over all ranks gives the
average over the data-parallel groups: the step's gradient is the same as without it.

Data in: the trainer's ranks (``torch.distributed`` joined) and the model config. Data out:
the active :class:`SequenceParallel` (:func:`active`), transformers' ``sdpa`` attention wrapped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

from rft.errors import ConfigError
from rft.placement import sequence_group_layout


@dataclass(frozen=True)
class SequenceParallel:
    """This rank's sequence group."""

    size: int  # ranks per group
    rank: int  # this rank's place in its group: it holds the size-th part p of the positions
    group: Any  # torch.distributed ProcessGroup of the group's ranks

    def shard(self, inputs: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], int]:
        """The model's keyword arguments for this rank's positions of ``inputs`` (input ids
        ``[B, T]``, T a multiple of ``size``, right-padded rows) and the first position it
        holds: ``input_ids [B, t]`` and their global ``position_ids``, no attention mask."""
        if "position_ids" in inputs:
            raise ValueError("packed micro-batches are not split across a sequence group")
        ids = inputs["input_ids"]  # [B, T]
        t = ids.shape[1] // self.size
        start = self.rank * t
        positions = torch.arange(start, start + t, device=ids.device).unsqueeze(0)  # [1, t]
        return {
            "input_ids": ids[:, start : start + t],
            "position_ids": positions.expand(ids.shape[0], t),
        }, start


_ACTIVE: Optional[SequenceParallel] = None


def active() -> Optional[SequenceParallel]:
    """The sequence group of this process's trainer, or None (sequences whole on each rank)."""
    return _ACTIVE


def setup(size: int, rank: int, world_size: int) -> SequenceParallel:
    """Form the sequence groups (a collective: every rank calls it) and route transformers'
    SDPA attention through :func:`ulysses_attention`; this process's group is :func:`active`."""
    global _ACTIVE
    _, _, place = sequence_group_layout(rank, world_size, size)
    mine = None
    for first in range(0, world_size, size):
        group = dist.new_group(list(range(first, first + size)))
        if first <= rank < first + size:
            mine = group
    _ACTIVE = SequenceParallel(size, place, mine)
    _wrap_sdpa()
    return _ACTIVE


def check_attention(model: torch.nn.Module, path: str) -> None:
    """A model the group trains or scores must attend through transformers' ``sdpa`` kernel,
    the one :func:`ulysses_attention` wraps: another kernel would attend over this rank's
    positions only, silently. ConfigError naming the kernel it loaded with."""
    kernel = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if active() is not None and kernel != "sdpa":
        raise ConfigError(
            f"{path} loaded with attention kernel {kernel!r}, but "
            "trainer.ulysses_sequence_parallel_size splits attention inside transformers' "
            "'sdpa' kernel only; use a model type transformers runs with sdpa, or set the size "
            "to 1"
        )


def length_multiple(multiple: int) -> int:
    """Padded sequence lengths: a multiple of ``multiple`` and of the group's size."""
    sp = active()
    return multiple if sp is None else math.lcm(multiple, sp.size)


# ----------------------------------------------------------------------------- collectives


class _AllToAll(torch.autograd.Function):
    """Dim-0 all-to-all over a group: part i of each rank goes to rank i. It is a block
    transpose across ranks, so its adjoint (the backward) is the same exchange."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return _exchange(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _exchange(grad, ctx.group), None


def _exchange(x: torch.Tensor, group: Any) -> torch.Tensor:
    x = x.contiguous()  # before empty_like, which keeps a view's strides
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    return out


class _AllReduceSum(torch.autograd.Function):
    """Sum over a group; the gradient of each input is the sum of the outputs' gradients."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        out = x.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        out = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out, group=ctx.group)
        return out, None


def gather_tokens(values: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """``[B, R]`` per-token values, each rank's own tokens set and the rest 0, summed over the
    group (differentiably): every rank gets all of them."""
    return _AllReduceSum.apply(values, sp.group)


def seq_to_heads(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """``[B, H, t, D]`` (all heads, this rank's positions) -> ``[B, H/size, T, D]`` (its share
    of the heads, every position in order)."""
    b, h, t, d = x.shape
    parts = x.reshape(b, sp.size, h // sp.size, t, d).transpose(0, 1)  # [s, B, H/s, t, D]
    got = _AllToAll.apply(parts, sp.group)  # [s, B, H/s, t, D]: rank i's positions
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // sp.size, sp.size * t, d)


def heads_to_seq(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """``[B, T, H/size, D]`` (attention's output for this rank's heads) -> ``[B, t, H, D]``
    (every head, this rank's positions)."""
    b, full, hl, d = x.shape
    t = full // sp.size
    parts = x.reshape(b, sp.size, t, hl, d).transpose(0, 1)  # [s, B, t, H/s, D]
    got = _AllToAll.apply(parts, sp.group)  # [s, B, t, H/s, D]: rank i's heads
    return got.permute(1, 2, 0, 3, 4).reshape(b, t, sp.size * hl, d)


# ----------------------------------------------------------------------------- attention

_CORE_SDPA: Any = None  # transformers' own sdpa_attention_forward


@torch.compiler.disable  # run eagerly inside compiled layers (trainer.compile_layers): traced,
# an autograd function that fills a buffer by a collective gets a zero gradient (DeepSpeed's note)
def ulysses_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface over a sequence group: query ``[B, Hq, t, D]``, key and
    value ``[B, Hkv, t, D]`` of this rank's positions -> ``[B, t, Hq, D]``. The model's mask,
    built for t positions, is dropped: attention over the T gathered positions is causal."""
    sp = active()
    if sp is None:
        return _CORE_SDPA(module, query, key, value, attention_mask, **kwargs)
    q, k, v = (seq_to_heads(x, sp) for x in (query, key, value))
    kwargs.pop("is_causal", None)
    out, _ = _CORE_SDPA(module, q, k, v, None, is_causal=True, **kwargs)  # [B, T, Hq/s, D]
    return heads_to_seq(out, sp), None


def _wrap_sdpa() -> None:
    """Route the ``sdpa`` attention of every model loaded afterwards (and before) through
    :func:`ulysses_attention` (transformers looks its kernels up by name at each call)."""
    global _CORE_SDPA
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if _CORE_SDPA is None:
        _CORE_SDPA = ALL_ATTENTION_FUNCTIONS["sdpa"]
    ALL_ATTENTION_FUNCTIONS["sdpa"] = ulysses_attention
