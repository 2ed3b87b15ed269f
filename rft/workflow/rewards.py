"""Reward functions: a response and a ground truth (strings) -> named reward parts (floats).

A reward function is ``fn(response: str, truth: str, **args) -> dict[str, float]``; the reward
of an experience is the sum of its parts, stored with it for metrics. Reward model scores
(:mod:`rft.explorer.reward_model`) are parts too, weighed in by :func:`combine_reward`.
Built-ins: ``REWARD_FNS``; a user's ``package.module:function`` via :func:`get_reward_fn`.
Trinity's class shape of each (``MathRewardFn``...) and user classes: :mod:`rft.workflow.reward_fn`.
:func:`answer_extractor` says where a reward function reads the answer (``ANSWER_EXTRACTORS``).
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import json
import logging
import operator
import re
import threading
from fractions import Fraction
from typing import Any, Callable, Mapping, Sequence

from rft.config.known_names import REWARD_FNS as TRINITY_REWARD_FNS
from rft.config.known_names import TRINITY_NAMES
from rft.config.typed_dict import not_supported
from rft.errors import ConfigError, did_you_mean
from rft.workflow.rlcr import checked_weights, rlcr_parts

log = logging.getLogger(__name__)

RewardParts = dict[str, float]
RewardFunction = Callable[..., RewardParts]

FORMAT_SCORE = 0.1
MATH_VERIFY_TIMEOUT_S = 5

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER_RE = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")
_FINAL_NUMBER_END_RE = re.compile(r"\d(?:\s+[A-Za-z]+)?[\s.!*$]*$")  # "19", "19 apples."
_THINK_ANSWER_RE = re.compile(r"\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*", re.DOTALL)


# ----------------------------------------------------------------------------- extraction


def last_answer_tag(text: str) -> str | None:
    """Content of the last complete ``<answer>...</answer>``, stripped; None if there is none."""
    found = _ANSWER_RE.findall(text)
    return found[-1].strip() if found else None


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` (nested braces matched), or None."""
    start = text.rfind("\\boxed")
    while start != -1:
        content = _braced_content(text, start + len("\\boxed"))
        if content is not None:
            return content.strip()
        start = text.rfind("\\boxed", 0, start)  # unclosed: try an earlier box
    return None


