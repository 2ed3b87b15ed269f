"""The run's ``algorithm`` section resolved to functions once (:class:`LossFns`), for the trainer
to train with and for preflight to check a config on the login node. Data in: the typed config;
data out: functions of tensors from ``rft.algo``. ``ConfigError`` for a bad name or argument.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from rft.algo.correction import CORRECTIONS, correction_weights
from rft.algo.entropy_clip import CLIPB_MU, clipb_keep
from rft.algo.losses import ENTROPY_LOSS_FNS, KL_FNS, LOSS_AGG_MODES
from rft.algo.m2po import M2_THRESHOLD
from rft.algo.registry import (
    ADVANTAGE_FNS,
    POLICY_LOSS_FNS,
    get_advantage_fn,
    get_entropy_loss_fn,
    get_gae_fn,
    get_kl_loss_fn,
    get_kl_penalty_fn,
    get_policy_loss_fn,
    valid_args,
)
from rft.config import names
from rft.config.schema import AlgorithmConfig, Config, RolloutCorrectionConfig
from rft.data import trains_pairs
from rft.errors import ConfigError

# The registries implement exactly the names the config declares (GAE, which needs values, apart).
assert set(ADVANTAGE_FNS) == set(names.ADVANTAGE_FN_NAMES) - names.NEEDS_CRITIC
assert names.NEEDS_CRITIC == {"ppo"}
assert names.NEEDS_TEACHER <= set(ADVANTAGE_FNS)
assert names.BY_INFO <= names.BY_RUN <= set(ADVANTAGE_FNS)
assert names.GROUP_BASELINES <= set(ADVANTAGE_FNS)
assert names.ENTROPY_TOKEN_FILTER == {"clipb"}  # its filter: clipb_keep
assert names.EXPERT_LOSSES <= set(POLICY_LOSS_FNS)
assert names.ROLLOUT_ENTROPY <= set(ENTROPY_LOSS_FNS)
assert set(POLICY_LOSS_FNS) == set(names.POLICY_LOSS_FN_NAMES)
assert set(KL_FNS) == set(names.KL_FN_NAMES)
assert set(ENTROPY_LOSS_FNS) == set(names.ENTROPY_LOSS_FN_NAMES)
assert set(LOSS_AGG_MODES) == set(names.LOSS_AGG_MODES)
assert set(CORRECTIONS) == set(names.ROLLOUT_CORRECTION_MODES)


@dataclass
class LossFns:
    """The algorithm's choices, resolved to functions once per run."""

    advantage: Callable[..., Any] | None  # group/batch estimators; None for SFT and GAE
    policy: Callable[..., Any]
    kl_loss: Callable[..., Any] | None
    kl_penalty: Callable[..., Any] | None
    entropy: Callable[..., Any]
    entropy_in_loss: bool
    entropy_rollout_only: bool  # the bonus counts rollout rows only (entropy_loss_fn: mix)
    agg_mode: str
    recompute_old: bool
    sft: bool
    # (proximal, behaviour, mask) -> (weights [B, L], CorrectionSums); None: no correction
    correction: Callable[..., Any] | None = None
    # (token_rewards, values, mask) -> (advantages, returns, metrics): advantage_fn ppo (a critic)
    gae: Callable[..., Any] | None = None
    advantage_by_run: bool = False  # the advantage takes each row's (run, env step): runs=...
    advantage_by_info: bool = False  # ... and each row's experience info: infos=... (gigpo)
    # the advantage takes each row's mean rollout log-prob: logprob_means=... (grpo rank_penalty)
    advantage_by_logprobs: bool = False
    # the advantage takes old_logprobs= and teacher_logprobs= (on_policy_distill, jsd)
    advantage_by_teacher: bool = False
    # policy_loss_fn m2po: its mask's m2_threshold, applied per mini-batch (rft.trainer.m2po)
    m2po_threshold: float | None = None
    # (advantages, mask, rollout_logprobs, entropy) -> (kept tokens [B, R], metrics), applied
    # after the advantages with the old pass's entropies (names.ENTROPY_TOKEN_FILTER: Clip-B)
    token_filter: Callable[..., Any] | None = None

    @property
    def needs_ref(self) -> bool:
        return self.kl_loss is not None or self.kl_penalty is not None


def _with_agg(
    args: dict[str, Any], agg_mode: str, fn_name: str, getter: Callable[..., Any]
) -> dict[str, Any]:
    """Add the run's loss_agg_mode to the function's args when it takes one and none is given."""
    kind = getter.__name__.removeprefix("get_")
    if "loss_agg_mode" in valid_args(kind, fn_name) and "loss_agg_mode" not in args:
        return {**args, "loss_agg_mode": agg_mode}
    return args


# Trinity's SFTLossFn(use_token_level_loss): a mean over all tokens, else over sequences.
_TOKEN_LEVEL_SFT = {True: "token-mean", False: "seq-mean-token-mean"}


