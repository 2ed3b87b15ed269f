"""``math_rm_workflow`` (:mod:`rft.workflow.math_rm`), run as Trinity runs it: a task made into
the workflow with the auxiliary models, ``set_repeat_times``, ``run()``; the policy and the judge
are scripted model handles.

Follows Trinity-RFT's MathRMWorkflow, trinity/common/workflows/math_rm_workflow.py (the newest
version, without the register decorator: yanxi-chen/Trinity-RFT@5b77c08, a mirror of
agentscope-ai/Trinity-RFT main): ``reward_fn(response, messages, ground_truth=truth)`` with the
reply's Experience, reward = sum of the parts, parts into metrics, ``eid.run = i +
run_id_base``.
"""

from __future__ import annotations

import asyncio
import re
from typing import Optional

import pytest

from rft.config.schema import FormatConfig
from rft.errors import WorkflowError
from rft.workflow import (
    AsyncMathRMWorkflow,
    Experience,
    GenerationConfig,
    MathRMWorkflow,
    RewardFn,
    Task,
)
from rft.workflow.conversation import ChatTemplate
from rft.workflow.registry import workflow_class
from tests.helpers.scripted_model import scripted_model

QUESTION = {"question": "What is 2 + 2?", "answer": "4"}


@pytest.fixture(scope="module")
def template(smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    return ChatTemplate(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir))


def judge_handle(template: ChatTemplate, verdicts: list[str]):
    """A scripted judge as the workflow gets it; its OpenAI clients are not used here."""
    judge, service = scripted_model(template, verdicts)
    judge.get_openai_client = judge.get_openai_async_client = lambda: None
    return judge, service


class JudgeReward(RewardFn):
    """A judge reward the way a Trinity user writes one for math_rm_workflow: it reads the
    reply Experience and the messages, and asks the first auxiliary model for a 0-10 grade."""

    def __init__(self, scale: float = 1.0):
        self.scale = scale

    def __call__(
        self,
        experience: Experience,
        messages: list[dict],
        ground_truth: Optional[str] = None,
        auxiliary_models: Optional[list] = None,
    ) -> dict:
        question = messages[-1]["content"]
        prompt = (
            f"Question: {question}\nReference: {ground_truth}\n"
            f"Answer: {experience.response_text}\nGrade 0-10:"
        )
        verdict = auxiliary_models[0].chat([{"role": "user", "content": prompt}])[0]
        grade = float(re.findall(r"\d+", verdict.response_text)[-1])
        return {"judge": self.scale * grade / 10, "tokens": 0.01 * len(experience.tokens)}


class TrinityShapedReward(RewardFn):
    """A reward with Trinity's exact call signature (no auxiliary_models keyword)."""

    def __init__(self):
        pass

    def __call__(self, experience, messages, ground_truth=None):
        return {"exact": float(experience.response_text.strip() == ground_truth)}


def make_task(workflow: type, reward_fn: Optional[type], **fields) -> Task:
    return Task(
        workflow=workflow,
        format_args=FormatConfig(prompt_key="question", response_key="answer"),
        rollout_args=GenerationConfig(temperature=0.7, max_tokens=32),
        reward_fn=reward_fn,
        raw_task=dict(QUESTION),
        task_id="t/0",
        **fields,
    )


def test_the_names_resolve_to_the_classes():
    assert workflow_class("math_rm_workflow") is MathRMWorkflow
    assert workflow_class("async_math_rm_workflow") is AsyncMathRMWorkflow
    assert MathRMWorkflow.can_repeat and MathRMWorkflow.can_reset
    assert not MathRMWorkflow.is_async and AsyncMathRMWorkflow.is_async


def test_each_reply_is_graded_by_the_judge_and_rewarded_with_the_sum(template):
    task = make_task(MathRMWorkflow, JudgeReward, reward_fn_args={"scale": 2.0})
    model, service = scripted_model(template, ["4", "5"])
    judge, judge_service = judge_handle(template, ["Grade: 10", "3"])
    workflow = task.to_workflow(model, auxiliary_models=[judge])
    workflow.set_repeat_times(2, 4)
    replies = workflow.run()

    [(_, sampling)] = service.calls  # one policy call for both runs
    assert (sampling["n"], sampling["temperature"]) == (2, 0.7)
    # the judge saw each reply with the question and the reference
    asked = [template.tokenizer.decode(ids) for ids, _ in judge_service.calls]
    assert "Question: What is 2 + 2?" in asked[0] and "Reference: 4" in asked[0]
    assert "Answer: 4" in asked[0] and "Answer: 5" in asked[1]
    # hand-computed: judge = 2.0 * grade / 10; tokens = 0.01 * (prompt + reply tokens)
    lengths = [len(r.tokens) for r in replies]
    assert replies[0].metrics["judge"] == pytest.approx(2.0)
    assert replies[1].metrics["judge"] == pytest.approx(0.6)
    assert [r.reward for r in replies] == pytest.approx(
        [2.0 + 0.01 * lengths[0], 0.6 + 0.01 * lengths[1]]
    )
    assert [r.eid.run for r in replies] == [4, 5]


def test_a_reward_with_trinitys_signature_gets_no_judge_keyword(template):
    task = make_task(MathRMWorkflow, TrinityShapedReward)
    model, _ = scripted_model(template, ["4", "22"])
    workflow = task.to_workflow(model)
    workflow.set_repeat_times(2, 0)
    assert [r.reward for r in workflow.run()] == [1.0, 0.0]


def test_the_async_twin_runs_async_with_the_same_scores(template):
    task = make_task(AsyncMathRMWorkflow, JudgeReward)
    model, _ = scripted_model(template, ["4"])
    judge, _ = judge_handle(template, ["7"])
    workflow = task.to_workflow(model, auxiliary_models=[judge])
    workflow.set_repeat_times(1, 2)
    [reply] = asyncio.run(workflow.run_async())
    assert reply.metrics["judge"] == pytest.approx(0.7) and reply.eid.run == 2


def test_without_a_reward_it_says_what_to_set(template):
    model, _ = scripted_model(template, [])
    with pytest.raises(WorkflowError, match="default_reward_fn_type"):
        make_task(MathRMWorkflow, None).to_workflow(model)
