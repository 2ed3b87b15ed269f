"""Trinity-RFT's algorithm types in rft: the advantage and loss functions they add (hand-computed
values), their argument checks, and the presets against a table transcribed from Trinity."""

from __future__ import annotations

import math

import pytest
import torch

from rft.algo import registry
from rft.algo.losses import ENTROPY, MU, SFT_LOSS
from rft.algo.weighted_pg import RATIO_MEAN
from rft.config import names
from rft.config.load import config_from_dict
from rft.config.presets import COMMON_DEFAULTS, PRESETS, REPEAT_TIMES
from rft.errors import ConfigError
from rft.trainer.step import _batch_term_weight

T = torch.tensor


def _adv(name: str, rewards: list[float], groups: list[str], **args) -> list[float]:
    fn = registry.get_advantage_fn(name, args)
    adv, _ = fn(T(rewards), groups, torch.ones(len(rewards), 1))
    return adv[:, 0].tolist()


# ----------------------------------------------------------------------------- advantages


def test_asymre_shifts_the_group_mean_down_and_keeps_a_lone_reward():
    # group a: mean 0.5, baseline 0.5 - 0.1 = 0.4 -> [0.6, -0.4]; b alone: baseline 0 -> 0.7
    assert _adv("asymre", [1, 0, 0.7], ["a", "a", "b"]) == pytest.approx([0.6, -0.4, 0.7])
    assert _adv("asymre", [1, 0], ["a", "a"], baseline_shift=0.0) == pytest.approx([0.5, -0.5])


def test_grpo_verl_and_grpo_keep_a_lone_reward_as_trinity():
    # [1, 0]: mean 0.5, unbiased std 0.7071068 -> +-0.5 / 0.7071078; lone 2 -> 2 / (1 + 1e-6)
    got = _adv("grpo_verl", [1, 0, 2], ["a", "a", "b"])
    assert got == pytest.approx([0.7071058, -0.7071058, 1.999998], abs=1e-6)
    assert _adv("grpo", [1, 0, 2], ["a", "a", "b"]) == pytest.approx(got, abs=1e-6)


def test_rec_mean_baseline_population_std_and_lone_reward():
    # mean 0.25 -> [0.75, -0.25 x3]; population std sqrt(0.1875) = 0.4330127
    assert _adv("rec", [1, 0, 0, 0], ["g"] * 4) == pytest.approx([0.75, -0.25, -0.25, -0.25])
    normed = _adv("rec", [1, 0, 0, 0], ["g"] * 4, std_normalize=True)
    assert normed == pytest.approx([1.7320508, -0.5773503, -0.5773503, -0.5773503], abs=1e-5)
    assert _adv("rec", [0.7], ["lone"]) == pytest.approx([0.7])  # mean 0, std 1


def test_rec_drop_balance_drops_extra_below_mean_responses():
    torch.manual_seed(0)
    # 3 below the mean vs 1 above: 2 of the zeros dropped (advantage 0); kept [1, 0]: mean 0.5
    got = _adv("rec", [1, 0, 0, 0], ["g"] * 4, drop="balance")
    assert got[0] == pytest.approx(0.5)
    assert sorted(got[1:]) == pytest.approx([-0.5, 0.0, 0.0])
    # balanced groups drop nothing
    assert _adv("rec", [1, 1, 0, 0], ["g"] * 4, drop="balance") == pytest.approx(
        [0.5, 0.5, -0.5, -0.5]
    )


# ----------------------------------------------------------------------------- policy losses

LP = T([[-1.0, -1.0], [-1.0, -1.0]])  # logprob of every token
# row 0: log ratios [0.5, -0.5] (r = 1.6487213, 0.6065307); row 1: [0.2, 0.1] (1.2214, 1.1052)
OLD = T([[-1.5, -0.5], [-1.2, -1.1]])
ADV = T([[1.0, 1.0], [-1.0, -1.0]])
MASK = torch.ones(2, 2)
R0, R1 = math.exp(0.5), math.exp(-0.5)
S0, S1 = math.exp(0.2), math.exp(0.1)


def _loss(name: str, adv=ADV, **args) -> tuple[float, dict]:
    loss, metrics = registry.get_policy_loss_fn(name, args)(LP, OLD, adv, MASK)
    return loss.item(), metrics


