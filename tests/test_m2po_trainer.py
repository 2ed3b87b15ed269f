"""M2PO on real DeepSpeed ranks (``integration``: 2 gloo ranks under torchrun, a tiny Llama): the
mask of each mini-batch is decided over every rank's tokens, so two ranks give the one-rank step.
Rollout log-probs are the model's own plus noise (std 0.3), so the log ratios are of the size
M2PO's threshold (0.04) acts on."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rft.algo.m2po import M2_AFTER, M2_BEFORE, MASKED_FRACTION, TRUST_REGION_FRACTION
from rft.buffer.experience import Experience
from tests.helpers.trainer_runs import make_batch, metrics, run_ok, torchrun_cmd, write_config

pytestmark = pytest.mark.integration


def noisy_rollouts(model_dir: Path, std: float) -> list[Experience]:
    """``make_batch(1)`` (4 groups of 2) with log-probs the model's (temperature 1) + noise."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    exps = make_batch(1)
    for exp in exps:
        ids = torch.tensor([exp.prompt_ids + exp.response_ids])  # [1, T]
        with torch.no_grad():
            logits = model(ids).logits[0, len(exp.prompt_ids) - 1 : -1]  # [R, V]
        own = torch.log_softmax(logits.float(), -1).gather(
            -1, torch.tensor(exp.response_ids).unsqueeze(-1)
        )[:, 0]  # [R]
        exp.logprobs = (own + std * torch.randn(len(own), generator=gen)).tolist()
        exp.temperature = 1.0
    return exps


def test_two_ranks_mask_the_mini_batch_as_one_rank_does(tmp_path, tiny_model_dir):
    from rft.buffer.segments import SegmentWriter

    exps = noisy_rollouts(tiny_model_dir, 0.3)
    extra = {
        "algorithm": {
            "algorithm_type": "m2po",
            "repeat_times": 2,
            "optimizer": {"lr": 1e-3},
        },
        "buffer": {
            "batch_size": 4,
            "train_batch_size": 4,  # two updates: the second mask is at updated weights
            "total_steps": 1,
            "explorer_input": {"taskset": {"path": "unused-by-the-trainer"}},
        },
    }
    rows = {}
    for ranks in (2, 1):
        config = write_config(tmp_path, f"ranks{ranks}", tiny_model_dir, **extra)
        SegmentWriter(tmp_path / "t" / f"ranks{ranks}" / "buffer", "explorer-0").write(exps, seq=1)
        run_ok(torchrun_cmd(config, ranks=ranks), tmp_path / f"ranks{ranks}.log")
        rows[ranks] = metrics(tmp_path / "t" / f"ranks{ranks}")[1]
    one = rows[1]
    assert one["updates"] == 2
    assert 0 < one[MASKED_FRACTION] < one[TRUST_REGION_FRACTION] < 1
    assert one[M2_AFTER] <= 0.04 < one[M2_BEFORE]
    keys = (M2_BEFORE, M2_AFTER, MASKED_FRACTION, TRUST_REGION_FRACTION, "pg_loss", "grad_norm")
    for key in keys:
        assert rows[2][key] == pytest.approx(one[key], rel=1e-4, abs=1e-7), key
