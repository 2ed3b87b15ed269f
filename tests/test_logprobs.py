"""Token log-probs and entropies in float32 chunks (rft.algo.logprobs) and the trainer's
forward that uses them (rft.trainer.engine.forward_logprobs): values and gradients equal a
naive full log-softmax, and no float32 ``[tokens, vocab]`` tensor is kept for the backward."""

from __future__ import annotations

import pytest
import torch

from rft.algo.logprobs import logprobs_from_hidden, logprobs_from_logits

N, H, V = 23, 8, 41


def naive(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temps: torch.Tensor):
    """Full log-softmax of ``hidden @ weight.T / T`` in float64: log-probs and entropies."""
    logsm = torch.log_softmax((hidden @ weight.T).double() / temps.double().unsqueeze(-1), -1)
    return logsm.gather(-1, labels.unsqueeze(-1)).squeeze(-1), -(logsm.exp() * logsm).sum(-1)


def inputs(dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(N, H, generator=g).to(dtype).requires_grad_()
    weight = torch.randn(V, H, generator=g).to(dtype).requires_grad_()
    labels = torch.randint(0, V, (N,), generator=g)
    temps = torch.rand(N, generator=g) + 0.5  # each token at its own temperature
    return hidden, weight, labels, temps


@pytest.mark.parametrize("chunk_elems", [1, 5 * V, 1 << 20], ids=["row", "5rows", "whole"])
@pytest.mark.parametrize("source", ["hidden", "logits"])
def test_values_and_gradients_equal_the_full_log_softmax(source, chunk_elems):
    hidden, weight, labels, temps = inputs()
    g = torch.Generator().manual_seed(1)
    w_lp, w_ent = torch.randn(N, generator=g), torch.randn(N, generator=g)  # upstream gradients
    lp, ent = naive(hidden, weight, labels, temps)
    want = torch.autograd.grad((lp * w_lp + ent * w_ent).sum(), (hidden, weight))
    if source == "hidden":
        got_lp, got_ent = logprobs_from_hidden(
            hidden,
            weight,
            labels,
            temperature=temps,
            with_entropy=True,
            max_chunk_elems=chunk_elems,
        )
    else:
        got_lp, got_ent = logprobs_from_logits(
            hidden @ weight.T,
            labels,
            temperature=temps,
            with_entropy=True,
            max_chunk_elems=chunk_elems,
        )
    assert got_lp.dtype == got_ent.dtype == torch.float32
    torch.testing.assert_close(got_lp.double(), lp.detach(), rtol=0, atol=1e-5)
    torch.testing.assert_close(got_ent.double(), ent.detach(), rtol=0, atol=1e-5)
    got = torch.autograd.grad((got_lp * w_lp + got_ent * w_ent).sum(), (hidden, weight))
    for g_got, g_want in zip(got, want):
        torch.testing.assert_close(g_got.double(), g_want.double(), rtol=1e-5, atol=1e-5)


def test_log_probs_alone_take_no_entropy_gradient_and_a_number_temperature():
    hidden, weight, labels, _ = inputs()
    lp, ent = logprobs_from_hidden(hidden, weight, labels, temperature=0.7, max_chunk_elems=3 * V)
    assert ent is None
    want, _ = naive(hidden, weight, labels, torch.full((N,), 0.7))
    torch.testing.assert_close(lp.double(), want.detach(), rtol=0, atol=1e-5)
    (g_got,) = torch.autograd.grad(lp.sum(), hidden)
    (g_want,) = torch.autograd.grad(want.sum(), hidden)
    torch.testing.assert_close(g_got.double(), g_want.double(), rtol=1e-5, atol=1e-5)


def test_a_frozen_head_gets_no_gradient_and_empty_input_gives_empty_output():
    hidden, weight, labels, temps = inputs()
    frozen = weight.detach()
    lp, _ = logprobs_from_hidden(hidden, frozen, labels, temperature=temps)
    lp.sum().backward()
    assert hidden.grad is not None and frozen.grad is None
    empty, ent = logprobs_from_hidden(
        hidden[:0], weight, labels[:0], temperature=temps[:0], with_entropy=True
    )
    assert empty.shape == ent.shape == (0,)


def saved_float32_shapes(fn) -> list[tuple[int, ...]]:
    """Shapes of the float32 tensors autograd keeps for the backward while ``fn`` runs."""
    shapes: list[tuple[int, ...]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.dtype == torch.float32:
            shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return shapes


def test_no_float32_logits_are_kept_for_the_backward():
    """bf16 logits: what is saved is the bf16 logits and per-token vectors, never ``[N, V]``
    in float32 (a naive ``.float().log_softmax()`` keeps it); from hidden states no ``[N, V]``
    tensor at all."""
    hidden, weight, labels, temps = inputs(torch.bfloat16)
    logits = (hidden @ weight.T).detach().requires_grad_()
    naive_saved = saved_float32_shapes(lambda: torch.log_softmax(logits.float(), -1))
    assert (N, V) in naive_saved  # the test can see the copy it guards against
    saved = saved_float32_shapes(
        lambda: logprobs_from_logits(
            logits, labels, temperature=temps, with_entropy=True, max_chunk_elems=V
        )
    )
    assert all(shape[-1] != V for shape in saved), saved
    saved = saved_float32_shapes(
        lambda: logprobs_from_hidden(
            hidden, weight, labels, temperature=temps, with_entropy=True, max_chunk_elems=V
        )
    )
    assert all(shape[-1] != V for shape in saved), saved


def test_forward_from_hidden_states_equals_the_models_logits(tiny_model_dir):
    """A Llama's log-probs and entropies (and their gradients in every parameter, the tied
    head included) taken from the decoder's hidden states equal those from its logits."""
    from transformers import AutoModelForCausalLM

    from rft.buffer.experience import Experience
    from rft.trainer import engine
    from rft.trainer.batching import collate, rows_from_experiences

    torch.manual_seed(0)
    exps = [
        Experience(
            "t",
            f"g{i}",
            [1, 2, 3 + i],
            [5 + i] * (2 + 3 * i),
            logprobs=[-1.0] * (2 + 3 * i),
            temperature=0.6 + 0.5 * i,
        )
        for i in range(3)
    ]  # ragged rows, padded
    rows = rows_from_experiences(exps)
    micro = collate(rows, [0, 1, 2], torch.zeros_like(rows.response_mask), rows.rollout_logprobs)
    micro.response_mask[2, 1] = 0  # a response token the loss does not count: log-prob 0
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert engine.plain_head(model) is not None

    def scored(via_logits: bool):
        model.zero_grad()
        if via_logits:  # an unlisted model type takes the model's own forward and its logits
            model.config.model_type, kept = "not-listed", model.config.model_type
            assert engine.plain_head(model) is None
        try:
            lp, ent = engine.forward_logprobs(model, micro, with_entropy=True)
        finally:
            if via_logits:
                model.config.model_type = kept
        (lp.sum() + 0.3 * ent.sum()).backward()
        return lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    lp_h, ent_h, grads_h = scored(via_logits=False)
    lp_l, ent_l, grads_l = scored(via_logits=True)
    mask = micro.response_mask > 0
    assert (lp_h[~mask] == 0).all() and (lp_h[mask] < 0).all()
    torch.testing.assert_close(lp_h, lp_l, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent_h, ent_l, rtol=0, atol=1e-5)
    assert set(grads_h) == set(grads_l)
    for name in grads_h:
        torch.testing.assert_close(grads_h[name], grads_l[name], rtol=1e-4, atol=1e-6, msg=name)


ENGINE_SCRIPT = """
import sys, torch, deepspeed
from transformers import AutoModelForCausalLM
from rft.buffer.experience import Experience
from rft.config.load import config_from_dict
from rft.trainer import engine
from rft.trainer.batching import collate, rows_from_experiences

stage = int(sys.argv[3])
settings = engine.zero3_gather_settings  # as on 2 ranks: large tensors partitioned, gathered
engine.zero3_gather_settings = lambda hidden, world, offload: settings(hidden, 2, offload)
plain = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)  # before ZeRO-3's
cfg = config_from_dict({"mode": "train", "checkpoint_root_dir": sys.argv[2], "model": {"model_path": sys.argv[1]},
                        "trainer": {"zero_stage": stage, "precision": "fp32", "gradient_checkpointing_every": 2}})
actor = engine.build_actor(cfg, engine.init_distributed(), 4)
head = engine.plain_head(actor.engine)
assert head is not None  # the hidden-state path, under ZeRO-3 too
print("partitioned head", head.weight.numel() == 0)
print("checkpointed", [layer.gradient_checkpointing for layer in actor.module.model.layers])
calls = []
prologue = actor.engine._backward_prologue
actor.engine._backward_prologue = lambda *a, **k: (calls.append(1), prologue(*a, **k))[1]
exps = [Experience("t", "g", [1, 2, 3], [5, 6, 7], logprobs=[-1.0] * 3),
        Experience("t", "g", [4, 2], [9, 8, 7, 6, 5], logprobs=[-1.0] * 5)]
rows = rows_from_experiences(exps)
micro = collate(rows, [0, 1], torch.zeros_like(rows.response_mask), rows.rollout_logprobs)
want, _ = engine.forward_logprobs(plain, micro, with_entropy=False)
with deepspeed.zero.GatheredParameters([head.weight]):
    head_before = head.weight.detach().clone()
for step in range(2):
    logprob, entropy = engine.forward_logprobs(actor.engine, micro, with_entropy=True)
    if step == 0:
        print("as the plain model", torch.allclose(logprob, want, atol=1e-5))
    engine.backward(actor, logprob.sum() + 0.1 * entropy.sum())
    engine.optimizer_step(actor)
with deepspeed.zero.GatheredParameters([head.weight]):
    print("head trained", not torch.equal(head.weight.detach(), head_before))
print("prologues", len(calls))
engine.teardown(0)
"""


@pytest.mark.integration
@pytest.mark.parametrize("zero_stage", [2, 3])
def test_the_hidden_state_path_goes_through_the_engines_forward(
    tiny_model_dir, tmp_path, zero_stage
):
    """DeepSpeed sets up each backward in its engine's forward (ZeRO's gradient-accumulation
    boundary among it): log-probs from hidden states must come from that forward, one
    backward prologue per micro-batch. Under ZeRO-3 (issue 35) the head stays partitioned and
    the log-probs are computed inside its forward, where ZeRO gathers it: they equal the plain
    model's and the head trains. The engine's model checkpoints every second layer with
    ``trainer.gradient_checkpointing_every: 2``."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", ENGINE_SCRIPT, str(tiny_model_dir), str(tmp_path), str(zero_stage)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    logs = out.stdout[-2000:] + out.stderr[-4000:]
    assert "prologues 2" in out.stdout, logs
    assert "checkpointed [True, False]" in out.stdout  # trainer.gradient_checkpointing_every: 2
    assert "as the plain model True" in out.stdout and "head trained True" in out.stdout, logs
    assert f"partitioned head {zero_stage == 3}" in out.stdout, logs


def test_bf16_head_gradient_is_summed_over_chunks_in_float32():
    """Many chunks of a bfloat16 head: the weight's gradient is as close to the float64 one as
    a single-chunk computation's (the chunks' sum is not rounded to bf16 at each addition)."""
    hidden, weight, labels, temps = inputs(torch.bfloat16)
    lp, _ = naive(hidden.double(), weight.double(), labels, temps)
    (want,) = torch.autograd.grad(lp.sum(), weight)

    def error(chunk_elems: int) -> float:
        got, _ = logprobs_from_hidden(
            hidden, weight, labels, temperature=temps, max_chunk_elems=chunk_elems
        )
        (grad,) = torch.autograd.grad(got.sum(), weight)
        assert grad.dtype == torch.bfloat16
        return float((grad.double() - want.double()).abs().max())

    assert error(V) <= 1.25 * error(1 << 20)  # one token per chunk vs all in one (bf16 sums: 2x)
