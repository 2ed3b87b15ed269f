"""``RAFT_alfworld_workflow`` (Trinity's RAFT agent on ALFWorld, rft/workflow/envs/raft_alfworld.py):
its system prompt, reply parsing and repetition rule as pure functions; its runs against a
scripted model and a scripted game (which replies are played, the reward, the steps, when RAFT
trains, one sample per task, evaluation, the game a row names, a full context); and one game on
the real ALFWorld engine (``tests/helpers/alfworld_game.py``) where alfworld is installed."""

from __future__ import annotations

from pathlib import Path

import pytest

from rft.config.schema import FormatConfig
from rft.errors import NotSupportedError, WorkflowError
from rft.workflow.conversation import ChatTemplate
from rft.workflow.envs import alfworld
from rft.workflow.envs.raft_alfworld import (
    MAX_ENV_STEPS,
    SYSTEM_PROMPT,
    RaftAlfworldWorkflow,
    RaftRun,
    Reply,
    parse_reply,
    repeated,
)
from rft.workflow.registry import workflow_class
from rft.workflow.task import GenerationConfig, Task
from tests.helpers.alfworld_game import SOLUTION, TASK, write_game
from tests.helpers.scripted_model import scripted_model

needs_alfworld = pytest.mark.skipif(
    not alfworld.python_package("alfworld").met(),
    reason="needs the alfworld package: bash env/setup.sh --envs",
)
START = "You are in the middle of a room.\n\nYour task is to: put some apple in fridge."
REAL_OPEN = alfworld.open_env  # the real engine's game, for the test that plays it
HINT = (
    "Nothing happens.Please check if the action you take is valid or you have carefully "
    "followed the action format."
)


def say(action: str) -> str:
    """A reply with all three blocks."""
    return (
        "<experience>Find the object first, then its target.</experience>\n\n"
        f"<think>next</think>\n\n<action>{action}</action>"
    )


# ----------------------------------------------------------------------------- pure parts


def test_registered_under_trinitys_name_while_the_reflect_variant_stays_refused():
    assert workflow_class("RAFT_alfworld_workflow") is RaftAlfworldWorkflow
    with pytest.raises(NotSupportedError, match="RAFT_reflect_alfworld_workflow"):
        workflow_class("RAFT_reflect_alfworld_workflow")
    assert RaftAlfworldWorkflow.requires == alfworld.AlfworldWorkflow.requires
    assert RaftAlfworldWorkflow.can_reset and RaftAlfworldWorkflow.can_repeat
    RaftAlfworldWorkflow.check_workflow_args({"max_env_steps": 0, "max_attempts": 0})  # unread


def test_system_prompt_is_trinitys_template_as_jinja_renders_it():
    assert SYSTEM_PROMPT.startswith(
        "You are an agent interacting with a virtual text-based environment.\n\n"
        "## Response Format:\nYou MUST use this exact format for every response. All three "
        "tags are REQUIRED in sequential order:\n\n<experience>Working principles,"
    )
    # the template's "\n\n" are backslash-n text, not line breaks
    assert (
        "the current task.</experience>\\n\\n\n<think>your reasoning process</think>\\n\\n\n"
        in (SYSTEM_PROMPT)
    )
    assert "  move (object) to (receptacle):    place an object in or on a receptacle\n" in (
        SYSTEM_PROMPT
    )
    assert "</think>\\n\\n<action>go to cabinet 1</action>\n\n## Important Note:\n" in SYSTEM_PROMPT
    assert SYSTEM_PROMPT.endswith("or overly specific behavioral guidelines.")  # no last newline
    assert SYSTEM_PROMPT.count("\n") == 28  # the template's 29 lines


