"""The model handle a workflow talks to (Trinity-RFT's ``ModelWrapper``): ``chat``/``generate``
and their async twins, answered by the explorer's engine with the current weights; a
conversation's sample (``convert_messages_to_experience``), the model's log-probs of given
tokens, and OpenAI clients on the explorer's endpoint.

Data in: messages or prompt strings from one episode. Data out: Trinity-shaped
:class:`~rft.workflow.experience.Experience` replies, and the episode's token-faithful samples
(:class:`~rft.workflow.conversation.History`). Requests go to a :class:`GenerationService` as
vLLM ``SamplingParams`` keywords (the explorer batches the calls of every running episode into
one engine call).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import threading
from concurrent.futures import Future
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence

from rft.errors import WorkflowError
from rft.workflow.conversation import ChatTemplate, Completion, History, Messages, Thread
from rft.workflow.experience import EID, Experience
from rft.workflow.task import GenerationConfig, sampling_keywords

log = logging.getLogger(__name__)

HANDLE_KEYS = frozenset({"tools", "enable_recording"})  # the handle's own, not sampling

_warned: set[str] = set()  # workflow classes warned about re-tokenized messages
_warned_lock = threading.Lock()


class EpisodeCancelled(WorkflowError):
    """The episode ran past its time (``explorer.max_timeout``) or the explorer is stopping."""


class GenerationService(Protocol):
    """What the handle needs from the explorer."""

    max_model_len: Optional[int]  # prompt + response tokens the engine holds
    model_version: int  # the weights version the engine generates with now

    def submit(
        self, prompt_ids: list[int], sampling: Mapping[str, Any]
    ) -> "Future[list[Completion]]": ...

    def parse_tool_calls(self, text: str, tools: list) -> tuple[str, list[dict]]: ...

    def parse_reasoning(self, text: str) -> Optional[tuple[Optional[str], Optional[str]]]: ...


@dataclasses.dataclass
class _Episode:
    """What a handle shares with its clones (:meth:`ModelWrapper.clone_with_isolated_history`)."""

    cancelled: Optional[str] = None  # why the explorer stopped the episode
    model_calls: int = 0
    retokenized_turns: int = 0
    handles: list = dataclasses.field(default_factory=list)  # the handle and its clones
    # (earlier part of a converted conversation, the experience of the conversation's end)
    split: list = dataclasses.field(default_factory=list)


class ModelWrapper:
    """One episode's view of the rollout model."""

    enable_history = True  # Trinity's flag: calls are recorded (always, here)

    def __init__(
        self,
        service: GenerationService,
        template: ChatTemplate,
        defaults: GenerationConfig,
        model_path: str = "",
    ):
        self.service = service
        self.template = template
        self.defaults = defaults  # the task's rollout_args
        self._model_path = model_path  # model.model_path, as the explorer was configured
        self.history = History(template)
        self.calls: list[Experience] = []  # every reply, for extract_experience_from_history
        self.time_limit_s: Optional[float] = None  # the episode's limit (explorer.max_timeout)
        # The explorer's OpenAI-compatible endpoint (rft.workflow.endpoint), started on demand
        # by get_openai_client()/api_key; None where the explorer offers none.
        self.endpoint_factory: Optional[Callable[[], Any]] = None
        self.run_name = "run"  # names this task run in its API key
        self.workflow_cls: Optional[type] = None  # the episode's workflow (names its warnings)
        self.openai_client: Any = None  # Trinity's: made by get_openai_client(), then kept
        self.openai_async_client: Any = None
        self._api_key: Optional[str] = None
        self._keys: list[str] = []  # every key the endpoint knows this handle by
        self._version: Optional[int] = None  # of the latest reply
        self._episode = _Episode(handles=[self])

    # -- chat

    def chat(self, messages: Messages, **kwargs: Any) -> list[Experience]:
        """``n`` replies to ``messages`` (OpenAI-style dicts; ``tools=`` OpenAI tool schemas).

        Keywords: every :class:`GenerationConfig` field and any vLLM ``SamplingParams`` keyword
        (``stop``, ``repetition_penalty``, ``seed``, ``min_tokens``, ``stop_token_ids``...),
        over the task's ``rollout_args`` (None: the task's value); a name SamplingParams does
        not take is refused. rft's bookkeeping keeps: each reply's tokens with their log-probs
        (``logprobs`` asks for more top ones) and its text (``detokenize=False`` changes
        nothing); ``prompt_logprobs`` is not sent (a reply carries none: :meth:`logprobs`
        gives them); ``output_kind``, ``flat_logprobs``, ``stream_interval``, ``skip_clone``
        are the engine's and refused; greedy ``n`` > 1 is n greedy requests (vLLM refuses it);
        ``include_stop_str_in_output`` defaults to True (the text ends where the tokens do);
        ``max_tokens``/``min_tokens`` are cut to the room the context leaves.
        ``enable_recording`` (Trinity's) changes nothing: every call is recorded."""
        future, finish = self._submit_chat(messages, kwargs)
        return [reply for reply, _ in finish(future.result())]

    async def chat_async(self, messages: Messages, **kwargs: Any) -> list[Experience]:
        future, finish = self._submit_chat(messages, kwargs)
        return [reply for reply, _ in finish(await asyncio.wrap_future(future))]

    def generate(self, prompts: Sequence[str], **kwargs: Any) -> list[Experience]:
        """Replies to raw prompt strings (no chat template), ``n`` per prompt, in order;
        keywords as :meth:`chat`."""
        pending = [self._submit_text(p, kwargs) for p in prompts]
        return [e for future, finish in pending for e in finish(future.result())]

    async def generate_async(self, prompts: Sequence[str], **kwargs: Any) -> list[Experience]:
        pending = [self._submit_text(p, kwargs) for p in prompts]
        results = await asyncio.gather(*(asyncio.wrap_future(f) for f, _ in pending))
        return [e for (_, finish), r in zip(pending, results) for e in finish(r)]

    # -- tokens, log-probs, conversations

    async def get_message_token_len(self, messages: Messages) -> int:
        """Tokens of ``messages`` rendered by the chat template with the generation prompt:
        the prompt a chat call with them starts from (Trinity's; async as there)."""
        return len(self.template.encode(self.template.render(list(messages))))

    def logprobs(self, tokens: Sequence[int], temperature: Optional[float] = None) -> Any:
        """The model's log-prob of each token after the first given the ones before it: a
        float32 tensor [len(tokens) - 1], as Trinity's. The engine scores them (vLLM's prompt
        log-probs, the current weights) through this episode's calls. vLLM scores prompt
        tokens with the model's own distribution, so ``temperature`` (Trinity's argument; None:
        the task's) only reaches the one token the request samples, as on Trinity's engine."""
        return _tensor(self._submit_logprobs(tokens, temperature).result()[0].prompt_logprobs)

    async def logprobs_async(
        self, tokens: Sequence[int], temperature: Optional[float] = None
    ) -> Any:
        future = self._submit_logprobs(tokens, temperature)
        return _tensor((await asyncio.wrap_future(future))[0].prompt_logprobs)

    def convert_messages_to_experience(
        self,
        messages: Messages,
        tools: Optional[list] = None,
        temperature: Optional[float] = None,
    ) -> Experience:
        """The sample of a conversation, up to its last assistant message (Trinity's; reward
        left to the caller). This model's replies in this episode, as returned, keep the
        engine's tokens and log-probs, the template's tokens between them masked. Any other
        assistant message (edited by the workflow, or never the model's reply here) is
        re-tokenized with the chat template as Trinity does: trained (mask 1) with the engine's
        log-probs of its tokens now (:meth:`logprobs` at ``temperature``), counted in
        ``episodes/retokenized_turns``, warned once per workflow class. A template that
        re-renders history splits the conversation: the earlier parts are trained too, with
        this experience's reward (:attr:`split_samples`). ``tools``: the schemas it was
        rendered with (None: as its model calls were)."""
        pending, finish = self._submit_convert(messages, tools, temperature)
        return finish([future.result() for future in pending])

    async def convert_messages_to_experience_async(
        self,
        messages: Messages,
        tools: Optional[list] = None,
        temperature: Optional[float] = None,
    ) -> Experience:
        pending, finish = self._submit_convert(messages, tools, temperature)
        return finish(list(await asyncio.gather(*(asyncio.wrap_future(f) for f in pending))))

    # -- the model

    @property
    def model_version(self) -> int:
        """The weights version of this handle's latest reply; before any, the engine's now."""
        return self._version if self._version is not None else self.service.model_version

    @property
    async def model_version_async(self) -> int:
        return self.model_version

    @property
    def model_path(self) -> str:
        """The rollout model's path as the explorer was configured (``model.model_path``)."""
        return self._model_path

    @property
    def model_name(self) -> str:
        """The model name to send the endpoint: :attr:`model_path`, as Trinity's."""
        return self._model_path

    def clone_with_isolated_history(self) -> "ModelWrapper":
        """A handle on the same engine and episode (time limit, cancellation, counts) whose
        calls are recorded apart: its own :meth:`samples`, :meth:`extract_experience_from_history`
        and API key, new OpenAI clients (Trinity's)."""
        clone = copy.copy(self)
        clone.history = History(self.template)
        clone.calls = []
        clone.openai_client = clone.openai_async_client = None
        clone._api_key = clone._version = None
        clone._keys = []
        self._episode.handles.append(clone)
        return clone

    # -- the episode, shared with clones

    @property
    def cancelled(self) -> Optional[str]:
        """Why the explorer stopped the episode (its next model call raises), or None."""
        return self._episode.cancelled

    @cancelled.setter
    def cancelled(self, why: Optional[str]) -> None:
        self._episode.cancelled = why

    @property
    def model_calls(self) -> int:
        return self._episode.model_calls

    @property
    def retokenized_turns(self) -> int:
        """Assistant messages converted from the template's tokens (not the engine's)."""
        return self._episode.retokenized_turns

    @property
    def prefix_breaks(self) -> int:
        return sum(handle.history.prefix_breaks for handle in self._episode.handles)

    @property
    def split_samples(self) -> list[Experience]:
        """The earlier parts of converted conversations (a template that re-renders history
        split them), each with the reward, info (``split_part``), metrics and run of its
        conversation's last experience as they are now (the explorer reads them after the
        run and trains them too)."""
        for part, end in self._episode.split:
            part.reward, part.metrics = end.reward, dict(end.metrics)
            part.info = {**end.info, "split_part": True}
            part.eid = EID(run=end.eid.run, step=end.eid.step)
        return [part for part, _ in self._episode.split]

    # -- the OpenAI-compatible endpoint (agent code that speaks the OpenAI API)

    @property
    def base_url(self) -> str:
        """The endpoint's ``.../v1`` URL; calls with :attr:`api_key` are this episode's."""
        return self._endpoint().base_url

    @property
    def api_key(self) -> str:
        """This task run's key: calls carrying it are answered by the engine and recorded."""
        if self._api_key is None:
            self._api_key = self._endpoint().register(self, self.run_name)
            self._keys.append(self._api_key)
        return self._api_key

    def set_api_key(self, api_key: str) -> None:
        """Trinity's: calls carrying ``api_key`` are this episode's too (e.g. ``task.api_key``,
        as Trinity's workflows set it in ``reset``); its clients send it from now on. The key
        ends with the episode, like the one rft issued (:attr:`api_key`)."""
        if api_key == self._api_key:
            return
        self._endpoint().register(self, self.run_name, key=api_key)
        self._keys.append(api_key)
        self._api_key = api_key
        for client in (self.openai_client, self.openai_async_client):
            if client is not None:
                client.api_key = api_key

    def get_openai_client(self) -> Any:
        """An ``openai.OpenAI`` client whose calls are this episode's (recorded, trained),
        made once; its ``model_path`` is the model name to send (Trinity's attribute)."""
        if self.openai_client is None:
            import openai

            self.openai_client = openai.OpenAI(
                base_url=self.base_url,
                api_key=self.api_key,
                max_retries=0,
                http_client=self._endpoint().http_client(),
            )
        self.openai_client.model_path = self.model_path
        return self.openai_client

    def get_openai_async_client(self) -> Any:
        """An ``openai.AsyncOpenAI`` client, as :meth:`get_openai_client`."""
        if self.openai_async_client is None:
            import openai

            self.openai_async_client = openai.AsyncOpenAI(
                base_url=self.base_url, api_key=self.api_key, max_retries=0
            )
        self.openai_async_client.model_path = self.model_path
        return self.openai_async_client

    def close_endpoint_key(self) -> None:
        """The episode ended: its keys (its clones' too) stop working."""
        for handle in self._episode.handles:
            for key in handle._keys:
                handle._endpoint().unregister(key)

    def _endpoint(self) -> Any:
        if self.endpoint_factory is None:
            raise WorkflowError(
                "this model handle has no OpenAI-compatible endpoint: set "
                "explorer.rollout_model.enable_openai_api: true"
            )
        return self.endpoint_factory()

    def chat_recorded(
        self, messages: Messages, **kwargs: Any
    ) -> list[tuple[Experience, Optional[Thread]]]:
        """The endpoint's call: replies as :meth:`chat`, each with the thread that recorded it.
        The recorded assistant message is the one the endpoint returns (content without
        reasoning or tool-call markup, ``tool_calls``), as an agent sends it back."""
        future, finish = self._submit_chat(messages, kwargs, as_openai=True)
        return finish(future.result())

    # -- what the episode produced

    def extract_experience_from_history(self, clear_history: bool = True) -> list[Experience]:
        """The replies since the last call (Trinity's step-wise workflows: one step's replies)."""
        out = list(self.calls)
        if clear_history:
            self.calls.clear()
        return out

    def samples(self) -> list[Thread]:
        return self.history.samples()

    # -- internals

    def _sampling(self, kwargs: dict[str, Any]) -> tuple[dict[str, Any], Optional[list]]:
        """A call's vLLM SamplingParams keywords and its tools."""
        call = {k: v for k, v in kwargs.items() if k not in HANDLE_KEYS}
        return sampling_keywords(self.defaults, call, HANDLE_KEYS), kwargs.get("tools") or None

    def _check(self) -> None:
        if self.cancelled:
            raise EpisodeCancelled(self.cancelled)
        self._episode.model_calls += 1

    def _room(self, prompt_ids: list[int], sampling: dict[str, Any]) -> Optional[dict[str, Any]]:
        """``sampling`` with max_tokens (and min_tokens) cut to what fits in max_model_len
        (no max_tokens: all of it); None if nothing fits."""
        limit = self.service.max_model_len
        if limit is None:
            return sampling
        room = limit - len(prompt_ids)
        if room < 1:
            return None
        fitted = {**sampling, "max_tokens": min(sampling.get("max_tokens", room), room)}
        if fitted.get("min_tokens", 0) > fitted["max_tokens"]:
            fitted["min_tokens"] = fitted["max_tokens"]
        return fitted

    def _submit_chat(self, messages: Messages, kwargs: dict[str, Any], as_openai: bool = False):
        sampling, tools = self._sampling(kwargs)
        self._check()
        messages = [dict(m) for m in messages]
        continue_final = bool(messages) and messages[-1].get("role") == "assistant"
        prompt_ids, parent = self.history.prompt_for(messages, tools, continue_final)
        fitted = self._room(prompt_ids, sampling)
        future = (
            _nothing_to_wait_for() if fitted is None else self.service.submit(prompt_ids, fitted)
        )

        def finish(completions: list[Completion]) -> list[tuple[Experience, Optional[Thread]]]:
            """Each reply with the thread that recorded it (None: answered without the engine)."""
            if fitted is None:
                return [(_prompt_truncated(prompt_ids), None) for _ in range(sampling.get("n", 1))]
            recorded = []
            for completion in completions:
                split = self.service.parse_reasoning(completion.text)
                reasoning, content = split if split is not None else (None, completion.text)
                calls: list[dict] = []
                if tools:
                    content, calls = self.service.parse_tool_calls(content or "", tools)
                reply = _reply(completion, calls, reasoning, content)
                message = (
                    openai_message(reply)
                    if as_openai
                    else {"role": "assistant", "content": completion.text}
                )
                thread = self.history.record(
                    messages, tools, prompt_ids, parent, completion, message
                )
                recorded.append((reply, thread))
                self._version = completion.model_version
            self.calls.extend(reply for reply, _ in recorded)
            return recorded

        return future, finish

    def _submit_text(self, prompt: str, kwargs: dict[str, Any]):
        sampling, _ = self._sampling(kwargs)
        self._check()
        prompt_ids = self.template.encode(prompt)
        fitted = self._room(prompt_ids, sampling)
        future = (
            _nothing_to_wait_for() if fitted is None else self.service.submit(prompt_ids, fitted)
        )

        def finish(completions: list[Completion]) -> list[Experience]:
            if fitted is None:
                return [_prompt_truncated(prompt_ids) for _ in range(sampling.get("n", 1))]
            replies = [_reply(c, []) for c in completions]
            if completions:
                self._version = completions[-1].model_version
            self.calls.extend(replies)
            return replies

        return future, finish

    def _submit_logprobs(
        self, tokens: Sequence[int], temperature: Optional[float]
    ) -> "Future[list[Completion]]":
        """A one-token request whose prompt is ``tokens``, asking for the prompt's log-probs."""
        if self.cancelled:
            raise EpisodeCancelled(self.cancelled)
        ids = [int(t) for t in (tokens.tolist() if hasattr(tokens, "tolist") else tokens)]
        limit = self.service.max_model_len
        if limit is not None and len(ids) >= limit:
            raise WorkflowError(
                f"logprobs of {len(ids)} tokens: the engine scores at most max_model_len - 1 = "
                f"{limit - 1} (it samples one token after them)"
            )
        if temperature is None:
            temperature = self.defaults.temperature
        sampling = {"n": 1, "max_tokens": 1, "logprobs": 0, "prompt_logprobs": 0}
        sampling["temperature"] = 1.0 if temperature is None else temperature
        return self.service.submit(ids, sampling)

    def _submit_convert(self, messages: Messages, tools: Optional[list], temperature):
        """The scoring requests a conversation's sample needs, and how to finish it."""
        if self.cancelled:
            raise EpisodeCancelled(self.cancelled)
        parts = self.history.sample_of(messages, tools)
        if not parts:
            raise WorkflowError(
                "convert_messages_to_experience: the messages have no assistant message, "
                "nothing the model could be trained on"
            )
        limit = self.service.max_model_len
        cut: set[int] = set()
        for part in parts:
            if part.unscored and limit is not None and len(part.tokens) >= limit:
                part.cut(limit - 1)  # as Trinity: kept to what the engine scores
                cut.add(id(part))
        unscored = [part for part in parts if part.unscored]
        pending = [self._submit_logprobs(part.tokens, temperature) for part in unscored]

        def finish(results: list[list[Completion]]) -> Experience:
            for part, [scored] in zip(unscored, results):
                part.score(scored.prompt_logprobs, scored.model_version)
            self._retokenized(sum(part.retokenized_turns for part in parts))
            exps = [
                _sample(part, "response_truncated" if id(part) in cut else None) for part in parts
            ]
            self._episode.split += [(exp, exps[-1]) for exp in exps[:-1]]
            return exps[-1]

        return pending, finish

    def _retokenized(self, turns: int) -> None:
        """Count ``turns`` re-tokenized assistant messages; warn once per workflow class."""
        if not turns:
            return
        self._episode.retokenized_turns += turns
        cls = self.workflow_cls
        name = f"{cls.__module__}.{cls.__qualname__}" if cls is not None else "a workflow"
        with _warned_lock:
            first = name not in _warned
            _warned.add(name)
        if first:
            log.warning(
                "%s: %d assistant message(s) that were not this model's replies as returned "
                "(edited, or written by the workflow) were re-tokenized with the chat template "
                "and trained with the engine's log-probs, as Trinity does; "
                "episodes/retokenized_turns counts them (this warning: once per workflow class)",
                name,
                turns,
            )


