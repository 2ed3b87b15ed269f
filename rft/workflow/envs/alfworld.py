"""``alfworld_workflow`` and ``step_wise_alfworld_workflow``: Trinity-RFT's ALFWorld agents on the
``alfworld`` package (TextWorld games of ALFRED household tasks, played in text).

A taskset row's ``task_desc`` is the path of a game file: ALFWorld's layout, a ``game.tw-pddl``
(the PDDL domain, problem and text grammar of one task) with its ``traj_data.json`` beside it
(the task type the hand-coded expert wrapper reads), as ``alfworld-download`` unpacks them and
Trinity's examples/grpo_alfworld/get_alfworld_data.py lists them. Each turn the model sees
``Observation: ...`` and answers ``<think>...</think><action>...</action>``; a run ends when the
game is done (its reward: 1 when the task is solved) or after ``workflow_args.max_env_steps``
turns (30) with reward -0.1, as Trinity's. ``alfworld_workflow``: one experience per run, the
whole conversation; ``step_wise_alfworld_workflow``: one per turn, each given the run's reward
(Trinity's RewardPropagationWorkflow; ``algorithm_type: multi_step_grpo`` or ``gigpo``).
alfworld and textworld are imported when a run starts, never when rft is imported.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Optional

from rft.errors import WorkflowError
from rft.workflow.base import MultiTurnWorkflow
from rft.workflow.envs.text_game import max_env_steps, parse_action
from rft.workflow.experience import Experience
from rft.workflow.registry import register_workflow
from rft.workflow.requires import python_package
from rft.workflow.step_wise import RewardPropagationWorkflow

UNFINISHED_REWARD = -0.1  # a run that never finished the game (Trinity's)
TRAJ_DATA = "traj_data.json"  # beside each game file: the task type the expert wrapper reads

# Trinity's system prompt, word for word.
SYSTEM_PROMPT = """
You are an agent interacting with a virtual text-based environment.

## Notes:
At each step, you should first think then perform action to fulfill the instruction. You should ALWAYS wrap your thinking with the <think> </think> tag and wrap your action with the <action> </action> tag.
You should ALWAYS take one action each step.
DO NOT try to interact with the user at anytime. Finish the task by yourself.

## Action Format:
Below are the available commands you can use:
  look:                             look around your current location
  inventory:                        check your current inventory(you can only have 1 item in your inventory)
  go to (receptacle):               move to a receptacle
  open (receptacle):                open a receptacle
  close (receptacle):               close a receptacle
  take (object) from (receptacle):  take an object from a receptacle
  move (object) to (receptacle):  place an object in or on a receptacle
  examine (something):              examine a receptacle or an object
  use (object):                     use an object
  heat (object) with (receptacle):  heat an object using a receptacle
  clean (object) with (receptacle): clean an object using a receptacle
  cool (object) with (receptacle):  cool an object using a receptacle
  slice (object) with (object):     slice an object using a sharp object

For example your output should be like this:
<think> To solve the task, I need first to ... </think><action>go to cabinet 1</action>
"""  # noqa: E501
INVALID_HINT = (  # appended to an observation that says the action did nothing (Trinity's)
    "Please check if the action you take is valid or you have carefully followed the action format."
)


def format_observation(observation: str) -> str:
    """A user turn: the game's text after ``Observation: ``, with Trinity's hint when the last
    action did nothing."""
    if "Nothing happens." in observation:
        observation += INVALID_HINT
    return "Observation: " + observation


def game_file(task_desc: Any) -> Path:
    """The game a row names, checked: a file with ALFWorld's ``traj_data.json`` beside it."""
    path = Path(str(task_desc or ""))
    if not path.is_file():
        raise WorkflowError(
            f"alfworld: task_desc {str(task_desc)[:200]!r} is not a game file; each row's "
            "task_desc is the path of an ALFWorld game.tw-pddl (alfworld-download's data, "
            "listed as rows by Trinity's examples/grpo_alfworld/get_alfworld_data.py)"
        )
    if not (path.parent / TRAJ_DATA).is_file():
        raise WorkflowError(
            f"alfworld: {path} has no {TRAJ_DATA} beside it (ALFWorld's expert wrapper reads "
            "the task type there); keep each game folder as alfworld-download unpacks it"
        )
    return path


