"""A task's group: its prompt, its scoring, the experiences it makes.

Single-turn recipes: the prompt's token ids (:func:`build_prompts`), each sample's reward
(:func:`score_all`, with reward models), the buffer records (:func:`group_records`). Workflow
classes: the workflow's view of a task (:func:`episode_task`) and the records of its episodes
(:func:`episode_records`). The explorer loop (:mod:`rft.explorer.steps`) builds on these.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from rft.buffer.experience import Experience
from rft.config.schema import Config
from rft.explorer import tasksets as T
from rft.explorer.engine import Sample
from rft.explorer.episodes import (
    EpisodeResult,
    to_record,
)
from rft.explorer.reward_model import RewardModel, conversation
from rft.workflow.conversation import ChatTemplate
from rft.workflow.endpoint import Endpoint, shared_endpoint
from rft.workflow.single_turn import Recipe
from rft.workflow.task import GenerationConfig
from rft.workflow.task import Task as WorkflowTask

log = logging.getLogger(__name__)


@dataclass
class PromptJob:
    """A task whose prompt fits: what generation and scoring need."""

    slot: int
    task: T.Task
    taskset: T.Taskset
    row: dict
    ids: list[int]
    recipe: Recipe  # the row's single-turn workflow


def build_prompts(
    cfg: Config, tokenizer: Any, items: list[tuple[int, T.Task]], tasksets: list[T.Taskset]
) -> tuple[list[PromptJob], dict[str, int]]:
    """Prompt ids per task; a prompt over :func:`~rft.explorer.tasksets.prompt_token_limit` is
    left out (its task yields no experiences), counted in ``prompts_filtered`` and logged."""
    counts = {"prompts_filtered": 0}
    limit = T.prompt_token_limit(cfg)
    thinking = enable_thinking(cfg)
    jobs = []
    for slot, task in items:
        ts = tasksets[task.taskset]
        row = ts.rows[task.index]
        fmt = ts.config.format
        recipe = ts.workflow_of(row)
        messages = recipe.build_messages(row, fmt)
        if recipe.base_prompt:  # workflow_args.use_base: a base model's plain-text prompt
            ids = tokenizer.encode(recipe.prompt_text(messages))
        else:
            ids = T.prompt_ids(
                tokenizer,
                messages,
                reply_prefix=fmt.reply_prefix,
                enable_thinking=thinking,
                chat_template=cfg.model.custom_chat_template,
            )
        if limit is not None and len(ids) > limit:
            counts["prompts_filtered"] += 1
            continue
        jobs.append(PromptJob(slot, task, ts, row, ids, recipe))
    if counts["prompts_filtered"]:
        log.warning(
            "%d of %d prompts are longer than %d tokens and were left out "
            "(model.enable_prompt_truncation=%s)",
            counts["prompts_filtered"],
            len(items),
            limit,
            cfg.model.enable_prompt_truncation,
        )
    return jobs, counts


def score(job: PromptJob, sample: Sample) -> dict[str, float]:
    """The rule reward's parts of one sample (the workflow's reward function)."""
    fmt = job.taskset.config.format
    truth = job.recipe.ground_truth(job.row, fmt)
    return job.recipe.score(sample.text, truth, fmt.reply_prefix, len(sample.response_ids))


def score_all(
    jobs: list[PromptJob],
    groups: list[list[Sample]],
    reward_models: Sequence[RewardModel] = (),
) -> tuple[list[list[tuple[float, dict[str, float]]]], dict[str, float]]:
    """(reward, parts) of every sample, grouped as ``groups``: the rule's parts, and with reward
    models their scores, each model scoring all the samples in one call; combined by the
    taskset's weights (:meth:`rft.workflow.single_turn.Recipe.reward`)."""
    flat = [(job, sample) for job, group in zip(jobs, groups) for sample in group]
    scores: list[list[float]] = [[] for _ in flat]
    stats: dict[str, float] = {}
    if reward_models and flat:
        start = time.monotonic()
        prompts = {
            id(job): job.recipe.build_messages(job.row, job.taskset.config.format) for job in jobs
        }
        conversations = [conversation(prompts[id(job)], sample.text) for job, sample in flat]
        for model in reward_models:
            for mine, value in zip(scores, model.score(conversations)):
                mine.append(value)
        stats = {
            "reward_model_time_s": time.monotonic() - start,
            "reward_model_truncated": sum(m.last_truncated for m in reward_models),
        }
    rewards = [
        job.recipe.reward(score(job, sample), mine) for (job, sample), mine in zip(flat, scores)
    ]
    out, first = [], 0
    for group in groups:
        out.append(rewards[first : first + len(group)])
        first += len(group)
    return out, stats


def episode_slots(items: Sequence[tuple[int, T.Task]], tasksets: list[T.Taskset]) -> set[int]:
    """Slots of ``items`` whose workflow (the taskset's, or the row's own) is a workflow class."""
    return {
        slot
        for slot, t in items
        if isinstance(
            tasksets[t.taskset].workflow_of(tasksets[t.taskset].rows[t.index]), T.WorkflowClass
        )
    }


