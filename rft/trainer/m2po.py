"""M2PO's keep-mask over one optimizer mini-batch (``policy_loss_fn: m2po``), for rft.trainer.step.

Before the mini-batch's backward passes: a no-grad forward over this rank's micro-batches gives
the current log-probs; the squared log-ratios (to the rollout's) of the trust-region tokens are
gathered from every rank, in rank order; every rank drops the same ones over all of them
(:func:`rft.algo.m2po.dropped_by_m2`) and keeps its own slice. Out: one ``[B, R]`` mask per
micro-batch and the mask's metrics, the same on every rank. The math is ``rft.algo.m2po``'s.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from rft.algo.m2po import dropped_by_m2, mask_metrics, trust_region
from rft.errors import ConfigError, DataError
from rft.trainer import engine
from rft.trainer.batching import MicroBatch
from rft.trainer.plan import MiniPlan, Plan, micro_batch

MASK_TIME_S = "time_m2po_mask_s"  # trainer: the step's no-grad passes and gathers of M2PO masks
# config.json keys (substrings) of settings that make a train-mode forward random
_RANDOM_SETTINGS = ("dropout", "pdrop", "layerdrop", "drop_path", "jitter_noise")


@dataclass
class MiniMask:
    """The M2PO mask of one optimizer mini-batch, as this rank needs it."""

    keep: list[torch.Tensor]  # [B, R] bool per micro-batch of the mini-batch (this rank's)
    metrics: dict[str, float]  # rft.algo.m2po's mask metrics over the whole mini-batch


def random_parts(model: torch.nn.Module) -> list[str]:
    """What makes two forwards of ``model`` in train mode differ: dropout modules with p > 0,
    batch norms, and nonzero dropout-like settings of its ``config`` (as Trinity checks)."""
    found = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0:
            found.append(f"{name or 'model'}: {type(module).__name__}(p={module.p})")
        elif isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            found.append(f"{name or 'model'}: {type(module).__name__}")
    config = getattr(engine.causal_lm(model), "config", None)
    settings = config.to_dict() if hasattr(config, "to_dict") else {}
    for key, value in sorted(settings.items()):
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        if numeric and value != 0 and any(word in key for word in _RANDOM_SETTINGS):
            found.append(f"config.json {key}={value}")
    return found


def check_deterministic(model: torch.nn.Module) -> None:
    """ConfigError when the mask's forward and the training forward could disagree."""
    found = random_parts(model)
    if found:
        raise ConfigError(
            "policy_loss_fn m2po computes its mask in a separate forward, which must give the "
            f"training forward's log-probs, but the model is random in train mode ({found}); "
            "set these to 0 (config.json, LoRA's lora_dropout)"
        )


def rank_span(parts: Sequence[torch.Tensor], rank: int) -> slice:
    """Where rank ``rank``'s values lie in the concatenation of every rank's ``parts``."""
    start = sum(len(p) for p in parts[:rank])
    return slice(start, start + len(parts[rank]))


def _current_log_ratios(
    actor: engine.Actor, micros: list[MicroBatch]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per micro-batch, its trust-region mask ``[B, R]`` and those tokens' squared log-ratios
    ``[K_micro]`` (on the CPU, row-major), from a no-grad forward at the current weights."""
    regions, values = [], []
    with torch.no_grad():
        for micro in micros:
            logprob = engine.forward_logprobs(actor.engine, micro, with_entropy=False)[0]
            log_ratio = logprob.float() - micro.old_logprobs  # [B, R]
            counted = micro.response_mask.bool()  # [B, R]
            if not bool(torch.isfinite(log_ratio[counted]).all()):
                raise DataError(
                    "policy_loss_fn m2po: a rollout log-prob is not finite (log ratio "
                    "inf or nan); check the explorer's logprobs of these experiences"
                )
            region = trust_region(log_ratio, micro.advantages, counted)  # [B, R]
            regions.append(region)
            values.append(log_ratio[region].square().cpu())  # [K_micro]
    return regions, values


def mini_batch_mask(
    actor: engine.Actor,
    plan: Plan,
    mini: MiniPlan,
    adv: torch.Tensor,
    old: torch.Tensor,
    pad_id: int,
    info: engine.DistInfo,
    threshold: float,
) -> MiniMask:
    """The mini-batch's M2PO mask at the current weights (a collective: every rank calls it
    for the same mini-batch). ``adv`` and ``old`` (the rollout's log-probs) are ``[N, R]``."""
    t0 = time.perf_counter()
    check_deterministic(actor.module)
    micros = [micro_batch(plan, rows, adv, old, pad_id, info.device) for rows in mini.micro_rows]
    regions, values = _current_log_ratios(actor, micros)
    parts = engine.all_gather_objects(torch.cat(values))  # [K_r] per rank, in rank order
    every = torch.cat(list(parts))  # [K] the whole mini-batch's
    dropped = dropped_by_m2(every, threshold)  # [K], the same on every rank
    mine = dropped[rank_span(parts, info.rank)].split([len(v) for v in values])
    keep = []
    for micro, region, drops in zip(micros, regions, mine):
        mask = micro.response_mask.bool().clone()  # [B, R]
        mask[region] = ~drops.to(mask.device)
        keep.append(mask)
    counted = sum(t.tokens for t in mini.totals.values())
    metrics = mask_metrics(every, dropped, counted)
    metrics[MASK_TIME_S] = time.perf_counter() - t0
    return MiniMask(keep, metrics)


def step_metrics(masks: Sequence[MiniMask]) -> dict[str, float]:
    """The step's mask metrics: each mini-batch's mean over the step's updates, the time summed."""
    if not masks:
        return {}
    keys = [k for k in masks[0].metrics if k != MASK_TIME_S]
    out = {k: math.fsum(m.metrics[k] for m in masks) / len(masks) for k in keys}
    out[MASK_TIME_S] = math.fsum(m.metrics[MASK_TIME_S] for m in masks)
    return out
