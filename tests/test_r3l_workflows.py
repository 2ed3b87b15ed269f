"""Trinity's R3L RAFT baselines (``RAFT_baseline_<env>_workflow``: countdown, dapo, scienceworld,
alfworld) run against a scripted model with hand-written rows: a right first answer, a wrong then
a right one (the feedback turn), all wrong (the sample kept with no loss token), evaluation, bad
format, bad rows; ScienceWorld against a scripted simulator, and one short episode on the real
one where java and scienceworld are installed; ALFWorld on a real one-room game
(``tests/helpers/alfworld_game.py``) where the alfworld package is installed. Then the eight R3L
example configs at dry run, as written (their lowercase names, the R3L fork's) and under
Trinity's capitalised names."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rft.config.schema import FormatConfig
from rft.errors import WorkflowError
from rft.workflow.conversation import ChatTemplate
from rft.workflow.envs import alfworld, sciworld
from rft.workflow.envs.r3l_alfworld import RaftBaselineAlfworldWorkflow, task_of
from rft.workflow.envs.r3l_alfworld import action_of as alfworld_action_of
from rft.workflow.envs.r3l_countdown import (
    FORMAT_FEEDBACK,
    RaftBaselineCountdownWorkflow,
    is_solution,
    puzzle_prompt,
)
from rft.workflow.envs.r3l_dapo import SYSTEM_PROMPT, RaftBaselineDapoWorkflow, answer_of
from rft.workflow.envs.r3l_sciworld import (
    EMPTY_ACTION,
    RaftBaselineSciWorldWorkflow,
    action_of,
    scienceworld_task,
)
from rft.workflow.registry import workflow_class
from rft.workflow.task import GenerationConfig, Task
from tests.helpers.alfworld_game import SOLUTION, TASK, write_game
from tests.helpers.sciworld_env import ScriptedEnv
from tests.helpers.scripted_model import scripted_model
from tests.helpers.trinity_examples import dry_run

EXAMPLES = Path(__file__).resolve().parent / "fixtures" / "trinity_examples_newest"
needs_jvm = pytest.mark.skipif(
    shutil.which("java") is None or not sciworld.python_package("scienceworld").met(),
    reason="needs java and the scienceworld package: bash env/setup.sh --envs",
)
needs_alfworld = pytest.mark.skipif(
    not alfworld.python_package("alfworld").met(),
    reason="needs the alfworld package: bash env/setup.sh --envs",
)

COUNTDOWN_ROW = {"nums": [44, 19, 35], "target": 98}
RIGHT_EQ = "<think>44 + 19 + 35 = 98</think> <answer>44 + 19 + 35</answer>"
WRONG_EQ = "<think>try</think> <answer>44 + 19 - 35</answer>"
DAPO_ROW = {
    "prompt": [{"role": "user", "content": "What is 6 times 7?"}],
    "reward_model": {"ground_truth": "42", "style": "rule"},
}
RIGHT_42 = "<think>6 * 7 = 42</think><answer>\\boxed{42}</answer>"
WRONG_41 = "<think>6 * 7 = 41</think><answer>41</answer>"


@pytest.fixture(scope="module")
def template(smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    return ChatTemplate(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir))


def run(workflow_cls, template, row, script, *, repeat=1, is_eval=False, prompt_key=None, **args):
    """The workflow's experiences on ``row`` with replies ``script``, and the scripted service."""
    model, service = scripted_model(template, script)
    task = Task(
        workflow=workflow_cls,
        repeat_times=repeat,
        format_args=FormatConfig(prompt_key=prompt_key or "prompt"),
        rollout_args=GenerationConfig(temperature=1.0),
        workflow_args=args,
        is_eval=is_eval,
        raw_task=row,
        task_id="t/0",
    )
    workflow = task.to_workflow(model)
    workflow.set_repeat_times(repeat, 7)
    exps = workflow.run()
    for exp in exps:
        exp.check(workflow_cls.__name__, evaluation=is_eval)
    return exps, service


