"""GiGPO (``algorithm_type: gigpo``) against Trinity-RFT's definition, with hand-computed values.

The specification is agentscope-ai/Trinity-RFT at commit 0fcd37e9497b977e56053e256ddbb36964084e0a:
trinity/algorithm/advantage_fn/gigpo_advantage.py (GiGPOAdvantageFn, below "gigpo_advantage.py")
and trinity/algorithm/algorithm.py (GiGPOAlgorithm). Each test names the lines it follows.
"""

from __future__ import annotations

import pytest
import torch

from rft.algo.advantages import grpo_advantages
from rft.algo.gigpo import gigpo_advantages
from rft.algo.registry import get_advantage_fn
from rft.buffer.experience import Experience as Record
from rft.config.load import config_from_dict, load_config
from rft.errors import ConfigError, DataError
from rft.trainer.algorithm import build_loss_fns
from rft.trainer.batching import rows_from_experiences

EPS = 1e-6


def _info(step_reward=None, state=None) -> dict:
    info = {}
    if step_reward is not None:
        info["step_reward"] = step_reward
    if state is not None:
        info["env_state_hash"] = state
    return info


def _shared_anchor_batch():
    """One task, two runs of two steps; both runs start in state "A", then part ways.
    Run 0 earns 1 at its last step, run 1 nothing (Trinity's test_anchor_state_grouping)."""
    groups = ["t"] * 4
    runs = [(0, 0), (0, 1), (1, 0), (1, 1)]
    infos = [_info(0.0, "A"), _info(1.0, "B0"), _info(0.0, "A"), _info(0.0, "B1")]
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])  # the terminal reward copied to every step
    return rewards, groups, runs, infos


def test_two_episodes_sharing_an_anchor_state():
    # gigpo_advantage.py process(): episode return = sum(rewards) (undiscounted), normalised
    # per task by _normalize with fnorm "none": (R - mean) / (1 + eps); steps grouped by
    # str(info["env_state_hash"]) across the batch, a group of >= 2 normalises the discounted
    # returns R_t; combined = a_e + omega * a_s, written as action_mask * combined.
    rewards, groups, runs, infos = _shared_anchor_batch()
    mask = torch.tensor([[1.0, 1.0, 0.0]] * 4)
    adv, metrics = gigpo_advantages(rewards, groups, mask, runs=runs, infos=infos)
    # A_E: returns 1 and 0, mean 0.5 -> +-0.5. Discounted (gamma 1) returns: run 0 [1, 1],
    # run 1 [0, 0]. Anchor "A" = {run 0 step 0 (1), run 1 step 0 (0)} -> +-0.5; B0, B1 alone: 0.
    expected = [x / (1 + EPS) for x in (0.5 + 0.5, 0.5, -0.5 - 0.5, -0.5)]
    assert adv[:, 0].tolist() == pytest.approx(expected, abs=1e-7)
    assert adv[:, 2].tolist() == [0.0] * 4  # off the mask
    assert metrics["gigpo/anchor_groups_total"] == 3.0
    assert metrics["gigpo/anchor_groups_size_gt1"] == 1.0
    assert metrics["gigpo/anchor_group_hit_ratio"] == pytest.approx(1 / 3)
    assert metrics["gigpo/episode_reward_mean"] == pytest.approx(0.5)


def test_gamma_discounts_the_step_returns_only():
    # gigpo_advantage.py _discounted_returns: R_t = sum_{k>=t} gamma^(k-t) r_k feeds the anchor
    # groups; episode_return = sum(rewards) is undiscounted.
    rewards, groups, runs, infos = _shared_anchor_batch()
    adv, _ = gigpo_advantages(rewards, groups, torch.ones(4, 1), runs=runs, infos=infos, gamma=0.5)
    # run 0 step 0: R_0 = 0 + 0.5 * 1 = 0.5 vs run 1's 0 -> A_S = +-0.25; A_E stays +-0.5.
    expected = [x / (1 + EPS) for x in (0.75, 0.5, -0.75, -0.5)]
    assert adv[:, 0].tolist() == pytest.approx(expected, abs=1e-7)


