"""The explorer loop's admission rule (rft.explorer.steps), on a stand-in engine whose requests
take several engine steps: without overlap one step is in the engine at a time and weights load
only with the engine empty; with overlap (explorer.partial_rollout, mode explore) later steps
enter while earlier requests run and weights load between engine steps. Evaluation, rft-debug
and bench mode go through the same path (run_tasks)."""

from __future__ import annotations

import pytest

from rft.explorer import steps as S
from rft.explorer import tasksets as T
from rft.explorer.engine import Sample
from tests.helpers.explorer import arithmetic_rows, make_cfg, open_sets, taskset_dict
from tests.helpers.runs import read_segments, write_jsonl
from tests.helpers.stand_in_engine import StandInEngine, StandInTokenizer

STEPS = 4


class SlowAnswers(StandInEngine):
    """Answers "#### 1"; a request finishes after ``turns`` engine steps. Records the steps open
    in the engine at each add, and the samples in flight at each weights label."""

    tokenizer = StandInTokenizer()

    def __init__(self, turns: int = 3):
        super().__init__()
        self.turns, self.age = turns, {}
        self.open_at_add: list[set[str]] = []
        self.labels: list[tuple[int, int]] = []  # (version, samples in flight)

    def add(self, key, prompt_ids, args) -> None:
        super().add(key, prompt_ids, args)
        self.age[key] = 0
        self.open_at_add.append({k.split(":")[0] for k in self.pending})

    def step(self):
        self.steps += 1
        for key in self.pending:
            self.age[key] += 1
        done = [k for k in self.pending if self.age[k] >= self.turns]
        out = []
        for key in done:
            prompt, args = self.pending.pop(key)
            out.append((key, self.reply(prompt, args)))
        return out

    def reply(self, prompt_ids, args) -> list[Sample]:
        return [Sample(list(prompt_ids), [7], [-0.5], "stop", "#### 1") for _ in range(args.n)]

    def label_version(self, version: int) -> None:
        self.labels.append((version, self.in_flight))


def run(tmp_path, partial_rollout: bool) -> tuple[SlowAnswers, list[dict]]:
    from rft.explorer.loop import run_explorer

    rows = write_jsonl(tmp_path / "a.jsonl", arithmetic_rows(3 * STEPS))
    cfg = make_cfg(
        tmp_path,
        tmp_path,
        [taskset_dict(rows, "a")],
        buffer={"total_steps": STEPS},
        explorer={"partial_rollout": partial_rollout, "max_inflight_samples": 12},
    )
    engine = SlowAnswers()
    result = run_explorer(cfg, engine)
    assert result.steps == list(range(1, STEPS + 1))
    segments = read_segments(cfg.run_dir)["explorer-0"]
    assert sorted(segments) == result.steps and all(len(s) == 6 for s in segments.values())
    return engine, result.metrics


def test_without_overlap_one_step_is_in_the_engine_at_a_time(tmp_path, monkeypatch):
    monkeypatch.setattr(S, "WEIGHTS_POLL_S", 0.0)
    engine, metrics = run(tmp_path, partial_rollout=False)
    assert all(len(open_steps) == 1 for open_steps in engine.open_at_add)
    assert engine.labels and all(in_flight == 0 for _, in_flight in engine.labels)
    for m in metrics:  # one meaning each: the step's whole window, the engine's part of it
        assert 0 < m["generate_time_s"] <= m["step_time_s"]
        assert m["loop_tokens_per_s"] == pytest.approx(m["generated_tokens"] / m["step_time_s"])
        assert m["rollout/inflight_samples"] == 0 and m["tasks"] == 3


def test_with_overlap_later_steps_enter_while_earlier_requests_run(tmp_path, monkeypatch):
    monkeypatch.setattr(S, "WEIGHTS_POLL_S", 0.0)
    engine, metrics = run(tmp_path, partial_rollout=True)
    assert max(len(open_steps) for open_steps in engine.open_at_add) >= 2
    assert any(in_flight > 0 for _, in_flight in engine.labels)  # loaded between engine steps
    assert sum(m["generated_tokens"] for m in metrics) == STEPS * 6


def test_run_tasks_scores_a_list_of_tasks_through_the_loops_path(tmp_path):
    rows = write_jsonl(tmp_path / "a.jsonl", arithmetic_rows(4))
    cfg = make_cfg(tmp_path, tmp_path, [taskset_dict(rows, "a")])
    engine = SlowAnswers(turns=2)
    items = [(i, T.Task(0, i, 0)) for i in range(4)]
    exps, metrics = S.run_tasks(cfg, engine, open_sets(cfg), items, 7, 3, "eval")
    assert [e.group_id for e in exps] == [f"eval:7:{i}" for i in range(4) for _ in range(2)]
    assert {e.model_version for e in exps} == {3} and engine.in_flight == 0
    assert all("accuracy" in e.reward_parts for e in exps)  # scored by the taskset's reward
    assert metrics["tasks"] == 4 and metrics["generated_tokens"] == 8


def test_an_engine_step_that_fails_fails_the_calls_in_it():
    """An auxiliary model's serving thread: the engine raising fails the calls it held (their
    episodes see the error at once instead of running to max_timeout) and they leave it."""
    from rft.explorer.calls import EngineCalls

    class Broken(SlowAnswers):
        def step(self):
            raise RuntimeError("engine died")

    engine = Broken()
    calls = EngineCalls(engine)
    calls.started(0)
    future = calls.submit(0, [1, 2], {"max_tokens": 4})
    with pytest.raises(RuntimeError, match="engine died"):
        calls.serve_once(0.01)
    with pytest.raises(RuntimeError, match="engine died"):
        future.result(timeout=0)
    assert engine.in_flight == 0 and calls.in_engine == 0


def test_a_buffer_the_explorer_cannot_write_is_refused_before_the_engine_starts(
    tmp_path, monkeypatch
):
    """storage_type sql in a job on two nodes: refused with what to use, before vLLM starts."""
    from rft.errors import ConfigError
    from rft.explorer import loop

    def no_engine(cfg):
        raise AssertionError("the engine started before the buffer was checked")

    monkeypatch.setattr(loop, "Engine", no_engine)
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    rows = write_jsonl(tmp_path / "a.jsonl", arithmetic_rows(3))
    sql = {"storage_type": "sql", "path": f"sqlite:///{tmp_path}/buffer.db"}
    cfg = make_cfg(
        tmp_path,
        tmp_path,
        [taskset_dict(rows, "a")],
        buffer={"trainer_input": {"experience_buffer": sql}},
    )
    with pytest.raises(ConfigError, match="storage_type: sql needs every explorer"):
        loop.run_explorer(cfg)