def trained(exp) -> int:
    """Loss tokens of a sample."""
    return int(exp.action_mask.sum())


def prompt_of(template: ChatTemplate, service, call: int) -> str:
    return template.tokenizer.decode(service.calls[call][0])


# ----------------------------------------------------------------------------- names


def test_registered_under_trinitys_name_and_the_r3l_forks_lowercase_one():
    for cls, name in (
        (RaftBaselineCountdownWorkflow, "RAFT_baseline_countdown_workflow"),
        (RaftBaselineDapoWorkflow, "RAFT_baseline_dapo_workflow"),
        (RaftBaselineSciWorldWorkflow, "RAFT_baseline_scienceworld_workflow"),
        (RaftBaselineAlfworldWorkflow, "RAFT_baseline_alfworld_workflow"),
    ):
        assert workflow_class(name) is cls and workflow_class(name.lower()) is cls
    with pytest.raises(WorkflowError, match="Did you mean 'RAFT_baseline_dapo_workflow'"):
        workflow_class("RAFT_baseline_dapo_workflw")


# ----------------------------------------------------------------------------- countdown


def test_countdown_right_first_answer_is_trained_with_reward_one(template):
    [exp], service = run(RaftBaselineCountdownWorkflow, template, COUNTDOWN_ROW, [RIGHT_EQ])
    assert exp.reward == 1.0 and exp.eid.run == 7
    assert exp.metrics == {"success": 1.0, "reward": 1.0, "attempts": 1.0}
    assert trained(exp) > 0
    first = prompt_of(template, service, 0)
    assert "[44, 19, 35]" in first and "equals 98" in first and "<answer> </answer>" in first
    assert service.calls[0][1]["max_tokens"] == 4096  # Trinity's per-reply limit


def test_countdown_wrong_then_right_gets_feedback_and_the_earlier_attempt(template):
    [exp], service = run(
        RaftBaselineCountdownWorkflow, template, COUNTDOWN_ROW, [WRONG_EQ, RIGHT_EQ]
    )
    assert exp.reward == 1.0 and exp.metrics["attempts"] == 2 and trained(exp) > 0
    second = prompt_of(template, service, 1)
    feedback = (
        "Feedback: 44 + 19 - 35 is not a solution: use each of [44, 19, 35] once and make 98."
    )
    assert feedback in second
    assert "Attempt 1: 44 + 19 - 35 -> 44 + 19 - 35 is not a solution" in second
    assert "This is attempt 2." in second
    assert 0 < trained(exp) < len(exp.action_mask)  # the turns between the replies: masked


def test_countdown_all_wrong_keeps_the_sample_with_no_loss_token(template):
    exps, service = run(
        RaftBaselineCountdownWorkflow, template, COUNTDOWN_ROW, [WRONG_EQ] * 6, repeat=2
    )
    assert [e.eid.run for e in exps] == [7, 8] and len(service.calls) == 6
    for exp in exps:
        assert exp.reward == 0.0 and exp.metrics == {"success": 0.0, "reward": 0.0, "attempts": 3.0}
        assert len(exp.tokens) > exp.prompt_length and trained(exp) == 0
    # no feedback after the last attempt: the third prompt is the last user turn
    assert "This is attempt 3." in prompt_of(template, service, 2)


def test_countdown_eval_is_one_sample_even_when_wrong_and_keeps_its_mask(template):
    [exp], service = run(
        RaftBaselineCountdownWorkflow,
        template,
        COUNTDOWN_ROW,
        [WRONG_EQ] * 3,
        repeat=4,
        is_eval=True,
    )
    assert exp.reward == 0.0 and exp.metrics["success"] == 0.0 and trained(exp) > 0
    assert len(service.calls) == 3


def test_countdown_bad_format_is_an_attempt_with_format_feedback(template):
    [exp], service = run(
        RaftBaselineCountdownWorkflow,
        template,
        COUNTDOWN_ROW,
        ["<answer>44 + 19 + 35</answer>", RIGHT_EQ],  # no <think>
    )
    assert exp.reward == 1.0 and exp.metrics["attempts"] == 2
    second = prompt_of(template, service, 1)
    assert f"Feedback: {FORMAT_FEEDBACK}" in second and "Attempt 1: (no equation)" in second


