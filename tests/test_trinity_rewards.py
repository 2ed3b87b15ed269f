"""Trinity-RFT's reward classes (:mod:`rft.workflow.reward_fn`), used as Trinity users use them:
the built-ins by name and by class, a ``RewardFn`` subclass registered with
``REWARD_FUNCTIONS``, and a plugin's reward named in a config."""

from __future__ import annotations

import json
import sys
import uuid

import pytest

from rft.errors import ConfigError, NotSupportedError, WorkflowError
from rft.workflow import (
    REWARD_FUNCTIONS,
    AccuracyReward,
    CountDownRewardFn,
    FinalNumberRewardFn,
    FormatReward,
    MathBoxedRewardFn,
    MathDAPORewardFn,
    MathRewardFn,
    RewardFn,
    compute_score,
    registry,
    simple_answer_parser,
    validate_think_pattern,
    verify_math_answer,
)
from rft.workflow.reward_fn import BUILTIN_REWARDS, reward_fn_class, reward_function
from rft.workflow.rewards import REWARD_FNS
from rft.workflow.single_turn import get_workflow

R1_REPLY = "<think>2 + 2 makes 4</think> <answer>4</answer>"


@pytest.fixture
def clean_rewards(monkeypatch):
    """The reward registry and plugin state, restored after the test."""
    monkeypatch.setattr(REWARD_FUNCTIONS, "classes", dict(REWARD_FUNCTIONS.classes))
    monkeypatch.setattr(registry.WORKFLOWS, "classes", dict(registry.WORKFLOWS.classes))
    monkeypatch.setattr(registry, "_loaded", set())
    monkeypatch.setattr(registry, "_failed", {})
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv(registry.PLUGIN_DIRS_ENV, raising=False)
    monkeypatch.delenv(registry.TRINITY_PLUGIN_DIRS_ENV, raising=False)
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("rewardtest_"):
            del sys.modules[name]


# ----------------------------------------------------------------------------- built-in classes


def test_every_builtin_reward_name_is_a_registered_class_with_trinitys_name():
    assert {name: cls.__name__ for name, cls in BUILTIN_REWARDS.items()} == {
        "math_reward": "MathRewardFn",
        "math_boxed_reward": "MathBoxedRewardFn",
        "accuracy_reward": "AccuracyReward",
        "format_reward": "FormatReward",
        "countdown_reward": "CountDownRewardFn",
        "math_dapo_reward": "MathDAPORewardFn",
        "final_number_reward": "FinalNumberRewardFn",
        "rlcr_reward": "RLCRRewardFn",
    }
    assert set(BUILTIN_REWARDS) == set(REWARD_FNS)
    assert REWARD_FUNCTIONS.get("math_reward") is MathRewardFn
    assert REWARD_FUNCTIONS.modules is REWARD_FUNCTIONS.classes  # Trinity's attribute name
    assert all(issubclass(cls, RewardFn) for cls in BUILTIN_REWARDS.values())


def test_math_reward_fn_scores_accuracy_and_the_think_answer_format():
    reward = MathRewardFn()
    assert reward(response=R1_REPLY, truth="4") == {"accuracy": 1.0, "format_score": 0.1}
    assert reward(response=R1_REPLY, truth="5") == {"accuracy": 0.0, "format_score": 0.1}
    # the answer without the tags: no answer found, and the format is wrong
    assert reward(response="It is 4.", truth="4") == {"accuracy": 0.0, "format_score": -0.1}
    # Trinity's positional order: response, prompt, truth
    assert reward(R1_REPLY, "What is 2+2?", "4") == {"accuracy": 1.0, "format_score": 0.1}


