"""``model.external_model`` in mode bench: the eval tasksets answered by an OpenAI-compatible
endpoint (Trinity's ``engine_type: external``), with no local engine.

Data in: the endpoint (:func:`rft.config.external.external_endpoint`: URL and key from the
environment variables the config names), the eval tasksets. Every model call is one chat
completion (``POST <base_url>/chat/completions``, one request per sample), as Trinity's external
engine sends them; ``generate`` sends each prompt as one user message. Data out: scored
records and the bench metrics of each taskset (:func:`evaluate_external`).

Only text comes back: no token ids, no log-probs. That is all a bench needs (rewards read the
text; response lengths come from the endpoint's ``usage``), and it is why the external model
never trains (:func:`rft.config.external.check_external_mode`). Writes nothing to the run.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from rft.buffer.experience import Experience as Record
from rft.config.external import external_endpoint
from rft.config.schema import Config
from rft.errors import ConfigError, WorkflowError
from rft.explorer import tasksets as T
from rft.explorer.endpoint_client import (
    COMPLETION_TOKENS,
    ExternalClient,
    ExternalModel,
    Reply,
)
from rft.explorer.engine import Sample
from rft.explorer.episodes import (
    EpisodeJob,
    EpisodeResult,
    episode_jobs,
    episode_metrics,
)
from rft.explorer.eval import eval_taskset_metrics
from rft.explorer.groups import PromptJob, episode_task, group_records
from rft.monitor import EPISODE_FIRST_ERROR
from rft.workflow.experience import Experience, numbers
from rft.workflow.recording import WorkflowWithRecording
from rft.workflow.tools import counting

log = logging.getLogger(__name__)


def connect(cfg: Config) -> ExternalClient:
    """The checked endpoint of ``model.external_model`` (ConfigError for a missing variable,
    RftError for an endpoint that does not answer)."""
    if cfg.explorer.auxiliary_models:
        raise ConfigError(
            "explorer.auxiliary_models with model.external_model: not built (they are local "
            "vLLM engines, and an external-model bench starts none); remove them"
        )
    client = ExternalClient(external_endpoint(cfg), timeout_s=cfg.explorer.max_timeout)
    client.check()
    log.info(
        "external model: %s at %s (no local engine)", client.model_name, client.endpoint.base_url
    )
    return client


FAILED_RUNS = "failed_runs"  # eval/<taskset>/failed_runs: samples whose request or episode failed


def evaluate_external(
    cfg: Config, client: ExternalClient, eval_sets: Sequence[T.Taskset], step: int = 0
) -> dict[str, float]:
    """The bench metrics of every eval taskset (:func:`rft.explorer.eval.eval_taskset_metrics`),
    ``response_length_mean`` from the endpoint's usage counts, and ``failed_runs``. A taskset
    of which nothing came back raises, with the first error."""
    metrics: dict[str, float] = {}
    for ts in eval_sets:
        items = [(i, T.Task(0, i, 0)) for i in range(len(ts))]
        classes = {
            slot
            for slot, t in items
            if isinstance(ts.workflow_of(ts.rows[t.index]), T.WorkflowClass)
        }
        records, errors = _recipe_records(
            cfg, client, ts, [it for it in items if it[0] not in classes], step
        )
        if classes:
            more, episode_errors = _episode_records(
                cfg, client, ts, [it for it in items if it[0] in classes], step
            )
            records, errors = records + more, errors + episode_errors
        if errors and not records:
            raise WorkflowError(
                f"{ts.label}: every run failed against the external model: {errors[0]}"
            )
        for error in errors[:1]:
            log.warning("%s: %d run(s) failed, the first: %s", ts.name, len(errors), error)
        groups = [
            [r for r in records if r.group_id == g]
            for g in dict.fromkeys(r.group_id for r in records)
        ]
        out = eval_taskset_metrics(ts.name, ts.sampling.n, groups, cfg.monitor.detailed_stats)
        counted = [
            r.info[COMPLETION_TOKENS] for r in records if r.info.get(COMPLETION_TOKENS) is not None
        ]
        if records:  # the records hold no token ids: the endpoint's counts, where it gave them
            out[f"eval/{ts.name}/response_length_mean"] = (
                statistics.fmean(counted) if counted else float("nan")
            )
        metrics.update(out | {f"eval/{ts.name}/{FAILED_RUNS}": len(errors)})
    return metrics


def _sampling(args: T.SamplingArgs) -> dict[str, Any]:
    """A taskset's sampling settings as the keywords of one sample's request."""
    return {
        "n": 1,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "max_tokens": args.max_tokens,
        "stop": args.stop,
        **dict(args.extra),
    }


def _recipe_records(
    cfg: Config,
    client: ExternalClient,
    ts: T.Taskset,
    items: list[tuple[int, T.Task]],
    step: int,
) -> tuple[list[Record], list[str]]:
    """The single-turn tasks: ``n`` requests per task, ``explorer.runner_per_model`` at once,
    scored by the taskset's reward function; the records and the failed requests' errors."""
    fmt = ts.config.format
    jobs, prompts = [], []
    for slot, task in items:
        row = ts.rows[task.index]
        recipe = ts.workflow_of(row)
        messages = recipe.build_messages(row, fmt)
        if recipe.base_prompt:  # a plain-text prompt, sent as one user message (as Trinity)
            messages = [{"role": "user", "content": recipe.prompt_text(messages)}]
        jobs.append(PromptJob(slot, task, ts, row, [], recipe))
        prompts.append(messages)
    sampling = {**T.sampling_defaults(cfg), **_sampling(ts.sampling)}
    units = [(j, k) for j in range(len(jobs)) for k in range(ts.sampling.n)]

    def ask(unit: tuple[int, int]) -> Reply | str:
        try:
            return client.chat(prompts[unit[0]], sampling)[0]
        except WorkflowError as e:
            return str(e)

    with ThreadPoolExecutor(max(1, cfg.explorer.runner_per_model)) as pool:
        answers = list(pool.map(ask, units))
    replies: dict[int, list[Reply]] = {j: [] for j in range(len(jobs))}
    for (j, _), answer in zip(units, answers):
        if isinstance(answer, Reply):
            replies[j].append(answer)
    records = []
    for j, job in enumerate(jobs):
        truth = job.recipe.ground_truth(job.row, fmt)
        mine = replies[j]
        samples = [Sample([], [], [], r.finish_reason, r.text) for r in mine]
        rewards = [
            job.recipe.reward(
                job.recipe.score(r.text, truth, fmt.reply_prefix, r.completion_tokens or 0)
            )
            for r in mine
        ]
        for record, reply in zip(group_records(job, samples, rewards, step, 0, "bench"), mine):
            record.eval = True
            record.info[COMPLETION_TOKENS] = reply.completion_tokens
            records.append(record)
    return records, [a for a in answers if isinstance(a, str)]


def _episode_records(
    cfg: Config,
    client: ExternalClient,
    ts: T.Taskset,
    items: list[tuple[int, T.Task]],
    step: int,
) -> tuple[list[Record], list[str]]:
    """The workflow-class tasks: their episodes, ``explorer.runner_per_model`` at once; the
    records of the episodes that ended well and the failed ones' errors."""
    jobs: list[EpisodeJob] = []
    for slot, task in items:
        workflow = ts.workflow_of(ts.rows[task.index])
        jobs += episode_jobs(slot, episode_task(ts, task, step, "eval"), workflow.cls)
    with ThreadPoolExecutor(max(1, cfg.explorer.runner_per_model)) as pool:
        results = list(pool.map(lambda job: _run_episode(client, job), jobs))
    stats = episode_metrics(results)
    if EPISODE_FIRST_ERROR in stats:
        log.warning("%s: first failed episode: %s", ts.name, stats[EPISODE_FIRST_ERROR])
    records = [
        Record(
            task_id=str(r.job.task.task_id),
            group_id=f"bench:{step}:{r.job.slot}",
            prompt_ids=[],
            response_ids=[],
            reward=0.0 if exp.reward is None else float(exp.reward),
            reward_parts=numbers(exp.metrics),
            truncated=exp.truncate_status is not None,
            eval=True,
            response_text=exp.response_text,
            info={
                "step": step,
                "taskset": ts.name,
                COMPLETION_TOKENS: exp.info.get(COMPLETION_TOKENS),
            },
        )
        for r in results
        if r.ok
        for exp in r.experiences
    ]
    return records, [r.failure or "" for r in results if not r.ok]


