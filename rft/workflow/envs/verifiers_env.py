"""``verifiers_env``: a verifiers environment (PyPI ``verifiers`` >= 0.4, its ``verifiers.v1``
stack) played by the explorer's model and scored by the environment's own reward functions.

``workflow_args``: ``env_id``, the verifiers taskset id (an importable module that exports one
``vf.Taskset`` subclass in ``__all__``, as ``vf-eval`` and prime-rl load it: put its folder on
``--plugin-dir`` or install it); ``env_args``, the fields of that taskset's config (checked by its
config class at dry run); ``max_turns``, model replies per episode (10); ``tool_timeout_s``, each
tool call's limit (30).

A taskset row is one verifiers task's data (``prompt``, ``system_prompt`` and the task class's own
fields: what ``python -m rft.workflow.envs.verifiers_data`` writes from the environment's
taskset); a row without ``prompt`` takes the text of the taskset's ``prompt_key``. One episode:
the system prompt and the prompt, the ``@vf.tool`` methods of the taskset's and the task's
``Toolset``s offered to the model as tools (described in the system prompt, hermes-style, when
the model's chat template does not show tools) and called in this process; a reply with tool calls
gets their results and another turn, and the episode ends on a reply without tool calls, on a
``@vf.stop`` hook (one that takes the trace) returning true, or after ``max_turns`` replies. The
task's own ``score()`` then runs over a ``vf.Trace`` of the conversation: every ``@vf.reward``
and ``@vf.metric`` value becomes a metric, and the reward is the weighted sum of the rewards
(``Trace.reward``). The model's turns are token-faithful, as in every rft multi-turn workflow.

What differs from verifiers' own runner: rft's model is the agent, in this process; there is no
harness program and no sandbox. So tasks that need a container (``NEEDS_CONTAINER``), hooks
that take a ``runtime``, ``@vf.intercept`` hooks, request/response stop hooks and judges are
refused with the reason (at dry run where the class shows it). verifiers is imported when an
episode runs or the dry run checks the arguments, never when rft is imported.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping

from rft.errors import WorkflowError, refuse_unknown_keys
from rft.workflow.base import MultiTurnWorkflow
from rft.workflow.experience import Experience
from rft.workflow.model import openai_message
from rft.workflow.registry import register_workflow
from rft.workflow.requires import python_package
from rft.workflow.tools import MAX_RESULT_CHARS, count_tool_call, function_schema, tool_prompt

NAME = "verifiers_env"
# the hooks a verifiers Task may declare that rft runs, and those it refuses (with why)
_REFUSED_HOOKS = {
    "intercept": "@vf.intercept hooks rewrite requests inside verifiers' interception proxy, "
    "which rft does not run",
}


@dataclass(frozen=True)
class VerifiersArgs:
    """The taskset's ``workflow_args`` for ``verifiers_env``, each checked."""

    env_id: str = ""  # the verifiers taskset id (an importable module)
    env_args: dict = field(default_factory=dict)  # the taskset config's fields
    max_turns: int = 10  # model replies per episode
    tool_timeout_s: float = 30.0  # each tool call's limit


def parse_args(args: Mapping[str, Any]) -> VerifiersArgs:
    """The checked arguments; WorkflowError naming the key and what to write."""
    known = VerifiersArgs.__dataclass_fields__
    refuse_unknown_keys(f"{NAME}: unknown workflow_args key", args, known)
    kinds = {"env_id": str, "env_args": dict, "max_turns": int, "tool_timeout_s": (int, float)}
    for key, value in args.items():
        if isinstance(value, bool) or not isinstance(value, kinds[key]):
            raise WorkflowError(f"{NAME}: workflow_args.{key} must be a {known[key].type}, got {value!r}")  # fmt: skip
    parsed = VerifiersArgs(**args)
    if not parsed.env_id:
        raise WorkflowError(
            f"{NAME}: workflow_args.env_id is required: the verifiers taskset id, a module "
            "that exports its vf.Taskset subclass in __all__ (its folder on --plugin-dir)"
        )
    if parsed.max_turns < 1 or parsed.tool_timeout_s <= 0:
        raise WorkflowError(f"{NAME}: workflow_args.max_turns must be >= 1 and tool_timeout_s > 0")
    return parsed


