"""Workflow classes in the streaming explorer: episodes whose model calls are engine requests.

Episodes run in threads (:class:`rft.explorer.episodes.EpisodePool`) across steps. Each model
call becomes an engine request that the streaming loop's thread adds, steps and hands back
(:class:`EngineCalls`), so the engine keeps generating for other steps while an episode waits
on a tool. A task's group is complete when all its episodes ended (:class:`StreamedEpisodes`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from rft.config.schema import Config
from rft.errors import WorkflowError
from rft.explorer import tasksets as T
from rft.explorer.auxiliary import auxiliary_models
from rft.explorer.engine import Engine, Sample
from rft.explorer.episodes import (
    EpisodePool,
    EpisodeResult,
    ModelCall,
    ModelCalls,
    episode_jobs,
    settle,
)
from rft.explorer.rollout import agent_endpoint, episode_task, episode_template, tool_parser
from rft.workflow.model import EpisodeCancelled

REQUEST_PREFIX = "episode:"  # engine request keys of episodes' model calls


class EngineCalls(ModelCalls):
    """Episodes' model calls as engine requests. Episode threads :meth:`submit`; the loop's
    thread (the only one touching the engine) :meth:`pump` s them into the engine and
    :meth:`resolve` s what :meth:`Engine.step` returns. An ended episode's calls are aborted."""

    def __init__(self, engine: Engine, cfg: Config):
        super().__init__(
            engine,
            0,
            engine.max_model_len,
            tool_parser(cfg),
            cfg.explorer.rollout_model.reasoning_parser,
        )
        self._live: dict[str, ModelCall] = {}  # request key -> call, in the engine
        self._aborts: list[str] = []  # keys of ended episodes' calls, still in the engine
        self._ids = itertools.count()

    def ended(self, episode: int) -> None:
        """The episode's thread is done or abandoned: its calls fail and leave the engine."""
        super().ended(episode)
        with self._lock:
            for key, r in self._live.items():
                if r.episode == episode and key not in self._aborts:
                    settle(r.future, error=EpisodeCancelled(f"episode {episode} ended"))
                    self._aborts.append(key)
            self._lock.notify_all()

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


@dataclass
class EpisodeGroup:
    """One task's episodes in the streaming explorer."""

    sealed_with: int  # the open step the group is sealed with
    key: str  # its key in that step (and in the spool)
    step: int  # the step its group id names (a carried slot keeps its own)
    slot: int
    taskset: T.Taskset
    task: T.Task
    waiting: set[int] = field(default_factory=set)  # episodes not ended yet
    results: list[EpisodeResult] = field(default_factory=list)


class StreamedEpisodes:
    """The workflow-class groups of a streaming explorer: their episodes (at most
    ``explorer.runner_per_model`` at once, each stopped at ``explorer.max_timeout`` and run
    again up to ``explorer.max_retry_times`` times; a group waits for its retries) and their
    engine calls."""

    def __init__(self, cfg: Config, engine: Engine, writer: str):
        self.writer = writer
        self.calls = EngineCalls(engine, cfg)
        self.pool = EpisodePool(
            self.calls,
            episode_template(cfg),
            concurrency=cfg.explorer.runner_per_model,
            timeout_s=cfg.explorer.max_timeout,
            max_retry_times=cfg.explorer.max_retry_times,
            endpoint=agent_endpoint(cfg),
            model_path=cfg.model.model_path,
            auxiliary=auxiliary_models(cfg),
        )
        self._groups: dict[int, EpisodeGroup] = {}  # episode id -> its group

    def start(
        self, sealed_with: int, key: str, step: int, slot: int, ts: T.Taskset, task: T.Task
    ) -> None:
        """Queue the episodes of one task (its group ``key`` of open step ``sealed_with``)."""
        workflow = ts.workflow_of(ts.rows[task.index])
        jobs = episode_jobs(slot, episode_task(ts, task, step, self.writer), workflow.cls)
        group = EpisodeGroup(sealed_with, key, step, slot, ts, task)
        group.waiting = set(self.pool.add(jobs))
        for i in group.waiting:
            self._groups[i] = group

    def label_version(self, version: int) -> None:
        """Weights ``version`` generates from now on (calls the engine did not label)."""
        self.calls.version = version

    @property
    def runs_in_flight(self) -> int:
        """Task runs of the episodes not ended yet."""
        return self.pool.unfinished_runs

    def poll(self) -> list[EpisodeGroup]:
        """Episodes started and stopped as due; the groups whose episodes have all ended."""
        complete = []
        for i in self.pool.poll():
            group = self._groups.pop(i)
            group.results.append(self.pool.pop(i))
            group.waiting.discard(i)
            if not group.waiting:
                complete.append(group)
        return complete

    def serve(self, engine_busy: bool, timeout_s: float) -> None:
        """Calls into the engine; with the engine idle, wait for one (at most ``timeout_s``)."""
        self.calls.pump()
        if not engine_busy and self._groups:
            self.calls.wait(timeout_s)
            self.calls.pump()
