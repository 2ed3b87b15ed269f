"""PPO's critic math (pure torch): GAE advantages and returns, the clipped value loss, and the
critic's metrics.

Data in: ``token_rewards`` ``[B, L]`` (a scalar reward on each response's last token, see
``rft.algo.advantages.token_level_rewards``, plus any per-token KL penalty), ``values``
``[B, L]`` (the critic's value of the state before each response token) and ``mask`` ``[B, L]``
(1 on response tokens the policy generated). Tokens off the mask (padding, or tool/environment
tokens inside a multi-turn response) are skipped: they neither earn, nor are valued, nor
discount, as in veRL's ``compute_gae_advantage_return``.

Data out: advantages (whitened over the batch's masked tokens, as veRL and Trinity's ``ppo``
advantage) and returns (advantage + value, not whitened: the critic's regression target);
the value loss and its metrics.
"""

from __future__ import annotations

import torch

from rft.monitor import VALUE_CLIP_FRAC, VALUE_LOSS

Metrics = dict[str, float]


def gae(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, *,
        gamma: float = 1.0, lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
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


def gae_advantages(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, *,
                   gamma: float = 1.0, lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, Metrics]:
    """PPO's advantage (``advantage_fn: ppo``): whitened GAE advantages, raw returns, metrics."""
    advantages, returns = gae(token_rewards, values, mask, gamma=gamma, lam=lam)
    n = mask.float().sum().clamp(min=1)
    metrics = {"advantage_raw_mean": (advantages.sum() / n).item(),
               "return_mean": (returns.sum() / n).item(),
               "value_mean": ((values.float() * mask.float()).sum() / n).item()}
    return whiten(advantages, mask), returns, metrics


def value_loss(new_values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
               mask: torch.Tensor, *, cliprange_value: float) -> tuple[torch.Tensor, Metrics]:
    """Clipped value loss: 0.5 * mean over masked tokens of max((V - R)^2, (V_clip - R)^2),
    V_clip = old + clamp(V - old, +-cliprange_value); the clip fraction is the share of tokens
    where the clipped term is the larger (PPO2, veRL's ``compute_value_loss``)."""
    mask_f = mask.float()
    n = mask_f.sum().clamp(min=1)
    clipped = old_values + (new_values - old_values).clamp(-cliprange_value, cliprange_value)
    unclipped_loss = (new_values - returns).square()  # [B, L]
    clipped_loss = (clipped - returns).square()  # [B, L]
    loss = 0.5 * (torch.maximum(unclipped_loss, clipped_loss) * mask_f).sum() / n
    clip_frac = ((clipped_loss > unclipped_loss).float() * mask_f).sum() / n
    return loss, {VALUE_LOSS: loss.item(), VALUE_CLIP_FRAC: clip_frac.item()}


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
