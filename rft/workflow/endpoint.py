"""An OpenAI-compatible chat endpoint per explorer process, so agent code written against the
OpenAI SDK (in process or as a subprocess) runs on the explorer's engine and is trained.

Data in: ``/v1/chat/completions`` and ``/v1/models`` requests whose API key names a running
episode, or a served key (:meth:`Endpoint.serve`: a shared judge's callers, each request a call
of its own). Data out: OpenAI-shaped answers (streamed too); each call is recorded in that episode's
:class:`~rft.workflow.model.ModelWrapper` history, the same token-faithful recording as
``model.chat``. A key whose episode ended is refused (nothing crosses task runs).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
import time
import uuid
from contextlib import AbstractContextManager, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator, Optional

from rft.errors import WorkflowError
from rft.workflow.experience import Experience
from rft.workflow.model import ModelWrapper, openai_message

log = logging.getLogger(__name__)

BIND_HOST_ENV = "RFT_ENDPOINT_HOST"  # address the endpoint listens on (default: loopback)
# Request fields answered as OpenAI documents them -> the model call's argument name.
_SAMPLING = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "n": "n",
    "max_tokens": "max_tokens",
    "max_completion_tokens": "max_tokens",
    "stop": "stop",
    "tools": "tools",
}
# Fields that change nothing here (bookkeeping of the client, or always true of this endpoint).
_IGNORED = frozenset(
    {
        "model",
        "messages",
        "stream",
        "stream_options",
        "user",
        "metadata",
        "store",
        "seed",
        "parallel_tool_calls",
        "logprobs",
        "top_logprobs",
        "frequency_penalty",
        "presence_penalty",
    }
)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Every running episode may connect at once (runner_per_model of them, each agent perhaps
    # several): the stdlib's backlog of 5 resets the rest.
    request_queue_size = 4096
    endpoint: "Endpoint"


class Endpoint:
    """The process's endpoint: one HTTP server on a free port (the OS picks it, so two explorers
    or two jobs on a node never clash), one API key per registered episode."""

    def __init__(self, model_name: str, host: Optional[str] = None):
        self.model_name = model_name
        self._models: dict[str, ModelWrapper] = {}
        # keys whose every request gets a handle of its own (an auxiliary server's callers)
        self._served: dict[str, Callable[[], AbstractContextManager[ModelWrapper]]] = {}
        self._lock = threading.Lock()
        self._http: Any = None
        self.calls = 0
        self.disconnects = 0  # answers the client did not stay for (their samples dropped)
        self._server = _Server((host or "127.0.0.1", 0), _Handler)
        self._server.endpoint = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="rft-endpoint", daemon=True
        )
        self._thread.start()
        host_, self.port = self._server.server_address[:2]
        self.base_url = f"http://{host_}:{self.port}/v1"
        log.info("OpenAI-compatible endpoint for agents at %s", self.base_url)

    def register(self, model: ModelWrapper, name: str, key: Optional[str] = None) -> str:
        """An API key for ``model``'s episode: a new one (``name``: the task run, for reading
        logs), or ``key`` as given (Trinity's ``set_api_key(task.api_key)``); WorkflowError
        when ``key`` is another live episode's."""
        key = key or f"rft-{name}-{secrets.token_hex(8)}"
        with self._lock:
            held = self._models.get(key)
            if held is not None and held is not model:
                raise WorkflowError(
                    f"API key {key!r} is another running episode's; give each task run its own "
                    "key (Trinity's task.api_key is <batch_id>/<task_id>/<run_id>)"
                )
            self._models[key] = model
        return key

    def unregister(self, key: str) -> None:
        with self._lock:
            self._models.pop(key, None)

    def model_for(self, key: str) -> Optional[ModelWrapper]:
        with self._lock:
            return self._models.get(key)

    def serve(self, key: str, opener: Callable[[], AbstractContextManager[ModelWrapper]]) -> None:
        """Answer each request that carries ``key`` with a handle of its own, which ``opener``
        opens before the request and closes after it: the calls of an auxiliary server's
        callers, which belong to no episode of this process and keep no history."""
        with self._lock:
            self._served[key] = opener

    @contextmanager
    def handle_for(self, key: str) -> Iterator[Optional[ModelWrapper]]:
        """The handle that answers a request with ``key``, for the request's duration: the
        registered episode's, a fresh one for a served key, None for an unknown key."""
        with self._lock:
            model, opener = self._models.get(key), self._served.get(key)
        if opener is None:
            yield model
            return
        with opener() as handle:
            yield handle

    def http_client(self) -> Any:
        """One HTTP client for every in-process OpenAI client of this endpoint: its connections
        are kept alive and reused, and it is built once (an SDK client per episode would each
        build their own)."""
        with self._lock:
            if self._http is None:
                import openai

                self._http = openai.DefaultHttpxClient()  # the SDK's pool: 1000 connections
            return self._http

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._http is not None:
            self._http.close()


_shared: Optional[Endpoint] = None
_shared_lock = threading.Lock()


def shared_endpoint(model_name: str) -> Endpoint:
    """This process's endpoint, started on first use."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Endpoint(model_name, os.environ.get(BIND_HOST_ENV))
        return _shared


def call_arguments(body: dict[str, Any]) -> dict[str, Any]:
    """The model call's arguments for a chat completion request; raises ``ValueError`` naming
    a field this endpoint cannot honour."""
    unknown = sorted(set(body) - set(_SAMPLING) - _IGNORED - {"tool_choice"})
    if unknown:
        raise ValueError(
            f"unsupported field(s) {unknown}; this endpoint takes {sorted(_SAMPLING)} "
            f"(and ignores {sorted(_IGNORED - {'messages'})})"
        )
    choice = body.get("tool_choice")
    if choice not in (None, "auto"):
        raise ValueError(
            f"tool_choice {choice!r} is not supported: leave it unset or 'auto' (the model "
            "decides; tool calls are read by explorer.rollout_model.tool_call_parser)"
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ValueError("messages must be a list of message objects")
    body["messages"] = [text_message(m) for m in messages]
    return {_SAMPLING[k]: v for k, v in body.items() if k in _SAMPLING and v is not None}


def text_message(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` with its ``content`` as one string: the OpenAI API also takes a list of
    content parts (AgentScope and others send ``[{"type": "text", "text": ...}]``); text parts
    are joined in order, any other part (image, audio, file) is a ``ValueError``."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind != "text" or not isinstance(part.get("text"), str):
            raise ValueError(
                f"a {message.get('role', '?')} message has a content part of type {kind!r}: "
                "this endpoint serves a text model and takes text parts only"
            )
        texts.append(part["text"])
    return {**message, "content": "".join(texts)}


def completion_body(model_name: str, replies: list[Experience]) -> dict[str, Any]:
    """The ``chat.completion`` object for a call's replies."""
    prompt_tokens = replies[0].prompt_length if replies else 0
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": [
            {
                "index": i,
                "message": openai_message(r),
                "finish_reason": finish_reason(r),
                "logprobs": None,
            }
            for i, r in enumerate(replies)
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": sum(len(r.tokens) - r.prompt_length for r in replies),
            "total_tokens": prompt_tokens + sum(len(r.tokens) - r.prompt_length for r in replies),
        },
    }


