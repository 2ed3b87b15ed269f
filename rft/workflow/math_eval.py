"""``math_eval_workflow`` (Trinity-RFT's, and its ``async_`` twin): Qwen2.5-Math's evaluation
prompt (reason step by step, answer in ``\\boxed{}``) at temperature 0.6, top-p 0.8, scored by
the boxed answer. The question is the row's ``format.prompt_key`` column (Trinity reads a fixed
``question`` column)."""

from __future__ import annotations

from rft.workflow.base import Workflow
from rft.workflow.experience import Experience
from rft.workflow.registry import register_workflow
from rft.workflow.rewards import answers_match, last_boxed

EVAL_SAMPLING = {"temperature": 0.6, "top_p": 0.8}


@register_workflow("math_eval_workflow")
class MathEvalWorkflow(Workflow):
    can_repeat = True

    def messages(self) -> list[dict]:
        question = self.task.task_desc or ""
        return [
            {"role": "system", "content": "You are a helpful assistant."},
            {
                "role": "user",
                "content": f"{question}\nPlease reason step by step, and put "
                "your final answer within \\boxed{}.",
            },
        ]

    def score(self, replies: list[Experience]) -> list[Experience]:
        for reply in replies:
            correct = float(
                answers_match(last_boxed(reply.response_text or "") or "", self.task.truth or "")
            )
            reply.reward = correct
            reply.metrics["accuracy"] = correct
        return replies

    def run(self) -> list[Experience]:
        return self.score(self.model.chat(self.messages(), n=self.repeat_times, **EVAL_SAMPLING))


@register_workflow("async_math_eval_workflow")
class AsyncMathEvalWorkflow(MathEvalWorkflow):
    is_async = True

    async def run_async(self) -> list[Experience]:
        replies = await self.model.chat_async(self.messages(), n=self.repeat_times, **EVAL_SAMPLING)
        return self.score(replies)