def test_fnorm_std_and_omega():
    # gigpo_advantage.py _normalize: fnorm "std" divides by torch.std (unbiased) + eps;
    # combined = a_e + self.omega * a_s.
    rewards, groups, runs, infos = _shared_anchor_batch()
    adv, _ = gigpo_advantages(
        rewards, groups, torch.ones(4, 1), runs=runs, infos=infos, fnorm="std", omega=0.5
    )
    # A_E: [1, 0] has unbiased std sqrt(0.5): +-0.5 / sqrt(0.5) = +-sqrt(0.5); anchor "A" the same.
    s = 0.5 / (0.5**0.5 + EPS)
    assert adv[:, 0].tolist() == pytest.approx([s + 0.5 * s, s, -s - 0.5 * s, -s], abs=1e-6)


def test_distinct_states_leave_the_episode_advantage():
    # gigpo_advantage.py: "if len(members) < 2: continue" (a_s stays 0.0), and a step without
    # the hash key is in no bucket (Trinity's test_singleton_anchor_zero_step_adv).
    rewards, groups, runs, _ = _shared_anchor_batch()
    infos = [_info(0.0, "A0"), _info(1.0, "B0"), _info(0.0), _info(0.0, "B1")]
    adv, metrics = gigpo_advantages(rewards, groups, torch.ones(4, 1), runs=runs, infos=infos)
    assert adv[:, 0].tolist() == pytest.approx([0.5, 0.5, -0.5, -0.5], abs=1e-6)
    assert metrics["gigpo/anchor_groups_size_gt1"] == 0.0
    assert metrics["gigpo/anchor_group_hit_ratio"] == 0.0
    assert metrics["gigpo/mean_abs_A_S"] == 0.0


def test_anchor_groups_span_tasks_and_hashes_compare_as_strings():
    # gigpo_advantage.py: "for exp in exps" over the whole batch, keyed str(state_hash).
    groups = ["t", "u"]
    runs = [(0, 0), (0, 0)]
    infos = [_info(2.0, 7), _info(0.0, "7")]
    adv, _ = gigpo_advantages(torch.zeros(2), groups, torch.ones(2, 1), runs=runs, infos=infos)
    # Each task has one run: A_E = R / (1 + eps) (_normalize, len(values) == 1: mean 0, denom 1).
    # The shared anchor "7": returns 2 and 0 -> +-1.
    assert adv[:, 0].tolist() == pytest.approx([(2.0 + 1.0) / (1 + EPS), -1.0 / (1 + EPS)])


def test_single_step_episodes_are_grpo_like():
    # One step per run, no step_reward: the sparse fallback (_step_rewards: the terminal
    # reward on the last step) makes R the run's reward; no hash, no step term.
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 1.0])
    groups = ["g"] * 4 + ["h"] * 2
    runs = [(0, 0), (1, 0), (2, 0), (3, 0), (0, 0), (1, 0)]
    infos = [{}] * 6
    mask = torch.ones(6, 2)
    adv, _ = gigpo_advantages(rewards, groups, mask, runs=runs, infos=infos, fnorm="std")
    grpo, _ = grpo_advantages(rewards, groups, mask, epsilon=EPS)
    assert torch.allclose(adv, grpo, atol=1e-6)
    # fnorm none (Trinity's default): Dr.GRPO's r - mean, divided by 1 + eps.
    adv, _ = gigpo_advantages(rewards, groups, mask, runs=runs, infos=infos)
    drgrpo, _ = grpo_advantages(rewards, groups, mask, std_normalize=False)
    assert torch.allclose(adv, drgrpo / (1 + EPS), atol=1e-7)


def test_sparse_fallback_counts_the_last_steps_reward_once():
    # gigpo_advantage.py _step_rewards: without step_reward_key on any step of the run, r_t is
    # exp.reward on the last step (sorted by eid.step) and 0 before it. Rows arrive out of order.
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])
    runs = [(0, 1), (0, 0), (1, 0), (1, 1)]
    infos = [_info(state="S1"), _info(state="S0"), _info(state="S0"), _info(state="S2")]
    adv, _ = gigpo_advantages(rewards, ["t"] * 4, torch.ones(4, 1), runs=runs, infos=infos)
    # Episode returns 1 (not 2) and 0 -> +-0.5; anchor S0: run 0's R_0 = 1 vs run 1's 0 -> +-0.5.
    assert adv[:, 0].tolist() == pytest.approx([0.5, 1.0, -1.0, -0.5], abs=1e-6)


