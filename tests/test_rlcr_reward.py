"""``rlcr_reward`` (RLCR: format, accuracy and the Brier score of the stated confidence), as
Trinity users call it: ``RLCRRewardFn(**reward_fn_args)(response=..., truth=...)``, by name in a
single-turn recipe, and with MathWorkflow as Trinity's examples/rlcr_math/rlcr_math.yaml runs it.

Every expected value is hand-computed from Trinity-RFT's
trinity/common/rewards/rlcr_reward.py at agentscope-ai/Trinity-RFT@cc24051 (default weights
format 0.5, accuracy 0.5, brier 0.5, mean_confidence 1e-5, confidence_one_or_zero 1e-5;
brier = 1 - (accuracy - confidence)^2; a malformed reply scores format, accuracy and brier 0
but still logs its last stated confidence).
"""

from __future__ import annotations

import pytest

from rft.config.schema import FormatConfig
from rft.errors import ConfigError
from rft.workflow import (
    REWARD_FUNCTIONS,
    GenerationConfig,
    MathWorkflow,
    RLCRRewardFn,
    Task,
)
from rft.workflow.conversation import ChatTemplate
from rft.workflow.reward_fn import reward_fn_class, reward_function
from rft.workflow.rewards import answer_extractor
from rft.workflow.single_turn import get_workflow
from tests.helpers.scripted_model import scripted_model


def reply(answer: str = "4", confidence: str = "0.8", tail: str = "") -> str:
    return (
        f"<think>2 + 2 is 4</think> <answer>{answer}</answer>\n"
        f"<analysis>checked</analysis> <confidence>{confidence}</confidence>{tail}"
    )


def parts(fmt, acc, brier, mean, extreme) -> dict:
    return {
        "format": fmt,
        "accuracy": acc,
        "brier": brier,
        "mean_confidence": mean,
        "confidence_one_or_zero": extreme,
    }


@pytest.mark.parametrize(
    "response, expected",
    [
        # right, 0.8 sure: brier 0.5 * (1 - 0.2^2) = 0.48, mean 1e-5 * 0.8
        (reply(), parts(0.5, 0.5, 0.48, 8e-6, 0.0)),
        # wrong, 0.8 sure: brier 0.5 * (1 - 0.8^2) = 0.18
        (reply(answer="5"), parts(0.5, 0.0, 0.18, 8e-6, 0.0)),
        # right and certain: brier 0.5, and the all-or-nothing flag (1.0 > 0.99)
        (reply(confidence="1"), parts(0.5, 0.5, 0.5, 1e-5, 1e-5)),
        # wrong and 0.005 sure: brier 0.5 * (1 - 0.005^2), flag (0.005 < 0.01)
        (reply(answer="3", confidence=" 0.005 "), parts(0.5, 0.0, 0.4999875, 5e-8, 1e-5)),
        # text after </confidence>: malformed, the stated 0.8 is still logged
        (reply(tail=" Thanks!"), parts(0.0, 0.0, 0.0, 8e-6, 0.0)),
        # text between </answer> and <analysis>: malformed
        (reply().replace("\n<analysis>", " so <analysis>"), parts(0.0, 0.0, 0.0, 8e-6, 0.0)),
        # a confidence outside [0, 1]: malformed, and none logged
        (reply(confidence="1.5"), parts(0.0, 0.0, 0.0, 0.0, 0.0)),
        # nested tags: malformed
        (
            "<think><answer>4</answer></think><answer>4</answer><analysis>a</analysis>"
            "<confidence>0.5</confidence>",
            parts(0.0, 0.0, 0.0, 5e-6, 0.0),
        ),
        # a tag inside the last confidence: nothing logged either
        (
            "<think>x</think><answer>4</answer><analysis>a</analysis>"
            "<confidence>0.5<think></confidence>",
            parts(0.0, 0.0, 0.0, 0.0, 0.0),
        ),
        # earlier text and balanced blocks before the closing chain are allowed
        (
            "First try <answer>3</answer>, no. " + reply(confidence="0.5"),
            parts(0.5, 0.5, 0.375, 5e-6, 0.0),
        ),
    ],
)
def test_the_five_parts_with_trinitys_default_weights(response, expected):
    got = RLCRRewardFn()(response=response, truth="4")
    assert got == pytest.approx(expected, abs=1e-12)


