"""What a workflow returns: Trinity-RFT's ``Experience`` constructor fields, token-level.

Data in: a workflow (or the model handle) builds one per trained sample: ``tokens`` (prompt
then response), ``prompt_length``, per-response-token ``logprobs`` and ``action_mask`` (1: the
model generated the token, 0: a tool, the environment or the chat template added it), a
``reward``. Data out: the explorer turns it into the buffer's record
(:func:`rft.explorer.episodes.to_record`). Pure data: no engine, no tokenizer.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

from rft.errors import WorkflowError


@dataclass
class EID:
    """Where an experience comes from (Trinity's ``eid``). The explorer sets ``batch`` (the
    explorer step) and ``task`` (the task's id, ``<taskset>/<row>``: a string, where Trinity
    counts tasks within a batch); a workflow sets ``run`` (which of the task's runs) and
    ``step`` (which step of a step-wise run)."""

    batch: Union[int, str] = 0
    task: Union[int, str] = 0
    run: int = 0
    step: int = 0
    suffix: str = field(default_factory=lambda: uuid.uuid4().hex[:6])  # tells samples apart

    @property
    def uid(self) -> str:
        """This experience's id."""
        return f"{self.batch}/{self.task}/{self.run}/{self.step}/{self.suffix}"

    @property
    def sid(self) -> str:
        """The step's id: shared by every run's experience of that step of the task."""
        return f"{self.batch}/{self.task}/{self.step}"

    @property
    def rid(self) -> str:
        """The run's id: shared by every step's experience of that run."""
        return f"{self.batch}/{self.task}/{self.run}"

    @property
    def tid(self) -> str:
        """The task's id: shared by every experience of the task (a GRPO group)."""
        return f"{self.batch}/{self.task}"

    def __str__(self) -> str:
        return self.uid

    def to_dict(self) -> dict:
        return {
            "batch": self.batch,
            "task": self.task,
            "run": self.run,
            "step": self.step,
            "suffix": self.suffix,
        }


# Trinity's tensor fields and their torch dtypes: a list, an array or a tensor becomes a 1-D
# tensor when it is set (at construction or later, so ``exp.logprobs = [...]`` works too).
# torch is imported on first use: a tool's subprocess imports this package and no tensor.
TENSOR_FIELDS = {"tokens": "int32", "logprobs": "float32", "action_mask": "bool"}


def _tensor(name: str, values: Any) -> Any:
    import torch

    dtype = getattr(torch, TENSOR_FIELDS[name])
    t = values.detach().flatten() if isinstance(values, torch.Tensor) else torch.tensor(values)
    if name == "action_mask" and t.dtype != torch.bool and not bool(((t == 0) | (t == 1)).all()):
        return t.to(torch.int64)  # kept as given: check() refuses values other than 0 and 1
    return t.to(dtype) if t.numel() else t.new_empty(0, dtype=dtype)


def as_list(values: Any) -> list:
    """A tensor field (or any sequence) as a list of Python numbers."""
    return values.tolist() if hasattr(values, "tolist") else list(values)


def numbers(values: Optional[dict]) -> dict[str, float]:
    """The numeric entries of ``values`` (booleans aside) as floats: what of an experience's
    ``info`` (or a recording run's metrics) becomes metrics."""
    return {
        str(k): float(v)
        for k, v in (values or {}).items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


@dataclass
class Experience:
    """One trained sample: tokens with the model's log-probs, a loss mask and a reward. As
    Trinity's, ``tokens`` (int32), ``logprobs`` (float32) and ``action_mask`` (bool) are 1-D
    tensors; lists, arrays and tensors given for them are converted when set."""

    tokens: Any = ()  # prompt then response token ids
    prompt_length: int = 0  # how many of ``tokens`` are the prompt
    logprobs: Any = None  # one per response token (0 where masked)
    action_mask: Any = None  # one per response token (True: the model generated it); None: all
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

    def __setattr__(self, name: str, value: Any) -> None:
        if name in TENSOR_FIELDS and value is not None:
            value = _tensor(name, value)
        elif name == "response_versions" and value is not None:
            value = [int(v) for v in as_list(value)]
        object.__setattr__(self, name, value)

    @property
    def response_ids(self) -> list[int]:
        return self.tokens[self.prompt_length :].tolist()

    @property
    def prompt_ids(self) -> list[int]:
        return self.tokens[: self.prompt_length].tolist()

    def check(self, who: str, evaluation: bool = False) -> None:
        """WorkflowError naming ``who`` (the workflow) when the fields do not fit together.
        ``evaluation``: an evaluation task's experience may have no reward (Trinity's
        evaluation workflows score through ``metrics``; its reward counts as 0)."""
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
        if self.action_mask is not None and str(self.action_mask.dtype) != "torch.bool":
            raise WorkflowError(f"{who} returned an action_mask with values other than 0 and 1")
        if self.reward is None and not evaluation:
            raise WorkflowError(
                f"{who} returned an experience without a reward: set "
                "experience.reward before returning it"
            )
