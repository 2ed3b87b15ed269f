"""Trinity-RFT's reward classes: ``RewardFn``, the ``REWARD_FUNCTIONS`` registry, the built-ins.

Data in: a workflow's call ``reward_fn(response=..., truth=...)`` on an instance built with the
taskset's ``reward_fn_args`` (Trinity's ``task.reward_fn(**task.reward_fn_args)``). Data out:
reward parts, ``dict[str, float]``. Each built-in class calls the pure function of its config
name in :mod:`rft.workflow.rewards`, which owns the rules. A user's class registered with
``@REWARD_FUNCTIONS.register_module(name)`` in a plugin module answers to that name in configs:
:func:`reward_fn_class` gives workflow classes their ``Task.reward_fn``, :func:`reward_function`
gives the single-turn recipes a function. Also Trinity's answer helpers users import.
"""

from __future__ import annotations

import functools
import inspect
import re
from abc import ABC, abstractmethod
from typing import Any, Callable, Mapping, Optional

from rft.errors import ConfigError, WorkflowError
from rft.workflow.registry import Registry, load_plugins
from rft.workflow.rewards import (
    FORMAT_SCORE,
    REWARD_FNS,
    RewardFunction,
    RewardParts,
    accuracy_reward,
    answers_match,
    as_reward_parts,
    countdown_reward,
    extract_ground_truth,
    final_number_reward,
    format_reward,
    get_reward_fn,
    import_user_fn,
    last_boxed,
    last_number,
    math_boxed_reward,
    math_dapo_reward,
    math_reward,
    one_think_block,
    rlcr_answer_matches,
)
from rft.workflow.rlcr import checked_weights, rlcr_parts

REWARD_FUNCTIONS = Registry("reward function")


class RewardFn(ABC):
    """Trinity's reward base class: built with the taskset's ``reward_fn_args``, called with
    keyword arguments (``response=``, ``truth=``, ...), returns reward parts (their sum is the
    reward). Both methods are abstract, as in Trinity: a subclass defines ``__init__`` too."""

    @abstractmethod
    def __init__(self, **kwargs: Any) -> None: ...

    @abstractmethod
    def __call__(self, **kwargs: Any) -> dict[str, float]: ...


def _text(truth: Any) -> str:
    return "" if truth is None else str(truth)


# ----------------------------------------------------------------------------- Trinity's helpers


def validate_think_pattern(text: str) -> bool:
    """Exactly one ``<think>`` and one ``</think>``, in that order (Trinity's)."""
    return one_think_block(text)


_FIRST_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>")  # Trinity's: the first, one line
_ANSWER_IS = re.compile(r"(?:final|the)\s+answer\s+is\s*:?\s*(.+)", re.IGNORECASE)


def simple_answer_parser(response: str) -> str:
    """The answer in a reply: the content of its first ``<answer>...</answer>``, else the whole
    reply, stripped. (Trinity's returns math_verify's parse of that text; rft's returns the text,
    which rft's comparison, :func:`~rft.workflow.rewards.answers_match`, parses itself.)"""
    found = _FIRST_ANSWER_TAG.search(response)
    return (found.group(1) if found else response).strip()


def compute_score(solution_str: str, ground_truth: str) -> float:
    """1.0 if the last ``\\boxed{}`` of ``solution_str`` equals the reference answer of
    ``ground_truth`` (its last box, its GSM8K ``####`` number, else its text), else 0.0."""
    return math_boxed_reward(solution_str, extract_ground_truth(str(ground_truth)))["accuracy"]


def _stated_answer(text: str) -> Optional[str]:
    """Qwen2.5-Math's reading of a reply: the last box, else "the answer is X", else the last
    number."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    stated = _ANSWER_IS.search(text)
    if stated:
        return stated.group(1).strip().rstrip(".")
    return last_number(text)


def verify_math_answer(response_text: str, ground_truth: str) -> tuple[float, dict[str, Any]]:
    """Trinity's evaluation check (Qwen2.5-Math's): (accuracy 1.0/0.0, details with
    ``parsed_prediction``, ``ground_truth`` and ``is_correct``). The reply's answer is its last
    box, else "the answer is X", else its last number; the truth's is read as by
    :func:`~rft.workflow.rewards.extract_ground_truth`."""
    predicted = _stated_answer(response_text)
    truth = extract_ground_truth(str(ground_truth))
    correct = predicted is not None and answers_match(predicted, truth)
    details = {"parsed_prediction": predicted, "ground_truth": truth, "is_correct": correct}
    return float(correct), details


def _accuracy_by(parser: Callable[[str], Any], response: str, truth: Any) -> float:
    """Trinity's ``AccuracyReward(answer_parser)``: the parser reads the answer of the reply
    and of the truth; rft compares the two strings."""
    predicted, expected = parser(response), parser(_text(truth))
    for value in (predicted, expected):
        if value is not None and not isinstance(value, str):
            raise WorkflowError(
                f"answer_parser {getattr(parser, '__qualname__', parser)!r} returned "
                f"{type(value).__name__}; in rft it returns the answer as a string (or None), "
                "which rft's answers_match compares"
            )
    return float(
        predicted is not None and expected is not None and answers_match(predicted, expected)
    )


def _format_by(pattern: str, response: str) -> float:
    """Trinity's ``FormatReward(pattern)``: +0.1 if the reply matches, -0.1 otherwise."""
    return FORMAT_SCORE if re.match(pattern, response, re.DOTALL | re.MULTILINE) else -FORMAT_SCORE


