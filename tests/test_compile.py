"""``trainer.compile_layers``: decoder layers compiled in place train as the eager model does,
under the same parameter names; ZeRO-3 is refused before a job starts."""

from __future__ import annotations

import shutil

import pytest
import torch


@pytest.mark.skipif(shutil.which("g++") is None, reason="torch.compile on CPU needs a C++ compiler")
def test_compiled_layers_give_the_eager_log_probs_and_gradients(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from rft.buffer.experience import Experience
    from rft.trainer import engine as dse
    from rft.trainer.batching import collate, rows_from_experiences

    exps = [Experience("t", f"g{i}", [1, 2, 3 + i], [5 + i] * (3 + 2 * i), logprobs=[-1.0] * (3 + 2 * i))
            for i in range(2)]
    rows = rows_from_experiences(exps)
    zeros = torch.zeros_like(rows.response_mask)
    micro = collate(rows, [0, 1], zeros, zeros, packed=True)

    def scored(model):
        lp, _ = dse.forward_logprobs(model, micro, with_entropy=False)
        lp.sum().backward()
        return lp.detach(), {n: p.grad for n, p in model.named_parameters()}

    eager = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    compiled = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    names = list(compiled.state_dict())
    assert dse.compile_layers(compiled) == compiled.config.num_hidden_layers
    assert list(compiled.state_dict()) == names  # checkpoints and publishing see the same names
    lp_eager, grads_eager = scored(eager)
    lp_compiled, grads_compiled = scored(compiled)
    torch.testing.assert_close(lp_compiled, lp_eager, rtol=0, atol=1e-5)
    for name, grad in grads_eager.items():
        torch.testing.assert_close(grads_compiled[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_compile_layers_with_zero3_is_refused_on_the_login_node(tmp_path):
    from rft.config.load import config_from_dict
    from rft.errors import NotSupportedError

    def load(zero_stage: int):
        return config_from_dict({"mode": "train", "checkpoint_root_dir": str(tmp_path),
                                 "model": {"model_path": str(tmp_path)},
                                 "trainer": {"compile_layers": True, "zero_stage": zero_stage}})

    assert load(2).trainer.compile_layers
    with pytest.raises(NotSupportedError, match="zero_stage 2"):
        load(3)
