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
import copy
import logging
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from rft.buffer.experience import Experience as Record
from rft.config.external import ExternalEndpoint, external_endpoint
from rft.config.schema import Config
from rft.errors import ConfigError, RftError, WorkflowError
from rft.explorer import tasksets as T
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
from rft.workflow.model import HANDLE_KEYS
from rft.workflow.recording import WorkflowWithRecording
from rft.workflow.task import GenerationConfig, sampling_keywords
from rft.workflow.tools import counting

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 30.0  # the start-up request to <base_url>/models
MAX_RETRIES = 2  # the openai client's retries of a failed request (with backoff)
COMPLETION_TOKENS = "completion_tokens"  # a record's info: the endpoint's usage count
# vLLM sampling keywords the OpenAI chat API takes under its own name ("max_tokens" is sent
# as max_completion_tokens, as Trinity's external engine does)
OPENAI_KEYS = frozenset(
    {"temperature", "top_p", "stop", "seed", "presence_penalty", "frequency_penalty"}
)
# not sent: log-probs are not asked for (nothing is trained), the rest is the engine's bookkeeping
NOT_SENT = frozenset(
    {"n", "logprobs", "include_stop_str_in_output", "skip_special_tokens", "min_tokens"}
)
NO_EFFECT = {"top_k": -1, "repetition_penalty": 1.0}  # values that change nothing: not sent


@dataclass
class Reply:
    text: str
    finish_reason: str
    completion_tokens: Optional[int]  # the endpoint's usage count (None: not reported)
    reasoning: Optional[str] = None  # reasoning_content, where the server splits it off
    tool_calls: Optional[list] = None


class ExternalClient:
    """The endpoint of ``model.external_model``: one ``openai.OpenAI`` client, shared by the
    threads that evaluate (the client is thread-safe)."""

    def __init__(self, endpoint: ExternalEndpoint, timeout_s: float):
        import openai

        self.endpoint = endpoint
        self.model_name = endpoint.model_name
        self.openai = openai.OpenAI(
            base_url=endpoint.base_url,
            api_key=endpoint.api_key,
            timeout=timeout_s,
            max_retries=MAX_RETRIES,
        )

    def check(self) -> None:
        """RftError when the endpoint cannot be reached or refuses the key (``GET /models``);
        a server without that route passes, a model it does not list is warned about."""
        import openai

        where = f"{self.endpoint.base_url} (${self.endpoint.base_url_env})"
        try:
            page = self.openai.with_options(timeout=CHECK_TIMEOUT_S, max_retries=0).models.list()
        except openai.APIConnectionError as e:
            raise RftError(
                f"model.external_model: cannot reach {where}: {e}; check the URL and that the "
                "server is up"
            ) from e
        except openai.AuthenticationError as e:
            raise RftError(
                f"model.external_model: {where} refused the key in ${self.endpoint.api_key_env}: "
                f"{e}"
            ) from e
        except openai.APIStatusError as e:  # it answered: a server without GET /models
            log.info("external model: %s answered GET /models with %d", where, e.status_code)
            return
        served = [m.id for m in page.data]
        if served and self.model_name not in served:
            log.warning(
                "external model: %s lists %s, not model.external_model.model_name=%s",
                where,
                ", ".join(served[:8]),
                self.model_name,
            )

    def chat(
        self, messages: Sequence[Mapping], sampling: Mapping[str, Any], tools: Optional[list] = None
    ) -> list[Reply]:
        """``sampling["n"]`` replies (vLLM keywords), one request each: servers that refuse
        ``n`` > 1, or greedy ``n`` > 1, answer them too. WorkflowError when a request fails."""
        args = request_args(self.model_name, sampling)
        if tools:
            args["tools"] = tools
        return [self._one(messages, args) for _ in range(int(sampling.get("n", 1)))]

    def _one(self, messages: Sequence[Mapping], args: dict[str, Any]) -> Reply:
        import openai

        try:
            response = self.openai.chat.completions.create(messages=list(messages), **args)
        except openai.OpenAIError as e:
            raise WorkflowError(
                f"external model {self.model_name} at {self.endpoint.base_url}: "
                f"{type(e).__name__}: {e}"
            ) from e
        choice = response.choices[0]
        usage = getattr(response, "usage", None)
        extra = choice.message.model_extra or {}
        calls = [c.model_dump() for c in choice.message.tool_calls or []]
        return Reply(
            text=choice.message.content or "",
            finish_reason=choice.finish_reason or "stop",
            completion_tokens=getattr(usage, "completion_tokens", None),
            reasoning=extra.get("reasoning_content"),
            tool_calls=calls or None,
        )


def request_args(model_name: str, sampling: Mapping[str, Any]) -> dict[str, Any]:
    """A chat completion's arguments for vLLM sampling keywords: the OpenAI ones under their
    names, other keywords that change something in ``extra_body`` (vLLM's server reads them;
    other servers may refuse them: the workflow asked for them)."""
    args: dict[str, Any] = {"model": model_name}
    extra: dict[str, Any] = {}
    for key, value in sampling.items():
        if value is None or key in NOT_SENT or NO_EFFECT.get(key, object()) == value:
            continue
        if key == "max_tokens":
            args["max_completion_tokens"] = value
        elif key == "stop":
            if value:
                args["stop"] = [value] if isinstance(value, str) else list(value)
        elif key in OPENAI_KEYS:
            args[key] = value
        else:
            extra[key] = value
    if extra:
        args["extra_body"] = extra
    return args


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


