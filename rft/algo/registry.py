"""Algorithm choices by name: ``get_*_fn(name, args)`` turns a config's ``(name, args)`` pair into
a ready function of tensors, raising ``ConfigError`` (what to write instead) for an unknown name,
an unknown argument or a bad value. The math lives in the sibling modules; this module imports
only them, torch, the stdlib and ``rft.errors``. Resolving a whole ``algorithm`` section is
``rft.trainer.algorithm``'s.
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any, Callable, Mapping

from rft.algo.advantages import ADVANTAGE_FNS as _BASE_ADVANTAGE_FNS
from rft.algo.advantages import STD_CAL_LEVELS
from rft.algo.critic import gae_advantages
from rft.algo.distill import DISTILL_ADVANTAGE_FNS, DISTILL_LOSSES
from rft.algo.dpo import dpo_loss
from rft.algo.entropy_clip import clipb_advantages
from rft.algo.gigpo import FNORMS, gigpo_advantages
from rft.algo.losses import (
    ENTROPY_LOSS_FNS,
    KL_FNS,
    LOSS_AGG_MODES,
    kl_loss,
    kl_penalty,
)
from rft.algo.losses import POLICY_LOSS_FNS as _BASE_POLICY_LOSS_FNS
from rft.algo.m2po import m2po_loss
from rft.algo.weighted_pg import REC_CLIP_MODES, REC_REGULARIZERS, REC_WEIGHTS, WEIGHTED_PG_LOSSES
from rft.config.known_names import TRINITY_NAMES
from rft.errors import ConfigError, did_you_mean

# Every policy loss by name: rft.algo.losses' and rft.algo.weighted_pg's, and DPO's, whose
# function takes (logprob, ref_logprob, mask) of pair rows (called by rft.trainer.dpo only).
POLICY_LOSS_FNS: dict[str, Callable[..., Any]] = {
    **_BASE_POLICY_LOSS_FNS,
    **WEIGHTED_PG_LOSSES,
    **DISTILL_LOSSES,
    "dpo": dpo_loss,
    "m2po": m2po_loss,  # its mask comes from the trainer (rft.trainer.m2po)
}
# Every group/batch advantage by name (GAE, which needs a critic's values, apart): the
# distillation ones take the student's and the teacher's log-probs too, GiGPO each row's run
# and info (context parameters); Clip-B's token filter is the trainer's (entropies).
ADVANTAGE_FNS: dict[str, Callable[..., Any]] = {
    **_BASE_ADVANTAGE_FNS,
    **DISTILL_ADVANTAGE_FNS,
    "gigpo": gigpo_advantages,
    "clipb": clipb_advantages,  # its token filter comes from the trainer (rft.trainer.step)
}

# Supplied by the trainer on each call, never by the config.
_CONTEXT_PARAMS = frozenset(
    {
        "step",
        "expert_mask",
        "is_weights",
        "runs",
        "infos",
        "old_logprobs",
        "teacher_logprobs",
        "m2po_mask",
        "logprob_means",
    }
)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


# Argument name -> (check, what a valid value is). Unlisted arguments accept any value.
_VALUE_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "loss_agg_mode": (lambda v: v in LOSS_AGG_MODES, f"one of {sorted(LOSS_AGG_MODES)}"),
    "sft_loss_agg_mode": (lambda v: v in LOSS_AGG_MODES, f"one of {sorted(LOSS_AGG_MODES)}"),
    "grpo_loss_agg_mode": (lambda v: v in LOSS_AGG_MODES, f"one of {sorted(LOSS_AGG_MODES)}"),
    "epsilon": (lambda v: _is_number(v) and v > 0, "a number > 0"),
    "std_threshold": (lambda v: v is None or (_is_number(v) and v >= 0), "null or a number >= 0"),
    "std_normalize": (lambda v: isinstance(v, bool), "true or false"),
    "std_cal_level": (lambda v: v in STD_CAL_LEVELS, f"one of {list(STD_CAL_LEVELS)}"),
    "rank_penalty": (lambda v: v is None or _is_number(v), "null or a number"),
    "duplicate_experiences": (lambda v: isinstance(v, bool), "true or false"),
    "whiten": (lambda v: isinstance(v, bool), "true or false"),
    "gamma": (lambda v: _is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "lam": (lambda v: _is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "opmd_baseline": (lambda v: v in ("mean", "logavgexp"), "'mean' or 'logavgexp'"),
    "tau": (lambda v: _is_number(v) and v >= 0, "a number >= 0"),
    "clip_range": (lambda v: v is None or (_is_number(v) and v >= 0), "null or a number >= 0"),
    "clip_range_low": (lambda v: v is None or (_is_number(v) and v >= 0), "null or a number >= 0"),
    "clip_range_high": (lambda v: v is None or (_is_number(v) and v >= 0), "null or a number >= 0"),
    "clip_ratio_c": (
        lambda v: v is None or (_is_number(v) and v > 1),
        "null (no dual clip) or a number > 1",
    ),
    "mu_warmup_steps": (_is_count, "an integer >= 0"),
    "mu_decay_steps": (_is_count, "an integer >= 0"),
    "mu_peak": (lambda v: _is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "mu_valley": (lambda v: _is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "enable_phi_function": (lambda v: isinstance(v, bool), "true or false"),
    "kl_coef": (lambda v: _is_number(v) and v >= 0, "a number >= 0"),
    "lambda_coef": (lambda v: _is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "entropy_coef": (_is_number, "a number"),
    "baseline_shift": (_is_number, "a number"),
    "drop": (lambda v: v in (None, "balance"), "null or 'balance'"),
    "mu": (lambda v: _is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "advantage_threshold": (_is_number, "a number"),
    "enable_mask_clip": (lambda v: isinstance(v, bool), "true or false"),
    "mask_clip_range_low": (lambda v: _is_number(v) and v >= 0, "a number >= 0"),
    "mask_clip_range_high": (lambda v: _is_number(v) and v >= 0, "a number >= 0"),
    "tau_pos": (lambda v: _is_number(v) and v > 0, "a number > 0"),
    "tau_neg": (lambda v: _is_number(v) and v > 0, "a number > 0"),
    "epsilon_low": (lambda v: _is_number(v) and 0 < v <= 1, "a number in (0, 1]"),
    "epsilon_high": (lambda v: _is_number(v) and v > 0, "a number > 0"),
    "epsilon_low_prime": (lambda v: _is_number(v) and 0 < v <= 1, "a number in (0, 1]"),
    "epsilon_high_prime": (lambda v: _is_number(v) and v > 0, "a number > 0"),
    "clip_mode": (lambda v: v in REC_CLIP_MODES, f"one of {list(REC_CLIP_MODES)}"),
    "weight": (lambda v: v in REC_WEIGHTS, f"one of {list(REC_WEIGHTS)}"),
    "regularizer": (lambda v: v in REC_REGULARIZERS, f"one of {list(REC_REGULARIZERS)}"),
    "regularizer_coef": (lambda v: _is_number(v) and v >= 0, "a number >= 0"),
    "temp": (lambda v: _is_number(v) and v > 0, "a number > 0"),
    "beta": (lambda v: _is_number(v) and v > 0, "a number > 0"),
    "label_smoothing": (lambda v: _is_number(v) and 0 <= v < 0.5, "a number in [0, 0.5)"),
    "m2_threshold": (lambda v: _is_number(v) and 0 <= v < math.inf, "a finite number >= 0"),
    "log_ratio_clip": (lambda v: _is_number(v) and 0 < v < math.inf, "a finite number > 0"),
    "omega": (_is_number, "a number"),
    "fnorm": (lambda v: v in FNORMS, f"one of {list(FNORMS)}"),
    "step_reward_key": (lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    "env_state_hash_key": (lambda v: isinstance(v, str) and v != "", "a non-empty string"),
}


def _check_name(kind: str, name: str, registry: Mapping[str, Any]) -> None:
    if name in registry:
        return
    raise ConfigError(
        f"algorithm.{kind}: unknown name {name!r}; valid names: {sorted(registry)}."
        f"{did_you_mean(name, registry, TRINITY_NAMES)}"
    )


def _config_params(fn: Callable[..., Any]) -> list[str]:
    """Keyword-only parameters of ``fn`` that a config may set."""
    params = inspect.signature(fn).parameters.values()
    return [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.name not in _CONTEXT_PARAMS]


def _defaults(fn: Callable[..., Any]) -> dict[str, Any]:
    params = inspect.signature(fn).parameters.values()
    return {p.name: p.default for p in params if p.default is not p.empty}


def _check_sapo(args: Mapping[str, Any]) -> str | None:
    # SAPO's stability needs negative-advantage tokens gated at least as hard as positive ones.
    if args["tau_neg"] < args["tau_pos"]:
        return f"tau_neg={args['tau_neg']!r} must be >= tau_pos={args['tau_pos']!r}"
    return None


def _check_opmd_baseline(args: Mapping[str, Any]) -> str | None:
    if args["opmd_baseline"] == "logavgexp" and args["tau"] <= 0:
        return f"opmd_baseline 'logavgexp' divides by tau, which must be > 0 (got {args['tau']!r})"
    return None


def _check_m2po(args: Mapping[str, Any]) -> str | None:
    # Trinity's M2POPolicyLossFn: dropped tokens must still count in the denominator.
    if args["loss_agg_mode"] != "token-mean":
        return f"loss_agg_mode must be 'token-mean' (got {args['loss_agg_mode']!r})"
    return None


# (kind, name, key) -> a check of one function's argument whose name means another thing
# elsewhere (MIX's mu is a weight in [0, 1], Clip-B's a count of standard deviations).
_NAMED_VALUE_CHECKS: dict[tuple[str, str, str], tuple[Callable[[Any], bool], str]] = {
    ("advantage_fn", "clipb", "mu"): (lambda v: _is_number(v) and v >= 0, "a number >= 0"),
}

# (kind, name) -> a check of the function's full arguments (defaults + config) across keys.
_JOINT_CHECKS: dict[tuple[str, str], Callable[[Mapping[str, Any]], str | None]] = {
    ("policy_loss_fn", "sapo"): _check_sapo,
    ("advantage_fn", "opmd"): _check_opmd_baseline,
    ("policy_loss_fn", "m2po"): _check_m2po,
}


def _check_args(
    kind: str, name: str, fn: Callable[..., Any], args: Mapping[str, Any] | None
) -> dict[str, Any]:
    args = dict(args or {})
    allowed = _config_params(fn)
    for key, value in args.items():
        if key not in allowed:
            raise ConfigError(
                f"algorithm.{kind}_args.{key}: not an argument of {kind} {name!r}; "
                f"valid arguments: {allowed}.{did_you_mean(key, allowed)}"
            )
        check = _NAMED_VALUE_CHECKS.get((kind, name, key), _VALUE_CHECKS.get(key))
        if check is not None and not check[0](value):
            raise ConfigError(f"algorithm.{kind}_args.{key}: got {value!r}, expected {check[1]}.")
    joint = _JOINT_CHECKS.get((kind, name))
    problem = joint({**_defaults(fn), **args}) if joint is not None else None
    if problem is not None:
        raise ConfigError(f"algorithm.{kind}_args ({kind} {name!r}): {problem}.")
    return args


def valid_args(kind: str, name: str) -> list[str]:
    """The argument names a config may give to ``kind`` (e.g. ``policy_loss_fn``) ``name``."""
    getter = _GETTERS.get(kind)
    if getter is None:
        raise ConfigError(
            f"unknown algorithm function kind {kind!r}; valid kinds: {sorted(_GETTERS)}"
        )
    names, fn_of = getter
    _check_name(kind, name, names)
    return _config_params(fn_of(name))


def get_advantage_fn(name: str, args: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """``fn(rewards [B] or [B, L], group_ids [B], mask [B, L]) -> (advantages [B, L], metrics)``."""
    _check_name("advantage_fn", name, ADVANTAGE_FNS)
    fn = ADVANTAGE_FNS[name]
    return functools.partial(fn, **_check_args("advantage_fn", name, fn, args))


def get_gae_fn(args: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """``advantage_fn: ppo``: ``fn(token_rewards [B, L], values [B, L], mask [B, L]) ->
    (whitened advantages, returns, metrics)``; args ``gamma``, ``lam``."""
    return functools.partial(
        gae_advantages, **_check_args("advantage_fn", "ppo", gae_advantages, args)
    )


def get_policy_loss_fn(name: str, args: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """``fn(logprob, old_logprob, advantages, mask, *, step=0, expert_mask=None, is_weights=None)
    -> (loss, metrics)``, all ``[B, L]`` but ``expert_mask`` ``[B]``; ``loss_agg_mode`` comes
    from args."""
    _check_name("policy_loss_fn", name, POLICY_LOSS_FNS)
    fn = POLICY_LOSS_FNS[name]
    return functools.partial(fn, **_check_args("policy_loss_fn", name, fn, args))


def get_kl_loss_fn(name: str, args: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """``fn(logprob, ref_logprob, mask) -> (kl_coef * agg(kl), metrics)``; args ``kl_coef``,
    ``loss_agg_mode``."""
    _check_name("kl_loss_fn", name, KL_FNS)
    return functools.partial(kl_loss, name, **_check_args("kl_loss_fn", name, kl_loss, args))


def get_kl_penalty_fn(name: str, args: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """``fn(token_rewards, logprob, ref_logprob, mask) -> (token_rewards - kl_coef * kl,
    metrics)``; arg ``kl_coef``."""
    _check_name("kl_penalty_fn", name, KL_FNS)
    return functools.partial(
        kl_penalty, name, **_check_args("kl_penalty_fn", name, kl_penalty, args)
    )


def get_entropy_loss_fn(name: str, args: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """``fn(entropy [B, L], mask [B, L]) -> (term added to the loss, metrics)``; ``default``
    takes ``entropy_coef`` and gives ``-entropy_coef * agg(entropy)``."""
    _check_name("entropy_loss_fn", name, ENTROPY_LOSS_FNS)
    fn = ENTROPY_LOSS_FNS[name]
    return functools.partial(fn, **_check_args("entropy_loss_fn", name, fn, args))


def check_loss_agg_mode(mode: str, key: str = "algorithm.loss_agg_mode") -> str:
    """Return ``mode`` if it is a ``LOSS_AGG_MODES`` key, else raise ConfigError naming ``key``."""
    if mode not in LOSS_AGG_MODES:
        raise ConfigError(
            f"{key}: unknown mode {mode!r}; valid modes: {sorted(LOSS_AGG_MODES)}."
            f"{did_you_mean(mode, LOSS_AGG_MODES)}"
        )
    return mode


# kind -> (registry of names, name -> the function whose keyword-only parameters are the args)
_ALL_ADVANTAGE_FNS = {**ADVANTAGE_FNS, "ppo": gae_advantages}
_GETTERS: dict[str, tuple[Mapping[str, Any], Callable[[str], Callable[..., Any]]]] = {
    "advantage_fn": (_ALL_ADVANTAGE_FNS, _ALL_ADVANTAGE_FNS.__getitem__),
    "policy_loss_fn": (POLICY_LOSS_FNS, POLICY_LOSS_FNS.__getitem__),
    "kl_loss_fn": (KL_FNS, lambda _name: kl_loss),
    "kl_penalty_fn": (KL_FNS, lambda _name: kl_penalty),
    "entropy_loss_fn": (ENTROPY_LOSS_FNS, ENTROPY_LOSS_FNS.__getitem__),
}
