"""``RAFT_baseline_countdown_workflow``: Trinity-RFT's R3L RAFT baseline on Countdown puzzles
(``trinity/common/workflows/envs/R3L/countdown/raft_workflow.py``; shared part: :mod:`.r3l`).

A task row holds ``nums`` (the numbers) and ``target``. Each attempt is a user turn stating the
puzzle (from the second attempt on, with the earlier equations and their feedback) and a reply
``<think>...</think><answer>equation</answer>``; the equation must use each number once with
+ - * / and parentheses and equal the target (:func:`rft.workflow.rewards.countdown_reward`'s
rule). A wrong or malformed answer gets a feedback turn and another attempt, up to
``workflow_args.max_attempts`` (3); reward 1.0 once an answer is right, else 0.
"""

from __future__ import annotations

import json
from typing import Any

from rft.errors import WorkflowError
from rft.workflow.envs.r3l import RaftBaselineWorkflow, Rollout, max_attempts, think_and_answer
from rft.workflow.registry import register_workflow
from rft.workflow.rewards import countdown_reward

NAME = "RAFT_baseline_countdown_workflow"  # Trinity's registered name, its case included
# The R3L authors' fork (shiweijiezero/Trinity-RFT) registers it in lower case, the name the
# R3L example configs use (modelscope's examples/R3L at f9ab6de, whose package has NAME): both.
FORK_NAME = NAME.lower()
HISTORY_LENGTH = 4  # earlier attempts a prompt lists (Trinity's)
FORMAT_REQUEST = (
    "Reason it out step by step inside <think> </think>. Then write the equation alone inside "
    "<answer> </answer>, like <answer>(7 - 3) * 2</answer>."
)
FORMAT_FEEDBACK = "The reply needs a <think>...</think> part and an <answer>...</answer> part."
NO_EQUATION = "(no equation)"  # how a malformed attempt is listed in later prompts


def _whole(value: Any) -> int:
    number = float(value)
    if not number.is_integer():
        raise ValueError(f"{value!r} is not a whole number")
    return int(number)


def puzzle(row: Any) -> tuple[list[int], int]:
    """The row's numbers and target."""
    try:
        if isinstance(row["nums"], (str, bytes)):
            raise TypeError("nums is text, not a list")
        return [_whole(n) for n in row["nums"]], _whole(row["target"])
    except (KeyError, TypeError, ValueError) as e:
        raise WorkflowError(
            f"{NAME}: task row {str(row)[:200]} needs 'nums' (a list of whole numbers) and "
            "'target' (a whole number), as in justinphan3110/Countdown-Tasks-3to4"
        ) from e


def is_solution(equation: str, nums: list[int], target: int) -> bool:
    """Whether ``equation`` uses each of ``nums`` once and equals ``target``."""
    truth = json.dumps({"target": target, "numbers": nums})
    return countdown_reward(f"<answer>{equation}</answer>", truth)["score"] == 1.0


def wrong_feedback(equation: str, nums: list[int], target: int) -> str:
    return f"{equation} is not a solution: use each of {nums} once and make {target}. Try again."


def puzzle_prompt(nums: list[int], target: int, history: list[tuple[str, str]]) -> str:
    """An attempt's user turn; ``history``: the earlier attempts, (equation, feedback) each."""
    lines = [
        f"Countdown puzzle: combine the numbers {nums} into an equation that equals {target}, "
        "using + - * / and parentheses and each number exactly once."
    ]
    if history:
        shown = history[-HISTORY_LENGTH:]
        first = len(history) - len(shown) + 1
        lines.append(f"Your last {len(shown)} of {len(history)} attempt(s) and their feedback:")
        lines += [f"  Attempt {first + i}: {eq} -> {fb}" for i, (eq, fb) in enumerate(shown)]
        lines.append(f"This is attempt {len(history) + 1}.")
    lines.append(FORMAT_REQUEST)
    return "\n".join(lines)


@register_workflow(NAME)
@register_workflow(FORK_NAME)
class RaftBaselineCountdownWorkflow(RaftBaselineWorkflow):
    name = NAME

    def rollout(self) -> Rollout:
        nums, target = puzzle(self.task.raw_task)
        limit = max_attempts(self.task.workflow_args)
        messages: list[dict] = []
        history: list[tuple[str, str]] = []
        reward, attempts = 0.0, 0
        for attempt in range(limit):
            messages.append({"role": "user", "content": puzzle_prompt(nums, target, history)})
            reply = self.ask(messages)
            if reply is None:
                break
            attempts += 1
            think, equation = think_and_answer(reply)
            if think is None or equation is None:
                history.append((NO_EQUATION, FORMAT_FEEDBACK))
            elif is_solution(equation, nums, target):
                reward = 1.0
                break
            else:
                history.append((equation, wrong_feedback(equation, nums, target)))
            if attempt + 1 < limit:  # feedback only where another attempt follows
                messages.append({"role": "user", "content": f"Feedback: {history[-1][1]}"})
        return Rollout(messages, reward, {"attempts": attempts})
