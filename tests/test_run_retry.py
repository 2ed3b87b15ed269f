"""``explorer.max_retry_times`` (Trinity's): a workflow run that raises or runs past
``explorer.max_timeout`` runs again, the same task run from the start, up to that many times;
a run that then succeeds is a success, one that fails every time is a failed run (counted,
``episodes/first_error``, the stop rule). Real workflow classes on stand-in engines (no vLLM), in
:class:`rft.explorer.episodes.EpisodePool`, where the retry lives, and through the explorer
loop's :class:`rft.explorer.episode_groups.EpisodeGroups`."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import pytest

from rft.errors import ConfigError
from rft.explorer import episodes as E
from rft.explorer.episodes import episode_jobs, episode_metrics
from rft.explorer.failures import FailureGuard
from rft.monitor import (
    EPISODE_ERRORS,
    EPISODE_FAILED,
    EPISODE_FIRST_ERROR,
    EPISODE_RETRIED,
    EPISODE_TIMEOUTS,
    EPISODES,
)
from rft.workflow import Workflow
from rft.workflow.conversation import ChatTemplate
from rft.workflow.task import GenerationConfig, Task
from tests.helpers.runs import agent_cfg, write_jsonl
from tests.helpers.stand_in_engine import FixedEngine, run_pool

REPLY = "4"


class Attempts:
    """Each run's attempts, as the workflow records them in ``raw_task["log"]`` (a folder): one
    JSON line per attempt in ``run<run_id>.jsonl``."""

    @staticmethod
    def record(task: Task, **extra) -> int:
        path = Path(task.raw_task["log"]) / f"run{task.run_id}.jsonl"
        with path.open("a") as f:
            f.write(json.dumps({"task": task.task_id, "run": task.run_id, **extra}) + "\n")
        return len(path.read_text().splitlines())  # this attempt's number, from 1

    @staticmethod
    def of(folder: Path) -> dict[int, list[dict]]:
        return {
            int(p.stem[3:]): [json.loads(line) for line in p.read_text().splitlines()]
            for p in sorted(folder.glob("run*.jsonl"))
        }


class FailsFirst(Workflow):
    """One model call; the first attempt of each run then raises (a flaky environment)."""

    def run(self):
        attempt = Attempts.record(self.task, max_tokens=self.task.rollout_args.max_tokens)
        reply = self.model.chat([{"role": "user", "content": self.task.task_desc}])[0]
        if attempt == 1:
            raise ConnectionError("environment reset the connection")
        reply.reward = 1.0
        return [reply]


class Answers(Workflow):
    """One model call, rewarded: every attempt succeeds."""

    def run(self):
        Attempts.record(self.task)
        reply = self.model.chat([{"role": "user", "content": self.task.task_desc}])[0]
        reply.reward = 1.0
        return [reply]


class AlwaysFails(Workflow):
    """One model call, then raises: every attempt fails."""

    def run(self):
        Attempts.record(self.task)
        self.model.chat([{"role": "user", "content": self.task.task_desc}])
        raise ValueError("the environment is broken")


class HangsFirst(Workflow):
    """The first attempt of each run talks to the model until the explorer stops it (it runs
    past explorer.max_timeout); later attempts answer once."""

    def run(self):
        attempt = Attempts.record(self.task)
        while True:
            reply = self.model.chat([{"role": "user", "content": self.task.task_desc}])[0]
            if attempt > 1:
                reply.reward = 1.0
                return [reply]
            time.sleep(0.01)


STALE_DONE: dict[str, threading.Event] = {}  # log folder -> set when the first attempt returned


class StuckFirst(Workflow):
    """The first attempt sleeps outside model calls past the deadline and its grace (the pool
    abandons its thread) and returns while the retry still runs; the retry calls the model
    before and after that, and must not be ended by the abandoned thread's exit."""

    def run(self):
        attempt = Attempts.record(self.task)
        done = STALE_DONE[self.task.raw_task["log"]]
        if attempt == 1:
            time.sleep(1.5)
            done.set()
            return []
        self.model.chat([{"role": "user", "content": "before"}])
        assert done.wait(5)
        time.sleep(0.2)  # the abandoned thread's cleanup runs meanwhile
        reply = self.model.chat([{"role": "user", "content": "after"}])[0]
        reply.reward = 1.0
        return [reply]