# ----------------------------------------------------------------------------- built-in classes
# Each takes extra call keywords and leaves them (a workflow may pass more than a reward reads,
# as MathBoxedWorkflow does), and reads a missing truth as "".


@REWARD_FUNCTIONS.register_module("accuracy_reward")
class AccuracyReward(RewardFn):
    """``accuracy`` 1.0/0.0 (:func:`~rft.workflow.rewards.accuracy_reward`: the last
    ``<answer>``, else the last box, else the whole reply); with ``answer_parser`` (text ->
    answer string), the parser's answers of reply and truth compared."""

    def __init__(self, answer_parser: Optional[Callable[[str], Any]] = None):
        self.answer_parser = None if answer_parser is simple_answer_parser else answer_parser

    def __call__(
        self, response: str, prompt: Optional[str] = None, truth: Optional[str] = None, **kwargs
    ) -> dict[str, float]:
        if self.answer_parser is None:
            return accuracy_reward(response, _text(truth))
        return {"accuracy": _accuracy_by(self.answer_parser, response, truth)}


@REWARD_FUNCTIONS.register_module("format_reward")
class FormatReward(RewardFn):
    """``format_score`` +0.1/-0.1: rft's think/answer structure
    (:func:`~rft.workflow.rewards.format_reward`), or whether the reply matches ``pattern``."""

    def __init__(self, pattern: Optional[str] = None):
        self.pattern = pattern

    def __call__(self, response: str, **kwargs) -> dict[str, float]:
        if self.pattern is None:
            return format_reward(response, "")
        return {"format_score": _format_by(self.pattern, response)}


@REWARD_FUNCTIONS.register_module("math_reward")
class MathRewardFn(RewardFn):
    """R1-style math (:func:`~rft.workflow.rewards.math_reward`): ``accuracy`` of the last
    ``<answer>`` and ``format_score`` +0.1/-0.1 for one think block then one answer block;
    ``answer_parser`` / ``pattern`` replace either rule as in :class:`AccuracyReward` /
    :class:`FormatReward`."""

    def __init__(
        self,
        answer_parser: Optional[Callable[[str], Any]] = None,
        pattern: Optional[str] = None,
    ) -> None:
        self.accuracy_reward = AccuracyReward(answer_parser)
        self.format_reward = FormatReward(pattern)

    def __call__(
        self, response: str, prompt: Optional[str] = None, truth: Optional[str] = None, **kwargs
    ) -> dict[str, float]:
        parts = math_reward(response, _text(truth))
        if self.accuracy_reward.answer_parser is not None:
            parts.update(self.accuracy_reward(response, prompt, truth))
        if self.format_reward.pattern is not None:
            parts.update(self.format_reward(response))
        return parts


@REWARD_FUNCTIONS.register_module("math_boxed_reward")
class MathBoxedRewardFn(RewardFn):
    """``accuracy`` of the last ``\\boxed{}``; ``format_score`` 0, or ``-format_score_coef``
    with ``with_think`` when the reply lacks one think block
    (:func:`~rft.workflow.rewards.math_boxed_reward`). The call's ``with_think`` /
    ``format_score_coef`` (MathBoxedWorkflow passes its workflow_args) override the
    constructor's (rft's reward_fn_args; Trinity's constructor takes and drops any)."""

    def __init__(self, with_think: bool = False, format_score_coef: float = 0.1) -> None:
        self.with_think = with_think
        self.format_score_coef = format_score_coef

    def __call__(
        self,
        response: str,
        truth: Optional[str] = None,
        with_think: Optional[bool] = None,
        format_score_coef: Optional[float] = None,
        **kwargs,
    ) -> dict[str, float]:
        return math_boxed_reward(
            response,
            _text(truth),
            with_think=self.with_think if with_think is None else bool(with_think),
            format_score_coef=(
                self.format_score_coef if format_score_coef is None else format_score_coef
            ),
        )


