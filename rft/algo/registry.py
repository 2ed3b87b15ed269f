"""Algorithm choices by name: the registries and the checks on their arguments.

The names are declared in :mod:`rft.config.names`; the math lives in :mod:`rft.algo.advantages`
(advantage estimators), :mod:`rft.algo.losses` (policy, KL and entropy losses, aggregation,
log-prob and entropy helpers) and :mod:`rft.algo.correction` (off-policy weights). This module
maps the names to the functions (checked at import to cover exactly the declared names) and
turns a config's ``(name, args)`` pair into a ready function, raising ``ConfigError`` for an
unknown name, an unknown argument or a bad value:

    algorithm.advantage_fn      + advantage_fn_args      -> get_advantage_fn (get_gae_fn: ppo)
    algorithm.policy_loss_fn    + policy_loss_fn_args    -> get_policy_loss_fn
    algorithm.kl_loss_fn        + kl_loss_fn_args        -> get_kl_loss_fn
    algorithm.kl_penalty_fn     + kl_penalty_fn_args     -> get_kl_penalty_fn
    algorithm.entropy_loss_fn   + entropy_loss_fn_args   -> get_entropy_loss_fn
    algorithm.rollout_correction                         -> get_correction_fn

The returned functions take tensors only (see each getter). :func:`build_loss_fns` resolves a
whole ``algorithm`` section at once: the trainer calls it to train, preflight to check a config
on the login node. Only torch and the stdlib are imported.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from rft.algo.advantages import (
    ADVANTAGE_FNS,
    GroupIds,
    group_index,
    token_level_rewards,
)
from rft.algo.correction import CORRECTIONS, correction_weights
from rft.algo.critic import gae_advantages
from rft.algo.logprobs import token_entropy, token_logprobs
from rft.algo.losses import (
    ENTROPY_LOSS_FNS,
    KL_FNS,
    LOSS_AGG_MODES,
    POLICY_LOSS_FNS,
    aggregate,
    chord_mu,
    kl,
    kl_loss,
    kl_penalty,
)
from rft.config import names
from rft.config.schema import AlgorithmConfig, RolloutCorrectionConfig
from rft.errors import ConfigError, did_you_mean

__all__ = [
    "ADVANTAGE_FNS", "POLICY_LOSS_FNS", "KL_FNS", "ENTROPY_LOSS_FNS", "LOSS_AGG_MODES",
    "GroupIds", "group_index", "token_level_rewards", "aggregate", "chord_mu", "kl", "kl_loss", "kl_penalty",
    "token_entropy", "token_logprobs", "valid_args", "get_advantage_fn", "get_policy_loss_fn",
    "get_kl_loss_fn", "get_kl_penalty_fn", "get_entropy_loss_fn", "check_loss_agg_mode",
    "get_correction_fn", "get_gae_fn", "LossFns", "build_loss_fns",
]

# The registries implement exactly the declared names (GAE, which needs values, apart).
assert set(ADVANTAGE_FNS) == set(names.ADVANTAGE_FN_NAMES) - names.NEEDS_CRITIC
assert names.NEEDS_CRITIC == {"ppo"}
assert set(POLICY_LOSS_FNS) == set(names.POLICY_LOSS_FN_NAMES)
assert set(KL_FNS) == set(names.KL_FN_NAMES)
assert set(ENTROPY_LOSS_FNS) == set(names.ENTROPY_LOSS_FN_NAMES)
assert set(LOSS_AGG_MODES) == set(names.LOSS_AGG_MODES)
assert set(CORRECTIONS) == set(names.ROLLOUT_CORRECTION_MODES)

# Supplied by the trainer on each call, never by the config.
_CONTEXT_PARAMS = frozenset({"step", "expert_mask", "is_weights"})


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


# Argument name -> (check, what a valid value is). Unlisted arguments accept any value.
_VALUE_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "loss_agg_mode": (lambda v: v in LOSS_AGG_MODES, f"one of {sorted(LOSS_AGG_MODES)}"),
    "epsilon": (lambda v: _is_number(v) and v > 0, "a number > 0"),
    "std_threshold": (lambda v: v is None or (_is_number(v) and v >= 0), "null or a number >= 0"),
    "std_normalize": (lambda v: isinstance(v, bool), "true or false"),
    "whiten": (lambda v: isinstance(v, bool), "true or false"),
    "gamma": (lambda v: _is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "lam": (lambda v: _is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "opmd_baseline": (lambda v: v in ("mean", "logavgexp"), "'mean' or 'logavgexp'"),
    "tau": (lambda v: _is_number(v) and v > 0, "a number > 0"),
    "clip_range": (lambda v: v is None or (_is_number(v) and v >= 0), "null or a number >= 0"),
    "clip_range_low": (lambda v: v is None or (_is_number(v) and v >= 0), "null or a number >= 0"),
    "clip_range_high": (lambda v: v is None or (_is_number(v) and v >= 0), "null or a number >= 0"),
    "clip_ratio_c": (lambda v: v is None or (_is_number(v) and v > 1), "null (no dual clip) or a number > 1"),
    "mu_warmup_steps": (_is_count, "an integer >= 0"),
    "mu_decay_steps": (_is_count, "an integer >= 0"),
    "mu_peak": (lambda v: _is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "mu_valley": (lambda v: _is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "enable_phi_function": (lambda v: isinstance(v, bool), "true or false"),
    "kl_coef": (lambda v: _is_number(v) and v >= 0, "a number >= 0"),
    "entropy_coef": (_is_number, "a number"),
}


def _check_name(kind: str, name: str, registry: Mapping[str, Any]) -> None:
    if name in registry:
        return
    raise ConfigError(f"algorithm.{kind}: unknown name {name!r}; valid names: {sorted(registry)}."
                      f"{did_you_mean(name, registry)}")


def _config_params(fn: Callable[..., Any]) -> list[str]:
    """Keyword-only parameters of ``fn`` that a config may set."""
    params = inspect.signature(fn).parameters.values()
    return [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.name not in _CONTEXT_PARAMS]


def _check_args(kind: str, name: str, fn: Callable[..., Any], args: Mapping[str, Any] | None) -> dict[str, Any]:
    args = dict(args or {})
    allowed = _config_params(fn)
    for key, value in args.items():
        if key not in allowed:
            raise ConfigError(
                f"algorithm.{kind}_args.{key}: not an argument of {kind} {name!r}; "
                f"valid arguments: {allowed}.{did_you_mean(key, allowed)}"
            )
        check = _VALUE_CHECKS.get(key)
        if check is not None and not check[0](value):
            raise ConfigError(f"algorithm.{kind}_args.{key}: got {value!r}, expected {check[1]}.")
    return args


def valid_args(kind: str, name: str) -> list[str]:
    """The argument names a config may give to ``kind`` (e.g. ``policy_loss_fn``) ``name``."""
    getter = _GETTERS.get(kind)
    if getter is None:
        raise ConfigError(f"unknown algorithm function kind {kind!r}; valid kinds: {sorted(_GETTERS)}")
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
    return functools.partial(gae_advantages, **_check_args("advantage_fn", "ppo", gae_advantages, args))


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
    return functools.partial(kl_penalty, name, **_check_args("kl_penalty_fn", name, kl_penalty, args))


def get_entropy_loss_fn(name: str, args: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """``fn(entropy [B, L], mask [B, L]) -> (term added to the loss, metrics)``; ``default``
    takes ``entropy_coef`` and gives ``-entropy_coef * agg(entropy)``."""
    _check_name("entropy_loss_fn", name, ENTROPY_LOSS_FNS)
    fn = ENTROPY_LOSS_FNS[name]
    return functools.partial(fn, **_check_args("entropy_loss_fn", name, fn, args))


def check_loss_agg_mode(mode: str, key: str = "algorithm.loss_agg_mode") -> str:
    """Return ``mode`` if it is a ``LOSS_AGG_MODES`` key, else raise ConfigError naming ``key``."""
    if mode not in LOSS_AGG_MODES:
        raise ConfigError(f"{key}: unknown mode {mode!r}; valid modes: {sorted(LOSS_AGG_MODES)}."
                          f"{did_you_mean(mode, LOSS_AGG_MODES)}")
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


@dataclass
class LossFns:
    """The algorithm's choices, resolved to functions once per run."""

    advantage: Callable[..., Any] | None  # group/batch estimators; None for SFT and GAE
    policy: Callable[..., Any]
    kl_loss: Callable[..., Any] | None
    kl_penalty: Callable[..., Any] | None
    entropy: Callable[..., Any]
    entropy_in_loss: bool
    agg_mode: str
    recompute_old: bool
    sft: bool
    # (proximal, behaviour, mask) -> (weights [B, L], CorrectionSums); None: no correction
    correction: Callable[..., Any] | None = None
    # (token_rewards, values, mask) -> (advantages, returns, metrics): advantage_fn ppo (a critic)
    gae: Callable[..., Any] | None = None

    @property
    def needs_ref(self) -> bool:
        return self.kl_loss is not None or self.kl_penalty is not None


