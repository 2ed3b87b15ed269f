"""``RAFT_alfworld_workflow``: Trinity-RFT's RAFT agent on ALFWorld
(``trinity/common/workflows/envs/alfworld/RAFT_alfworld_workflow.py`` with its ``RAFT_utils.py``
and ``RAFT_prompt/alfworld_system.j2``; example ``examples/RAFT_alfworld/RAFT_alfworld_7B.yaml``)
on :mod:`.alfworld`'s games, with :mod:`.r3l`'s RAFT sample rule.

A row names its game as Trinity's does: the prompt column (the example's ``prompt_key:
game_file``), else the row's ``game_file`` (:func:`.r3l_alfworld.game_path`). One run and one
sample per task, in training and in evaluation, whatever ``repeat_times`` (the example's is 1).
Each turn the model sees ``Observation: ...`` (:func:`.alfworld.format_observation`) and answers
``<experience>``, ``<think>`` and ``<action>`` blocks in that order; the action is played (a
reply without the three in order: the empty action). The same action three times in a row ends
the run at reward 0 before it is played; otherwise at most 50 turns or until the game is done;
reward = the game's reward on the last turn played (1: solved). RAFT trains on the run only when
its reward is >= 1 and every reply had all three blocks, none empty. Metrics ``success`` (done
at reward >= 1), ``reward`` and ``steps`` (the replies). Reads no ``workflow_args``: 50 turns
and 4096 tokens per reply are fixed, as Trinity's. Sampling is the task's ``rollout_args``, the
values Trinity passes (its fallbacks 1.0/20/0.95 serve a rollout_args without those fields,
which Trinity's GenerationConfig never is).

Differences from Trinity. Forced by rft (an experience needs prompt and response tokens and a
reward): a run RAFT does not train on keeps its conversation's sample, reward and metrics with
an all-zero loss mask (Trinity returns a one-token placeholder with info ``error_reason`` and
``rollout_failed``); an evaluation run returns its conversation's sample with the same metrics
(Trinity: a placeholder carrying them, its info a timestamp ``task_id``); the trained sample's
reward is the run's (Trinity leaves it unset: RAFT's loss reads none). As rft's other RAFT
workflows (:mod:`.r3l`): a row naming no game file, a game error, a model error or a failed
conversion fails the episode (Trinity swallows each into the placeholder); a conversation with
no room left in ``model.max_model_len`` ends the run at reward 0 (Trinity's engine errors or
answers a placeholder text); a reply is kept as the engine returned it (Trinity strips it; the
parse is the same); ``success`` is 1.0/0.0 in info too (a bool there). The game is
:mod:`.alfworld`'s (Trinity's wrappers and infos; its calls take turns in TextWorld's engine with
the process's other games); ``run()`` is synchronous (Trinity's is async, with the same blocking
game calls); no progress prints.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence

from rft.workflow.envs import alfworld
from rft.workflow.envs.r3l import SUCCESS_REWARD, RaftBaselineWorkflow, Rollout
from rft.workflow.envs.r3l_alfworld import game_path
from rft.workflow.experience import Experience
from rft.workflow.registry import register_workflow

NAME = "RAFT_alfworld_workflow"  # Trinity's registered name, its case too
MAX_ENV_STEPS = 50  # turns per run (Trinity's, fixed there)
REPEATS_TO_FAIL = 3  # the same action this many times in a row ends the run (Trinity's)

# Trinity's RAFT_prompt/alfworld_system.j2 as Jinja renders it: its "\n\n" are literal
# backslash-n text in the template, and the file's last newline is dropped.
SYSTEM_PROMPT = """\
You are an agent interacting with a virtual text-based environment.

## Response Format:
You MUST use this exact format for every response. All three tags are REQUIRED in sequential order:

<experience>Working principles, strategies, common knowledge, and potential pitfalls relevant to the current task.</experience>\\n\\n
<think>your reasoning process</think>\\n\\n
<action>exactly one action command</action>

## Action Commands:
  look:                             look around your current location
  inventory:                        check your current inventory(you can only have 1 item in your inventory)
  go to (receptacle):               move to a receptacle
  open (receptacle):                open a receptacle
  close (receptacle):               close a receptacle
  take (object) from (receptacle):  take an object from a receptacle
  move (object) to (receptacle):    place an object in or on a receptacle
  examine (something):              examine a receptacle or an object
  use (object):                     use an object
  heat (object) with (receptacle):  heat an object using a receptacle
  clean (object) with (receptacle): clean an object using a receptacle
  cool (object) with (receptacle):  cool an object using a receptacle
  slice (object) with (object):     slice an object using a sharp object

