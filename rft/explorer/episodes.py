"""Running workflow episodes concurrently against one engine.

Data in: tasks whose taskset names a workflow class. Each episode (one workflow run) runs in its
own thread with its own model handle, whose calls reach the engine as requests
(:class:`rft.explorer.calls.EngineCalls`; only the explorer loop's thread touches the engine). A
failed or timed-out episode runs again, up to ``explorer.max_retry_times`` times
(:class:`EpisodePool`). Data out: each episode's checked experiences, their buffer records
(:func:`to_record`) and the step's episode metrics (:func:`episode_metrics`). A failed episode
never stops the explorer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import re
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol, Sequence

from rft.buffer.experience import ENV_STEP_KEY, RUN_KEY
from rft.buffer.experience import Experience as Record
from rft.errors import WorkflowError
from rft.explorer.calls import EngineCalls
from rft.monitor import (
    EPISODE_ERRORS,
    EPISODE_FAILED,
    EPISODE_FIRST_ERROR,
    EPISODE_PREFIX_BREAKS,
    EPISODE_RETOKENIZED,
    EPISODE_RETRIED,
    EPISODE_SAMPLES,
    EPISODE_TIMEOUTS,
    EPISODE_TURNS,
    EPISODES,
    TOOL_CALLS,
    TOOL_ERRORS,
    TOOL_TIMEOUTS,
)
from rft.workflow.conversation import ChatTemplate
from rft.workflow.endpoint import Endpoint
from rft.workflow.experience import Experience, as_list, numbers
from rft.workflow.model import EpisodeCancelled, ModelWrapper
from rft.workflow.recording import WorkflowWithRecording
from rft.workflow.task import Task
from rft.workflow.tools import ToolCounts, counting

log = logging.getLogger(__name__)

JOIN_GRACE_S = 5.0  # after an episode's deadline, how long its thread may take to notice
ERROR_LINE_CHARS = 300  # a failed run's error, as the console and the metrics show it


class AuxiliaryHandles(Protocol):
    """What an episode pool needs of a generative auxiliary model (a judge; served by
    :class:`rft.explorer.auxiliary.AuxiliaryModel`): a handle per episode, and word when the
    episode ends."""

    def handle(
        self, episode: int, run_name: str, time_limit_s: Optional[float]
    ) -> ModelWrapper: ...

    def ended(self, episode: int) -> None: ...


@dataclass
class EpisodeJob:
    """One workflow run to do: which task, which run of its group."""

    slot: int  # the task's slot in the step (its group)
    task: Task
    repeat: int  # runs this episode does itself (can_repeat workflows), else 1


@dataclass
class EpisodeResult:
    job: EpisodeJob
    experiences: list[Experience] = field(default_factory=list)
    error: Optional[str] = None
    timed_out: bool = False
    turns: int = 0
    prefix_breaks: int = 0
    retokenized_turns: int = 0  # assistant messages trained from the template's tokens
    seconds: float = 0.0
    tools: ToolCounts = field(default_factory=ToolCounts)  # its tool calls, every attempt's
    retries: int = 0  # times it ran again after failing (explorer.max_retry_times)

    @property
    def ok(self) -> bool:
        """Finished in time without raising: its experiences are kept."""
        return self.error is None and not self.timed_out

    @property
    def error_line(self) -> Optional[str]:
        """A run that did not end well, in one line: ``<Workflow>: <Type: message>`` (the
        traceback's last line; the traceback itself is in the explorer's log)."""
        if self.ok:
            return None
        why = one_line(self.error or "ran past explorer.max_timeout")
        return f"{getattr(self.job.task.workflow, '__name__', 'workflow')}: {why}"

    @property
    def failure(self) -> Optional[str]:
        """:attr:`error_line` with the task: ``<Workflow> on task <id>: <Type: message>``."""
        line = self.error_line
        if line is None:
            return None
        workflow, _, error = line.partition(": ")
        return f"{workflow} on task {self.job.task.task_id}: {error}"


def one_line(error: str) -> str:
    """An error as the console shows it: its first non-empty line, at most
    :data:`ERROR_LINE_CHARS` characters."""
    first = next((line.strip() for line in error.splitlines() if line.strip()), error)
    return first if len(first) <= ERROR_LINE_CHARS else first[: ERROR_LINE_CHARS - 3] + "..."


def episode_jobs(slot: int, task: Task, workflow_cls: type) -> list[EpisodeJob]:
    """The episodes of one task: one doing every run (``can_repeat``), else one per run."""
    if getattr(workflow_cls, "can_repeat", False):
        return [EpisodeJob(slot, task, task.repeat_times)]
    return [EpisodeJob(slot, _with_run(task, i), 1) for i in range(task.repeat_times)]


def run_name(job: EpisodeJob) -> str:
    """The task run in an API key: ``<taskset>_<row>_<run>`` (letters, digits, ``_``, ``-``)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"{job.task.task_id}_{job.task.run_id}")


