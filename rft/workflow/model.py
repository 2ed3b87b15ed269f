"""The model handle a workflow talks to (Trinity-RFT's ``ModelWrapper``): ``chat``/``generate``
and their async twins, answered by the explorer's engine with the current weights.

Data in: messages or prompt strings from one episode. Data out: Trinity-shaped
:class:`~rft.workflow.experience.Experience` replies, and the episode's token-faithful samples
(:class:`~rft.workflow.conversation.History`). Requests go to a :class:`GenerationService`
(the explorer batches the calls of every running episode into one engine call).
"""

from __future__ import annotations

import asyncio
import dataclasses
from concurrent.futures import Future
from typing import Any, Callable, Optional, Protocol, Sequence

from rft.errors import WorkflowError
from rft.workflow.conversation import ChatTemplate, Completion, History, Messages, Thread
from rft.workflow.experience import Experience
from rft.workflow.task import GenerationArgs

CALL_KEYS = frozenset(f.name for f in dataclasses.fields(GenerationArgs)) | {"stop", "tools"}


class EpisodeCancelled(WorkflowError):
    """The episode ran past its time (``explorer.max_timeout``) or the explorer is stopping."""


class GenerationService(Protocol):
    """What the handle needs from the explorer."""

    max_model_len: Optional[int]  # prompt + response tokens the engine holds

    def submit(
        self, prompt_ids: list[int], args: GenerationArgs, stop: Sequence[str]
    ) -> "Future[list[Completion]]": ...

    def parse_tool_calls(self, text: str, tools: list) -> tuple[str, list[dict]]: ...

    def parse_reasoning(self, text: str) -> Optional[tuple[Optional[str], Optional[str]]]: ...


class ModelWrapper:
    """One episode's view of the rollout model."""

    enable_history = True  # Trinity's flag: calls are recorded (always, here)

    def __init__(
        self, service: GenerationService, template: ChatTemplate, defaults: GenerationArgs
    ):
        self.service = service
        self.template = template
        self.defaults = defaults  # the task's rollout_args
        self.history = History(template)
        self.calls: list[Experience] = []  # every reply, for extract_experience_from_history
        # Earlier parts of conversations a prefix break split (the explorer trains them too).
        self.split_samples: list[Experience] = []
        self.model_calls = 0
        self.cancelled: Optional[str] = None  # why the explorer stopped the episode
        self.time_limit_s: Optional[float] = None  # the episode's limit (explorer.max_timeout)
        # The explorer's OpenAI-compatible endpoint (rft.workflow.endpoint), started on demand
        # by get_openai_client()/api_key; None where the explorer offers none.
        self.endpoint_factory: Optional[Callable[[], Any]] = None
        self.run_name = "run"  # names this task run in its API key
        self._api_key: Optional[str] = None

    # -- chat

    def chat(self, messages: Messages, **kwargs: Any) -> list[Experience]:
        """``n`` replies to ``messages`` (OpenAI-style dicts; ``tools=`` OpenAI tool schemas)."""
        future, finish = self._submit_chat(messages, kwargs)
        return [reply for reply, _ in finish(future.result())]

    async def chat_async(self, messages: Messages, **kwargs: Any) -> list[Experience]:
        future, finish = self._submit_chat(messages, kwargs)
        return [reply for reply, _ in finish(await asyncio.wrap_future(future))]

    def generate(self, prompts: Sequence[str], **kwargs: Any) -> list[Experience]:
        """Replies to raw prompt strings (no chat template), ``n`` per prompt, in order."""
        pending = [self._submit_text(p, kwargs) for p in prompts]
        return [e for future, finish in pending for e in finish(future.result())]

    async def generate_async(self, prompts: Sequence[str], **kwargs: Any) -> list[Experience]:
        pending = [self._submit_text(p, kwargs) for p in prompts]
        results = await asyncio.gather(*(asyncio.wrap_future(f) for f, _ in pending))
        return [e for (_, finish), r in zip(pending, results) for e in finish(r)]

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
        return self._api_key

    @property
    def model_name(self) -> str:
        return self._endpoint().model_name

    def get_openai_client(self) -> Any:
        """An ``openai.OpenAI`` client whose calls are this episode's (recorded, trained)."""
        import openai

        return openai.OpenAI(
            base_url=self.base_url,
            api_key=self.api_key,
            max_retries=0,
            http_client=self._endpoint().http_client(),
        )

    def get_openai_async_client(self) -> Any:
        import openai

        return openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=0)

    def close_endpoint_key(self) -> None:
        """The episode ended: its key stops working."""
        if self._api_key is not None:
            self._endpoint().unregister(self._api_key)

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

    def _args(self, kwargs: dict[str, Any]) -> tuple[GenerationArgs, list[str], Optional[list]]:
        unknown = sorted(set(kwargs) - CALL_KEYS)
        if unknown:
            raise WorkflowError(
                f"model call with unknown argument(s) {unknown}; the model handle "
                f"takes {sorted(CALL_KEYS)}"
            )
        fields = {k: v for k, v in kwargs.items() if k not in ("stop", "tools") and v is not None}
        stop = kwargs.get("stop") or []
        return (
            dataclasses.replace(self.defaults, **fields),
            [stop] if isinstance(stop, str) else list(stop),
            kwargs.get("tools") or None,
        )

    def _check(self) -> None:
        if self.cancelled:
            raise EpisodeCancelled(self.cancelled)
        self.model_calls += 1

    def _room(self, prompt_ids: list[int], args: GenerationArgs) -> Optional[GenerationArgs]:
        """``args`` with max_tokens cut to what fits in max_model_len; None if nothing fits."""
        limit = self.service.max_model_len
        if limit is None:
            return args
        room = limit - len(prompt_ids)
        return (
            None if room < 1 else dataclasses.replace(args, max_tokens=min(args.max_tokens, room))
        )

    def _submit_chat(self, messages: Messages, kwargs: dict[str, Any], as_openai: bool = False):
        self._check()
        args, stop, tools = self._args(kwargs)
        messages = [dict(m) for m in messages]
        continue_final = bool(messages) and messages[-1].get("role") == "assistant"
        prompt_ids, parent = self.history.prompt_for(messages, tools, continue_final)
        fitted = self._room(prompt_ids, args)
        future = (
            _nothing_to_wait_for()
            if fitted is None
            else self.service.submit(prompt_ids, fitted, stop)
        )

        def finish(completions: list[Completion]) -> list[tuple[Experience, Optional[Thread]]]:
            """Each reply with the thread that recorded it (None: answered without the engine)."""
            if fitted is None:
                return [(_prompt_truncated(prompt_ids), None) for _ in range(args.n)]
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
            self.calls.extend(reply for reply, _ in recorded)
            return recorded

        return future, finish

    def _submit_text(self, prompt: str, kwargs: dict[str, Any]):
        self._check()
        args, stop, _ = self._args(kwargs)
        prompt_ids = self.template.encode(prompt)
        fitted = self._room(prompt_ids, args)
        future = (
            _nothing_to_wait_for()
            if fitted is None
            else self.service.submit(prompt_ids, fitted, stop)
        )

        def finish(completions: list[Completion]) -> list[Experience]:
            if fitted is None:
                return [_prompt_truncated(prompt_ids) for _ in range(args.n)]
            replies = [_reply(c, []) for c in completions]
            self.calls.extend(replies)
            return replies

        return future, finish


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