def test_countdown_max_attempts_is_a_workflow_arg(template):
    [exp], service = run(
        RaftBaselineCountdownWorkflow, template, COUNTDOWN_ROW, [WRONG_EQ], max_attempts=1
    )
    assert exp.metrics["attempts"] == 1 and trained(exp) == 0 and len(service.calls) == 1
    with pytest.raises(WorkflowError, match="max_attempts must be a whole number"):
        RaftBaselineCountdownWorkflow.check_workflow_args({"max_attempts": 0})


def test_countdown_context_full_ends_the_run_and_a_first_prompt_too_long_fails(template):
    model, service = scripted_model(template, [WRONG_EQ])
    first = template.encode(
        template.render([{"role": "user", "content": puzzle_prompt([44, 19, 35], 98, [])}])
    )
    service.max_model_len = len(first) + 40  # room for the first reply, not the second prompt
    task = Task(workflow=RaftBaselineCountdownWorkflow, raw_task=COUNTDOWN_ROW)
    [exp] = task.to_workflow(model).run()
    assert exp.reward == 0.0 and exp.metrics["attempts"] == 1 and trained(exp) == 0
    model, service = scripted_model(template, [])
    service.max_model_len = 10
    with pytest.raises(WorkflowError, match="first prompt leaves no room"):
        task.to_workflow(model).run()


@pytest.mark.parametrize(
    "row", [{"nums": [1, 2]}, {"nums": "12", "target": 3}, {"nums": [1.5, 2], "target": 3}]
)
def test_countdown_bad_row_names_the_fields(template, row):
    with pytest.raises(WorkflowError, match="needs 'nums'"):
        run(RaftBaselineCountdownWorkflow, template, row, [])


def test_countdown_check_is_rewards_rule():
    assert is_solution("(44 + 19) + 35", [44, 19, 35], 98)
    assert not is_solution("44 + 19 + 35 + 1", [44, 19, 35], 98)  # an extra number
    assert not is_solution("44 + 54", [44, 19, 35], 98)  # numbers not the task's
    assert not is_solution("import os", [44, 19, 35], 98)


# ----------------------------------------------------------------------------- DAPO math


def test_dapo_right_first_answer_from_dapo_math_rows(template):
    [exp], service = run(RaftBaselineDapoWorkflow, template, DAPO_ROW, [RIGHT_42])
    assert exp.reward == 1.0 and exp.metrics == {"success": 1.0, "reward": 1.0, "attempts": 1.0}
    assert trained(exp) > 0
    first = prompt_of(template, service, 0)
    assert SYSTEM_PROMPT.splitlines()[0] in first and "What is 6 times 7?" in first


def test_dapo_wrong_then_right_gets_feedback(template):
    row = {"question": "What is 6 times 7?", "answer": "42"}  # AIME-style rows
    [exp], service = run(RaftBaselineDapoWorkflow, template, row, [WRONG_41, RIGHT_42])
    assert exp.reward == 1.0 and exp.metrics["attempts"] == 2 and trained(exp) > 0
    second = prompt_of(template, service, 1)
    assert "Feedback: 41 is not the right answer.\n\nTry again." in second
    assert second.count("What is 6 times 7?") == 1  # the problem is stated once


def test_dapo_all_wrong_keeps_the_sample_with_no_loss_token(template):
    row = {"prompt": "What is 6 times 7?", "answer": "42"}  # plain prompt/answer rows
    [exp], service = run(RaftBaselineDapoWorkflow, template, row, [WRONG_41] * 3)
    assert exp.reward == 0.0 and exp.metrics["success"] == 0.0 and exp.metrics["attempts"] == 3
    assert trained(exp) == 0 and len(service.calls) == 3


