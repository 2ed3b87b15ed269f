"""Step-wise workflows (Trinity-RFT's step_wise_workflow.py, ``algorithm_type:
multi_step_grpo``): an agent runs in steps, and every model reply of a step is one experience.

Data in: a task and the episode's model handle; the subclass defines ``step(step_num)`` (talk
to the model, say whether to go on), ``max_step_num`` and a reward: per step
(:class:`StepWiseRewardWorkflow`) or one for the whole run, given to every step
(:class:`RewardPropagationWorkflow`). Data out: the replies of every step, each with its
reward and ``eid.step``. A run ends early when a step says stop (``step`` returns False).
"""

from __future__ import annotations

from typing import Any, Optional

from rft.workflow.base import Workflow
from rft.workflow.experience import EID, Experience
from rft.workflow.model import ModelWrapper
from rft.workflow.task import Task


class _Steps(Workflow):
    """What the step-wise workflows share: the OpenAI client and the subclass's hooks."""

    def __init__(
        self,
        *,
        task: Task,
        model: ModelWrapper,
        auxiliary_models: Optional[list] = None,
        use_openai_client: bool = True,
    ):
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        self._use_openai_client = use_openai_client
        self._client: Any = None

    @property
    def client(self) -> Any:
        """Trinity's ``self.client``: an OpenAI client on the rollout model (its calls are this
        run's), None with ``use_openai_client=False``. Made on first use, so a workflow that
        never uses it needs no endpoint (``explorer.rollout_model.enable_openai_api``)."""
        if self._client is None and self._use_openai_client:
            self._client = self.model.get_openai_client()
        return self._client

    @client.setter
    def client(self, value: Any) -> None:
        self._client = value

    @property
    def max_step_num(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} defines no max_step_num")

    def step(self, step_num: int) -> bool:
        raise NotImplementedError(f"{type(self).__name__} defines no step()")

    async def step_async(self, step_num: int) -> bool:
        raise NotImplementedError(f"{type(self).__name__} defines no step_async()")

    def _step_replies(self, step_num: int) -> list[Experience]:
        """The replies since the last step, marked with this run and ``step_num``."""
        exps = self.model.extract_experience_from_history()
        for exp in exps:
            exp.eid = EID(run=self.run_id_base, step=step_num)
        return exps


class StepWiseRewardWorkflow(_Steps):
    """Each step's replies get that step's ``reward(exps, step_num)``."""

    def reward(self, exps: list[Experience], step_num: int) -> float:
        raise NotImplementedError(f"{type(self).__name__} defines no reward()")

    def run(self) -> list[Experience]:
        out: list[Experience] = []
        for step_num in range(self.max_step_num):
            go_on = self.step(step_num=step_num)
            exps = self._step_replies(step_num)
            reward = self.reward(exps, step_num=step_num)
            for exp in exps:
                exp.reward = reward
            out.extend(exps)
            if not go_on:
                break
        return out


class AsyncStepWiseRewardWorkflow(StepWiseRewardWorkflow):
    """:class:`StepWiseRewardWorkflow` with ``step_async`` and ``reward_async``."""

    is_async = True

    async def reward_async(self, exps: list[Experience], step_num: int) -> float:
        raise NotImplementedError(f"{type(self).__name__} defines no reward_async()")

    async def run_async(self) -> list[Experience]:
        out: list[Experience] = []
        for step_num in range(self.max_step_num):
            go_on = await self.step_async(step_num=step_num)
            exps = self._step_replies(step_num)
            reward = await self.reward_async(exps, step_num=step_num)
            for exp in exps:
                exp.reward = reward
            out.extend(exps)
            if not go_on:
                break
        return out


class RewardPropagationWorkflow(_Steps):
    """One ``reward(exps)`` for the whole run, given to every step's replies, with the steps
    taken as the ``actual_env_steps`` metric."""

    def reward(self, exps: list[Experience]) -> float:
        raise NotImplementedError(f"{type(self).__name__} defines no reward()")

    def run(self) -> list[Experience]:
        out: list[Experience] = []
        steps = 0
        for step_num in range(self.max_step_num):
            go_on = self.step(step_num=step_num)
            steps += 1
            exps = self._step_replies(step_num)
            out.extend(exps)
            if not go_on:
                break
        return _propagated(out, self.reward(out), steps)


class AsyncRewardPropagationWorkflow(RewardPropagationWorkflow):
    """:class:`RewardPropagationWorkflow` with ``step_async`` and ``reward_async``."""

    is_async = True

    async def reward_async(self, exps: list[Experience]) -> float:
        raise NotImplementedError(f"{type(self).__name__} defines no reward_async()")

    async def run_async(self) -> list[Experience]:
        out: list[Experience] = []
        steps = 0
        for step_num in range(self.max_step_num):
            go_on = await self.step_async(step_num=step_num)
            steps += 1
            exps = self._step_replies(step_num)
            out.extend(exps)
            if not go_on:
                break
        return _propagated(out, await self.reward_async(out), steps)


def _propagated(exps: list[Experience], reward: float, steps: int) -> list[Experience]:
    for exp in exps:
        exp.reward = reward
        exp.metrics = {**(exp.metrics or {}), "actual_env_steps": steps}
    return exps
