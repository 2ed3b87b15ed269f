"""The first-task check (``explorer.first_task_check``): before any engine starts, each training
taskset's workflow class runs once on the taskset's first row against a fake model handle.

Data in: a checked config (the model folder's tokenizer, the training tasksets). Every model
call, a generative auxiliary model's too (:func:`fake_auxiliary`), gets one fixed reply
(:class:`FixedReply`); no engine starts, nothing is written; tools the
workflow runs in subprocesses run for real. Data out: per taskset, a line for the plan (ok with
the experience count, or skipped and why: it needs the real engine's OpenAI endpoint, its own
code raised a WorkflowError on the reply, or it ran past :data:`PROBE_TIMEOUT_S`), or a
:class:`~rft.errors.WorkflowError` naming the workflow, the task, the exception's last line and
the innermost frame in the user's code.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import sysconfig
import threading
import traceback
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

import rft
from rft.config.auxiliary import scoring_max_len
from rft.config.schema import Config
from rft.errors import WorkflowError
from rft.explorer import tasksets as T
from rft.explorer.auxiliary import model_template
from rft.explorer.episodes import episode_jobs, one_line, run_name, run_workflow
from rft.explorer.groups import episode_task, episode_template
from rft.models import GENERATIVE, auxiliary_kinds, read_config
from rft.workflow.conversation import ChatTemplate, Completion
from rft.workflow.endpoint import Endpoint
from rft.workflow.model import EpisodeCancelled, ModelWrapper
from rft.workflow.task import GenerationConfig

log = logging.getLogger(__name__)

# What every model call answers: a reply that math rewards parse (boxed and GSM8K-style).
FIXED_REPLY = "The answer is \\boxed{4}.\n#### 4"
FIXED_LOGPROB = -1.0  # log-prob of each reply token
PROBE_TIMEOUT_S = 30.0  # a run still going after this is left behind, its check skipped
SKIP_OPTION = "explorer.first_task_check: false"
ENDPOINT_SKIP = "it calls the OpenAI endpoint, which needs the real engine"


class FixedReply:
    """A :class:`~rft.workflow.model.GenerationService` without an engine: ``n`` copies of
    :data:`FIXED_REPLY` (the chat template's tokens and its end-of-turn token, log-probs
    :data:`FIXED_LOGPROB`, finish ``stop``), cut at the call's ``max_tokens`` as the engine cuts
    (finish ``length``); with ``prompt_logprobs``, :data:`FIXED_LOGPROB` for each prompt token
    after the first. No tool calls or reasoning are parsed out of it."""

    model_version = 0  # the weights "version" of its replies

    def __init__(self, template: ChatTemplate, max_model_len: Optional[int], text=FIXED_REPLY):
        self.template = template
        self.max_model_len = max_model_len
        self.text = text
        self.ids = template.encode(text) + _end_token(template)

    def submit(
        self, prompt_ids: list[int], sampling: Mapping[str, Any]
    ) -> "Future[list[Completion]]":
        ids = self.ids[: sampling.get("max_tokens", len(self.ids))]
        cut = len(ids) < len(self.ids)
        scored = "prompt_logprobs" in sampling
        text = self.template.decode(ids) if cut else self.text
        future: Future = Future()
        future.set_result(
            [
                Completion(
                    list(prompt_ids),
                    list(ids),
                    [FIXED_LOGPROB] * len(ids),
                    "length" if cut else "stop",
                    text,
                    prompt_logprobs=[FIXED_LOGPROB] * (len(prompt_ids) - 1) if scored else [],
                )
                for _ in range(sampling.get("n", 1))
            ]
        )
        return future

    def parse_tool_calls(self, text: str, tools: list) -> tuple[str, list[dict]]:
        return text, []

    def parse_reasoning(self, text: str) -> Optional[tuple[Optional[str], Optional[str]]]:
        return None


def _end_token(template: ChatTemplate) -> list[int]:
    """The token an engine's reply ends with when it stops: the first of the template's end of
    turn (ChatML: ``<|im_end|>``), else the tokenizer's end of sequence."""
    end = template.encode(template.end_of_turn) if template.end_of_turn else []
    if end:
        return end[:1]
    eos = getattr(template.tokenizer, "eos_token_id", None)
    return [] if eos is None else [eos]


class _NeedsRealModel(Exception):
    """The fake handle's answer to a call that only the real engine can serve."""


@dataclass
class _Run:
    """What one probe run left behind (its thread writes it)."""

    experiences: int = 0
    error: Optional[BaseException] = None
    needed_real_model: bool = False  # it asked for the OpenAI endpoint


def first_task_checks(cfg: Config, timeout_s: Optional[float] = None) -> dict[str, str]:
    """Run the workflow class of each training taskset's first row once; {taskset config key:
    ``<Workflow> on task <id>: ok (N experiences)`` or ``...: skipped (why)``}. A run that
    raises is a WorkflowError (:func:`failure_message`)."""
    lines: dict[str, str] = {}
    template: Optional[ChatTemplate] = None
    for label, ts_config in cfg.labelled_tasksets(evaluation=False):
        fmt = ts_config.format
        is_class = isinstance(T.taskset_workflow(cfg, ts_config, label, False), T.WorkflowClass)
        if not (is_class or fmt.workflow_key or fmt.reward_fn_key):
            continue  # a single-turn recipe: no code of the user's runs
        ts = T.open_taskset(cfg, ts_config, label, is_eval=False)
        workflow = ts.workflow_of(ts.rows[0])
        if not isinstance(workflow, T.WorkflowClass):
            continue
        template = template or episode_template(cfg)
        lines[label] = probe(cfg, ts, template, timeout_s)
        log.info("first-task check: %s", lines[label])
    return lines