def _run_episode(client: ExternalClient, job: EpisodeJob) -> EpisodeResult:
    """One episode of a workflow class on the endpoint; a failure is kept, never raised."""
    result = EpisodeResult(job)
    model = ExternalModel(client, job.task.rollout_args)
    start = time.monotonic()
    try:
        with counting(result.tools):
            result.experiences = _run_workflow(job, model)
    except Exception as e:  # a workflow's failure ends its episode, never the bench
        result.error = f"{type(e).__name__}: {e}"
        log.warning("episode of task %s failed: %s", job.task.task_id, result.error)
    result.seconds = time.monotonic() - start
    result.turns = model.model_calls
    return result


def _run_workflow(job: EpisodeJob, model: ExternalModel) -> list[Experience]:
    workflow = job.task.to_workflow(model)
    if isinstance(workflow, WorkflowWithRecording):
        raise WorkflowError(
            f"{type(workflow).__name__} records its experiences through rft's endpoint, which "
            "an external model's calls bypass: not built with model.external_model"
        )
    if job.repeat > 1 or getattr(workflow, "can_repeat", False):
        workflow.set_repeat_times(job.repeat, job.task.run_id)
    else:
        workflow.set_single_run_context(job.task.run_id)
    result = asyncio.run(workflow.run_async()) if workflow.is_async else workflow.run()
    if not isinstance(result, list) or not all(isinstance(e, Experience) for e in result):
        raise WorkflowError(
            f"{type(workflow).__name__}.run returned {type(result).__name__}: it must return "
            "a list of rft.workflow.Experience"
        )
    return result
