"""Reward functions and workflows on hand-written responses (no dataset rows are copied)."""

from __future__ import annotations

import sys
import textwrap
import threading

import pytest

from rft.errors import ConfigError, DataError
from rft.workflow import rewards as R
from rft.workflow.single_turn import ALIASES, MATH_SYSTEM_PROMPT, WORKFLOWS, get_workflow


def think_answer(answer: str) -> str:
    return f"<think>Add the two amounts.</think>\n<answer>{answer}</answer>"


# ----------------------------------------------------------------------------- answers


@pytest.mark.parametrize(
    "predicted, truth",
    [
        ("1,234", "1234"),
        ("1234", "1,234"),
        ("$5", "5"),
        ("\\$5", "5"),
        ("12 dollars", "12"),
        ("12 \\text{ dollars}", "12"),
        ("-7", "-7"),
        ("\u22127", "-7"),  # unicode minus
        ("0.5", "1/2"),
        ("\\frac{1}{2}", "0.5"),
        ("\\dfrac{3}{4}", "0.75"),
        ("2.50", "2.5"),
        ("50%", "50"),
        ("42.", "42"),
        ("\\sqrt{2}", "\\sqrt 2"),  # not a plain number: math_verify decides
        ("x = 5", "5"),
    ],
)
def test_answers_that_match(predicted, truth):
    assert R.answers_match(predicted, truth)


@pytest.mark.parametrize(
    "predicted, truth",
    [("7", "-7"), ("1,234", "1235"), ("0.5", "0.25"), ("", "5"), ("banana", "5"), ("5", "")],
)
def test_answers_that_do_not_match(predicted, truth):
    assert not R.answers_match(predicted, truth)


def test_to_number_is_exact():
    assert R.to_number("-1,234.50") == R.to_number("-2469/2")
    assert (
        R.to_number("3/0") is None and R.to_number("1,2") is None
    )  # no division by zero, not thousands


def test_math_verify_is_used_off_the_main_thread_without_raising():
    result = {}
    thread = threading.Thread(target=lambda: result.update(ok=R.answers_match("\\sqrt{4}", "2")))
    thread.start()
    thread.join()
    assert result["ok"] is True  # math_verify's signal timeouts would raise here; we pass none


def test_math_verify_errors_count_as_wrong(monkeypatch):
    import math_verify

    def boom(*args, **kwargs):
        raise RuntimeError("parser exploded")

    monkeypatch.setattr(math_verify, "parse", boom)
    assert R.answers_match("\\sqrt{2}", "\\sqrt{2}") is False


# ----------------------------------------------------------------------------- extraction