def test_the_weights_of_the_rlcr_example_and_the_reward_is_their_sum():
    # examples/rlcr_math/rlcr_math.yaml's reward_fn_args; the workflow sums the parts
    weights = {
        "format": 0.5,
        "accuracy": 0.5,
        "brier": 0.5,
        "mean_confidence": 1.0e-5,
        "confidence_one_or_zero": 1.0e-5,
    }
    got = REWARD_FUNCTIONS.get("rlcr_reward")(weights=weights)(response=reply(), truth="4")
    assert sum(got.values()) == pytest.approx(0.5 + 0.5 + 0.48 + 8e-6)
    doubled = {**weights, "brier": 1.0, "accuracy": 0.0}
    got = RLCRRewardFn(weights=doubled)(response=reply(), truth="4")
    assert (got["accuracy"], got["brier"]) == (0.0, pytest.approx(0.96))


@pytest.mark.parametrize(
    "weights, match",
    [
        ({"format": 1.0}, "missing"),
        ({**{k: 1.0 for k in ("format", "accuracy", "brier")}, "mean_confidence": 0, "x": 1}, "x"),
        ([1, 2, 3, 4, 5], "not a mapping"),
    ],
)
def test_bad_weights_fail_when_the_config_is_loaded(weights, match):
    with pytest.raises(ConfigError, match=match):
        reward_function("rlcr_reward", {"weights": weights})
    with pytest.raises(ConfigError, match=match):
        reward_fn_class("rlcr_reward", {"weights": weights})


def test_a_weight_that_is_not_a_finite_number_is_refused():
    weights = dict.fromkeys(
        ("format", "accuracy", "brier", "mean_confidence", "confidence_one_or_zero"), 1.0
    )
    for bad in (True, float("nan"), "0.5"):
        with pytest.raises(ConfigError, match="finite number"):
            RLCRRewardFn(weights={**weights, "brier": bad})


def test_the_truth_is_read_as_rfts_rewards_read_it():
    # a GSM8K solution cell: the number after ####
    got = RLCRRewardFn()(response=reply(confidence="1"), truth="2 and 2 make 4.\n#### 4")
    assert got["accuracy"] == 0.5 and got["brier"] == 0.5
    # no truth: well formed, but neither accuracy nor brier (Trinity's rule)
    assert RLCRRewardFn()(response=reply(), truth=None) == pytest.approx(
        parts(0.5, 0.0, 0.0, 8e-6, 0.0)
    )


def test_a_verifier_that_fails_scores_no_accuracy_nor_brier():
    def broken(answer, truth):
        raise TimeoutError("verification timed out")

    got = RLCRRewardFn(verifier=broken)(response=reply(), truth="4")
    assert got == pytest.approx(parts(0.5, 0.0, 0.0, 8e-6, 0.0))
    # a parser and a verifier of the user's: the parser reads answer and truth
    loose = RLCRRewardFn(answer_parser=lambda s: s.strip().lower(), verifier=str.__eq__)
    assert loose(response=reply(answer=" Four"), truth="FOUR")["accuracy"] == 0.5


def test_by_name_in_a_single_turn_recipe():
    recipe = get_workflow("math_workflow", "rlcr_reward", None)
    assert recipe.score(reply(), "4") == pytest.approx(parts(0.5, 0.5, 0.48, 8e-6, 0.0))
    assert "closing" in answer_extractor(recipe.reward_fn)


def test_math_workflow_with_rlcr_reward_as_the_rlcr_example_runs_it(smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    template = ChatTemplate(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir))
    system = "Solve the math problem and finish with exactly this four-tag sequence: ..."
    task = Task(
        workflow=MathWorkflow,
        format_args=FormatConfig(
            prompt_key="prompt", response_key="solution", system_prompt=system
        ),
        rollout_args=GenerationConfig(temperature=1.0, max_tokens=64),
        reward_fn=reward_fn_class("rlcr_reward"),
        raw_task={"prompt": "What is 2 + 2?", "solution": "4"},
        task_id="rlcr/0",
    )
    model, service = scripted_model(template, [reply(), reply(answer="5", confidence="1")])
    workflow = task.to_workflow(model)
    workflow.set_repeat_times(2, 0)
    replies = workflow.run()
    assert system in template.tokenizer.decode(service.calls[0][0])
    # right at 0.8: 1.480008; wrong at 1.0: format 0.5 + brier 0 + mean 1e-5 + flag 1e-5
    assert [r.reward for r in replies] == pytest.approx([1.480008, 0.50002])
    assert replies[1].metrics["confidence_one_or_zero"] == pytest.approx(1e-5)
