"""Trinity's ``rubric_judge_workflow`` in rft: the judge's rating parse (pure), and episodes on
stand-in engines where the judge (an auxiliary model's handle, reached through its OpenAI client)
rates each of the policy's replies against the row's rubrics."""

from __future__ import annotations

from pathlib import Path

import pytest

from rft.errors import WorkflowError
from rft.workflow.registry import workflow_class
from rft.workflow.rubric_judge import NO_RUBRICS, parse_rating, rubric_lines
from tests.helpers.runs import agent_cfg, write_jsonl
from tests.helpers.stand_in_engine import FixedEngine, run_pool

RUBRIC = [
    {"description": "Names the right diagnosis", "weight": 3},
    {"description": "Warns about side effects", "weight": 1},
]


@pytest.mark.parametrize(
    "text,rating",
    [
        ('```json\n{"rating": 7}\n```\nbecause...', 7),
        ('Here:\n```\n{"rating": 10}\n```', 10),  # a plain fence
        ('```json\n{"rating": 2.5}\n```', 2.5),
        ('```json\n{"rating": 0}\n```', None),  # outside 1..10
        ('```json\n{"rating": "7"}\n```', None),  # not a number
        ('```json\n{"rating": true}\n```', None),
        ('{"rating": 7}', None),  # no fenced block
        ('```json\n{"rating": 7}', None),  # unclosed
        ("```json\nnot json\n```", None),
        ("```json\n[7]\n```", None),
        (None, None),
    ],
)
def test_the_rating_is_the_fenced_jsons_number_in_1_to_10(text, rating):
    assert parse_rating(text) == rating


def test_rubrics_are_listed_with_their_weights_and_a_bad_list_is_named():
    assert rubric_lines(RUBRIC, "t/0") == (
        "Rubric 0 (weight 3): Names the right diagnosis\nRubric 1 (weight 1): Warns about side effects"
    )
    assert rubric_lines([], "t/0") == NO_RUBRICS
    with pytest.raises(WorkflowError, match="task t/1: 'rubric' must be a list of"):
        rubric_lines(["be nice"], "t/1")


def _episodes(tmp_path: Path, policy_dir: Path, verdict: str, row: dict, with_judge: bool = True):
    """Two runs of one rubric task: the policy says "aspirin", the judge says ``verdict``."""
    from rft.config.schema import FormatConfig
    from rft.explorer.auxiliary import AuxiliaryModel
    from rft.explorer.episodes import episode_jobs
    from rft.explorer.groups import episode_template
    from rft.workflow.task import GenerationConfig, Task

    data = write_jsonl(tmp_path / "t.jsonl", [row])
    judges = [{"model_path": str(policy_dir), "max_model_len": 256}] if with_judge else []
    cfg = agent_cfg(tmp_path, policy_dir, data, "rubric_judge_workflow", auxiliary_models=judges)
    template = episode_template(cfg)
    judge = AuxiliaryModel(cfg, 0, engine=FixedEngine(template, verdict)) if with_judge else None
    policy = FixedEngine(template, "aspirin")
    task = Task(
        workflow=workflow_class("rubric_judge_workflow"),
        repeat_times=2,
        raw_task=row,
        format_args=FormatConfig(prompt_key="question"),
        rollout_args=GenerationConfig(max_tokens=8),
        task_id="rubric/0",
    )
    try:
        results, _ = run_pool(
            episode_jobs(0, task, task.workflow),
            policy,
            template,
            concurrency=1,
            timeout_s=60,
            auxiliary=[judge] if judge else [],
        )
        prompts = [template.decode(p) for p in judge.engine.prompts] if judge else []
    finally:
        if judge is not None:
            judge.close()
    return results, prompts, template


def test_the_judge_rates_each_reply_against_the_rubrics(tmp_path, vllm_model_dir):
    row = {"question": "What relieves a headache?", "rubric": RUBRIC}
    results, prompts, template = _episodes(
        tmp_path, vllm_model_dir, '```json\n{"rating": 8}\n```', row
    )
    [result] = results
    assert result.error is None and len(result.experiences) == 2
    for run, exp in enumerate(result.experiences):
        assert exp.reward == pytest.approx(0.8) and exp.metrics["judge_success"] == 1.0
        assert exp.eid.run == run  # the policy's replies, not the judge's
        assert template.decode(list(exp.tokens)[exp.prompt_length :]) == "aspirin"
    assert len(prompts) == 2  # one judge call per reply
    assert "<response>\naspirin\n</response>" in prompts[0]
    assert "Rubric 0 (weight 3): Names the right diagnosis" in prompts[0]
    assert "What relieves a headache?" in prompts[0]


def test_an_answer_without_a_rating_scores_zero_and_no_judge_fails_the_episode(
    tmp_path, vllm_model_dir
):
    row = {"question": "What relieves a headache?"}  # no rubric: the judge is told so
    results, prompts, _ = _episodes(tmp_path, vllm_model_dir, "I would say 8/10", row)
    [result] = results
    assert [e.reward for e in result.experiences] == [0.0, 0.0]
    assert result.experiences[0].metrics["judge_success"] == 0.0
    assert NO_RUBRICS in prompts[0]
    results, _, _ = _episodes(tmp_path / "none", vllm_model_dir, "x", row, with_judge=False)
    assert "set explorer.auxiliary_models[0] to a causal LM folder" in results[0].error
