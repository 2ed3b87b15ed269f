"""Workflows: how one task row becomes chat messages for generation, and how replies are scored.

Data in: a task row (a dict from the taskset, one row of a HF dataset) and the taskset's
format config (``prompt_key``, ``response_key``, ``messages_key``, ``system_prompt``,
``reply_prefix``: ``rft.config.FormatConfig`` or any mapping/object with those names).
Data out: ``build_messages`` -> ``[{"role", "content"}, ...]`` for the chat template;
``ground_truth`` -> the reference answer string; ``score`` -> reward parts (floats, summed into
the reward).

When ``reply_prefix`` is set, the last message is ``{"role": "assistant", "content":
reply_prefix}``: a reply the model continues (render it with ``continue_final_message=True``),
and ``score`` is given ``reply_prefix + response`` so tags opened in the prefix count.

Built-ins (``WORKFLOWS``, Trinity-RFT's names):
- ``math_workflow``: R1-style system prompt (reason in ``<think>``, answer in ``<answer>``),
  reward ``math_reward``;
- ``math_boxed_workflow``: system prompt asking for the final answer in ``\\boxed{}``, reward
  ``math_boxed_reward``;
- ``simple_workflow``: the format's system prompt only, reward given by name or dotted path
  (``default_reward_fn_type``), ``accuracy_reward`` if none.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Mapping

from rft.errors import ConfigError, DataError
from rft.rewards import RewardFn, RewardParts, extract_ground_truth, get_reward_fn

Messages = list[dict[str, str]]

MATH_SYSTEM_PROMPT = (
    "You are a careful assistant who solves problems. First work through the problem inside "
    "<think> </think> tags, then state only the final result inside <answer> </answer> tags, "
    "like this: <think> your reasoning </think> <answer> your final answer </answer>."
)

MATH_BOXED_SYSTEM_PROMPT = (
    "Solve the problem step by step, showing your reasoning. Write the final answer, and only "
    "the final answer, inside \\boxed{} at the end of your reply."
)


@dataclasses.dataclass(frozen=True)
class Workflow:
    """A named prompt recipe and reward; the methods are the whole workflow."""

    name: str
    system_prompt: str | None  # used when the format config sets none
    reward_fn: RewardFn  # fn(response, truth) -> reward parts

    def build_messages(self, row: Mapping[str, Any], fmt: Any) -> Messages:
        """Chat messages for generating a reply to ``row``."""
        system_prompt = _fmt(fmt, "system_prompt") or self.system_prompt
        messages_key = _fmt(fmt, "messages_key")
        if messages_key:
            messages = _row_messages(row, messages_key)
        else:
            prompt = _column(row, _fmt(fmt, "prompt_key") or "prompt")
            messages = [{"role": "user", "content": str(prompt)}]
        if system_prompt and messages[0]["role"] != "system":
            messages = [{"role": "system", "content": system_prompt}] + messages
        reply_prefix = _fmt(fmt, "reply_prefix")
        if reply_prefix:
            messages = messages + [{"role": "assistant", "content": reply_prefix}]
        return messages

    def ground_truth(self, row: Mapping[str, Any], fmt: Any) -> str:
        """The reference answer of ``row`` (GSM8K ``####`` number, last ``\\boxed{}``, or text)."""
        return extract_ground_truth(str(_column(row, _fmt(fmt, "response_key") or "response")))

    def score(self, response: str, truth: str, reply_prefix: str | None = None) -> RewardParts:
        """Reward parts of a generated ``response`` (without the prefix) against ``truth``."""
        return self.reward_fn((reply_prefix or "") + response, truth)


def _fmt(fmt: Any, key: str) -> Any:
    """A format field from a FormatConfig-like object, a mapping, or None."""
    if fmt is None:
        return None
    if isinstance(fmt, Mapping):
        return fmt.get(key)
    return getattr(fmt, key, None)


def _column(row: Mapping[str, Any], key: str) -> Any:
    if key not in row:
        raise DataError(
            f"task row has no column {key!r}; its columns are {sorted(row)}. Set the taskset's "
            f"format (prompt_key / response_key / messages_key) to the right column."
        )
    return row[key]


def _row_messages(row: Mapping[str, Any], key: str) -> Messages:
    """The row's chat messages, minus a trailing assistant reply (that is what we generate)."""
    value = _column(row, key)
    ok = isinstance(value, list) and all(
        isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in value
    )
    if not ok or not value:
        raise DataError(
            f"task column {key!r} must be a non-empty list of {{'role': str, 'content': str}} "
            f"messages; got {str(value)[:200]!r}."
        )
    messages = [{"role": m["role"], "content": m["content"]} for m in value]
    while messages and messages[-1]["role"] == "assistant":
        messages.pop()
    if not messages:
        raise DataError(f"task column {key!r} holds only assistant messages: there is no prompt.")
    return messages


_BUILTIN = {
    "math_workflow": (MATH_SYSTEM_PROMPT, "math_reward"),
    "math_boxed_workflow": (MATH_BOXED_SYSTEM_PROMPT, "math_boxed_reward"),
    "simple_workflow": (None, "accuracy_reward"),
}
WORKFLOWS: tuple[str, ...] = tuple(_BUILTIN)


def get_workflow(
    name: str, reward_fn: str | None = None, reward_fn_args: Mapping[str, Any] | None = None
) -> Workflow:
    """The workflow ``name``; ``reward_fn`` (built-in name or ``package.module:function``)
    replaces its default reward, ``reward_fn_args`` are bound to the reward function."""
    if name not in _BUILTIN:
        close = difflib.get_close_matches(str(name), WORKFLOWS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"workflow {name!r} is not one of {list(WORKFLOWS)}.{hint}")
    system_prompt, default_reward = _BUILTIN[name]
    return Workflow(name, system_prompt, get_reward_fn(reward_fn or default_reward, reward_fn_args))
