"""Trinity-RFT's AgentScope ReAct workflow (``as_react_workflow``, also registered there as
``agentscope_react_workflow``): an AgentScope agent (PyPI ``agentscope``) solves the task's
question through the explorer's recording endpoint; every model call it made is a sample with
the run's reward.

``workflow_args.type`` picks a template (a system prompt and a reward); Trinity ships
``gsm8k`` only: the question is the row's ``format.prompt_key`` column, the answer its
``response_key`` column (a GSM8K solution: the number after ``####``), the reward Trinity's
boxed-answer math reward (``accuracy`` + ``format_score``) built with ``reward_fn_args``.
Sampling: the taskset's ``rollout_args`` temperature and ``max_tokens``.

Differences from Trinity (agentscope 2.0 replaced the v1 ``ReActAgent`` Trinity builds): the
agent is agentscope 2.0's ``Agent`` with runtime-state injection off (no clock in the prompt);
it answers in text and the reward reads its final message, where Trinity asks for a structured
``result`` field, because agentscope 2.0 forces that field through a named ``tool_choice``,
which rft's endpoint cannot honour (it does not constrain decoding). A subclass adds tools by
overriding :meth:`tools`. agentscope is imported when an episode runs, never with rft.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from rft.errors import NotSupportedError, WorkflowError
from rft.workflow.recording import WorkflowWithRecording
from rft.workflow.registry import register_workflow
from rft.workflow.requires import python_package
from rft.workflow.reward_fn import MathBoxedRewardFn

MAX_ITERS = 10  # reasoning-acting iterations per reply (agentscope's default is 50)

# Task types of Trinity's newer as_react_workflow that need what rft does not build.
TRINITY_TYPES_NOT_BUILT = {
    "email_search": "its template's agent searches the Enron e-mail corpus (an SQLite database "
    "and Trinity's search tools), which rft does not build; bring that agent as a "
    "WorkflowWithRecording plugin (docs/agentic-workflows.md), or use type: gsm8k",
}


def gsm8k_truth(answer: Any) -> str:
    """A GSM8K ``answer`` column's final number (after ``####``), else the text itself."""
    text = str(answer)
    return text.split("####")[1].strip() if "####" in text else text


@dataclass(frozen=True)
class Template:
    """A task type: the agent's system prompt, and the reward of its final text against the
    row's answer (a dict of named parts, summed)."""

    system_prompt: str
    reward: Callable[[str, Any, dict], dict[str, float]]


def _gsm8k_reward(response: str, answer: Any, reward_fn_args: dict) -> dict[str, float]:
    args = {"format_score_coef": 0.1, **reward_fn_args, "with_think": False}
    return MathBoxedRewardFn()(response=response, truth=gsm8k_truth(answer), **args)


TEMPLATES: dict[str, Template] = {
    "gsm8k": Template(
        system_prompt=(
            "You are an agent specialized in solving math problems with tools. Please solve "
            "the math problem given to you. You can write and execute Python code to perform "
            "calculation or verify your answer. You should return your final answer within "
            "\\boxed{{}}."
        ),
        reward=_gsm8k_reward,
    ),
}


@register_workflow("as_react_workflow")
@register_workflow("agentscope_react_workflow")
class AgentScopeReActWorkflow(WorkflowWithRecording):
    requires = (python_package("agentscope"),)

    @classmethod
    def check_workflow_args(cls, workflow_args: dict) -> None:
        kind = workflow_args.get("type", "gsm8k")
        if kind in TRINITY_TYPES_NOT_BUILT:
            raise NotSupportedError(
                f"Trinity's `as_react_workflow type {kind}` is not supported by rft: "
                + TRINITY_TYPES_NOT_BUILT[kind]
            )
        unknown = sorted(set(workflow_args) - {"type", "max_iters"})
        if unknown:
            raise WorkflowError(
                f"AgentScope ReAct workflow: unknown workflow_args {unknown}; it takes type "
                f"(one of {sorted(TEMPLATES)}) and max_iters"
            )
        if kind not in TEMPLATES:
            raise WorkflowError(
                f"AgentScope ReAct workflow: workflow_args.type {kind!r} has no template "
                f"(known: {sorted(TEMPLATES)}); subclass AgentScopeReActWorkflow and add one "
                "to its TEMPLATES, or use type: gsm8k"
            )
        iters = workflow_args.get("max_iters", MAX_ITERS)
        if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
            raise WorkflowError(f"workflow_args.max_iters {iters!r}: use a whole number >= 1")

    def tools(self) -> list[Callable]:
        """The agent's tool functions (AgentScope registers each by its signature and
        docstring); Trinity's workflow gives it none."""
        return []

    async def run_async(self) -> dict:
        args = self.task.workflow_args or {}
        self.check_workflow_args(args)
        template = TEMPLATES[args.get("type", "gsm8k")]
        row, fmt = self.task.raw_task or {}, self.task.format_args
        question, answer = row.get(fmt.prompt_key), row.get(fmt.response_key)
        if question is None:
            raise WorkflowError(f"task row has no {fmt.prompt_key!r} column (format.prompt_key)")
        agent = self._agent(template.system_prompt, int(args.get("max_iters", MAX_ITERS)))
        reply = await agent.reply(_user_message(str(question)))
        text = reply.get_text_content() or ""
        parts = template.reward(text, answer, dict(self.task.reward_fn_args or {}))
        info = {**parts, "react_memory_length": len(agent.state.context)}
        await self.update_reward(sum(parts.values()), info)
        return {}

    def _agent(self, system_prompt: str, max_iters: int) -> Any:
        from agentscope.agent import Agent, InjectionConfig, ReActConfig
        from agentscope.credential import OpenAICredential
        from agentscope.model import OpenAIChatModel
        from agentscope.tool import Toolkit

        rollout = self.task.rollout_args
        model = OpenAIChatModel(
            credential=OpenAICredential(api_key=self.api_key, base_url=self.base_url),
            model=self.model_name,
            stream=False,
            parameters=OpenAIChatModel.Parameters(
                temperature=rollout.temperature, max_tokens=rollout.max_tokens
            ),
        )
        toolkit = Toolkit(tools=[_allowed_tool(fn) for fn in self.tools()])
        return Agent(
            name="react_agent",
            system_prompt=system_prompt,
            model=model,
            toolkit=toolkit,
            react_config=ReActConfig(max_iters=max_iters),
            injection_config=InjectionConfig(inject_runtime_state=False),
        )


def _user_message(text: str) -> Any:
    from agentscope.message import Msg, TextBlock

    return Msg(name="user", role="user", content=[TextBlock(text=text)])


def _allowed_tool(fn: Callable) -> Any:
    """``fn`` as an AgentScope tool that runs without asking a user to confirm (no one is
    there to answer during training)."""
    from agentscope.permission import PermissionBehavior, PermissionDecision
    from agentscope.tool import FunctionTool

    allow = PermissionDecision(behavior=PermissionBehavior.ALLOW, message="training run")
    return FunctionTool(fn, permission=allow)