# TextWorld's PDDL engine parses with one module-level parser, which concurrent calls corrupt;
# rft's episodes are threads of one explorer process (Trinity's runners are processes), so
# they take turns inside the game engine (each call takes milliseconds; model calls run free).
_ENGINE = threading.Lock()


class Game:
    """A TextWorld game of ALFWorld (object names as "apple 1", the hand-coded expert wrapper,
    the infos Trinity requests) whose calls take turns with every other game of the process."""

    def __init__(self, path: Path):
        import textworld
        import textworld.gym
        from alfworld.agents.environment.alfred_tw_env import (
            AlfredDemangler,
            AlfredExpert,
            AlfredExpertType,
        )

        infos = textworld.EnvInfos(description=True, inventory=True, admissible_commands=True)
        wrappers = [AlfredDemangler(), AlfredExpert(expert_type=AlfredExpertType.HANDCODED)]
        with _ENGINE:
            env_id = textworld.gym.register_game(str(path), infos, wrappers=wrappers)
            self._env = textworld.gym.make(env_id)

    def reset(self) -> tuple[str, dict]:
        with _ENGINE:
            return self._env.reset()

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        with _ENGINE:
            return self._env.step(action)

    def close(self) -> None:
        with _ENGINE:
            self._env.close()


def open_env(path: Path) -> Game:
    return Game(path)


@register_workflow("alfworld_workflow")
class AlfworldWorkflow(MultiTurnWorkflow):
    """One game per run: the conversation until the game is done or the turns run out."""

    requires = (python_package("alfworld"),)

    @classmethod
    def check_workflow_args(cls, workflow_args: dict) -> None:
        max_env_steps(workflow_args)

    def run(self) -> list[Experience]:
        steps = max_env_steps(self.task.workflow_args)
        env = open_env(game_file(self.task.task_desc))
        try:
            observation, _ = env.reset()
            messages = [{"role": "system", "content": SYSTEM_PROMPT}]
            reward, done, rounds = UNFINISHED_REWARD, False, 0
            for rounds in range(steps):
                messages.append({"role": "user", "content": format_observation(observation)})
                reply = self.model.chat(messages)[0]
                messages.append({"role": "assistant", "content": reply.response_text})
                observation, step_reward, done, _ = env.step(parse_action(reply.response_text))
                if done:
                    reward = float(step_reward)
                    break
        finally:
            env.close()
        # Trinity's metrics: env_rounds is the index of the last turn (turns - 1)
        info = {"env_rounds": rounds, "env_done": int(done)}
        return [self.process_messages_to_experience(messages, reward, info=info)]


@register_workflow("step_wise_alfworld_workflow")
class StepWiseAlfworldWorkflow(RewardPropagationWorkflow):
    """Each turn a step (its reply one experience); the run's reward given to every step."""

    requires = (python_package("alfworld"),)

    def __init__(self, *, task, model, auxiliary_models=None, use_openai_client: bool = False):
        super().__init__(
            task=task,
            model=model,
            auxiliary_models=auxiliary_models,
            use_openai_client=use_openai_client,
        )
        self.game = game_file(task.task_desc)
        self.max_env_steps = max_env_steps(task.workflow_args)
        self.env: Optional[Game] = None
        self.observation = ""
        self.done = False
        self.final_reward = UNFINISHED_REWARD
        self.memory: list[dict] = []

    @classmethod
    def check_workflow_args(cls, workflow_args: dict) -> None:
        max_env_steps(workflow_args)

    @property
    def max_step_num(self) -> int:
        return self.max_env_steps

    def run(self) -> list[Experience]:
        self.env = env = open_env(self.game)
        try:
            self.observation, _ = env.reset()
            self.done, self.final_reward = False, UNFINISHED_REWARD
            self.memory = [{"role": "system", "content": SYSTEM_PROMPT}]
            return super().run()
        finally:
            env.close()

    def step(self, step_num: int) -> bool:
        if self.done:
            return False
        self.memory.append({"role": "user", "content": format_observation(self.observation)})
        reply = self.model.chat(self.memory)[0]
        self.memory.append({"role": "assistant", "content": reply.response_text})
        assert self.env is not None, "step() runs inside run()"
        self.observation, reward, self.done, _ = self.env.step(parse_action(reply.response_text))
        if self.done:
            self.final_reward = float(reward)
        return not self.done

    def reward(self, exps: list[Experience]) -> float:
        return self.final_reward