def _tensor(values: list[float]) -> Any:
    import torch

    return torch.tensor(values, dtype=torch.float32)


def _nothing_to_wait_for() -> "Future[list[Completion]]":
    """The call's prompt leaves no room for a reply: it is answered without the engine."""
    future: Future = Future()
    future.set_result([])
    return future


def _prompt_truncated(prompt_ids: list[int]) -> Experience:
    """Trinity's reply to a prompt with no room left: no response, ``prompt_truncated``."""
    return Experience(
        tokens=prompt_ids,
        prompt_length=len(prompt_ids),
        logprobs=[],
        action_mask=[],
        response_text="",
        truncate_status="prompt_truncated",
        finish_reason="length",
    )


def _sample(thread: Thread, truncate_status: Optional[str]) -> Experience:
    """A conversation's sample as an experience (no reward yet)."""
    return Experience(
        tokens=thread.tokens,
        prompt_length=len(thread.prompt_ids),
        logprobs=list(thread.logprobs),
        action_mask=list(thread.action_mask),
        truncate_status=truncate_status,
        finish_reason=thread.finish_reason,
        model_version=min(thread.versions) if thread.versions else None,
        response_versions=list(thread.response_versions),
    )


def openai_message(reply: Experience) -> dict[str, Any]:
    """A reply as the OpenAI API's assistant message (content without reasoning or tool-call
    markup, ``tool_calls``, ``reasoning_content``): what the endpoint returns and records."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
        message["content"] = reply.content or None
    if reply.reasoning_content is not None:
        message["reasoning_content"] = reply.reasoning_content
    return message


def _reply(
    c: Completion,
    tool_calls: list[dict],
    reasoning: Optional[str] = None,
    content: Optional[str] = None,
) -> Experience:
    return Experience(
        tokens=c.prompt_ids + c.response_ids,
        prompt_length=len(c.prompt_ids),
        logprobs=c.logprobs,
        action_mask=[1] * len(c.response_ids),
        response_text=c.text,
        model_version=c.model_version,
        response_versions=c.versions or None,
        tool_calls=tool_calls,
        reasoning_content=reasoning,
        content=c.text if content is None else content,
        finish_reason=c.finish_reason,
        truncate_status="response_truncated" if c.finish_reason == "length" else None,
    )
