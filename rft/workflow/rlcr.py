"""RLCR's reward rule (Trinity-RFT's ``rlcr_reward``, trinity/common/rewards/rlcr_reward.py):
a math answer with a stated confidence, scored for format, accuracy and calibration.

Data in: a reply that ends ``<think>..</think><answer>..</answer><analysis>..</analysis>
<confidence>q</confidence>``, the reference answer, the five part weights and a ``verify(answer,
truth) -> bool``. Data out: the five weighted parts. Pure: the answer check is passed in
(:func:`rft.workflow.rewards.rlcr_reward` passes rft's); only rft.errors is imported.
"""

from __future__ import annotations

import math
import re
from numbers import Real
from typing import Any, Callable, Mapping, Optional

from rft.errors import ConfigError

PARTS = ("format", "accuracy", "brier", "mean_confidence", "confidence_one_or_zero")
DEFAULT_WEIGHTS = {
    "format": 0.5,
    "accuracy": 0.5,
    "brier": 0.5,
    "mean_confidence": 1e-5,  # logged more than rewarded: the mean stated confidence
    "confidence_one_or_zero": 1e-5,  # and how often it is all-or-nothing
}
_TAG = re.compile(r"</?(?:think|answer|analysis|confidence)>")
_CLOSING_CHAIN = tuple(
    tag
    for name in ("think", "answer", "analysis", "confidence")
    for tag in (f"<{name}>", f"</{name}>")
)
EXTREME_CONFIDENCE = (0.01, 0.99)  # a confidence below the first or above the second: 0 or 1


def checked_weights(weights: Optional[Mapping[str, Any]]) -> dict[str, float]:
    """The part weights: all five named, each a finite number (Trinity's rule); None: the
    defaults. ConfigError (from ``reward_fn_args.weights``) otherwise."""
    if weights is None:
        return dict(DEFAULT_WEIGHTS)
    if not isinstance(weights, Mapping):
        raise ConfigError(
            f"rlcr_reward weights: {weights!r} is not a mapping; give reward_fn_args.weights "
            f"with the keys {list(PARTS)}"
        )
    missing, unknown = sorted(set(PARTS) - set(weights)), sorted(set(weights) - set(PARTS))
    if missing or unknown:
        raise ConfigError(
            f"rlcr_reward weights: missing {missing}, unknown {unknown}; give exactly "
            f"{list(PARTS)} (all five, as Trinity requires)"
        )
    out = {}
    for name in PARTS:
        value = weights[name]
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
            raise ConfigError(f"rlcr_reward weights.{name}: {value!r} is not a finite number")
        out[name] = float(value)
    return out


def confidence_value(text: str) -> Optional[float]:
    """A confidence payload as a number in [0, 1], or None (not a number, not finite, outside)."""
    try:
        value = float(text.strip())
    except (ValueError, OverflowError):
        return None
    return value if math.isfinite(value) and 0.0 <= value <= 1.0 else None


def last_confidence(response: str) -> Optional[float]:
    """The last ``<confidence>`` .. last ``</confidence>`` payload, whatever the rest of the
    reply looks like (it feeds the logged parts); None if absent, holding a tag or not a
    confidence."""
    start, end = response.rfind("<confidence>"), response.rfind("</confidence>")
    if start < 0 or end < 0 or start > end:
        return None
    payload = response[start + len("<confidence>") : end]
    return None if _TAG.search(payload) else confidence_value(payload)


def closing_answer(response: str) -> Optional[tuple[str, float]]:
    """(answer text, confidence) when the reply is well formed, else None. Well formed: the
    four tags never nest and every one opened is closed; the last eight tags are the closing
    chain think, answer, analysis, confidence, with only whitespace between one block and the
    next and after the last; its confidence a number in [0, 1]. Text (and earlier balanced
    blocks) before the chain is allowed."""
    tags = list(_TAG.finditer(response))
    open_name = None
    for tag in tags:
        text = tag.group(0)
        name = text.strip("</>")
        if text.startswith("</"):
            if open_name != name:
                return None
            open_name = None
        elif open_name is not None:
            return None
        else:
            open_name = name
    if open_name is not None or len(tags) < len(_CLOSING_CHAIN):
        return None
    chain = tags[-len(_CLOSING_CHAIN) :]
    if tuple(t.group(0) for t in chain) != _CLOSING_CHAIN:
        return None
    gaps = [response[chain[i].end() : chain[i + 1].start()] for i in (1, 3, 5)]
    if any(gap.strip() for gap in gaps) or response[chain[-1].end() :].strip():
        return None
    confidence = confidence_value(response[chain[6].end() : chain[7].start()])
    if confidence is None:
        return None
    return response[chain[2].end() : chain[3].start()], confidence


def rlcr_parts(
    response: str,
    truth: Optional[str],
    weights: Mapping[str, float],
    verify: Callable[[str, str], bool],
) -> dict[str, float]:
    """The weighted parts: ``format`` 1 for a well-formed reply (:func:`closing_answer`);
    ``accuracy`` 1 when ``verify(answer, truth)``; ``brier`` 1 - (accuracy - confidence)^2;
    both 0 for a malformed reply, a missing truth or a ``verify`` that raises (a checker's
    failure is no evidence of a wrong answer). ``mean_confidence`` is the last stated
    confidence (:func:`last_confidence`, 0 if none) and ``confidence_one_or_zero`` 1 when it is
    within 0.01 of 0 or 1, well formed or not."""
    stated = last_confidence(response)
    low, high = EXTREME_CONFIDENCE
    extreme = stated is not None and (stated < low or stated > high)
    closing = closing_answer(response)
    accuracy = brier = 0.0
    if closing is not None and truth is not None:
        answer, confidence = closing
        try:
            accuracy = float(bool(verify(answer, truth)))
            brier = 1.0 - (accuracy - confidence) ** 2
        except Exception:  # a user's verifier, or the math checker, failed: no score either way
            accuracy = brier = 0.0
    raw = {
        "format": float(closing is not None),
        "accuracy": accuracy,
        "brier": brier,
        "mean_confidence": stated or 0.0,
        "confidence_one_or_zero": float(extreme),
    }
    return {name: float(weights[name] * raw[name]) for name in PARTS}