def test_gsm8k_ground_truth_after_hashes():
    assert R.gsm8k_answer("She has 3 + 4 = 7 apples.\n#### 7") == "7"
    assert R.gsm8k_answer("Total is 1,000 + 234.\n#### 1,234") == "1234"
    assert R.gsm8k_answer("#### $18") == "18"
    assert R.gsm8k_answer("#### -3.5") == "-3.5"
    assert R.gsm8k_answer("no marker 9") == "no marker 9"
    assert R.extract_ground_truth("so the area is \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"


def test_last_boxed_handles_nesting_and_unclosed_boxes():
    assert R.last_boxed("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert (
        R.last_boxed("first \\boxed{1} then \\boxed{\\sqrt{\\frac{a}{b}}} end")
        == "\\sqrt{\\frac{a}{b}}"
    )
    assert R.last_boxed("\\boxed{3} and an unclosed \\boxed{4") == "3"
    assert R.last_boxed("\\boxed {5}") == "5"
    assert R.last_boxed("no box here") is None


def test_last_answer_tag():
    assert R.last_answer_tag("<answer>1</answer> wait <answer> 2 </answer>") == "2"
    assert R.last_answer_tag("<answer>3") is None


# ----------------------------------------------------------------------------- reward functions


def test_math_reward_correct_and_well_formed():
    assert R.math_reward(think_answer("$1,234"), "1234") == {"accuracy": 1.0, "format_score": 0.1}
    assert R.total_reward(R.math_reward(think_answer("1234"), "1234")) == pytest.approx(1.1)


def test_math_reward_wrong_answer_keeps_format_score():
    assert R.math_reward(think_answer("17"), "18") == {"accuracy": 0.0, "format_score": 0.1}


def test_math_reward_last_answer_wins_but_two_answers_are_bad_format():
    text = "<think>hmm</think><answer>3</answer><answer>4</answer>"
    assert R.math_reward(text, "4") == {"accuracy": 1.0, "format_score": -0.1}
    assert R.math_reward(text, "3")["accuracy"] == 0.0


@pytest.mark.parametrize(
    "text",
    [
        "The answer is 4.",  # no tags
        "<think>sum</think><answer>4",  # unclosed answer
        "<think>sum<answer>4</answer>",  # unclosed think
        "<answer>4</answer><think>after</think>",  # wrong order
        "<think>sum</think><answer>4</answer> trailing words",
    ],
)
def test_math_reward_bad_format(text):
    assert R.math_reward(text, "4")["format_score"] == -0.1


def test_math_reward_no_answer_is_zero_accuracy():
    assert R.math_reward("<think>I give up</think>", "4") == {"accuracy": 0.0, "format_score": -0.1}


def test_math_boxed_reward_as_trinitys():
    """Trinity's math_boxed_reward: accuracy of the last box; a format penalty only with
    with_think, for a reply without exactly one <think> block closed in order."""
    assert R.math_boxed_reward("so \\boxed{\\frac{1}{2}}", "0.5") == {
        "accuracy": 1.0,
        "format_score": 0.0,
    }
    assert R.math_boxed_reward("so 1/2", "0.5") == {"accuracy": 0.0, "format_score": 0.0}
    assert R.math_boxed_reward("\\boxed{2} no, \\boxed{3}", "3")["accuracy"] == 1.0
    think = "<think>half</think> \\boxed{0.5}"
    assert R.math_boxed_reward(think, "0.5", with_think=True)["format_score"] == 0.0
    for bad in ("\\boxed{0.5}", "</think><think> \\boxed{0.5}", "<think><think></think>"):
        parts = R.math_boxed_reward(bad, "0.5", with_think=True, format_score_coef=0.3)
        assert parts["format_score"] == -0.3, bad


def test_math_boxed_workflow_reads_trinitys_workflow_args():
    from rft.errors import ConfigError

    wf = get_workflow("math_boxed_workflow", workflow_args={"with_think": True})
    assert "<think>" in wf.system_prompt
    assert wf.score("\\boxed{1}", "1") == {"accuracy": 1.0, "format_score": -0.1}
    coef = get_workflow("math_boxed_workflow", workflow_args={"format_score_coef": 0.5})
    assert coef.score("\\boxed{1}", "1")["format_score"] == 0.0  # no penalty without with_think
    base = get_workflow("math_boxed_workflow", "accuracy_reward", workflow_args={"use_base": True})
    assert base.base_prompt and not coef.base_prompt  # a prompt argument: the reward never sees it
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}]
    assert base.prompt_text(messages) == "System:Be brief.\nUser:\n1+1?\nAssistant:\n"
    assert base.prompt_text(messages[1:]) == "User:\n1+1?\nAssistant:\n"
    with pytest.raises(ConfigError, match="takes none"):
        get_workflow("math_workflow", workflow_args={"with_think": True})
    with pytest.raises(ConfigError, match="reward_fn_args instead"):
        get_workflow(
            "math_boxed_workflow", "accuracy_reward", None, workflow_args={"with_think": True}
        )


def test_accuracy_and_format_rewards():
    assert R.accuracy_reward("<answer>5</answer>", "5") == {"accuracy": 1.0}
    assert R.accuracy_reward("it is \\boxed{5}", "5") == {"accuracy": 1.0}
    assert R.accuracy_reward("5", "5") == {"accuracy": 1.0}
    assert R.format_reward(think_answer("x"), "") == {"format_score": 0.1}


