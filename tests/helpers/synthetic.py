"""Hand-made experiences: rollout groups for trainer tests (known token counts and rewards),
whole groups with fixed tokens for buffer tests."""

from __future__ import annotations

import random

from rft.buffer.experience import Experience
from tests.buffer_worker import GROUP_SIZE


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


def make_batch(tag: str, groups: int, size: int = GROUP_SIZE, version: int = 0) -> list[Experience]:
    """``groups`` whole groups of ``size`` records named after ``tag``: fixed tokens, reward k
    for the k-th record of a group, written at ``version``."""
    return [
        Experience(
            task_id=f"{tag}-{g}",
            group_id=f"{tag}-{g}",
            experience_id=f"{tag}-{g}-{k}",
            prompt_ids=[1, 2],
            response_ids=[3, 4, 5],
            logprobs=[-0.5, -0.25, -1.0],
            reward=float(k),
            reward_parts={"accuracy": 1.0},
            model_version=version,
        )
        for g in range(groups)
        for k in range(size)
    ]