def test_topr_full_weight_above_threshold_truncated_ratio_below():
    adv = T([[2.0, 2.0], [-1.0, -1.0]])
    old = T([[-1.0, -1.0], [-1.5, -0.5]])  # row 1 ratios [1.6487, 0.6065] -> w [1, 0.6065]
    loss, m = registry.get_policy_loss_fn("topr")(LP, old, adv, MASK)
    # -w A lp = [2, 2, -1, -0.6065307] -> mean
    assert loss.item() == pytest.approx((4 - 1 - R1) / 4)
    assert m[RATIO_MEAN] == pytest.approx((2 + R0 + R1) / 4)


def test_cispo_clips_the_weight_not_the_gradient_and_mask_clip():
    # w = clip(r, 0, 1.28): row 0 [1.28, 0.6065], row 1 [1.2214, 1.1052]; -w A lp = [w0 | -w1]
    loss, _ = _loss("cispo")
    assert loss == pytest.approx((1.28 + R1 - S0 - S1) / 4)
    # mask clip: row 0 token 0 (A > 0, r > 1.28) gets weight 0
    loss, m = _loss("cispo", enable_mask_clip=True)
    assert loss == pytest.approx((R1 - S0 - S1) / 4)
    assert m["masked_frac"] == pytest.approx(0.25)
    lp = LP.clone().requires_grad_()
    registry.get_policy_loss_fn("cispo")(lp, OLD, ADV, MASK)[0].backward()
    # gradient -w A / 4: the clipped token still moves, at weight 1.28
    assert lp.grad[0].tolist() == pytest.approx([-1.28 / 4, -R1 / 4])


def test_sapo_soft_gate_by_advantage_sign():
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    w_pos = [4 * sig(R0 - 1), 4 * sig(R1 - 1)]  # tau_pos 1
    w_neg = [4 / 1.05 * sig(1.05 * (S0 - 1)), 4 / 1.05 * sig(1.05 * (S1 - 1))]  # tau_neg 1.05
    loss, _ = _loss("sapo")
    assert loss == pytest.approx((sum(w_pos) - sum(w_neg)) / 4, abs=1e-6)


def test_sppo_masks_tokens_outside_the_log_symmetric_range():
    # eps 0.3: [1/1.3, 1.3] = [0.769, 1.3]: row 0 both out, row 1 both in
    loss, m = _loss("sppo")
    # -A (lp - old) on row 1 = [0.2, 0.1] -> sum 0.3 / 4
    assert loss == pytest.approx(0.075)
    assert m["pg_clipfrac"] == pytest.approx(0.5)
    loss, m = _loss("sppo", epsilon=1.0)  # [0.5, 2]: all in; row 0: -(0.5) + 0.5 = 0
    assert loss == pytest.approx(0.075)
    assert m["pg_clipfrac"] == 0.0


@pytest.mark.parametrize(
    "args, expected",
    [
        ({}, (1 + 1 - 1 - 1) / 4),  # -A lp = [1, 1 | -1, -1]
        ({"clip_mode": "two-side"}, -1 / 4),  # only r = 1.1052 lies in [0.8, 1.2]
        ({"clip_mode": "one-side"}, (1 - 1 - 1) / 4),  # A>=0: r<=1.2; A<=0: r>=0.8
        ({"clip_mode": "ring"}, -1 / 4),  # ring primes 0.6/2 add nothing here
        ({"weight": "importance_sampling"}, (R0 + R1 - S0 - S1) / 4),
        ({"regularizer": "k2", "regularizer_coef": 0.5}, 0.5 * (0.25 * 2 + 0.04 + 0.01) / 4),
        ({"regularizer": "forward-kl", "regularizer_coef": 0.5}, 0.5 * 4 / 4),
    ],
)
def test_rec_clip_modes_weights_and_regularisers(args, expected):
    assert _loss("rec", **args)[0] == pytest.approx(expected, abs=1e-6)


def test_rec_gspo_one_side_uses_the_sequence_ratio():
    # row 0: mean log r 0 -> s = 1 (kept); row 1: mean 0.15 -> s = 1.1618, A <= 0 needs s >= 0.8
    assert _loss("rec", clip_mode="gspo-one-side")[0] == pytest.approx(0.0)
    got = _loss("rec", weight="gspo_importance_sampling")[0]
    assert got == pytest.approx((2 * 1.0 - 2 * math.exp(0.15)) / 4)


def test_mix_is_constant_mu_ppo_plus_plain_nll():
    lp = T([[-1.0, -2.0], [-0.5, -1.5]])
    expert = T([False, True])
    adv = T([[1.0, 1.0], [0.0, 0.0]])
    loss, m = registry.get_policy_loss_fn("mix", {"mu": 0.2})(
        lp, lp, adv, MASK, expert_mask=expert, step=7
    )
    # rollout row: ratio 1, PPO = -mean(A) = -1; expert row: NLL mean = 1.0
    assert loss.item() == pytest.approx(0.8 * -1.0 + 0.2 * 1.0)
    assert m[MU] == 0.2 and m[f"expert/{SFT_LOSS}"] == pytest.approx(1.0)


