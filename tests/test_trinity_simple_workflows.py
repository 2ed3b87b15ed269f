"""Trinity-RFT's simple and step-wise workflow classes (:mod:`rft.workflow.simple`,
:mod:`rft.workflow.step_wise`), run as the explorer runs them, on a scripted model handle."""

from __future__ import annotations

import asyncio
from typing import Optional

import pytest

from rft.config.schema import FormatConfig
from rft.errors import WorkflowError
from rft.workflow import (
    AccuracyReward,
    AsyncMathBoxedWorkflow,
    AsyncMathWorkflow,
    AsyncRewardPropagationWorkflow,
    AsyncSimpleWorkflow,
    AsyncStepWiseRewardWorkflow,
    BaseSimpleWorkflow,
    GenerationConfig,
    MathBoxedRewardFn,
    MathBoxedWorkflow,
    MathRewardFn,
    MathWorkflow,
    RewardFn,
    RewardPropagationWorkflow,
    SimpleWorkflow,
    StepWiseRewardWorkflow,
    Task,
)
from rft.workflow.base import workflow_signature_problem
from rft.workflow.conversation import ChatTemplate
from rft.workflow.simple import BOXED_THINK_SYSTEM_PROMPT, R1_SYSTEM_PROMPT
from tests.helpers.scripted_model import scripted_model

QUESTION = {"question": "What is 2 + 2?", "answer": "4"}
R1_RIGHT = "<think>2 + 2 makes 4</think> <answer>4</answer>"
R1_WRONG = "<think>guess</think> <answer>5</answer>"


@pytest.fixture(scope="module")
def template(smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    return ChatTemplate(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir))


def make_task(workflow: type, reward_fn: Optional[type] = None, **fields) -> Task:
    fmt = fields.pop("format_args", FormatConfig(prompt_key="question", response_key="answer"))
    return Task(
        workflow=workflow,
        format_args=fmt,
        rollout_args=GenerationConfig(temperature=0.7, max_tokens=32),
        reward_fn=reward_fn,
        raw_task=dict(QUESTION),
        task_id="t/0",
        **fields,
    )


def prompt_text(template: ChatTemplate, service, call: int = 0) -> str:
    return template.tokenizer.decode(service.calls[call][0])


# ----------------------------------------------------------------------------- a user's workflow


class ExactMatch(RewardFn):
    """A user's reward: the reply equals the truth, and a small bonus for brevity."""

    def __init__(self, bonus: float = 0.0):
        self.bonus = bonus

    def __call__(self, response: str, truth: Optional[str] = None, **kwargs) -> dict:
        return {"exact": float(response.strip() == truth), "bonus": self.bonus}


class BriefWorkflow(SimpleWorkflow):
    """A user's SimpleWorkflow subclass: its own prompt, the task's reward."""

    def format_messages(self):
        return [{"role": "user", "content": f"Answer with a number only. {self.task_desc}"}]


def test_a_simple_workflow_subclass_runs_n_replies_and_sums_each_rewards(template):
    task = make_task(BriefWorkflow, ExactMatch, reward_fn_args={"bonus": 0.25})
    model, service = scripted_model(template, ["4", "five"])
    workflow = task.to_workflow(model)
    workflow.set_repeat_times(2, 6)
    assert task.rollout_args.n == 2 and workflow.rollout_args["n"] == 2
    replies = workflow.run()
    [(prompt_ids, sampling)] = service.calls  # one call, asked for both runs
    assert (sampling["n"], sampling["temperature"], sampling["max_tokens"]) == (2, 0.7, 32)
    assert "Answer with a number only. What is 2 + 2?" in prompt_text(template, service)
    assert [r.reward for r in replies] == [1.25, 0.25]
    assert replies[0].metrics == {"exact": 1.0, "bonus": 0.25}
    assert [r.eid.run for r in replies] == [6, 7]


def test_simple_workflow_messages_take_the_system_prompt_and_reply_prefix(template):
    fmt = FormatConfig(
        prompt_key="question", response_key="answer", system_prompt="Be brief.", reply_prefix="="
    )
    model, _ = scripted_model(template, [])
    workflow = make_task(SimpleWorkflow, ExactMatch, format_args=fmt).to_workflow(model)
    assert workflow.format_messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "="},
    ]
    assert workflow.truth == "4" and workflow.task_desc == "What is 2 + 2?"


def test_a_simple_workflow_without_a_reward_class_says_what_to_set(template):
    model, _ = scripted_model(template, [])
    with pytest.raises(WorkflowError, match="not a RewardFn subclass.*default_reward_fn_type"):
        make_task(SimpleWorkflow).to_workflow(model)


def test_class_flags_are_trinitys():
    flags = {
        cls.__name__: (cls.can_reset, cls.can_repeat, cls.is_async)
        for cls in (
            SimpleWorkflow,
            AsyncSimpleWorkflow,
            MathWorkflow,
            AsyncMathWorkflow,
            MathBoxedWorkflow,
            AsyncMathBoxedWorkflow,
        )
    }
    assert flags == {
        "SimpleWorkflow": (True, True, False),
        "AsyncSimpleWorkflow": (True, True, True),
        "MathWorkflow": (True, True, False),
        "AsyncMathWorkflow": (True, True, True),
        "MathBoxedWorkflow": (True, True, False),
        "AsyncMathBoxedWorkflow": (True, True, True),
    }
    assert (BaseSimpleWorkflow.can_reset, BaseSimpleWorkflow.can_repeat) == (False, False)
    for name in flags:
        assert workflow_signature_problem(globals()[name]) is None


# ----------------------------------------------------------------------------- math workflows


