"""Model calls of episodes (workflow runs) as requests of one engine.

Each episode's model handle (:class:`rft.workflow.model.ModelWrapper`) reaches the engine through
a channel (:meth:`EngineCalls.channel`): its calls are queued from the episode's thread and go
into the engine from the one thread that touches it (:class:`EngineCalls`), so calls of every
running episode, of every step, share the engine's batches. A call of an ended episode fails at
once (:class:`~rft.workflow.model.EpisodeCancelled`); one already in the engine is aborted.
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from rft.errors import WorkflowError
from rft.explorer.engine import Requests, Sample
from rft.explorer.tasksets import SamplingArgs
from rft.workflow.conversation import Completion
from rft.workflow.model import EpisodeCancelled

REQUEST_PREFIX = "episode:"  # engine request keys of episodes' model calls
CALL_WAIT_S = 0.05  # with the engine idle, longest the serving thread waits for a call


@dataclass
class ModelCall:
    """One model call of an episode, waiting for the engine."""

    episode: int
    prompt_ids: list[int]
    args: SamplingArgs
    future: Future
    version: Optional[int] = None  # weights loaded when it entered the engine


class EngineCalls:
    """Episodes' model calls as engine requests, and what every episode's model handle reaches
    through :meth:`channel` (the engine's tool-call and reasoning parsers, the length limit).
    Episode threads :meth:`submit`; one thread (the only one touching the engine: the explorer
    loop's, an auxiliary model's) :meth:`pump` s them into the engine and :meth:`resolve` s what
    its ``step`` returns (:meth:`serve_once`, when nothing else uses the engine). An ended
    episode's calls fail; those in the engine are aborted."""

    def __init__(
        self,
        engine: Requests,
        version: int = 0,
        tool_parser: Optional[str] = None,
        reasoning_parser: Optional[str] = None,
    ):
        self.engine = engine
        self.version = version  # of completions the engine did not label token by token
        self.max_model_len: Optional[int] = engine.max_model_len
        self.tool_parser = tool_parser
        self.reasoning_parser = reasoning_parser
        self._queued: list[ModelCall] = []  # calls not sent to the engine yet
        self._running: set[int] = set()  # episodes started and not ended
        self._live: dict[str, ModelCall] = {}  # request key -> call, in the engine
        self._aborts: list[str] = []  # keys of ended episodes' calls, still in the engine
        self._ids = itertools.count()
        self._lock = threading.Condition()

    def channel(self, episode: int) -> "_Channel":
        return _Channel(self, episode)

    def submit(self, episode: int, prompt_ids: list[int], sampling: Mapping[str, Any]) -> Future:
        """A call of ``episode``'s model handle (``sampling``: its vLLM SamplingParams
        keywords), queued; its future holds the completions (a call of an episode that ended
        fails at once: it never reaches the engine)."""
        request = ModelCall(episode, list(prompt_ids), SamplingArgs.of(sampling), Future())
        with self._lock:
            if episode not in self._running:
                settle(request.future, error=EpisodeCancelled(f"episode {episode} ended"))
                return request.future
            self._queued.append(request)
            self._lock.notify_all()
        return request.future

    def started(self, episode: int) -> None:
        with self._lock:
            self._running.add(episode)

    def ended(self, episode: int) -> None:
        """The episode's thread is done or abandoned: its calls fail (queued ones at once, those
        in the engine leave it at the next :meth:`pump`)."""
        with self._lock:
            self._running.discard(episode)
            for r in [r for r in self._queued if r.episode == episode]:
                self._queued.remove(r)
                settle(r.future, error=EpisodeCancelled(f"episode {episode} ended"))
            for key, r in self._live.items():
                if r.episode == episode and key not in self._aborts:
                    settle(r.future, error=EpisodeCancelled(f"episode {episode} ended"))
                    self._aborts.append(key)
            self._lock.notify_all()

    def completions(
        self, group: Sequence[Sample], version: Optional[int] = None
    ) -> list[Completion]:
        """The engine's samples for one call, as its model handle reads them: tokens the engine
        did not label are of ``version`` (default: :attr:`version`)."""
        return [
            Completion(
                s.prompt_ids,
                s.response_ids,
                s.logprobs,
                s.finish_reason,
                s.text,
                s.versions[0] if s.versions else self.version if version is None else version,
                s.versions,
                s.prompt_logprobs,
            )
            for s in group
        ]

    def parse_tool_calls(self, text: str, tools: list) -> tuple[str, list[dict]]:
        if self.tool_parser is None:
            return text, []
        return self.engine.parse_tool_calls(text, tools, self.tool_parser)

    def parse_reasoning(self, text: str) -> Optional[tuple[Optional[str], Optional[str]]]:
        if self.reasoning_parser is None:
            return None
        return self.engine.parse_reasoning(text, self.reasoning_parser)

    def pump(self) -> None:
        """Into the engine: the calls submitted since the last pump (a call the engine refuses
        fails alone, as a WorkflowError of its episode); out: ended episodes' calls."""
        with self._lock:
            queued, self._queued = self._queued, []
            aborts, self._aborts = self._aborts, []
            aborts = [key for key in aborts if self._live.pop(key, None) is not None]
            version = self.version  # with LoRA a call keeps this version's adapter to its end
        for key in aborts:
            self.engine.abort(key)
        for r in queued:
            key = f"{REQUEST_PREFIX}{next(self._ids)}"
            r.version = version
            try:
                self.engine.add(key, r.prompt_ids, r.args)
            except Exception as e:  # e.g. sampling arguments vLLM refuses
                settle(r.future, error=WorkflowError(f"the engine refused the model call: {e}"))
                continue
            with self._lock:
                self._live[key] = r

    def drain(self) -> None:
        """Every episode call out of the engine (none of them is awaited any more)."""
        with self._lock:
            keys, self._aborts = list(self._live), []
            self._live.clear()
        for key in keys:
            self.engine.abort(key)

    @staticmethod
    def owns(key: str) -> bool:
        return key.startswith(REQUEST_PREFIX)

    def resolve(self, key: str, samples: list[Sample]) -> None:
        """A finished request: its call answered (unless its episode ended meanwhile)."""
        with self._lock:
            request = self._live.pop(key, None)
            if key in self._aborts:  # ended in the same engine step: nothing left to abort
                self._aborts.remove(key)
        if request is not None:
            settle(request.future, self.completions(samples, request.version))

    @property
    def in_engine(self) -> int:
        """Samples of episodes' calls now in the engine."""
        with self._lock:
            return sum(r.args.n for r in self._live.values())

    def wait(self, timeout_s: float) -> None:
        """Until a call or an episode's end needs :meth:`pump`, at most ``timeout_s``."""
        with self._lock:
            if not (self._queued or self._aborts):
                self._lock.wait(timeout_s)

    def serve_once(self, timeout_s: float) -> None:
        """One round of an engine that serves these calls alone: the calls in, one engine step,
        its finished calls answered; with nothing in flight, wait for a call (at most
        ``timeout_s``)."""
        self.pump()
        if not self.engine.in_flight:
            self.wait(timeout_s)
            self.pump()
        if not self.engine.in_flight:
            return
        try:
            finished = self.engine.step()
        except Exception as e:  # the engine failed: its calls fail with it, the caller reports it
            self.fail(e)
            raise
        for key, samples in finished:
            self.resolve(key, samples)

    def fail(self, error: BaseException) -> None:
        """Every call in the engine fails with ``error`` and leaves it."""
        with self._lock:
            live, self._aborts = list(self._live.items()), []
            self._live.clear()
        for key, request in live:
            settle(request.future, error=error)
            self.engine.abort(key)


def settle(future: Future, result: Any = None, error: Optional[BaseException] = None) -> None:
    """Complete a call's future, unless it is done already: a workflow that stopped awaiting
    it (``asyncio.wait_for``) cancelled it, and its episode goes on without it."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass


@dataclass
class _Channel:
    """One episode's end of the service (what its model handle calls)."""

    service: EngineCalls
    episode: int

    @property
    def max_model_len(self) -> Optional[int]:
        return self.service.max_model_len

    @property
    def model_version(self) -> int:
        """The weights version the engine generates with now."""
        return self.service.version

    def submit(self, prompt_ids: list[int], sampling: Mapping[str, Any]) -> Future:
        return self.service.submit(self.episode, prompt_ids, sampling)

    def parse_tool_calls(self, text: str, tools: list) -> tuple[str, list[dict]]:
        return self.service.parse_tool_calls(text, tools)

    def parse_reasoning(self, text: str) -> Optional[tuple[Optional[str], Optional[str]]]:
        return self.service.parse_reasoning(text)
