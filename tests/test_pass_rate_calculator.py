"""Trinity's ``pass_rate_calculator`` experience operator (:mod:`rft.trainer.experience_ops`):
each task's pass rate (mean reward) and the share of tasks in each band, on hand-made groups,
applied the way the trainer's reads apply operators (several reads per step, ratios per step).

Expected values are hand-computed from Trinity-RFT's PassRateCalculator,
trinity/buffer/operators/mappers/pass_rate_calculator.py (the newest version, ``**kwargs``
constructor: yanxi-chen/Trinity-RFT@3640ae2, a mirror of agentscope-ai/Trinity-RFT main; the
name is in trinity/buffer/operators/__init__.py at 139d1c4): valid 0 < p < 1, strict
1/16 + 1e-3 < p < 15/16 - 1e-3, <1, >0, <15/16 - 1e-3, >1/16 + 1e-3.
"""

from __future__ import annotations

import pytest

from rft.buffer.experience import Experience
from rft.trainer.experience_ops import (
    PASS_RATE_TASKS,
    PIPELINE_PREFIX,
    ExperiencePipeline,
    pass_rate_calculator,
)

SELECTION = f"{PIPELINE_PREFIX}selection/"


def task(task_id: str, rewards) -> list[Experience]:
    """One task's responses with these rewards (its pass rate is their mean)."""
    return [
        Experience(
            task_id=task_id,
            group_id=f"{task_id}#g",
            prompt_ids=[1, 2],
            response_ids=[5, 6],
            logprobs=[-1.0, -1.0],
            reward=float(r),
        )
        for r in rewards
    ]


def ratios(counts: dict) -> dict:
    return {k.removeprefix(SELECTION): v for k, v in counts.items() if k.endswith("_ratio")}


def test_the_bands_of_four_tasks_pass_rates():
    # pass rates: all right 1.0, none 0.0, 1 of 16 = 0.0625, 3 of 4 = 0.75
    exps = (
        task("a/0", [1, 1])
        + task("a/1", [0, 0, 0])
        + task("a/2", [1] + [0] * 15)
        + task("b/0", [1, 1, 1, 0])
    )
    kept, counts = pass_rate_calculator(exps)
    assert kept is exps  # a mapper: every experience stays
    assert counts[PASS_RATE_TASKS] == 4
    pipeline = ExperiencePipeline([pass_rate_calculator])
    pipeline.start_step()
    assert len(pipeline.apply(exps)) == 25
    assert ratios(pipeline.counts) == {
        "valid_ratio": 2 / 4,  # 0.0625 and 0.75
        "strict_valid_ratio": 1 / 4,  # 0.0625 is not above 1/16 + 1e-3
        "<1_ratio": 3 / 4,
        ">0_ratio": 3 / 4,
        "<15_16_ratio": 3 / 4,  # all but 1.0
        ">1_16_ratio": 2 / 4,  # 1.0 and 0.75
    }


def test_ratios_are_of_the_whole_step_across_reads():
    pipeline = ExperiencePipeline([pass_rate_calculator])
    pipeline.start_step()
    pipeline.apply(task("t/0", [1, 0]))  # 0.5
    pipeline.apply(task("t/1", [1, 1]) + task("t/2", [0.5, 0.5]))  # 1.0 (a mean: 0.5)
    assert pipeline.counts[PASS_RATE_TASKS] == 3
    assert ratios(pipeline.counts)["valid_ratio"] == pytest.approx(2 / 3)
    assert ratios(pipeline.counts)["<1_ratio"] == pytest.approx(2 / 3)
    pipeline.start_step()
    assert pipeline.counts == {}


def test_evaluation_samples_and_empty_reads_give_no_ratio():
    pipeline = ExperiencePipeline([pass_rate_calculator])
    pipeline.start_step()
    evals = task("e/0", [1, 0])
    for exp in evals:
        exp.eval = True
    assert pipeline.apply(evals) == []
    assert pipeline.counts[PASS_RATE_TASKS] == 0
    assert not ratios(pipeline.counts)  # Trinity's mean of nothing is NaN; rft reports none