@pytest.fixture(scope="module")
def template(smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    return ChatTemplate(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir))


def task(workflow: type, log: Path, repeat_times: int = 2, task_id: str = "t/0") -> Task:
    log.mkdir(parents=True, exist_ok=True)
    return Task(
        workflow=workflow,
        repeat_times=repeat_times,
        raw_task={"question": "2+2?", "log": str(log)},
        rollout_args=GenerationConfig(max_tokens=8),
        task_id=task_id,
    )


def run_batch(template, tasks: list[Task], retries: int, timeout_s: float = 30):
    """The tasks' episodes in a pool on a stand-in engine; (results, metrics)."""
    jobs = [j for slot, t in enumerate(tasks) for j in episode_jobs(slot, t, t.workflow)]
    engine = FixedEngine(template, REPLY)
    return run_pool(
        jobs, engine, template, concurrency=4, timeout_s=timeout_s, max_retry_times=retries
    )


def test_a_run_that_fails_once_runs_again_and_counts_as_a_success(template, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=E.__name__)
    results, metrics = run_batch(template, [task(FailsFirst, tmp_path)], retries=2)
    assert [r.ok for r in results] == [True, True]
    assert [r.retries for r in results] == [1, 1]
    assert all(len(r.experiences) == 1 and r.experiences[0].reward == 1.0 for r in results)
    assert metrics[EPISODES] == 2 and metrics[EPISODE_RETRIED] == 2
    assert metrics[EPISODE_FAILED] == 0 and metrics[EPISODE_TIMEOUTS] == 0
    assert EPISODE_FIRST_ERROR not in metrics  # nothing failed in the end
    # the same task run again, from the start: same run id, same sampling settings
    attempts = Attempts.of(tmp_path)
    assert attempts == {run: [{"task": "t/0", "run": run, "max_tokens": 8}] * 2 for run in (0, 1)}
    retried = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retried) == 2  # one line per retry, with the error
    assert all("\n" not in line for line in retried)
    assert all(
        "task t/0 (retry 1 of explorer.max_retry_times=2)" in line
        and "FailsFirst: ConnectionError: environment reset the connection" in line
        for line in retried
    )


def test_a_run_failing_every_attempt_is_a_failed_run_and_feeds_the_stop_rule(template, tmp_path):
    results, metrics = run_batch(template, [task(AlwaysFails, tmp_path)], retries=2)
    assert [len(a) for a in Attempts.of(tmp_path).values()] == [3, 3]  # 1 + 2 retries
    assert [r.ok for r in results] == [False, False] and [r.retries for r in results] == [2, 2]
    assert metrics[EPISODE_FAILED] == 2 and metrics[EPISODE_RETRIED] == 2
    error = "AlwaysFails on task t/0: ValueError: the environment is broken"
    assert metrics[EPISODE_FIRST_ERROR] == error
    assert metrics[EPISODE_ERRORS] == {"AlwaysFails: ValueError: the environment is broken": 2}
    guard = FailureGuard(max_failed_steps=2, max_failed_share=1.0, window_steps=4)
    failed = metrics[EPISODE_FAILED] + metrics[EPISODE_TIMEOUTS]
    assert guard.observe(1, metrics[EPISODES], failed, metrics[EPISODE_FIRST_ERROR]) is None
    reason = guard.observe(2, metrics[EPISODES], failed, metrics[EPISODE_FIRST_ERROR])
    assert reason is not None and error in reason


def test_max_retry_times_zero_runs_each_run_once(template, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=E.__name__)
    results, metrics = run_batch(template, [task(FailsFirst, tmp_path)], retries=0)
    assert [len(a) for a in Attempts.of(tmp_path).values()] == [1, 1]
    assert [r.ok for r in results] == [False, False] and [r.retries for r in results] == [0, 0]
    assert metrics[EPISODE_FAILED] == 2 and metrics[EPISODE_RETRIED] == 0
    assert "FailsFirst on task t/0: ConnectionError" in metrics[EPISODE_FIRST_ERROR]
    assert not [r for r in caplog.records if "retrying" in r.getMessage()]