@functools.lru_cache(maxsize=16)
def _load(env_id: str, env_args_json: str) -> Any:
    from pydantic import ValidationError
    from verifiers.v1.utils.loaders import taskset_class

    try:
        cls = taskset_class(env_id)
    except (ImportError, TypeError, ValueError, AttributeError) as e:
        raise WorkflowError(f"{NAME}: cannot load the verifiers taskset {env_id!r}: {e}") from e
    config_cls = _config_class(cls)
    try:
        config = config_cls.model_validate({**json.loads(env_args_json), "id": env_id})
    except ValidationError as e:
        raise WorkflowError(f"{NAME}: workflow_args.env_args do not fit {cls.__name__}'s config {config_cls.__name__}: {e}") from e  # fmt: skip
    return cls(config)


def _config_class(cls: type) -> type:
    from verifiers.v1.configs.taskset import TasksetConfig
    from verifiers.v1.utils.generic import concrete_type

    return concrete_type(cls, TasksetConfig) or TasksetConfig


def load_taskset(args: VerifiersArgs) -> Any:
    """The environment's ``vf.Taskset``, built once per (env_id, env_args) in this process."""
    return _load(args.env_id, json.dumps(args.env_args, sort_keys=True))


def refusals(task: Any) -> list[str]:
    """Why rft cannot run verifiers task ``task`` (an instance, or its class at dry run)."""
    from verifiers.v1.session import hook_boundary
    from verifiers.v1.trace import Trace

    why = []
    if getattr(task, "NEEDS_CONTAINER", False):
        why.append(f"{_name(task)} needs a container (NEEDS_CONTAINER), which rft does not run")
    for attr, reason in _REFUSED_HOOKS.items():
        if _hooks(task, attr):
            why.append(f"{_name(task)}: {reason}")
    for attr in ("reward", "metric"):
        for fn in _hooks(task, attr):
            runtime = inspect.signature(fn).parameters.get("runtime")
            if runtime is not None and runtime.default is inspect.Parameter.empty:
                why.append(f"@vf.{attr} {fn.__name__} takes the task's runtime (a sandbox), which rft does not have")  # fmt: skip
    for fn in _hooks(task, "stop"):
        try:
            boundary = hook_boundary(fn, allow_trace=True)
        except TypeError as e:  # verifiers refuses it too: no typed Trace/Request/Response
            why.append(f"@vf.stop {fn.__name__}: {e}")
            continue
        if boundary is not Trace:
            why.append(f"@vf.stop {fn.__name__} acts on a request or response; rft runs stop hooks that take the trace")  # fmt: skip
    if not isinstance(task, type) and task.config.judges:
        why.append("judges (TaskConfig.judges) call a judge model; score with @vf.reward functions instead")  # fmt: skip
    return why


def _name(task: Any) -> str:
    return task.__name__ if isinstance(task, type) else type(task).__name__


def _hooks(task: Any, attr: str) -> list:
    if isinstance(task, type):  # the class: its decorated functions
        return [fn for k in task.__mro__ for fn in vars(k).values() if callable(fn) and hasattr(fn, attr)]  # fmt: skip
    return task.hooks(attr) if attr in ("stop", "metric", "reward") else _decorated(task, attr)


def _decorated(task: Any, attr: str) -> list:
    from verifiers.v1.utils.decorators import discover_decorated

    return discover_decorated(task, attr)


def check_args(workflow_args: Mapping[str, Any]) -> VerifiersArgs:
    """The arguments, the taskset loaded and its task class checked (the dry run's check)."""
    args = parse_args(workflow_args)
    taskset = load_taskset(args)
    why = refusals(type(taskset).task_type())
    if taskset.config.task.judges:
        why.append("judges (env_args.task.judges) call a judge model; score with @vf.reward functions instead")  # fmt: skip
    if why:
        raise WorkflowError(f"{NAME}: {args.env_id} cannot run in rft: " + "; ".join(why))
    return args


