"""The workflow classes a user subclasses (Trinity-RFT's ``Workflow``, ``MultiTurnWorkflow``,
``StepWiseRewardWorkflow``).

Data in: a :class:`~rft.workflow.task.Task` and the episode's
:class:`~rft.workflow.model.ModelWrapper`. Data out: ``run()`` (or ``async run_async()``)
returns experiences with rewards. A workflow never touches files or the engine directly.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Optional

from rft.errors import WorkflowError
from rft.workflow.conversation import Messages, Thread
from rft.workflow.experience import EID, Experience
from rft.workflow.model import ModelWrapper
from rft.workflow.task import Task


class Workflow:
    """Runs one task with the model and returns experiences (set ``is_async`` and define
    ``run_async`` for an async workflow)."""

    can_reset: bool = False  # reset(task) reuses the instance for another task
    can_repeat: bool = False  # run() does all repeat_times runs (set_repeat_times is called)
    is_async: bool = False  # run_async() instead of run()

    def __init__(self, *, task: Task, model: ModelWrapper, auxiliary_models: Optional[list] = None):
        self.task = task
        self.model = model
        self.auxiliary_models = auxiliary_models or []
        self.run_id_base = 0
        self.repeat_times = 1
        self.logger = logging.getLogger(type(self).__module__)

    def reset(self, task: Task) -> None:
        raise NotImplementedError(f"{type(self).__name__} sets can_reset but defines no reset()")

    def set_repeat_times(self, repeat_times: int, run_id_base: int) -> None:
        self.repeat_times = repeat_times
        self.run_id_base = run_id_base

    def run(self) -> list[Experience]:
        raise NotImplementedError(
            f"{type(self).__name__} defines no run() (or set is_async and define run_async())"
        )

    async def run_async(self) -> list[Experience]:
        raise NotImplementedError(f"{type(self).__name__} sets is_async but defines no run_async()")


class MultiTurnWorkflow(Workflow):
    """A conversation with the model, trained as one sample per conversation."""

    can_repeat = True

    def process_messages_to_experience(
        self,
        messages: Messages,
        reward: float,
        info: Optional[dict] = None,
        truncate_status: Optional[str] = None,
    ) -> Experience:
        """The sample of ``messages``: the model's own tokens and log-probs for every assistant
        turn, the chat template's tokens between them (masked), ``reward`` on it. Every
        assistant message must be a reply of ``self.model`` in this episode, as returned."""
        thread = self.model.history.find(messages)
        if thread is None:
            raise WorkflowError(
                f"{type(self).__name__}.process_messages_to_experience: the assistant messages are "
                "not replies of self.model in this episode as returned (rft trains the engine's own "
                "tokens only); append each reply as {'role': 'assistant', 'content': "
                "response.response_text}"
            )
        info = dict(info or {})
        metrics = {
            k: float(v)
            for k, v in info.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        # A prefix break split the conversation: its earlier parts are trained too, same reward.
        part = thread.predecessor
        while part is not None:
            self.model.split_samples.append(
                self._sample(part, reward, {**info, "split_part": True}, metrics, None)
            )
            part = part.predecessor
        return self._sample(thread, reward, info, metrics, truncate_status)

    def _sample(
        self,
        thread: Thread,
        reward: float,
        info: dict,
        metrics: dict,
        truncate_status: Optional[str],
    ) -> Experience:
        return Experience(
            tokens=thread.tokens,
            prompt_length=len(thread.prompt_ids),
            logprobs=thread.logprobs,
            action_mask=thread.action_mask,
            reward=reward,
            info=info,
            metrics=metrics,
            truncate_status=truncate_status,
            response_text=None,
            finish_reason=thread.finish_reason,
            model_version=min(thread.versions) if thread.versions else None,
            response_versions=thread.response_versions,
            eid=EID(run=self.run_id_base),
        )


class StepWiseRewardWorkflow(Workflow):
    """One experience per step (Trinity's step-wise workflows, ``algorithm_type:
    multi_step_grpo``): ``step(step_num)`` talks to the model and says whether to go on,
    ``reward(exps, step_num)`` scores the step's replies, ``max_step_num`` bounds the run."""

    def __init__(
        self,
        *,
        task: Task,
        model: ModelWrapper,
        auxiliary_models: Optional[list] = None,
        use_openai_client: bool = False,
    ):
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        self.client = model.get_openai_client() if use_openai_client else None

    @property
    def max_step_num(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} defines no max_step_num")

    def step(self, step_num: int) -> bool:
        raise NotImplementedError(f"{type(self).__name__} defines no step()")

    def reward(self, exps: list[Experience], step_num: int) -> float:
        raise NotImplementedError(f"{type(self).__name__} defines no reward()")

    def run(self) -> list[Experience]:
        out: list[Experience] = []
        for step_num in range(self.max_step_num):
            go_on = self.step(step_num=step_num)
            exps = self.model.extract_experience_from_history()
            reward = self.reward(exps, step_num=step_num)
            for exp in exps:
                exp.reward = reward
                exp.eid = EID(run=self.run_id_base, step=step_num)
            out.extend(exps)
            if not go_on:
                break
        return out


def workflow_signature_problem(cls: Any) -> Optional[str]:
    """Why ``cls`` cannot run as a workflow here, or None (checked at dry run)."""
    if not isinstance(cls, type):
        return f"{cls!r} is not a class"
    if not issubclass(cls, Workflow):
        return f"{cls.__module__}.{cls.__qualname__} is not a subclass of rft.workflow.Workflow"
    try:
        inspect.signature(cls).bind(task=None, model=None, auxiliary_models=None)
    except TypeError as e:
        return f"{cls.__qualname__}(*, task, model, auxiliary_models=None) cannot be called: {e}"
    if cls.is_async and cls.run_async is Workflow.run_async:
        return f"{cls.__qualname__} sets is_async = True but defines no async run_async()"
    if not cls.is_async and cls.run is Workflow.run:
        return (
            f"{cls.__qualname__} defines no run() (or set is_async = True and define run_async())"
        )
    if cls.can_reset and cls.reset is Workflow.reset:
        return f"{cls.__qualname__} sets can_reset = True but defines no reset(task)"
    return None
