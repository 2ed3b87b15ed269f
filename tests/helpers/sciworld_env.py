"""A scripted ScienceWorld environment for workflow tests: ScienceWorld's reset/step/close
signature without the simulator (the real one runs in the integration tests)."""

from __future__ import annotations

from typing import Optional


class ScriptedEnv:
    """ScienceWorld's reset/step signature: each step's score change comes from ``deltas``;
    ``done_at``: the move that ends the task."""

    def __init__(self, deltas, done_at: Optional[int] = None):
        self.deltas, self.done_at, self.closed, self.actions = list(deltas), done_at, False, []

    def get_gold_action_sequence(self):
        return ["a", "b", "c"]

    def reset(self):
        self.moves = 0
        return "You are in the hallway.", {}

    def get_task_description(self):
        return "Your task is to boil water."

    def step(self, action):
        self.actions.append(action)
        self.moves += 1
        return f"moved {self.moves}", self.deltas[self.moves - 1], self.moves == self.done_at, {}

    def close(self):
        self.closed = True
