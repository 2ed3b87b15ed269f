"""Trinity-RFT's single-call workflow classes, the ones users subclass: ``SimpleWorkflow``,
``MathWorkflow``, ``MathBoxedWorkflow`` and their async twins.

Data in: a task (its question column, format, ``rollout_args``, reward class and
``reward_fn_args``) and the episode's model handle. Data out: the ``n`` replies of one chat
call (``n`` = the runs asked for by ``set_repeat_times``), each rewarded with the sum of its
reward parts, the parts in its metrics. These classes answer to no config name: the names
``simple_workflow``, ``math_workflow``... are rft's batched recipes
(:mod:`rft.workflow.single_turn`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict
from typing import Any, Optional

from rft.errors import WorkflowError
from rft.workflow.base import Workflow
from rft.workflow.experience import Experience
from rft.workflow.model import ModelWrapper
from rft.workflow.reward_fn import MathBoxedRewardFn, MathRewardFn, RewardFn
from rft.workflow.single_turn import base_model_prompt
from rft.workflow.task import Task

# Trinity's prompts, so a subclass ported from Trinity asks what it asked there.
R1_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. The reasoning process and answer are enclosed within "
    "<think> </think> and <answer> </answer> tags, respectively, i.e.,\n"
    "<think> reasoning process here </think>\n<answer> answer here </answer>.\n"
)
BOXED_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
BOXED_THINK_SYSTEM_PROMPT = (
    "You are a helpful assistant that solves MATH problems. You should first thinks about the "
    "reasoning process in mind and then provides the user with the answer. You should present "
    "your reasoning process using the format: <think>\n ...your reasoning process here... "
    "</think>\n first. You should always include your final answer in \\boxed{} as closed-form "
    "results."
)


def _built_reward(reward_cls: Any, args: dict, who: str) -> RewardFn:
    """Trinity's ``task.reward_fn(**task.reward_fn_args)``, for a RewardFn subclass only."""
    if not (isinstance(reward_cls, type) and issubclass(reward_cls, RewardFn)):
        raise WorkflowError(
            f"{who}: the task's reward_fn is {reward_cls!r}, not a RewardFn subclass; name a "
            "reward in the taskset's default_reward_fn_type (or set task.reward_fn in reset)"
        )
    return reward_cls(**args)


class BaseSimpleWorkflow(Workflow):
    """One chat call for a task's question; the reward class is built from the task."""

    def __init__(
        self,
        *,
        task: Task,
        model: ModelWrapper,
        auxiliary_models: Optional[list[ModelWrapper]] = None,
    ):
        self.reset(task)  # first, as in Trinity: a subclass's reset reads only the task
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)

    def _read_task(self, task: Task) -> None:
        self.task = task
        self.format_args = task.format_args
        self.system_prompt = task.format_args.system_prompt
        self.reply_prefix = task.format_args.reply_prefix
        self.reward_fn_args = task.reward_fn_args
        self.raw_task = task.raw_task
        self.task_desc = task.task_desc
        self.truth = task.truth

    def reset(self, task: Task) -> None:
        self._read_task(task)
        self.reward_fn = _built_reward(task.reward_fn, self.reward_fn_args, type(self).__name__)

    def set_repeat_times(self, repeat_times: int, run_id_base: int) -> None:
        """``repeat_times`` runs as the ``n`` replies of one call."""
        super().set_repeat_times(repeat_times, run_id_base)
        self.task.rollout_args.n = repeat_times

    @property
    def rollout_args(self) -> dict[str, Any]:
        """The task's sampling settings as the model call's keyword arguments."""
        return asdict(self.task.rollout_args)

    def format_messages(self) -> list[dict]:
        """The system prompt (if any), the question, and the reply prefix (if any) as an
        assistant message the model continues."""
        messages = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": self.task_desc})
        if self.reply_prefix:
            messages.append({"role": "assistant", "content": self.reply_prefix})
        return messages

    def _reward_kwargs(self, response: Experience) -> dict[str, Any]:
        """The keywords the reward class is called with for one reply."""
        return {"response": response.response_text, "truth": self.truth}

    def _reward_parts(self, response: Experience) -> dict[str, float]:
        """One reply's reward parts: the reward class called with :meth:`_reward_kwargs`."""
        return self.reward_fn(**self._reward_kwargs(response))

    def _score_replies(self, responses: list[Experience]) -> list[Experience]:
        """Each reply's reward parts into its metrics, their sum as its reward, and its run."""
        for i, response in enumerate(responses):
            parts = self._reward_parts(response)
            if response.metrics is None:
                response.metrics = {}
            response.metrics.update(parts)
            response.reward = float(sum(parts.values()))
            response.eid.run = i + self.run_id_base
            self.logger.debug("task %s reply %d: reward %s", self.task.task_id, i, parts)
        return responses


