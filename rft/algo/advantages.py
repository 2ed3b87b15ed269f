"""Advantage estimators (pure torch): rewards of a batch of responses -> token-level advantages.

Data in: ``rewards`` ``[B]`` (or ``[B, L]`` token rewards), ``group_ids`` ``[B]`` (the responses
of one task share an id) and ``mask`` ``[B, L]``. Data out: ``(advantages [B, L] float32,
metrics)``, zero off the mask. ``ADVANTAGE_FNS`` maps Trinity-RFT's names to the functions.
"""

from __future__ import annotations

import math
from typing import Callable, Hashable, Sequence, Union

import torch

GroupIds = Union[torch.Tensor, Sequence[Hashable]]
Metrics = dict[str, float]
AdvantageOut = tuple[torch.Tensor, Metrics]


def group_index(
    group_ids: GroupIds, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, int]:
    """Number the distinct ids in order of first appearance: ``[B]`` long tensor, group count."""
    keys = group_ids.tolist() if isinstance(group_ids, torch.Tensor) else list(group_ids)
    numbering: dict[Hashable, int] = {}
    index = [numbering.setdefault(key, len(numbering)) for key in keys]
    return torch.tensor(index, dtype=torch.long, device=device), len(numbering)


def _scores(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One float32 score per response ``[B]``: the reward itself, or its masked token sum."""
    rewards = rewards.float()
    if rewards.dim() == 1:
        return rewards  # [B]
    return (rewards * mask.float()).sum(dim=-1)  # [B]


def _broadcast(per_response: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return per_response.unsqueeze(-1) * mask.float()  # [B, L]


def _group_stats(
    scores: torch.Tensor, index: torch.Tensor, n_groups: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-group size, mean and unbiased std (0 for a single member), each ``[G]``."""
    count = torch.zeros(n_groups, device=scores.device).index_add_(
        0, index, torch.ones_like(scores)
    )
    mean = torch.zeros(n_groups, device=scores.device).index_add_(0, index, scores) / count  # [G]
    sq_dev = (scores - mean[index]).square()  # [B]
    sum_sq = torch.zeros(n_groups, device=scores.device).index_add_(0, index, sq_dev)  # [G]
    # unbiased, as Trinity and veRL (torch.std); a group of one gets advantage 0 from its callers
    # (no baseline to compare with; Trinity and veRL pass its raw reward through instead)
    std = torch.sqrt(sum_sq / (count - 1).clamp(min=1))  # [G]
    return count, mean, std


def _batch_metrics(scores: torch.Tensor, advantages: torch.Tensor) -> Metrics:
    return {
        "reward_mean": scores.mean().item(),
        "reward_std": scores.std().item() if scores.numel() > 1 else 0.0,
        "advantage_mean": advantages.mean().item(),
    }


STD_CAL_LEVELS = ("group", "batch")  # Trinity's std_cal_level: whose reward std divides


def trinity_group_stats(
    scores: torch.Tensor, index: torch.Tensor, n_groups: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Trinity's per-group size, mean and std ``[G]`` (GRPOGroupedAdvantage,
    StepWiseGRPOAdvantageFn): a group of one has mean 0 and std 1, so its reward passes through
    as r / (1 + epsilon); larger groups their mean and unbiased std (torch.std)."""
    count, mean, std = _group_stats(scores, index, n_groups)
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return count, mean, std


def batch_std(scores: torch.Tensor) -> torch.Tensor:
    """``std_cal_level: batch``'s divisor: the unbiased std of every score in the batch, 1 for a
    batch of one (Trinity's precomputed_std)."""
    return scores.std() if scores.numel() > 1 else torch.ones((), device=scores.device)


def group_std_kept(
    count: torch.Tensor, std: torch.Tensor, std_threshold: float | None
) -> torch.Tensor:
    """Which groups ``[G]`` Trinity trains on: with ``std_threshold`` only groups of two or more
    whose reward std is above it (the others are dropped before the batch:
    :func:`rft.trainer.experience_ops.std_threshold_filter`); without, all."""
    if std_threshold is None:
        return torch.ones_like(count, dtype=torch.bool)
    return (count > 1) & (std > std_threshold)


def rank_penalized(
    scores: torch.Tensor,
    index: torch.Tensor,
    n_groups: int,
    logprob_means: torch.Tensor,
    penalty: float,
) -> torch.Tensor:
    """Trinity's ``rank_penalty`` (arXiv 2506.02355): within each group of two or more, the
    score of the member whose mean rollout log-prob ranks k-th of n (0: the least likely) is
    scaled by 1 - (k / n) x ``penalty``. Groups of one are unchanged."""
    out = scores.clone()
    for g in range(n_groups):
        members = (index == g).nonzero(as_tuple=True)[0]  # [n_g]
        if len(members) < 2:
            continue
        ranks = torch.argsort(torch.argsort(logprob_means[members])).float() / len(members)
        out[members] = scores[members] * (1 - ranks * penalty)
    return out


def grpo_advantages(
    rewards: torch.Tensor,
    group_ids: GroupIds,
    mask: torch.Tensor,
    *,
    logprob_means: torch.Tensor | None = None,
    epsilon: float = 1e-6,
    std_threshold: float | None = None,
    std_normalize: bool = True,
    std_cal_level: str = "group",
    rank_penalty: float | None = None,
    duplicate_experiences: bool = False,
) -> AdvantageOut:
    """GRPO as Trinity's ``grpo`` (GRPOGroupedAdvantage): A_i = (r_i - mean_g) / (std_g +
    epsilon) within each group g; a group of one has mean 0 and std 1.

    ``std_cal_level: batch`` divides by the std of the whole batch's rewards (the mean stays
    the group's). ``rank_penalty``: the group's mean and std are taken over rank-penalised
    rewards (:func:`rank_penalized`, from ``logprob_means`` ``[B]``, each response's mean
    rollout log-prob) while A_i reads the raw r_i, as in Trinity. ``std_threshold``: groups of
    one and groups whose std is at most it are dropped before the step (the trainer's read,
    :func:`rft.trainer.experience_ops.std_threshold_filter`; here they get 0), and with
    ``duplicate_experiences`` randomly chosen kept groups are repeated in their place (Polaris).
    ``std_normalize=False`` gives A_i = r_i - mean_g (Dr.GRPO).
    """
    del duplicate_experiences  # acted on by the trainer's read (std_threshold_filter)
    scores = _scores(rewards, mask)  # [B]
    index, n_groups = group_index(group_ids, scores.device)
    baseline = scores
    if rank_penalty is not None:
        if logprob_means is None:
            raise ValueError("rank_penalty needs each response's mean rollout log-prob")
        baseline = rank_penalized(scores, index, n_groups, logprob_means.to(scores), rank_penalty)
    count, mean, std = trinity_group_stats(baseline, index, n_groups)  # [G] each
    adv = scores - mean[index]  # [B]
    if std_normalize:
        divisor = batch_std(scores) if std_cal_level == "batch" else std[index]
        adv = adv / (divisor + epsilon)
    keep = group_std_kept(count, std, std_threshold)  # [G]
    adv = torch.where(keep[index], adv, torch.zeros_like(adv))  # [B]
    metrics = _batch_metrics(scores, adv)
    metrics["group_std_mean"] = std.mean().item()
    metrics["zero_advantage_group_frac"] = 1.0 - keep.float().mean().item()
    return _broadcast(adv, mask), metrics


def rloo_advantages(rewards: torch.Tensor, group_ids: GroupIds, mask: torch.Tensor) -> AdvantageOut:
    """RLOO: A_i = r_i - mean of the other members of its group = n/(n-1) (r_i - mean_g)."""
    scores = _scores(rewards, mask)  # [B]
    index, n_groups = group_index(group_ids, scores.device)
    count, mean, _ = _group_stats(scores, index, n_groups)  # [G]
    n = count[index]  # [B]
    adv = torch.where(
        n > 1, n / (n - 1).clamp(min=1) * (scores - mean[index]), torch.zeros_like(scores)
    )
    return _broadcast(adv, mask), _batch_metrics(scores, adv)


def reinforce_advantages(
    rewards: torch.Tensor,
    group_ids: GroupIds,
    mask: torch.Tensor,
    *,
    whiten: bool = False,
    epsilon: float = 1e-6,
) -> AdvantageOut:
    """Plain REINFORCE: A_i = r_i (groups ignored); ``whiten`` standardises over the batch,
    A_i = (r_i - mean) / (std + epsilon)."""
    scores = _scores(rewards, mask)  # [B]
    adv = scores
    if whiten and scores.numel() > 1:
        adv = (scores - scores.mean()) / (scores.std() + epsilon)
    return _broadcast(adv, mask), _batch_metrics(scores, adv)


def token_level_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, L]`` token rewards: as given if 2-D (masked), else each row's scalar reward on its
    last response token (the input ``rft.algo.losses.kl_penalty`` expects)."""
    if rewards.dim() == 2:
        return rewards.float() * mask.float()
    positions = torch.arange(mask.shape[-1], device=mask.device)  # [L]
    last = (positions * (mask > 0)).amax(dim=-1)  # [B]
    token_rewards = torch.zeros(mask.shape, device=rewards.device)  # [B, L]
    has_tokens = (mask > 0).any(dim=-1)  # [B]
    token_rewards[has_tokens, last[has_tokens]] = rewards.float()[has_tokens]
    return token_rewards


def discounted_returns(
    token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float
) -> torch.Tensor:
    """G_t = sum over later response tokens k >= t of gamma^(#response tokens from t to k) r_k.

    Tokens off the mask (padding, or tool/env tokens in a multi-turn response) neither earn nor
    discount: the running return passes them unchanged. ``[B, L]`` -> ``[B, L]``, 0 off the mask.
    """
    mask_f = mask.float()  # [B, L]
    returns = torch.zeros_like(token_rewards)  # [B, L]
    running = torch.zeros_like(token_rewards[:, 0])  # [B]
    for t in reversed(range(token_rewards.shape[-1])):
        on = mask_f[:, t]  # [B]
        running = on * (token_rewards[:, t] + gamma * running) + (1.0 - on) * running
        returns[:, t] = running
    return returns * mask_f


def reinforceplusplus_advantages(
    rewards: torch.Tensor,
    group_ids: GroupIds,
    mask: torch.Tensor,
    *,
    gamma: float = 1.0,
) -> AdvantageOut:
    """REINFORCE++: discounted token returns, whitened over every response token of the batch:
    A = (G - mean(G)) / sqrt(var(G) + 1e-8) (unbiased variance over masked tokens).

    KL in the reward: pass ``[B, L]`` token rewards from ``rft.algo.losses.kl_penalty`` (a ``[B]``
    reward is put on each response's last token).
    """
    mask_f = mask.float()  # [B, L]
    returns = discounted_returns(token_level_rewards(rewards, mask), mask, gamma)  # [B, L]
    n_tokens = mask_f.sum()
    mean = returns.sum() / n_tokens.clamp(min=1)
    var = ((returns - mean).square() * mask_f).sum() / (n_tokens - 1).clamp(min=1)
    adv = (returns - mean) * torch.rsqrt(var + 1e-8) * mask_f  # [B, L]
    scores = _scores(rewards, mask)  # [B]
    metrics = _batch_metrics(scores, adv.sum() / n_tokens.clamp(min=1))
    metrics["return_mean"] = mean.item()
    return adv, metrics


def opmd_advantages(
    rewards: torch.Tensor,
    group_ids: GroupIds,
    mask: torch.Tensor,
    *,
    opmd_baseline: str = "mean",
    tau: float = 1.0,
) -> AdvantageOut:
    """OPMD (Trinity): A_i = r_i - b_g, with b_g the group mean (``opmd_baseline: mean``) or
    its soft maximum b_g = tau * log(mean_j exp(r_j / tau)) (``logavgexp``; tends to the mean
    as tau grows and to the max as tau -> 0)."""
    scores = _scores(rewards, mask)  # [B]
    index, n_groups = group_index(group_ids, scores.device)
    count, mean, _ = _group_stats(scores, index, n_groups)  # [G]
    baseline = (
        mean if opmd_baseline == "mean" else _group_logavgexp(scores, index, n_groups, count, tau)
    )
    adv = torch.where(count[index] > 1, scores - baseline[index], torch.zeros_like(scores))  # [B]
    return _broadcast(adv, mask), _batch_metrics(scores, adv)


def _group_logavgexp(
    scores: torch.Tensor, index: torch.Tensor, n_groups: int, count: torch.Tensor, tau: float
) -> torch.Tensor:
    """tau * log(mean exp(r / tau)) per group ``[G]``, shifted by the group max for stability."""
    scaled = scores / tau  # [B]
    group_max = torch.full((n_groups,), -math.inf, device=scores.device)
    group_max = group_max.scatter_reduce(0, index, scaled, reduce="amax")  # [G]
    sum_exp = torch.zeros(n_groups, device=scores.device).index_add_(
        0, index, torch.exp(scaled - group_max[index])
    )
    return tau * (group_max + torch.log(sum_exp / count))  # [G]


def last_step_scores(
    group_ids: GroupIds, runs: Sequence[tuple[int, int]], scores: Sequence[float]
) -> tuple[
    list[tuple[Hashable, int]], dict[tuple[Hashable, int], float], dict[tuple[Hashable, int], int]
]:
    """Step-wise rows (``runs[i]`` = (run, env step) of row i in group ``group_ids[i]``) ->
    each row's run key (group, run), each run's score (its last env step's) and step count."""
    keys = group_ids.tolist() if isinstance(group_ids, torch.Tensor) else list(group_ids)
    run_of = [(g, run) for g, (run, _) in zip(keys, runs)]
    last: dict[tuple, tuple[int, float]] = {}  # run -> (its last env step, that step's score)
    steps: dict[tuple, int] = {}
    for key, (_, step), score in zip(run_of, runs, scores):
        steps[key] = steps.get(key, 0) + 1
        if key not in last or step >= last[key][0]:
            last[key] = (step, score)
    return run_of, {k: v[1] for k, v in last.items()}, steps


def step_wise_grpo_advantages(
    rewards: torch.Tensor,
    group_ids: GroupIds,
    mask: torch.Tensor,
    *,
    runs: Sequence[tuple[int, int]],
    epsilon: float = 1e-6,
    enable_step_norm: bool = False,
    std_cal_level: str = "group",
    std_threshold: float | None = None,
) -> AdvantageOut:
    """Multi-step GRPO (Trinity's ``step_wise_grpo``, StepWiseGRPOAdvantageFn): each run of a
    task (``runs[i]`` = (run, env step) of row i) scores the reward of its last step; runs of one
    group are compared as GRPO, (score - mean_g) / (std_g + epsilon), a group of one run having
    mean 0 and std 1 (``std_cal_level: batch``: the std of every run's score in the batch);
    every step of a run gets its run's advantage, divided by the run's step count with
    ``enable_step_norm``. ``std_threshold``: groups of one run, and groups whose runs' score std
    is at most it, are dropped before the step (the trainer's read,
    :func:`rft.trainer.experience_ops.std_threshold_filter`; here they get 0)."""
    scores = _scores(rewards, mask)  # [B]
    run_of, last, steps = last_step_scores(group_ids, runs, scores.tolist())
    run_keys = list(last)
    run_scores = torch.tensor([last[k] for k in run_keys], dtype=torch.float32)  # [R]
    index, n_groups = group_index([k[0] for k in run_keys])
    count, mean, std = trinity_group_stats(run_scores, index, n_groups)  # [G] each
    divisor = batch_std(run_scores) if std_cal_level == "batch" else std[index]  # [R] or []
    run_adv = (run_scores - mean[index]) / (divisor + epsilon)  # [R]
    keep = group_std_kept(count, std, std_threshold)  # [G]
    run_adv = torch.where(keep[index], run_adv, torch.zeros_like(run_adv))
    if enable_step_norm:
        run_adv = run_adv / torch.tensor([float(steps[k]) for k in run_keys])
    by_run = dict(zip(run_keys, run_adv.tolist()))
    adv = torch.tensor(
        [by_run[k] for k in run_of], dtype=torch.float32, device=scores.device
    )  # [B]
    metrics = _batch_metrics(scores, adv)
    metrics["runs"] = float(len(run_keys))
    metrics["steps_per_run_mean"] = len(run_of) / max(len(run_keys), 1)
    return _broadcast(adv, mask), metrics


def grpo_verl_advantages(
    rewards: torch.Tensor,
    group_ids: GroupIds,
    mask: torch.Tensor,
    *,
    epsilon: float = 1e-6,
) -> AdvantageOut:
    """Trinity's ``grpo_verl`` (trinity/algorithm/advantage_fn/grpo_advantage.py,
    GRPOAdvantageFn, veRL's outcome GRPO): (r_i - mean_g) / (std_g + epsilon), but a group of
    one keeps its reward, r / (1 + epsilon) (mean 0, std 1), where ``grpo`` gives it 0."""
    scores = _scores(rewards, mask)  # [B]
    index, n_groups = group_index(group_ids, scores.device)
    count, mean, std = _group_stats(scores, index, n_groups)  # [G] each
    single = count[index] == 1  # [B]
    mean_b = torch.where(single, torch.zeros_like(scores), mean[index])  # [B]
    std_b = torch.where(single, torch.ones_like(scores), std[index])  # [B]
    adv = (scores - mean_b) / (std_b + epsilon)  # [B]
    return _broadcast(adv, mask), _batch_metrics(scores, adv)


def asymre_advantages(
    rewards: torch.Tensor,
    group_ids: GroupIds,
    mask: torch.Tensor,
    *,
    baseline_shift: float = -0.1,
) -> AdvantageOut:
    """AsymRE (trinity/algorithm/advantage_fn/asymre_advantage.py, ASYMREGroupAdvantage):
    A_i = r_i - (mean_g + baseline_shift); a negative shift lowers the baseline, so more
    responses are reinforced than pushed down. A group of one has baseline 0: A = r."""
    scores = _scores(rewards, mask)  # [B]
    index, n_groups = group_index(group_ids, scores.device)
    count, mean, _ = _group_stats(scores, index, n_groups)  # [G]
    baseline = torch.where(count > 1, mean + baseline_shift, torch.zeros_like(mean))  # [G]
    adv = scores - baseline[index]  # [B]
    metrics = _batch_metrics(scores, adv)
    metrics["group_baseline_mean"] = baseline.mean().item()
    return _broadcast(adv, mask), metrics


def rec_advantages(
    rewards: torch.Tensor,
    group_ids: GroupIds,
    mask: torch.Tensor,
    *,
    epsilon: float = 1e-6,
    std_normalize: bool = False,
    drop: str | None = None,
) -> AdvantageOut:
    """REC (trinity/algorithm/advantage_fn/rec_advantage.py, RECGroupedAdvantage): A_i =
    r_i - mean_g, or (r_i - mean_g) / (std_g + epsilon) with ``std_normalize`` (population
    std). ``drop: balance``: a group with more responses below its mean than at or above it
    drops randomly chosen ones below (advantage 0) until the two counts match, and mean/std
    are taken over the kept ones. A group with one kept response uses mean 0, std 1."""
    scores = _scores(rewards, mask)  # [B]
    index, n_groups = group_index(group_ids, scores.device)
    adv = torch.zeros_like(scores)  # [B]
    dropped = 0
    for g in range(n_groups):
        members = (index == g).nonzero(as_tuple=True)[0]  # [n_g]
        group = scores[members]  # [n_g]
        keep = torch.ones_like(group, dtype=torch.bool)  # [n_g]
        below = group < group.mean()  # [n_g]
        extra = int(below.sum()) - int((~below).sum())
        if drop == "balance" and len(group) > 1 and extra > 0:
            below_at = below.nonzero(as_tuple=True)[0]
            keep[below_at[torch.randperm(len(below_at))[:extra]]] = False
            dropped += extra
        kept = group[keep]
        if len(kept) > 1:
            mean, std = kept.mean(), kept.std(unbiased=False)
        else:
            mean, std = torch.tensor(0.0), torch.tensor(1.0)
        part = group - mean
        if std_normalize:
            part = part / (std + epsilon)
        adv[members] = torch.where(keep, part, torch.zeros_like(part))
    metrics = _batch_metrics(scores, adv)
    metrics["drop_balance_frac"] = dropped / max(len(scores), 1)
    return _broadcast(adv, mask), metrics


ADVANTAGE_FNS: dict[str, Callable[..., AdvantageOut]] = {
    "step_wise_grpo": step_wise_grpo_advantages,
    "grpo": grpo_advantages,
    "rloo": rloo_advantages,
    "reinforce": reinforce_advantages,
    "reinforceplusplus": reinforceplusplus_advantages,
    "opmd": opmd_advantages,
    "asymre": asymre_advantages,
    "rec": rec_advantages,
    "grpo_verl": grpo_verl_advantages,
}
