"""What Trinity's text-game agents share (ScienceWorld, ALFWorld and their R3L/RAFT variants):
the action a reply names and the turn budget of a run. Pure functions of strings and dicts."""

from __future__ import annotations

from typing import Optional

from rft.errors import WorkflowError

MAX_ENV_STEPS = 30  # turns per run: Trinity's default (workflow_args.max_env_steps)


def parse_action(reply: Optional[str]) -> str:
    """The text between the first ``<action>`` and the next ``</action>`` (or the reply's end),
    stripped, as Trinity's ``split("<action>")[1].split("</action>")[0]``; "" when there is no
    ``<action>`` (an empty action, which the game answers as invalid)."""
    head, tag, rest = (reply or "").partition("<action>")
    return rest.split("</action>", 1)[0].strip() if tag else ""


def max_env_steps(workflow_args: dict, default: int = MAX_ENV_STEPS) -> int:
    """``workflow_args.max_env_steps`` (``default`` when unset), checked: a whole number >= 1."""
    steps = workflow_args.get("max_env_steps", default)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise WorkflowError(f"max_env_steps must be a whole number >= 1, got {steps!r}")
    return steps