def test_dapo_eval_is_one_sample(template):
    [exp], service = run(
        RaftBaselineDapoWorkflow, template, DAPO_ROW, [WRONG_41, RIGHT_42], repeat=3, is_eval=True
    )
    assert exp.reward == 1.0 and len(service.calls) == 2


def test_dapo_bad_format_then_an_answer_line(template):
    [exp], service = run(
        RaftBaselineDapoWorkflow,
        template,
        DAPO_ROW,
        ["42", "<think>six sevens</think>\nAnswer: 42\n"],  # no tags; then Answer: stands in
    )
    assert exp.reward == 1.0 and exp.metrics["attempts"] == 2
    assert "Feedback: The reply needs a <think>" in prompt_of(template, service, 1)


def test_dapo_answer_is_the_tag_else_the_first_answer_line():
    assert answer_of("<think>x</think><ANSWER> 3 </ANSWER> Answer: 4") == ("x", "3")
    assert answer_of("<think>x</think> answer: 5\nAnswer: 6") == ("x", "5")
    assert answer_of("Answer: 5") == (None, "5")


@pytest.mark.parametrize(
    "row",
    [
        {"prompt": [{"role": "user", "content": "2+2?"}]},  # no reward_model
        {"prompt": [], "reward_model": {"ground_truth": "4"}},
        {"question": "2+2?", "answer": ""},
        {"text": "2+2?"},
    ],
)
def test_dapo_bad_row_names_the_shapes(template, row):
    with pytest.raises(WorkflowError, match="has no problem and answer"):
        run(RaftBaselineDapoWorkflow, template, row, [])


# ----------------------------------------------------------------------------- ScienceWorld


def act(action: str) -> str:
    return f"<think>next</think> <action>{action}</action>"


SCIWORLD_ROW = {"task_desc": '{"task_name": "boil", "var_num": 0}'}


def sciworld_run(monkeypatch, template, env, script, **kwargs):
    opened = []
    monkeypatch.setattr(sciworld, "open_env", lambda task: opened.append(task) or env)
    monkeypatch.setattr(sciworld, "close_env", lambda e: e.close())
    kwargs.setdefault("prompt_key", "task_desc")
    exps, service = run(
        RaftBaselineSciWorldWorkflow, template, kwargs.pop("row", SCIWORLD_ROW), script, **kwargs
    )
    return exps, service, opened


def test_sciworld_solved_run_is_trained_with_reward_one(monkeypatch, template):
    env = ScriptedEnv([25, 75], done_at=2)
    [exp], service, opened = sciworld_run(
        monkeypatch, template, env, [act("look around"), act("focus on water")]
    )
    assert opened == [sciworld.SciWorldTask("boil", 0)] and env.closed
    assert env.actions == ["look around", "focus on water"]
    assert exp.reward == 1.0 and exp.metrics == {"success": 1.0, "reward": 1.0, "steps": 2.0}
    assert trained(exp) > 0 and service.calls[0][1]["max_tokens"] == 16384
    first = prompt_of(template, service, 0)
    assert "You are an agent, your job is to do some scientific experiment" in first
    assert (
        "Observation: \nTask Description: Your task is to boil water.\nYou are in the hallway."
        in first
    )
    assert "<action> </action>" in first
    assert "Observation: \nmoved 1" in prompt_of(template, service, 1)


def test_sciworld_partial_score_is_the_reward_but_no_loss_token(monkeypatch, template):
    env = ScriptedEnv([20, 10, -50])
    exps, service, opened = sciworld_run(
        monkeypatch,
        template,
        env,
        [act("a"), act("b"), act("c"), act("d"), act("e"), act("f")],
        repeat=2,
        max_env_steps=3,
    )
    assert len(opened) == 1 and env.closed  # one simulator for both runs
    assert [e.eid.run for e in exps] == [7, 8]
    for exp in exps:
        assert exp.reward == pytest.approx(0.3) and exp.metrics["steps"] == 3
        assert exp.metrics["success"] == 0.0 and trained(exp) == 0