def finish_reason(reply: Experience) -> str:
    if reply.tool_calls:
        return "tool_calls"
    return "length" if reply.finish_reason == "length" else "stop"


def stream_chunks(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A completion as ``chat.completion.chunk`` events (the whole reply in one delta: the
    engine answers a call at once)."""
    base = {k: body[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    chunks = []
    for choice in body["choices"]:
        message = choice["message"]
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        if message.get("tool_calls"):
            delta["tool_calls"] = [
                {"index": j, **call} for j, call in enumerate(message["tool_calls"])
            ]
        chunks.append(
            base | {"choices": [{"index": choice["index"], "delta": delta, "finish_reason": None}]}
        )
        chunks.append(
            base
            | {
                "choices": [
                    {
                        "index": choice["index"],
                        "delta": {},
                        "finish_reason": choice["finish_reason"],
                    }
                ]
            }
        )
    return chunks


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        log.debug("endpoint: " + format, *args)

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        if self.path.rstrip("/") != "/v1/models":
            return self._error(
                404, f"no route {self.path}; routes: /v1/models, /v1/chat/completions"
            )
        with self.server.endpoint.handle_for(self._key()) as model:
            if model is None:
                return self._unknown_key()
        name = self.server.endpoint.model_name
        self._json(200, {"object": "list", "data": [{"id": name, "object": "model"}]})

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        if self.path.rstrip("/") != "/v1/chat/completions":
            return self._error(404, f"no route {self.path}; routes: /v1/chat/completions")
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            if not isinstance(body, dict):
                raise ValueError("the request body must be a JSON object")
            kwargs = call_arguments(body)
        except ValueError as e:
            return self._error(400, str(e))
        with self.server.endpoint.handle_for(self._key()) as model:
            if model is None:
                return self._unknown_key()
            self._answer(model, body, kwargs)

    def _answer(self, model: ModelWrapper, body: dict[str, Any], kwargs: dict[str, Any]) -> None:
        endpoint = self.server.endpoint
        try:
            recorded = model.chat_recorded(body["messages"], **kwargs)
        except WorkflowError as e:  # the episode was stopped, or a bad call
            return self._error(409, str(e))
        except Exception as e:  # noqa: BLE001 - the engine failed: the agent gets an answer
            log.warning("endpoint call failed: %s: %s", type(e).__name__, e)
            return self._error(500, f"the explorer could not answer: {type(e).__name__}: {e}")
        endpoint.calls += 1
        answer = completion_body(endpoint.model_name, [reply for reply, _ in recorded])
        for _, thread in recorded:
            if thread is not None:
                thread.call_id = answer["id"]
        try:
            if body.get("stream"):
                self._stream(answer)
            else:
                self._json(200, answer)
        except (BrokenPipeError, ConnectionResetError):
            # The agent left before reading its answer: it never continues from these turns.
            endpoint.disconnects += 1
            for _, thread in recorded:
                if thread is not None:
                    model.history.retract(thread)

    def _key(self) -> str:
        auth = self.headers.get("Authorization", "")
        return auth[len("Bearer ") :] if auth.startswith("Bearer ") else ""

    def _unknown_key(self) -> None:
        self._error(
            401,
            "unknown API key: use the key the workflow handed out for this task run "
            "(model.api_key); a run's key stops working when its episode ends",
        )

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, answer: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        for chunk in stream_chunks(answer):
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

    def _error(self, status: int, message: str) -> None:
        kind = {401: "authentication_error", 500: "server_error"}.get(
            status, "invalid_request_error"
        )
        self._json(status, {"error": {"message": message, "type": kind, "code": status}})
