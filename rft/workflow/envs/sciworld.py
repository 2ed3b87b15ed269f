"""``sciworld_workflow``: Trinity-RFT's ScienceWorld agent on the ``scienceworld`` package.

A taskset row's ``task_desc`` is a JSON object ``{"task_name", "var_num", "jar_path"}`` (Trinity's
rows; ``python -m rft.workflow.envs.sciworld_data DIR`` writes them). One ScienceWorld JVM per
workflow run (``can_repeat``: it does all ``repeat_times`` runs of its task, ``reset`` between
them), closed and waited for at the end. Each turn the model sees ``Observation: ...`` and
answers ``<think>...</think><action>...</action>``; the reward is the best score the run reached
above its start, over 100 (0 to 1). ``workflow_args.max_env_steps``: turns per run (30).
scienceworld is imported when a run starts, never when rft is imported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rft.errors import WorkflowError
from rft.workflow.base import MultiTurnWorkflow
from rft.workflow.envs.text_game import max_env_steps, parse_action
from rft.workflow.experience import Experience
from rft.workflow.registry import register_workflow
from rft.workflow.requires import JAVA, python_package

ENV_STEP_LIMIT = 100  # ScienceWorldEnv's envStepLimit (Trinity's)
SIMPLIFICATION = "easy"  # ScienceWorld's simplification preset (Trinity's)
SCORE_SCALE = 100.0  # ScienceWorld scores run 0..100; the reward is 0..1
JVM_EXIT_TIMEOUT_S = 10.0  # after close(), the JVM is waited for this long, then killed

# Trinity's system prompt, word for word (its newest text).
SYSTEM_PROMPT = """
You are an agent, your job is to do some scientific experiment in a virtual text-based environment.

## Notes:
At each step, you should first think then perform action to fulfill the instruction. You should ALWAYS wrap your thinking with the <think> </think> tag and wrap your action with the <action> </action> tag.
You should ALWAYS take one action each step.
DO NOT try to interact with the user at anytime. Finish the task by yourself.

## Action Format:
Below are the available commands you can use:
    open OBJ: open a container
    close OBJ: close a container
    activate OBJ: activate a device
    deactivate OBJ: deactivate a device
    connect OBJ to OBJ: connect electrical components
    disconnect OBJ: disconnect electrical components
    use OBJ [on OBJ]: use a device/item
    look around: describe the current room
    examine OBJ: describe an object in detail
    look at OBJ: describe a container's contents
    read OBJ: read a note or book
    move OBJ to OBJ: move an object to a container
    pick up OBJ: move an object to the inventory
    pour OBJ into OBJ: pour a liquid into a container
    mix OBJ: chemically mix a container
    teleport to LOC: teleport to a specific room
    focus on OBJ: signal intent on a task object
    wait: task no action for 10 steps
    wait1: task no action for a step

For example your output should be like this:
<think> Now I will check the bedroom ... </think><action>teleport to bedroom</action>
"""  # noqa: E501


@dataclass(frozen=True)
class SciWorldTask:
    """What a row's ``task_desc`` names: a ScienceWorld task and its variation."""

    task_name: str  # e.g. "boil" (ScienceWorld's names, scienceworld.ScienceWorldEnv.task_names)
    var_num: int  # the variation
    jar_path: str = ""  # the simulator's jar; "" = the installed package's own


def parse_task(task_desc: Any) -> SciWorldTask:
    """The task a row's ``task_desc`` (a JSON string, or the object itself) names."""
    try:
        spec = json.loads(task_desc) if isinstance(task_desc, str) else task_desc
        return SciWorldTask(
            str(spec["task_name"]), int(spec["var_num"]), spec.get("jar_path") or ""
        )
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise WorkflowError(
            f"sciworld_workflow: task_desc {str(task_desc)[:200]!r} is not a JSON object with "
            '"task_name" and "var_num" (and optionally "jar_path"); make the taskset with '
            "python -m rft.workflow.envs.sciworld_data DIR"
        ) from e


def format_observation(observation: str) -> str:
    """A user turn: the environment's text under Trinity's ``Observation:`` line."""
    return "Observation: \n" + observation


def open_env(task: SciWorldTask) -> Any:
    """A ScienceWorld simulator (its own JVM) with ``task`` loaded and its gold path made."""
    from scienceworld import ScienceWorldEnv

    if task.jar_path and not Path(task.jar_path).is_file():
        raise WorkflowError(
            f"sciworld_workflow: jar_path {task.jar_path!r} is not a file; drop jar_path from "
            "the rows to use the scienceworld package's own jar"
        )
    env = ScienceWorldEnv("", task.jar_path or None, envStepLimit=ENV_STEP_LIMIT)
    try:
        env.load(task.task_name, task.var_num, SIMPLIFICATION, generateGoldPath=True)
    except BaseException:
        close_env(env)
        raise
    return env


def close_env(env: Any) -> None:
    """Shut the simulator down and wait for its JVM to exit (killed after a timeout)."""
    process = getattr(getattr(env, "_gateway", None), "java_process", None)
    try:
        env.close()
    finally:
        # its __del__ closes again, which on a shut gateway prints py4j tracebacks
        env.close = lambda: None
        if process is not None and process.poll() is None:
            try:
                process.wait(timeout=JVM_EXIT_TIMEOUT_S)
            except Exception:
                process.kill()
                process.wait()


@register_workflow("sciworld_workflow")
class SciWorldWorkflow(MultiTurnWorkflow):
    can_repeat = True  # Trinity's: one simulator serves all the task's runs
    requires = (python_package("scienceworld"), JAVA)

    @classmethod
    def check_workflow_args(cls, workflow_args: dict) -> None:
        max_env_steps(workflow_args)

    def run(self) -> list[Experience]:
        task = parse_task(self.task.task_desc)
        steps = max_env_steps(self.task.workflow_args)
        env = open_env(task)
        try:
            golden_rounds = len(env.get_gold_action_sequence())
            experiences = []
            for i in range(self.repeat_times):
                experience = self.run_once(env, steps, golden_rounds)
                experience.eid.run = self.run_id_base + i
                experiences.append(experience)
            return experiences
        finally:
            close_env(env)

    def run_once(self, env: Any, steps: int, golden_rounds: int) -> Experience:
        """One run from the task's start: at most ``steps`` turns, until the simulator is done."""
        observation, _ = env.reset()
        observation = f"Task Description: {env.get_task_description()}\n{observation}"
        messages = [{"role": "system", "content": SYSTEM_PROMPT}]
        gained, best, done, rounds = 0.0, 0.0, False, 0
        for rounds in range(steps):
            messages.append({"role": "user", "content": format_observation(observation)})
            reply = self.model.chat(messages)[0]
            if reply.truncate_status == "prompt_truncated":
                break
            messages.append({"role": "assistant", "content": reply.response_text})
            observation, reward, done, _ = env.step(parse_action(reply.response_text))
            gained += reward  # the step's score change; the sum is the score above the start
            best = max(best, gained)
            if done:
                break
        # Trinity's metrics: env_rounds is the index of the last turn (turns - 1)
        info = {"env_rounds": rounds, "env_done": int(done), "golden_rounds": golden_rounds}
        return self.process_messages_to_experience(messages, best / SCORE_SCALE, info=info)
