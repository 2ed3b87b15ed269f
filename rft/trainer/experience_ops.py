"""Trinity's experience operators, applied by the trainer to the experiences it reads (rank 0).

Trinity runs them in its explorer before the trainer's queue (trinity/buffer/pipelines/
experience_pipeline.py); rft runs them as :class:`~rft.trainer.inputs.BufferSource` reads whole
groups, so the explorer writes every experience. After them, as Trinity's advantage runs after
its pipeline, the ``std_threshold`` group skip of the ``grpo`` and ``step_wise_grpo``
advantages. Data in: experiences in whole groups, ``data_processor.experience_pipeline`` and
``algorithm``. Data out: the experiences kept (truncated ones masked) and the step's counts as
metrics. Pure functions over experiences; no tensors, no I/O.
"""

from __future__ import annotations

import copy
import functools
import math
import random
import statistics
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from rft.algo.advantages import last_step_scores
from rft.buffer.experience import ENV_STEP_KEY, RUN_KEY, Experience, new_experience_id
from rft.config.names import EXPERIENCE_OPERATORS, STD_THRESHOLD_SKIP
from rft.config.schema import (
    AlgorithmConfig,
    DynamicSamplingArgs,
    ExperiencePipelineConfig,
    OperatorConfig,
    RewardThresholdArgs,
)

# Metric names (Trinity's, under its experience_pipeline/ prefix; per step, on the trainer).
PIPELINE_PREFIX = "experience_pipeline/"
MASKED_TRUNCATED = f"{PIPELINE_PREFIX}masked_truncated_count"  # responses whose loss mask is 0
FILTERED = f"{PIPELINE_PREFIX}filtered_count"  # experiences the filters dropped
DROPPED_ALL_CORRECT = f"{PIPELINE_PREFIX}dropped_all_correct"  # of those, in all-right groups
DROPPED_ALL_WRONG = f"{PIPELINE_PREFIX}dropped_all_wrong"  # of those, in all-wrong groups
DROPPED_GROUPS = f"{PIPELINE_PREFIX}dropped_groups"  # whole groups the group filters dropped
EXPERIENCE_COUNT = f"{PIPELINE_PREFIX}experience_count"  # experiences the operators kept
DUPLICATED_GROUPS = f"{PIPELINE_PREFIX}duplicated_groups"  # copies put in dropped groups' place

Counts = dict[str, int]
Operator = Callable[[list[Experience]], tuple[list[Experience], Counts]]


def mask_response_truncated(exps: list[Experience]) -> tuple[list[Experience], Counts]:
    """DAPO's overlong filtering (Trinity's MaskResponseTruncatedOperator in
    trinity/buffer/operators/filters/reward_filter.py): a response cut at max_tokens gets an
    all-zero action mask, so it adds no token to the loss. It stays in the batch: its reward
    still counts in its group's baseline, as in Trinity (advantages are computed after)."""
    masked = 0
    for exp in exps:
        if exp.truncated:
            exp.action_mask = [0] * exp.array_len("response_ids")
            masked += 1
    return exps, {MASKED_TRUNCATED: masked}


def outcome_score(exp: Experience, metric_key: str) -> float:
    """The score dynamic sampling judges by: the reward part ``metric_key`` (Trinity reads
    ``exp.metrics[metric_key]``; rft's rewards put ``accuracy`` in ``reward_parts``), else the
    total reward."""
    return float(exp.reward_parts.get(metric_key, exp.reward))


def dapo_dynamic_sampling(
    exps: list[Experience], args: DynamicSamplingArgs
) -> tuple[list[Experience], Counts]:
    """DAPO's dynamic sampling (Trinity's DAPODynamicSamplingFilter, reward_filter.py): keep a
    group only when some but not all of its responses are right (score > correct_threshold);
    a group of one is dropped too, as Trinity's group_by filter does. Groups are ``group_id``s
    (Trinity groups by task id; rft's group is one task's repeat_times responses)."""
    groups = _groups(exps)
    kept: list[Experience] = []
    counts = {FILTERED: 0, DROPPED_ALL_CORRECT: 0, DROPPED_ALL_WRONG: 0, DROPPED_GROUPS: 0}
    for group in groups.values():
        right = sum(outcome_score(e, args.metric_key) > args.correct_threshold for e in group)
        if len(group) >= 2 and 0 < right < len(group):
            kept.extend(group)
            continue
        counts[FILTERED] += len(group)
        counts[DROPPED_GROUPS] += 1
        if len(group) >= 2:  # a group of one is counted as filtered only (as in Trinity)
            counts[DROPPED_ALL_CORRECT if right else DROPPED_ALL_WRONG] += len(group)
    return kept, counts


