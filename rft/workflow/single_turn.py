"""Workflows: how one task row becomes chat messages for generation, and how replies are scored.

Data in: a task row (a dict from the taskset) and the taskset's format config. Data out:
:meth:`Recipe.build_messages` -> chat messages; :meth:`Recipe.ground_truth` -> the reference
answer; :meth:`Recipe.score` -> the rule's reward parts; :meth:`Recipe.reward` -> the scalar
reward and all parts, with reward model scores. Built-ins: ``WORKFLOWS`` (:func:`get_workflow`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from rft.config.auxiliary import RewardWeights
from rft.config.known_names import TRINITY_NAMES
from rft.data import Messages, chat_messages, column, format_field
from rft.errors import ConfigError, did_you_mean
from rft.workflow.reward_fn import reward_function
from rft.workflow.rewards import (
    RewardFunction,
    RewardParts,
    combine_reward,
    extract_ground_truth,
    takes_response_length,
)

MATH_SYSTEM_PROMPT = (
    "You are a careful assistant who solves problems. First work through the problem inside "
    "<think> </think> tags, then state only the final result inside <answer> </answer> tags, "
    "like this: <think> your reasoning </think> <answer> your final answer </answer>."
)

MATH_BOXED_SYSTEM_PROMPT = (
    "Solve the problem step by step, showing your reasoning. Write the final answer, and only "
    "the final answer, inside \\boxed{} at the end of your reply."
)
MATH_BOXED_THINK_SYSTEM_PROMPT = (
    "You solve math problems. First reason about the problem inside <think> </think> tags, "
    "then give the final answer, in closed form, inside \\boxed{}."
)


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A named single-turn prompt recipe and reward; the methods are the whole workflow (the
    explorer generates all of a step's recipe prompts in one engine call)."""

    name: str
    system_prompt: str | None  # used when the format config sets none
    reward_fn: RewardFunction  # fn(response, truth) -> reward parts
    reward_weights: RewardWeights = RewardWeights()  # rule vs reward model scores
    user_suffix: str | None = None  # appended to the last user message (Qwen2.5-Math's prompt)
    base_prompt: bool = False  # workflow_args.use_base: plain text, no chat template (base models)

    def build_messages(self, row: Mapping[str, Any], fmt: Any) -> Messages:
        """Chat messages for generating a reply to ``row`` (:func:`rft.data.chat_messages`).

        ``fmt``: ``rft.config.FormatConfig`` or any mapping/object with its names
        (``prompt_key``, ``response_key``, ``messages_key``, ``system_prompt``,
        ``reply_prefix``). With ``reply_prefix`` the last message is ``{"role": "assistant",
        "content": reply_prefix}``, a reply the model continues: render it with
        ``continue_final_message=True``.
        """
        messages = chat_messages(row, fmt, self.system_prompt)
        if self.user_suffix:
            last = max(i for i, m in enumerate(messages) if m["role"] == "user")
            messages[last] = {
                **messages[last],
                "content": messages[last]["content"] + self.user_suffix,
            }
        return messages

    def prompt_text(self, messages: Messages) -> str:
        """The messages as a base model's plain-text prompt (:func:`base_model_prompt`)."""
        return base_model_prompt(messages)

    def ground_truth(self, row: Mapping[str, Any], fmt: Any) -> str:
        """The reference answer of ``row`` (GSM8K ``####`` number, last ``\\boxed{}``, or text)."""
        return extract_ground_truth(
            str(column(row, format_field(fmt, "response_key") or "response"))
        )

    def score(
        self, response: str, truth: str, reply_prefix: str | None = None, response_length: int = 0
    ) -> RewardParts:
        """Reward parts of a generated ``response`` (without the prefix) against ``truth``;
        ``response_length`` (tokens) reaches a reward that takes it (math_dapo_reward). The
        reward function is given ``reply_prefix + response``, so tags opened in the prefix count."""
        if takes_response_length(self.reward_fn):
            return self.reward_fn(
                (reply_prefix or "") + response, truth, response_length=response_length
            )
        return self.reward_fn((reply_prefix or "") + response, truth)

    def reward(
        self, rule_parts: RewardParts, model_scores: Sequence[float] = ()
    ) -> tuple[float, RewardParts]:
        """The scalar reward and every part: :func:`~rft.workflow.rewards.combine_reward` with
        this workflow's weights (``model_scores``: one per reward model, config order)."""
        w = self.reward_weights
        return combine_reward(rule_parts, model_scores, w.rule_weight, w.reward_model_weight)


