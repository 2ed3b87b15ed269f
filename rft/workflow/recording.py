"""Workflows that train agent code rft did not write (Trinity-RFT's ``WorkflowWithRecording``
shape): the agent talks to the explorer's OpenAI-compatible endpoint with this run's
``base_url``/``api_key``/``model_name``, the workflow sets the reward with ``update_reward``,
and every sample the endpoint recorded for the run becomes an experience with that reward.

``agent_program_workflow`` runs a program (any language, OpenAI SDK or plain HTTP) in a
sandbox with ``OPENAI_BASE_URL``/``OPENAI_API_KEY``/``OPENAI_MODEL`` set and scores its answer.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from typing import Any, Optional

from rft.errors import WorkflowError
from rft.workflow.base import MultiTurnWorkflow
from rft.workflow.experience import Experience
from rft.workflow.registry import register_workflow
from rft.workflow.rewards import answers_match, total_reward
from rft.workflow.sandbox import Limits, run_sandboxed

SANDBOX_GRACE_S = 30.0  # a sandbox outlives its episode's limit by this much (start-up included)


class RecordingWorkflow(MultiTurnWorkflow):
    """Subclass and define :meth:`run_agent`: run any agent against :attr:`base_url` with
    :attr:`api_key`, then call :meth:`update_reward`. An agent that made no model call, or a
    run that never set a reward, is a failed episode (never a hang: the explorer's
    ``max_timeout`` stops the run)."""

    can_repeat = False  # one run per episode: each run has its own key

    def __init__(self, *, task, model, auxiliary_models=None):
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        self._reward: Optional[float] = None
        self._info: dict[str, Any] = {}

    @property
    def base_url(self) -> str:
        return self.model.base_url

    @property
    def api_key(self) -> str:
        return self.model.api_key

    @property
    def model_name(self) -> str:
        return self.model.model_name

    def run_agent(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} defines no run_agent()")

    def update_reward(self, reward: float, info: Optional[dict] = None) -> None:
        """The run's reward (the last call wins); ``info``: numbers become metrics."""
        self._reward = float(reward)
        self._info.update(info or {})

    def run(self) -> list[Experience]:
        self.run_agent()
        if self._reward is None:
            raise WorkflowError(f"{type(self).__name__}: the run ended without update_reward()")
        samples = self.model.samples()
        if not samples:
            raise WorkflowError(
                f"{type(self).__name__}: the agent made no model call through the endpoint "
                f"({self.base_url}, this run's api_key): nothing to train on"
            )
        metrics = {
            k: float(v)
            for k, v in self._info.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        return [self._sample(t, self._reward, dict(self._info), metrics, None) for t in samples]


@register_workflow("agent_program_workflow")
class AgentProgramWorkflow(RecordingWorkflow):
    """``workflow_args``: ``command`` (a list, or one string split like a shell does; ``python``
    is this interpreter; existing relative paths are made absolute), ``sandbox`` (see
    ``rft.workflow.sandbox.Limits``). The program reads its task as JSON on stdin (and in
    ``RFT_TASK``). Its last line of output is its answer, scored like the task's reward
    function (default: the answer equals the task's truth); a last line ``{"reward": x}`` sets
    the reward itself."""

    def run_agent(self) -> None:
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
        last = lines[-1].strip() if lines else ""
        reward, info = self.score(last)
        self.update_reward(reward, {**info, "agent_seconds": done.seconds})

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
