"""``rubric_judge_workflow`` (Trinity-RFT's RubricJudgeWorkflow,
trinity/common/workflows/rubric_judge_workflow.py; "rubrics as rewards", arXiv 2507.17746): the
policy answers the task's question ``n`` times in one call, and an LLM judge rates each answer
against the row's rubrics from 1 to 10; the reward is the rating / 10.

Data in: a task whose row holds ``rubric``, a list of ``{"description", "weight"}`` (Trinity's
``rar_medicine`` rows), and the judge, ``explorer.auxiliary_models[0]`` (in each explorer task, or
shared by them: :mod:`rft.explorer.auxiliary_server`). Data out: the replies, each with its
reward and the step's ``judge_success`` share (judge answers that held a valid rating) in its
metrics. A judge answer without a JSON block holding an integer ``rating`` in 1..10 gives reward
0, as in Trinity; a judge call that fails fails the episode.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from rft.errors import WorkflowError
from rft.workflow.experience import Experience
from rft.workflow.registry import register_workflow
from rft.workflow.simple import SimpleWorkflow
from rft.workflow.task import Task

NAME = "rubric_judge_workflow"
RATINGS = (1, 10)  # the judge's scale; the reward is rating / 10
# The policy's system prompt when the taskset's format sets none (Trinity's default says the
# same: a user asks, the assistant reasons, then answers).
DEFAULT_SYSTEM_PROMPT = (
    "The user asks a question and the assistant answers it, reasoning it through first and "
    "then giving the answer."
)
JUDGE_SYSTEM_PROMPT = (
    "You grade answers. You get a prompt, an answer to it and a list of weighted rubrics. Judge "
    "how well the answer meets the rubrics as a whole, weighing each by its weight: an answer "
    "that breaks several rubrics rates low, one that meets all of them rates high. Reply with a "
    'JSON block first, ```json\n{"rating": N}\n``` with N an integer from 1 (worst) to 10 (best).'
)
NO_RUBRICS = "No rubrics were given."


def rubric_lines(rubric: Any, task_id: str) -> str:
    """The rubrics as numbered lines with their weights (WorkflowError for a malformed list)."""
    if not rubric:
        return NO_RUBRICS
    try:
        return "\n".join(
            f"Rubric {i} (weight {item['weight']}): {item['description']}"
            for i, item in enumerate(rubric)
        )
    except (KeyError, TypeError) as e:
        raise WorkflowError(
            f"{NAME}: task {task_id}: 'rubric' must be a list of {{'description', 'weight'}} "
            f"items, got {str(rubric)[:200]}"
        ) from e


def judge_messages(question: str, answer: str, rubrics: str) -> list[dict]:
    """The judge's conversation for one answer."""
    user = (
        f"Rate the answer to this prompt by the rubrics.\n<prompt>\n{question}\n</prompt>\n"
        f"<response>\n{answer}\n</response>\n<rubrics>\n{rubrics}\n</rubrics>\n"
        "Your JSON rating:"
    )
    return [
        {"role": "system", "content": JUDGE_SYSTEM_PROMPT},
        {"role": "user", "content": user},
    ]


def parse_rating(text: Optional[str]) -> Optional[int | float]:
    """The ``rating`` of the first fenced block (```json, else ```) of a judge answer, when it is
    a number in :data:`RATINGS`; None otherwise."""
    text = text or ""
    tag = "```json" if "```json" in text else "```"
    start = text.find(tag)
    end = text.find("```", start + len(tag)) if start != -1 else -1
    if end == -1:
        return None
    try:
        rating = json.loads(text[start + len(tag) : end].strip()).get("rating")
    except (json.JSONDecodeError, AttributeError):
        return None
    if isinstance(rating, bool) or not isinstance(rating, (int, float)):
        return None
    return rating if RATINGS[0] <= rating <= RATINGS[1] else None


@register_workflow(NAME)
class RubricJudgeWorkflow(SimpleWorkflow):
    """Trinity's RubricJudgeWorkflow: :class:`~rft.workflow.simple.SimpleWorkflow`'s prompt and
    call, each reply rated by the judge (``self.auxiliary_models[0]``, its OpenAI client)."""

    def reset(self, task: Task) -> None:
        self._read_task(task)  # no reward class: the judge rates
        if self.system_prompt is None:
            self.system_prompt = DEFAULT_SYSTEM_PROMPT
        self.rubric = (self.raw_task or {}).get("rubric", [])

    def judge(self) -> Any:
        """The judge's OpenAI client (Trinity's ``_build_judge``: override for another)."""
        if not self.auxiliary_models:
            raise WorkflowError(
                f"{NAME} rates answers with an LLM judge: set explorer.auxiliary_models[0] to "
                "a causal LM folder (the judge)"
            )
        return self.auxiliary_models[0]

    def rating(self, answer: str, judge: Any) -> Optional[int | float]:
        """The judge's rating of one answer (None: its answer held no valid rating)."""
        rubrics = rubric_lines(self.rubric, self.task.task_id)
        completion = judge.chat.completions.create(
            model=judge.model_path,
            messages=judge_messages(self.task_desc, answer, rubrics),
            stream=False,
            temperature=0.0,
        )
        text = completion.choices[0].message.content
        rating = parse_rating(text)
        if rating is None:
            self.logger.warning("task %s: no valid rating in the judge's answer %r", self.task.task_id, (text or "")[:200])  # fmt: skip
        return rating

    def run(self) -> list[Experience]:
        judge = self.judge()
        replies = self.model.chat(self.format_messages(), **self.rollout_args)
        ratings = [self.rating(reply.response_text, judge) for reply in replies]
        success = sum(r is not None for r in ratings) / max(len(ratings), 1)
        for i, (reply, rating) in enumerate(zip(replies, ratings)):
            reply.reward = 0.0 if rating is None else rating / RATINGS[1]
            reply.eid.run = i + self.run_id_base
            reply.metrics = {**(reply.metrics or {}), "judge_success": float(success)}
        return replies
