"""One training step of the policy on this rank's share of a batch (data-parallel over ranks).

Data in: the step's experiences (identical on every rank), the actor, an optional reference model
and critic, and the algorithm's functions (:class:`LossFns`). Data out: the model updated once
per mini-batch and epoch, and the step's metrics over the whole batch (meaningful on rank 0).
Phases of :func:`train_step`: :func:`prepare_inputs` (plan, reference and old log-probs, critic
values, teacher log-probs, advantages) -> :func:`_update_critic` -> correction weights ->
:func:`update_policy` (per epoch, mini- and micro-batch: forward, loss x its share, backward; one
optimizer step per mini-batch) -> :func:`step_metrics`. The math stays in ``rft.algo``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from rft.algo.advantages import token_level_rewards
from rft.algo.correction import CorrectionSums
from rft.algo.losses import ENTROPY
from rft.buffer.experience import Experience
from rft.config.schema import Config
from rft.errors import DataError
from rft.monitor import (
    BATCH_EXPERIENCES,
    BATCH_TOKENS,
    CRITIC_WARMUP,
    OLD_LOGPROBS_TIME_S,
    POLICY_LOSS,
    UPDATES,
)
from rft.trainer import engine, m2po
from rft.trainer.algorithm import LossFns
from rft.trainer.batching import (
    MetricSums,
    MicroBatch,
    Rows,
    micro_loss_scale,
    micro_source,
    source_fractions,
)
from rft.trainer.critic import old_values, update_critic, value_metrics
from rft.trainer.distill import add_trainer_teacher_logprobs, teacher_inputs
from rft.trainer.plan import (
    MiniPlan,
    Plan,
    gather_rows,
    local_pass,
    local_passes,
    micro_batch,
    narrow_mask,
    plan_step,
)


def _advantages(
    plan: Plan,
    fns: LossFns,
    ref: torch.Tensor | None,
    old: torch.Tensor,
    info: engine.DistInfo,
    values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, float]]:
    """Advantages ``[N, R]`` of the rollout rows (expert rows, CHORD's, get 0) and, with GAE
    (``values`` from the critic), the returns ``[N, R]`` the critic learns (else None)."""
    rows, mask = plan.rows, plan.rows.response_mask
    adv = torch.zeros_like(mask)  # [N, R]
    rollout = [i for i in range(len(rows)) if not bool(rows.expert[i])]
    if (fns.advantage is None and fns.gae is None) or not rollout:
        return adv, None, {}
    metrics: dict[str, float] = {}
    rewards: torch.Tensor = rows.rewards  # [N]
    if fns.kl_penalty is not None:
        assert ref is not None
        mine = plan.local_rows
        local, metrics = fns.kl_penalty(
            token_level_rewards(rows.rewards, mask)[mine], old[mine], ref[mine], mask[mine]
        )  # [n, R]
        rewards = torch.zeros_like(mask)  # [N, R]
        for part_rows, part in engine.all_gather_objects((mine, local)):
            rewards[part_rows] = part
    if fns.gae is not None:
        assert values is not None
        returns = torch.zeros_like(mask)  # [N, R]
        adv[rollout], returns[rollout], gae_metrics = fns.gae(
            token_level_rewards(rewards, mask)[rollout], values[rollout], mask[rollout]
        )
        return adv, returns, {**metrics, **gae_metrics}
    context = {"runs": [rows.runs[i] for i in rollout]} if fns.advantage_by_run else {}
    if fns.advantage_by_info:
        context["infos"] = [rows.infos[i] for i in rollout]
    if fns.advantage_by_logprobs:  # rank_penalty: each response's mean rollout log-prob
        context["logprob_means"] = mean_rollout_logprobs(rows, rollout)
    if fns.advantage_by_teacher:  # on-policy distillation: the teacher's per-token log-probs
        # recomputed old log-probs are this rank's rows only: the advantage (and its metrics,
        # reported by rank 0) reads every row
        context = teacher_inputs(
            rows, rollout, gather_rows(plan, old) if fns.recompute_old else old
        )
    part, adv_metrics = fns.advantage(
        rewards[rollout], [rows.group_ids[i] for i in rollout], mask[rollout], **context
    )  # [n, R]
    adv[rollout] = part
    return adv, None, {**metrics, **adv_metrics}


def _need_rollout_logprobs(rows: Rows, which: list[int], what: str, remedy: str) -> None:
    """A DataError naming ``what`` reads rollout log-probs when a row of ``which`` lacks them."""
    missing = [i for i in which if not bool(rows.has_logprobs[i])]
    if missing:
        raise DataError(
            f"{what} reads the rollout log-probs of each response, but {len(missing)} of the "
            "step's rows came without them (a workflow that builds experiences without "
            f"logprobs); {remedy} or record them"
        )


def mean_rollout_logprobs(rows: Rows, which: list[int]) -> torch.Tensor:
    """Each row's mean vLLM log-prob over its response positions ``[n]`` (Trinity's
    rank_penalty ranks a group's responses by it); a row that came without log-probs cannot be
    ranked."""
    _need_rollout_logprobs(
        rows, which, "algorithm.advantage_fn_args.rank_penalty", "unset rank_penalty"
    )
    # Trinity's torch.mean(exp.logprobs): over every response position, tool or environment
    # tokens of a multi-turn response included (the loss mask does not narrow it)
    lengths = torch.tensor([rows.response_lens[i] for i in which], dtype=torch.float32)  # [n]
    total = rows.rollout_logprobs[which].sum(dim=-1)  # [n], 0 past each response
    return total / lengths.clamp(min=1)


def _filter_tokens(
    plan: Plan, fns: LossFns, adv: torch.Tensor, entropy: torch.Tensor
) -> dict[str, float]:
    """Clip-B's token filter (``fns.token_filter``) over the rollout rows of the whole batch:
    from the advantages ``adv`` ``[N, R]`` (zeroed in place where dropped), the rollout
    log-probs and this rank's old-pass ``entropy`` ``[N, R]`` (gathered from every rank), the
    rows' mask narrowed to the kept tokens (:func:`rft.trainer.plan.narrow_mask`); its metrics."""
    rows = plan.rows
    rollout = [i for i in range(len(rows)) if not bool(rows.expert[i])]
    if fns.token_filter is None or not rollout:
        return {}
    _need_rollout_logprobs(rows, rollout, "algorithm.advantage_fn clipb", "choose grpo")
    every = gather_rows(plan, entropy)  # [N, R]
    keep, metrics = fns.token_filter(
        adv[rollout], rows.response_mask[rollout], rows.rollout_logprobs[rollout], every[rollout]
    )  # [n, R]
    mask = rows.response_mask.clone()  # [N, R]
    mask[rollout] = keep
    adv[rollout] = adv[rollout] * keep
    narrow_mask(plan, mask)
    return metrics


def _correction_rows(
    plan: Plan, fns: LossFns, rows: list[int], proximal: torch.Tensor
) -> tuple[torch.Tensor, CorrectionSums]:
    """Correction weights ``[n, R]`` of ``rows`` from their proximal log-probs ``[n, R]``
    (1 on expert rows and rows without behaviour log-probs) and their sums."""
    assert fns.correction is not None
    table, width = plan.rows, proximal.shape[1]
    weighted = (~table.expert[rows] & table.has_logprobs[rows]).to(proximal.device)  # [n]
    mask = table.response_mask[rows, :width].to(proximal.device) * weighted.unsqueeze(-1)  # [n, R]
    behaviour = table.rollout_logprobs[rows, :width].to(proximal.device)  # [n, R]
    weights, sums = fns.correction(proximal, behaviour, mask)  # [n, R]
    return torch.where(weighted.unsqueeze(-1), weights, torch.ones_like(weights)), sums


def _gather_correction(sums: CorrectionSums) -> dict[str, float]:
    """The step's correction metrics over all ranks."""
    total = CorrectionSums()
    for part in engine.all_gather_objects(sums):
        total.merge(part)
    return total.metrics()


def _correction(
    plan: Plan, fns: LossFns, old: torch.Tensor
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """Off-policy correction weights ``[N, R]`` (this rank's rollout rows; 1 elsewhere) and the
    step's correction metrics over all ranks; (None, {}) when the correction is off."""
    if fns.correction is None:
        return None, {}
    mine = plan.local_rows
    weights = torch.ones_like(old)  # [N, R]
    sums = CorrectionSums()
    if mine:
        weights[mine], sums = _correction_rows(plan, fns, mine, old[mine])
    return weights, _gather_correction(sums)


def old_pass_skippable(fns: LossFns, updates: int) -> bool:
    """Whether the no-grad old-log-prob pass can be skipped: recomputed old log-probs, one
    update (one mini-batch, one epoch) and nothing that needs them before the update (a KL
    penalty in the reward). Then they equal the training forward's own log-probs, detached,
    and each micro-batch takes them (and its correction weights, proximal = old) from its
    forward; metric ``old_logprobs_skipped``."""
    return (
        fns.recompute_old
        and updates == 1
        and fns.kl_penalty is None
        and not fns.advantage_by_teacher  # the distillation advantage reads them first
        and fns.token_filter is None  # Clip-B reads the old pass's entropies first
    )


def _micro_loss(
    micro: MicroBatch,
    logprob: torch.Tensor,
    entropy: torch.Tensor,
    fns: LossFns,
    step: int,
    batch_weight: float = 1.0,
    m2po_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The micro-batch's loss from its forward's ``logprob`` and ``entropy`` ``[B, R]``.
    ``batch_weight`` (:func:`_batch_term_weight`) weights the terms over every row (KL, entropy
    bonus) of a micro-batch that holds one source of a mixed batch. ``m2po_mask`` ``[B, R]``:
    the tokens M2PO keeps (:mod:`rft.trainer.m2po`), for ``policy_loss_fn: m2po`` only."""
    mask = micro.response_mask
    extra = {} if m2po_mask is None else {"m2po_mask": m2po_mask}
    loss, metrics = fns.policy(
        logprob,
        micro.old_logprobs,
        micro.advantages,
        mask,
        step=step,
        expert_mask=micro.expert,  # mix_chord's mu schedule and SFT rows
        is_weights=micro.is_weights,
        **extra,
    )
    if not fns.sft:  # SFT's loss is its own metric (rft.algo.losses.SFT_LOSS)
        metrics[POLICY_LOSS] = loss.item()
    if fns.entropy_in_loss:
        ent_loss, ent_metrics = fns.entropy(entropy, mask, expert_mask=micro.expert)
        # a rollout-only bonus is its source's own part, like the policy loss's
        loss = loss + ent_loss * (1.0 if fns.entropy_rollout_only else batch_weight)
        metrics.update(ent_metrics)
    else:
        metrics[ENTROPY] = float((entropy * mask).sum() / mask.sum().clamp(min=1))
    if fns.kl_loss is not None:
        assert micro.ref_logprobs is not None
        kl_term, kl_metrics = fns.kl_loss(logprob, micro.ref_logprobs, mask)
        loss = loss + kl_term * batch_weight
        metrics.update(kl_metrics)
    metrics["logprob_mean"] = float((logprob.detach() * mask).sum() / mask.sum().clamp(min=1))
    return loss, metrics


def _batch_term_weight(source_fraction: float, agg_mode: str) -> float:
    """Weight of a whole-batch term (KL, entropy) in a one-source micro-batch: the micro-batch
    scales make each source's terms sum to that source's aggregate, so the whole batch's is
    their mean weighted by each source's share; under seq-mean-token-sum-norm (a total token
    sum over the padded width, no mean) it is their plain sum."""
    return 1.0 if agg_mode == "seq-mean-token-sum-norm" else source_fraction


def _old_from_forward(
    plan: Plan, fns: LossFns, rows: list[int], micro: MicroBatch, proximal: torch.Tensor
) -> CorrectionSums:
    """For a skipped old-log-prob pass: set the micro-batch's old log-probs to its forward's
    ``proximal`` ``[B, R]`` (detached; PPO ratio 1 in value, the same gradient) and its
    correction weights from them (proximal = old); return the weights' statistics."""
    micro.old_logprobs = proximal
    if fns.correction is None or not rows:
        return CorrectionSums()
    micro.is_weights, sums = _correction_rows(plan, fns, rows, proximal.float())
    return sums


# ----------------------------------------------------------------------------- the phases


@dataclass
class StepInputs:
    """What the updates read, prepared before the first (tensors over the step's rows)."""

    plan: Plan
    ref: torch.Tensor | None  # [N, R] reference log-probs (KL loss or penalty), else None
    response_tokens: torch.Tensor  # [N] response tokens per row before any token filter
    old: torch.Tensor  # [N, R] old log-probs; zeros when skip_old (filled per micro-batch)
    skip_old: bool  # old log-probs (and correction weights) come from each training forward
    adv: torch.Tensor  # [N, R] advantages (0 on expert rows)
    values: torch.Tensor | None  # [N, R] the critic's values before its update, else None
    returns: torch.Tensor | None  # [N, R] GAE's returns the critic learns, else None
    metrics: dict[str, float]  # the step's metrics so far (advantages, teacher, critic, ...)
    old_logprobs_time_s: float  # the old-log-prob pass
    is_weights: torch.Tensor | None = None  # [N, R] correction weights (set after the critic's)


@dataclass
class PolicyUpdates:
    """What the policy's updates leave: this rank's metric sums and the updates' statistics."""

    sums: MetricSums = field(default_factory=MetricSums)
    grad_norms: list[float] = field(default_factory=list)  # one per optimizer update
    m2po_masks: list[m2po.MiniMask] = field(default_factory=list)  # per update, at its weights
    correction: CorrectionSums = field(default_factory=CorrectionSums)  # of a skipped old pass
    forward_backward_s: float = 0.0
    optimizer_s: float = 0.0


def _old_logprobs(
    actor: engine.Actor, plan: Plan, fns: LossFns, skip: bool, pad_id: int, info: engine.DistInfo
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Old log-probs ``[N, R]``: recomputed on this rank's rows, the rollout's, or zeros where
    the pass is skipped (:func:`old_pass_skippable`: each micro-batch fills its own); with a
    token filter (Clip-B) the recomputed pass's entropies ``[N, R]`` too, else None."""
    mask = plan.rows.response_mask  # [N, R]
    if skip:
        return torch.zeros_like(mask), None
    if fns.recompute_old and fns.token_filter is not None:

        def both(m: MicroBatch) -> tuple[torch.Tensor, ...]:
            logprob, entropy = engine.forward_logprobs(actor.engine, m, with_entropy=True)
            assert entropy is not None
            return logprob, entropy

        old, entropy = local_passes(both, plan, pad_id, info.device)
        return old, entropy
    if fns.recompute_old:
        old = local_pass(
            lambda m: engine.forward_logprobs(actor.engine, m, with_entropy=False)[0],
            plan,
            pad_id,
            info.device,
        )
        return old, None
    if not fns.sft and not bool((plan.rows.has_logprobs | plan.rows.expert).all()):
        raise DataError(
            "algorithm.old_logprobs is 'rollout' but some experiences carry no "
            "logprobs; use old_logprobs: recompute"
        )
    return plan.rows.rollout_logprobs, None


def prepare_inputs(
    actor: engine.Actor,
    ref: engine.Reference | None,
    critic: engine.Actor | None,
    plan: Plan,
    cfg: Config,
    fns: LossFns,
    pad_id: int,
    info: engine.DistInfo,
) -> StepInputs:
    """Reference and old log-probs, the critic's values, the teacher's log-probs (distillation
    with the teacher in the trainer) and the advantages of the step's rows."""
    ref_lp = None
    if fns.needs_ref:
        assert ref is not None
        ref_lp = local_pass(lambda m: engine.reference_logprobs(ref, m), plan, pad_id, info.device)
    skip_old = old_pass_skippable(fns, cfg.trainer.ppo_epochs * len(plan.minis))
    response_tokens = plan.rows.response_mask.sum(-1)  # [N]
    t_old = time.perf_counter()
    old, entropy = _old_logprobs(actor, plan, fns, skip_old, pad_id, info)  # [N, R] each
    t_old = time.perf_counter() - t_old
    values = None if critic is None else old_values(critic, plan, pad_id, info.device)  # [N, R]
    teacher = (  # distillation with the teacher in the trainer: its log-probs, rows lacking them
        add_trainer_teacher_logprobs(cfg, plan, pad_id, info) if fns.advantage_by_teacher else {}
    )
    adv, returns, metrics = _advantages(plan, fns, ref_lp, old, info, values)
    metrics.update(teacher)
    if entropy is not None:
        metrics.update(_filter_tokens(plan, fns, adv, entropy))
    return StepInputs(
        plan, ref_lp, response_tokens, old, skip_old, adv, values, returns, metrics, t_old
    )


def _update_critic(
    critic: engine.Actor, inputs: StepInputs, cfg: Config, pad_id: int, info: engine.DistInfo
) -> dict[str, float]:
    """How well the old values predicted GAE's returns, then the critic's updates' metrics."""
    values, returns, rows = inputs.values, inputs.returns, inputs.plan.rows
    assert values is not None and returns is not None
    rollout_mask = rows.response_mask * (~rows.expert).unsqueeze(-1)  # [N, R]
    metrics = value_metrics(values, returns, rollout_mask)
    metrics.update(
        update_critic(
            critic,
            inputs.plan,
            values,
            returns,
            epochs=cfg.trainer.ppo_epochs,
            cliprange_value=cfg.trainer.trainer_config.critic.cliprange_value,
            pad_id=pad_id,
            info=info,
        )
    )
    return metrics


def _micro_inputs(
    inputs: StepInputs, rows: list[int], pad_id: int, device: torch.device
) -> MicroBatch:
    """The micro-batch of ``rows`` with its reference log-probs and correction weights."""
    micro = micro_batch(inputs.plan, rows, inputs.adv, inputs.old, pad_id, device)
    width = micro.response_mask.shape[1]
    if inputs.ref is not None:
        micro.ref_logprobs = (
            inputs.ref[rows, :width].to(device) if rows else torch.zeros_like(micro.response_mask)
        )
    if inputs.is_weights is not None:
        micro.is_weights = (
            inputs.is_weights[rows, :width].to(device)
            if rows
            else torch.ones_like(micro.response_mask)
        )
    return micro


def _mini_batch(
    actor: engine.Actor,
    inputs: StepInputs,
    mini: MiniPlan,
    m2po_keep: list[torch.Tensor] | None,
    fns: LossFns,
    step: int,
    updates: int,
    pad_id: int,
    info: engine.DistInfo,
    done: PolicyUpdates,
) -> None:
    """Forward and backward of one mini-batch's micro-batches (the gradients accumulate), each
    loss x its share; their metrics (and a skipped pass's correction sums) added to ``done``."""
    fractions = source_fractions(mini.totals, fns.agg_mode)
    for k, rows in enumerate(mini.micro_rows):
        micro = _micro_inputs(inputs, rows, pad_id, info.device)
        source = micro_source(micro)
        scale = micro_loss_scale(  # data-parallel shares: a sequence group's ranks share rows
            micro.response_mask, mini.totals[source], fns.agg_mode, info.dp_size
        )
        logprob, entropy = engine.forward_logprobs(
            actor.engine, micro, with_entropy=True, entropy_grad=fns.entropy_in_loss
        )  # [B, R] each
        assert entropy is not None
        if inputs.skip_old:
            done.correction.merge(
                _old_from_forward(inputs.plan, fns, rows, micro, logprob.detach())
            )
        whole = _batch_term_weight(fractions[source], fns.agg_mode)
        keep = None if m2po_keep is None else m2po_keep[k]
        loss, metrics = _micro_loss(micro, logprob, entropy, fns, step, whole, keep)
        engine.backward(actor, loss * scale)
        # every rank's sums: a sequence group's ranks hold the same metrics (scale / world)
        done.sums.add(metrics, scale / info.world_size / updates, fractions[source])


def update_policy(
    actor: engine.Actor,
    inputs: StepInputs,
    fns: LossFns,
    epochs: int,
    step: int,
    pad_id: int,
    info: engine.DistInfo,
) -> PolicyUpdates:
    """Per epoch and mini-batch: its micro-batches' forward and backward, then one optimizer
    step (M2PO's keep-mask taken first, at the weights of that update)."""
    plan, done = inputs.plan, PolicyUpdates()
    updates = epochs * len(plan.minis)
    for _epoch in range(epochs):
        for mini in plan.minis:
            t1 = time.perf_counter()
            keep = None
            if fns.m2po_threshold is not None:
                done.m2po_masks.append(
                    m2po.mini_batch_mask(
                        actor, plan, mini, inputs.adv, inputs.old, pad_id, info, fns.m2po_threshold
                    )
                )
                keep = done.m2po_masks[-1].keep
            _mini_batch(actor, inputs, mini, keep, fns, step, updates, pad_id, info, done)
            t2 = time.perf_counter()
            done.grad_norms.append(engine.optimizer_step(actor))
            done.forward_backward_s += t2 - t1
            done.optimizer_s += time.perf_counter() - t2
    return done


def step_metrics(
    actor: engine.Actor,
    inputs: StepInputs,
    done: PolicyUpdates,
    fns: LossFns,
    num_experiences: int,
    prepare_s: float,
) -> dict[str, float]:
    """The step's metrics over all ranks: the inputs', the updates' and the batch's."""
    plan, metrics = inputs.plan, inputs.metrics
    mask = plan.rows.response_mask  # [N, R]
    metrics.update(engine.reduce_metric_sums(done.sums))
    metrics.update(m2po.step_metrics(done.m2po_masks))
    if inputs.skip_old and fns.correction is not None:
        metrics.update(_gather_correction(done.correction))
    rollout = ~plan.rows.expert  # [N]
    adv_rows = (inputs.adv.sum(-1) / mask.sum(-1).clamp(min=1))[rollout]  # [n] per response
    lengths = inputs.response_tokens  # [N] before a token filter narrowed the mask
    if bool(plan.rows.expert.any()) and not fns.sft:
        metrics["batch_expert_samples"] = int(plan.rows.expert.sum())
    metrics.update(
        grad_norm=sum(done.grad_norms) / len(done.grad_norms),
        lr=engine.current_lr(actor),
        advantages_mean=float(adv_rows.mean()) if len(adv_rows) else 0.0,
        advantages_std=float(adv_rows.std()) if len(adv_rows) > 1 else 0.0,
        response_length_mean=float(lengths.mean()),
        response_length_max=float(lengths.max()),
        micro_batches=sum(len(mini.micro_rows) for mini in plan.minis),
        time_prepare_s=prepare_s,
        old_logprobs_skipped=int(inputs.skip_old),
        time_forward_backward_s=done.forward_backward_s,
        time_optimizer_s=done.optimizer_s,
    )
    metrics.update({UPDATES: len(done.grad_norms), **_batch_sizes(inputs, num_experiences)})
    return metrics


def _batch_sizes(inputs: StepInputs, num_experiences: int) -> dict[str, float]:
    return {
        BATCH_EXPERIENCES: num_experiences,
        BATCH_TOKENS: inputs.plan.num_tokens,
        OLD_LOGPROBS_TIME_S: inputs.old_logprobs_time_s,
    }


def train_step(
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
    """Prepare and apply one step's updates; return its metrics (timings included). With a
    ``critic`` (``advantage_fn: ppo``) its values give GAE advantages, it is updated first, and
    the policy is left alone during the first ``critic_warmup`` steps."""
    if not exps:  # e.g. every prompt of the step was overlong and left out: nothing to learn
        return {UPDATES: 0, BATCH_EXPERIENCES: 0, BATCH_TOKENS: 0}
    t0 = time.perf_counter()
    plan = plan_step(exps, cfg, info)
    inputs = prepare_inputs(actor, ref, critic, plan, cfg, fns, pad_id, info)
    if critic is not None:
        inputs.metrics.update(_update_critic(critic, inputs, cfg, pad_id, info))
    if step <= cfg.trainer.trainer_config.trainer.critic_warmup:  # the critic learns first
        sizes = _batch_sizes(inputs, len(exps))
        return {**inputs.metrics, UPDATES: 0, CRITIC_WARMUP: 1, **sizes}
    if not inputs.skip_old:  # skipped: each micro-batch weighs itself (_old_from_forward)
        inputs.is_weights, correction_metrics = _correction(plan, fns, inputs.old)  # [N, R]
        inputs.metrics.update(correction_metrics)
    prepare_s = time.perf_counter() - t0
    done = update_policy(actor, inputs, fns, cfg.trainer.ppo_epochs, step, pad_id, info)
    return step_metrics(actor, inputs, done, fns, len(exps), prepare_s)