def task_of(taskset: Any, row: Mapping[str, Any], prompt: str | None) -> Any:
    """The verifiers task of taskset row ``row`` (its wire data; ``prompt`` when it has none)."""
    from pydantic import ValidationError

    task_cls = type(taskset).task_type()
    data = {k: v for k, v in row.items() if v is not None}
    if "prompt" not in data and prompt is not None:
        data["prompt"] = prompt
    try:
        task_data = task_cls.data_type().model_validate(data)
    except ValidationError as e:
        raise WorkflowError(f"{NAME}: the row does not fit {task_cls.__name__}'s data: {e}") from e
    if task_data.prompt is None:
        raise WorkflowError(f"{NAME}: the row has no prompt (write the task's data with python -m rft.workflow.envs.verifiers_data)")  # fmt: skip
    return task_cls(task_data, taskset.config.task)


# --- tools: the Toolsets' @vf.tool methods, called in this process


@dataclass
class Tools:
    """The episode's tools by the name the model sees, with their OpenAI schemas."""

    methods: dict[str, Any]
    schemas: list[dict]
    timeout_s: float

    async def call(self, call: Mapping[str, Any]) -> tuple[str, bool]:
        """One OpenAI-style tool call's result text, and whether it succeeded."""
        fn = call.get("function") or {}
        name = fn.get("name", "")
        method = self.methods.get(name)
        if method is None:
            return f"error: no tool named {name!r}; tools: {sorted(self.methods)}", False
        try:
            args = json.loads(fn.get("arguments") or "{}")
            if not isinstance(args, dict):
                raise ValueError("arguments must be a JSON object")
            result = method(**args)
            if inspect.isawaitable(result):
                result = await asyncio.wait_for(result, self.timeout_s)
        except asyncio.TimeoutError:
            count_tool_call(error=True, timed_out=True)
            return f"error: {name} took longer than {self.timeout_s:g}s and was stopped", False
        except Exception as e:  # a tool's failure is the model's observation, as in verifiers
            count_tool_call(error=True, timed_out=False)
            return f"error: {type(e).__name__}: {e}"[:MAX_RESULT_CHARS], False
        count_tool_call(error=False, timed_out=False)
        text = result if isinstance(result, str) else json.dumps(result, default=str)
        return text[:MAX_RESULT_CHARS], True


async def open_tools(taskset: Any, task: Any, timeout_s: float) -> Tools:
    """The tools of the taskset's and the task's Toolsets, each set up for this episode."""
    toolsets = [*type(taskset).toolsets(taskset.config), *type(task).toolsets(task.config)]
    methods, schemas = {}, []
    for toolset in toolsets:
        await toolset.setup()
        await toolset.setup_task(task)
        prefix = toolset.server_name
        for fn in _decorated(toolset, "tool"):
            name = getattr(fn, "tool_name", None) or fn.__name__
            name = f"{prefix}_{name}" if prefix else name
            methods[name] = fn
            schemas.append(function_schema(fn, name))
    return Tools(methods, schemas, timeout_s)


# --- the conversation as verifiers sees it


def vf_messages(messages: list[dict]) -> list[Any]:
    """rft's OpenAI-style messages as verifiers ``Message`` models (tool calls flattened)."""
    from pydantic import TypeAdapter
    from verifiers.v1.types import Message

    adapter = TypeAdapter(Message)
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {"id": c.get("id") or uuid.uuid4().hex, **c["function"]} for c in m["tool_calls"]
            ]
        out.append(adapter.validate_python(m))
    return out


def new_trace(task: Any, messages: list[dict]) -> Any:
    """A ``vf.Trace`` of the conversation: one node a message, the model's turns ``sampled``."""
    from verifiers.v1.configs.agent import AgentConfig
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.state import state_cls
    from verifiers.v1.trace import AgentInfo, Trace, TraceTask

    trace = Trace(
        task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
        state=state_cls(type(task))(),
        agent=AgentInfo(config=AgentConfig()),
    )
    for i, (raw, message) in enumerate(zip(messages, vf_messages(messages))):
        sampled = raw["role"] == "assistant"
        trace.nodes.append(MessageNode(parent=i - 1 if i else None, message=message, sampled=sampled))  # fmt: skip
    return trace