def test_sciworld_bad_format_ends_the_run_with_reward_zero(monkeypatch, template):
    env = ScriptedEnv([50, 50])
    [exp], service, _ = sciworld_run(
        monkeypatch, template, env, [act("look around"), "<action>open door</action>"]
    )  # the second reply has no <think>
    assert exp.reward == 0.0 and exp.metrics["steps"] == 2 and trained(exp) == 0
    assert env.actions == ["look around"] and len(service.calls) == 2


def test_sciworld_same_action_three_times_ends_the_run(monkeypatch, template):
    env = ScriptedEnv([10, 0, 0, 0])
    [exp], service, _ = sciworld_run(monkeypatch, template, env, [act("wait")] * 4)
    assert exp.reward == 0.0 and exp.metrics["steps"] == 3 and env.actions == ["wait", "wait"]


def test_sciworld_empty_action_is_answered_without_a_move(monkeypatch, template):
    env = ScriptedEnv([100], done_at=1)
    [exp], service, _ = sciworld_run(monkeypatch, template, env, [act(""), act("boil water")])
    assert env.actions == ["boil water"] and exp.reward == 1.0
    assert f"Observation: \n{EMPTY_ACTION}" in prompt_of(template, service, 1)


def test_sciworld_eval_is_one_sample(monkeypatch, template):
    env = ScriptedEnv([30, 0], done_at=2)
    [exp], service, _ = sciworld_run(
        monkeypatch, template, env, [act("a"), act("b")], repeat=3, is_eval=True
    )
    assert exp.reward == pytest.approx(0.3) and trained(exp) > 0 and len(service.calls) == 2


def test_sciworld_task_names_json_or_trinitys_name_dash_variation():
    assert scienceworld_task('{"task_name": "melt", "var_num": 2}', "x") == (
        sciworld.SciWorldTask("melt", 2)
    )
    assert scienceworld_task("find-living-thing-3", "x") == (
        sciworld.SciWorldTask("find-living-thing", 3)
    )
    assert scienceworld_task("boil", "x") == sciworld.SciWorldTask("boil", 0)
    with pytest.raises(WorkflowError, match="no 'task_id' column.*prompt_key: task_desc"):
        scienceworld_task(None, "task_id")
    assert action_of("<think>a</think>\n<action> open door </action>") == "open door"
    assert action_of("<action>open door</action>") is None


def test_sciworld_checks_max_env_steps_and_requires_the_simulator():
    with pytest.raises(WorkflowError, match="max_env_steps"):
        RaftBaselineSciWorldWorkflow.check_workflow_args({"max_env_steps": 0})
    assert RaftBaselineSciWorldWorkflow.requires == sciworld.SciWorldWorkflow.requires


@needs_jvm
def test_sciworld_an_episode_on_the_real_simulator(template):
    """Two turns of find-living-thing on the real JVM, every reply ``look around``."""
    [exp], service = run(
        RaftBaselineSciWorldWorkflow,
        template,
        {"task_id": "find-living-thing-0"},
        [act("look around"), act("teleport to kitchen")],
        prompt_key="task_id",
        max_env_steps=2,
    )
    assert exp.metrics["steps"] == 2 and exp.reward < 1.0 and trained(exp) == 0
    assert "Your task is to find" in prompt_of(template, service, 0)


# ----------------------------------------------------------------------------- ALFWorld


@pytest.fixture
def game(tmp_path) -> Path:
    return write_game(tmp_path / "game")


def alfworld_row(game: Path) -> dict:
    """A row as R3L's get_alfworld_data.py writes it (its configs' prompt_key, task_id, absent)."""
    return {"game_file": str(game), "target": ""}


def alfworld_run(template, game, script, **kwargs):
    kwargs.setdefault("prompt_key", "task_id")
    row = kwargs.pop("row", None) or alfworld_row(game)
    return run(RaftBaselineAlfworldWorkflow, template, row, script, **kwargs)


