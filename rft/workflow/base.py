"""The workflow classes a user subclasses (Trinity-RFT's ``Workflow``, ``MultiTurnWorkflow``;
the simple and step-wise families: :mod:`rft.workflow.simple`, :mod:`rft.workflow.step_wise`).

Data in: a :class:`~rft.workflow.task.Task` and the episode's
:class:`~rft.workflow.model.ModelWrapper`. Data out: ``run()`` (or ``async run_async()``)
returns experiences with rewards. A workflow never touches files or the engine directly.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

from rft.workflow.conversation import Messages
from rft.workflow.experience import EID, Experience, numbers
from rft.workflow.log import get_logger
from rft.workflow.model import ModelWrapper
from rft.workflow.task import Task


class Workflow:
    """Runs one task with the model and returns experiences (set ``is_async`` and define
    ``run_async`` for an async workflow). Trinity's ``Workflow``: ``auxiliary_models`` are the
    explorer's generative auxiliary models, each a :class:`ModelWrapper`, kept as
    ``auxiliary_model_wrappers``; ``auxiliary_models`` holds an OpenAI client of each (async
    clients for an ``is_async`` workflow), None when there are none."""

    can_reset: bool = False  # reset(task) reuses the instance for another task
    can_repeat: bool = False  # run() does all repeat_times runs (set_repeat_times is called)
    is_async: bool = False  # run_async() instead of run()
    # what it needs beyond rft's base install (rft.workflow.requires), checked at dry run
    requires: tuple = ()

    @classmethod
    def check_workflow_args(cls, workflow_args: dict) -> None:
        """Raise WorkflowError for taskset ``workflow_args`` this class cannot run with (called
        at dry run once ``requires`` is met, so a bad argument fails on the login node)."""

    def __init__(
        self,
        *,
        task: Task,
        model: ModelWrapper,
        auxiliary_models: Optional[list[ModelWrapper]] = None,
    ):
        self.task = task
        self.model = model
        self.auxiliary_model_wrappers = auxiliary_models
        self.auxiliary_models: Optional[list[Any]] = None
        if auxiliary_models:
            self.auxiliary_models = [
                m.get_openai_async_client() if self.is_async else m.get_openai_client()
                for m in auxiliary_models
            ]
        self.run_id_base = 0
        self.repeat_times = 1
        self.logger = get_logger(type(self).__module__)

    @property
    def resettable(self) -> bool:
        """Trinity's older name of ``can_reset``."""
        return type(self).can_reset

    @property
    def repeatable(self) -> bool:
        """Trinity's older name of ``can_repeat``."""
        return type(self).can_repeat

    @property
    def asynchronous(self) -> bool:
        """Trinity's older name of ``is_async``."""
        return type(self).is_async

    def reset(self, task: Task) -> None:
        raise NotImplementedError(f"{type(self).__name__} sets can_reset but defines no reset()")

    def set_repeat_times(self, repeat_times: int, run_id_base: int) -> None:
        """This run does ``repeat_times`` runs of its task, numbered from ``run_id_base``
        (called on ``can_repeat`` workflows)."""
        self.repeat_times = repeat_times
        self.run_id_base = run_id_base

    def set_single_run_context(self, run_id_base: int) -> None:
        """This run is run ``run_id_base`` of its task, alone (workflows without
        ``can_repeat``); unlike :meth:`set_repeat_times` it changes nothing else."""
        self.repeat_times = 1
        self.run_id_base = run_id_base

    def run(self) -> list[Experience]:
        raise NotImplementedError(
            f"{type(self).__name__} defines no run() (or set is_async and define run_async())"
        )

    async def run_async(self) -> list[Experience]:
        raise NotImplementedError(f"{type(self).__name__} sets is_async but defines no run_async()")


class MultiTurnWorkflow(Workflow):
    """A conversation with the model, trained as one sample per conversation (Trinity's: each
    run is its own episode unless the subclass sets ``can_repeat``)."""

    def process_messages_to_experience(
        self,
        messages: Messages,
        reward: float,
        info: Optional[dict] = None,
        truncate_status: Optional[str] = None,
    ) -> Experience:
        """The sample of ``messages`` (``self.model.convert_messages_to_experience``, as
        Trinity's), with ``reward``, ``info`` (its numbers also as metrics) and this run's id:
        the engine's tokens and log-probs of the model's replies as returned, the chat
        template's tokens between them (masked); an assistant message the workflow edited or
        wrote is re-tokenized as Trinity does (trained, counted in
        ``episodes/retokenized_turns``)."""
        experience = self.model.convert_messages_to_experience(messages)
        return self._rewarded(experience, reward, info, truncate_status)

    async def process_messages_to_experience_async(
        self,
        messages: Messages,
        reward: float,
        info: Optional[dict] = None,
        truncate_status: Optional[str] = None,
    ) -> Experience:
        """:meth:`process_messages_to_experience` for async workflows."""
        experience = await self.model.convert_messages_to_experience_async(messages)
        return self._rewarded(experience, reward, info, truncate_status)

    def _rewarded(
        self,
        experience: Experience,
        reward: float,
        info: Optional[dict],
        truncate_status: Optional[str],
    ) -> Experience:
        experience.reward = reward
        experience.info = dict(info or {})
        experience.metrics = numbers(experience.info)
        experience.truncate_status = experience.truncate_status or truncate_status
        experience.eid = EID(run=self.run_id_base)
        return experience


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