def _with_run(task: Task, run_id: int) -> Task:
    return dataclasses.replace(task, run_id=run_id)


def run_workflow(
    job: EpisodeJob, model: ModelWrapper, auxiliary: Sequence[ModelWrapper] = ()
) -> list[Experience]:
    """Run one episode's workflow (its repeats set, sync or async) with ``auxiliary``: its
    handles on the generative auxiliary models (Trinity's ``auxiliary_models``, config order);
    its checked experiences, none of them an auxiliary model's reply."""
    workflow = job.task.to_workflow(model, auxiliary_models=list(auxiliary) or None)
    if job.repeat > 1 or getattr(workflow, "can_repeat", False):
        workflow.set_repeat_times(job.repeat, job.task.run_id)
    else:
        workflow.set_single_run_context(job.task.run_id)
    if isinstance(workflow, WorkflowWithRecording):
        result = workflow.recorded_experiences(asyncio.run(workflow.run_async()))
    else:
        result = asyncio.run(workflow.run_async()) if workflow.is_async else workflow.run()
    if not isinstance(result, list) or not all(isinstance(e, Experience) for e in result):
        raise WorkflowError(
            f"{type(workflow).__name__}.run returned {type(result).__name__}: it "
            "must return a list of rft.workflow.Experience"
        )
    returned = {id(exp) for exp in result}
    if any(id(reply) in returned for handle in auxiliary for reply in handle.calls):
        raise WorkflowError(
            f"{type(workflow).__name__}.run returned a reply of an auxiliary model: their "
            "replies are never trained on; return the experiences of self.model"
        )
    result = result + [exp for exp in model.split_samples if id(exp) not in returned]
    for exp in result:
        exp.eid.batch, exp.eid.task = job.task.batch_id, job.task.task_id
        exp.check(type(workflow).__name__, evaluation=job.task.is_eval)
    return result


