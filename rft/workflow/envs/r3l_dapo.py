"""``RAFT_baseline_dapo_workflow``: Trinity-RFT's R3L RAFT baseline on math problems
(``trinity/common/workflows/envs/R3L/dapo/raft_workflow.py``; shared part: :mod:`.r3l`).

A task row is DAPO-Math's (``prompt``: chat messages, the first one's content the problem;
``reward_model.ground_truth``), or ``question``/``answer`` (AIME-style), or ``prompt``/``answer``
strings. The model answers ``<think>...</think><answer>...</answer>`` (an ``Answer: ...`` line
stands in for a missing ``<answer>``); the answer is checked against the ground truth by
:func:`rft.workflow.rewards.answers_match`. A wrong or malformed answer gets a feedback turn and
another attempt, up to ``workflow_args.max_attempts`` (3); reward 1.0 once one is right, else 0.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from rft.errors import WorkflowError
from rft.workflow.envs.r3l import RaftBaselineWorkflow, Rollout, max_attempts, think_and_answer
from rft.workflow.registry import register_workflow
from rft.workflow.rewards import answers_match, extract_ground_truth

NAME = "RAFT_baseline_dapo_workflow"  # Trinity's registered name, its case included
# The R3L authors' fork (shiweijiezero/Trinity-RFT) registers it in lower case, the name the
# R3L example configs use (modelscope's examples/R3L at f9ab6de, whose package has NAME): both.
FORK_NAME = NAME.lower()
SYSTEM_PROMPT = """You solve math problems. Write every reply in two parts, in this order:
<think>your reasoning, step by step</think>
<answer>the final answer alone</answer>
Give exact values. If the problem asks for the answer in a particular form (for example \
\\boxed{}), write it in that form inside <answer>."""
FORMAT_REQUEST = (
    "Reason step by step inside <think> </think>, then give the final answer inside "
    "<answer> </answer>."
)
FORMAT_FEEDBACK = "The reply needs a <think>...</think> part and an <answer>...</answer> part."
_ANSWER_LINE = re.compile(r"Answer:\s*(.+?)(?:\n|$)", re.IGNORECASE)  # the first one


def problem_and_truth(row: Any) -> tuple[str, str]:
    """The row's problem text and ground truth (Trinity's three row shapes, in its order)."""
    row = row or {}
    prompt = row.get("prompt")
    if isinstance(prompt, (list, tuple)):  # math_dapo: chat messages and a reward_model dict
        first = prompt[0] if prompt else None
        problem = first.get("content") if isinstance(first, dict) else None
        reward_model = row.get("reward_model")
        truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
    elif "question" in row and "answer" in row:
        problem, truth = row["question"], row["answer"]
    else:
        problem, truth = prompt, row.get("answer")
    if not problem or truth is None or not str(truth).strip():
        raise WorkflowError(
            f"{NAME}: task row {str(row)[:200]} has no problem and answer: give 'prompt' "
            "(chat messages) with 'reward_model': {'ground_truth': ...} as in DAPO-Math-17k, "
            "or 'question' and 'answer', or 'prompt' and 'answer'"
        )
    return str(problem), str(truth)


def answer_of(reply: str) -> tuple[Optional[str], Optional[str]]:
    """The reply's reasoning and answer: the ``<answer>`` block, else the first ``Answer:`` line."""
    think, answer = think_and_answer(reply)
    if answer is None:
        line = _ANSWER_LINE.search(reply)
        answer = line.group(1).strip() if line else None
    return think, answer


@register_workflow(NAME)
@register_workflow(FORK_NAME)
class RaftBaselineDapoWorkflow(RaftBaselineWorkflow):
    name = NAME

    def rollout(self) -> Rollout:
        problem, truth = problem_and_truth(self.task.raw_task)
        truth = extract_ground_truth(truth)
        limit = max_attempts(self.task.workflow_args)
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"{problem}\n\n{FORMAT_REQUEST}"},
        ]
        reward, attempts = 0.0, 0
        for attempt in range(limit):
            reply = self.ask(messages)
            if reply is None:
                break
            attempts += 1
            think, answer = answer_of(reply)
            if think is None or answer is None:
                feedback = FORMAT_FEEDBACK
            elif answers_match(answer, truth):
                reward = 1.0
                break
            else:
                feedback = f"{answer} is not the right answer."
            if attempt + 1 < limit:  # feedback only where another attempt follows
                content = f"Feedback: {feedback}\n\nTry again. {FORMAT_REQUEST}"
                messages.append({"role": "user", "content": content})
        return Rollout(messages, reward, {"attempts": attempts})
