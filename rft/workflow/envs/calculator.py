"""``calculator_workflow``: products and sums the model works out by calling a calculator.

A task row holds ``question`` and ``answer``. The model writes ``<calc>expression</calc>``
(generation stops there), the tool's result comes back as ``<result>...</result>``, and the
reply with ``<answer>N</answer>`` (or any reply without a call) ends the episode; reward 1 for
a right answer, 0 when the turns run out on a calculator call. With
``explorer.rollout_model.enable_auto_tool_choice`` the model's native tool calls work too.
``workflow_args``: ``max_env_steps`` (model turns, default 4), ``tool_timeout_s`` (5).
"""

from __future__ import annotations

import re

from rft.workflow.base import MultiTurnWorkflow
from rft.workflow.experience import Experience
from rft.workflow.registry import register_workflow
from rft.workflow.rewards import answers_match, arithmetic_value, last_answer_tag, last_number
from rft.workflow.tools import ToolBox

SYSTEM_PROMPT = (
    "You have a calculator. Use it like this.\n"
    "User: What is 23 * 47?\nAssistant: <calc>23*47</calc>\nUser: <result>1081</result>\n"
    "Assistant: <answer>1081</answer>"
)
_CALC = re.compile(r"<calc>(.*?)</calc>\s*$", re.DOTALL)


def evaluate(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / and parentheses."""
    value = arithmetic_value(expression.replace("x", "*").replace("×", "*"))
    return str(int(value)) if value.is_integer() else f"{value:.6g}"


@register_workflow("calculator_workflow")
class CalculatorWorkflow(MultiTurnWorkflow):
    can_repeat = False  # each run is its own episode: runs of one task go concurrently

    def run(self) -> list[Experience]:
        args = self.task.workflow_args
        tools = ToolBox([evaluate], call_timeout_s=float(args.get("tool_timeout_s", 5)))
        system = self.task.format_args.system_prompt or SYSTEM_PROMPT
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"{self.task.task_desc or ''} Use the calculator."},
        ]
        calls = 0
        for _ in range(int(args.get("max_env_steps", 4))):
            reply = self.model.chat(messages, stop=["</calc>"])[0]
            if reply.truncate_status == "prompt_truncated":
                break
            messages.append({"role": "assistant", "content": reply.response_text})
            if reply.tool_calls:
                messages += tools.run_calls(reply.tool_calls)
                calls += len(reply.tool_calls)
                continue
            asked = _CALC.search(reply.response_text or "")
            if asked is None:
                break
            result = tools.call("evaluate", {"expression": asked.group(1)})
            messages.append({"role": "user", "content": f"<result>{result.content}</result>"})
            calls += 1
        final = next(m["content"] for m in reversed(messages) if m["role"] == "assistant")
        # An episode that ends on a calculator call (the turns ran out) has no answer.
        answer = last_answer_tag(final) or ("" if _CALC.search(final) else last_number(final)) or ""
        correct = answers_match(answer, self.task.truth or "")
        return [
            self.process_messages_to_experience(
                messages,
                float(correct),
                info={"accuracy": float(correct), "calculator_calls": calls},
            )
        ]