class EpisodePool:
    """Episodes running in threads, at most ``concurrency`` at once, each with a model handle on
    ``service`` (:class:`rft.explorer.calls.EngineCalls`). An
    episode that raises or runs past ``timeout_s`` (``explorer.max_timeout``) runs again, the
    same task run from the start, up to ``max_retry_times`` times (Trinity's
    ``explorer.max_retry_times``); then it ends as failed. It never stops the explorer. The
    caller's thread serves the model calls meanwhile.

    Each attempt has its own id for the service and its thread (a new one per retry), so a
    thread abandoned past its deadline can never end or feed the attempt that replaced it."""

    def __init__(
        self,
        service: EngineCalls,
        template: ChatTemplate,
        *,
        concurrency: int,
        timeout_s: Optional[float],
        max_retry_times: int = 0,
        endpoint: Optional[Callable[[], Endpoint]] = None,
        model_path: str = "",
        auxiliary: Sequence[AuxiliaryHandles] = (),
    ):
        self.service = service
        self.template = template
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.max_retry_times = max_retry_times
        self.endpoint = endpoint
        self.model_path = model_path  # model.model_path: the handles' model_path
        self.results: dict[int, EpisodeResult] = {}  # every episode not yet taken by pop()
        self._ids = itertools.count()  # episode ids and attempt ids, never reused
        self._queued: deque[int] = deque()  # episodes
        # running attempts: attempt id -> its episode, start, model
        self._threads: dict[int, tuple[int, float, ModelWrapper]] = {}
        # generative auxiliary models (a judge): each episode gets a handle on each, here only
        self.auxiliary = list(auxiliary)
        self._aux: dict[int, list[ModelWrapper]] = {}  # running attempts: auxiliary handles
        self._ended: list[int] = []  # episodes ended (or abandoned), not yet seen by poll()
        self._lock = threading.Lock()

    def add(self, jobs: Sequence[EpisodeJob]) -> list[int]:
        """Queue ``jobs``; their episode ids (keys of :attr:`results`)."""
        ids = [next(self._ids) for _ in jobs]
        for i, job in zip(ids, jobs):
            self.results[i] = EpisodeResult(job)
        self._queued.extend(ids)
        return ids

    def pop(self, i: int) -> EpisodeResult:
        """An ended episode's result, forgotten by the pool."""
        return self.results.pop(i)

    @property
    def unfinished_runs(self) -> int:
        """Task runs of the episodes queued or running (a ``can_repeat`` episode does several)."""
        with self._lock:
            live = [*self._queued, *(i for i, _, _ in self._threads.values())]
        return sum(self.results[i].job.repeat for i in live)

    @property
    def idle(self) -> bool:
        """Nothing queued or running, and every ended episode returned by :meth:`poll`."""
        with self._lock:
            return not (self._queued or self._threads or self._ended)

    def poll(self) -> list[int]:
        """Start queued episodes while fewer than ``concurrency`` run, stop the ones past their
        deadline, queue failed ones again while they have retries left; the ids of the episodes
        that ended for good since the last call."""
        while self._queued and len(self._threads) < self.concurrency:
            self._start(self._queued.popleft())
        if self.timeout_s is not None:
            self._enforce_deadlines(self.timeout_s)
        with self._lock:
            ended, self._ended = self._ended, []
        return [i for i in ended if not self._retry(i)]

    def _retry(self, i: int) -> bool:
        """Queue failed episode ``i`` again, first in line, if it has retries left: the same
        job (task, run id, sampling settings) with a fresh result that keeps the count."""
        result = self.results[i]
        if result.ok or result.retries >= self.max_retry_times:
            return False
        log.warning(
            "retrying episode of task %s (retry %d of explorer.max_retry_times=%d): %s",
            result.job.task.task_id,
            result.retries + 1,
            self.max_retry_times,
            result.error_line,
        )
        # tool calls of the failed attempt happened: counted on (its thread may still add to
        # the old counts if it was abandoned, never to these)
        tools = dataclasses.replace(result.tools)
        self.results[i] = EpisodeResult(result.job, tools=tools, retries=result.retries + 1)
        self._queued.appendleft(i)
        return True

    def _start(self, i: int) -> None:
        result = self.results[i]
        job, k = result.job, next(self._ids)  # k: this attempt's id
        model = ModelWrapper(
            self.service.channel(k), self.template, job.task.rollout_args, self.model_path
        )
        model.workflow_cls = job.task.workflow
        model.time_limit_s = self.timeout_s
        model.endpoint_factory = self.endpoint
        model.run_name = run_name(job)
        self._aux[k] = [a.handle(k, model.run_name, self.timeout_s) for a in self.auxiliary]
        self.service.started(k)
        with self._lock:
            self._threads[k] = (i, time.monotonic(), model)
        threading.Thread(
            target=self._body, args=(k, result, model), daemon=True, name=f"rft-episode-{i}"
        ).start()

    def _end(self, k: int) -> None:
        with self._lock:
            running = self._threads.pop(k, None)
            if running is not None:
                self._ended.append(running[0])

    def _body(self, k: int, result: EpisodeResult, model: ModelWrapper) -> None:
        start = time.monotonic()
        try:
            with counting(result.tools):
                result.experiences = run_workflow(result.job, model, self._aux[k])
        except Exception as e:  # a workflow's failure ends its episode, never the explorer
            result.error = f"{type(e).__name__}: {e}"
            if not isinstance(e, EpisodeCancelled):
                log.warning(
                    "episode of task %s failed: %s",
                    result.job.task.task_id,
                    result.error,
                    exc_info=not isinstance(e, WorkflowError),
                )
        finally:
            model.close_endpoint_key()  # later calls with the run's key are refused
            result.seconds = time.monotonic() - start
            result.turns = model.model_calls
            result.prefix_breaks = model.prefix_breaks
            result.retokenized_turns = model.retokenized_turns
            try:
                self.service.ended(k)
                self._end_auxiliary(k)
            finally:  # the loop learns of the end even when releasing a handle fails
                self._end(k)

    def _end_auxiliary(self, k: int, why: Optional[str] = None) -> None:
        """Attempt ``k``'s auxiliary handles: their waiting calls fail; stopped (``why``), its
        later calls raise that; ended, their keys are closed and the handles dropped."""
        handles = self._aux.get(k, []) if why is not None else self._aux.pop(k, [])
        for aux, handle in zip(self.auxiliary, handles):
            if why is not None:
                handle.cancelled = why
            else:
                handle.close_endpoint_key()
            aux.ended(k)

    def _enforce_deadlines(self, timeout_s: float) -> None:
        now = time.monotonic()
        with self._lock:
            running = list(self._threads.items())
        for k, (i, start, model) in running:
            if now - start < timeout_s:
                continue
            result = self.results[i]
            if model.cancelled is None:
                model.cancelled = (
                    f"episode of task {result.job.task.task_id} ran past "
                    f"explorer.max_timeout={timeout_s:g}s"
                )
                result.timed_out = True
                log.warning("%s: stopping it", model.cancelled)
                self.service.ended(k)  # its waiting call fails now
                self._end_auxiliary(k, model.cancelled)
            elif now - start > timeout_s + JOIN_GRACE_S:  # stuck outside model calls: abandon it
                result.error = result.error or model.cancelled
                model.close_endpoint_key()  # a retry may register the same key (set_api_key)
                self._end(k)