@pytest.mark.parametrize(
    "reply, parsed",
    [
        (
            "<experience> Look first. </experience>\n<think> go </think>\n"
            "<action> go to fridge 1 </action>",
            Reply("Look first.", "go", "go to fridge 1"),
        ),
        (  # blocks span lines; text between them is skipped; the first action is taken
            "<experience>a\nb</experience> so <think>c</think> then "
            "<action>look</action><action>inventory</action>",
            Reply("a\nb", "c", "look"),
        ),
        ("<experience></experience><think>t</think><action>look</action>", Reply("", "t", "look")),
        ("<think>t</think><action>look</action>", Reply("", "", "")),  # no experience
        ("<think>t</think><experience>e</experience><action>look</action>", Reply("", "", "")),
        ("<experience>e</experience><think>t</think><action>look", Reply("", "", "")),  # unclosed
        ("go to fridge 1", Reply("", "", "")),
        (None, Reply("", "", "")),
    ],
)
def test_a_reply_is_its_experience_think_and_action_in_order(reply, parsed):
    assert parse_reply(reply) == parsed


def test_a_reply_is_complete_when_no_block_is_empty():
    assert Reply("e", "t", "look").complete
    assert not Reply("", "t", "look").complete
    assert not Reply("e", "", "look").complete
    assert not Reply("e", "t", "").complete


def test_the_same_action_three_times_running_is_a_repeat():
    assert not repeated([]) and not repeated(["look", "look"])
    assert repeated(["look", "look", "look"])
    assert repeated(["go to fridge 1", "look", "look", "look"])
    assert not repeated(["look", "inventory", "look"])
    assert repeated(["", "", ""])  # three replies without an action


def test_success_needs_done_and_training_needs_every_reply_complete():
    solved = RaftRun([], 1.0, done=True)
    assert solved.success and solved.trained
    sloppy = RaftRun([], 1.0, done=True, complete=False)
    assert sloppy.success and not sloppy.trained
    assert not RaftRun([], 0.0, done=True).success and not RaftRun([], 0.0).trained
    unfinished = RaftRun([], 1.0)  # Trinity trains on reward >= 1, success also asks done
    assert not unfinished.success and unfinished.trained


# ----------------------------------------------------------------------------- runs


class ScriptedGame:
    """A game answering each action from ``outcomes`` (else "Nothing happens."), recording what
    was played."""

    def __init__(self, outcomes: dict[str, tuple[str, float, bool]]):
        self.outcomes = outcomes
        self.played: list[str] = []
        self.closed = False

    def reset(self):
        return START, {}

    def step(self, action: str):
        self.played.append(action)
        observation, reward, done = self.outcomes.get(action, ("Nothing happens.", 0.0, False))
        return observation, reward, done, {}

    def close(self):
        self.closed = True


SOLVABLE = {
    "go to countertop 1": ("You arrive at countertop 1.", 0.0, False),
    "take apple 1 from countertop 1": ("You pick up the apple 1.", 0.0, False),
    "move apple 1 to fridge 1": ("You move the apple 1 to the fridge 1.", 1.0, True),
    "inventory": ("You are carrying nothing.", 0.5, False),  # a reward without done
}


@pytest.fixture(scope="module")
def template(smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    return ChatTemplate(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir))


@pytest.fixture
def game_file(tmp_path) -> Path:
    """A path alfworld.game_file accepts (the scripted game never reads it)."""
    (tmp_path / "traj_data.json").write_text("{}")
    (tmp_path / "game.tw-pddl").write_text("{}")
    return tmp_path / "game.tw-pddl"


def run(
    monkeypatch, template, script, game=None, *, row, prompt_key="game_file", repeat=1, **kwargs
):
    """The workflow's samples of one task with replies ``script``, its model service and the
    paths it opened (``game``: a ScriptedGame, else the real engine)."""
    model, service = scripted_model(template, script)
    task = Task(
        workflow=RaftAlfworldWorkflow,
        repeat_times=repeat,
        format_args=FormatConfig(prompt_key=prompt_key),
        rollout_args=GenerationConfig(temperature=1.0),
        raw_task=row,
        task_id="t/0",
        **kwargs,
    )
    workflow = task.to_workflow(model)
    workflow.set_repeat_times(repeat, 7)
    opened: list[Path] = []

    def open_env(path):
        opened.append(path)
        return game if game is not None else REAL_OPEN(path)

    monkeypatch.setattr(alfworld, "open_env", open_env)
    exps = workflow.run()
    for exp in exps:
        exp.check("RaftAlfworldWorkflow", evaluation=task.is_eval)
    return exps, service, opened