def test_entropy_mix_counts_rollout_rows_only():
    entropy = T([[1.0, 1.0], [3.0, 3.0]])
    fn = registry.get_entropy_loss_fn("mix", {"entropy_coef": 0.1})
    loss, m = fn(entropy, MASK, expert_mask=T([False, True]))
    assert loss.item() == pytest.approx(-0.1) and m[ENTROPY] == pytest.approx(1.0)
    loss, m = fn(entropy, MASK, expert_mask=T([True, True]))
    assert loss.item() == 0.0 and m == {}
    assert registry.get_entropy_loss_fn("default", {"entropy_coef": 0.1})(
        entropy, MASK, expert_mask=T([False, True])
    )[0].item() == pytest.approx(-0.2)


def test_whole_batch_terms_weigh_each_source_by_its_share():
    assert _batch_term_weight(0.25, "token-mean") == 0.25
    assert _batch_term_weight(0.25, "seq-mean-token-mean") == 0.25
    assert _batch_term_weight(0.25, "seq-mean-token-sum-norm") == 1.0


# ----------------------------------------------------------------------------- argument checks


@pytest.mark.parametrize(
    "kind, name, args, match",
    [
        ("policy_loss_fn", "sapo", {"tau_neg": 0.9}, "tau_neg=0.9 must be >= tau_pos=1.0"),
        ("policy_loss_fn", "rec", {"clip_mode": "both"}, "clip_mode: got 'both'"),
        ("policy_loss_fn", "rec", {"epsilon_low": 1.5}, r"in \(0, 1\]"),
        ("policy_loss_fn", "cispo", {"enable_mask_clip": 1}, "true or false"),
        ("policy_loss_fn", "mix", {"mu": 2}, r"in \[0, 1\]"),
        ("advantage_fn", "rec", {"drop": "all"}, "null or 'balance'"),
        ("advantage_fn", "asymre", {"baseline_shift": "low"}, "a number"),
        ("advantage_fn", "opmd", {"opmd_baseline": "logavgexp", "tau": 0}, "tau, which must"),
    ],
)
def test_bad_arguments_name_the_key_and_what_is_valid(kind, name, args, match):
    getter = getattr(registry, f"get_{kind}")
    with pytest.raises(ConfigError, match=match):
        getter(name, args)


def test_opmd_loss_accepts_tau_zero_as_trinity_asymre_example():
    loss, _ = registry.get_policy_loss_fn("opmd", {"tau": 0})(LP, OLD, ADV, MASK)
    assert loss.item() == pytest.approx(0.0)  # -A lp = [1, 1, -1, -1] / (1 + 0)


# ----------------------------------------------------------------------------- presets