# ----------------------------------------------------------------------------- resolution


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        textwrap.dedent("""
        def length_bonus(response, truth, scale=1.0):
            return {"exact": float(response == truth), "short": scale / (1 + len(response))}

        def plain(response, truth):
            return 0.25

        def broken(response, truth):
            return "yes"

        NOT_CALLABLE = 3
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_rewards"
    sys.modules.pop("my_rewards", None)


def test_builtin_reward_by_name():
    assert R.get_reward_fn("math_reward") is R.math_reward


def test_user_reward_by_dotted_path(user_module):
    fn = R.get_reward_fn("my_rewards:length_bonus", {"scale": 3.0})
    assert fn("ab", "ab") == {"exact": 1.0, "short": 1.0}
    assert R.get_reward_fn("my_rewards.plain")("x", "y") == {"reward": 0.25}


def test_user_reward_returning_garbage_raises(user_module):
    with pytest.raises(ConfigError, match="must return a float"):
        R.get_reward_fn("my_rewards:broken")("x", "y")


@pytest.mark.parametrize(
    "spec, words",
    [
        ("no_such_pkg_xyz.rewards:fn", ["could not import module", "no_such_pkg_xyz.rewards"]),
        ("my_rewards:missing", ["has no callable", "missing"]),
        ("my_rewards:NOT_CALLABLE", ["has no callable"]),
        ("mathreward", ["not a built-in", "math_reward"]),
    ],
)
def test_bad_reward_paths_say_what_was_tried(user_module, spec, words):
    with pytest.raises(ConfigError) as e:
        R.get_reward_fn(spec)
    assert all(w in str(e.value) for w in words)


def test_reward_args_are_checked(user_module):
    with pytest.raises(ConfigError, match="cannot be called"):
        R.get_reward_fn("my_rewards:plain", {"scale": 2})
    with pytest.raises(ConfigError, match="takes no arguments"):
        R.get_reward_fn("math_reward", {"scale": 2})


# ----------------------------------------------------------------------------- workflows

FMT = {"prompt_key": "question", "response_key": "answer"}


def test_math_workflow_messages_truth_and_score():
    wf = get_workflow("math_workflow")
    row = {"question": "Tom has 2 pens and buys 3. How many?", "answer": "2 + 3 = 5\n#### 5"}
    assert wf.build_messages(row, FMT) == [
        {"role": "system", "content": MATH_SYSTEM_PROMPT},
        {"role": "user", "content": row["question"]},
    ]
    assert wf.ground_truth(row, FMT) == "5"
    assert wf.score(think_answer("5"), "5") == {"accuracy": 1.0, "format_score": 0.1}


def test_format_system_prompt_and_reply_prefix():
    wf = get_workflow("math_workflow")
    fmt = dict(FMT, system_prompt="Be brief.", reply_prefix="<think>")
    messages = wf.build_messages({"question": "1+1?", "answer": "2"}, fmt)
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[-1] == {"role": "assistant", "content": "<think>"}
    # the generated text continues the prefix: its opening <think> counts for the format
    assert (
        wf.score("ok</think><answer>2</answer>", "2", reply_prefix="<think>")["format_score"] == 0.1
    )


def test_messages_key_drops_the_trailing_assistant_reply():
    wf = get_workflow("simple_workflow")
    row = {
        "chat": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        "answer": "x",
    }
    assert wf.build_messages(row, {"messages_key": "chat"}) == [{"role": "user", "content": "hi"}]
    with pytest.raises(DataError, match="'chat'"):
        wf.build_messages({"chat": "not a list"}, {"messages_key": "chat"})


def test_missing_prompt_column_names_key_and_available_columns():
    with pytest.raises(DataError) as e:
        get_workflow("math_workflow").build_messages({"problem": "?", "solution": "1"}, FMT)
    assert "'question'" in str(e.value) and "['problem', 'solution']" in str(e.value)


def test_boxed_and_simple_workflows(user_module):
    boxed = get_workflow("math_boxed_workflow")
    assert "\\boxed{}" in boxed.build_messages({"question": "q"}, FMT)[0]["content"]
    assert boxed.ground_truth({"answer": "work... \\boxed{\\frac{1}{2}}"}, FMT) == "\\frac{1}{2}"
    assert boxed.score("\\boxed{0.5}", "\\frac{1}{2}")["accuracy"] == 1.0
    simple = get_workflow("simple_workflow", "my_rewards:length_bonus", {"scale": 0.0})
    assert simple.build_messages({"question": "q"}, FMT) == [{"role": "user", "content": "q"}]
    assert simple.score("a", "a") == {"exact": 1.0, "short": 0.0}


def test_answer_extractor_of_each_workflow_and_user_functions(user_module):
    assert set(R.ANSWER_EXTRACTORS) == set(R.REWARD_FNS)
    by_workflow = {
        name: R.answer_extractor(get_workflow(name).reward_fn)
        for name in WORKFLOWS
        if name not in ALIASES
    }
    assert by_workflow == {
        "math_workflow": "last <answer>...</answer> tag",
        "math_boxed_workflow": "last \\boxed{...}",
        "simple_workflow": "last <answer>...</answer> tag, else last \\boxed{...}, else the whole response",
        "on_policy_distill_workflow": "last <answer>...</answer> tag, else last \\boxed{...}, else the whole response",
        "on_policy_distill_math_workflow": "last \\boxed{...}",
    }
    assert R.answer_extractor(R.format_reward).startswith("none")
    assert (
        R.answer_extractor(R.get_reward_fn("my_rewards:length_bonus", {"scale": 2.0}))
        == "user function my_rewards:length_bonus"
    )
    assert (
        R.answer_extractor(R.get_reward_fn("my_rewards.plain")) == "user function my_rewards:plain"
    )


def test_unknown_workflow():
    with pytest.raises(ConfigError, match="Did you mean 'math_workflow'"):
        get_workflow("math_workfow")
    assert set(WORKFLOWS) - set(ALIASES) == {
        "math_workflow",
        "math_boxed_workflow",
        "simple_workflow",
        "on_policy_distill_workflow",
        "on_policy_distill_math_workflow",
    }
    assert get_workflow("async_math_workflow").system_prompt == MATH_SYSTEM_PROMPT


@pytest.mark.parametrize(
    "reply, accuracy, fmt",
    [
        ("12 + 7 = 19.", 1.0, 0.1),
        ("It is 19 apples.", 1.0, 0.1),  # a unit word may follow the final number
        ("The answer is **19**", 1.0, 0.1),
        ("19 is what you get when you add them", 1.0, -0.1),  # rambling past the answer
        (
            "12 + 7 = 19, so with 3 more it is 22.",
            0.0,
            0.1,
        ),  # the last number is read, not the first
        ("Tom has 1,219 coins", 0.0, 0.1),
        ("I do not know.", 0.0, -0.1),
    ],
)
def test_final_number_reward_reads_the_last_number(reply, accuracy, fmt):
    assert R.final_number_reward(reply, "19") == {"accuracy": accuracy, "format_score": fmt}
    assert R.get_reward_fn("final_number_reward") is R.final_number_reward


def test_countdown_reward_checks_numbers_and_target():
    truth = '{"target": 16, "numbers": [2, 3, 5]}'
    assert R.countdown_reward("<answer>(3 + 5) * 2</answer>", truth) == {"score": 1.0}
    assert R.countdown_reward("<answer>3 + 5 + 2</answer>", truth) == {"score": 0.1}  # misses
    assert R.countdown_reward("<answer>(3 + 5) * 2 * 2</answer>", truth) == {
        "score": 0.1
    }  # 2 twice
    assert R.countdown_reward(
        "<answer>9**9**9</answer>", '{"target": 1, "numbers": [9, 9, 9]}'
    ) == {"score": 0.1}
    assert R.countdown_reward("16", truth) == {"score": 0.0}
    assert R.countdown_reward("<answer>16</answer>", "{'target': 16, 'numbers': [16]}") == {
        "score": 1.0
    }


def test_math_dapo_reward_and_its_overlong_penalty():
    assert R.math_dapo_reward("so\nAnswer: 42", "42") == {
        "accuracy": 1.0,
        "wrong_answer": 0.0,
        "format_score": 0.0,
    }
    assert R.math_dapo_reward("Answer: 41", "42")["wrong_answer"] == -1.0
    fn = R.get_reward_fn(
        "math_dapo_reward",
        {
            "enable_overlong_penalty": True,
            "penalty_factor": 1.0,
            "max_response_length": 100,
            "cache_length": 20,
        },
    )
    assert fn("Answer: 42", "42", response_length=80)["format_score"] == 0.0
    assert fn("Answer: 42", "42", response_length=90)["format_score"] == pytest.approx(-0.5)
    assert fn("Answer: 42", "42", response_length=150)["format_score"] == -1.0
    with pytest.raises(ConfigError, match="needs penalty_factor"):
        R.get_reward_fn("math_dapo_reward", {"enable_overlong_penalty": True})
    with pytest.raises(ConfigError, match="Did you mean 'cache_length'"):
        R.get_reward_fn("math_dapo_reward", {"cache_lenght": 2})
    recipe = get_workflow(
        "simple_workflow",
        "math_dapo_reward",
        {
            "enable_overlong_penalty": True,
            "penalty_factor": 1.0,
            "max_response_length": 10,
            "cache_length": 5,
        },
    )
    assert recipe.score("Answer: 3", "3", response_length=20)["format_score"] == -1.0
