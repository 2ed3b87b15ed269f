"""The explorer loop's steps (:mod:`rft.explorer.steps`): an admitted step's state
(:class:`OpenStep`), what happened since the last seal (:class:`Totals`), and what the steps
sealed together report (:func:`sealed_steps`): their experiences in slot order and metrics (the
meaning of each time metric: :mod:`rft.monitor`).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from rft.buffer.experience import Experience
from rft.explorer import cursor as C
from rft.explorer import tasksets as T
from rft.explorer.episodes import EpisodeResult, episode_metrics
from rft.explorer.groups import PromptJob, generated_tokens
from rft.explorer.teacher import TEACHER_KL
from rft.monitor import (
    ACCURACY,
    EXPLORER_RELOAD_S,
    EXPLORER_STEP_S,
    EXPLORER_WAIT_S,
    GENERATE_TIME_S,
    GENERATE_TOKENS_PER_S,
    GENERATED_TOKENS,
    LOOP_TOKENS_PER_S,
    RESPONSE_LENGTH_MAX,
    REWARD_MEAN,
    ROLLOUT_INFLIGHT,
    ROLLOUT_SPAN_MEAN,
    ROLLOUT_SPAN_SHARE,
    ROLLOUT_TOKENS_DISCARDED,
    WEIGHTS_VERSION,
)


@dataclass
class OpenStep:
    """An admitted step: its groups in flight and finished."""

    step: int
    share: C.Share  # (slot, task) pairs sealed with this step (carried slots included)
    cursor: T.Cursor  # the task stream after this step (saved when it is sealed)
    version: int  # weights loaded when it was admitted
    pending: dict[str, int] = field(default_factory=dict)  # key -> the step its group id names
    prompts: dict[str, PromptJob] = field(default_factory=dict)  # of pending single-turn groups
    done: dict[str, list[Experience]] = field(default_factory=dict)  # key -> its experiences
    resumed: set[str] = field(default_factory=set)  # keys taken from the spool (not generated)
    episodes: list[EpisodeResult] = field(default_factory=list)  # of its workflow-class groups
    stats: dict[str, float] = field(default_factory=dict)


@dataclass
class Totals:
    """What happened since the last sealed step (its metrics)."""

    since: float = field(default_factory=time.monotonic)
    engine_s: float = 0.0  # inside the engine's steps
    reload_s: float = 0.0
    wait_s: float = 0.0
    discarded: int = 0  # response tokens of groups dropped by explorer.max_version_span


def add_stats(opened: OpenStep, stats: dict[str, float], share: float) -> None:
    """``share`` of a scoring call's seconds and counts, to the step ``opened``."""
    for name, value in stats.items():
        opened.stats[name] = opened.stats.get(name, 0.0) + value * share


def sealed_steps(
    steps: list[OpenStep], totals: Totals, in_flight: int
) -> list[tuple[list[Experience], C.Share, dict[str, float]]]:
    """The experiences (groups adjacent, in slot order), share and metrics of the steps sealed
    together. The time since the last seal and the engine's part of it are shared out by the
    model tokens each generated (so each step shows the window's rates); the loads, waits and
    drops of the window go to the first."""
    seconds = time.monotonic() - totals.since
    parts = [step_experiences(opened) for opened in steps]
    tokens = [generated for _, generated in parts]
    out = []
    for k, (opened, (exps, generated)) in enumerate(zip(steps, parts)):
        window = totals if k == 0 else Totals(since=totals.since)
        share = generated / sum(tokens) if sum(tokens) else 1 / len(steps)
        mine = step_metrics(
            opened, exps, generated, seconds * share, window, in_flight, totals.engine_s * share
        )
        out.append((exps, opened.share, mine))
    return out


def step_experiences(opened: OpenStep) -> tuple[list[Experience], int]:
    """A sealed step's experiences (groups adjacent, in slot order) and the model tokens it
    generated (groups taken from the spool after a restart not counted)."""
    keys = sorted(opened.done, key=lambda k: tuple(int(part) for part in k.split(".")))
    exps = [e for key in keys for e in opened.done[key]]
    generated = sum(
        generated_tokens(e) for k in keys if k not in opened.resumed for e in opened.done[k]
    )
    return exps, generated


def step_metrics(
    opened: OpenStep,
    exps: list[Experience],
    generated: int,
    seconds: float,
    window: Totals,
    in_flight: int,
    engine_s: float | None = None,
) -> dict[str, float]:
    """A sealed step's metrics: ``generated`` model tokens in its ``seconds`` of the window (of
    them, ``engine_s`` in the engine's steps; default: all); ``in_flight``: samples the engine
    still runs."""
    spans = [
        max(e.response_versions) - min(e.response_versions) for e in exps if e.response_versions
    ]
    engine_s = seconds if engine_s is None else engine_s
    episodes = opened.episodes
    return {
        **opened.stats,
        **experience_metrics(exps),
        **teacher_gap(exps),
        **(episode_metrics(episodes) if episodes else {}),
        "tasks": len(opened.share),
        GENERATED_TOKENS: generated,
        GENERATE_TIME_S: engine_s,
        GENERATE_TOKENS_PER_S: generated / engine_s if engine_s > 0 else 0.0,
        EXPLORER_STEP_S: seconds,
        LOOP_TOKENS_PER_S: generated / seconds if seconds > 0 else 0.0,
        WEIGHTS_VERSION: opened.version,
        EXPLORER_RELOAD_S: window.reload_s,
        EXPLORER_WAIT_S: window.wait_s,
        ROLLOUT_SPAN_SHARE: len(spans) / len(exps) if exps else 0.0,
        ROLLOUT_SPAN_MEAN: sum(spans) / len(spans) if spans else 0.0,
        ROLLOUT_TOKENS_DISCARDED: window.discarded,
        ROLLOUT_INFLIGHT: in_flight,
    }


def teacher_gap(exps: list[Experience]) -> dict[str, float]:
    """The teacher's mean per-token log-prob gap over a step's experiences (distillation)."""
    pairs = [
        (s, t)
        for e in exps
        if e.teacher_logprobs and len(e.teacher_logprobs) == len(e.logprobs)
        for s, t in zip(e.logprobs, e.teacher_logprobs)
    ]
    return {TEACHER_KL: sum(s - t for s, t in pairs) / len(pairs)} if pairs else {}


def accuracy_of(exp: Experience) -> float:
    """The ``accuracy`` reward part, or the reward when the reward function has no such part."""
    return float(exp.reward_parts.get("accuracy", exp.reward))


def experience_metrics(exps: list[Experience]) -> dict[str, float]:
    """Reward statistics, each reward part, accuracy, response lengths, truncation rate."""
    if not exps:
        return {"experiences": 0}
    rewards = [e.reward for e in exps]
    lengths = [len(e.response_ids) for e in exps]
    out = {
        "experiences": len(exps),
        REWARD_MEAN: statistics.fmean(rewards),
        "reward/std": statistics.pstdev(rewards),
        "reward/max": max(rewards),
        "reward/min": min(rewards),
        ACCURACY: statistics.fmean(map(accuracy_of, exps)),
        "response_length/mean": statistics.fmean(lengths),
        RESPONSE_LENGTH_MAX: max(lengths),
        "truncation_rate": sum(e.truncated for e in exps) / len(exps),
    }
    for part in sorted({p for e in exps for p in e.reward_parts}):
        out[f"reward/{part}/mean"] = statistics.fmean(e.reward_parts.get(part, 0.0) for e in exps)
    return out