async def stopped(task: Any, trace: Any) -> str | None:
    """The name of the first trace stop hook that says stop, or None."""
    from verifiers.v1.session import call_hook
    from verifiers.v1.trace import Trace

    for fn in task.hooks("stop"):
        if await call_hook(fn, {Trace: trace, "trace": trace, "task": task.data}):
            return fn.__name__
    return None


async def score(task: Any, trace: Any) -> tuple[float, dict[str, float]]:
    """The task's score over ``trace``: the weighted sum of its rewards, and every reward and
    metric value by name. A hook that fails or gives no number fails the episode."""
    from verifiers.v1.errors import TaskError

    try:
        await task.score(trace)
    except TaskError as e:
        raise WorkflowError(f"{NAME}: scoring failed: {e.__cause__ or e}") from e
    values = {**trace.metrics, **{k: (r.score if r else None) for k, r in trace.rewards.items()}}
    missing = sorted(k for k, v in values.items() if v is None)
    if missing:
        raise WorkflowError(f"{NAME}: scoring gave no value for {missing}")
    return float(trace.reward), {k: float(v) for k, v in values.items()}


@register_workflow(NAME)
class VerifiersEnvWorkflow(MultiTurnWorkflow):
    is_async = True
    can_repeat = False  # each run is its own episode: runs of one task go concurrently
    requires = (python_package("verifiers", module="verifiers.v1"),)

    @classmethod
    def check_workflow_args(cls, workflow_args: dict) -> None:
        check_args(workflow_args)

    async def run_async(self) -> list[Experience]:
        args = parse_args(self.task.workflow_args)
        taskset = load_taskset(args)
        task = task_of(taskset, self.task.raw_task or {}, self.task.task_desc)
        why = refusals(task)
        if why:
            raise WorkflowError(f"{NAME}: {args.env_id} cannot run in rft: " + "; ".join(why))
        tools = await open_tools(taskset, task, args.tool_timeout_s)
        # two views of one conversation: rft's (each reply as the engine's text, so the next
        # prompt extends the tokens sampled) and verifiers' (replies parsed, as scored)
        messages = first_messages(task.data)
        if tools.schemas and not self.model.template.renders_tools:
            messages = with_tool_prompt(messages, tools.schemas)
        shown = list(messages)
        turns, tool_calls, stop = 0, 0, None
        while turns < args.max_turns and stop is None:
            reply = (await self.model.chat_async(messages, tools=tools.schemas or None))[0]
            if reply.truncate_status == "prompt_truncated":
                break
            turns += 1
            messages.append({"role": "assistant", "content": reply.response_text})
            shown.append(openai_message(reply))
            for call in reply.tool_calls or []:
                text, _ = await tools.call(call)
                result = {"role": "tool", "tool_call_id": call.get("id", ""), "content": text}
                messages.append(result)
                shown.append(result)
                tool_calls += 1
            stop = await stopped(task, new_trace(task, shown))
            if not reply.tool_calls or reply.truncate_status == "response_truncated":
                break
        reward, values = await score(task, new_trace(task, shown))
        info = {**values, "turns": turns, "tool_calls": tool_calls}
        return [await self.process_messages_to_experience_async(messages, reward, info=info)]


def with_tool_prompt(messages: list[dict], schemas: list[dict]) -> list[dict]:
    """``messages`` with the tools described in the system prompt (added when there is none):
    for a model whose chat template does not show tools."""
    text = tool_prompt(schemas)
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]  # fmt: skip
    return [{"role": "system", "content": text}, *messages]


def first_messages(data: Any) -> list[dict]:
    """The opening messages of a task: its system prompt, then its prompt (text or messages)."""
    messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if isinstance(data.prompt, str):
        return [*messages, {"role": "user", "content": data.prompt}]
    return [*messages, *(m.model_dump(exclude_none=True) for m in data.prompt)]