def episode_metrics(results: list[EpisodeResult]) -> dict[str, Any]:
    """The step's episode counts; with failed runs (after their retries), the first one's error
    (with its task) and how many runs failed with each error line (JSON-only metrics: strings,
    a dict)."""
    ok = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    failures = (
        {
            EPISODE_FIRST_ERROR: failed[0].failure,
            EPISODE_ERRORS: dict(Counter(r.error_line for r in failed)),
        }
        if failed
        else {}
    )
    return {
        **failures,
        EPISODES: len(results),
        EPISODE_FAILED: sum(r.error is not None and not r.timed_out for r in results),
        EPISODE_TIMEOUTS: sum(r.timed_out for r in results),
        EPISODE_RETRIED: sum(r.retries > 0 for r in results),
        EPISODE_TURNS: sum(r.turns for r in ok) / max(len(ok), 1),
        EPISODE_SAMPLES: sum(len(r.experiences) for r in ok),
        EPISODE_PREFIX_BREAKS: sum(r.prefix_breaks for r in results),
        EPISODE_RETOKENIZED: sum(r.retokenized_turns for r in results),
        TOOL_CALLS: sum(r.tools.calls for r in results),
        TOOL_ERRORS: sum(r.tools.errors for r in results),
        TOOL_TIMEOUTS: sum(r.tools.timeouts for r in results),
    }


def to_record(
    exp: Experience,
    task: Task,
    group_id: str,
    version: int,
    temperature: float,
    info: dict[str, Any],
) -> Optional[Record]:
    """The buffer record of a workflow's experience; None when it has no response tokens."""
    if len(exp.tokens) <= exp.prompt_length:
        return None
    mask = [] if exp.action_mask is None else [int(m) for m in as_list(exp.action_mask)]
    versions = list(exp.response_versions or [])
    return Record(
        task_id=str(task.task_id),
        group_id=group_id,
        prompt_ids=exp.prompt_ids,
        response_ids=exp.response_ids,
        logprobs=[] if exp.logprobs is None else as_list(exp.logprobs),
        action_mask=mask if 0 in mask else [],
        reward=0.0 if exp.reward is None else float(exp.reward),  # an evaluation sample: 0
        reward_parts=numbers(exp.metrics),
        model_version=version if exp.model_version is None else exp.model_version,
        response_versions=versions if len(set(versions)) > 1 else [],
        temperature=temperature,
        truncated=exp.truncate_status is not None,
        eval=task.is_eval,
        response_text=exp.response_text,
        info={**_json_safe(exp.info), **info, RUN_KEY: exp.eid.run, ENV_STEP_KEY: exp.eid.step},
    )


def _json_safe(info: dict) -> dict[str, Any]:
    out = {}
    for k, v in (info or {}).items():
        try:
            json.dumps(v)
            out[str(k)] = v
        except (TypeError, ValueError):
            out[str(k)] = repr(v)
    return out