def trained(exp) -> int:
    """Loss tokens of a sample."""
    return int(exp.action_mask.sum())


def prompt_of(template: ChatTemplate, service, call: int) -> str:
    return template.tokenizer.decode(service.calls[call][0])


def test_a_solved_run_is_one_trained_sample_with_reward_one(monkeypatch, template, game_file):
    game = ScriptedGame(SOLVABLE)
    actions = ["go to countertop 1", "take apple 1 from countertop 1", "move apple 1 to fridge 1"]
    row = {"game_file": str(game_file), "target": ""}
    [exp], service, opened = run(monkeypatch, template, [say(a) for a in actions], game, row=row)
    assert opened == [game_file] and game.closed and game.played == actions
    assert exp.reward == 1.0 and exp.eid.run == 7 and trained(exp) > 0
    assert exp.metrics == {"success": 1.0, "reward": 1.0, "steps": 3.0}
    assert len(service.calls) == 3 and service.calls[0][1]["max_tokens"] == 4096
    first = prompt_of(template, service, 0)
    assert "All three tags are REQUIRED in sequential order" in first
    assert f"Observation: {START}" in first
    assert "Observation: You arrive at countertop 1." in prompt_of(template, service, 1)
    assert "<action>take apple 1 from countertop 1</action>" in prompt_of(template, service, 2)


def test_one_run_and_one_sample_whatever_repeat_times(monkeypatch, template, game_file):
    game = ScriptedGame(SOLVABLE)
    row = {"game_file": str(game_file)}
    exps, service, _ = run(
        monkeypatch, template, [say("move apple 1 to fridge 1")] * 4, game, row=row, repeat=4
    )
    assert len(exps) == 1 and exps[0].eid.run == 7 and len(service.calls) == 1


def test_a_solved_run_with_an_incomplete_reply_is_not_trained(monkeypatch, template, game_file):
    game = ScriptedGame(SOLVABLE)
    script = [
        "<think>no experience block</think><action>go to countertop 1</action>",
        say("take apple 1 from countertop 1"),
        say("move apple 1 to fridge 1"),
    ]
    [exp], service, _ = run(monkeypatch, template, script, game, row={"game_file": str(game_file)})
    assert game.played == ["", "take apple 1 from countertop 1", "move apple 1 to fridge 1"]
    assert f"Observation: {HINT}" in prompt_of(template, service, 1)
    assert exp.reward == 1.0 and exp.metrics == {"success": 1.0, "reward": 1.0, "steps": 3.0}
    assert len(exp.tokens) > exp.prompt_length and trained(exp) == 0


@pytest.mark.parametrize(
    "script, played",
    [
        ([say("look")] * 3, ["look", "look"]),
        (["<action>look</action>"] * 3, ["", ""]),  # unparsed: the empty action, thrice
        ([say("go to countertop 1")] + [say("look")] * 3, ["go to countertop 1", "look", "look"]),
    ],
)
def test_the_third_same_action_ends_the_run_at_reward_zero_unplayed(
    monkeypatch, template, game_file, script, played
):
    game = ScriptedGame(SOLVABLE)
    [exp], service, _ = run(monkeypatch, template, script, game, row={"game_file": str(game_file)})
    assert game.played == played and game.closed and len(service.calls) == len(script)
    assert exp.reward == 0.0 and trained(exp) == 0
    assert exp.metrics == {"success": 0.0, "reward": 0.0, "steps": float(len(script))}


