"""Padding-free micro-batches (``trainer.padding_free``): sequences packed into one row with
position ids that restart per sequence score, lose and differentiate exactly as the padded
micro-batch of the same rows."""

from __future__ import annotations

import pytest
import torch

from rft.buffer.experience import Experience
from rft.trainer.batching import collate, plan_micro_batches, rows_from_experiences


def ragged_rows():
    """Three rows of different prompt and response lengths (padding inside a micro-batch)."""
    exps = [
        Experience(
            "t",
            f"g{i}",
            list(range(1, 3 + 2 * i)),
            [7 + i] * (5 - 2 * i + 3 * (i == 2)),
            logprobs=[-1.0] * (5 - 2 * i + 3 * (i == 2)),
            reward=float(i),
            temperature=0.7 + 0.2 * i,
        )
        for i in range(3)
    ]
    return rows_from_experiences(exps)


def test_the_token_budget_counts_packed_tokens_not_padded_ones():
    lengths = [10, 4, 4, 4]
    padded = plan_micro_batches(
        range(4), lengths, use_dynamic_bsz=True, max_token_len=20, micro_batch_size=1
    )
    packed = plan_micro_batches(
        range(4), lengths, use_dynamic_bsz=True, max_token_len=20, micro_batch_size=1, packed=True
    )
    assert padded == [[0, 1], [2, 3]]  # 2 x 10 = 20, a third row would pad to 30
    assert packed == [[0, 1, 2], [3]]  # 10 + 4 + 4 = 18, the next 4 would make 22


def test_a_packed_micro_batch_is_the_rows_back_to_back_with_restarting_positions():
    rows = ragged_rows()
    zeros = torch.zeros_like(rows.response_mask)
    padded = collate(rows, [0, 1, 2], zeros, zeros)
    packed = collate(rows, [0, 1, 2], zeros, zeros, packed=True)
    lengths = [len(ids) for ids in rows.input_ids]
    assert packed.input_ids.shape == (1, sum(lengths)) and packed.num_tokens == padded.num_tokens
    assert packed.input_ids[0].tolist() == [t for ids in rows.input_ids for t in ids.tolist()]
    assert packed.position_ids[0].tolist() == [p for n in lengths for p in range(n)]
    assert torch.equal(packed.response_ids, padded.response_ids)
    assert torch.equal(packed.response_mask, padded.response_mask)
    flat = packed.input_ids[0]
    mask = packed.response_mask > 0
    # each counted token is the one after the position that predicts it, in the packed row
    assert torch.equal(flat[packed.logit_positions[mask] + 1], packed.response_ids[mask])
    assert padded.model_inputs().keys() == {"input_ids", "attention_mask"}
    assert packed.model_inputs().keys() == {
        "input_ids",
        "position_ids",
    }  # no mask: position ids separate