# ----------------------------------------------------------------------------- the model handle


class ExternalModel:
    """A workflow's model handle (Trinity's ``ModelWrapper``) answered by the endpoint. Replies
    carry text and no tokens: :meth:`logprobs` and token counts are refused, and the workflow's
    own OpenAI clients talk to the endpoint directly."""

    enable_history = False

    def __init__(self, client: ExternalClient, defaults: GenerationConfig):
        self.client = client
        self.defaults = defaults  # the task's rollout_args
        self.calls: list[Experience] = []  # every reply, for extract_experience_from_history
        self.model_calls = 0
        self.cancelled: Optional[str] = None
        self.openai_client: Any = None
        self.openai_async_client: Any = None

    def chat(self, messages: Sequence[Mapping], **kwargs: Any) -> list[Experience]:
        """``n`` replies to ``messages``; keywords as :meth:`rft.workflow.ModelWrapper.chat`."""
        sampling = sampling_keywords(
            self.defaults,
            {k: v for k, v in kwargs.items() if k not in HANDLE_KEYS},
            HANDLE_KEYS,
        )
        self.model_calls += 1
        replies = [
            _experience(r) for r in self.client.chat(messages, sampling, kwargs.get("tools"))
        ]
        self.calls.extend(replies)
        return replies

    async def chat_async(self, messages: Sequence[Mapping], **kwargs: Any) -> list[Experience]:
        return await asyncio.to_thread(self.chat, messages, **kwargs)

    def generate(self, prompts: Sequence[str], **kwargs: Any) -> list[Experience]:
        """Each prompt as one user message (an endpoint serves chat models; as Trinity's
        external engine)."""
        return [e for p in prompts for e in self.chat([{"role": "user", "content": p}], **kwargs)]

    async def generate_async(self, prompts: Sequence[str], **kwargs: Any) -> list[Experience]:
        return await asyncio.to_thread(self.generate, prompts, **kwargs)

    def logprobs(self, tokens: Sequence[int], temperature: Optional[float] = None) -> Any:
        raise WorkflowError(_NO_TOKENS.format(what="log-probs"))

    async def logprobs_async(self, tokens: Sequence[int], temperature: Any = None) -> Any:
        return self.logprobs(tokens, temperature)

    async def get_message_token_len(self, messages: Sequence[Mapping]) -> int:
        raise WorkflowError(_NO_TOKENS.format(what="token counts"))

    def convert_messages_to_experience(
        self, messages: Sequence[Mapping], tools: Optional[list] = None, temperature: Any = None
    ) -> Experience:
        """The conversation's last assistant message as a reply (text only, as Trinity's)."""
        last = messages[-1] if messages else {}
        text = last.get("content") if last.get("role") == "assistant" else ""
        return _experience(Reply(text if isinstance(text, str) else "", "stop", None))

    async def convert_messages_to_experience_async(
        self, messages: Any, tools: Any = None, temperature: Any = None
    ) -> Experience:
        return self.convert_messages_to_experience(messages, tools, temperature)

    def extract_experience_from_history(self, clear_history: bool = True) -> list[Experience]:
        out = list(self.calls)
        if clear_history:
            self.calls.clear()
        return out

    def clone_with_isolated_history(self) -> "ExternalModel":
        clone = copy.copy(self)
        clone.calls = []
        return clone

    @property
    def model_version(self) -> int:
        return 0  # the endpoint's model: the bench's step 0

    @property
    async def model_version_async(self) -> int:
        return 0

    @property
    def model_path(self) -> str:
        """The model name to send the endpoint (``model.external_model.model_name``)."""
        return self.client.model_name

    model_name = model_path

    @property
    def base_url(self) -> str:
        return self.client.endpoint.base_url

    @property
    def api_key(self) -> str:
        return self.client.endpoint.api_key

    def set_api_key(self, api_key: str) -> None:
        """No effect: calls carry the key of ``model.external_model.api_key_env``."""

    def get_openai_client(self) -> Any:
        """An ``openai.OpenAI`` client on the endpoint itself (its calls are not recorded)."""
        if self.openai_client is None:
            import openai

            self.openai_client = openai.OpenAI(base_url=self.base_url, api_key=self.api_key)
        self.openai_client.model_path = self.model_path
        return self.openai_client

    def get_openai_async_client(self) -> Any:
        if self.openai_async_client is None:
            import openai

            self.openai_async_client = openai.AsyncOpenAI(
                base_url=self.base_url, api_key=self.api_key
            )
        self.openai_async_client.model_path = self.model_path
        return self.openai_async_client


_NO_TOKENS = (
    "model.external_model: an OpenAI-compatible endpoint returns text, not {what}; a bench of "
    "an external model runs workflows that read replies' text only"
)


def _experience(reply: Reply) -> Experience:
    """A reply as a workflow sees it: text, no tokens; the usage count in ``info``."""
    return Experience(
        response_text=reply.text,
        content=reply.text,
        reasoning_content=reply.reasoning,
        tool_calls=reply.tool_calls or [],
        finish_reason=reply.finish_reason,
        truncate_status="response_truncated" if reply.finish_reason == "length" else None,
        model_version=0,
        info={COMPLETION_TOKENS: reply.completion_tokens},
    )


# ----------------------------------------------------------------------------- evaluation

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