def test_out_of_turns_after_fifty_the_reward_is_the_last_turns(monkeypatch, template, game_file):
    game = ScriptedGame(SOLVABLE)
    script = [say("look"), say("inventory")] * (MAX_ENV_STEPS // 2) + [say("never asked")]
    [exp], service, _ = run(monkeypatch, template, script, game, row={"game_file": str(game_file)})
    assert MAX_ENV_STEPS == 50 and len(service.calls) == 50 and len(game.played) == 50
    assert game.played[-1] == "inventory"  # answered with reward 0.5, not done
    assert exp.reward == 0.5 and trained(exp) == 0
    assert exp.metrics == {"success": 0.0, "reward": 0.5, "steps": 50.0}


def test_evaluation_is_one_sample_that_keeps_its_mask(monkeypatch, template, game_file):
    game = ScriptedGame(SOLVABLE)
    row = {"game_file": str(game_file)}
    [exp], service, _ = run(
        monkeypatch, template, [say("look")] * 3, game, row=row, repeat=3, is_eval=True
    )
    assert exp.reward == 0.0 and exp.metrics == {"success": 0.0, "reward": 0.0, "steps": 3.0}
    assert trained(exp) > 0 and len(service.calls) == 3


def test_the_prompt_column_names_the_game_else_game_file(
    monkeypatch, template, game_file, tmp_path
):
    other = tmp_path / "other"
    other.mkdir()
    (other / "traj_data.json").write_text("{}")
    (other / "game.tw-pddl").write_text("{}")
    row = {"task_desc": str(other / "game.tw-pddl"), "game_file": str(game_file)}
    script = [say("move apple 1 to fridge 1")]
    _, _, opened = run(
        monkeypatch, template, script, ScriptedGame(SOLVABLE), row=row, prompt_key="task_desc"
    )
    assert opened == [other / "game.tw-pddl"]
    _, _, opened = run(
        monkeypatch, template, script, ScriptedGame(SOLVABLE), row=row, prompt_key="task_id"
    )
    assert opened == [game_file]
    with pytest.raises(
        WorkflowError, match="RAFT_alfworld_workflow: the task row has neither a 'task_id' column"
    ):
        run(monkeypatch, template, [], ScriptedGame({}), row={"target": ""}, prompt_key="task_id")
    with pytest.raises(WorkflowError, match="is not a game file"):
        run(
            monkeypatch,
            template,
            [],
            ScriptedGame({}),
            row={"game_file": str(tmp_path / "missing")},
        )


def test_a_full_context_ends_the_run_at_reward_zero(monkeypatch, template, game_file):
    reply = say("go to countertop 1")
    model, service = scripted_model(template, [reply, say("look")])
    first = template.encode(
        template.render(
            [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": f"Observation: {START}"},
            ]
        )
    )
    # room for the first reply, not for the second prompt (which adds an observation too)
    service.max_model_len = len(first) + len(template.encode(reply)) + 3
    task = Task(
        workflow=RaftAlfworldWorkflow,
        format_args=FormatConfig(prompt_key="game_file"),
        raw_task={"game_file": str(game_file)},
    )
    game = ScriptedGame(SOLVABLE)
    monkeypatch.setattr(alfworld, "open_env", lambda path: game)
    [exp] = task.to_workflow(model).run()
    assert game.played == ["go to countertop 1"] and len(service.calls) == 1
    assert exp.reward == 0.0 and exp.metrics["steps"] == 1 and trained(exp) == 0


# ----------------------------------------------------------------------------- the real game


@needs_alfworld
def test_the_real_game_solved_is_trained_unless_a_reply_was_incomplete(
    monkeypatch, template, tmp_path
):
    game = write_game(tmp_path / "game")
    row = {"game_file": str(game), "target": ""}
    [exp], service, _ = run(monkeypatch, template, [say(a) for a in SOLUTION], row=row)
    assert exp.reward == 1.0 and trained(exp) > 0
    assert exp.metrics == {"success": 1.0, "reward": 1.0, "steps": 5.0}
    first = prompt_of(template, service, 0)
    assert "Observation: -= Welcome to TextWorld, ALFRED! =-" in first
    assert f"Your task is to: {TASK}." in first
    assert (
        "Observation: You arrive at countertop 1. On the countertop 1, you see a apple 1."
        in prompt_of(template, service, 1)
    )
    # a reply without its experience block plays the empty action, which the game refuses
    script = ["<think>go</think><action>go to countertop 1</action>"] + [say(a) for a in SOLUTION]
    [exp], service, _ = run(monkeypatch, template, script, row=row)
    assert f"Observation: {HINT}" in prompt_of(template, service, 1)
    assert exp.reward == 1.0 and exp.metrics["steps"] == 6 and trained(exp) == 0
