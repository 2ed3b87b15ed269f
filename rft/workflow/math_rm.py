"""``math_rm_workflow`` and ``async_math_rm_workflow`` (Trinity-RFT's MathRMWorkflow,
trinity/common/workflows/math_rm_workflow.py): a math question answered ``n`` times in one call,
each reply scored by a reward class that sees the whole exchange, typically a judge model.

Data in: a task (question, format, ``rollout_args``, a reward class from
``default_reward_fn_type`` built with ``reward_fn_args``) and the episode's handles. Data out:
the replies, each rewarded with the sum of the parts that
``reward_fn(reply, messages, ground_truth=truth)`` returns (Trinity's call: the reply is the
``Experience``, not its text), the parts in its metrics. The judge: rft serves the explorer's
generative ``explorer.auxiliary_models`` to the workflow (``self.auxiliary_model_wrappers``);
a reward class whose ``__call__`` takes ``auxiliary_models`` (or ``**kwargs``) gets those
handles there, where Trinity's judge rewards read an API address from the environment.
"""

from __future__ import annotations

import inspect
from typing import Any

from rft.workflow.experience import Experience
from rft.workflow.registry import register_workflow
from rft.workflow.simple import SimpleWorkflow

AUXILIARY_KEYWORD = "auxiliary_models"  # the call keyword that carries the judge handles


def takes_keyword(fn: Any, name: str) -> bool:
    """Whether ``fn`` can be called with the keyword ``name`` (named, or ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.kind is p.VAR_KEYWORD
        or (p.name == name and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
        for p in params
    )


@register_workflow("math_rm_workflow")
class MathRMWorkflow(SimpleWorkflow):
    """Trinity's MathRMWorkflow: :class:`~rft.workflow.simple.SimpleWorkflow`'s prompt and
    call, scored by ``reward_fn(reply, messages, ground_truth=truth)``. The task must name a
    reward (Trinity has no default here either)."""

    def _reward_parts(self, response: Experience) -> dict[str, float]:
        """Trinity's call: the reply itself, the messages and the reference answer (and the
        judge handles for a reward class that takes them)."""
        extra = {}
        if takes_keyword(self.reward_fn, AUXILIARY_KEYWORD):
            extra[AUXILIARY_KEYWORD] = self.auxiliary_model_wrappers or []
        return self.reward_fn(response, self.format_messages(), ground_truth=self.truth, **extra)


@register_workflow("async_math_rm_workflow")
class AsyncMathRMWorkflow(MathRMWorkflow):
    is_async = True

    async def run_async(self) -> list[Experience]:
        replies = await self.model.chat_async(self.format_messages(), **self.rollout_args)
        return self._score_replies(replies)
