"""DPO: the loss on hand-computed values (Trinity-RFT's trinity/algorithm/policy_loss_fn/
dpo_loss.py), the config it needs, pairs kept whole in micro-batches, and a CPU run with a tiny
model whose loss falls while the chosen/rejected reward margin rises."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rft.algo.dpo import (
    CHOSEN_REWARD,
    DPO_LOSS,
    REJECTED_REWARD,
    REWARD_ACCURACY,
    REWARD_MARGIN,
    dpo_loss,
)
from rft.config.load import config_from_dict
from rft.errors import ConfigError
from rft.trainer.algorithm import build_loss_fns
from rft.trainer.dpo import fit_pair, pair_micro_batches


def softplus(x: float) -> float:
    return math.log1p(math.exp(x))  # -log sigmoid(-x)


# ----------------------------------------------------------------------------- the loss

# Pair 0: chosen tokens (-1, -2) under the policy, (-2, -2) under the reference: ratio 1;
# rejected (-2, masked) vs (-1, masked): ratio -1; z = 2. Pair 1: policy == reference, z = 0.
LOGPROB = torch.tensor([[-1.0, -2.0], [-2.0, -9.0], [-0.5, -0.5], [-3.0, -1.0]])
REF = torch.tensor([[-2.0, -2.0], [-1.0, -7.0], [-0.5, -0.5], [-3.0, -1.0]])
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])


def test_dpo_loss_on_hand_computed_values():
    loss, m = dpo_loss(LOGPROB[:2], REF[:2], MASK[:2], beta=0.5)
    # -log sigmoid(beta z) = log(1 + e^-1)
    assert loss.item() == pytest.approx(softplus(-1.0), abs=1e-6)
    assert m[CHOSEN_REWARD] == pytest.approx(0.5) and m[REJECTED_REWARD] == pytest.approx(-0.5)
    assert m[REWARD_MARGIN] == pytest.approx(1.0) and m[REWARD_ACCURACY] == 1.0
    loss, m = dpo_loss(LOGPROB, REF, MASK, beta=0.5)  # the mean over both pairs
    assert loss.item() == pytest.approx((softplus(-1.0) + math.log(2)) / 2, abs=1e-6)
    assert m[DPO_LOSS] == pytest.approx(loss.item())
    assert m[REWARD_ACCURACY] == 0.5  # pair 1: equal rewards, not a win


def test_label_smoothing_mixes_in_the_flipped_label():
    loss, _ = dpo_loss(LOGPROB[:2], REF[:2], MASK[:2], beta=0.5, label_smoothing=0.1)
    assert loss.item() == pytest.approx(0.9 * softplus(-1.0) + 0.1 * softplus(1.0), abs=1e-6)


def test_dpo_gradient_moves_chosen_up_and_rejected_down():
    logprob = LOGPROB[:2].clone().requires_grad_(True)
    dpo_loss(logprob, REF[:2], MASK[:2], beta=0.5)[0].backward()
    g = 0.5 * torch.sigmoid(torch.tensor(-1.0)).item()  # beta * sigmoid(-beta z)
    expected = torch.tensor([[-g, -g], [g, 0.0]])  # the masked token gets none
    assert torch.allclose(logprob.grad, expected, atol=1e-6)


# ----------------------------------------------------------------------------- batching


def test_micro_batches_keep_pairs_whole():
    rows = list(range(8))  # 4 pairs
    fixed = pair_micro_batches(
        rows, [5] * 8, use_dynamic_bsz=False, max_token_len=0, micro_batch_size=3
    )
    assert fixed == [[0, 1], [2, 3], [4, 5], [6, 7]]  # 3 sequences: one whole pair
    fixed = pair_micro_batches(
        rows, [5] * 8, use_dynamic_bsz=False, max_token_len=0, micro_batch_size=4
    )
    assert fixed == [[0, 1, 2, 3], [4, 5, 6, 7]]
    lengths = [4, 6, 3, 3, 20, 2, 1, 1]
    dynamic = pair_micro_batches(
        rows, lengths, use_dynamic_bsz=True, max_token_len=24, micro_batch_size=1
    )
    # padded: pairs 0+1 -> 4 x 6 = 24 fit; pair 2 (20 long) alone; pair 3 alone after it
    assert dynamic == [[0, 1, 2, 3], [4, 5], [6, 7]]
    packed = pair_micro_batches(
        rows, lengths, use_dynamic_bsz=True, max_token_len=24, micro_batch_size=1, packed=True
    )
    assert packed == [[0, 1, 2, 3], [4, 5, 6, 7]]  # sums 16, then 22 + 2 = 24


def test_fit_pair_cuts_replies_then_the_shared_prompt():
    assert fit_pair([1, 2], [3], [4, 5], 10) == ([1, 2], [3], [4, 5])
    assert fit_pair([1, 2, 3], [4, 5, 6], [7], 5) == ([1, 2, 3], [4, 5], [7])
    assert fit_pair([1, 2, 3, 4], [5, 6], [7], 3) == ([3, 4], [5], [7])


# ----------------------------------------------------------------------------- config


def dpo_dict(**algorithm) -> dict:
    return {
        "mode": "train",
        "model": {"model_path": "/m"},
        "algorithm": {"algorithm_type": "dpo", **algorithm},
        "buffer": {"trainer_input": {"experience_buffer": {"path": "/pairs"}}},
    }


def test_dpo_preset_as_trinity():
    cfg = config_from_dict(dpo_dict())
    algo = cfg.algorithm
    assert (algo.policy_loss_fn, algo.advantage_fn, algo.kl_loss_fn) == ("dpo", None, "k2")
    assert cfg.buffer.trainer_input.experience_buffer.storage_type == "file"
    fns = build_loss_fns(algo)
    assert fns.advantage is None and fns.kl_loss is not None
    args = {"policy_loss_fn_args": {"beta": 0.2, "label_smoothing": 0.1}}
    build_loss_fns(config_from_dict(dpo_dict(**args)).algorithm)


@pytest.mark.parametrize(
    "args, message",
    [
        ({"beta": 0}, "beta: got 0, expected a number > 0"),
        ({"label_smoothing": 0.5}, r"label_smoothing: got 0.5, expected a number in \[0, 0.5\)"),
        ({"tau": 1}, "not an argument of policy_loss_fn 'dpo'"),
    ],
)
def test_bad_dpo_args_are_refused(args, message):
    with pytest.raises(ConfigError, match=message):
        build_loss_fns(config_from_dict(dpo_dict(policy_loss_fn_args=args)).algorithm)


def test_dpo_needs_mode_train_and_a_dataset():
    both = dpo_dict()
    both["mode"] = "both"
    both["buffer"] = {"explorer_input": {"taskset": {"path": "/t"}}}
    with pytest.raises(ConfigError, match="'dpo' trains on a dataset of preference pairs"):
        config_from_dict(both)


# ----------------------------------------------------------------------------- end to end


@pytest.mark.integration
def test_dpo_raises_the_margin_alike_on_one_and_two_ranks(tmp_path, tiny_model_dir):
    from tests.helpers.trainer_runs import PY, metrics, run_ok, torchrun_cmd, write_config

    rows = [
        {"prompt": f"What is {a} + {a}?", "chosen": f"{2 * a}", "rejected": f"{2 * a + 1}!"}
        for a in range(4)
    ]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = write_config(
        tmp_path,
        "dpo",
        tiny_model_dir,
        mode="train",
        algorithm={
            "algorithm_type": "dpo",
            "kl_loss_fn": "k1",
            "kl_loss_fn_args": {"kl_coef": 0.01},
            "policy_loss_fn_args": {"beta": 0.5},
            "optimizer": {"lr": 3e-3},
        },
        buffer={
            "train_batch_size": 4,
            "total_steps": 5,
            "trainer_input": {
                "experience_buffer": {
                    "name": "pairs",
                    "path": str(data),
                    "storage_type": "file",
                    "format": {"prompt_type": "plaintext"},
                }
            },
        },
        trainer={
            "zero_stage": 2,
            "precision": "fp32",
            "save_interval": 0,
            "use_dynamic_bsz": False,
            "micro_batch_size_per_gpu": 4,  # two pairs per micro-batch: two micro-batches
        },
    )
    run_ok([PY, "-m", "rft.trainer", "--config", str(config)], tmp_path / "dpo.log")
    run_dir = tmp_path / "t" / "dpo"
    got = metrics(run_dir)
    # step 1's forward precedes its update: the policy is its reference (z = 0)
    assert got[1][DPO_LOSS] == pytest.approx(math.log(2), abs=1e-4)
    assert got[1][REWARD_MARGIN] == pytest.approx(0.0, abs=1e-4)
    assert got[5][DPO_LOSS] < got[1][DPO_LOSS] - 0.05
    assert got[5][REWARD_MARGIN] > got[2][REWARD_MARGIN] > 0
    assert got[5]["batch_pairs"] == 4 and got[5]["batch_experiences"] == 8
    assert got[5]["micro_batches"] == 2 and got[5]["updates"] == 1
    assert "kl_loss" in got[5]
    assert json.loads((run_dir / "trainer_meta.json").read_text())["buffer_cursor"] == {"row": 20}
    # two ranks, a pair each way: the same losses (the loss shares add up to the batch's)
    two = write_config(tmp_path, "dpo2", tiny_model_dir, **yaml_sections(config))
    run_ok(torchrun_cmd(two), tmp_path / "dpo2.log")
    got2 = metrics(tmp_path / "t" / "dpo2")
    for step in (2, 5):
        for key in (DPO_LOSS, REWARD_MARGIN, "kl_loss"):
            assert got2[step][key] == pytest.approx(got[step][key], rel=1e-3, abs=1e-5), key


def yaml_sections(config) -> dict:
    import yaml

    sections = yaml.safe_load(config.read_text())
    return {k: v for k, v in sections.items() if k not in ("name", "checkpoint_root_dir")}
