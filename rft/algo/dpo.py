"""DPO's loss (Rafailov et al. 2023) on a batch of preference pairs; pure math.

Data in: per-token log-probs of the policy and of the frozen reference model ``[2P, R]`` with
the response mask, rows interleaved as Trinity-RFT lays them out (chosen at even rows, its
rejected reply at the next odd row; trinity/algorithm/policy_loss_fn/dpo_loss.py). Data out:
the mean loss over the P pairs and its metrics. Imports torch and the stdlib only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Metric names the loss writes (Trinity's names; the trainer logs them as they come).
DPO_LOSS = "dpo_loss"  # mean DPO loss of the pairs
CHOSEN_REWARD = "chosen_reward"  # mean beta * (log pi - log pi_ref) of the chosen replies
REJECTED_REWARD = "rejected_reward"  # the same of the rejected replies
REWARD_MARGIN = "reward_margin"  # chosen_reward - rejected_reward: rises as the policy learns
REWARD_ACCURACY = "accuracy_mean"  # share of pairs whose chosen reply has the larger reward


def sequence_logprobs(logprob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Log-probability of each response ``[B]``: the masked sum of its token log-probs ``[B, R]``."""
    return (logprob * mask.to(logprob.dtype)).sum(dim=-1)


def dpo_loss(
    logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    mask: torch.Tensor,
    *,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean over pairs of ``-(1 - eps) log sigmoid(beta z) - eps log sigmoid(-beta z)`` with
    ``z = (log pi(c) - log pi_ref(c)) - (log pi(r) - log pi_ref(r))`` (sequence log-probs) and
    ``eps = label_smoothing`` (conservative DPO: the labels are wrong with probability eps).

    ``logprob``, ``ref_logprob`` and ``mask`` are ``[2P, R]``, chosen at even rows.
    """
    assert logprob.shape[0] % 2 == 0, "DPO rows come in (chosen, rejected) pairs"
    policy = sequence_logprobs(logprob, mask)  # [2P]
    ref = sequence_logprobs(ref_logprob.to(logprob.dtype), mask)  # [2P]
    chosen_ratio = policy[0::2] - ref[0::2]  # [P]
    rejected_ratio = policy[1::2] - ref[1::2]  # [P]
    z = chosen_ratio - rejected_ratio  # [P]
    losses = (
        -F.logsigmoid(beta * z) * (1 - label_smoothing) - F.logsigmoid(-beta * z) * label_smoothing
    )  # [P]
    loss = losses.mean()
    chosen_reward = beta * chosen_ratio.detach()  # [P]
    rejected_reward = beta * rejected_ratio.detach()  # [P]
    return loss, {
        DPO_LOSS: loss.item(),
        CHOSEN_REWARD: chosen_reward.mean().item(),
        REJECTED_REWARD: rejected_reward.mean().item(),
        REWARD_MARGIN: (chosen_reward - rejected_reward).mean().item(),
        REWARD_ACCURACY: (chosen_reward > rejected_reward).float().mean().item(),
    }
