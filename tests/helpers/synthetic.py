"""Hand-made rollout experiences for trainer tests: known token counts and rewards."""

from __future__ import annotations

import random

from rft.buffer.experience import Experience


def rollout_groups(
    step: int, groups: int, repeat: int, *, seed: int, prompt_tokens: int
) -> list[Experience]:
    """``groups`` groups of ``repeat`` samples: group g has ``prompt_tokens + g`` prompt tokens,
    sample k has ``3 + k + g`` response tokens, reward k and rollout log-probs -1."""
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt = [rng.randrange(10, 1000) for _ in range(prompt_tokens + g)]
        for k in range(repeat):
            resp = [rng.randrange(10, 1000) for _ in range(3 + k + g)]
            out.append(
                Experience(
                    task_id=f"t{g}",
                    group_id=f"s{step}-g{g}",
                    prompt_ids=prompt,
                    response_ids=resp,
                    logprobs=[-1.0] * len(resp),
                    reward=float(k),
                )
            )
    return out