def test_math_reward_fn_takes_trinitys_parser_and_pattern():
    last_word = MathRewardFn(answer_parser=lambda text: text.split()[-1], pattern=r"^Answer")
    assert last_word(response="Answer 4", truth="so 4") == {"accuracy": 1.0, "format_score": 0.1}
    assert last_word(response="I say 5", truth="4") == {"accuracy": 0.0, "format_score": -0.1}
    # Trinity's default parser, given explicitly, is the default rule
    assert MathRewardFn(answer_parser=simple_answer_parser)(response=R1_REPLY, truth="4") == {
        "accuracy": 1.0,
        "format_score": 0.1,
    }
    with pytest.raises(WorkflowError, match="returns the answer as a string"):
        AccuracyReward(answer_parser=lambda text: [text])(response="4", truth="4")


def test_math_boxed_reward_fn_reads_the_last_box_and_penalises_a_missing_think():
    boxed = MathBoxedRewardFn()
    assert boxed(response="so \\boxed{3} no, \\boxed{12}", truth="12") == {
        "accuracy": 1.0,
        "format_score": 0.0,
    }
    assert boxed(response="\\boxed{12}", truth="12", with_think=True) == {
        "accuracy": 1.0,
        "format_score": -0.1,
    }
    thinking = "<think>6 * 2</think> \\boxed{12}"
    assert boxed(response=thinking, truth="12", with_think=True)["format_score"] == 0.0
    # the constructor's settings (rft's reward_fn_args) are the defaults of each call
    strict = MathBoxedRewardFn(with_think=True, format_score_coef=0.5)
    assert strict(response="\\boxed{7}", truth="12") == {"accuracy": 0.0, "format_score": -0.5}
    assert strict(response="\\boxed{7}", truth="12", with_think=False)["format_score"] == 0.0
    # what a workflow passes on and the reward does not read is left alone
    assert boxed(response="\\boxed{12}", truth="12", response_token=[1, 2])["accuracy"] == 1.0


def test_accuracy_format_countdown_and_final_number_classes():
    assert AccuracyReward()(response="\\boxed{0.5}", truth="1/2") == {"accuracy": 1.0}
    assert AccuracyReward()(response="<answer>3</answer> \\boxed{4}", truth="4") == {
        "accuracy": 0.0  # the answer tag comes first
    }
    assert FormatReward()(response=R1_REPLY) == {"format_score": 0.1}
    assert FormatReward(pattern=r"^\d+$")(response="42") == {"format_score": 0.1}
    assert FormatReward(pattern=r"^\d+$")(response="42 apples") == {"format_score": -0.1}
    truth = json.dumps({"target": 24, "numbers": [4, 6, 1]})
    countdown = CountDownRewardFn()
    assert countdown(response="<answer>4 * 6 * 1</answer>", truth=truth) == {"score": 1.0}
    assert countdown(response="<answer>4 * 6 + 1</answer>", truth=truth) == {"score": 0.1}
    assert countdown(response="24", truth=truth) == {"score": 0.0}
    assert FinalNumberRewardFn()(response="She has 19 apples.", truth="19") == {
        "accuracy": 1.0,
        "format_score": 0.1,
    }


def test_math_dapo_reward_fn_is_plus_minus_one_with_the_overlong_penalty():
    plain = MathDAPORewardFn()
    assert plain(response="Answer: 7", truth="7") == {"accuracy": 1.0, "format_score": 0.0}
    assert plain(response="Answer: 8", truth="7") == {"accuracy": -1.0, "format_score": 0.0}
    dapo = MathDAPORewardFn(
        enable_overlong_penalty=True, penalty_factor=1.0, max_response_length=10, cache_length=4
    )
    # expected length 10 - 4 = 6 tokens: 8 tokens cost (6 - 8) / 4 = -0.5, over 10 the factor
    assert dapo(response="Answer: 7", response_token=list(range(8)), truth="7") == {
        "accuracy": 1.0,
        "format_score": -0.5,
    }
    assert dapo("Answer: 7", list(range(6)), "7") == {"accuracy": 1.0, "format_score": 0.0}
    assert dapo("Answer: 7", list(range(11)), "7")["format_score"] == -1.0
    with pytest.raises(WorkflowError, match="response_token"):
        dapo(response="Answer: 7", truth="7")
    with pytest.raises(ConfigError, match="needs penalty_factor"):
        MathDAPORewardFn(enable_overlong_penalty=True)


