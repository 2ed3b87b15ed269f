"""A one-room ALFWorld game written by hand for the tests (ALFWorld's own games come from
alfworld-download, not reachable here): a countertop with an apple on it and a closed fridge;
the task "put some apple in fridge" (ALFWorld's pick_and_place_simple). The PDDL domain and the
text grammar are the installed alfworld package's own (alfworld/data); the problem below uses
the domain's predicates and ALFWorld's mangled object names, which its demangler turns into
"apple 1", "countertop 1", "fridge 1". Solved by: go to countertop 1, take apple 1 from
countertop 1, go to fridge 1, open fridge 1, move apple 1 to fridge 1 (reward 1, done)."""

from __future__ import annotations

import json
from pathlib import Path

SOLUTION = [
    "go to countertop 1",
    "take apple 1 from countertop 1",
    "go to fridge 1",
    "open fridge 1",
    "move apple 1 to fridge 1",
]
TASK = "put some apple in fridge"

_APPLE = "Apple_bar__plus_00_dot_10_bar__plus_00_dot_90_bar__minus_01_dot_00"
_COUNTER = "CounterTop_bar__minus_01_dot_00_bar__plus_00_dot_90_bar__minus_01_dot_00"
_FRIDGE = "Fridge_bar__plus_01_dot_00_bar__plus_00_dot_00_bar__minus_02_dot_00"
_START = "loc_bar__minus_3_bar_0_bar_0_bar_30"
_AT_COUNTER = "loc_bar__minus_4_bar__minus_4_bar_2_bar_60"
_AT_FRIDGE = "loc_bar_4_bar__minus_6_bar_1_bar_60"
_PLACES = (_START, _AT_COUNTER, _AT_FRIDGE)


def _problem() -> str:
    distances = "\n".join(
        f"        (= (distance {a} {b}) 1)" for a in _PLACES for b in _PLACES if a != b
    )
    return f"""
(define (problem plan_rft_tiny)
    (:domain alfred)
    (:objects
        agent1 - agent
        {_APPLE} - object
        AppleType - otype
        {_COUNTER} - receptacle
        {_FRIDGE} - receptacle
        CounterTopType - rtype
        FridgeType - rtype
        {_START} - location
        {_AT_COUNTER} - location
        {_AT_FRIDGE} - location
    )
    (:init
        (= (totalCost) 0)
        (atLocation agent1 {_START})
        (receptacleAtLocation {_COUNTER} {_AT_COUNTER})
        (receptacleAtLocation {_FRIDGE} {_AT_FRIDGE})
        (objectAtLocation {_APPLE} {_AT_COUNTER})
        (inReceptacle {_APPLE} {_COUNTER})
        (openable {_FRIDGE})
        (receptacleType {_COUNTER} CounterTopType)
        (receptacleType {_FRIDGE} FridgeType)
        (objectType {_APPLE} AppleType)
        (canContain CounterTopType AppleType)
        (canContain FridgeType AppleType)
        (pickupable {_APPLE})
        (moveable {_APPLE})
        (coolable {_APPLE})
{distances}
    )
    (:goal
        (exists (?r - receptacle)
            (exists (?o - object)
                (and
                    (inReceptacle ?o ?r)
                    (objectType ?o AppleType)
                    (receptacleType ?r FridgeType)
                )
            )
        )
    )
)
"""


def write_game(folder: Path) -> Path:
    """The game in ``folder`` as alfworld-download lays one out: ``game.tw-pddl`` and its
    ``traj_data.json``; returns the game file's path (a taskset row's task_desc)."""
    import alfworld

    data = Path(alfworld.__file__).parent / "data"
    folder.mkdir(parents=True, exist_ok=True)
    game = {
        "pddl_domain": (data / "alfred.pddl").read_text(),
        "grammar": (data / "alfred.twl2").read_text().replace("UNKNOWN GOAL", TASK),
        "pddl_problem": _problem(),
        "solvable": True,
        "walkthrough": SOLUTION,
    }
    (folder / "game.tw-pddl").write_text(json.dumps(game))
    traj = {
        "task_type": "pick_and_place_simple",
        "pddl_params": {
            "object_target": "Apple",
            "parent_target": "Fridge",
            "mrecep_target": "",
            "toggle_target": "",
            "object_sliced": False,
        },
    }
    (folder / "traj_data.json").write_text(json.dumps(traj))
    return folder / "game.tw-pddl"
