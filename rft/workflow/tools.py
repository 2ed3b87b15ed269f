"""Tools a workflow offers the model: Python functions, each call run in a fresh subprocess
with a time limit (at most one such process per core at once: a call waits for its turn, and the
wait is not its time), so a tool that raises, hangs, crashes or returns garbage becomes an error
observation for the model, never a hung or dead explorer.

Data in: functions (importable: defined at a module's top level) or ``"pkg.module:function"``
specs, and the model's OpenAI-style tool calls. Data out: OpenAI tool schemas for
``model.chat(tools=...)``, ``{"role": "tool", ...}`` messages, and each episode's
:class:`ToolCounts` (:func:`counting`), which the explorer turns into its step's metrics.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
import threading
import time
import typing
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Sequence, Union

from rft.errors import WorkflowError

_JSON_TYPES = {
    int: "integer",
    float: "number",
    str: "string",
    bool: "boolean",
    list: "array",
    dict: "object",
}
MAX_RESULT_CHARS = 4000  # longer tool output is cut (the model's context is finite)


def _tool_slots() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, cores or 1)


# Tool processes running at once in this process (every episode's ToolBox shares them): one per
# core. Each starts a Python interpreter (~0.35 s of CPU); 32 episodes reaching their tool call
# together beside a busy engine on 2 cores took longer than the calculator's 5 s limit, and the
# model was scored on "took longer than 5s" instead of the result (measured 2026-11-29: up to 22
# of 32 runs a step). A call's time limit counts its own run, not its wait for a slot.
_SLOTS = threading.BoundedSemaphore(_tool_slots())


@dataclass
class ToolCounts:
    """Tool calls, errors and timeouts of one episode (only its thread adds to it)."""

    calls: int = 0
    errors: int = 0
    timeouts: int = 0

    def add(self, error: bool, timed_out: bool) -> None:
        self.calls += 1
        self.errors += error and not timed_out
        self.timeouts += timed_out


_COUNTING: ContextVar[Optional[ToolCounts]] = ContextVar("rft_tool_counts", default=None)


@contextmanager
def counting(counts: ToolCounts) -> Iterator[ToolCounts]:
    """Count into ``counts`` the tool calls this thread makes meanwhile (an episode's body)."""
    token = _COUNTING.set(counts)
    try:
        yield counts
    finally:
        _COUNTING.reset(token)


@dataclass(frozen=True)
class ToolResult:
    content: str  # what the model reads
    ok: bool
    timed_out: bool = False


@dataclass(frozen=True)
class Tool:
    name: str
    spec: str  # "pkg.module:function"
    schema: dict  # OpenAI function schema


def function_schema(fn: Callable, name: Optional[str] = None) -> dict:
    """The OpenAI tool schema of ``fn`` (a function or bound method): its parameters typed from
    their annotations (strings when unannotated), those without defaults required, its
    docstring the description."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # an annotation that does not resolve: the parameter is a string
        hints = {}
    params, required = {}, []
    for p in inspect.signature(fn).parameters.values():
        hint = typing.get_origin(hints.get(p.name)) or hints.get(p.name)
        params[p.name] = {"type": _JSON_TYPES.get(hint if isinstance(hint, type) else str, "string")}  # fmt: skip
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
    return {
        "type": "function",
        "function": {
            "name": name or fn.__name__,
            "description": inspect.getdoc(fn) or fn.__name__,
            "parameters": {"type": "object", "properties": params, "required": required},
        },
    }


TOOL_PROMPT = """# Tools

You can call these functions:
<tools>
{tools}
</tools>

To call one, write a JSON object with its name and arguments inside <tool_call></tool_call> tags:
<tool_call>
{{"name": "<function name>", "arguments": {{<the arguments>}}}}
</tool_call>"""


def tool_prompt(schemas: Sequence[dict]) -> str:
    """The tools described in text, with the hermes call format, for a system prompt when the
    model's chat template does not show tools (``ChatTemplate.renders_tools``)."""
    return TOOL_PROMPT.format(tools="\n".join(json.dumps(s) for s in schemas))


def count_tool_call(error: bool, timed_out: bool) -> None:
    """Count one tool call into the running episode's :class:`ToolCounts` (none outside an
    episode's thread or task)."""
    counts = _COUNTING.get()
    if counts is not None:
        counts.add(error=error, timed_out=timed_out)


def _tool(fn: Union[Callable, str]) -> Tool:
    if isinstance(fn, str):
        module_name, _, attr = fn.partition(":")
        try:
            fn = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise WorkflowError(f"tool {fn!r}: cannot import it ({e})") from e
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or "." in name or "<" in name:
        raise WorkflowError(
            f"tool {fn!r} must be a function at the top level of an importable "
            "module (the call runs in a fresh process that imports it)"
        )
    return Tool(fn.__name__, f"{module}:{fn.__name__}", function_schema(fn))


class ToolBox:
    """A workflow's tools: ``call`` runs one in a subprocess with ``call_timeout_s``; after
    ``episode_timeout_s`` of tool time in this toolbox, every further call fails at once."""

    def __init__(
        self,
        functions: Sequence[Union[Callable, str]],
        *,
        call_timeout_s: float = 10.0,
        episode_timeout_s: Optional[float] = None,
    ):
        self.tools = {t.name: t for t in map(_tool, functions)}
        self.call_timeout_s = call_timeout_s
        self.episode_timeout_s = episode_timeout_s
        self.spent_s = 0.0

    def schemas(self) -> list[dict]:
        return [t.schema for t in self.tools.values()]

    def call(self, name: str, arguments: Union[str, dict, None]) -> ToolResult:
        result = self._call(name, arguments)
        count_tool_call(error=not result.ok, timed_out=result.timed_out)
        return result

    def _call(self, name: str, arguments: Union[str, dict, None]) -> ToolResult:
        tool = self.tools.get(name)
        if tool is None:
            return ToolResult(f"error: no tool named {name!r}; tools: {sorted(self.tools)}", False)
        try:
            args = json.loads(arguments) if isinstance(arguments, str) else dict(arguments or {})
            if not isinstance(args, dict):
                raise ValueError("arguments must be a JSON object")
        except ValueError as e:
            return ToolResult(f"error: the arguments are not a JSON object ({e})", False)
        limit = self.call_timeout_s
        if self.episode_timeout_s is not None:
            limit = min(limit, self.episode_timeout_s - self.spent_s)
            if limit <= 0:
                return ToolResult("error: this episode's tool time is used up", False, True)
        return self._run(tool, args, limit)

    def _run(self, tool: Tool, args: dict, limit_s: float) -> ToolResult:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        with _SLOTS:
            return self._run_in_slot(tool, args, limit_s, env)

    def _run_in_slot(self, tool: Tool, args: dict, limit_s: float, env: dict) -> ToolResult:
        start = time.monotonic()
        try:
            done = subprocess.run(
                [sys.executable, "-m", "rft.workflow.tool_worker", tool.spec],
                input=json.dumps(args),
                capture_output=True,
                text=True,
                timeout=limit_s,
                env=env,
            )
        except subprocess.TimeoutExpired:
            return ToolResult(
                f"error: {tool.name} took longer than {limit_s:g}s and was stopped", False, True
            )
        finally:
            self.spent_s += time.monotonic() - start
        try:
            out = json.loads(done.stdout)
        except ValueError:
            why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
            return ToolResult(f"error: {tool.name} crashed ({why[:200]})", False)
        if not out.get("ok"):
            return ToolResult(f"error: {out.get('error', 'unknown')}"[:MAX_RESULT_CHARS], False)
        result = out["result"]
        text = result if isinstance(result, str) else json.dumps(result)
        return ToolResult(text[:MAX_RESULT_CHARS], True)

    def run_calls(self, tool_calls: Sequence[dict]) -> list[dict]:
        """Tool messages answering the model's OpenAI-style ``tool_calls``, in order."""
        messages = []
        for call in tool_calls:
            fn = call.get("function", {})
            result = self.call(fn.get("name", ""), fn.get("arguments"))
            messages.append(
                {"role": "tool", "tool_call_id": call.get("id", ""), "content": result.content}
            )
        return messages