def test_trinitys_answer_helpers():
    assert validate_think_pattern("<think>a</think> b")
    assert not validate_think_pattern("<think>a</think> <think>b</think>")
    assert not validate_think_pattern("</think> <think>")
    assert simple_answer_parser("x <answer> 12 </answer> <answer>13</answer>") == "12"
    assert simple_answer_parser(" 12 ") == "12"
    assert compute_score("it is \\boxed{\\frac{1}{2}}", "\\boxed{0.5}") == 1.0
    assert compute_score("it is 0.5", "0.5") == 0.0  # no box in the solution
    assert compute_score("\\boxed{72}", "48 + 24 = 72\n#### 72") == 1.0
    assert verify_math_answer("So the final answer is 12.", "12") == (
        1.0,
        {"parsed_prediction": "12", "ground_truth": "12", "is_correct": True},
    )
    accuracy, details = verify_math_answer("I get 3, then 7", "\\boxed{8}")
    assert (
        accuracy == 0.0 and details["parsed_prediction"] == "7" and details["ground_truth"] == "8"
    )


def test_reward_fn_is_abstract_as_in_trinity(clean_rewards):
    @REWARD_FUNCTIONS.register_module("no_init_reward")
    class NoInit(RewardFn):
        def __call__(self, response, truth=None, **kwargs):
            return {"r": 1.0}

    with pytest.raises(TypeError, match="abstract"):
        NoInit()
    with pytest.raises(ConfigError, match="does not define \\['__init__'\\]"):
        reward_fn_class("no_init_reward")  # on the login node, not in the first episode


# ----------------------------------------------------------------------------- a user's class


class LengthPenalty(RewardFn):
    """A user's reward, written as Trinity's guide writes them."""

    def __init__(self, max_chars: int = 10, penalty: float = -0.5):
        self.max_chars, self.penalty = max_chars, penalty
        self.math = MathRewardFn()

    def __call__(self, response: str, truth=None, **kwargs) -> dict:
        parts = self.math(response=response, truth=truth)
        parts["length"] = self.penalty if len(response) > self.max_chars else 0.0
        return parts


def test_a_registered_reward_class_is_found_by_name(clean_rewards):
    REWARD_FUNCTIONS.register_module("length_penalty_reward")(LengthPenalty)
    assert reward_fn_class("length_penalty_reward", {"max_chars": 80}) is LengthPenalty
    # a single-turn recipe builds it with reward_fn_args, as Trinity does reward_fn(**args)
    recipe = get_workflow("math_workflow", "length_penalty_reward", {"penalty": -1.0})
    assert recipe.score(R1_REPLY, "4") == {"accuracy": 1.0, "format_score": 0.1, "length": -1.0}
    assert recipe.score("<think></think><answer>4</answer>", "4")["length"] == -1.0
    assert reward_function("length_penalty_reward", {"max_chars": 99})(R1_REPLY, "4") == {
        "accuracy": 1.0,
        "format_score": 0.1,
        "length": 0.0,
    }
    with pytest.raises(ConfigError, match="cannot be built.*max_char"):
        reward_fn_class("length_penalty_reward", {"max_char": 80})


def test_a_registered_name_is_taken_unless_forced(clean_rewards):
    with pytest.raises(WorkflowError, match="'math_reward' is taken by .*MathRewardFn"):
        REWARD_FUNCTIONS.register_module("math_reward")(LengthPenalty)
    # Trinity's other form: the class as an argument, force to replace
    assert REWARD_FUNCTIONS.register_module("math_reward", LengthPenalty, force=True) is (
        LengthPenalty
    )
    assert reward_fn_class("math_reward") is LengthPenalty
    assert get_workflow("math_workflow").score(R1_REPLY, "4")["length"] == -0.5


