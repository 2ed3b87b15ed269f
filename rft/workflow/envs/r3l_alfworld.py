"""``RAFT_baseline_alfworld_workflow``: the R3L RAFT baseline on ALFWorld (the R3L authors' fork
shiweijiezero/Trinity-RFT: ``trinity/common/workflows/envs/R3L/alfworld/raft_workflow.py``, its
``utils.py`` and ``prompts/alfworld_system.j2``; modelscope's Trinity at f9ab6de holds the same
workflow file; shared part: :mod:`.r3l`), on :mod:`rft.workflow.envs.alfworld`'s games.

A row names its game as ``alfworld_workflow``'s do: the prompt column (``format.prompt_key``)
holds the path of an ALFWorld ``game.tw-pddl`` (``traj_data.json`` beside it); without that
column, the row's ``game_file`` (what R3L's get_alfworld_data.py writes: its configs point
``prompt_key`` at a ``task_id`` column those rows lack, and the fork falls back the same way).
One game serves all the task's runs, reset for each. R3L's system prompt; each turn the model
sees the observation and the game's admissible actions (after the first turn also the task and
its last four actions) and must answer one ``<think>...</think>`` and one
``<action>...</action>``: a reply without both (or with two of either), an action that is not
admissible, or the same action three times in a row ends the run at reward 0. At most
``workflow_args.max_env_steps`` turns (25) or until the game is done; reward = the game's reward
on the last turn (1.0: solved). Metrics ``success``, ``reward`` and ``steps`` (the replies).

Differences from the fork, as :mod:`.r3l_sciworld` handled them: a failed training run keeps
its sample with a zero loss mask (the fork returns a two-token placeholder); an unreadable row,
a model error or a game error fails the episode (the fork trains the placeholder); a
conversation with no room left in ``model.max_model_len`` ends the run at reward 0 (the fork
stops at a fixed 20480 - 512 tokens); ``max_env_steps`` is a workflow argument (fixed at 25
there; the system prompt says 25 either way, as the fork's); the reply is kept as the engine
returned it (the fork strips it). The game is :mod:`.alfworld`'s (its calls take turns in
TextWorld's engine with the process's other games; closed after the episode), with no TextWorld
step limit of its own (the fork's, 25, ends where its turn budget does); an action that is not
admissible ends the run before it reaches the game (the fork plays it first: the same run, the
same reward, and the next run resets the game).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional, Sequence

from rft.errors import WorkflowError
from rft.workflow.envs import alfworld
from rft.workflow.envs.r3l import RaftBaselineWorkflow, Rollout
from rft.workflow.envs.text_game import max_env_steps
from rft.workflow.registry import register_workflow

NAME = "RAFT_baseline_alfworld_workflow"  # modelscope's Trinity's registered name, its case too
# The R3L authors' fork registers it in lower case, the name the R3L example configs use
# (modelscope's examples/R3L at f9ab6de, whose package has NAME): both.
FORK_NAME = NAME.lower()
MAX_ENV_STEPS = 25  # turns per run (the fork's, fixed there)
HISTORY_LENGTH = 4  # earlier actions a turn's prompt lists (the fork's)
REPEATS_TO_FAIL = 3  # the same action this many times in a row ends the run (the fork's)

# The fork's prompts/alfworld_system.j2 as rendered, word for word.
SYSTEM_PROMPT = """\
You are an agent interacting with a virtual text-based environment.

## Response Format:
You MUST use this exact format for every response. Both tags are REQUIRED in sequential order:

<think>your analytical reasoning and thought process</think>
<action>exactly one specific action command</action>

## Action Commands:
Your <action> must be one of the following, strictly following the command (argument) format.

### Navigation & Observation:
- look: Look around your current location to get more details.
- inventory: Check the object you are currently holding (you can only hold one).
- go to (receptacle): Move to a receptacle (e.g., table, fridge, sink).

### Interacting with Receptacles:
- open (receptacle): Open a receptacle.
- close (receptacle): Close a receptacle.

### Interacting with Objects:
- take (object) from (receptacle): Pick up an object from a receptacle.
- move (object) to (receptacle): Place the object you are holding into or onto a receptacle.
- examine (object): Examine an object closely to learn its properties.

### Changing Object States:
- heat (object) with (receptacle): Heat an object with a device (e.g., microwave).
- cool (object) with (receptacle): Cool an object with a device (e.g., fridge).
- clean (object) with (receptacle): Clean an object with a device (e.g., sink).
- slice (object) with (object): Slice an object using a sharp object (e.g., knife).

For example your output should be like this:
<think>your reasoning process here</think>
<action>look</action>

<think>your reasoning process here</think>
<action>go to sofa 1</action>

