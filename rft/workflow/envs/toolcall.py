"""``toolcall_workflow``: one reply of function calls, scored against the reference calls.

Trinity-RFT's ToolACE workflow (trinity/common/workflows/customized_toolcall_workflows.py, after
NVlabs/Tool-N1), no tools run: a task row holds ``tools`` (a JSON list of function schemas),
``raw_system``, ``conversations`` (``[{"from": "human"|"gpt"|"observation"|"function_call",
"value": ...}]``) and ``answer`` (a JSON list of ``{"name", "arguments"}``). The reply must think
once in ``<think>...</think>``, then give a JSON list of calls in ``<tool_call>...</tool_call>``;
reward 1 when that is so and the calls equal the answer's (names and arguments, in any order),
else 0.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from rft.workflow.base import Workflow
from rft.workflow.experience import Experience
from rft.workflow.registry import register_workflow

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "observation": "tool",
    "tool": "tool",
}
TOOL_PROMPT = """
# Tools

You may call these functions:
<tools>
{tools}
</tools>

In each reply, first reason inside <think> </think>, once. Then give the calls as a JSON list
inside <tool_call> </tool_call>, each item {{"name": <function name>, "arguments": <object>}},
for example:
<think>I need the weather in Paris.</think> <tool_call>[{{"name": "weather", "arguments": {{"city": "Paris"}}}}]</tool_call>
Give arguments of the types the schema asks for."""


def prompt_messages(row: dict[str, Any]) -> list[dict[str, str]]:
    """The chat of a ToolACE row: its system text with the tool list, then its turns."""
    tools = "\n".join(
        json.dumps({"type": "function", "function": tool}) for tool in _loads(row["tools"])
    )
    messages = [{"role": "system", "content": str(row.get("raw_system") or "") + TOOL_PROMPT.format(tools=tools)}]  # fmt: skip
    for turn in row.get("conversations") or []:
        source, value = turn["from"], turn["value"]
        if source == "function_call":  # an earlier call, shown as the assistant's JSON
            messages.append({"role": "assistant", "content": json.dumps(value)})
        elif source in _ROLES:
            messages.append({"role": _ROLES[source], "content": str(value)})
    return messages


def _loads(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _calls(text: str) -> list | None:
    """The JSON list of calls in the reply's last ``<tool_call>`` block (one object counts as a
    list of one), or None when there is none or it is not JSON."""
    blocks = _TOOL_CALL.findall(text)
    if not blocks:
        return None
    try:
        calls = json.loads(blocks[-1].strip())
        if isinstance(calls, str):
            calls = json.loads(calls)
    except json.JSONDecodeError:
        return None
    return [calls] if isinstance(calls, dict) else calls if isinstance(calls, list) else None


def _same_calls(calls: list, answer: list) -> bool:
    """Equal multisets of (name, arguments); two empty lists agree."""
    key = lambda call: (call["name"], json.dumps(call["arguments"], sort_keys=True))  # noqa: E731
    try:
        return Counter(map(key, calls)) == Counter(map(key, answer))
    except TypeError:  # arguments that JSON cannot hold
        return False


def toolcall_reward(response: str, answer: Any) -> float:
    """1.0 for one ``<think>`` block closed before the ``<tool_call>`` whose calls (each with a
    ``name`` and ``arguments``) equal ``answer`` (a JSON list or the list); else 0.0."""
    calls = _calls(response)
    if calls is None or response.count("<think>") != 1 or response.count("</think>") != 1:
        return 0.0
    call_at = response.find("<tool_call>")
    if call_at != -1 and response.find("</think>") > call_at:
        return 0.0
    if not all(isinstance(c, dict) and {"name", "arguments"} <= c.keys() for c in calls):
        return 0.0
    return float(_same_calls(calls, _loads(answer)))


@register_workflow("toolcall_workflow")
class ToolCallWorkflow(Workflow):
    can_repeat = False

    def run(self) -> list[Experience]:
        row = self.task.raw_task or {}
        reply = self.model.chat(prompt_messages(row))[0]
        reply.reward = toolcall_reward(reply.response_text or "", row.get("answer", "[]"))
        reply.info["accuracy"] = reply.reward
        return [reply]