ADMISSIBLE_AT_START = "['go to countertop 1', 'go to fridge 1', 'help', 'inventory', 'look']"
# an unsolved walk of six admissible actions: the apple taken, never put in the fridge
WANDER = [
    "look",
    "go to fridge 1",
    "open fridge 1",
    "close fridge 1",
    "go to countertop 1",
    "take apple 1 from countertop 1",
]


@needs_alfworld
def test_alfworld_solved_game_is_trained_with_reward_one(template, game):
    [exp], service = alfworld_run(template, game, [act(a) for a in SOLUTION])
    assert exp.reward == 1.0 and exp.eid.run == 7
    assert exp.metrics == {"success": 1.0, "reward": 1.0, "steps": 5.0}
    assert trained(exp) > 0 and len(service.calls) == 5
    assert service.calls[0][1]["max_tokens"] == 512  # the fork's per-reply limit
    first = prompt_of(template, service, 0)
    assert "You are an agent interacting with a virtual text-based environment." in first
    assert "- Step Limit: You must complete the task within 25 steps." in first
    assert (
        "You are an expert agent operating in the ALFRED Embodied Environment.\n"
        "Your current observation is: -= Welcome to TextWorld, ALFRED! =-\n\n"
        "You are in the middle of a room. Looking quickly around you, you see a countertop 1, "
        f"and a fridge 1.\n\nYour task is to: {TASK}.\n"
        f"Your admissible actions of the current situation are: {ADMISSIBLE_AT_START}.\n\n"
        "Now it's your turn to take an action." in first
    )
    assert "Format: <think>your reasoning process</think> <action>your chosen action</action>" in (
        first
    )
    second = prompt_of(template, service, 1)
    assert (
        "You are an expert agent operating in the ALFRED Embodied Environment. Your task is to: "
        f"{TASK}.\nPrior to this step, you have already taken 1 step(s). Below are the most "
        "recent 1 actions you took:\n  Step 0: go to countertop 1\nYou are now at step 1 and "
        "your current observation is: You arrive at countertop 1. On the countertop 1, you see "
        "a apple 1.\n" in second
    )
    assert "'take apple 1 from countertop 1']." in second  # the admissible actions now
    assert "<action>open fridge 1</action>" in prompt_of(template, service, 4)


@needs_alfworld
def test_alfworld_unsolved_runs_score_zero_with_no_loss_token_on_one_game(template, game):
    exps, service = alfworld_run(
        template, game, [act(a) for a in WANDER] * 2, repeat=2, max_env_steps=6
    )
    assert [e.eid.run for e in exps] == [7, 8] and len(service.calls) == 12
    for exp in exps:
        assert exp.reward == 0.0 and exp.metrics == {"success": 0.0, "reward": 0.0, "steps": 6.0}
        assert len(exp.tokens) > exp.prompt_length and trained(exp) == 0
    # the last turn lists the last four of five actions; the second run starts afresh (reset)
    assert (
        "Prior to this step, you have already taken 5 step(s). Below are the most recent 4 "
        "actions you took:\n  Step 1: go to fridge 1\n  Step 2: open fridge 1\n"
        "  Step 3: close fridge 1\n  Step 4: go to countertop 1\nYou are now at step 5 and "
        "your current observation is: You arrive at countertop 1."
        in prompt_of(template, service, 5)
    )
    assert "Your current observation is: -= Welcome to TextWorld" in prompt_of(template, service, 6)


@needs_alfworld
def test_alfworld_a_solved_run_and_a_failed_one_in_one_episode(template, game):
    script = [act(a) for a in SOLUTION] + [act("look")] * 3
    exps, service = alfworld_run(template, game, script, repeat=2)
    assert [e.reward for e in exps] == [1.0, 0.0]
    assert trained(exps[0]) > 0 and trained(exps[1]) == 0
    assert exps[1].metrics == {"success": 0.0, "reward": 0.0, "steps": 3.0}  # look, thrice


