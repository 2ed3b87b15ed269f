"""What a workflow returns: Trinity-RFT's ``Experience`` constructor fields, token-level.

Data in: a workflow (or the model handle) builds one per trained sample: ``tokens`` (prompt
then response), ``prompt_length``, per-response-token ``logprobs`` and ``action_mask`` (1: the
model generated the token, 0: a tool, the environment or the chat template added it), a
``reward``. Data out: the explorer turns it into the buffer's record
(:func:`rft.explorer.episodes.to_record`). Pure data: no engine, no tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from rft.errors import WorkflowError


@dataclass
class EID:
    """Where an experience comes from within its task (Trinity's ``eid``)."""

    run: int = 0  # which of the task's repeat_times runs
    step: int = 0  # which step of a step-wise run


def _ints(values: Any) -> list[int]:
    return [int(v) for v in (values.tolist() if hasattr(values, "tolist") else values)]


def _floats(values: Any) -> list[float]:
    return [float(v) for v in (values.tolist() if hasattr(values, "tolist") else values)]


@dataclass
class Experience:
    """One trained sample: tokens with the model's log-probs, a loss mask and a reward."""

    tokens: Sequence[int] = ()  # prompt then response token ids (lists or 1-D tensors)
    prompt_length: int = 0  # how many of ``tokens`` are the prompt
    logprobs: Optional[Sequence[float]] = None  # one per response token (0 where masked)
    action_mask: Optional[Sequence[int]] = None  # one per response token; None: all generated
    reward: Optional[float] = None  # the workflow sets it
    info: dict = field(default_factory=dict)  # JSON-able metadata, kept with the record
    metrics: dict = field(default_factory=dict)  # name -> number, averaged into the step's metrics
    prompt_text: Optional[str] = None
    response_text: Optional[str] = None
    truncate_status: Optional[str] = None  # "response_truncated", "prompt_truncated" or None
    eid: EID = field(default_factory=EID)
    model_version: Optional[int] = None  # weights version that generated the response tokens
    tool_calls: list = field(default_factory=list)  # parsed OpenAI-style calls of a chat reply
    # With explorer.rollout_model.reasoning_parser: a chat reply's reasoning and its answer
    # (response_text stays whole: it is what the model generated and what is trained).
    reasoning_content: Optional[str] = None
    content: Optional[str] = None  # the reply less its reasoning and tool calls
    finish_reason: Optional[str] = None  # "stop", "length", ...
    # Set by rft, not by workflows: per response token, the weights version that generated it
    # (a streaming explorer loads new weights while an episode's model call runs).
    response_versions: Optional[Sequence[int]] = None

    def __post_init__(self) -> None:
        self.tokens = _ints(self.tokens)
        if self.logprobs is not None:
            self.logprobs = _floats(self.logprobs)
        if self.action_mask is not None:
            self.action_mask = _ints(self.action_mask)
        if self.response_versions is not None:
            self.response_versions = _ints(self.response_versions)

    @property
    def response_ids(self) -> list[int]:
        return list(self.tokens[self.prompt_length :])

    @property
    def prompt_ids(self) -> list[int]:
        return list(self.tokens[: self.prompt_length])

    def check(self, who: str) -> None:
        """WorkflowError naming ``who`` (the workflow) when the fields do not fit together."""
        n = len(self.tokens) - self.prompt_length
        if self.prompt_length < 1 or n < 1:
            raise WorkflowError(
                f"{who} returned an experience with prompt_length "
                f"{self.prompt_length} of {len(self.tokens)} tokens: it needs at "
                "least one prompt and one response token"
            )
        for name in ("logprobs", "action_mask", "response_versions"):
            values = getattr(self, name)
            if values is not None and len(values) != n:
                raise WorkflowError(
                    f"{who} returned an experience with {len(values)} {name} for "
                    f"{n} response tokens: give one per response token"
                )
        if self.action_mask is not None and any(v not in (0, 1) for v in self.action_mask):
            raise WorkflowError(f"{who} returned an action_mask with values other than 0 and 1")
        if self.reward is None:
            raise WorkflowError(
                f"{who} returned an experience without a reward: set "
                "experience.reward before returning it"
            )
