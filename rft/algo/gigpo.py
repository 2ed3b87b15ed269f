"""GiGPO (group-in-group policy optimisation, Feng et al., arXiv:2505.10978) advantages for
step-wise agent workflows, pure torch: A = A_E(episode) + omega * A_S(step at an anchor state).

Follows agentscope-ai/Trinity-RFT trinity/algorithm/advantage_fn/gigpo_advantage.py
(GiGPOAdvantageFn at 0fcd37e). Data in: one row per env step of a run, its reward ``[B]``, its
task's group id, ``runs`` (run, env step) and ``infos`` (the experience's ``info``: the step's
immediate reward and the hash of the state it acted in). Data out: ``(advantages [B, L],
metrics)``, each row's scalar on its response mask.
"""

from __future__ import annotations

from typing import Any, Hashable, Mapping, Sequence

import torch

from rft.algo.advantages import AdvantageOut, GroupIds, _batch_metrics, _broadcast, _scores
from rft.errors import DataError

FNORMS = ("none", "std")  # fnorm: the divisor of a group's deviations (1, or its unbiased std)


def discounted_step_returns(step_rewards: Sequence[float], gamma: float) -> list[float]:
    """R_t = sum over k >= t of gamma^(k - t) r_k, for one run's steps in order."""
    returns, running = [0.0] * len(step_rewards), 0.0
    for t in reversed(range(len(step_rewards))):
        running = step_rewards[t] + gamma * running
        returns[t] = running
    return returns


def normalized(values: Sequence[float], fnorm: str, epsilon: float) -> list[float]:
    """(v - mean) / (denom + epsilon), denom the unbiased std (``fnorm: std``) or 1 (``none``).
    A single value has mean 0 and denom 1 (Trinity's ``_normalize``): it keeps v / (1 + eps)."""
    v = torch.tensor(values, dtype=torch.float32)  # [n]
    if len(values) == 1:
        return (v / (1.0 + epsilon)).tolist()
    denom = v.std() if fnorm == "std" else torch.tensor(1.0)
    return ((v - v.mean()) / (denom + epsilon)).tolist()


def run_step_rewards(
    rows: Sequence[int], scores: Sequence[float], infos: Sequence[Mapping[str, Any]], key: str
) -> list[float]:
    """Immediate rewards r_t of one run's ``rows`` (in step order): ``info[key]`` of each step
    when any step has it (0 where one lacks it), else the last step's reward, 0 before it."""
    if any(key in infos[i] for i in rows):
        out = []
        for i in rows:
            value = infos[i].get(key, 0.0)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise DataError(
                    f"experience info {key!r} is {value!r}; the workflow must set it to the "
                    "step's immediate reward, a number (or leave it out on every step)"
                )
            out.append(float(value))
        return out
    return [0.0] * (len(rows) - 1) + [scores[rows[-1]]]


def gigpo_advantages(
    rewards: torch.Tensor,
    group_ids: GroupIds,
    mask: torch.Tensor,
    *,
    runs: Sequence[tuple[int, int]],
    infos: Sequence[Mapping[str, Any]],
    omega: float = 1.0,
    gamma: float = 1.0,
    fnorm: str = "none",
    epsilon: float = 1e-6,
    step_reward_key: str = "step_reward",
    env_state_hash_key: str = "env_state_hash",
) -> AdvantageOut:
    """GiGPO: A_i = A_E(run of i) + omega * A_S(i).

    A_E: each run's episode return (the sum of its step rewards, :func:`run_step_rewards`)
    normalised among the runs of its task (:func:`normalized`). A_S: the steps of the whole
    batch that acted in one state (the same ``str(info[env_state_hash_key])``, any task or
    run) form an anchor group; with two or more members, their discounted returns from that
    step on (:func:`discounted_step_returns`) are normalised within it; a step alone in its
    state, or without the key, gets A_S = 0.
    """
    scores = _scores(rewards, mask).tolist()  # [B]
    tasks = group_ids.tolist() if isinstance(group_ids, torch.Tensor) else list(group_ids)
    by_run: dict[tuple[Hashable, int], list[int]] = {}  # (task, run) -> rows
    for i, (task, (run, _)) in enumerate(zip(tasks, runs)):
        by_run.setdefault((task, run), []).append(i)
    step_return = [0.0] * len(scores)  # [B] discounted return from each row's step on
    episode_return: dict[tuple[Hashable, int], float] = {}
    for key, rows in by_run.items():
        rows = sorted(rows, key=lambda i: runs[i][1])  # stable: Trinity's sort by eid.step
        step_rewards = run_step_rewards(rows, scores, infos, step_reward_key)
        for i, r_t in zip(rows, discounted_step_returns(step_rewards, gamma)):
            step_return[i] = r_t
        episode_return[key] = sum(step_rewards)

    runs_of_task: dict[Hashable, list[tuple[Hashable, int]]] = {}
    for key in episode_return:
        runs_of_task.setdefault(key[0], []).append(key)
    a_e: dict[tuple[Hashable, int], float] = {}
    task_means = []
    for keys in runs_of_task.values():
        returns = [episode_return[k] for k in keys]
        a_e.update(zip(keys, normalized(returns, fnorm, epsilon)))
        task_means.append(sum(returns) / len(returns) if len(returns) > 1 else 0.0)

    anchors: dict[str, list[int]] = {}  # str(state hash) -> rows, across the batch
    for i, info in enumerate(infos):
        state = info.get(env_state_hash_key)
        if state is not None:
            anchors.setdefault(str(state), []).append(i)
    a_s = [0.0] * len(scores)  # [B]
    shared = [rows for rows in anchors.values() if len(rows) > 1]
    for rows in shared:
        for i, value in zip(rows, normalized([step_return[i] for i in rows], fnorm, epsilon)):
            a_s[i] = value

    episode_adv = [a_e[(task, run)] for task, (run, _) in zip(tasks, runs)]  # [B]
    adv = torch.tensor([e + omega * s for e, s in zip(episode_adv, a_s)], device=mask.device)  # [B]
    metrics = _batch_metrics(torch.tensor(scores), adv)
    metrics["gigpo/episode_reward_mean"] = sum(task_means) / max(len(task_means), 1)
    metrics["gigpo/anchor_groups_total"] = float(len(anchors))
    metrics["gigpo/anchor_groups_size_gt1"] = float(len(shared))
    metrics["gigpo/anchor_group_hit_ratio"] = len(shared) / len(anchors) if anchors else 0.0
    metrics["gigpo/mean_abs_A_E"] = sum(map(abs, episode_adv)) / max(len(episode_adv), 1)
    metrics["gigpo/mean_abs_A_S"] = sum(map(abs, a_s)) / max(len(a_s), 1)
    return _broadcast(adv, mask), metrics
