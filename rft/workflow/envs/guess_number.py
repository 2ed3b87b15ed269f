"""``guess_number_workflow``: find a hidden whole number with "higher"/"lower" feedback.

A task row holds ``target``, ``low`` and ``high``. Each model turn is a guess; the environment
answers "Higher.", "Lower." or, for a reply with no number in range, asks again. Reward 1 when
the target is named within ``workflow_args.max_env_steps`` turns (default 4), else 0.
"""

from __future__ import annotations

import re

from rft.workflow.base import MultiTurnWorkflow
from rft.workflow.experience import Experience
from rft.workflow.registry import register_workflow

_NUMBER = re.compile(r"-?\d+")


@register_workflow("guess_number_workflow")
class GuessNumberWorkflow(MultiTurnWorkflow):
    can_repeat = False

    def run(self) -> list[Experience]:
        row = self.task.raw_task or {}
        target, low, high = int(row["target"]), int(row["low"]), int(row["high"])
        prompt = (
            f"I picked a whole number from {low} to {high}. Guess it. Reply with one "
            "number only; I will say whether the number is higher or lower."
        )
        messages = [{"role": "user", "content": prompt}]
        found, turns = False, 0
        for _ in range(int(self.task.workflow_args.get("max_env_steps", 4))):
            reply = self.model.chat(messages)[0]
            if reply.truncate_status == "prompt_truncated":
                break
            turns += 1
            messages.append({"role": "assistant", "content": reply.response_text})
            numbers = [int(n) for n in _NUMBER.findall(reply.response_text or "")]
            guess = next((n for n in numbers if low <= n <= high), None)
            if guess == target:
                found = True
                break
            if guess is None:
                feedback = f"Reply with one whole number from {low} to {high}."
            else:
                feedback = "Higher." if target > guess else "Lower."
            messages.append({"role": "user", "content": feedback})
        return [
            self.process_messages_to_experience(
                messages, float(found), info={"accuracy": float(found), "guesses": turns}
            )
        ]
