"""PPO's critic math (pure torch, no rft imports): GAE advantages and returns, the clipped value
loss, explained variance.

Data in: ``token_rewards``, ``values`` and ``mask``, each ``[B, L]``; tokens off the mask
(padding, tool tokens inside a multi-turn response) neither earn, nor are valued, nor discount,
as in veRL's ``compute_gae_advantage_return``. Data out: whitened advantages, raw returns (the
critic's regression target), the value loss and its clip fraction (named by the trainer).
"""

from __future__ import annotations

import torch

Metrics = dict[str, float]

# Metric names gae_advantages writes (defined here only).
ADVANTAGE_RAW_MEAN = (
    "advantage_raw_mean"  # mean GAE advantage over the masked tokens, before whitening
)
RETURN_MEAN = "return_mean"  # mean return (advantage + value) over the masked tokens
VALUE_MEAN = "value_mean"  # mean value over the masked tokens


def gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation: ``(advantages, returns)``, each ``[B, L]``, raw.

    delta_t = r_t + gamma * V_next - V_t, A_t = delta_t + gamma * lam * A_next, where "next" is
    the next response token on the mask (0 past the last one: the episode ends).
    """
    mask_f = mask.float()  # [B, L]
    rewards, values = token_rewards.float(), values.float()
    advantages = torch.zeros_like(rewards)  # [B, L]
    next_value = torch.zeros_like(rewards[:, 0])  # [B]
    next_advantage = torch.zeros_like(rewards[:, 0])  # [B]
    for t in reversed(range(rewards.shape[-1])):
        on = mask_f[:, t]  # [B]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        next_value = on * values[:, t] + (1.0 - on) * next_value
        next_advantage = on * advantage + (1.0 - on) * next_advantage
        advantages[:, t] = next_advantage
    advantages = advantages * mask_f
    return advantages, (advantages + values) * mask_f


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the masked tokens (unbiased variance), 0 off the mask."""
    mask_f = mask.float()
    n = mask_f.sum()
    mean = (x * mask_f).sum() / n.clamp(min=1)
    var = ((x - mean).square() * mask_f).sum() / (n - 1).clamp(min=1)
    return (x - mean) * torch.rsqrt(var + eps) * mask_f


def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, Metrics]:
    """PPO's advantage (``advantage_fn: ppo``): whitened GAE advantages, raw returns, metrics."""
    advantages, returns = gae(token_rewards, values, mask, gamma=gamma, lam=lam)
    n = mask.float().sum().clamp(min=1)
    metrics = {
        ADVANTAGE_RAW_MEAN: (advantages.sum() / n).item(),
        RETURN_MEAN: (returns.sum() / n).item(),
        VALUE_MEAN: ((values.float() * mask.float()).sum() / n).item(),
    }
    return whiten(advantages, mask), returns, metrics


def value_loss(
    new_values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    cliprange_value: float,
) -> tuple[torch.Tensor, float]:
    """``(loss, clip fraction)``. Clipped value loss: 0.5 * mean over masked tokens of
    max((V - R)^2, (V_clip - R)^2), V_clip = old + clamp(V - old, +-cliprange_value); the clip
    fraction is the share of tokens where the clipped term is the larger (PPO2, veRL's
    ``compute_value_loss``)."""
    mask_f = mask.float()
    n = mask_f.sum().clamp(min=1)
    clipped = old_values + (new_values - old_values).clamp(-cliprange_value, cliprange_value)
    unclipped_loss = (new_values - returns).square()  # [B, L]
    clipped_loss = (clipped - returns).square()  # [B, L]
    loss = 0.5 * (torch.maximum(unclipped_loss, clipped_loss) * mask_f).sum() / n
    clip_frac = ((clipped_loss > unclipped_loss).float() * mask_f).sum() / n
    return loss, clip_frac.item()


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over the masked tokens: 1 is a perfect critic,
    0 no better than a constant, below 0 worse (nan when the returns do not vary)."""
    mask_f = mask.float()
    n = mask_f.sum().clamp(min=1)

    def var(x: torch.Tensor) -> torch.Tensor:
        mean = (x * mask_f).sum() / n
        return ((x - mean).square() * mask_f).sum() / n

    total = var(returns.float())
    if total.item() == 0:
        return float("nan")
    return (1 - var(returns.float() - values.float()) / total).item()