def group_records(
    job: PromptJob,
    group: list[Sample],
    rewards: list[tuple[float, dict[str, float]]],
    step: int,
    version: int,
    writer: str,
) -> list[Experience]:
    """The experiences of one job's samples (group id ``writer:step:slot``). With per-token
    weight versions (a streaming explorer) a sample's ``model_version`` is its first token's
    and ``response_versions`` says where later versions took over; else ``version``."""
    out = []
    for sample, (reward, parts) in zip(group, rewards):
        spans = len(set(sample.versions)) > 1
        out.append(
            Experience(
                task_id=task_id(job.taskset, job.task),
                group_id=f"{writer}:{step}:{job.slot}",
                prompt_ids=sample.prompt_ids,
                response_ids=sample.response_ids,
                logprobs=sample.logprobs,
                response_versions=sample.versions if spans else [],
                reward=reward,
                reward_parts=parts,
                model_version=sample.versions[0] if sample.versions else version,
                temperature=job.taskset.sampling.temperature,
                truncated=sample.truncated,
                response_text=sample.text,
                info={"step": step, "epoch": job.task.epoch, "taskset": job.taskset.name},
            )
        )
    return out


def task_id(taskset: T.Taskset, task: T.Task) -> str:
    """The experience's ``task_id`` of a task: ``<taskset name>/<row index>``."""
    return f"{taskset.name}/{task.index}"


def enable_thinking(cfg: Config) -> bool | None:
    """The chat template's thinking switch: ``model.enable_thinking``, else the rollout model's."""
    return (
        cfg.model.enable_thinking
        if cfg.model.enable_thinking is not None
        else cfg.explorer.rollout_model.enable_thinking
    )


def episode_template(cfg: Config) -> ChatTemplate:
    """The chat template episodes render with: a tokenizer of their own (the engine's is used by
    the engine's thread meanwhile), loaded once per model folder and template settings."""
    return _chat_template(
        cfg.model.model_path, cfg.model.custom_chat_template, enable_thinking(cfg)
    )


@functools.lru_cache(maxsize=4)
def _chat_template(
    model_path: str, chat_template: str | None, thinking: bool | None
) -> ChatTemplate:
    from transformers import AutoTokenizer

    return ChatTemplate(AutoTokenizer.from_pretrained(model_path), chat_template, thinking)


def agent_endpoint(cfg: Config) -> Optional[Callable[[], Endpoint]]:
    """How episodes reach this process's OpenAI-compatible endpoint (started on first use),
    with ``explorer.rollout_model.enable_openai_api``; else None."""
    if not cfg.explorer.rollout_model.enable_openai_api:
        return None
    # named by the model's path, as vLLM's server is: the model_path/model_name of the handles
    return functools.partial(shared_endpoint, cfg.model.model_path)


def episode_task(ts: T.Taskset, task: T.Task, step: int, writer: str) -> WorkflowTask:
    """The workflow's view of a task whose taskset (or row) names a workflow class."""
    row = dict(ts.rows[task.index])
    choice = ts.workflow_of(row)
    s = ts.sampling
    return WorkflowTask(
        workflow=choice.cls,
        repeat_times=s.n,
        format_args=ts.config.format,
        rollout_args=GenerationConfig(
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            logprobs=s.logprobs,
            max_tokens=s.max_tokens,
        ),
        workflow_args=dict(ts.config.workflow_args),
        reward_fn_args=dict(ts.config.reward_fn_args),
        is_eval=writer == "eval",
        reward_fn=choice.reward_fn,
        raw_task=row,
        batch_id=step,
        task_id=task_id(ts, task),
    )


def episode_records(
    results: Sequence[EpisodeResult],
    ts: T.Taskset,
    task: T.Task,
    step: int,
    slot: int,
    version: int,
    writer: str,
) -> list[Experience]:
    """The buffer records of one task's episodes (group ``writer:step:slot``): the experiences
    of the episodes that ended well."""
    info = {"step": step, "epoch": task.epoch, "taskset": ts.name}
    records = []
    for result in results:
        if not result.ok:
            continue
        for exp in result.experiences:
            record = to_record(
                exp,
                result.job.task,
                f"{writer}:{step}:{slot}",
                version,
                ts.sampling.temperature,
                info,
            )
            if record is not None:
                records.append(record)
    return records


def model_tokens(results: Sequence[EpisodeResult]) -> int:
    """Tokens the model generated in ``results`` (tool and template tokens not counted)."""
    return sum(generated_tokens(e) for r in results for e in r.experiences)


def generated_tokens(exp: Any) -> int:
    """The response tokens of a workflow's experience or a record that the model generated
    (an empty or missing ``action_mask``: all of them)."""
    mask = exp.action_mask
    return int(sum(mask)) if mask is not None and len(mask) else len(exp.response_ids)


def tool_parser(cfg: Config) -> Optional[str]:
    """The engine's tool-call parser of replies, when the rollout model parses tool calls."""
    rollout = cfg.explorer.rollout_model
    return rollout.tool_call_parser if rollout.enable_auto_tool_choice else None
