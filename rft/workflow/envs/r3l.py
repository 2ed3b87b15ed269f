"""Trinity-RFT's R3L RAFT baselines (``trinity/common/workflows/envs/R3L/*/raft_workflow.py``):
what the countdown, DAPO-math and ScienceWorld ones share (:mod:`.r3l_countdown`,
:mod:`.r3l_dapo`, :mod:`.r3l_sciworld`).

Data in: a task row (each workflow reads its own fields) and the model handle. Data out: one
sample per run, ``repeat_times`` runs (one in evaluation), reward 1.0 on success. RAFT trains
on successful runs only: a failed run's sample keeps its tokens, reward and metrics but gets an
all-zero loss mask (Trinity returns a two-token placeholder with an empty action mask), so it
adds no token to the loss. A row the workflow cannot read, or a model call that raises, fails
the episode (Trinity's swallow every exception into that placeholder).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from rft.errors import WorkflowError
from rft.workflow.base import MultiTurnWorkflow
from rft.workflow.conversation import Messages
from rft.workflow.experience import Experience

MAX_ATTEMPTS = 3  # answers per run (Trinity's max_attempts, fixed there)
SUCCESS_REWARD = 1.0  # a run at this reward or above is a success: RAFT trains on it

_THINK = re.compile(r"<think>\s*(.*?)\s*</think>", re.DOTALL)
_ANSWER = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL | re.IGNORECASE)


def think_and_answer(reply: str) -> tuple[Optional[str], Optional[str]]:
    """The first ``<think>`` block's text and the first ``<answer>`` block's (its tags in any
    case), each stripped; None for a block that is missing (Trinity's ``parse_response``)."""
    think, answer = _THINK.search(reply), _ANSWER.search(reply)
    return (
        think.group(1).strip() if think else None,
        answer.group(1).strip() if answer else None,
    )


def max_attempts(workflow_args: dict) -> int:
    """``workflow_args.max_attempts``: answers per run (Trinity's 3)."""
    attempts = workflow_args.get("max_attempts", MAX_ATTEMPTS)
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise WorkflowError(f"max_attempts must be a whole number >= 1, got {attempts!r}")
    return attempts


@dataclass
class Rollout:
    """One run: the conversation to train on, its reward and its own metrics."""

    messages: Messages  # up to the model's last reply (later user turns are not trained)
    reward: float
    info: dict = field(default_factory=dict)  # numbers: "attempts" or "steps"

    @property
    def success(self) -> bool:
        return self.reward >= SUCCESS_REWARD

    @property
    def trained(self) -> bool:
        """RAFT trains on the run: a success (RAFT_alfworld_workflow asks more)."""
        return self.success


class RaftBaselineWorkflow(MultiTurnWorkflow):
    """A RAFT baseline: ``rollout()`` plays one run; ``run()`` plays the task's runs and keeps
    the loss on the successful ones. Subclasses set ``name`` and define ``rollout``."""

    can_reset = True  # Trinity's flags: reset(task) reuses the instance for another task
    can_repeat = True  # one episode does all repeat_times runs
    name = ""  # the registered name, for messages
    max_tokens = 4096  # per reply (Trinity's, passed on every call over max_response_tokens)

    @classmethod
    def check_workflow_args(cls, workflow_args: dict) -> None:
        max_attempts(workflow_args)

    def reset(self, task) -> None:
        self.task = task

    def run(self) -> list[Experience]:
        runs = 1 if self.task.is_eval else self.repeat_times  # Trinity: one sample in evaluation
        return [self.sample(i, rollout) for i, rollout in enumerate(self.rollouts(runs))]

    def rollouts(self, runs: int) -> list[Rollout]:
        """``runs`` runs of the task."""
        return [self.rollout() for _ in range(runs)]

    def rollout(self) -> Rollout:
        raise NotImplementedError(f"{type(self).__name__} defines no rollout()")

    def sample(self, i: int, rollout: Rollout) -> Experience:
        """Run ``i``'s sample, its loss mask all zero unless RAFT trains on it (in training)."""
        info = {"success": float(rollout.success), "reward": rollout.reward, **rollout.info}
        experience = self.process_messages_to_experience(
            rollout.messages, rollout.reward, info=info
        )
        experience.eid.run = self.run_id_base + i
        if not rollout.trained and not self.task.is_eval:
            experience.action_mask = [False] * (len(experience.tokens) - experience.prompt_length)
        return experience

    def ask(self, messages: Messages) -> Optional[str]:
        """The model's reply to ``messages``, appended to them as the engine returned it (the
        sample keeps its tokens); None when the conversation leaves it no room within
        max_model_len (Trinity stops at a fixed token count instead)."""
        reply = self.model.chat(messages, max_tokens=self.max_tokens)[0]
        if reply.truncate_status == "prompt_truncated":
            if not any(m["role"] == "assistant" for m in messages):
                raise WorkflowError(
                    f"{self.name}: the task's first prompt leaves no room for a reply within "
                    "model.max_model_len; raise max_model_len or shorten the task"
                )
            return None
        text = reply.response_text or ""
        messages.append({"role": "assistant", "content": text})
        return text