def test_math_workflow_defaults_to_math_reward_fn_and_the_r1_prompt(template):
    shared = FormatConfig(prompt_key="question", response_key="answer")
    task = make_task(MathWorkflow, format_args=shared)
    model, service = scripted_model(template, [R1_RIGHT, R1_WRONG])
    workflow = task.to_workflow(model)
    assert task.reward_fn is MathRewardFn and isinstance(workflow.reward_fn, MathRewardFn)
    assert task.format_args.system_prompt == R1_SYSTEM_PROMPT
    assert shared.system_prompt is None  # the taskset's format config is left as it was
    workflow.set_repeat_times(2, 0)
    replies = workflow.run()
    assert "A conversation between User and Assistant." in prompt_text(template, service)
    assert [r.reward for r in replies] == pytest.approx([1.1, 0.1])
    assert replies[1].metrics == {"accuracy": 0.0, "format_score": 0.1}


def test_math_workflow_keeps_a_named_reward_and_its_prompt(template):
    task = make_task(MathWorkflow, AccuracyReward)
    model, _ = scripted_model(template, [])
    workflow = task.to_workflow(model)
    assert task.reward_fn is AccuracyReward and workflow.system_prompt is None
    fmt = FormatConfig(prompt_key="question", response_key="answer", system_prompt="Mine.")
    task = make_task(MathWorkflow, format_args=fmt)
    assert task.to_workflow(model).system_prompt == "Mine." and task.reward_fn is MathRewardFn


def test_async_math_workflow_runs_async(template):
    task = make_task(AsyncMathWorkflow)
    model, _ = scripted_model(template, [R1_RIGHT])
    workflow = task.to_workflow(model)
    workflow.set_repeat_times(1, 3)
    [reply] = asyncio.run(workflow.run_async())
    assert reply.reward == pytest.approx(1.1) and reply.eid.run == 3
    assert task.reward_fn is MathRewardFn


def test_math_boxed_workflow_reads_its_workflow_args(template):
    task = make_task(MathBoxedWorkflow, workflow_args={"with_think": True})
    model, service = scripted_model(
        template, ["\\boxed{4}", "<think>2+2</think> so \\boxed{4} and more"], cut=["\\boxed{4}"]
    )
    workflow = task.to_workflow(model)
    assert workflow.system_prompt == BOXED_THINK_SYSTEM_PROMPT
    assert isinstance(workflow.reward_fn, MathBoxedRewardFn)
    workflow.set_repeat_times(2, 0)
    cut, whole = workflow.run()
    assert cut.metrics == {"accuracy": 1.0, "format_score": -0.1}  # no think block
    assert whole.metrics == {"accuracy": 1.0, "format_score": 0.0} and whole.reward == 1.0
    # a reply cut at the length limit is kept, with no token trained
    assert cut.truncate_status == "response_truncated" and set(cut.action_mask.tolist()) == {0}
    assert set(whole.action_mask.tolist()) == {1}


def test_math_boxed_workflow_asks_a_base_model_in_plain_text(template):
    task = make_task(AsyncMathBoxedWorkflow, workflow_args={"use_base": True})
    model, service = scripted_model(template, ["\\boxed{5}"])
    workflow = task.to_workflow(model)
    expected = (
        "System:Please reason step by step, and put your final answer within \\boxed{}."
        "\nUser:\nWhat is 2 + 2?\nAssistant:\n"
    )
    assert workflow.format_prompt() == expected
    [reply] = asyncio.run(workflow.run_async())
    assert service.calls[0][0] == template.encode(expected)  # no chat template
    assert reply.metrics == {"accuracy": 0.0, "format_score": 0.0} and reply.reward == 0.0


# ----------------------------------------------------------------------------- step-wise


class TwoQuestions(RewardPropagationWorkflow):
    """Asks twice; the run's reward is whether the last reply is right."""

    max_step_num = 3

    def step(self, step_num: int) -> bool:
        self.last = self.model.chat([{"role": "user", "content": f"Try {step_num}"}])[0]
        return step_num < 1

    def reward(self, exps) -> float:
        return float(self.last.response_text == "4")


class ScoredSteps(AsyncStepWiseRewardWorkflow):
    """Scores each step by its reply, until a reply says stop."""

    max_step_num = 3

    async def step_async(self, step_num: int) -> bool:
        [reply] = await self.model.chat_async([{"role": "user", "content": f"Step {step_num}"}])
        return reply.response_text != "stop"

    async def reward_async(self, exps, step_num: int) -> float:
        return float(exps[0].response_text == "4")


def test_reward_propagation_gives_every_step_the_runs_reward(template):
    model, _ = scripted_model(template, ["3", "4"])
    workflow = make_task(TwoQuestions).to_workflow(model)
    workflow.set_single_run_context(2)
    exps = workflow.run()
    assert [(e.eid.run, e.eid.step, e.reward) for e in exps] == [(2, 0, 1.0), (2, 1, 1.0)]
    assert all(e.metrics["actual_env_steps"] == 2 for e in exps)
    assert issubclass(AsyncRewardPropagationWorkflow, RewardPropagationWorkflow)
    assert issubclass(ScoredSteps, StepWiseRewardWorkflow)


def test_step_wise_rewards_each_step_until_a_step_says_stop(template):
    model, _ = scripted_model(template, ["4", "stop", "4"])
    workflow = make_task(ScoredSteps).to_workflow(model)
    workflow.set_single_run_context(1)
    exps = asyncio.run(workflow.run_async())
    assert [(e.eid.run, e.eid.step, e.reward) for e in exps] == [(1, 0, 1.0), (1, 1, 0.0)]