def base_model_prompt(messages: Messages) -> str:
    """Messages as a base model's plain-text prompt, the format of Trinity's ``use_base``
    (``MathBoxedWorkflow.format_prompt``, trinity/common/workflows/customized_math_workflows.py):
    ``System:<system>`` then ``\nUser:\n<question>\nAssistant:\n``, then the assistant
    message's text (a reply prefix) if there is one."""
    system = "".join(m["content"] for m in messages if m["role"] == "system")
    user = "\n".join(m["content"] for m in messages if m["role"] == "user")
    prefix = "".join(m["content"] for m in messages if m["role"] == "assistant")
    head = f"System:{system}\n" if system else ""
    return f"{head}User:\n{user}\nAssistant:\n{prefix}"


# Trinity-RFT's names: (system prompt, default reward).
_BUILTIN = {
    "math_workflow": (MATH_SYSTEM_PROMPT, "math_reward"),  # R1-style <think>/<answer>
    "math_boxed_workflow": (MATH_BOXED_SYSTEM_PROMPT, "math_boxed_reward"),
    # the format's system prompt only; the reward given by name or dotted path
    # (default_reward_fn_type), accuracy_reward if none
    "simple_workflow": (None, "accuracy_reward"),
    # On-policy distillation (trinity/common/workflows/on_policy_distill_workflow.py): the
    # teacher's log-probs are the explorer's (rft.explorer.teacher); the reward is only logged.
    "on_policy_distill_workflow": (None, "accuracy_reward"),
    "on_policy_distill_math_workflow": ("You are a helpful assistant.", "math_boxed_reward"),
}
# Qwen2.5-Math's instruction after the question (Trinity's OnPolicyDistillMathWorkflow).
_USER_SUFFIX = {
    "on_policy_distill_math_workflow": "\nPlease reason step by step, and put your final answer "
    "within \\boxed{}.",
}
# Trinity's async twins: the same recipe (the explorer batches every prompt of a step anyway).
ALIASES = {
    "async_simple_workflow": "simple_workflow",
    "async_math_workflow": "math_workflow",
    "async_math_boxed_workflow": "math_boxed_workflow",
}
WORKFLOWS: tuple[str, ...] = (*_BUILTIN, *ALIASES)
# The workflow_args a recipe reads (Trinity's), each passed to its default reward as a keyword
# but those of PROMPT_ARGS; ``with_think`` also picks the system prompt that asks for a <think>
# block, ``use_base`` renders the prompt as plain text (Recipe.prompt_text).
WORKFLOW_ARGS: dict[str, tuple[str, ...]] = {
    "math_boxed_workflow": ("with_think", "format_score_coef", "use_base"),
}
PROMPT_ARGS = ("use_base",)  # workflow_args that shape the prompt, not the reward


def get_workflow(
    name: str,
    reward_fn: str | None = None,
    reward_fn_args: Mapping[str, Any] | None = None,
    reward_weights: RewardWeights = RewardWeights(),
    workflow_args: Mapping[str, Any] | None = None,
) -> Recipe:
    """The single-turn workflow ``name``; ``reward_fn`` (a built-in or registered name, or
    ``package.module:function``: :func:`~rft.workflow.reward_fn.reward_function`) replaces its
    default reward, ``reward_fn_args`` are bound to the reward function (without
    the reward weights: :func:`rft.config.auxiliary.split_reward_weights`); ``workflow_args``:
    those of :data:`WORKFLOW_ARGS`, which reach the default reward (:data:`PROMPT_ARGS` shape
    the prompt instead)."""
    if name not in WORKFLOWS:
        raise ConfigError(
            f"workflow {name!r} is not one of {list(WORKFLOWS)}.{did_you_mean(name, WORKFLOWS, TRINITY_NAMES)}"
        )
    base = ALIASES.get(name, name)
    system_prompt, default_reward = _BUILTIN[base]
    args = _checked_workflow_args(name, base, dict(workflow_args or {}))
    prompt_args = {key: args.pop(key) for key in PROMPT_ARGS if key in args}
    if args and reward_fn not in (None, default_reward):
        raise ConfigError(
            f"workflow_args {sorted(args)} of {name!r} reach its reward {default_reward!r}; "
            f"with reward {reward_fn!r} give that reward's arguments in reward_fn_args instead"
        )
    if args.get("with_think"):
        system_prompt = MATH_BOXED_THINK_SYSTEM_PROMPT
    return Recipe(
        name,
        system_prompt,
        reward_function(reward_fn or default_reward, {**(reward_fn_args or {}), **args} or None),
        reward_weights,
        _USER_SUFFIX.get(base),
        bool(prompt_args.get("use_base", False)),
    )


def _checked_workflow_args(name: str, base: str, args: dict[str, Any]) -> dict[str, Any]:
    takes = WORKFLOW_ARGS.get(base, ())
    for key in args:
        if key not in takes:
            raise ConfigError(
                f"workflow_args {key!r}: the single-turn workflow {name!r} takes "
                f"{list(takes) or 'none'} (reward_fn_args reach the reward)"
            )
    return args
