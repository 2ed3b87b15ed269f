"""A task as a workflow sees it: Trinity-RFT's ``Task`` fields over one taskset row.

Data in: a taskset row and its taskset's config (the explorer builds one per run). Data out:
what a workflow reads (``raw_task``, ``format_args``, ``rollout_args``, ``workflow_args``,
``reward_fn``...). Holds no engine and no file handles: a task is plain data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

from rft.config.schema import FormatConfig
from rft.workflow.rewards import RewardFn


@dataclass
class GenerationArgs:
    """Sampling settings of a task's chat/generate calls (Trinity's ``GenerationConfig``)."""

    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = -1  # -1: disabled
    logprobs: int = 0  # extra top log-probs (the sampled token's is always recorded)
    max_tokens: int = 128  # response token limit per model call
    n: int = 1  # samples per call


@dataclass
class Task:
    """One taskset row and everything a workflow needs to run it (Trinity's field names)."""

    workflow: Optional[type] = None  # the Workflow class that runs this task
    repeat_times: int = 1  # runs of this task in its group (algorithm.repeat_times)
    format_args: FormatConfig = field(default_factory=FormatConfig)  # the taskset's columns
    rollout_args: GenerationArgs = field(default_factory=GenerationArgs)  # sampling settings
    workflow_args: dict = field(default_factory=dict)  # taskset.workflow_args
    reward_fn_args: dict = field(default_factory=dict)  # taskset.reward_fn_args
    is_eval: bool = False  # an evaluation task: never trained on
    reward_fn: Optional[type] = None  # a RewardFn class (call it with response=..., truth=...)
    raw_task: Optional[dict] = None  # the taskset row
    batch_id: Union[int, str] = ""  # the explorer step
    task_id: Union[int, str] = ""  # "<taskset>/<row index>"
    run_id: int = 0  # which of the repeat_times runs this is (set per run)
    index: dict = field(default_factory=dict)  # free-form ids (Trinity's)

    @property
    def task_desc(self) -> Optional[str]:
        """The row's prompt column (``format_args.prompt_key``), if present."""
        return _column(self.raw_task, self.format_args.prompt_key)

    @property
    def truth(self) -> Optional[str]:
        """The row's answer column (``format_args.response_key``), if present."""
        return _column(self.raw_task, self.format_args.response_key)

    def to_workflow(self, model: Any, auxiliary_models: Optional[list] = None) -> Any:
        """An instance of this task's workflow class (Trinity's ``Task.to_workflow``)."""
        assert self.workflow is not None, "a task is built with its workflow class"
        return self.workflow(task=self, model=model, auxiliary_models=auxiliary_models)

    def to_dict(self) -> dict:
        return dict(self.raw_task or {})


def _column(row: Optional[dict], key: Optional[str]) -> Optional[str]:
    if not row or not key or key not in row:
        return None
    value = row[key]
    return None if value is None else str(value)


class RewardFnClass:
    """Trinity's ``RewardFn`` shape around an rft reward function: ``cls(**reward_fn_args)``,
    then ``instance(response=..., truth=...) -> {part: value}``. The taskset's
    ``reward_fn_args`` were bound (and checked) when the config was loaded, so the constructor's
    keyword arguments are accepted and not applied a second time."""

    fn: RewardFn  # set by :func:`reward_fn_class`

    def __init__(self, **_bound_at_load: Any):
        pass

    def __call__(self, response: str, truth: Optional[str] = None, **_: Any) -> dict[str, float]:
        return type(self).fn(response, "" if truth is None else truth)


def reward_fn_class(fn: RewardFn, name: str) -> type:
    """A :class:`RewardFnClass` subclass calling ``fn`` (its arguments already bound)."""
    return type(name, (RewardFnClass,), {"fn": staticmethod(fn)})
