"""Trinity-RFT users' workflow files run in rft (tests/fixtures/trinity_workflows: written the
way Trinity's docs and examples write them; ``changed_*`` with their imports changed to
``rft.workflow``, ``unchanged_*`` as written, through rft's ``trinity`` import alias): every
base class, sync and async, custom rewards, an LLM judge (a generative auxiliary model), recording
agents, a multi-turn environment relying on ``can_repeat`` False, edited assistant turns and an
evaluation workflow without rewards, in one 2-step CPU run of ``rft-run`` (explorer and trainer)
with no failed episode."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rft.workflow import trinity_alias
from tests.helpers.runs import REPO, read_segments, rft_run, write_jsonl

WORKFLOWS = Path(__file__).resolve().parent / "fixtures" / "trinity_workflows"

# Each training row's workflow (its registered name), and the reward column where the row names
# one (an AsyncSimpleWorkflow reads the taskset's reward; the others bring their own).
TRAINING = {
    "short_answer_workflow": None,
    "async_echo_workflow": "accuracy_reward",
    "checked_math_workflow": None,
    "checked_async_math_workflow": None,
    "base_model_boxed_workflow": None,
    "digit_env_workflow": None,
    "edited_turn_workflow": None,
    "two_step_propagation_workflow": None,
    "async_scored_steps_workflow": None,
    "own_experience_workflow": None,
    "judged_workflow": None,
    "recorded_agent_workflow": None,
    "brief_math_workflow": None,
    "two_turn_chat_workflow": None,
    "guide_recording_workflow": None,
}


def config(root: Path, model_dir: Path) -> Path:
    rows = [
        {"question": f"What is {i} + 1?", "answer": str(i + 1), "workflow": name, "reward": reward}
        for i, (name, reward) in enumerate(TRAINING.items())
    ]
    train = write_jsonl(root / "data" / "train.jsonl", rows)
    evaluation = write_jsonl(
        root / "eval" / "test.jsonl", [{"question": "Say 3.", "answer": "3"}] * 2
    )
    cfg = {
        "project": "trinity",
        "name": "workflows",
        "checkpoint_root_dir": str(root / "ck"),
        "mode": "both",
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 2, "kl_loss_fn": "none"},
        "model": {"model_path": str(model_dir), "max_response_tokens": 6, "max_model_len": 384},
        "cluster": {"node_num": 1, "gpu_per_node": 3},
        "buffer": {
            "total_epochs": 2,
            "batch_size": len(TRAINING),
            "explorer_input": {
                "taskset": {
                    "name": "trinity",
                    "path": str(train),
                    "split": "train",
                    "format": {
                        "prompt_key": "question",
                        "response_key": "answer",
                        "workflow_key": "workflow",
                        "reward_fn_key": "reward",
                    },
                    "default_workflow_type": "two_turn_chat_workflow",  # rows name theirs
                    "workflow_args": {"max_env_steps": 2},
                },
                "eval_tasksets": [
                    {
                        "name": "metrics-only",
                        "path": str(evaluation),
                        "split": "test",
                        "repeat_times": 2,
                        "format": {"prompt_key": "question", "response_key": "answer"},
                        "default_workflow_type": "metrics_only_eval_workflow",
                    }
                ],
            },
        },
        "explorer": {
            "eval_on_startup": False,
            "eval_interval": 2,
            "runner_per_model": 16,
            "max_timeout": 300,
            "max_failed_steps": 1,
            "rollout_model": {"dtype": "float32", "enable_openai_api": True},
            "auxiliary_models": [
                {"model_path": str(model_dir), "dtype": "float32", "max_model_len": 384}
            ],
        },
        "synchronizer": {"sync_method": "checkpoint", "sync_interval": 1},
        "trainer": {"save_interval": 0, "precision": "fp32"},
        "monitor": {"monitor_type": "console"},
    }
    path = root / "trinity_workflows.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_every_public_trinity_name_is_served_by_rft_workflow():
    import rft.workflow

    missing = [name for name in trinity_alias.TRINITY_API if not hasattr(rft.workflow, name)]
    assert missing == []
    docs = (REPO / "docs" / "agentic-workflows.md").read_text()
    undocumented = [name for name in trinity_alias.TRINITY_API if f"`{name}`" not in docs]
    assert undocumented == []


def test_unchanged_trinity_imports_resolve_to_rft_names_and_a_missing_name_says_so(tmp_path):
    """In a fresh interpreter (no Trinity-RFT installed): the alias is on after plugins load."""
    (tmp_path / "uses_missing.py").write_text(
        "from trinity.common.workflows import ToolCallWorkflow  # a name rft lacks\n"
    )
    code = (
        "import sys\n"
        "from rft.workflow import registry, MathWorkflow, REWARD_FUNCTIONS\n"
        f"registry.load_plugins([{str(WORKFLOWS)!r}, {str(tmp_path)!r}])\n"
        "import unchanged_math_reward as m\n"
        "assert m.MathWorkflow is MathWorkflow and m.REWARD_FUNCTIONS is REWARD_FUNCTIONS\n"
        "assert registry.WORKFLOWS.get('brief_math_workflow') is m.BriefMathWorkflow\n"
        "print(registry.failed_plugins_note())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "uses_missing.py (ImportError: trinity.common.workflows.ToolCallWorkflow: " in (
        done.stdout
    )
    assert "Trinity-RFT's name 'ToolCallWorkflow' is not part of rft's Trinity workflow API" in (
        done.stdout
    )


@pytest.mark.integration
def test_trinity_users_workflows_train_two_steps_with_no_failed_episode(vllm_model_dir, tmp_path):
    from rft.monitor import read_metrics

    done = rft_run(
        "--config", str(config(tmp_path, vllm_model_dir)), "--plugin-dir", str(WORKFLOWS)
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    run_dir = tmp_path / "ck" / "trinity" / "workflows"
    explored = read_metrics(run_dir, "explorer_explorer")
    training = [m for m in explored if "episodes/count" in m]
    assert [m["step"] for m in training] == [1, 2]
    for m in training:
        assert m.get("episodes/failed", 0) == 0, m.get("episodes/errors")
        assert m["episodes/retokenized_turns"] >= 2  # edited_turn_workflow: its edited replies
    assert [m["step"] for m in read_metrics(run_dir, "trainer")] == [1, 2]

    records = [r for seq in read_segments(run_dir)["explorer-0"].values() for r in seq]
    last = [r for r in records if r.info["step"] == 2]  # the last step's segment is kept
    by_task: dict[str, list] = {}
    for r in last:
        by_task.setdefault(r.task_id, []).append(r)
    assert len(by_task) == len(TRAINING)  # every workflow's group, each with both runs
    assert all({r.info["run"] for r in group} == {0, 1} for group in by_task.values())
    row = {name: by_task[f"trinity/{i}"] for i, name in enumerate(TRAINING)}
    # the multi-turn environment (can_repeat False): one sample per run, turns masked apart
    assert len(row["digit_env_workflow"]) == 2
    assert all(0 in r.action_mask for r in row["digit_env_workflow"])
    # step-wise: one sample per step; propagation gives each step the run's reward
    assert sorted((r.info["env_step"], r.reward) for r in row["async_scored_steps_workflow"]) == [
        (0, 0.25),
        (0, 0.25),
        (1, 0.5),
        (1, 0.5),
    ]
    assert {r.reward for r in row["two_step_propagation_workflow"]} == {2.0}
    # the recording agent: its two calls are one sample; update_reward(sample_ids=[the second
    # call's id]) overrode the reward of that sample
    assert [r.reward for r in row["recorded_agent_workflow"]] == [0.75, 0.75]
    # the judge answered each reply (through its OpenAI client); nothing of it was trained
    assert all("judge_said" in r.info for r in row["judged_workflow"])
    # Experience tensors: the model's log-probs of its own reply, rescored, equal the engine's
    assert all(r.info["rescore_gap"] < 1e-3 for r in row["own_experience_workflow"])
    # the edited conversation: trained retokenized (mask set on the edited turns)
    assert all(1 in r.action_mask for r in row["edited_turn_workflow"])
    # an evaluation workflow without rewards: its accuracy metric reaches the eval metrics
    evaluated = [m for m in explored if "eval/metrics-only/mean@2" in m]
    assert [m["step"] for m in evaluated] == [2]