@pytest.mark.parametrize("via_logits", [False, True], ids=["hidden", "logits"])
def test_packed_log_probs_losses_and_gradients_equal_the_padded(tiny_model_dir, via_logits):
    from transformers import AutoModelForCausalLM

    from rft.algo.losses import ppo_loss
    from rft.trainer import engine

    rows = ragged_rows()
    adv = torch.tensor([-1.0, 0.5, 2.0]).unsqueeze(-1) * rows.response_mask
    old = torch.full_like(rows.response_mask, -3.0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    if via_logits:  # the model's own forward and logits (model types not listed)
        model.config.model_type = "not-listed"
    assert (engine.plain_head(model) is None) == via_logits

    def run(packed: bool):
        model.zero_grad()
        micro = collate(rows, [0, 1, 2], adv, old, packed=packed)
        lp, ent = engine.forward_logprobs(model, micro, with_entropy=True)
        loss, _ = ppo_loss(lp, micro.old_logprobs, micro.advantages, micro.response_mask)
        (loss - 0.01 * ent.sum()).backward()
        return (
            lp.detach(),
            ent.detach(),
            loss.detach(),
            {n: p.grad.clone() for n, p in model.named_parameters()},
        )

    lp_pad, ent_pad, loss_pad, grads_pad = run(packed=False)
    lp_pack, ent_pack, loss_pack, grads_pack = run(packed=True)
    torch.testing.assert_close(lp_pack, lp_pad, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent_pack, ent_pad, rtol=0, atol=1e-5)
    torch.testing.assert_close(loss_pack, loss_pad, rtol=0, atol=1e-5)
    for name, grad in grads_pad.items():
        torch.testing.assert_close(grads_pack[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_packed_critic_values_equal_the_padded(tiny_model_dir):
    from transformers import AutoModelForTokenClassification

    from rft.trainer import engine

    torch.manual_seed(0)
    critic = AutoModelForTokenClassification.from_pretrained(
        tiny_model_dir, dtype=torch.float32, num_labels=1
    )
    rows = ragged_rows()
    zeros = torch.zeros_like(rows.response_mask)
    with torch.no_grad():
        padded = engine.forward_values(critic.eval(), collate(rows, [0, 1, 2], zeros, zeros))
        packed = engine.forward_values(critic, collate(rows, [0, 1, 2], zeros, zeros, packed=True))
    mask = rows.response_mask > 0
    torch.testing.assert_close(packed[mask], padded[mask], rtol=0, atol=1e-5)


def test_use_remove_padding_packs_and_the_attention_stays_default_on_cpu(tmp_path):
    from rft.config.load import config_from_dict
    from rft.trainer.engine import attention_implementation

    def trainer(**arr_model):
        cfg = config_from_dict(
            {
                "mode": "train",
                "checkpoint_root_dir": str(tmp_path),
                "model": {"model_path": str(tmp_path)},
                "trainer": {"trainer_config": {"actor_rollout_ref": {"model": arr_model}}},
            }
        )
        return cfg

    assert not trainer().trainer.padding_free
    cfg = trainer(use_remove_padding=True)
    assert cfg.trainer.padding_free
    assert not trainer(use_remove_padding=False).trainer.padding_free
    assert attention_implementation(cfg) is None  # no GPU: transformers' default (SDPA)


def test_a_float32_teacher_gets_no_flash_attention_in_a_bf16_packed_run(tmp_path, monkeypatch):
    from rft.config.load import config_from_dict
    from rft.trainer import engine
    from rft.trainer.attention import FLASH_ATTENTION_2, FLEX_ATTENTION

    monkeypatch.setattr(engine.torch.cuda, "is_available", lambda: True)  # a GPU with flash_attn
    monkeypatch.setattr(engine, "flash_attn_installed", lambda: True)
    cfg = config_from_dict(
        {
            "mode": "train",
            "checkpoint_root_dir": str(tmp_path),
            "model": {"model_path": str(tmp_path)},
            "trainer": {"padding_free": True, "precision": "bf16"},
        }
    )
    assert engine.attention_implementation(cfg) == FLASH_ATTENTION_2  # the actor trains in bf16
    assert engine.attention_implementation(cfg, torch.bfloat16) == FLASH_ATTENTION_2
    # FlashAttention-2 takes no float32: a teacher with dtype float32 attends with flex_attention
    assert engine.attention_implementation(cfg, torch.float32) == FLEX_ATTENTION


def test_packed_attention_prefers_flash_attention_then_flex_on_gpus():
    from rft.trainer.attention import FLASH_ATTENTION_2, FLEX_ATTENTION, packed_attention

    assert packed_attention(True, True, "bf16") == FLASH_ATTENTION_2
    assert packed_attention(True, True, "fp32") == FLEX_ATTENTION  # FA2 takes no float32
    assert packed_attention(True, False, "bf16") == FLEX_ATTENTION
    assert packed_attention(False, True, "bf16") is None  # CPU: flex_attention has no backward


@pytest.mark.parametrize("length_multiple", [1, 64])
def test_packed_log_probs_through_flex_attention_equal_the_padded(tiny_model_dir, length_multiple):
    """Issue 35: a packed micro-batch through flex_attention (a block mask built from the
    restarting position ids, no dense mask) scores as the padded micro-batch through SDPA, also
    with the packed row padded to a multiple of 64 (as compiled layers see it). Forward only:
    flex_attention has no backward on CPU."""
    from transformers import AutoModelForCausalLM

    from rft.trainer import engine

    rows = ragged_rows()
    zeros = torch.zeros_like(rows.response_mask)
    padded = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    flex = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation="flex_attention"
    )
    assert flex.config._attn_implementation == "flex_attention"
    packed_micro = collate(rows, [0, 1, 2], zeros, zeros, packed=True)
    if length_multiple > 1:  # the padding of compiled models: one more sequence, never read
        engine._COMPILED_MODELS.add(flex)
        inputs = packed_micro.model_inputs(length_multiple)
        assert inputs["input_ids"].shape[1] == 64 and inputs["position_ids"][0, -1] > 0
    try:
        with torch.no_grad():
            lp_pad, ent_pad = engine.forward_logprobs(
                padded, collate(rows, [0, 1, 2], zeros, zeros), with_entropy=True
            )
            lp_flex, ent_flex = engine.forward_logprobs(flex, packed_micro, with_entropy=True)
    finally:
        engine._COMPILED_MODELS.discard(flex)
    assert (lp_pad[rows.response_mask > 0] < 0).all()
    torch.testing.assert_close(lp_flex, lp_pad, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent_flex, ent_pad, rtol=0, atol=1e-5)