def reward_filter(
    exps: list[Experience], args: RewardThresholdArgs
) -> tuple[list[Experience], Counts]:
    """Trinity's RewardFilter (reward_filter.py): keep the experiences whose reward is at least
    ``threshold``. Per experience: a group may lose members (its baseline is then theirs)."""
    kept = [e for e in exps if e.reward >= args.threshold]
    return kept, {FILTERED: len(exps) - len(kept)}


def reward_std_filter(
    exps: list[Experience], args: RewardThresholdArgs
) -> tuple[list[Experience], Counts]:
    """Trinity's RewardSTDFilter (reward_filter.py): drop a group whose rewards' population
    standard deviation is at most ``threshold`` (no learning signal for a group baseline), and
    groups of one."""
    kept: list[Experience] = []
    dropped = 0
    for group in _groups(exps).values():
        if len(group) >= 2 and statistics.pstdev(e.reward for e in group) > args.threshold:
            kept.extend(group)
        else:
            dropped += 1
    return kept, {FILTERED: len(exps) - len(kept), DROPPED_GROUPS: dropped}


def invalid_reward_filter(exps: list[Experience]) -> tuple[list[Experience], Counts]:
    """Trinity's InvalidRewardFilter (reward_filter.py): drop experiences whose reward is not a
    finite number. rft's records are checked finite when written and read, so it keeps all
    unless a custom reader let one through."""
    kept = [e for e in exps if math.isfinite(e.reward)]
    return kept, {FILTERED: len(exps) - len(kept)}


def _group_std(group: list[Experience], by_run: bool) -> tuple[int, float]:
    """A group's member count and unbiased reward std (0 for one member): its experiences', or
    with ``by_run`` its runs' last-step rewards (step-wise GRPO compares runs)."""
    if by_run:
        runs = [(int(e.info.get(RUN_KEY, 0)), int(e.info.get(ENV_STEP_KEY, 0))) for e in group]
        _, last, _ = last_step_scores([""] * len(group), runs, [e.reward for e in group])
        scores = list(last.values())
    else:
        scores = [e.reward for e in group]
    return len(scores), statistics.stdev(scores) if len(scores) > 1 else 0.0


def std_threshold_filter(
    exps: list[Experience],
    *,
    threshold: float,
    by_run: bool,
    duplicate: bool,
    rng: Optional[random.Random] = None,
) -> tuple[list[Experience], Counts]:
    """The group skip of Trinity's ``grpo`` and ``step_wise_grpo`` advantages
    (``advantage_fn_args.std_threshold``): a group of one member (run, with ``by_run``) or whose
    rewards' unbiased std is at most ``threshold`` is dropped whole, before the step, so its
    tokens count in no loss denominator. With ``duplicate`` (``duplicate_experiences``, Polaris)
    each dropped group's place is taken by a copy of a kept group drawn at random, a group of
    its own (its id suffixed ``#dup<k>``): the step keeps its group count unless all were
    dropped."""
    rng = rng or random.Random()
    kept: list[list[Experience]] = []
    dropped = 0
    for group in _groups(exps).values():
        count, std = _group_std(group, by_run)
        if count > 1 and std > threshold:
            kept.append(group)
        else:
            dropped += 1
    counts = {FILTERED: len(exps) - sum(map(len, kept)), DROPPED_GROUPS: dropped}
    out = [e for group in kept for e in group]
    if duplicate and kept and dropped:
        for k in range(dropped):
            for exp in rng.choice(kept):
                twin = copy.deepcopy(exp)
                twin.group_id = f"{exp.group_id}#dup{k}"
                twin.experience_id = new_experience_id()
                out.append(twin)
        counts[DUPLICATED_GROUPS] = dropped
    return out, counts


def advantage_operator(algorithm: AlgorithmConfig) -> Operator | None:
    """The std_threshold group skip of the configured advantage (:func:`std_threshold_filter`),
    run after the configured operators as Trinity's advantage runs after its pipeline; None
    when the advantage drops no groups."""
    args = algorithm.advantage_fn_args
    if algorithm.advantage_fn not in STD_THRESHOLD_SKIP or args.get("std_threshold") is None:
        return None
    return functools.partial(
        std_threshold_filter,
        threshold=float(args["std_threshold"]),
        by_run=algorithm.advantage_fn == "step_wise_grpo",
        duplicate=bool(args.get("duplicate_experiences", False)),
    )