def test_builtin_names_carry_their_class_and_bad_names_keep_todays_errors(tmp_path, monkeypatch):
    assert reward_fn_class("math_reward") is MathRewardFn
    assert reward_fn_class("math_boxed_reward", {"with_think": True}) is MathBoxedRewardFn
    with pytest.raises(ConfigError, match="cannot be built.*scale"):
        reward_fn_class("math_reward", {"scale": 2})
    with pytest.raises(ConfigError, match="needs penalty_factor"):
        reward_fn_class("math_dapo_reward", {"enable_overlong_penalty": True})
    with pytest.raises(ConfigError, match="Did you mean 'math_reward'"):
        reward_fn_class("math_rewrd")
    with pytest.raises(NotSupportedError, match="rm_gallery_reward"):
        reward_fn_class("rm_gallery_reward")
    # a plain function by path: a RewardFn class around it, its arguments bound at load
    module = f"rewardtest_fn_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "def scaled(response, truth, scale=1.0):\n    return scale * (response == truth)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cls = reward_fn_class(f"{module}:scaled", {"scale": 3.0})
    assert issubclass(cls, RewardFn)
    assert cls(scale=3.0)(response="4", truth="4") == {"reward": 3.0}
    with pytest.raises(ConfigError, match="cannot be called"):
        reward_fn_class(f"{module}:scaled", {"sclae": 3.0})


# ----------------------------------------------------------------------------- from a config


def _plugin_cfg(folder, workflow: str, reward: str, reward_fn_args: dict):
    from rft.config.load import config_from_dict

    return config_from_dict(
        {
            "mode": "explore",
            "model": {"model_path": "m"},
            "cluster": {"gpu_per_node": 0},
            "buffer": {
                "explorer_input": {
                    "taskset": {
                        "path": "p",
                        "default_workflow_type": workflow,
                        "default_reward_fn_type": reward,
                        "reward_fn_args": reward_fn_args,
                    }
                }
            },
        }
    )


def test_a_plugin_reward_class_is_usable_by_name_from_a_config(
    clean_rewards, tmp_path, monkeypatch
):
    from rft.explorer.tasksets import WorkflowClass, taskset_workflow

    tag = uuid.uuid4().hex[:8]
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / f"rewardtest_plugin_{tag}.py").write_text(
        "from rft.workflow import REWARD_FUNCTIONS, WORKFLOWS, RewardFn, SimpleWorkflow\n"
        f"@REWARD_FUNCTIONS.register_module('echo_reward_{tag}')\n"
        "class EchoReward(RewardFn):\n"
        "    def __init__(self, bonus=0.0):\n"
        "        self.bonus = bonus\n"
        "    def __call__(self, response, truth=None, **kwargs):\n"
        "        return {'same': float(response == truth), 'bonus': self.bonus}\n"
        f"@WORKFLOWS.register_module('echo_workflow_{tag}')\n"
        "class EchoWorkflow(SimpleWorkflow):\n"
        "    pass\n"
    )
    monkeypatch.setenv(registry.PLUGIN_DIRS_ENV, str(folder))
    # a single-turn recipe: the class built with reward_fn_args, called per reply
    cfg = _plugin_cfg(folder, "math_workflow", f"echo_reward_{tag}", {"bonus": 0.25})
    label, ts = cfg.labelled_tasksets()[0]
    recipe = taskset_workflow(cfg, ts, label, False)
    assert recipe.score("7", "7") == {"same": 1.0, "bonus": 0.25}
    # a workflow class: its tasks carry the registered class itself
    cfg = _plugin_cfg(folder, f"echo_workflow_{tag}", f"echo_reward_{tag}", {"bonus": 0.5})
    label, ts = cfg.labelled_tasksets()[0]
    choice = taskset_workflow(cfg, ts, label, False)
    assert isinstance(choice, WorkflowClass) and choice.cls.__name__ == "EchoWorkflow"
    assert choice.reward_fn is REWARD_FUNCTIONS.get(f"echo_reward_{tag}")
    ts.reward_fn_args = {"bonus": 0.5, "bonnus": 1}
    with pytest.raises(ConfigError, match="taskset.*cannot be built.*bonnus"):
        taskset_workflow(cfg, ts, label, False)