@REWARD_FUNCTIONS.register_module("countdown_reward")
class CountDownRewardFn(RewardFn):
    """TinyZero's countdown (:func:`~rft.workflow.rewards.countdown_reward`): ``score`` 1.0,
    0.1 for a well-formed equation that misses, 0 without one."""

    def __init__(self) -> None:
        pass

    def __call__(
        self, response: str, prompt: Optional[str] = None, truth: Optional[str] = None, **kwargs
    ) -> dict[str, float]:
        return countdown_reward(response, _text(truth))


@REWARD_FUNCTIONS.register_module("math_dapo_reward")
class MathDAPORewardFn(RewardFn):
    """DAPO's math reward (:func:`~rft.workflow.rewards.math_dapo_reward`): ``accuracy`` +1 for
    a right last ``Answer: X`` line, -1 otherwise; ``format_score`` the soft overlong penalty of
    ``len(response_token)`` with ``enable_overlong_penalty``, else 0."""

    def __init__(
        self,
        enable_overlong_penalty: Optional[bool] = None,
        penalty_factor: Optional[float] = None,
        max_response_length: Optional[int] = None,
        cache_length: Optional[int] = None,
    ) -> None:
        self.settings = {
            "enable_overlong_penalty": bool(enable_overlong_penalty),
            "penalty_factor": penalty_factor,
            "max_response_length": max_response_length,
            "cache_length": cache_length,
        }
        math_dapo_reward("", "", **self.settings)  # a bad combination fails here, when built

    def __call__(
        self,
        response: str,
        response_token: Optional[Any] = None,
        truth: Optional[str] = None,
        **kwargs,
    ) -> dict[str, float]:
        if response_token is None and self.settings["enable_overlong_penalty"]:
            raise WorkflowError(
                "MathDAPORewardFn with enable_overlong_penalty needs the reply's token ids: "
                "call it with response_token=response.tokens[response.prompt_length:]"
            )
        length = 0 if response_token is None else len(response_token)
        parts = math_dapo_reward(response, _text(truth), response_length=length, **self.settings)
        return {
            "accuracy": parts["accuracy"] + parts["wrong_answer"],  # +1 right, -1 wrong
            "format_score": parts["format_score"],
        }


@REWARD_FUNCTIONS.register_module("final_number_reward")
class FinalNumberRewardFn(RewardFn):
    """rft's prose-reply reward (:func:`~rft.workflow.rewards.final_number_reward`):
    ``accuracy`` of the last number, ``format_score`` +0.1 if it ends the reply, else -0.1."""

    def __init__(self) -> None:
        pass

    def __call__(
        self, response: str, prompt: Optional[str] = None, truth: Optional[str] = None, **kwargs
    ) -> dict[str, float]:
        return final_number_reward(response, _text(truth))


@REWARD_FUNCTIONS.register_module("rlcr_reward")
class RLCRRewardFn(RewardFn):
    """RLCR (:func:`~rft.workflow.rewards.rlcr_reward`): ``format``, ``accuracy``, ``brier``,
    ``mean_confidence``, ``confidence_one_or_zero``, each times its ``weights`` entry (all five,
    or None for Trinity's defaults). ``answer_parser`` (text -> answer) reads the closing answer
    and the truth, ``verifier(answer, truth) -> bool`` compares them (rft's ``answers_match`` on
    the parsed strings if not given); by default the answer text is compared with the truth
    read by ``extract_ground_truth``. A parser or verifier that raises scores accuracy and
    brier 0, as in Trinity."""

    def __init__(
        self,
        weights: Optional[Mapping[str, Any]] = None,
        answer_parser: Optional[Callable[[str], Any]] = None,
        verifier: Optional[Callable[[Any, Any], bool]] = None,
    ) -> None:
        for name, fn in (("answer_parser", answer_parser), ("verifier", verifier)):
            if fn is not None and not callable(fn):
                raise ConfigError(f"RLCRRewardFn {name}: {fn!r} is not callable")
        self.weights = checked_weights(weights)
        self.answer_parser = None if answer_parser is simple_answer_parser else answer_parser
        self.verifier = verifier

    def _verify(self, answer: str, truth: str) -> bool:
        if self.answer_parser is None and self.verifier is None:
            return rlcr_answer_matches(answer, truth)
        if self.answer_parser is None:
            parsed, expected = answer.strip(), extract_ground_truth(truth)
        else:
            parsed, expected = self.answer_parser(answer), self.answer_parser(truth)
        return bool((self.verifier or answers_match)(parsed, expected))

    def __call__(
        self, response: str, prompt: Optional[str] = None, truth: Optional[str] = None, **kwargs
    ) -> dict[str, float]:
        return rlcr_parts(
            response, None if truth is None else str(truth), self.weights, self._verify
        )


