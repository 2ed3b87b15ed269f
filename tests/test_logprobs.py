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
        got_lp, got_ent = logprobs_from_hidden(hidden, weight, labels, temperature=temps,
                                               with_entropy=True, max_chunk_elems=chunk_elems)
    else:
        got_lp, got_ent = logprobs_from_logits(hidden @ weight.T, labels, temperature=temps,
                                               with_entropy=True, max_chunk_elems=chunk_elems)
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
    empty, ent = logprobs_from_hidden(hidden[:0], weight, labels[:0], temperature=temps[:0], with_entropy=True)
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
    saved = saved_float32_shapes(lambda: logprobs_from_logits(logits, labels, temperature=temps,
                                                              with_entropy=True, max_chunk_elems=V))
    assert all(shape[-1] != V for shape in saved), saved
    saved = saved_float32_shapes(lambda: logprobs_from_hidden(hidden, weight, labels, temperature=temps,
                                                              with_entropy=True, max_chunk_elems=V))
    assert all(shape[-1] != V for shape in saved), saved


def test_forward_from_hidden_states_equals_the_models_logits(tiny_model_dir):
    """A Llama's log-probs and entropies (and their gradients in every parameter, the tied
    head included) taken from the decoder's hidden states equal those from its logits."""
    from transformers import AutoModelForCausalLM

    from rft.buffer.experience import Experience
    from rft.trainer import engine as dse
    from rft.trainer.batching import collate, rows_from_experiences

    torch.manual_seed(0)
    exps = [Experience("t", f"g{i}", [1, 2, 3 + i], [5 + i] * (2 + 3 * i), logprobs=[-1.0] * (2 + 3 * i),
                       temperature=0.6 + 0.5 * i) for i in range(3)]  # ragged rows, padded
    rows = rows_from_experiences(exps)
    micro = collate(rows, [0, 1, 2], torch.zeros_like(rows.response_mask), rows.rollout_logprobs)
    micro.response_mask[2, 1] = 0  # a response token the loss does not count: log-prob 0
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert dse.plain_head(model) is not None

    def scored(via_logits: bool):
        model.zero_grad()
        if via_logits:  # an unlisted model type takes the model's own forward and its logits
            model.config.model_type, kept = "not-listed", model.config.model_type
            assert dse.plain_head(model) is None
        try:
            lp, ent = dse.forward_logprobs(model, micro, with_entropy=True)
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