For example your output should be like this:
<experience>In household tasks, I should start by exploring the environment to understand available objects and receptacles. Common pitfalls include forgetting to check inventory capacity and not examining objects before taking action.</experience>\\n\\n<think> To solve the task, I need first to ... </think>\\n\\n<action>go to cabinet 1</action>

## Important Note:
You must ensure that the <experience> section contains descriptions of working principles, strategies, common sense knowledge, and potential pitfalls that are universally applicable to this type of task, rather than generic statements, placeholder content, or overly specific behavioral guidelines."""  # noqa: E501


def _block(tag: str) -> str:
    return rf"<{tag}>\s*(.*?)\s*</{tag}>"


# the first <experience> block followed, in order, by a <think> and an <action> block
_REPLY = re.compile(".*?".join(_block(tag) for tag in ("experience", "think", "action")), re.DOTALL)


class Reply(NamedTuple):
    """A reply's three blocks, stripped; all "" when it lacks any of them in order."""

    experience: str
    think: str
    action: str

    @property
    def complete(self) -> bool:
        """Every block has text (Trinity's ``validate_response_format``)."""
        return all(self)


def parse_reply(reply: Optional[str]) -> Reply:
    """The blocks of the first ``<experience>...</experience>`` followed by ``<think>...</think>``
    and then ``<action>...</action>`` (anything between them); empty when there is none."""
    match = _REPLY.search(reply or "")
    return Reply(*(text.strip() for text in match.groups())) if match else Reply("", "", "")


def repeated(actions: Sequence[str]) -> bool:
    """The last :data:`REPEATS_TO_FAIL` actions are one action (the empty one included)."""
    return len(actions) >= REPEATS_TO_FAIL and len(set(actions[-REPEATS_TO_FAIL:])) == 1


@dataclass
class RaftRun(Rollout):
    """A run with what decides its metrics and its training beyond the reward."""

    done: bool = False  # the game said done on the last turn played
    complete: bool = True  # every reply had its three blocks, none empty

    @property
    def success(self) -> bool:
        return self.done and self.reward >= SUCCESS_REWARD

    @property
    def trained(self) -> bool:
        return self.reward >= SUCCESS_REWARD and self.complete


@register_workflow(NAME)
class RaftAlfworldWorkflow(RaftBaselineWorkflow):
    """One run of the task's game; its sample trained when solved with every reply complete."""

    name = NAME
    max_tokens = 4096  # per reply (Trinity's, over model.max_response_tokens)
    requires = alfworld.AlfworldWorkflow.requires

    @classmethod
    def check_workflow_args(cls, workflow_args: dict) -> None:
        """Trinity's reads none (not even the RAFT baselines' max_attempts)."""

    def run(self) -> list[Experience]:
        # Trinity's returns one sample whatever repeat_times (it sets can_repeat all the same)
        return [self.sample(0, self.rollout())]

    def rollout(self) -> RaftRun:
        task = self.task
        path = game_path(task.task_desc, task.raw_task, task.format_args.prompt_key, who=NAME)
        env = alfworld.open_env(path)
        try:
            return self.play(env)
        finally:
            env.close()

    def play(self, env: alfworld.Game) -> RaftRun:
        """One run from the game's start."""
        observation, _ = env.reset()
        messages = [{"role": "system", "content": SYSTEM_PROMPT}]
        actions: list[str] = []
        complete, reward = True, 0.0
        for _ in range(MAX_ENV_STEPS):
            messages.append({"role": "user", "content": alfworld.format_observation(observation)})
            text = self.ask(messages)
            if text is None:  # no room left for a reply
                return RaftRun(messages, 0.0, {"steps": len(actions)}, complete=complete)
            reply = parse_reply(text)
            complete = complete and reply.complete
            actions.append(reply.action)
            if repeated(actions):
                return RaftRun(messages, 0.0, {"steps": len(actions)}, complete=complete)
            observation, reward, done, _ = env.step(reply.action)
            if done:
                steps = {"steps": len(actions)}
                return RaftRun(messages, float(reward), steps, done=True, complete=complete)
        # out of turns: the last turn's reward (Trinity's), not a fixed one
        return RaftRun(messages, float(reward), {"steps": len(actions)}, complete=complete)