# pass_rate_calculator's metrics (Trinity's selection/ names, trinity/buffer/operators/mappers/
# pass_rate_calculator.py): each the share of the step's tasks whose pass rate p (the mean
# reward of the task's experiences) is in the band.
PASS_RATE_TASKS = f"{PIPELINE_PREFIX}selection/task_count"  # tasks with a pass rate this step
_SIXTEENTH = 1 / 16 + 1e-3  # Trinity's margins: one right (or one wrong) of 16 is outside
PASS_RATE_BANDS: dict[str, Callable[[float], bool]] = {
    f"{PIPELINE_PREFIX}selection/valid_ratio": lambda p: 0 < p < 1,
    f"{PIPELINE_PREFIX}selection/strict_valid_ratio": lambda p: _SIXTEENTH < p < 1 - _SIXTEENTH,
    f"{PIPELINE_PREFIX}selection/<1_ratio": lambda p: p < 1,
    f"{PIPELINE_PREFIX}selection/>0_ratio": lambda p: p > 0,
    f"{PIPELINE_PREFIX}selection/<15_16_ratio": lambda p: p < 1 - _SIXTEENTH,
    f"{PIPELINE_PREFIX}selection/>1_16_ratio": lambda p: p > _SIXTEENTH,
}


def _band_count(ratio_name: str) -> str:
    """The count behind a band's ratio (counts add up over a step's reads; ratios do not)."""
    return ratio_name.removesuffix("_ratio") + "_count"


def pass_rate_calculator(exps: list[Experience]) -> tuple[list[Experience], Counts]:
    """Trinity's PassRateCalculator: each task's pass rate (the mean reward of its experiences
    here, tasks told apart by ``task_id``, Trinity's taskset and index) and how many tasks fall
    in each :data:`PASS_RATE_BANDS` band; the ratios are made per step
    (:func:`pass_rate_ratios`). Keeps every experience. Trinity also hands the rates to its
    task selector; rft's explorer posts them for ``difficulty_based`` itself, with or without
    this operator (:mod:`rft.explorer.pass_rates`)."""
    rewards: dict[str, list[float]] = {}
    for exp in exps:
        rewards.setdefault(exp.task_id, []).append(exp.reward)
    rates = [statistics.fmean(values) for values in rewards.values()]
    counts = {PASS_RATE_TASKS: len(rates)}
    for name, band in PASS_RATE_BANDS.items():
        counts[_band_count(name)] = sum(band(p) for p in rates)
    return exps, counts


def pass_rate_ratios(counts: Counts) -> dict[str, float]:
    """The band ratios of the step's summed :func:`pass_rate_calculator` counts; none when no
    task was counted (Trinity's would be NaN)."""
    tasks = counts.get(PASS_RATE_TASKS, 0)
    if not tasks:
        return {}
    return {name: counts[_band_count(name)] / tasks for name in PASS_RATE_BANDS}


def _groups(exps: list[Experience]) -> dict[str, list[Experience]]:
    groups: dict[str, list[Experience]] = {}
    for exp in exps:
        groups.setdefault(exp.group_id, []).append(exp)
    return groups


# name -> the operator's function with its configured arguments bound
BUILDERS: dict[str, Callable[[OperatorConfig], Operator]] = {
    "mask_response_truncated": lambda op: mask_response_truncated,
    "dapo_dynamic_sampling": lambda op: functools.partial(
        dapo_dynamic_sampling, args=op.typed_args()
    ),
    "reward_filter": lambda op: functools.partial(reward_filter, args=op.typed_args()),
    "reward_std_filter": lambda op: functools.partial(reward_std_filter, args=op.typed_args()),
    "invalid_reward_filter": lambda op: invalid_reward_filter,
    "pass_rate_calculator": lambda op: pass_rate_calculator,
}
assert set(EXPERIENCE_OPERATORS) == set(BUILDERS), "rft.config.names lists other operators"


@dataclass
class ExperiencePipeline:
    """The configured operators, in order, and the counts of the current step."""

    operators: list[Operator] = field(default_factory=list)
    # summed since start_step(), and pass_rate_calculator's ratios of those sums
    counts: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_config(
        cls, cfg: ExperiencePipelineConfig | None, algorithm: AlgorithmConfig | None = None
    ) -> ExperiencePipeline:
        """The configured operators, then the advantage's group skip (:func:`advantage_operator`)."""
        operators = [BUILDERS[op.name](op) for op in (cfg.operators if cfg else [])]
        skip = advantage_operator(algorithm) if algorithm is not None else None
        return cls(operators + ([skip] if skip is not None else []))

    def start_step(self) -> None:
        self.counts = {}

    def apply(self, exps: Sequence[Experience]) -> list[Experience]:
        """The training experiences of ``exps`` (whole groups) the operators keep; evaluation
        samples are left out (never trained on)."""
        out = [e for e in exps if not e.eval]
        if not self.operators:
            return out
        for operator in self.operators:
            out, counts = operator(out)
            for key, n in counts.items():
                self.counts[key] = self.counts.get(key, 0) + n
        self.counts[EXPERIENCE_COUNT] = self.counts.get(EXPERIENCE_COUNT, 0) + len(out)
        self.counts.update(pass_rate_ratios(self.counts))
        return out
