"""Tasks of workflow classes in the explorer loop: each task's group of episodes.

Episodes run in threads (:class:`rft.explorer.episodes.EpisodePool`) across steps. Each model
call becomes an engine request that the loop's thread adds, steps and hands back
(:class:`rft.explorer.calls.EngineCalls`), so the engine keeps generating for other tasks while an
episode waits on a tool. A task's group is complete when all its episodes ended
(:class:`EpisodeGroups`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rft.config.schema import Config
from rft.explorer import tasksets as T
from rft.explorer.auxiliary import auxiliary_models
from rft.explorer.calls import EngineCalls
from rft.explorer.engine import Engine
from rft.explorer.episodes import EpisodePool, EpisodeResult, episode_jobs
from rft.explorer.groups import agent_endpoint, episode_task, episode_template, tool_parser


@dataclass
class EpisodeGroup:
    """One task's episodes."""

    sealed_with: int  # the open step the group is sealed with
    key: str  # its key in that step (and in the spool)
    step: int  # the step its group id names (a carried slot keeps its own)
    slot: int
    taskset: T.Taskset
    task: T.Task
    waiting: set[int] = field(default_factory=set)  # episodes not ended yet
    results: list[EpisodeResult] = field(default_factory=list)


class EpisodeGroups:
    """The workflow-class groups of the explorer loop (or of an evaluation): their episodes
    (at most ``explorer.runner_per_model`` at once, each stopped at ``explorer.max_timeout`` and
    run again up to ``explorer.max_retry_times`` times; a group waits for its retries) and their
    engine calls. The pool starts with the first task (its chat template loads then)."""

    def __init__(self, cfg: Config, engine: Engine, writer: str):
        self.cfg, self.writer = cfg, writer
        rollout = cfg.explorer.rollout_model
        self.calls = EngineCalls(engine, 0, tool_parser(cfg), rollout.reasoning_parser)
        self._pool: EpisodePool | None = None  # on the first task (the chat template loads)
        self._groups: dict[int, EpisodeGroup] = {}  # episode id -> its group

    @property
    def pool(self) -> EpisodePool:
        if self._pool is None:
            cfg = self.cfg
            self._pool = EpisodePool(
                self.calls,
                episode_template(cfg),
                concurrency=cfg.explorer.runner_per_model,
                timeout_s=cfg.explorer.max_timeout,
                max_retry_times=cfg.explorer.max_retry_times,
                endpoint=agent_endpoint(cfg),
                model_path=cfg.model.model_path,
                auxiliary=auxiliary_models(cfg),
            )
        return self._pool

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
        return self._pool.unfinished_runs if self._pool is not None else 0

    def poll(self) -> list[EpisodeGroup]:
        """Episodes started and stopped as due; the groups whose episodes have all ended."""
        complete: list[EpisodeGroup] = []
        if self._pool is None:
            return complete
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
