"""The streaming explorer (explorer.partial_rollout): engine requests across steps, weights
loaded in flight with every token's version recorded, groups spooled as they finish, kills."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from rft.buffer.experience import Experience
from rft.config.load import config_from_dict
from rft.explorer.engine import engine_kwargs
from rft.explorer.spool import GroupSpool, group_key
from tests.helpers.explorer import (
    arithmetic_rows,
    cfg_dict,
    make_cfg,
    merge,
    perturbed_copy,
    taskset_dict,
)
from tests.helpers.runs import REPO, read_segments, write_jsonl
from tests.helpers.stand_in_engine import StandInEngine


def record(task: str, group: str, n: int = 3) -> Experience:
    return Experience(
        task_id=task,
        group_id=group,
        prompt_ids=[1, 2],
        response_ids=list(range(n)),
        logprobs=[-0.5] * n,
    )


# ----------------------------------------------------------------------------- fast tests


def test_spool_keeps_groups_per_step_and_drops_sealed_ones(tmp_path):
    spool = GroupSpool(tmp_path, "explorer-0")
    a, b = [record("a/0", "w:2:0")], [record("a/1", "w:2:1"), record("a/1", "w:2:1")]
    spool.put(2, group_key(2, 0), a)
    spool.put(2, group_key(2, 1), b)
    spool.put(3, group_key(1, 4), [record("a/9", "w:1:4")])  # a carried slot of step 1
    kept = spool.take(2)
    assert sorted(kept) == ["2.0", "2.1"]
    assert [e.experience_id for e in kept["2.1"]] == [e.experience_id for e in b]
    assert kept["2.1"][1].response_ids == [0, 1, 2]
    assert list(spool.take(3)) == ["1.4"]
    # a torn file is not a group: removed, its group generated again; temporaries are ignored
    (spool.folder / "000003-3.0.jsonl").write_text('{"task_id": ')
    (spool.folder / "000003-3.1.jsonl.tmp").write_text("half")
    assert list(spool.take(3)) == ["1.4"]
    assert not (spool.folder / "000003-3.0.jsonl").exists()
    spool.drop(2)
    assert spool.take(2) == {} and list(spool.take(3)) == ["1.4"]


def test_config_refuses_what_streaming_cannot_do(tmp_path, vllm_model_dir, arithmetic_dir):
    from rft.config.queries import streams

    ts = [taskset_dict(arithmetic_dir / "a.jsonl", "a")]
    on = {"explorer": {"partial_rollout": True}}
    assert streams(make_cfg(tmp_path, vllm_model_dir, ts, **on))  # mode explore
    assert not streams(make_cfg(tmp_path, vllm_model_dir, ts, mode="both", **on))  # synchronous
    assert streams(
        make_cfg(tmp_path, vllm_model_dir, ts, mode="both", synchronizer={"sync_offset": 1}, **on)
    )
    lora = {"model": {"lora_configs": [{"lora_rank": 8, "lora_alpha": 16}]}}
    kwargs = engine_kwargs(make_cfg(tmp_path, vllm_model_dir, ts, **merge(on, lora)), True)
    assert (kwargs["max_loras"], kwargs["max_cpu_loras"]) == (2, 4)  # the old adapter finishes
    assert engine_kwargs(make_cfg(tmp_path, vllm_model_dir, ts, **lora), True)["max_loras"] == 1


def test_a_conversation_records_the_version_of_every_response_token():
    """A multi-turn sample's ``response_versions``: each model token its engine label (or its
    call's version when unlabelled), the tool tokens between turns their previous turn's."""
    from rft.workflow.conversation import Completion, History

    class Template:  # what History asks of a chat template, on a toy text-per-character scheme
        def render(self, messages, tools=None, add_generation_prompt=True, continue_final=False):
            text = "".join(f"<{m['role']}>{m['content']}" for m in messages)
            return text + ("<assistant>" if add_generation_prompt else "")

        def encode(self, text):
            return [ord(c) for c in text]

        def owed_after(self, response_ids):
            return ""

    history = History(Template())
    first = [{"role": "user", "content": "q"}]
    ids, parent = history.prompt_for(first)
    reply = {"role": "assistant", "content": "ab"}
    turn1 = Completion(ids, [97, 98, 99], [-0.1] * 3, "stop", "abc", 4, [4, 4, 5])
    thread = history.record(first, None, ids, parent, turn1, reply)
    second = first + [reply, {"role": "user", "content": "obs"}]
    ids2, parent2 = history.prompt_for(second)
    assert parent2 is thread
    turn2 = Completion(ids2, [100, 101], [-0.2] * 2, "stop", "de", 5)  # unlabelled: version 5
    thread2 = history.record(second, None, ids2, parent2, turn2, {"role": "assistant"})
    between = len(ids2) - len(thread.tokens)
    assert thread2.response_versions == [4, 4, 5] + [5] * between + [5, 5]
    assert len(thread2.response_versions) == len(thread2.response_ids)
    assert thread2.action_mask == [1, 1, 1] + [0] * between + [1, 1]


def test_a_call_its_workflow_stopped_awaiting_never_breaks_the_service():
    """A call cancelled by its workflow (asyncio.wait_for) is settled by nobody: the episode's
    end and the engine's answer leave it as it is; a call made after the episode ended fails
    at once instead of reaching the engine."""
    from rft.explorer.calls import EngineCalls
    from rft.workflow.model import EpisodeCancelled

    service = EngineCalls(StandInEngine())  # never pumped: no call reaches it
    service.started(0)
    call = service.submit(0, [1, 2], {})
    assert call.cancel()  # what asyncio.wrap_future does when the awaiting task is cancelled
    service.ended(0)  # would set_exception on the cancelled future
    late = service.submit(0, [1, 2], {})
    with pytest.raises(EpisodeCancelled):
        late.result(timeout=0)


def test_steps_sealed_together_share_the_window_by_tokens(monkeypatch):
    """Two steps sealed in one loop iteration: the seconds since the last seal, and the engine's
    seconds of them, are split by the tokens each generated (both show the window's rates); the
    window's loads and drops are the first's."""
    from rft.explorer import open_steps as S

    monkeypatch.setattr(S.time, "monotonic", lambda: 130.0)
    totals = S.Totals(since=100.0, engine_s=20.0, reload_s=2.0, discarded=7)
    steps = []
    for step, n in ((3, 30), (4, 10)):
        opened = S.OpenStep(step, [], None, version=1)
        opened.done["%d.0" % step] = [record("a/0", f"w:{step}:0", n)]
        steps.append(opened)

    (_, _, first), (_, _, second) = S.sealed_steps(steps, totals, in_flight=0)
    assert (first["step_time_s"], second["step_time_s"]) == pytest.approx((22.5, 7.5))
    assert (first["generate_time_s"], second["generate_time_s"]) == pytest.approx((15.0, 5.0))
    assert first["loop_tokens_per_s"] == second["loop_tokens_per_s"] == pytest.approx(40 / 30)
    assert first["generate_tokens_per_s"] == second["generate_tokens_per_s"] == pytest.approx(2.0)
    assert (first["reload_time_s"], first["rollout/tokens_discarded"]) == (2.0, 7)
    assert (second["reload_time_s"], second["rollout/tokens_discarded"]) == (0.0, 0)


def test_a_group_spans_versions_from_its_earliest_token_to_its_latest(
    tmp_path, vllm_model_dir, arithmetic_dir
):
    from rft.explorer.steps import too_wide

    ts = [taskset_dict(arithmetic_dir / "a.jsonl", "a")]
    cfg = make_cfg(
        tmp_path, vllm_model_dir, ts, explorer={"partial_rollout": True, "max_version_span": 1}
    )
    assert not too_wide(cfg, [[0, 0, 1], [1, 1]])
    assert too_wide(cfg, [[0, 0, 1], [1, 2]])  # each sample spans 1, the group 2
    assert not too_wide(cfg, [[], []])  # unlabelled (LoRA): a request keeps its adapter


# ----------------------------------------------------------------------------- engine


@pytest.fixture(scope="module")
def engine(vllm_model_dir, arithmetic_dir, tmp_path_factory):
    from rft.explorer.engine import Engine

    root = tmp_path_factory.mktemp("engine")
    return Engine(make_cfg(root, vllm_model_dir, [taskset_dict(arithmetic_dir / "a.jsonl", "a")]))


@pytest.mark.integration
def test_weights_load_between_engine_steps_with_requests_kept(engine, vllm_model_dir, tmp_path):
    """Greedy requests in flight while new weights load: no token is lost or regenerated
    (every sample has its full length), the tokens labelled with the old version are the old
    weights' greedy continuation, and the new weights took over from there."""
    from rft.explorer.engine import complete
    from rft.explorer.tasksets import SamplingArgs

    new = tmp_path / "v1"
    new.mkdir()
    perturbed_copy(vllm_model_dir, seed=3)(new)
    args = SamplingArgs(n=2, temperature=0.0, max_tokens=40, min_tokens=40)
    prompts = [[1, 5, 9, 12], [1, 7, 3]]
    engine.reload(vllm_model_dir)
    old = complete(engine, prompts, [args] * 2)
    engine.label_version(0)
    for i, ids in enumerate(prompts):
        engine.add(f"p{i}", ids, args)
    done: dict[str, list] = {}
    steps = 0
    while engine.in_flight:
        done.update(engine.step())
        steps += 1
        if steps == 10:
            assert engine.in_flight == 4  # nothing finished yet: the load happens mid-sample
            with engine.paused():
                engine.reload(new)
                engine.label_version(1)
    assert sorted(done) == ["p0", "p1"]
    for i in range(2):
        for sample, reference in zip(done[f"p{i}"], old[i]):
            assert len(sample.response_ids) == len(sample.logprobs) == 40
            switch = sample.versions.index(1)
            assert 0 < switch < 40 and set(sample.versions[switch:]) == {1}
            assert sample.response_ids[:switch] == reference.response_ids[:switch]
            assert sample.logprobs[:switch] == pytest.approx(reference.logprobs[:switch], abs=1e-4)
            assert sample.response_ids != reference.response_ids  # v1 wrote the rest
    engine.reload(vllm_model_dir)


def long_tail_cfg(root: Path, model: Path, data: Path, **extra) -> dict:
    """Two tasksets in each step: short answers (8 tokens) and long ones (up to 160)."""
    rows = arithmetic_rows(8)
    short = taskset_dict(write_jsonl(data / "short.jsonl", rows), "short")
    long = taskset_dict(
        write_jsonl(data / "long.jsonl", rows), "long", rollout_args={"max_tokens": 160}
    )
    model_args = {"max_response_tokens": 8, "min_response_tokens": 8}
    settings = {
        "model": model_args,
        "buffer": {"batch_size": 4, "total_steps": 3},
        "explorer": {"partial_rollout": True},
    }
    return cfg_dict(root, model, [short, long], **merge(settings, extra))


@contextlib.contextmanager
def publishing_while_generating(engine, run_dir: Path, model: Path) -> Iterator[None]:
    """Weights v1 (``model`` perturbed) published while the engine has requests in flight."""
    from rft.sync.publisher import WeightsPublisher

    def publish() -> None:
        while not engine.in_flight:
            time.sleep(0.01)
        time.sleep(0.3)
        WeightsPublisher(run_dir).publish(1, perturbed_copy(model, seed=1))

    thread = threading.Thread(target=publish)
    thread.start()
    try:
        yield
    finally:
        thread.join()


def groups_of(segments: dict[int, list[Experience]]) -> dict[int, list[str]]:
    return {seq: list(dict.fromkeys(e.group_id for e in exps)) for seq, exps in segments.items()}


@pytest.mark.integration
def test_streaming_explorer_loads_weights_in_flight_and_seals_steps_in_order(
    engine, vllm_model_dir, tmp_path, monkeypatch
):
    from rft.explorer import steps as explorer_steps
    from rft.explorer.loop import run_explorer

    monkeypatch.setattr(explorer_steps, "WEIGHTS_POLL_S", 0.0)
    cfg = config_from_dict(
        long_tail_cfg(
            tmp_path / "ckpt", vllm_model_dir, tmp_path, explorer={"max_inflight_samples": 64}
        )
    )
    with publishing_while_generating(engine, cfg.run_dir, vllm_model_dir):
        result = run_explorer(cfg, engine)
    assert result.steps == [1, 2, 3] and result.loaded_version == 1
    segments = read_segments(cfg.run_dir)["explorer-0"]
    assert sorted(segments) == [1, 2, 3]
    for seq, groups in groups_of(segments).items():  # 4 groups of 2, ids of their own step
        assert len(groups) == 4 and all(g.startswith(f"explorer-0:{seq}:") for g in groups)
        assert len(segments[seq]) == 8
    exps = [e for seq in segments.values() for e in seq]
    spanning = [e for e in exps if e.response_versions]
    assert spanning, "no sample was generated across the weights update"
    for e in spanning:
        assert len(e.response_versions) == len(e.response_ids) == len(e.logprobs)
        assert e.response_versions == sorted(e.response_versions)
        assert e.model_version == e.response_versions[0] == 0 and e.response_versions[-1] == 1
    eos = engine.tokenizer.eos_token_id
    for e in exps:  # each sample ran to its end: its limit or the end-of-sequence token
        limit = 8 if e.task_id.startswith("short") else 160
        assert len(e.response_ids) == limit or e.response_ids[-1] == eos
    metrics = result.metrics
    assert sum(m["rollout/tokens_discarded"] for m in metrics) == 0
    assert max(m["rollout/span_share"] for m in metrics) > 0
    assert sum(m["generated_tokens"] for m in metrics) == sum(len(e.response_ids) for e in exps)
    assert not (cfg.run_dir / "groups" / "explorer-0").exists() or not any(
        (cfg.run_dir / "groups" / "explorer-0").iterdir()
    )  # every spooled group was sealed, then removed


@pytest.mark.integration
def test_max_version_span_drops_groups_that_span_more(
    engine, vllm_model_dir, tmp_path, monkeypatch
):
    from rft.explorer import steps as explorer_steps
    from rft.explorer.loop import run_explorer

    monkeypatch.setattr(explorer_steps, "WEIGHTS_POLL_S", 0.0)
    extra = {"explorer": {"max_inflight_samples": 64, "max_version_span": 0}}
    cfg = config_from_dict(long_tail_cfg(tmp_path / "ckpt", vllm_model_dir, tmp_path, **extra))
    with publishing_while_generating(engine, cfg.run_dir, vllm_model_dir):
        result = run_explorer(cfg, engine)
    exps = [e for seq in read_segments(cfg.run_dir)["explorer-0"].values() for e in seq]
    dropped = sum(m["rollout/tokens_discarded"] for m in result.metrics)
    assert dropped > 0 and not any(e.response_versions for e in exps)
    assert len(exps) < 24  # the groups that spanned v0 and v1 left out; every step sealed
    assert result.steps == [1, 2, 3]


@pytest.mark.integration
def test_synchronous_mode_ignores_partial_rollout(engine, vllm_model_dir, arithmetic_dir, tmp_path):
    """mode both, sync_offset 0: one step at a time whether the key is set or not, the same
    samples, none spanning versions."""
    from rft.explorer.loop import run_explorer

    greedy = taskset_dict(
        arithmetic_dir / "a.jsonl", "a", rollout_args={"temperature": 0.0}, repeat_times=1
    )
    runs = []
    for name, on in (("off", False), ("on", True)):
        cfg = make_cfg(
            tmp_path / name,
            vllm_model_dir,
            [greedy],
            mode="both",
            buffer={"total_steps": 1},
            explorer={"partial_rollout": on},
        )
        result = run_explorer(cfg, engine)
        assert result.metrics[0]["rollout/span_share"] == 0.0
        runs.append(
            [(e.response_ids, e.logprobs) for e in read_segments(cfg.run_dir)["explorer-0"][1]]
        )
    assert runs[0] == runs[1]


KILLABLE = """
import json, sys
from rft.config.load import config_from_dict
from rft.explorer.loop import run_explorer
run_explorer(config_from_dict(json.loads(sys.argv[1])))
"""


@pytest.mark.integration
def test_a_killed_streaming_explorer_loses_only_unfinished_groups(engine, vllm_model_dir, tmp_path):
    """Killed while step 1's long groups run and its short ones are spooled: the restarted
    explorer seals those short groups as they were (same experience ids), generates only the
    rest, and the buffer holds every slot once."""
    from rft.buffer.segments import SegmentReader
    from rft.explorer.loop import run_explorer

    config = long_tail_cfg(tmp_path / "ckpt", vllm_model_dir, tmp_path)
    cfg = config_from_dict(config)
    spool = GroupSpool(cfg.run_dir, "explorer-0")
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLABLE, json.dumps(config)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not spool.take(1) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    kept = spool.take(1)
    assert kept, f"nothing spooled before the kill: {proc.stderr.read()[-3000:]!r}"
    assert not (cfg.run_dir / "buffer" / "explorer-0" / "seg-000001.jsonl").exists()
    result = run_explorer(cfg, engine)
    assert result.steps == [1, 2, 3] and result.metrics[0]["groups_resumed"] == len(kept)
    step1 = read_segments(cfg.run_dir)["explorer-0"][1]
    resumed = {  # group id -> experience ids spooled before the kill
        f"explorer-0:1:{key.split('.')[1]}": [e.experience_id for e in exps]
        for key, exps in kept.items()
    }
    for group, ids in resumed.items():
        assert [e.experience_id for e in step1 if e.group_id == group] == ids
    generated = sum(len(e.response_ids) for e in step1 if e.group_id not in resumed)
    assert result.metrics[0]["generated_tokens"] == generated  # kept groups are not counted
    reader = SegmentReader(cfg.run_dir / "buffer")
    read = reader.read(10_000)
    ids = [e.experience_id for e in read]
    assert len(ids) == len(set(ids)) == 24  # 3 steps x 4 tasks x 2 samples, each read once
    groups = [e.group_id for e in read]
    assert len(set(groups)) == 12


@pytest.mark.integration
def test_streaming_runs_workflow_classes_beside_single_turn_groups(
    engine, vllm_model_dir, tmp_path, monkeypatch
):
    """Multi-turn episodes (two model turns with a tool between) share the engine with long
    single-turn groups while v1 loads in flight: every step is sealed in order with its groups,
    episodes keep their masks, and a token's recorded version is the one that generated it."""
    from rft.explorer import steps as explorer_steps
    from rft.explorer.loop import run_explorer
    from rft.workflow import registry

    monkeypatch.setenv(registry.PLUGIN_DIRS_ENV, str(REPO / "tests" / "fixtures" / "plugins"))
    monkeypatch.setattr(explorer_steps, "WEIGHTS_POLL_S", 0.0)
    rows = arithmetic_rows(8)
    agent = taskset_dict(
        write_jsonl(tmp_path / "agent.jsonl", rows),
        "agent",
        default_workflow_type="scripted_turns",
        workflow_args={"turns": 2, "tools": ["echo"]},
        rollout_args={"max_tokens": 48},
    )
    long = taskset_dict(
        write_jsonl(tmp_path / "long.jsonl", rows), "long", rollout_args={"max_tokens": 160}
    )
    settings = {
        "buffer": {"batch_size": 4, "total_steps": 3},
        "explorer": {"partial_rollout": True, "max_inflight_samples": 64},
    }
    cfg = config_from_dict(cfg_dict(tmp_path / "ckpt", vllm_model_dir, [agent, long], **settings))
    with publishing_while_generating(engine, cfg.run_dir, vllm_model_dir):
        result = run_explorer(cfg, engine)
    assert result.steps == [1, 2, 3] and result.loaded_version == 1
    segments = read_segments(cfg.run_dir)["explorer-0"]
    for seq, groups in groups_of(segments).items():
        assert len(groups) == 4 and all(g.startswith(f"explorer-0:{seq}:") for g in groups)
        assert len(segments[seq]) == 8
    exps = [e for seq in segments.values() for e in seq]
    episodes = [e for e in exps if e.task_id.startswith("agent")]
    assert len(episodes) == 12 and all(e.reward == 1.0 for e in episodes)
    for e in episodes:  # two model turns, the tool's observation between them
        mask = e.action_mask
        assert mask[0] == 1 and sum(1 for a, b in zip(mask, mask[1:]) if a == 0 and b == 1) == 1
    for e in exps:
        if e.response_versions:
            assert len(e.response_versions) == len(e.response_ids)
            assert e.response_versions == sorted(e.response_versions)
            assert e.model_version == e.response_versions[0] == 0
    metrics = result.metrics
    assert sum(m.get("episodes/count", 0) for m in metrics) == 12
    assert sum(m.get("tools/calls", 0) for m in metrics) == 24
    model_tokens = sum(sum(e.action_mask) if e.action_mask else len(e.response_ids) for e in exps)
    assert sum(m["generated_tokens"] for m in metrics) == model_tokens
    assert engine.in_flight == 0


@pytest.mark.integration
def test_an_ended_episode_has_its_calls_aborted_in_the_engine(
    engine, vllm_model_dir, arithmetic_dir, tmp_path
):
    """An episode that ends (error, timeout) while its call runs: the call fails at once, the
    next pump aborts the request, and the engine holds nothing of it; another episode's call
    is answered with its tokens labelled by the engine."""
    from rft.errors import WorkflowError
    from rft.explorer.episode_groups import EngineCalls
    from rft.workflow.model import EpisodeCancelled

    cfg = make_cfg(tmp_path, vllm_model_dir, [taskset_dict(arithmetic_dir / "a.jsonl", "a")])
    engine.reload(vllm_model_dir)
    engine.label_version(7)
    calls = EngineCalls(engine, cfg)
    args = {"temperature": 1.0, "max_tokens": 40, "logprobs": 0}
    for episode in (0, 1, 2):
        calls.started(episode)
    doomed = calls.submit(0, [1, 5, 9], args)
    kept = calls.submit(1, [1, 7, 3], args)
    refused = calls.submit(2, [1, 7, 3], {"max_tokens": 40, "logprobs": 10_000})
    calls.pump()
    with pytest.raises(WorkflowError, match="the engine refused the model call"):
        refused.result(timeout=0)  # that call fails alone; the others run
    assert engine.in_flight == 2 and calls.in_engine == 2
    engine.step()
    calls.ended(0)
    with pytest.raises(EpisodeCancelled):
        doomed.result(timeout=0)
    calls.pump()
    assert engine.in_flight == 1 and calls.in_engine == 1
    while engine.in_flight:
        for key, samples in engine.step():
            assert calls.owns(key)
            calls.resolve(key, samples)
    [reply] = kept.result(timeout=0)
    assert reply.model_version == 7 and set(reply.versions) == {7}
    assert len(reply.versions) == len(reply.response_ids) > 0


@pytest.mark.integration
def test_reward_models_score_the_groups_of_an_engine_step_together(
    engine, vllm_model_dir, tiny_reward_model_dir, tmp_path, monkeypatch
):
    """With a reward model, the groups one engine step finished are scored in one call (fewer
    calls than groups), every sample carries the model's score, and the scoring seconds reach
    the sealed steps' metrics."""
    from rft.explorer import reward_model as R
    from rft.explorer.loop import run_explorer

    calls = []
    score = R.RewardModel.score
    monkeypatch.setattr(
        R.RewardModel, "score", lambda self, convs: calls.append(len(convs)) or score(self, convs)
    )
    extra = {"explorer": {"auxiliary_models": [{"model_path": str(tiny_reward_model_dir)}]}}
    cfg = config_from_dict(long_tail_cfg(tmp_path / "ckpt", vllm_model_dir, tmp_path, **extra))
    result = run_explorer(cfg, engine)
    exps = [e for seq in read_segments(cfg.run_dir)["explorer-0"].values() for e in seq]
    assert len(exps) == 24 and sum(calls) == 24 and len(calls) < 12  # 12 groups of 2
    assert all(len(e.reward_parts) > 0 for e in exps)
    assert sum(m.get("reward_model_time_s", 0.0) for m in result.metrics) > 0