def probe(
    cfg: Config, ts: T.Taskset, template: ChatTemplate, timeout_s: Optional[float] = None
) -> str:
    """Run the workflow of ``ts``'s row 0 on a :class:`FixedReply` handle (its first run; a
    ``can_repeat`` workflow does all ``repeat_times`` runs); the plan's line."""
    task = episode_task(ts, T.Task(0, 0, 0), step=0, writer="first_task_check")
    cls = task.workflow
    job = episode_jobs(0, task, cls)[0]
    model = ModelWrapper(
        FixedReply(template, _max_model_len(cfg)),
        template,
        task.rollout_args,
        cfg.model.model_path,
    )
    model.workflow_cls = cls
    model.time_limit_s = cfg.explorer.max_timeout
    model.run_name = run_name(job)
    run = _Run()
    if cfg.explorer.rollout_model.enable_openai_api:

        def endpoint():
            run.needed_real_model = True
            raise _NeedsRealModel(ENDPOINT_SKIP)

        model.endpoint_factory = endpoint

    auxiliary, endpoints = fake_auxiliary(cfg, model.run_name)

    def body() -> None:
        try:
            run.experiences = len(run_workflow(job, model, auxiliary))
        except BaseException as e:  # reported by the caller's thread
            run.error = e

    limit = PROBE_TIMEOUT_S if timeout_s is None else timeout_s
    thread = threading.Thread(target=body, daemon=True, name="rft-first-task-check")
    with contextlib.redirect_stdout(sys.stderr):  # the dry run's stdout is the plan
        thread.start()
        thread.join(limit)
    for endpoint in endpoints:
        endpoint.close()
    head = f"{cls.__name__} on task {task.task_id}"
    if thread.is_alive():
        model.cancelled = f"the first-task check gave up after {limit:g}s"  # its next call ends it
        return f"{head}: skipped (still running after {limit:g}s; not waited for)"
    if run.error is None:
        return f"{head}: ok ({run.experiences} experience{'s' * (run.experiences != 1)})"
    if run.needed_real_model:
        return f"{head}: skipped ({ENDPOINT_SKIP})"
    if isinstance(run.error, WorkflowError) and not isinstance(run.error, EpisodeCancelled):
        raised_at = _frames(run.error)[-1:]
        if raised_at and _is_users(raised_at[0].filename, cls):  # the workflow refused the reply
            return f"{head}: skipped (it refused the fixed reply: {_error_line(run.error)})"
    raise WorkflowError(failure_message(cls, str(task.task_id), ts.label, run.error)) from (
        run.error
    )


def fake_auxiliary(cfg: Config, name: str) -> tuple[list[ModelWrapper], list[Endpoint]]:
    """A :class:`FixedReply` handle on each generative auxiliary model (its own chat template),
    as a run hands them to the workflow, and their OpenAI-compatible endpoints: real ones on
    loopback, answering the same fixed reply (the workflow's OpenAI clients on a judge are
    made when it is built); the caller closes them."""
    handles, endpoints = [], []
    models = cfg.explorer.auxiliary_models
    for i, (aux, kind) in enumerate(zip(models, auxiliary_kinds(cfg) if models else [])):
        if kind != GENERATIVE:
            continue
        template = model_template(aux.model_path, aux.enable_thinking)
        key = f"explorer.auxiliary_models[{i}].model_path"
        limit = scoring_max_len(aux) or read_config(aux.model_path, key).get(
            "max_position_embeddings"
        )
        handle = ModelWrapper(
            FixedReply(template, limit), template, GenerationConfig(), aux.model_path
        )
        handle.run_name = name
        endpoint = Endpoint(aux.model_path)
        handle.endpoint_factory = lambda endpoint=endpoint: endpoint
        handles.append(handle)
        endpoints.append(endpoint)
    return handles, endpoints


def failure_message(cls: type, task_id: str, label: str, error: BaseException) -> str:
    """``first-task check: workflow W on task T (label) failed: Type: message (File ..., line
    N, in f); fix ...``, the frame being the innermost one in the user's code."""
    where = next(
        (
            f' (File "{f.filename}", line {f.lineno}, in {f.name})'
            for f in reversed(_frames(error))
            if _is_users(f.filename, cls)
        ),
        "",
    )
    return (
        f"first-task check: workflow {cls.__name__} on task {task_id} ({label}) failed: "
        f"{_error_line(error)}{where}; fix the workflow, or set {SKIP_OPTION} to skip this check"
    )


def _error_line(error: BaseException) -> str:
    """The traceback's last line (``Type: message``, its first line only), cut to length."""
    return one_line(f"{type(error).__name__}: {error}" if str(error) else type(error).__name__)


def _frames(error: BaseException) -> list[traceback.FrameSummary]:
    return list(traceback.extract_tb(error.__traceback__))


# rft's own code, the standard library and installed packages: never the user's file.
_NOT_USERS = tuple(
    Path(p).resolve()
    for p in {
        str(Path(rft.__file__).parent),
        *(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")),
    }
)


def _is_users(filename: str, cls: type) -> bool:
    """A file of the user's: the workflow's own module, or any file outside rft, the standard
    library and the installed packages."""
    if filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>
        return False
    path = Path(filename).resolve()
    own = getattr(sys.modules.get(cls.__module__), "__file__", None)
    if own and path == Path(own).resolve():
        return True
    return not any(path.is_relative_to(folder) for folder in _NOT_USERS)


def _max_model_len(cfg: Config) -> Optional[int]:
    """The context the engine would hold: the configured one, else the model's."""
    configured = cfg.explorer.rollout_model.max_model_len or cfg.model.max_model_len
    if configured:
        return configured
    return read_config(cfg.model.model_path, "model.model_path").get("max_position_embeddings")