def test_a_step_without_step_reward_counts_zero_and_a_bad_one_is_refused():
    # gigpo_advantage.py _step_rewards: once any step has the key, (exp.info).get(key, 0.0).
    runs = [(0, 0), (0, 1), (1, 0)]
    infos = [{}, _info(1.0), _info(0.0)]
    adv, _ = gigpo_advantages(torch.ones(3), ["t"] * 3, torch.ones(3, 1), runs=runs, infos=infos)
    assert adv[:, 0].tolist() == pytest.approx([0.5, 0.5, -0.5], abs=1e-6)
    with pytest.raises(DataError, match="step_reward"):
        gigpo_advantages(
            torch.ones(1), ["t"], torch.ones(1, 1), runs=[(0, 0)], infos=[_info("high")]
        )


def test_custom_info_keys():
    # GiGPOAdvantageFn(step_reward_key=..., env_state_hash_key=...): the keys are arguments.
    fn = get_advantage_fn("gigpo", {"step_reward_key": "r", "env_state_hash_key": "obs"})
    infos = [{"r": 1.0, "obs": "x"}, {"r": 0.0, "obs": "x"}]
    adv, _ = fn(torch.zeros(2), ["t", "t"], torch.ones(2, 1), runs=[(0, 0), (1, 0)], infos=infos)
    assert adv[:, 0].tolist() == pytest.approx([1.0, -1.0], abs=1e-5)


def test_args_are_checked():
    with pytest.raises(ConfigError, match="fnorm"):
        get_advantage_fn("gigpo", {"fnorm": "mean"})
    with pytest.raises(ConfigError, match="omega"):
        get_advantage_fn("gigpo", {"omega": "1"})
    with pytest.raises(ConfigError, match="valid arguments"):
        get_advantage_fn("gigpo", {"step_advantage_w": 1.0})


def _config(algorithm: dict):
    return config_from_dict(
        {
            "mode": "train",
            "algorithm": algorithm,
            "model": {"model_path": "m"},
            "cluster": {"gpu_per_node": 0},
        }
    )


def test_preset_builds_its_loss_fns():
    # algorithm.py GiGPOAlgorithm.default_config(): repeat_times 8, advantage_fn gigpo,
    # policy_loss_fn ppo (clip 0.2 both sides, token-mean), kl_penalty_fn none, kl_loss_fn k2,
    # entropy_loss_fn default.
    cfg = _config({"algorithm_type": "gigpo", "repeat_times": 8})
    algo = cfg.algorithm
    assert (algo.advantage_fn, algo.policy_loss_fn, algo.kl_loss_fn, algo.kl_penalty_fn) == (
        "gigpo",
        "ppo",
        "k2",
        "none",
    )
    assert (algo.entropy_loss_fn, algo.loss_agg_mode) == ("default", "token-mean")
    fns = build_loss_fns(algo)
    assert fns.advantage_by_run and fns.advantage_by_info and fns.needs_ref
    # The trainer's rows carry each record's run, env step and info to the advantage.
    recs = [
        Record("t", "g", [1], [2], logprobs=[0.0], reward=r, info={"run": run, "env_step": 0, **i})
        for run, r, i in ((0, 1.0, _info(1.0, "A")), (1, 0.0, _info(0.0, "A")))
    ]
    rows = rows_from_experiences(recs)
    assert rows.infos[0]["env_state_hash"] == "A"
    adv, _ = fns.advantage(
        rows.rewards, rows.group_ids, rows.response_mask, runs=rows.runs, infos=rows.infos
    )
    assert adv[:, 0].tolist() == pytest.approx([1.0, -1.0], abs=1e-5)


def test_trinity_example_algorithm_section_loads(tmp_path):
    # examples/gigpo_alfworld/gigpo.yaml's algorithm section as written (commit 3284b6a).
    path = tmp_path / "gigpo.yaml"
    path.write_text(
        "mode: train\n"
        "model: {model_path: m}\n"
        "cluster: {gpu_per_node: 0}\n"
        "algorithm:\n"
        "  algorithm_type: gigpo\n"
        "  repeat_times: 8\n"
        "  advantage_fn: gigpo\n"
        "  advantage_fn_args:\n"
        "    omega: 1.0\n"
        "    gamma: 1.0\n"
        "    fnorm: none\n"
        "    epsilon: 1e-6\n"
        "  policy_loss_fn_args:\n"
        "    clip_range_low: 0.2\n"
        "    clip_range_high: 0.2\n"
        "    loss_agg_mode: token-mean\n"
        "  optimizer:\n"
        "    lr: 5e-6\n"
    )
    cfg = load_config(path)
    assert cfg.algorithm.advantage_fn_args["epsilon"] == pytest.approx(1e-6)
    assert build_loss_fns(cfg.algorithm).advantage_by_info