## Critical Rules & Constraints
- Single Item Inventory: You can only hold one object at a time. You must put down the current object before taking a new one.
- Examine Before Acting: Before performing an action on an object (like take, heat, or clean), it is best to examine it first to confirm its properties.
- Use Exact Names: The (object) and (receptacle) arguments in your command MUST exactly match the names seen in your Observation, including any numbers (e.g., apple 1, desk 2).
- Systematic Thinking: Break down complex tasks into smaller, manageable sub-goals. Clearly outline your plan in the <think> block.
- Step Limit: You must complete the task within 25 steps."""  # noqa: E501
_TURN_TAIL = """
Now it's your turn to take an action.
You should first reason step-by-step about the current situation. This reasoning process MUST be enclosed within <think> </think> tags.
Once you've finished your reasoning, you should choose an admissible action for current step and present it within <action> </action> tags.

Format: <think>your reasoning process</think> <action>your chosen action</action>"""  # noqa: E501
_THINK = re.compile(r"<think>\s*(.*?)\s*</think>", re.DOTALL)
_ACTION = re.compile(r"<action>\s*(.*?)\s*</action>", re.DOTALL)
_TASK = re.compile(r"Your task is to:\s*(.+?)(?:\n|$)", re.IGNORECASE)


def action_of(reply: str) -> Optional[str]:
    """The action of a reply with exactly one ``<think>...</think>`` and one
    ``<action>...</action>`` (in either order), stripped; None for any other reply."""
    thinks, actions = _THINK.findall(reply), _ACTION.findall(reply)
    if len(thinks) != 1 or len(actions) != 1:
        return None
    return actions[0].strip()


def task_of(observation: str) -> str:
    """The task a game's first observation states (after ``Your task is to:``), else its last
    line."""
    match = _TASK.search(observation)
    return match.group(1).strip() if match else observation.split("\n")[-1]


def turn_prompt(observation: str, task: str, actions: Sequence[str], admissible: list) -> str:
    """A turn's user message: ``actions`` are the run's earlier ones (the turn's index is their
    count); ``admissible`` is shown as the fork shows it, a Python list."""
    if not actions:
        head = (
            "You are an expert agent operating in the ALFRED Embodied Environment.\n"
            f"Your current observation is: {observation}\n"
        )
    else:
        step = len(actions)
        recent = actions[-HISTORY_LENGTH:]
        listed = "\n".join(
            f"  Step {step - len(recent) + i}: {action}" for i, action in enumerate(recent)
        )
        head = (
            "You are an expert agent operating in the ALFRED Embodied Environment. Your task "
            f"is to: {task}\nPrior to this step, you have already taken {step} step(s). Below "
            f"are the most recent {len(recent)} actions you took:\n{listed}\n"
            f"You are now at step {step} and your current observation is: {observation}\n"
        )
    return (
        f"{head}Your admissible actions of the current situation are: {admissible}.\n{_TURN_TAIL}"
    )


def game_path(
    task_desc: Optional[str], row: Any, prompt_key: Optional[str], who: str = NAME
) -> Path:
    """The game a row names: its prompt column, else its ``game_file`` column; checked
    (``who``: the workflow, for the message)."""
    named = task_desc or (row.get("game_file") if isinstance(row, Mapping) else None)
    if not named:
        raise WorkflowError(
            f"{who}: the task row has neither a {prompt_key!r} column (the taskset's "
            "format.prompt_key) nor a 'game_file' column naming an ALFWorld game.tw-pddl "
            "(Trinity's and R3L's get_alfworld_data.py write game_file)"
        )
    return alfworld.game_file(named)


@register_workflow(NAME)
@register_workflow(FORK_NAME)
class RaftBaselineAlfworldWorkflow(RaftBaselineWorkflow):
    name = NAME
    max_tokens = 512  # per reply (the fork's, over model.max_response_tokens)
    requires = alfworld.AlfworldWorkflow.requires

    @classmethod
    def check_workflow_args(cls, workflow_args: dict) -> None:
        max_env_steps(workflow_args, MAX_ENV_STEPS)

    def rollouts(self, runs: int) -> list[Rollout]:
        path = game_path(self.task.task_desc, self.task.raw_task, self.task.format_args.prompt_key)
        steps = max_env_steps(self.task.workflow_args, MAX_ENV_STEPS)
        env = alfworld.open_env(path)
        try:
            return [self.play(env, steps) for _ in range(runs)]
        finally:
            env.close()

    def play(self, env: alfworld.Game, steps: int) -> Rollout:
        """One run from the game's start."""
        observation, info = env.reset()
        task = task_of(observation)
        messages = [{"role": "system", "content": SYSTEM_PROMPT}]
        actions: list[str] = []
        reward = 0.0
        for _ in range(steps):
            admissible = list(info.get("admissible_commands") or [])
            prompt = turn_prompt(observation, task, actions, admissible)
            messages.append({"role": "user", "content": prompt})
            reply = self.ask(messages)
            if reply is None:
                return Rollout(messages, 0.0, {"steps": len(actions)})
            action = action_of(reply)
            if action is None or action not in admissible:
                return Rollout(messages, 0.0, {"steps": len(actions) + 1})
            observation, reward, done, info = env.step(action)
            actions.append(action)
            if len(actions) >= REPEATS_TO_FAIL and len(set(actions[-REPEATS_TO_FAIL:])) == 1:
                return Rollout(messages, 0.0, {"steps": len(actions)})
            if done:
                break
        return Rollout(messages, float(reward), {"steps": len(actions)})