BUILTIN_REWARDS: dict[str, type] = dict(REWARD_FUNCTIONS.classes)  # config name -> class
assert set(BUILTIN_REWARDS) == set(REWARD_FNS), "one class per built-in reward function"


# ----------------------------------------------------------------------------- resolution


class _FunctionReward(RewardFn):
    """A RewardFn around a plain ``pkg.module:function`` reward whose ``reward_fn_args`` were
    bound (and checked) at load: the constructor takes them again, as workflows pass them, and
    leaves them."""

    fn: RewardFunction  # set per function by reward_fn_class

    def __init__(self, **_bound_at_load: Any) -> None:
        pass

    def __call__(self, response: str, truth: Optional[str] = None, **kwargs) -> dict[str, float]:
        return type(self).fn(response, _text(truth))


def _reward_class(spec: str) -> Optional[type]:
    """The RewardFn class ``spec`` names: registered (built-in or a plugin's), or imported from
    a ``pkg.module:Class`` path; None for anything else (a function, or an error to report)."""
    cls = REWARD_FUNCTIONS.get(spec)
    if cls is not None or spec in REWARD_FNS or not ("." in spec or ":" in spec):
        return cls
    found = import_user_fn(spec)
    return found if isinstance(found, type) and issubclass(found, RewardFn) else None


def _check_constructor(spec: str, cls: type, args: Mapping[str, Any]) -> None:
    """Fail at load (the login node) when ``cls(**args)`` cannot be called; a built-in class is
    built once too, so a bad combination of values fails here as well."""
    name = f"{cls.__module__}.{cls.__qualname__}"
    if inspect.isabstract(cls):
        missing = sorted(getattr(cls, "__abstractmethods__", ()))
        raise ConfigError(
            f"reward {spec!r}: {name} does not define {missing} (RewardFn's are abstract, as "
            "in Trinity); define __init__ and __call__"
        )
    try:
        inspect.signature(cls).bind(**args)
    except TypeError as e:
        raise ConfigError(
            f"reward_fn_args {sorted(args)}: reward {spec!r} ({name}) cannot be built with "
            f"them: {e}. Fix reward_fn_args or the class's __init__."
        ) from e
    except ValueError:
        return  # no signature to check
    if cls is BUILTIN_REWARDS.get(spec):
        cls(**args)


def reward_fn_class(spec: str, args: Optional[Mapping[str, Any]] = None) -> type:
    """``Task.reward_fn`` of a workflow class's tasks for the config's reward name: the class
    registered under it (``task.reward_fn is MathRewardFn`` for ``math_reward``), a
    ``pkg.module:Class`` RewardFn, or a ``pkg.module:function`` in a RewardFn class. Plugins are
    loaded first; ``args`` (``reward_fn_args``; the workflow builds the class with them) are
    checked here."""
    load_plugins()
    args = dict(args or {})
    cls = _reward_class(spec)
    if cls is None:
        fn = get_reward_fn(spec, args)  # today's errors for any other name
        return type(spec, (_FunctionReward,), {"fn": staticmethod(fn)})
    _check_constructor(spec, cls, args)
    return cls


def reward_function(spec: str, args: Optional[Mapping[str, Any]] = None) -> RewardFunction:
    """``fn(response, truth) -> parts`` for a single-turn recipe: a built-in's pure function
    with ``args`` bound, a user function, or a registered (or ``pkg.module:Class``) RewardFn
    class built with ``args`` on first use, as Trinity does ``reward_fn(**reward_fn_args)``.
    Plugins are loaded first."""
    load_plugins()
    cls = _reward_class(spec)
    if cls is None or cls is BUILTIN_REWARDS.get(spec):
        return get_reward_fn(spec, args)
    args = dict(args or {})
    _check_constructor(spec, cls, args)
    # Built on first use, in the process that scores: a user's class may load a judge model.
    instance = functools.cache(lambda: cls(**args))

    def call(response: str, truth: str) -> RewardParts:
        return instance()(response=response, truth=truth)

    call.__module__, call.__qualname__ = cls.__module__, cls.__qualname__  # answer_extractor
    return as_reward_parts(spec, call)
