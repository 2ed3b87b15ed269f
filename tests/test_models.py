"""Model folder helpers: SmolLM2 from the GGUF package, tiny random models, folder checks."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from rft.devtools import TINY_ARCHS, make_tiny_model
from rft.errors import CheckpointError, DataError
from rft.models import check_model_dir


def test_tiny_model_loads_with_transformers(tiny_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    info = check_model_dir(tiny_model_dir)
    assert info.model_type == "llama" and info.vocab_size == 49152
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = tok("1 + 2 =", return_tensors="pt").input_ids
    assert model(ids).logits.shape == (1, ids.shape[1], 49152)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert torch.isfinite(model(ids).logits).all()


@pytest.mark.parametrize("arch", sorted(TINY_ARCHS))
def test_tiny_model_archs_are_fast_and_deterministic(
    arch: str, tmp_path: Path, smollm2_tokenizer_dir: Path
) -> None:
    from safetensors.torch import load_file

    start = time.monotonic()
    a = make_tiny_model(
        tmp_path / "a", arch=arch, tie_word_embeddings=False, tokenizer_dir=smollm2_tokenizer_dir
    )
    assert time.monotonic() - start < 10
    b = make_tiny_model(
        tmp_path / "b", arch=arch, tie_word_embeddings=False, tokenizer_dir=smollm2_tokenizer_dir
    )
    assert json.loads((a / "config.json").read_text())["model_type"] == arch
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa)
    assert check_model_dir(a).architectures


def test_make_tiny_model_is_idempotent(tiny_model_dir: Path) -> None:
    before = (tiny_model_dir / "model.safetensors").stat().st_mtime_ns
    make_tiny_model(tiny_model_dir)
    assert (tiny_model_dir / "model.safetensors").stat().st_mtime_ns == before


def test_check_model_dir_errors_say_what_to_do(tmp_path: Path, tiny_model_dir: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        check_model_dir(tmp_path / "nope")
    (tmp_path / "ckpt" / "actor").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="rft-convert"):
        check_model_dir(tmp_path / "ckpt")
    no_tok = tmp_path / "no_tok"
    no_tok.mkdir()
    shutil.copy(tiny_model_dir / "config.json", no_tok)
    shutil.copy(tiny_model_dir / "model.safetensors", no_tok)
    with pytest.raises(DataError, match="tokenizer"):
        check_model_dir(no_tok)
    no_weights = tmp_path / "no_weights"
    shutil.copytree(tiny_model_dir, no_weights)
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="rft-convert"):
        check_model_dir(no_weights)
    assert check_model_dir(no_weights, need_weights=False).has_weights is False
    (no_weights / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        check_model_dir(no_weights)


def test_smollm2_folder_is_a_working_chat_model(smollm2_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rft.devtools import materialize_smollm2

    start = time.monotonic()
    assert (
        materialize_smollm2(smollm2_dir) == smollm2_dir and time.monotonic() - start < 2
    )  # idempotent
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["rope_theta"] == 100000 and config["tie_word_embeddings"] is True
    assert (smollm2_dir / "generation_config.json").is_file()
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    assert len(tok) == 49152 and tok.chat_template
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0][ids.shape[1] :])