def _braced_content(text: str, pos: int) -> str | None:
    """The text inside the ``{...}`` group opening at ``pos`` (after spaces), or None."""
    while pos < len(text) and text[pos] == " ":
        pos += 1
    if pos >= len(text) or text[pos] != "{":
        return None
    depth = 0
    for i in range(pos, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[pos + 1 : i]
    return None


def gsm8k_answer(text: str) -> str:
    """GSM8K ground truth: the number after the last ``####``, normalised (``1,234`` ->
    ``1234``, ``$5`` -> ``5``); text without ``####`` is returned stripped."""
    if "####" not in text:
        return text.strip()
    final = text.rsplit("####", 1)[1].strip()
    return _strip_decorations(final) if to_number(final) is not None else final


def extract_ground_truth(text: str) -> str:
    """A reference answer from a dataset cell: the GSM8K ``####`` number, else the last
    ``\\boxed{}`` of a worked solution, else the stripped text."""
    if "####" in text:
        return gsm8k_answer(text)
    return last_boxed(text) or text.strip()


# ----------------------------------------------------------------------------- comparison

# A unit is a word after a space ("12 dollars"), so "2x" is not read as 2.
_UNIT_TAIL = re.compile(r"(?:\s*\\?%|\s+[A-Za-z][A-Za-z .]*)$")
_THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_DECIMAL = re.compile(r"^-?(?:\d+\.?\d*|\.\d+)$")
_FRACTION = re.compile(r"^(-?\d+)\s*/\s*(-?\d+)$")
_LATEX_FRAC = re.compile(r"^(-?)\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}$")


def _strip_decorations(text: str) -> str:
    s = text.strip().replace("\u2212", "-").replace("\\!", "").replace("\\,", "")
    s = re.sub(r"\\text\{[^{}]*\}", "", s)  # \text{ dollars}
    s = s.replace("\\$", "").replace("$", "").strip()
    s = _UNIT_TAIL.sub("", s).strip().rstrip(".").strip()
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    return s


def to_number(text: str) -> Fraction | None:
    """Exact value of a plain number (``-1,234.50``, ``$5``, ``12 dollars``, ``50%``, ``3/4``,
    ``\\frac{1}{2}``), or None when ``text`` is anything else."""
    s = _strip_decorations(text)
    if _DECIMAL.match(s):
        return Fraction(s)
    match = _FRACTION.match(s)
    if match and int(match.group(2)) != 0:
        return Fraction(int(match.group(1)), int(match.group(2)))
    match = _LATEX_FRAC.match(s)
    if match and int(match.group(3)) != 0:
        value = Fraction(int(match.group(2)), int(match.group(3)))
        return -value if match.group(1) else value
    return None


def answers_match(predicted: str, truth: str) -> bool:
    """True if the predicted answer equals the truth: a fast exact path first (numbers after
    stripping ``$``, thousands commas, units and ``%``; integers, decimals and fractions compared
    as exact rationals), then ``math_verify`` (parse + verify) for anything else."""
    if not predicted.strip() or not truth.strip():
        return False
    pred_num, truth_num = to_number(predicted), to_number(truth)
    if pred_num is not None and truth_num is not None:
        if pred_num == truth_num:
            return True
        if pred_num.denominator == 1 and truth_num.denominator == 1:
            return False  # two different integers: no need to ask sympy
    return _math_verify_equal(predicted, truth)


def _mv_parse(text: str, timeout_s: int | None) -> list[Any]:
    from math_verify import parse  # imported here: it pulls in sympy (about 1 s)

    latex_first = "\\" in text
    attempts = [f"${text}$", text] if latex_first else [text, f"${text}$"]
    for attempt in attempts:
        parsed = parse(attempt, parsing_timeout=timeout_s)
        if parsed:
            return parsed
    return []


def _math_verify_equal(predicted: str, truth: str) -> bool:
    from math_verify import verify
    from math_verify.errors import TimeoutException

    # signal.alarm-based timeouts raise ValueError outside the main thread: there it runs with
    # timeouts, elsewhere without (it cannot hang on the fast path's numbers, but a
    # pathological expression could be slow).
    timeout_s = (
        MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    )
    try:
        gold, pred = _mv_parse(truth, timeout_s), _mv_parse(predicted, timeout_s)
        return bool(gold and pred and verify(gold, pred, timeout_seconds=timeout_s))
    # any math_verify error or timeout counts as a wrong answer, never an exception
    except (Exception, TimeoutException):  # TimeoutException is a BaseException
        log.debug(
            "math_verify failed on %r vs %r; counted as wrong", predicted, truth, exc_info=True
        )
        return False


# ----------------------------------------------------------------------------- reward functions


def has_think_answer_format(text: str) -> bool:
    """One ``<think>...</think>`` then one ``<answer>...</answer>``, only whitespace around."""
    match = _THINK_ANSWER_RE.fullmatch(text)
    if match is None:
        return False
    think, answer = match.groups()
    return not any(
        tag in part
        for part in (think, answer)
        for tag in ("<think>", "</think>", "<answer>", "</answer>")
    )


def _format_part(ok: bool) -> float:
    return FORMAT_SCORE if ok else -FORMAT_SCORE


def math_reward(response: str, truth: str) -> RewardParts:
    """R1-style math: accuracy of the last ``<answer>``, plus the think/answer format score."""
    answer = last_answer_tag(response)
    accuracy = 1.0 if answer is not None and answers_match(answer, truth) else 0.0
    return {"accuracy": accuracy, "format_score": _format_part(has_think_answer_format(response))}


def math_boxed_reward(
    response: str, truth: str, *, with_think: bool = False, format_score_coef: float = 0.1
) -> RewardParts:
    """Trinity's ``math_boxed_reward``: accuracy of the last ``\\boxed{}``; ``format_score`` 0,
    or ``-format_score_coef`` with ``with_think`` when the reply lacks one ``<think>`` block
    closed before any other (trinity/common/rewards/math_reward.py, math_utils.py)."""
    answer = last_boxed(response)
    accuracy = 1.0 if answer is not None and answers_match(answer, truth) else 0.0
    fault = with_think and not one_think_block(response)
    return {"accuracy": accuracy, "format_score": -float(format_score_coef) if fault else 0.0}


def one_think_block(text: str) -> bool:
    """Exactly one ``<think>`` and one ``</think>``, in that order (Trinity's
    ``validate_think_pattern``)."""
    opened, closed = text.count("<think>"), text.count("</think>")
    return opened == closed == 1 and text.find("<think>") < text.find("</think>")


def accuracy_reward(response: str, truth: str) -> RewardParts:
    """Accuracy only: the last ``<answer>``, else the last box, else the whole response."""
    answer = last_answer_tag(response)
    if answer is None:
        answer = last_boxed(response)
    if answer is None:
        answer = response
    return {"accuracy": 1.0 if answers_match(answer, truth) else 0.0}


def last_number(text: str) -> str | None:
    """The last number written in ``text`` (``19``, ``-4``, ``1,234``, ``2.5``), or None."""
    found = _NUMBER_RE.findall(text)
    return found[-1].rstrip(".,") if found else None


def final_number_reward(response: str, truth: str) -> RewardParts:
    """Replies in prose (a small model's): ``accuracy`` 1.0 if the last number in the reply
    equals the truth; ``format_score`` +0.1 if that number ends the reply (at most a unit word
    and ``.``, ``!``, ``**`` after it), -0.1 otherwise, so rambling past the answer costs reward."""
    answer = last_number(response)
    accuracy = 1.0 if answer is not None and answers_match(answer, truth) else 0.0
    ends_with_it = _FINAL_NUMBER_END_RE.search(response) is not None
    return {"accuracy": accuracy, "format_score": _format_part(ends_with_it)}


def format_reward(response: str, truth: str) -> RewardParts:
    """Format only: +0.1 for the think/answer structure, -0.1 otherwise."""
    return {"format_score": _format_part(has_think_answer_format(response))}


_EQUATION_CHARS = re.compile(r"^[\d+\-*/().\s]+$")
_DAPO_ANSWER = re.compile(r"(?i)answer\s*:\s*([^\n]+)")


_ARITHMETIC = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def arithmetic_value(expression: str) -> float:
    """The value of an expression of numbers, + - * / and parentheses (nothing else: no names,
    no powers); ValueError or ZeroDivisionError otherwise."""

    def value(node: ast.AST) -> float:
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, (int, float))
            and not isinstance(node.value, bool)
        ):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
            return _ARITHMETIC[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _ARITHMETIC:
            return _ARITHMETIC[type(node.op)](value(node.operand))
        raise ValueError("only numbers and + - * / ( ) are allowed")

    try:
        return float(value(ast.parse(expression.strip(), mode="eval").body))
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from e


def _countdown_truth(truth: str) -> tuple[float, list[int]] | None:
    """``{"target": T, "numbers": [...]}`` (JSON or a Python literal) -> (T, numbers)."""
    for parse in (json.loads, ast.literal_eval):
        try:
            value = parse(truth)
            return float(value["target"]), sorted(int(n) for n in value["numbers"])
        except (ValueError, SyntaxError, TypeError, KeyError):
            continue
    return None


def countdown_reward(response: str, truth: str) -> RewardParts:
    """Trinity's (TinyZero's) countdown: the last ``<answer>`` is an equation using each of the
    truth's ``numbers`` exactly once (+ - * / and parentheses) that equals its ``target``:
    ``score`` 1.0; a well-formed equation that misses: 0.1; no equation: 0. The truth column holds
    ``{"target": T, "numbers": [...]}``; DataError-free: an unreadable truth scores 0."""
    parsed = _countdown_truth(truth)
    equation = last_answer_tag(response)
    if parsed is None or equation is None or not _EQUATION_CHARS.match(equation):
        return {"score": 0.0}
    target, numbers = parsed
    if sorted(int(n) for n in re.findall(r"\d+", equation)) != numbers:
        return {"score": FORMAT_SCORE}
    try:
        value = arithmetic_value(equation)
    except (ValueError, ZeroDivisionError):
        return {"score": FORMAT_SCORE}
    return {"score": 1.0 if abs(value - target) < 1e-5 else FORMAT_SCORE}


def math_dapo_reward(
    response: str,
    truth: str,
    *,
    response_length: int = 0,
    enable_overlong_penalty: bool = False,
    penalty_factor: float | None = None,
    max_response_length: int | None = None,
    cache_length: int | None = None,
) -> RewardParts:
    """DAPO's math reward (Trinity's ``math_dapo_reward``): +1 for a right last ``Answer: X``
    line, -1 otherwise (``accuracy`` 1/0 plus ``wrong_answer`` 0/-1), and with
    ``enable_overlong_penalty`` the soft overlong penalty in ``format_score``: 0 up to
    ``max_response_length - cache_length`` response tokens, then down linearly to
    ``-penalty_factor`` at ``max_response_length`` (and beyond)."""
    found = _DAPO_ANSWER.findall(response)
    correct = bool(found) and answers_match(found[-1].strip(), truth)
    penalty = 0.0
    if enable_overlong_penalty:
        if (
            None in (penalty_factor, max_response_length, cache_length)
            or max_response_length <= cache_length
        ):
            raise ConfigError(
                "math_dapo_reward with enable_overlong_penalty needs penalty_factor, "
                "max_response_length and cache_length (max_response_length > "
                "cache_length) in reward_fn_args"
            )
        expected = max_response_length - cache_length
        if response_length > max_response_length:
            penalty = -float(penalty_factor)
        elif response_length > expected:
            penalty = (expected - response_length) / cache_length * penalty_factor
    return {
        "accuracy": float(correct),
        "wrong_answer": 0.0 if correct else -1.0,
        "format_score": penalty,
    }


def rlcr_reward(
    response: str, truth: str, *, weights: Mapping[str, float] | None = None
) -> RewardParts:
    """Trinity's ``rlcr_reward`` (RLCR: format, accuracy and the Brier score of the stated
    confidence, :func:`rft.workflow.rlcr.rlcr_parts`), each part times its ``weights`` entry.
    The answer is the closing ``<answer>`` block's text, compared by :func:`answers_match`
    with the truth read by :func:`extract_ground_truth` (Trinity compares math_verify parses)."""
    return rlcr_parts(response, truth, checked_weights(weights), rlcr_answer_matches)


def rlcr_answer_matches(answer: str, truth: str) -> bool:
    """RLCR's default check: the closing answer's text against the truth's reference answer."""
    return answers_match(answer.strip(), extract_ground_truth(truth))


def takes_response_length(fn: RewardFunction) -> bool:
    """Whether a reward function wants the response's token count (``response_length=``)."""
    try:
        return "response_length" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


# Trinity-RFT's names; final_number_reward is rft's own, for the quick start.
REWARD_FNS: dict[str, RewardFunction] = {
    "countdown_reward": countdown_reward,
    "math_dapo_reward": math_dapo_reward,
    "math_reward": math_reward,
    "math_boxed_reward": math_boxed_reward,
    "accuracy_reward": accuracy_reward,
    "format_reward": format_reward,
    "final_number_reward": final_number_reward,
    "rlcr_reward": rlcr_reward,
}

# Where each built-in's ``accuracy`` part reads the model's answer (reports name it: mode bench).
ANSWER_EXTRACTORS: dict[str, str] = {
    "math_reward": "last <answer>...</answer> tag",
    "math_boxed_reward": "last \\boxed{...}",
    "accuracy_reward": "last <answer>...</answer> tag, else last \\boxed{...}, else the whole response",
    "format_reward": "none (format_score only, no accuracy part)",
    "final_number_reward": "last number in the reply",
    "countdown_reward": "last <answer>...</answer> tag, an equation of the task's numbers",
    "math_dapo_reward": "last 'Answer: ...' line",
    "rlcr_reward": "<answer>...</answer> of the closing think/answer/analysis/confidence blocks",
}


def answer_extractor(fn: RewardFunction) -> str:
    """How ``fn`` (as :func:`get_reward_fn` returns it) reads the answer: a built-in's
    ``ANSWER_EXTRACTORS`` entry, else ``user function <module>:<function>``."""
    for name, builtin in REWARD_FNS.items():
        if fn is builtin:
            return ANSWER_EXTRACTORS[name]
    inner = fn.func if isinstance(fn, functools.partial) else fn
    inner = getattr(inner, "__wrapped__", inner)  # as_reward_parts' wrapper
    return f"user function {inner.__module__}:{getattr(inner, '__qualname__', repr(inner))}"


def total_reward(parts: Mapping[str, float]) -> float:
    """The scalar reward: the sum of the parts."""
    return float(sum(parts.values()))


REWARD_MODEL_PART = "reward_model"  # part name of a reward model's score (one model)


def reward_model_part_names(count: int) -> list[str]:
    """Part names of ``count`` reward models' scores: ``reward_model`` for one,
    ``reward_model_0``, ``reward_model_1``... for several (config order)."""
    return [REWARD_MODEL_PART] if count == 1 else [f"{REWARD_MODEL_PART}_{i}" for i in range(count)]


def combine_reward(
    rule_parts: Mapping[str, float],
    model_scores: Sequence[float],
    rule_weight: float = 1.0,
    reward_model_weight: float = 1.0,
) -> tuple[float, RewardParts]:
    """The reward of a sample scored by a rule and by reward models, and all its parts.

    reward = rule_weight * sum(rule parts) + reward_model_weight * sum(model scores); the parts
    are the rule's as it returned them plus each model's raw score
    (:func:`reward_model_part_names`). Without model scores this is :func:`total_reward`.
    """
    names = reward_model_part_names(len(model_scores)) if model_scores else []
    clash = sorted(set(names) & set(rule_parts))
    if clash:
        raise ConfigError(
            f"the rule reward returned part(s) {clash}, the name(s) of the reward "
            "model scores (explorer.auxiliary_models); rename them in the reward function"
        )
    reward = rule_weight * total_reward(rule_parts) + reward_model_weight * float(sum(model_scores))
    return float(reward), {**rule_parts, **{n: float(s) for n, s in zip(names, model_scores)}}


# ----------------------------------------------------------------------------- resolution


def import_user_fn(spec: str) -> Callable[..., Any]:
    """``pkg.module:function`` (or ``pkg.module.function``) -> the callable; a Trinity reward
    name rft does not ship is refused saying what to do (no guess)."""
    if spec in TRINITY_REWARD_FNS:
        raise not_supported(f"reward function {spec}", TRINITY_REWARD_FNS[spec])
    if ":" in spec:
        module_name, _, attr = spec.partition(":")
    else:
        module_name, _, attr = spec.rpartition(".")
    if not module_name or not attr:
        raise ConfigError(
            f"reward function {spec!r}: not a built-in ({sorted(REWARD_FNS)}) and not a "
            f"'package.module:function' path.{did_you_mean(spec, REWARD_FNS, TRINITY_NAMES)}"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(
            f"reward function {spec!r}: could not import module {module_name!r} ({e}). "
            f"Make it importable (installed, or its folder on PYTHONPATH) or use a built-in: "
            f"{sorted(REWARD_FNS)}."
        ) from e
    fn = getattr(module, attr, None)
    if fn is None or not callable(fn):
        raise ConfigError(
            f"reward function {spec!r}: module {module_name!r} ({getattr(module, '__file__', '?')}) "
            f"has no callable {attr!r}."
        )
    return fn


def as_reward_parts(spec: str, fn: Callable[..., Any]) -> RewardFunction:
    """Wrap a user function so a float result becomes ``{"reward": value}`` and a bad one raises."""

    @functools.wraps(fn)
    def wrapper(response: str, truth: str, **kwargs: Any) -> RewardParts:
        result = fn(response, truth, **kwargs)
        if isinstance(result, (int, float)) and not isinstance(result, bool):
            return {"reward": float(result)}
        if isinstance(result, Mapping) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in result.values()
        ):
            return {str(k): float(v) for k, v in result.items()}
        raise ConfigError(
            f"reward function {spec!r} returned {type(result).__name__}; it must return a float "
            f"or a dict of part name -> float."
        )

    return wrapper


def get_reward_fn(name_or_path: str, args: Mapping[str, Any] | None = None) -> RewardFunction:
    """Resolve a built-in name or ``package.module:function``; bind ``args`` (the config's
    ``reward_fn_args``) as keyword arguments. Returns ``fn(response, truth) -> parts``."""
    args = dict(args or {})
    if name_or_path in REWARD_FNS:
        fn = REWARD_FNS[name_or_path]
        if not args:
            return fn
        takes = [
            p.name
            for p in inspect.signature(fn).parameters.values()
            if p.kind is p.KEYWORD_ONLY and p.name != "response_length"
        ]
        unknown = sorted(set(args) - set(takes))
        if unknown:
            raise ConfigError(
                f"reward_fn_args {unknown}: the built-in reward {name_or_path!r} takes "
                f"{takes or 'no arguments'}.{did_you_mean(unknown[0], takes)}"
            )
        bound = functools.partial(fn, **args)
        bound("", "")  # a bad combination of arguments fails here, at load (the login node)
        return bound
    user_fn = import_user_fn(name_or_path)
    _check_user_args(name_or_path, user_fn, args)
    return functools.partial(as_reward_parts(name_or_path, user_fn), **args)


def _check_user_args(spec: str, fn: Callable[..., Any], args: Mapping[str, Any]) -> None:
    """Fail at load time if ``fn(response, truth, **args)`` cannot be called."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # no signature to check (a builtin or C function)
    try:
        signature.bind("response", "truth", **args)
    except TypeError as e:
        raise ConfigError(
            f"reward function {spec!r} cannot be called as fn(response, truth"
            f"{''.join(', ' + k + '=...' for k in args)}): {e}. Fix its signature or reward_fn_args."
        ) from e
