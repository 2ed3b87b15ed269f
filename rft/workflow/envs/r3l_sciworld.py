"""``RAFT_baseline_scienceworld_workflow``: Trinity-RFT's R3L RAFT baseline on ScienceWorld
(``trinity/common/workflows/envs/R3L/scienceworld/raft_workflow.py``; shared part: :mod:`.r3l`),
on :mod:`rft.workflow.envs.sciworld`'s simulator wrapper and system prompt.

A row's prompt column (``format.prompt_key``) names the task: ``sciworld_workflow``'s JSON
``{"task_name", "var_num"}`` or Trinity's ``task_name-variation`` string. One simulator serves
all the task's runs. Each turn the model sees the observation with a format reminder and must
answer ``<think>...</think>`` then ``<action>...</action>``: a reply without both ends the run,
as does the same action three times in a row (reward 0 either way); an empty action is
answered without a move. At most ``workflow_args.max_env_steps`` turns (30) or until the
simulator is done; reward = the best score reached above the start, over 100 (1.0: solved).
"""

from __future__ import annotations

import re
from typing import Any, Optional

from rft.errors import WorkflowError
from rft.workflow.envs import sciworld
from rft.workflow.envs.r3l import RaftBaselineWorkflow, Rollout
from rft.workflow.registry import register_workflow

NAME = "RAFT_baseline_scienceworld_workflow"  # Trinity's registered name, its case included
# The R3L authors' fork (shiweijiezero/Trinity-RFT) registers it in lower case, the name the
# R3L example configs use (modelscope's examples/R3L at f9ab6de, whose package has NAME): both.
FORK_NAME = NAME.lower()
REPEATS_TO_FAIL = 3  # the same action this many times in a row ends the run (Trinity's)
EMPTY_ACTION = "The action was empty; write one command inside <action> </action>."
ACTION_REQUEST = (
    "Your turn: reason step by step inside <think> </think>, then give exactly one command "
    "inside <action> </action>."
)
_THINK_ACTION = re.compile(r"<think>\s*(.*?)\s*</think>.*?<action>\s*(.*?)\s*</action>", re.DOTALL)


def scienceworld_task(task_desc: Optional[str], prompt_key: Optional[str]) -> sciworld.SciWorldTask:
    """The task a row's prompt column names: a JSON object, or ``name-variation`` (the number
    after the last ``-``: ScienceWorld's names hold dashes), or a bare name (variation 0)."""
    if task_desc is None:
        raise WorkflowError(
            f"{NAME}: the task row has no {prompt_key!r} column (the taskset's "
            "format.prompt_key); rows made by python -m rft.workflow.envs.sciworld_data (and "
            "Trinity's get_sciworld_data.py) hold the task in 'task_desc': set "
            "format.prompt_key: task_desc"
        )
    text = task_desc.strip()
    if text.startswith("{"):
        return sciworld.parse_task(text)
    name, dash, variation = text.rpartition("-")
    if dash and variation.isdigit():
        return sciworld.SciWorldTask(name, int(variation))
    return sciworld.SciWorldTask(text, 0)


def action_of(reply: str) -> Optional[str]:
    """The action of a ``<think>...</think> ... <action>...</action>`` reply, stripped; None
    when the reply lacks either part."""
    match = _THINK_ACTION.search(reply)
    return match.group(2).strip() if match else None


@register_workflow(NAME)
@register_workflow(FORK_NAME)
class RaftBaselineSciWorldWorkflow(RaftBaselineWorkflow):
    name = NAME
    max_tokens = 16384  # per reply (Trinity's, over model.max_response_tokens)
    requires = sciworld.SciWorldWorkflow.requires

    @classmethod
    def check_workflow_args(cls, workflow_args: dict) -> None:
        sciworld.max_env_steps(workflow_args)

    def rollouts(self, runs: int) -> list[Rollout]:
        task = scienceworld_task(self.task.task_desc, self.task.format_args.prompt_key)
        steps = sciworld.max_env_steps(self.task.workflow_args)
        env = sciworld.open_env(task)
        try:
            return [self.play(env, steps) for _ in range(runs)]
        finally:
            sciworld.close_env(env)

    def play(self, env: Any, steps: int) -> Rollout:
        """One run from the task's start."""
        observation, _ = env.reset()
        observation = f"Task Description: {env.get_task_description()}\n{observation}"
        messages = [{"role": "system", "content": sciworld.SYSTEM_PROMPT}]
        actions: list[str] = []
        gained, best, turns = 0.0, 0.0, 0
        for _ in range(steps):
            prompt = f"{sciworld.format_observation(observation)}\n\n{ACTION_REQUEST}"
            messages.append({"role": "user", "content": prompt})
            reply = self.ask(messages)
            if reply is None:
                return Rollout(messages, 0.0, {"steps": turns})
            turns += 1
            action = action_of(reply)
            actions.append(action or "")
            repeated = len(actions) >= REPEATS_TO_FAIL and len(set(actions[-REPEATS_TO_FAIL:])) == 1
            if action is None or repeated:
                return Rollout(messages, 0.0, {"steps": turns})
            if not action:
                observation = EMPTY_ACTION
                continue
            observation, delta, done, _ = env.step(action)
            gained += delta  # the step's score change: the sum is the score above the start
            best = max(best, gained)
            if done:
                break
        return Rollout(messages, best / sciworld.SCORE_SCALE, {"steps": turns})
