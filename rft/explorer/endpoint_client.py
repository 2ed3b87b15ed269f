"""A model handle answered by an OpenAI-compatible endpoint: the client
(:class:`ExternalClient`, one ``openai.OpenAI`` per endpoint) and the handle workflows call
(:class:`ExternalModel`, Trinity's ``ModelWrapper`` surface, text replies only).

Used by ``model.external_model`` in bench mode (:mod:`rft.explorer.external`) and by the
explorer tasks' handles on a shared auxiliary model (:mod:`rft.explorer.shared_auxiliary`).
Data in: an :class:`~rft.config.external.ExternalEndpoint`; data out: replies as
:class:`~rft.workflow.experience.Experience` objects with text and no token ids.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from rft.config.external import ExternalEndpoint
from rft.errors import RftError, WorkflowError
from rft.workflow.experience import Experience
from rft.workflow.model import HANDLE_KEYS, EpisodeCancelled
from rft.workflow.task import GenerationConfig, sampling_keywords

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


# ----------------------------------------------------------------------------- the model handle


class ExternalModel:
    """A workflow's model handle (Trinity's ``ModelWrapper``) answered by the endpoint. Replies
    carry text and no tokens: :meth:`logprobs` and token counts are refused, and the workflow's
    own OpenAI clients talk to the endpoint directly."""

    enable_history = False

    def __init__(
        self,
        client: ExternalClient,
        defaults: GenerationConfig,
        source: str = "model.external_model",
    ):
        self.client = client
        self.source = source  # what the endpoint is, for messages (a shared judge's config key)
        self.defaults = defaults  # the task's rollout_args
        self.calls: list[Experience] = []  # every reply, for extract_experience_from_history
        self.model_calls = 0
        self.cancelled: Optional[str] = None
        self.openai_client: Any = None
        self.openai_async_client: Any = None

    def chat(self, messages: Sequence[Mapping], **kwargs: Any) -> list[Experience]:
        """``n`` replies to ``messages``; keywords as :meth:`rft.workflow.ModelWrapper.chat`."""
        if self.cancelled:  # the explorer stopped the episode (its deadline, a step's end)
            raise EpisodeCancelled(self.cancelled)
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
        raise WorkflowError(_NO_TOKENS.format(source=self.source, what="log-probs"))

    async def logprobs_async(self, tokens: Sequence[int], temperature: Any = None) -> Any:
        return self.logprobs(tokens, temperature)

    async def get_message_token_len(self, messages: Sequence[Mapping]) -> int:
        raise WorkflowError(_NO_TOKENS.format(source=self.source, what="token counts"))

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
        """No effect: calls carry the endpoint's own key (``model.external_model.api_key_env``,
        a shared judge's address file)."""

    def close_endpoint_key(self) -> None:
        """No effect: the endpoint's key belongs to no episode, so nothing closes with one."""

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
    "{source}: an OpenAI-compatible endpoint returns text, not {what}; call it from workflows "
    "that read replies' text only"
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