class SimpleWorkflow(BaseSimpleWorkflow):
    """A single-turn task: ``n`` replies of one chat call, each scored by the reward class."""

    can_reset = True
    can_repeat = True
    is_async = False

    def run(self) -> list[Experience]:
        return self._score_replies(self.model.chat(self.format_messages(), **self.rollout_args))


class AsyncSimpleWorkflow(BaseSimpleWorkflow):
    can_reset = True
    can_repeat = True
    is_async = True

    async def run_async(self) -> list[Experience]:
        replies = await self.model.chat_async(self.format_messages(), **self.rollout_args)
        return self._score_replies(replies)


class MathWorkflow(SimpleWorkflow):
    """DeepSeek-R1's math task: ``MathRewardFn`` unless the task names a reward, and with it the
    R1 system prompt unless the format sets one."""

    def reset(self, task: Task) -> None:
        if task.reward_fn is None:
            task.reward_fn = MathRewardFn
        if task.reward_fn == MathRewardFn and task.format_args.system_prompt is None:
            # a copy: the taskset's format config is shared by all its tasks
            task.format_args = dataclasses.replace(task.format_args, system_prompt=R1_SYSTEM_PROMPT)
        super().reset(task)


class AsyncMathWorkflow(AsyncSimpleWorkflow, MathWorkflow):
    pass


class MathBoxedWorkflow(SimpleWorkflow):
    """Math answered in ``\\boxed{}`` (Trinity's customized_math_workflows.py): the reward
    (``MathBoxedRewardFn`` unless the task names one) is called with ``with_think``,
    ``format_score_coef`` (workflow_args) and ``response_token``; ``use_base`` asks a base model
    with a plain-text prompt. A reply cut at the length limit is kept, with no token trained."""

    def reset(self, task: Task) -> None:
        self._read_task(task)
        self.workflow_args = task.workflow_args
        self.use_base = self.workflow_args.get("use_base", False)
        self.with_think = self.workflow_args.get("with_think", False)
        self.format_score_coef = self.workflow_args.get("format_score_coef", 0.1)
        if self.system_prompt is None:
            self.system_prompt = (
                BOXED_THINK_SYSTEM_PROMPT if self.with_think else BOXED_SYSTEM_PROMPT
            )
        self.reward_fn = _built_reward(
            task.reward_fn or MathBoxedRewardFn, self.reward_fn_args, type(self).__name__
        )

    def format_prompt(self) -> str:
        """The base model's prompt: ``System:...\\nUser:\\n<question>\\nAssistant:\\n``."""
        messages = [{"role": "user", "content": self.task_desc}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return base_model_prompt(messages)

    def _reward_kwargs(self, response: Experience) -> dict[str, Any]:
        return {
            **super()._reward_kwargs(response),
            "with_think": self.with_think,
            "format_score_coef": self.format_score_coef,
            "response_token": response.tokens[response.prompt_length :],
        }

    def _score_replies(self, responses: list[Experience]) -> list[Experience]:
        for response in super()._score_replies(responses):
            if response.truncate_status == "response_truncated":
                response.action_mask = [0] * (len(response.tokens) - response.prompt_length)
        return responses

    def run(self) -> list[Experience]:
        if self.use_base:
            return self._score_replies(
                self.model.generate([self.format_prompt()], **self.rollout_args)
            )
        return self._score_replies(self.model.chat(self.format_messages(), **self.rollout_args))


class AsyncMathBoxedWorkflow(MathBoxedWorkflow):
    is_async = True

    async def run_async(self) -> list[Experience]:
        if self.use_base:
            replies = await self.model.generate_async([self.format_prompt()], **self.rollout_args)
        else:
            replies = await self.model.chat_async(self.format_messages(), **self.rollout_args)
        return self._score_replies(replies)