def _with_agg(args: dict[str, Any], agg_mode: str, fn_name: str, getter: Callable[..., Any]) -> dict[str, Any]:
    """Add the run's loss_agg_mode to the function's args when it takes one and none is given."""
    kind = getter.__name__.removeprefix("get_")
    if "loss_agg_mode" in valid_args(kind, fn_name) and "loss_agg_mode" not in args:
        return {**args, "loss_agg_mode": agg_mode}
    return args


def build_loss_fns(algo: AlgorithmConfig) -> LossFns:
    """The ``algorithm`` section's choices as functions; ConfigError for a bad name or argument."""
    agg = algo.loss_agg_mode or "token-mean"
    policy_args = _with_agg(algo.policy_loss_fn_args, agg, algo.policy_loss_fn, get_policy_loss_fn)
    sft = algo.policy_loss_fn == "sft"
    kl_on = algo.kl_loss_fn not in (None, "none")
    pen_on = algo.kl_penalty_fn not in (None, "none")
    entropy_name = algo.entropy_loss_fn or "none"
    gae = not sft and algo.advantage_fn in names.NEEDS_CRITIC
    return LossFns(
        advantage=None if sft or gae else get_advantage_fn(algo.advantage_fn, algo.advantage_fn_args),
        policy=get_policy_loss_fn(algo.policy_loss_fn, policy_args),
        kl_loss=get_kl_loss_fn(algo.kl_loss_fn, _with_agg(algo.kl_loss_fn_args, agg, algo.kl_loss_fn, get_kl_loss_fn)) if kl_on else None,
        kl_penalty=get_kl_penalty_fn(algo.kl_penalty_fn, algo.kl_penalty_fn_args) if pen_on else None,
        entropy=get_entropy_loss_fn(entropy_name, _with_agg(algo.entropy_loss_fn_args, agg, entropy_name, get_entropy_loss_fn)),
        entropy_in_loss=entropy_name != "none",
        agg_mode=policy_args.get("loss_agg_mode", agg),
        recompute_old=algo.old_logprobs == "recompute" and not sft,
        sft=sft,
        correction=get_correction_fn(algo.rollout_correction),
        gae=get_gae_fn(algo.advantage_fn_args) if gae else None,
    )


def get_correction_fn(rc: RolloutCorrectionConfig) -> Callable[..., Any] | None:
    """``fn(proximal, behaviour, mask) -> (weights [B, L], CorrectionSums)`` for
    ``algorithm.rollout_correction``, or None for mode ``none`` (which and how the keys combine
    with the rest of the config is checked in :mod:`rft.config.rules`)."""
    if rc.mode == "none":
        return None
    threshold = names.TIS_THRESHOLD if rc.rollout_is_threshold is None else rc.rollout_is_threshold
    return functools.partial(correction_weights, mode=rc.mode, rollout_is_threshold=threshold,
                             behav_imp_weight_cap=rc.behav_imp_weight_cap)