@needs_alfworld
@pytest.mark.parametrize(
    "reply",
    [
        "<action>go to fridge 1</action>",  # no <think>
        "<think>go</think> go to fridge 1",  # no <action>
        "<think>a</think><think>b</think><action>go to fridge 1</action>",
        "<think>a</think><action>go to fridge 1</action><action>look</action>",
        act("examine apple 1"),  # not admissible where the agent stands
        act("Go to fridge 1"),  # admissible only as the game spells it
    ],
)
def test_alfworld_bad_format_or_an_inadmissible_action_ends_the_run(template, game, reply):
    [exp], service = alfworld_run(template, game, [act("go to countertop 1"), reply, act("look")])
    assert exp.reward == 0.0 and exp.metrics["steps"] == 2 and trained(exp) == 0
    assert len(service.calls) == 2


@needs_alfworld
def test_alfworld_eval_is_one_sample_with_its_mask(template, game):
    [exp], service = alfworld_run(
        template, game, [act("look"), act("inventory")], repeat=3, is_eval=True, max_env_steps=2
    )
    assert exp.reward == 0.0 and exp.metrics["success"] == 0.0 and exp.metrics["steps"] == 2
    assert trained(exp) > 0 and len(service.calls) == 2


@needs_alfworld
def test_alfworld_the_prompt_column_names_the_game_else_game_file(template, game, tmp_path):
    [exp], _ = alfworld_run(
        template,
        game,
        [act(a) for a in SOLUTION],
        row={"task_desc": str(game), "game_file": str(tmp_path / "elsewhere")},
        prompt_key="task_desc",
    )
    assert exp.reward == 1.0
    with pytest.raises(WorkflowError, match="neither a 'task_id' column.*nor a 'game_file'"):
        alfworld_run(template, game, [], row={"target": ""})
    with pytest.raises(WorkflowError, match="is not a game file"):
        alfworld_run(template, game, [], row={"game_file": str(tmp_path / "missing.tw-pddl")})


def test_alfworld_reply_and_task_parsing_are_the_forks():
    reply = "<think>a</think>\n<action> go to fridge 1 </action>"
    assert alfworld_action_of(reply) == "go to fridge 1"
    assert alfworld_action_of("<action>look</action> <think>after</think>") == "look"  # any order
    assert alfworld_action_of("<think>a</think><action>look") is None  # unclosed
    assert task_of(f"-= Welcome =-\n\nYour task is to: {TASK}.") == f"{TASK}."
    assert task_of("no task here\nlast line") == "last line"


def test_alfworld_checks_max_env_steps_and_requires_alfworld():
    RaftBaselineAlfworldWorkflow.check_workflow_args({})
    with pytest.raises(WorkflowError, match="max_env_steps"):
        RaftBaselineAlfworldWorkflow.check_workflow_args({"max_env_steps": 0})
    assert RaftBaselineAlfworldWorkflow.requires == alfworld.AlfworldWorkflow.requires


# ----------------------------------------------------------------------------- R3L configs

R3L = {
    "countdown": "RAFT_baseline_countdown_workflow",
    "dapo": "RAFT_baseline_dapo_workflow",
    "scienceworld": "RAFT_baseline_scienceworld_workflow",
    "alfworld": "RAFT_baseline_alfworld_workflow",
}
NEEDS = {"scienceworld": [needs_jvm], "alfworld": [needs_alfworld]}
CONFIGS = [
    pytest.param(env, size, marks=NEEDS.get(env, [])) for env in R3L for size in ("1.5B", "7B")
]


@pytest.mark.parametrize("env,size", CONFIGS)
def test_r3l_configs_load_as_written(env, size, tmp_path, monkeypatch):
    """They name the workflow in lowercase (the R3L fork's name), and with Trinity's name."""
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path))
    path = EXAMPLES / f"R3L_{env}_RAFT_{size}.yaml"
    cfg = dry_run(path, tmp_path)
    assert cfg.algorithm.algorithm_type == "raft"
    cfg = dry_run(path, tmp_path, (f"buffer.explorer_input.default_workflow_type={R3L[env]}",))
    assert cfg.algorithm.algorithm_type == "raft"
