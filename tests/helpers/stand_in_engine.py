"""Engines without vLLM for fast tests of the explorer's paths: the request API of
:class:`rft.explorer.engine.Requests` (add, step, abort, in_flight) answered by :meth:`reply`,
and the episode pool served by :class:`rft.explorer.calls.EngineCalls` on such an engine."""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

from rft.explorer.calls import CALL_WAIT_S, EngineCalls
from rft.explorer.engine import Sample
from rft.explorer.episodes import EpisodeJob, EpisodePool, EpisodeResult, episode_metrics
from rft.workflow.conversation import ChatTemplate


class StandInTokenizer:
    """A chat template and tokenizer in one line each (no model folder)."""

    def apply_chat_template(self, messages, **_kwargs) -> str:
        return " ".join(m["content"] for m in messages)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) % 97 + 3 for c in text[:16]]


class StandInEngine:
    """Every request added finishes at the next :meth:`step` with :meth:`reply`'s samples;
    ``prompts`` keeps each request's prompt ids, ``steps`` counts the engine steps."""

    max_model_len = 256

    def __init__(self) -> None:
        self.pending: dict[str, tuple[list[int], Any]] = {}
        self.prompts: list[list[int]] = []
        self.steps = 0

    def reply(self, prompt_ids: list[int], args: Any) -> list[Sample]:
        raise NotImplementedError

    @property
    def in_flight(self) -> int:
        return sum(args.n for _, args in self.pending.values())

    def add(self, key: str, prompt_ids: Sequence[int], args: Any) -> None:
        assert key not in self.pending, f"request {key!r} is already in flight"
        self.pending[key] = (list(prompt_ids), args)

    def abort(self, key: str) -> None:
        self.pending.pop(key, None)

    def step(self) -> list[tuple[str, list[Sample]]]:
        self.steps += 1
        done, self.pending = self.pending, {}
        out = []
        for key, (prompt, args) in done.items():
            self.prompts.append(prompt)
            out.append((key, self.reply(prompt, args)))
        return out

    # what the explorer loop asks besides requests
    def load_initial(self, cfg: Any) -> None:
        pass

    def check_parsers(self, *_parsers: Any) -> None:
        pass

    def reload(self, folder: Any) -> float:
        return 0.0

    def label_version(self, version: int) -> None:
        pass

    def may_reload(self) -> bool:
        return True

    def paused(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


class FixedEngine(StandInEngine):
    """Every prompt gets ``n`` replies ``text``, tokenized by ``template``."""

    def __init__(self, template: ChatTemplate, text: str):
        super().__init__()
        self.ids, self.text = template.encode(text), text

    def reply(self, prompt_ids: list[int], args: Any) -> list[Sample]:
        sample = Sample(list(prompt_ids), list(self.ids), [-0.1] * len(self.ids), "stop", self.text)
        return [sample] * args.n


def run_pool(
    jobs: Sequence[EpisodeJob], engine: Any, template: ChatTemplate, **pool: Any
) -> tuple[list[EpisodeResult], dict[str, Any]]:
    """``jobs`` run by an :class:`EpisodePool` (keywords ``pool``) whose calls are ``engine``'s
    requests, served until every episode ended; their results and episode metrics."""
    calls = EngineCalls(engine)
    episodes = EpisodePool(calls, template, **pool)
    ids = episodes.add(jobs)
    while not episodes.idle:
        episodes.poll()
        calls.serve_once(CALL_WAIT_S)
    results = [episodes.pop(i) for i in ids]
    return results, episode_metrics(results)