def expert_loss_args(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """MIX / CHORD args as rft's loss takes them: Trinity's batch bookkeeping
    (``names.MIX_BATCH_ARGS``: no effect, checked by ``rft.config.mix_args``) dropped, and its
    ``use_token_level_loss_in_sft`` as the ``sft_loss_agg_mode`` it means."""
    if name not in names.EXPERT_LOSSES:
        return args
    args = {k: v for k, v in args.items() if k not in names.MIX_BATCH_ARGS}
    if "use_token_level_loss_in_sft" not in args:
        return args
    token_level = args.pop("use_token_level_loss_in_sft")
    key = "algorithm.policy_loss_fn_args"
    if not isinstance(token_level, bool):
        raise ConfigError(
            f"{key}.use_token_level_loss_in_sft: got {token_level!r}, expected true or false"
        )
    mode = _TOKEN_LEVEL_SFT[token_level]
    if args.setdefault("sft_loss_agg_mode", mode) != mode:
        raise ConfigError(
            f"{key}.use_token_level_loss_in_sft={token_level} (SFT part {mode}) contradicts "
            f"sft_loss_agg_mode={args['sft_loss_agg_mode']!r}; set only one"
        )
    return args


def uses_reference(cfg: Config, fns: LossFns | None = None) -> bool:
    """Whether the trainer holds a frozen reference model: for a KL term (loss or penalty), and
    for DPO, which always scores against it."""
    fns = fns or build_loss_fns(cfg.algorithm)
    return fns.needs_ref or trains_pairs(cfg)


def build_loss_fns(algo: AlgorithmConfig) -> LossFns:
    """The ``algorithm`` section's choices as functions; ConfigError for a bad name or argument."""
    agg = algo.loss_agg_mode or "token-mean"
    policy_args = _with_agg(
        expert_loss_args(algo.policy_loss_fn, algo.policy_loss_fn_args),
        agg,
        algo.policy_loss_fn,
        get_policy_loss_fn,
    )
    sft = algo.policy_loss_fn == "sft"
    kl_on = algo.kl_loss_fn not in (None, "none")
    pen_on = algo.kl_penalty_fn not in (None, "none")
    entropy_name = algo.entropy_loss_fn or "none"
    gae = not sft and algo.advantage_fn in names.NEEDS_CRITIC
    return LossFns(
        advantage=None
        if sft or gae or algo.advantage_fn is None  # None: DPO (pairs, no advantages)
        else get_advantage_fn(algo.advantage_fn, algo.advantage_fn_args),
        policy=get_policy_loss_fn(algo.policy_loss_fn, policy_args),
        kl_loss=get_kl_loss_fn(
            algo.kl_loss_fn, _with_agg(algo.kl_loss_fn_args, agg, algo.kl_loss_fn, get_kl_loss_fn)
        )
        if kl_on
        else None,
        kl_penalty=get_kl_penalty_fn(algo.kl_penalty_fn, algo.kl_penalty_fn_args)
        if pen_on
        else None,
        entropy=get_entropy_loss_fn(
            entropy_name,
            _with_agg(algo.entropy_loss_fn_args, agg, entropy_name, get_entropy_loss_fn),
        ),
        # a zero coefficient adds nothing: skip the entropy's gradient (memory) as for "none"
        entropy_in_loss=entropy_name != "none"
        and algo.entropy_loss_fn_args.get("entropy_coef", 0.0) != 0,
        entropy_rollout_only=entropy_name in names.ROLLOUT_ENTROPY,
        agg_mode=policy_args.get("loss_agg_mode", agg),
        recompute_old=algo.old_logprobs == "recompute" and not sft,
        sft=sft,
        correction=get_correction_fn(algo.rollout_correction),
        gae=get_gae_fn(algo.advantage_fn_args) if gae else None,
        advantage_by_run=algo.advantage_fn in names.BY_RUN,
        advantage_by_info=algo.advantage_fn in names.BY_INFO,
        advantage_by_logprobs=algo.advantage_fn == "grpo"
        and algo.advantage_fn_args.get("rank_penalty") is not None,
        advantage_by_teacher=algo.advantage_fn in names.NEEDS_TEACHER,
        m2po_threshold=float(policy_args.get("m2_threshold", M2_THRESHOLD))
        if algo.policy_loss_fn == "m2po"
        else None,
        token_filter=functools.partial(
            clipb_keep, mu=float(algo.advantage_fn_args.get("mu", CLIPB_MU))
        )
        if algo.advantage_fn in names.ENTROPY_TOKEN_FILTER
        else None,
    )


def get_correction_fn(rc: RolloutCorrectionConfig) -> Callable[..., Any] | None:
    """``fn(proximal, behaviour, mask) -> (weights [B, L], CorrectionSums)`` for
    ``algorithm.rollout_correction``, or None for mode ``none`` (which and how the keys combine
    with the rest of the config is checked in :mod:`rft.config.rules`)."""
    if rc.mode == "none":
        return None
    threshold = names.TIS_THRESHOLD if rc.rollout_is_threshold is None else rc.rollout_is_threshold
    return functools.partial(
        correction_weights,
        mode=rc.mode,
        rollout_is_threshold=threshold,
        behav_imp_weight_cap=rc.behav_imp_weight_cap,
    )
