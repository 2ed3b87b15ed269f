"""Trinity's MIX / CHORD ``policy_loss_fn_args``: the SFT part's aggregation acts (checked on
hand-computed values), the veRL batch bookkeeping has no effect and is checked against rft's
own values, and neither gets a "did you mean"."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from rft.algo.losses import mix_chord_loss
from rft.config.gpus import split_gpus
from rft.config.load import config_from_dict, read_raw
from rft.errors import ConfigError
from rft.trainer.algorithm import build_loss_fns, expert_loss_args

REPO = Path(__file__).resolve().parent.parent
CHORD = REPO / "tests" / "fixtures" / "trinity_examples" / "mix_chord.yaml"

# Two expert rows: NLL tokens [1, 1, 1] and [4] (the second row's last position is padding).
LOGPROB = torch.tensor([[-1.0, -1.0, -1.0], [-4.0, -9.0, -9.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
EXPERT = torch.tensor([True, True])
TOKEN_MEAN = (1 + 1 + 1 + 4) / 4  # 1.75: every expert token alike
SEQ_MEAN = (1 + 4) / 2  # 2.5: each sequence's mean, then the mean of those


def sft_only(**args) -> float:
    """mix_chord with mu = 1 and plain NLL: the SFT part alone."""
    zeros = torch.zeros_like(LOGPROB)
    loss, _ = mix_chord_loss(
        LOGPROB, zeros, zeros, MASK, expert_mask=EXPERT, mu_peak=1.0, mu_valley=1.0,
        enable_phi_function=False, **args,
    )  # fmt: skip
    return loss.item()


def test_sft_loss_agg_mode_aggregates_the_sft_part():
    assert sft_only() == pytest.approx(TOKEN_MEAN)  # loss_agg_mode token-mean
    assert sft_only(sft_loss_agg_mode="seq-mean-token-mean") == pytest.approx(SEQ_MEAN)
    assert sft_only(loss_agg_mode="seq-mean-token-mean") == pytest.approx(SEQ_MEAN)
    assert sft_only(
        loss_agg_mode="seq-mean-token-mean", sft_loss_agg_mode="token-mean"
    ) == pytest.approx(TOKEN_MEAN)


@pytest.mark.parametrize("token_level,expected", [(True, TOKEN_MEAN), (False, SEQ_MEAN)])
def test_use_token_level_loss_in_sft_is_trinitys_sft_aggregation(token_level, expected):
    args = {
        "use_token_level_loss_in_sft": token_level,
        "enable_phi_function": False,
        "mu_peak": 1.0,
        "mu_valley": 1.0,
        "ppo_mini_batch_size": 320,  # bookkeeping: dropped before the loss is built
        "ngpus_trainer": 4,
    }
    assert "ngpus_trainer" not in expert_loss_args("mix_chord", args)
    cfg = config_from_dict(
        {"model": {"model_path": "/m"}, "buffer": {"explorer_input": {"taskset": {"path": "/t"}}}}
    )
    cfg.algorithm.policy_loss_fn, cfg.algorithm.policy_loss_fn_args = "mix_chord", args
    fns = build_loss_fns(cfg.algorithm)
    zeros = torch.zeros_like(LOGPROB)
    loss, _ = fns.policy(LOGPROB, zeros, zeros, MASK, expert_mask=EXPERT)
    assert loss.item() == pytest.approx(expected)


def test_both_spellings_of_the_sft_aggregation_must_agree():
    args = {"use_token_level_loss_in_sft": False, "sft_loss_agg_mode": "token-mean"}
    with pytest.raises(ConfigError, match="use_token_level_loss_in_sft=False .*contradicts"):
        expert_loss_args("mix_chord", args)


def test_bookkeeping_args_belong_to_the_mix_losses_only():
    """Given to another loss they are what they always were: not its arguments."""
    cfg = config_from_dict(
        {"model": {"model_path": "/m"}, "buffer": {"explorer_input": {"taskset": {"path": "/t"}}}}
    )
    cfg.algorithm.policy_loss_fn_args = {"ngpus_trainer": 4}
    with pytest.raises(ConfigError, match="ngpus_trainer: not an argument of policy_loss_fn"):
        build_loss_fns(cfg.algorithm)


@pytest.fixture
def chord(monkeypatch, tmp_path) -> dict:
    """Trinity's examples/mix_chord config (its numbers agree with rft's), paths set."""
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path))
    raw = read_raw(CHORD, [f"checkpoint_root_dir={tmp_path}"])
    raw["buffer"]["explorer_input"]["taskset"].pop("workflow_args")  # with_think: not here
    arr = raw["trainer"]["trainer_config"]["actor_rollout_ref"]
    for part in ("actor", "ref"):  # sequence parallelism is refused (test_config)
        arr[part]["ulysses_sequence_parallel_size"] = 1
    return raw


def test_the_examples_bookkeeping_agrees_with_rfts_values(chord, caplog):
    with caplog.at_level(logging.WARNING):
        cfg = config_from_dict(chord)
    assert "has no effect: rft weighs" not in caplog.text  # 320 = 256 rollouts + 64 expert
    assert split_gpus(cfg).trainer == 4  # ngpus_trainer
    build_loss_fns(cfg.algorithm)


def test_stale_counts_are_named_with_rfts_value(chord, caplog):
    chord["buffer"]["train_batch_size"] = 160  # halved, the example's counts left as they were
    with caplog.at_level(logging.WARNING):
        config_from_dict(chord)
    assert "ppo_mini_batch_size=320 has no effect" in caplog.text
    assert "buffer.train_batch_size=160" in caplog.text
    assert "train_batch_size_expert=64 has no effect" in caplog.text  # rft: 32


def test_a_contradicting_micro_batching_mode_is_an_error(chord):
    chord["algorithm"]["policy_loss_fn_args"]["use_dynamic_bsz"] = False
    with pytest.raises(ConfigError, match="use_dynamic_bsz=False contradicts trainer.use_dyn"):
        config_from_dict(chord)
