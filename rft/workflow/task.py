"""A task as a workflow sees it: Trinity-RFT's ``Task`` fields over one taskset row.

Data in: a taskset row and its taskset's config (the explorer builds one per run). Data out:
what a workflow reads (``raw_task``, ``format_args``, ``rollout_args``, ``workflow_args``,
``reward_fn``...), and the vLLM ``SamplingParams`` keywords its model calls may carry (checked
without importing vllm). Holds no engine and no file handles: a task is plain data.
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass, field
from typing import Any, Collection, Mapping, Optional, Union

from rft.config.schema import FormatConfig
from rft.errors import WorkflowError


@dataclass
class GenerationConfig:
    """Sampling settings of a task's chat/generate calls: Trinity's ``GenerationConfig``, field
    for field and default for default. None is the model's default; the explorer fills every
    field of a task's ``rollout_args`` from the config (``model.*``, the taskset's
    ``rollout_args``)."""

    temperature: Optional[float] = None  # None: model.temperature; 0: greedy
    top_p: Optional[float] = None  # None: model.top_p
    top_k: int = -1  # -1: disabled
    # extra top log-probs per token (the sampled token's is always recorded); None: model.logprobs
    logprobs: Optional[int] = None
    # response tokens per model call; None: model.max_response_tokens (a handle without it:
    # up to the engine's context)
    max_tokens: Optional[int] = None
    n: int = 1  # samples per call


# vLLM's SamplingParams fields (vLLM 0.32; a test checks them against the installed vLLM).
VLLM_SAMPLING_KEYS = frozenset(
    {
        *("n", "temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "min_tokens"),
        *("presence_penalty", "frequency_penalty", "repetition_penalty", "watermarking"),
        *("stop", "stop_token_ids", "ignore_eos", "bad_words", "logit_bias", "allowed_token_ids"),
        *("logprobs", "prompt_logprobs", "prompt_logprob_token_ids", "prompt_logprob_start"),
        *("logprob_token_ids", "flat_logprobs", "detokenize", "skip_special_tokens"),
        *("spaces_between_special_tokens", "include_stop_str_in_output", "output_kind"),
        *("stream_interval", "skip_clone", "output_text_buffer_length", "structured_outputs"),
        *("extra_args", "skip_reading_prefix_cache", "thinking_token_budget"),
        *("repetition_detection", "routed_experts_prompt_start", "trace_decode_token_ids"),
    }
)
# How rft's engine hands a call's samples back (whole, a log-prob dict per token): refused.
ENGINE_KEYS = frozenset(
    {"output_kind", "stream_interval", "skip_clone", "flat_logprobs", "output_text_buffer_length"}
)
# Accepted, not sent: a reply's text is always decoded (it is the message the conversation
# records), and a reply carries no prompt log-probs (ModelWrapper.logprobs gives them).
UNSENT_KEYS = frozenset(
    {"detokenize", "prompt_logprobs", "prompt_logprob_token_ids", "prompt_logprob_start"}
)


def sampling_keywords(
    defaults: GenerationConfig, call: Mapping[str, Any], also: Collection[str] = ()
) -> dict[str, Any]:
    """A model call's vLLM ``SamplingParams`` keywords: ``defaults`` (a task's rollout_args),
    then the ``call``'s own (None: the default), less :data:`UNSENT_KEYS`. A WorkflowError
    names a keyword SamplingParams does not take (``also``: the caller's other keywords, for
    the message), or one of :data:`ENGINE_KEYS`."""
    unknown = sorted(set(call) - VLLM_SAMPLING_KEYS)
    if unknown:
        valid = sorted({*also, *VLLM_SAMPLING_KEYS})
        near = [m for k in unknown for m in difflib.get_close_matches(k, valid, n=1)]
        raise WorkflowError(
            f"model call with unknown argument(s) {unknown}"
            + (f" (did you mean {near}?)" if near else "")
            + f": vLLM's SamplingParams takes no such keyword; the model handle takes {valid}"
        )
    owned = sorted(set(call) & ENGINE_KEYS)
    if owned:
        raise WorkflowError(
            f"model call with {owned}: rft's engine sets them itself (it hands each call's "
            "samples back whole, with a log-prob per token); leave them out"
        )
    sampling = {k: v for k, v in asdict(defaults).items() if v is not None}
    sampling.update((k, v) for k, v in call.items() if v is not None and k not in UNSENT_KEYS)
    return sampling


@dataclass
class Task:
    """One taskset row and everything a workflow needs to run it (Trinity's field names)."""

    workflow: Optional[type] = None  # the Workflow class that runs this task
    repeat_times: int = 1  # runs of this task in its group (algorithm.repeat_times)
    format_args: FormatConfig = field(default_factory=FormatConfig)  # the taskset's columns
    rollout_args: GenerationConfig = field(default_factory=GenerationConfig)  # sampling settings
    workflow_args: dict = field(default_factory=dict)  # taskset.workflow_args
    reward_fn_args: dict = field(default_factory=dict)  # taskset.reward_fn_args
    is_eval: bool = False  # an evaluation task: never trained on
    reward_fn: Optional[type] = None  # a RewardFn subclass; workflows build it with reward_fn_args
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

    @property
    def api_key(self) -> str:
        """Trinity's key of this task run, ``<batch_id>/<task_id>/<run_id>``: a workflow may
        hand it to ``model.set_api_key`` (then the endpoint answers it for this run)."""
        return f"{self.batch_id}/{self.task_id}/{self.run_id}"

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
