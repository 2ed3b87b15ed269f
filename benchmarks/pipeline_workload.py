"""The pipeline simulator's samples (``benchmarks/pipeline_sim.py``): response lengths drawn
from a length model (``LENGTHS``), or replayed from a measured run's per-step records; each
explorer's share of a step as :class:`Share`. Standard library only, seeded: every mode and
shape sees the same samples.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class LengthModel:
    """Response lengths: lognormal with median ``median_tokens`` and log-std ``sigma``, cut at
    ``max_tokens`` (the generation limit), at least 1; every sample has ``prompt_tokens``."""

    name: str
    median_tokens: float
    sigma: float
    max_tokens: int
    prompt_tokens: int

    def sample(self, rng: random.Random, n: int) -> list[int]:
        mu = math.log(self.median_tokens)
        return [
            max(1, min(self.max_tokens, round(rng.lognormvariate(mu, self.sigma))))
            for _ in range(n)
        ]


LENGTHS = {
    # GSM8K chain-of-thought replies of a 1.5B instruct model: median 180 tokens, 95% within
    # 2.1x of it (sigma 0.45), limit 1024 as configs/grpo_gsm8k.yaml; ~150-token prompts.
    "gsm8k-like": LengthModel(
        "gsm8k-like", median_tokens=180, sigma=0.45, max_tokens=1024, prompt_tokens=150
    ),
    # Reasoning-style replies: most a few hundred tokens (median 400), a heavy tail (sigma 1.2:
    # 1 in 20 above 2,900 tokens) up to an 8,192-token limit that a few samples per step reach.
    "long-tail": LengthModel(
        "long-tail", median_tokens=400, sigma=1.2, max_tokens=8192, prompt_tokens=200
    ),
}


@dataclass(frozen=True)
class Share:
    """One explorer's share of one step: what generating and training it cost."""

    gen_tokens: int  # sum of the response lengths
    max_len: int  # the longest response (the batch's tail)
    group_train_tokens: tuple[float, ...]  # prompt + response tokens of each group (task)
    group_lengths: tuple[tuple[int, ...], ...] = ()  # each group's response lengths (streaming)


class Workload(Protocol):
    def share(
        self, step: int, rank: int, explorers: int, batch_size: int, repeat_times: int
    ) -> Share: ...


@dataclass(frozen=True)
class SampledWorkload:
    """Lengths drawn from a :class:`LengthModel`, seeded by (seed, step, task slot): a step's
    samples are the same whatever the number of explorers or the mode."""

    lengths: LengthModel
    seed: int = 0

    def share(
        self, step: int, rank: int, explorers: int, batch_size: int, repeat_times: int
    ) -> Share:
        groups = [
            self.lengths.sample(random.Random(f"{self.seed}/{step}/{slot}"), repeat_times)
            for slot in range(rank, batch_size, explorers)
        ]
        flat = [n for g in groups for n in g] or [0]
        return Share(
            sum(flat),
            max(flat),
            tuple(float(sum(g) + self.lengths.prompt_tokens * len(g)) for g in groups),
            tuple(tuple(g) for g in groups),
        )


@dataclass(frozen=True)
class StepRecord:
    """One step of a measured synchronous run (one explorer), in the simulator's terms."""

    step: int
    gen_tokens: int  # responses' tokens the explorer generated
    max_len: int  # its longest response
    explore_s: float  # explorer busy time: generating, scoring, sealing (not waiting, not loading)
    load_s: float  # explorer reload time of new weights (0: none this step)
    train_tokens: int  # prompt + response tokens the trainer trained on
    train_s: float  # trainer compute time (step time less reading and publishing)
    publish_s: float  # trainer time publishing weights (0: none this step)
    group_lengths: tuple[tuple[int, ...], ...] = ()  # each group's response lengths; (): unknown


@dataclass(frozen=True)
class ReplayWorkload:
    """The per-step totals of a measured run, replayed (split evenly over explorers and groups);
    steps past the end wrap around. Per-sample lengths (the streaming mode's input) are the
    record's ``group_lengths``, cycled over the share's slots; unknown, each sample has the
    mean length but one per share, which has the step's longest."""

    records: tuple[StepRecord, ...]
    batch_size: int  # tasks per step of the recorded run

    def share(
        self, step: int, rank: int, explorers: int, batch_size: int, repeat_times: int
    ) -> Share:
        rec = self.records[(step - 1) % len(self.records)]
        slots = range(rank, batch_size, explorers)
        per_group = rec.train_tokens / self.batch_size
        if rec.group_lengths:
            lengths = [tuple(rec.group_lengths[s % len(rec.group_lengths)]) for s in slots]
        else:
            mean = max(1, round(rec.gen_tokens / (self.batch_size * repeat_times)))
            lengths = [(mean,) * repeat_times for _ in slots]
            if lengths:
                lengths[0] = (rec.max_len, *lengths[0][1:])
        return Share(
            round(rec.gen_tokens * len(slots) / self.batch_size),
            rec.max_len,
            (per_group,) * len(slots),
            tuple(lengths),
        )