def test_a_run_stopped_at_max_timeout_is_retried(template, tmp_path):
    results, metrics = run_batch(template, [task(HangsFirst, tmp_path)], retries=1, timeout_s=0.5)
    assert [r.ok for r in results] == [True, True] and [r.retries for r in results] == [1, 1]
    assert metrics[EPISODE_TIMEOUTS] == 0 and metrics[EPISODE_RETRIED] == 2
    assert [len(a) for a in Attempts.of(tmp_path).values()] == [2, 2]


def test_only_the_failed_run_runs_again(template, tmp_path):
    good, bad = task(Answers, tmp_path / "good"), task(AlwaysFails, tmp_path / "bad", 1, "t/1")
    results, metrics = run_batch(template, [good, bad], retries=1)
    assert [r.retries for r in results] == [0, 0, 1]
    assert [len(a) for a in Attempts.of(tmp_path / "good").values()] == [1, 1]
    assert metrics[EPISODES] == 3 and metrics[EPISODE_RETRIED] == 1
    assert metrics[EPISODE_FAILED] == 1
    assert metrics[EPISODE_FIRST_ERROR].startswith("AlwaysFails on task t/1")


def test_an_abandoned_attempts_thread_never_ends_its_retry(template, tmp_path, monkeypatch):
    """The first attempt is stuck outside model calls past max_timeout and the join grace; the
    pool gives up on its thread and retries. When the stale thread finally returns, its
    cleanup must not end the retry (which is mid-episode then) nor count as its result."""
    monkeypatch.setattr(E, "JOIN_GRACE_S", 0.1)
    STALE_DONE[str(tmp_path)] = threading.Event()
    t = task(StuckFirst, tmp_path, repeat_times=1)
    results, metrics = run_batch(template, [t], retries=1, timeout_s=1.0)
    [result] = results
    assert result.ok, result.error
    assert result.retries == 1 and metrics[EPISODE_RETRIED] == 1
    assert [len(a) for a in Attempts.of(tmp_path).values()] == [2]
    [exp] = result.experiences  # the retry's reply to its second call
    assert "after" in template.decode(list(exp.tokens)[: exp.prompt_length])


# ----------------------------------------------------------------------------- config, loops


@pytest.fixture
def cfg_for(tmp_path, vllm_model_dir):
    data = write_jsonl(tmp_path / "data" / "train.jsonl", [{"question": "2+2?", "answer": "4"}])

    def make(**explorer):
        return agent_cfg(tmp_path / "run", vllm_model_dir, data, "math_workflow", **explorer)

    return make


def test_max_retry_times_is_trinitys_key_with_its_default(cfg_for):
    assert cfg_for().explorer.max_retry_times == 2
    assert cfg_for(max_retry_times=0).explorer.max_retry_times == 0
    with pytest.raises(ConfigError, match="max_retry_times"):
        cfg_for(max_retry_times=-1)


@pytest.mark.parametrize("retries", [2, 0])
def test_the_explorer_loops_episodes_retry_as_configured(cfg_for, template, tmp_path, retries):
    from rft.explorer.episode_groups import EpisodeGroups

    cfg = cfg_for(max_retry_times=retries, runner_per_model=4)
    engine = FixedEngine(template, REPLY)
    episodes = EpisodeGroups(cfg, engine, "explorer-0")
    assert episodes.pool.max_retry_times == retries
    log = tmp_path / "log"
    ids = episodes.pool.add(episode_jobs(0, task(FailsFirst, log), FailsFirst))
    ended, deadline = [], time.monotonic() + 30
    while len(ended) < len(ids) and time.monotonic() < deadline:
        episodes.serve(engine_busy=bool(engine.pending), timeout_s=0.01)
        for key, samples in engine.step():
            episodes.calls.resolve(key, samples)
        ended += episodes.pool.poll()
        time.sleep(0.005)
    results = [episodes.pool.pop(i) for i in sorted(ended)]
    metrics = episode_metrics(results)
    assert len(results) == 2
    if retries:
        assert [r.ok for r in results] == [True, True]
        assert metrics[EPISODE_RETRIED] == 2 and metrics[EPISODE_FAILED] == 0
    else:
        assert metrics[EPISODE_RETRIED] == 0 and metrics[EPISODE_FAILED] == 2
    assert episodes.runs_in_flight == 0
