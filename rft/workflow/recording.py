"""Workflows that train agent code rft did not write (Trinity-RFT's ``WorkflowWithRecording``):
the agent talks to the explorer's OpenAI-compatible endpoint with this run's
``base_url``/``api_key``/``model_name``, the workflow sets the reward with ``await
update_reward(...)``, and every sample the endpoint recorded for the run becomes an experience
with that reward.

``agent_program_workflow`` runs a program (any language, OpenAI SDK or plain HTTP) in a
sandbox with ``OPENAI_BASE_URL``/``OPENAI_API_KEY``/``OPENAI_MODEL`` set and scores its answer.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
from typing import Any, Optional, Sequence

from rft.errors import WorkflowError
from rft.workflow.base import Workflow
from rft.workflow.conversation import Thread
from rft.workflow.experience import EID, Experience, numbers
from rft.workflow.model import ModelWrapper
from rft.workflow.registry import register_workflow
from rft.workflow.rewards import answers_match, total_reward
from rft.workflow.sandbox import Limits, run_sandboxed
from rft.workflow.task import Task

SANDBOX_GRACE_S = 30.0  # a sandbox outlives its episode's limit by this much (start-up included)

Metrics = dict[str, float]  # what run_async returns: numbers for the step's metrics


class WorkflowWithRecording(Workflow):
    """Subclass and define ``async run_async(self) -> dict``: run any agent against
    :attr:`base_url` with :attr:`api_key` and :attr:`model_name`, ``await
    self.update_reward(reward)``, return metrics. Trinity's class: one run per instance
    (``can_repeat`` False), ``is_async`` True, ``auxiliary_models`` the auxiliary models'
    :class:`ModelWrapper` list (each with ``base_url``/``api_key``/``model_name``). An agent
    that made no model call, or a run whose samples got no reward, is a failed episode (never
    a hang: the explorer's ``max_timeout`` stops the run)."""

    can_reset = False
    can_repeat = False
    is_async = True

    def __init__(
        self,
        *,
        task: Task,
        model: ModelWrapper,
        auxiliary_models: Optional[list[ModelWrapper]] = None,
    ):
        super().__init__(task=task, model=model)
        self.auxiliary_model_wrappers = auxiliary_models
        self.auxiliary_models = auxiliary_models  # Trinity's: the wrappers, not clients
        self._rewards: list[tuple[float, dict, Optional[set[str]]]] = []

    @property
    def base_url(self) -> str:
        """The rollout model's OpenAI-compatible endpoint (``.../v1``)."""
        return self.model.base_url

    @property
    def api_key(self) -> str:
        """This run's key: calls carrying it are answered by the engine and recorded."""
        return self.model.api_key

    @property
    def model_name(self) -> str:
        return self.model.model_name

    async def run_async(self) -> Metrics:  # type: ignore[override]
        raise NotImplementedError(f"{type(self).__name__} defines no async run_async()")

    async def update_reward(
        self, reward: float, info: Optional[dict] = None, sample_ids: Optional[Sequence[str]] = None
    ) -> None:
        """Set the reward (and ``info``, kept with the samples; numbers become metrics) of the
        samples this run recorded, or of those whose chat completion ``id`` is in
        ``sample_ids``. A later call overrides an earlier one for the samples it names."""
        ids = None if sample_ids is None else {str(i) for i in sample_ids}
        self._rewards.append((float(reward), dict(info or {}), ids))

    def recorded_experiences(self, metrics: Optional[dict]) -> list[Experience]:
        """The run's recorded samples with their rewards (what the explorer trains on);
        ``metrics``: what :meth:`run_async` returned, added to every sample's metrics."""
        if metrics is not None and not isinstance(metrics, dict):
            raise WorkflowError(
                f"{type(self).__name__}.run_async returned {type(metrics).__name__}: a "
                "WorkflowWithRecording returns a dict of metrics (its samples are recorded)"
            )
        samples = self.model.samples()
        if not samples:
            raise WorkflowError(
                f"{type(self).__name__}: the agent made no model call through the endpoint "
                f"({self.base_url}, this run's api_key): nothing to train on"
            )
        run_metrics = numbers(metrics or {})
        out = []
        unrewarded = 0
        for thread in samples:
            reward, info = self._reward_of(thread)
            if reward is None:
                unrewarded += 1
                continue
            out.append(_experience(thread, reward, info, run_metrics, self.task.run_id))
        if unrewarded:
            said = (
                "never called update_reward()"
                if not self._rewards
                else (
                    f"gave no reward to {unrewarded} of its {len(samples)} recorded samples "
                    "(update_reward's sample_ids named none of their chat completion ids)"
                )
            )
            raise WorkflowError(f"{type(self).__name__}: the run {said}")
        return out

    def _reward_of(self, thread: Thread) -> tuple[Optional[float], dict]:
        ids = thread_call_ids(thread)
        reward: Optional[float] = None
        info: dict = {}
        for value, extra, named in self._rewards:
            if named is None or named & ids:
                reward, info = value, {**info, **extra}
        return reward, info


def thread_call_ids(thread: Thread) -> set[str]:
    """The chat completion ids of the calls a sample is made of (the endpoint labels them)."""
    ids: set[str] = set()
    node: Optional[Thread] = thread
    while node is not None:
        if node.call_id is not None:
            ids.add(node.call_id)
        node = node.extends
    return ids


def _experience(
    thread: Thread, reward: float, info: dict, run_metrics: dict, run: int
) -> Experience:
    return Experience(
        tokens=thread.tokens,
        prompt_length=len(thread.prompt_ids),
        logprobs=thread.logprobs,
        action_mask=thread.action_mask,
        reward=reward,
        info=info,
        metrics={**run_metrics, **numbers(info)},
        finish_reason=thread.finish_reason,
        model_version=min(thread.versions) if thread.versions else None,
        response_versions=thread.response_versions,
        eid=EID(run=run),
    )


@register_workflow("agent_program_workflow")
class AgentProgramWorkflow(WorkflowWithRecording):
    """``workflow_args``: ``command`` (a list, or one string split like a shell does; ``python``
    is this interpreter; existing relative paths are made absolute), ``sandbox`` (see
    ``rft.workflow.sandbox.Limits``). The program reads its task as JSON on stdin (and in
    ``RFT_TASK``). Its last line of output is its answer, scored like the task's reward
    function (default: the answer equals the task's truth); a last line ``{"reward": x}`` sets
    the reward itself."""

    async def run_async(self) -> Metrics:
        answer, seconds = await asyncio.to_thread(self.run_program)
        reward, parts = self.score(answer)
        await self.update_reward(reward, parts)
        return {"agent_seconds": seconds}

    def run_program(self) -> tuple[str, float]:
        """Run the program in its sandbox: the last line it printed, and its wall time."""
        args = self.task.workflow_args
        argv = program_argv(args.get("command"))
        limits = Limits.from_args(dict(args.get("sandbox") or {}), "taskset.workflow_args.sandbox")
        limit = self.model.time_limit_s
        row = json.dumps(self.task.to_dict(), default=str)
        env = {
            **os.environ,
            "OPENAI_BASE_URL": self.base_url,
            "OPENAI_API_KEY": self.api_key,
            "OPENAI_MODEL": self.model_name,
            "RFT_TASK": row,
        }
        done = run_sandboxed(
            argv,
            limits,
            env=env,
            stdin=row,
            timeout_s=(limit if limit is not None else 3600.0) + SANDBOX_GRACE_S,
            cancelled=lambda: self.model.cancelled,
        )
        if done.stopped:
            raise WorkflowError(f"agent program {argv[-1]!r} stopped: {done.stopped}")
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise WorkflowError(
                f"agent program {argv[-1]!r} exited with code {done.returncode}: {why[:300]}"
            )
        lines = [line for line in done.stdout.splitlines() if line.strip()]
        return (lines[-1].strip() if lines else ""), done.seconds

    def score(self, answer: str) -> tuple[float, dict[str, float]]:
        """(reward, parts) of the program's last line."""
        claimed = _claimed_reward(answer)
        if claimed is not None:
            return claimed, {}
        truth = self.task.truth or ""
        if self.task.reward_fn is not None:
            parts = self.task.reward_fn(**self.task.reward_fn_args)(response=answer, truth=truth)
            return total_reward(parts), dict(parts)
        correct = float(answers_match(answer, truth))
        return correct, {"accuracy": correct}


def program_argv(command: Any) -> list[str]:
    """``workflow_args.command`` as an argument list to run anywhere (the sandbox's working
    folder is a fresh scratch folder)."""
    if isinstance(command, str):
        argv = shlex.split(command)
    elif isinstance(command, list) and all(isinstance(a, str) for a in command):
        argv = list(command)
    else:
        argv = []
    if not argv:
        raise WorkflowError(
            "agent_program_workflow needs taskset.workflow_args.command: the program to run, "
            "e.g. [python, examples/openai_agent/calculator_agent.py]"
        )
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return [os.path.abspath(a) if not os.path.isabs(a) and os.path.exists(a) else a for a in argv]


def _claimed_reward(line: str) -> Optional[float]:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    if isinstance(value, dict) and isinstance(value.get("reward"), (int, float)):
        return float(value["reward"])
    return None