# Transcribed by hand from Trinity-RFT trinity/algorithm/algorithm.py (main after v0.5.2: the
# version registering jsd; its AlgorithmType.default_config() of each type) merged over the base
# defaults of trinity/common/config_validator.py AlgorithmConfigValidator (policy_loss_fn ppo,
# kl_penalty_fn none, kl_loss_fn k2, entropy_loss_fn default, loss_agg_mode token-mean).
# Columns: advantage_fn, policy_loss_fn, kl_loss_fn, kl_penalty_fn, entropy_loss_fn,
# sample_strategy, repeat_times. sft/raft/dpo train without advantages (Trinity's base "ppo" is
# unused there; rft leaves advantage_fn unset).
TRINITY = {
    "sft": (None, "sft", "none", "none", "none", "default", None),
    "ppo": ("ppo", "ppo", "k2", "none", "default", "default", 1),
    "grpo": ("grpo", "ppo", "k2", "none", "default", "default", 2),
    "dapo": ("grpo", "ppo", "none", "none", "default", "default", 16),  # agentscope-ai@0fcd37e
    "reinforceplusplus": ("reinforceplusplus", "ppo", "k2", "none", "default", "default", 2),
    "rloo": ("rloo", "ppo", "k2", "none", "default", "default", 2),
    "opmd": ("opmd", "opmd", "k2", "none", "default", "default", 2),
    "asymre": ("asymre", "opmd", "none", "none", "none", "default", 2),
    "dpo": (None, "dpo", "k2", "none", "default", "default", None),
    "topr": ("reinforce", "topr", "k2", "none", "default", "default", 2),
    "cispo": ("grpo", "cispo", "k2", "none", "default", "default", 2),
    "gspo": ("grpo", "gspo", "k2", "none", "default", "default", 2),
    "sapo": ("grpo", "sapo", "k2", "none", "default", "default", 2),
    "mix": ("grpo", "mix", "k2", "none", "mix", "mix", 8),
    "mix_chord": ("grpo", "mix_chord", "k2", "none", "mix", "mix", 8),
    "raft": (None, "sft", "none", "none", "none", "default", None),
    "sppo": ("opmd", "sppo", "none", "none", "none", "default", 2),
    "rec": ("rec", "rec", "k2", "none", "default", "default", 2),
    "multi_step_grpo": ("step_wise_grpo", "ppo", "k2", "none", "default", "default", 8),
    "on_policy_distill": ("on_policy_distill", "ppo", "none", "none", "none", "default", 8),
    "jsd": ("jsd", "ppo", "none", "none", "none", "default", 8),
    # agentscope-ai@402adb2 M2POAlgorithm (its tests/algorithm/test_m2po_policy_loss.py)
    "m2po": ("grpo", "m2po", "none", "none", "none", "default", 8),
    # agentscope-ai@0fcd37e GiGPOAlgorithm (its tests/algorithm/test_gigpo_advantage.py)
    "gigpo": ("gigpo", "ppo", "k2", "none", "default", "default", 8),
    # main 9051d63 registers grpo_verl as GRPOverlAlgorithm (its class body was not stored to
    # read): GRPO's preset with veRL's batch advantage, as the name and its advantage_fn say
    "grpo_verl": ("grpo_verl", "ppo", "k2", "none", "default", "default", 2),
}
KEYS = ("advantage_fn", "policy_loss_fn", "kl_loss_fn", "kl_penalty_fn", "entropy_loss_fn")


@pytest.mark.parametrize("algorithm_type", sorted(TRINITY))
def test_preset_equals_trinitys_default_config(algorithm_type):
    preset = {**COMMON_DEFAULTS, **PRESETS[algorithm_type]}
    *fns, strategy, repeat = TRINITY[algorithm_type]
    assert tuple(preset.get(k) for k in KEYS) == tuple(fns)
    assert preset["sample_strategy"] == strategy
    assert preset["loss_agg_mode"] == "token-mean"
    assert REPEAT_TIMES.get(algorithm_type) == repeat


def test_every_trinity_type_is_declared_and_only_reinforce_is_rfts_own():
    assert set(names.ALGORITHM_TYPES) == set(TRINITY) | {"reinforce"}
    assert set(PRESETS) == set(names.ALGORITHM_TYPES)


def _config(algorithm: dict) -> dict:
    return {
        "model": {"model_path": "/models/m"},
        "algorithm": {"repeat_times": 4, **algorithm},
        "buffer": {"batch_size": 2, "explorer_input": {"taskset": {"path": "/data/t"}}},
        "cluster": {"node_num": 1, "gpu_per_node": 2},
    }


@pytest.mark.parametrize("algorithm_type", sorted(names.NEEDS_TEACHER))
def test_distillation_types_need_one_teacher(algorithm_type):
    with pytest.raises(ConfigError, match="needs exactly one teacher in explorer.auxiliary_models"):
        config_from_dict(_config({"algorithm_type": algorithm_type}))
    raw = _config({"algorithm_type": algorithm_type})
    raw["explorer"] = {"auxiliary_models": [{"model_path": "/models/teacher"}]}
    raw["cluster"]["gpu_per_node"] = 3  # explorer: the engine's GPU and the teacher's
    assert config_from_dict(raw).algorithm.advantage_fn == algorithm_type


@pytest.mark.parametrize("algorithm_type", ["asymre", "topr", "cispo", "sapo", "sppo", "rec"])
def test_new_types_load_with_their_preset(algorithm_type):
    cfg = config_from_dict(_config({"algorithm_type": algorithm_type}))
    preset = {**COMMON_DEFAULTS, **PRESETS[algorithm_type]}
    assert {k: getattr(cfg.algorithm, k) for k in preset} == preset


def test_raft_trains_nll_on_rollouts_without_advantages():
    cfg = config_from_dict(_config({"algorithm_type": "raft"}))
    assert cfg.algorithm.policy_loss_fn == "sft" and cfg.algorithm.advantage_fn is None


def test_user_choices_win_over_the_preset():
    cfg = config_from_dict(_config({"algorithm_type": "ppo", "kl_loss_fn": "none"}))
    assert cfg.algorithm.kl_loss_fn == "none" and cfg.algorithm.entropy_loss_fn == "default"
