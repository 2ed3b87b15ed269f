"""Per-layer trainer options: ``trainer.compile_layers`` (decoder layers compiled in place train
as the eager model does, under the same parameter names; ZeRO-3 is refused before a job
starts) and ``trainer.gradient_checkpointing_every`` (which layers recompute)."""

from __future__ import annotations

import shutil

import pytest
import torch


@pytest.mark.skipif(shutil.which("g++") is None, reason="torch.compile on CPU needs a C++ compiler")
def test_compiled_layers_give_the_eager_log_probs_and_gradients(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from rft.buffer.experience import Experience
    from rft.trainer import engine
    from rft.trainer.batching import collate, rows_from_experiences

    exps = [
        Experience(
            "t", f"g{i}", [1, 2, 3 + i], [5 + i] * (3 + 2 * i), logprobs=[-1.0] * (3 + 2 * i)
        )
        for i in range(2)
    ]
    rows = rows_from_experiences(exps)
    zeros = torch.zeros_like(rows.response_mask)
    micro = collate(rows, [0, 1], zeros, zeros, packed=True)

    def scored(model):
        lp, _ = engine.forward_logprobs(model, micro, with_entropy=False)
        lp.sum().backward()
        return lp.detach(), {n: p.grad for n, p in model.named_parameters()}

    eager = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    compiled = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    names = list(compiled.state_dict())
    assert engine.compile_layers(compiled) == compiled.config.num_hidden_layers
    assert list(compiled.state_dict()) == names  # checkpoints and publishing see the same names
    lp_eager, grads_eager = scored(eager)
    lp_compiled, grads_compiled = scored(compiled)
    torch.testing.assert_close(lp_compiled, lp_eager, rtol=0, atol=1e-5)
    for name, grad in grads_eager.items():
        torch.testing.assert_close(grads_compiled[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def ragged_micro(response_lens: list[int], packed: bool = False):
    """A micro-batch of rows with 3-token prompts and these response lengths."""
    from rft.buffer.experience import Experience
    from rft.trainer.batching import collate, rows_from_experiences

    exps = [
        Experience("t", f"g{i}", [1, 2, 3 + i], [5 + i] * n, logprobs=[-1.0] * n)
        for i, n in enumerate(response_lens)
    ]
    rows = rows_from_experiences(exps)
    zeros = torch.zeros_like(rows.response_mask)
    return collate(rows, list(range(len(exps))), zeros, zeros, packed=packed)


@pytest.mark.skipif(shutil.which("g++") is None, reason="torch.compile on CPU needs a C++ compiler")
def test_compiled_layers_neither_break_the_graph_nor_recompile_for_new_lengths(tiny_model_dir):
    """Issue 35: after the first micro-batch, micro-batches of other lengths and row counts
    (sequence buckets 64 to 192) run the graphs already compiled, and no layer's graph breaks
    (the log-prob path asks for no hidden-state capture). The counters catch the old way:
    ``output_hidden_states`` breaks the graph in every compiled layer."""
    from torch._dynamo.utils import counters
    from transformers import AutoModelForCausalLM

    from rft.trainer import engine

    torch._dynamo.reset()
    counters.clear()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    engine.compile_layers(model)

    def train_on(response_lens: list[int]) -> None:
        micro = ragged_micro(response_lens)
        lp, ent = engine.forward_logprobs(model, micro, with_entropy=True)
        (lp.sum() + ent.sum()).backward()

    train_on([5, 9, 12])  # warm-up: batch and sequence dims compiled dynamic at once
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1 and not counters["graph_break"]
    for lens in ([30, 70, 3], [100, 2], [50, 51, 52, 53, 20], [180, 7]):
        train_on(lens)
    assert counters["stats"]["unique_graphs"] == graphs, "a micro-batch recompiled"
    assert not counters["graph_break"], dict(counters["graph_break"])

    micro = ragged_micro([30, 70, 3])
    model(**micro.model_inputs(64), use_cache=False, output_hidden_states=True)
    assert counters["graph_break"], "transformers' output capture no longer breaks the graph"


def test_compile_layers_with_zero3_is_refused_on_the_login_node(tmp_path):
    from rft.config.load import config_from_dict
    from rft.errors import NotSupportedError

    def load(**trainer):
        return config_from_dict(
            {
                "mode": "train",
                "checkpoint_root_dir": str(tmp_path),
                "model": {"model_path": str(tmp_path)},
                "trainer": {"compile_layers": True, **trainer},
            }
        )

    assert load(zero_stage=2).trainer.compile_layers
    with pytest.raises(NotSupportedError, match="zero_stage 2"):
        load(zero_stage=3)
    with pytest.raises(NotSupportedError, match="param_offload"):  # offload selects ZeRO-3
        load(param_offload=True)
    with pytest.raises(NotSupportedError, match="param_offload"):  # so does veRL's key
        load(
            trainer_config={
                "actor_rollout_ref": {"actor": {"fsdp_config": {"param_offload": True}}}
            }
        )


def test_checkpointing_every_second_layer_recomputes_only_those(tiny_model_dir):
    """``trainer.gradient_checkpointing_every: 2``: the first of two layers runs again in the
    backward, the second keeps its activations; gradients equal an uncheckpointed model's."""
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[1, 5, 9, 2, 7, 3]])

    def grads_and_calls(every: int | None):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).train()
        if every is not None:  # as rft.trainer.engine._build_engine enables it
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}, every_n_layers=every
            )
        calls = [0] * len(model.model.layers)
        for i, layer in enumerate(model.model.layers):
            # a pre-hook: the backward's recompute stops once it has what it needs (no post-hook)
            layer.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
        model(input_ids=ids).logits.pow(2).mean().backward()
        return {n: p.grad for n, p in model.named_parameters()}, calls

    plain, calls = grads_and_calls(None)
    assert calls == [1, 1]
    for every, recomputed in ((1, [2, 2]), (2, [2, 1])):
        grads, calls = grads_and_calls(every)
        assert calls == recomputed, every
        for name, grad in plain.items():
            torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_checkpointing_every_without_checkpointing_is_said_to_have_no_effect(tmp_path, caplog):
    from rft.config.load import config_from_dict

    with caplog.at_level("WARNING"):
        config_from_dict(
            {
                "mode": "train",
                "checkpoint_root_dir": str(tmp_path),
                "model": {"model_path": str(tmp_path)},
                "trainer": {"gradient_checkpointing": False, "gradient_checkpointing_every": 2},
            }
        )
    assert "gradient_checkpointing_every=2: no effect" in caplog.text
