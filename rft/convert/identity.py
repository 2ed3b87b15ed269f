"""Whether a Hugging Face folder holds this checkpoint's model, for ``rft-convert``.

A ``huggingface/`` holding another model's weights must be neither skipped as complete nor
mixed with the checkpoint's weights (its config.json would be kept). :func:`weights_mismatch`
compares the tensor names and shapes in the folder's safetensors headers with the checkpoint's;
:func:`config_mismatch` compares config.json's architecture and sizes with the run's model and
with the checkpoint's embedding shape. Headers, JSON and the checkpoint's metadata only: no
tensor is read.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from rft.convert.readers import open_checkpoint
from rft.convert.types import CheckpointContents, Job
from rft.errors import RftError
from rft.rundir import ACTOR_DIR, CONFIG_FILE, STEP_RE
from rft.safetensors_io import (
    INDEX_FILE,
    SINGLE_FILE,
    file_problem,
    read_header,
    weights_complete,
)

# config.json keys that fix a model's architecture and tensor shapes (absent ones are not compared)
IDENTITY_KEYS = (
    "model_type",
    "architectures",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
)


def readable_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the tensors in ``folder``'s whole safetensors files (an index's
    shards, else ``model.safetensors``); missing or damaged files are left out."""
    index = folder / INDEX_FILE
    try:
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        files = [SINGLE_FILE]
    shapes: dict[str, tuple[int, ...]] = {}
    for name in files:
        if file_problem(folder / name) is None:
            header = read_header(folder / name)
            shapes.update({k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"})
    return shapes


def checkpoint_shapes(contents: CheckpointContents) -> dict[str, tuple[int, ...]]:
    """Every tensor name the conversion may write (tied aliases too), with its shape."""
    shapes = {t.name: tuple(t.shape) for t in contents.tensors}
    shapes.update({a: shapes[s] for a, s in contents.aliases.items() if s in shapes})
    return shapes


def weights_mismatch(
    folder: dict[str, tuple[int, ...]], contents: CheckpointContents, complete: bool
) -> str | None:
    """How the weights in a folder (:func:`readable_shapes`) differ from the checkpoint's, or
    None. A tensor of the checkpoint absent from the folder counts only when it is ``complete``
    (a partial folder lacks some); a tied one may be there under either of its names."""
    ours = checkpoint_shapes(contents)
    for name, shape in folder.items():
        if name not in ours:
            return f"it holds {name}, which the checkpoint does not have"
        if shape != ours[name]:
            return f"its {name} is {list(shape)}, the checkpoint's {list(ours[name])}"
    names = {t.name: {t.name} for t in contents.tensors}  # a tied tensor: under either name
    for alias, source in contents.aliases.items():
        names.get(source, set()).add(alias)
    missing = [name for name, known in names.items() if not known & folder.keys()]
    if complete and missing:
        return f"it lacks the checkpoint's {missing[0]} ({len(missing)} tensor(s) in all)"
    return None


def config_mismatch(
    config: dict, contents: CheckpointContents, reference: dict | None, where: str
) -> str | None:
    """How ``config`` (a config.json) describes another model than the checkpoint, or None:
    an :data:`IDENTITY_KEYS` value other than the run's model config (``reference``, found
    at ``where``), or a vocab_size x hidden_size that no tensor of the checkpoint has (every
    causal LM has an embedding of that shape)."""
    for key in IDENTITY_KEYS:
        if reference and key in config and key in reference and config[key] != reference[key]:
            return f"its config.json says {key}={config[key]!r}, {where} {reference[key]!r}"
    vocab, hidden = config.get("vocab_size"), config.get("hidden_size")
    if isinstance(vocab, int) and isinstance(hidden, int):
        if not any(tuple(t.shape) in ((vocab, hidden), (hidden, vocab)) for t in contents.tensors):
            return (
                f"its config.json says vocab_size={vocab}, hidden_size={hidden}, but the "
                f"checkpoint has no [{vocab}, {hidden}] embedding"
            )
    return None


def reference_config(job: Job) -> tuple[dict | None, str]:
    """The config.json the policy's checkpoint was trained from, and how to name it: that of
    the run's ``model.model_path`` (config.yaml beside the step folder); (None, "") when it is
    not readable, or for a critic (another architecture). ``--base-model-dir`` is no reference:
    it only supplies files a step lacks, and one run directory may hold several models."""
    if job.out_dir.parent.name != ACTOR_DIR:
        return None, ""
    step = next((p for p in job.ckpt_dir.parents if STEP_RE.match(p.name)), None)
    try:
        run = yaml.safe_load((step.parent / CONFIG_FILE).read_text()) if step else None
        model_path = Path(run["model"]["model_path"])
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None, ""
    return _json(model_path / "config.json"), f"the run's model {model_path} says"


def _json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def foreign_model(
    folder: Path, contents: CheckpointContents, reference: tuple[dict | None, str]
) -> str | None:
    """Why ``folder`` (a step's ``huggingface/``) holds another model than the checkpoint, as
    a message saying what to do; None when its weights and config.json fit the checkpoint."""
    shapes = readable_shapes(folder)
    config = _json(folder / "config.json")
    why = weights_mismatch(shapes, contents, weights_complete(folder)) if shapes else None
    why = why or (config_mismatch(config, contents, *reference) if config else None)
    if why is None:
        return None
    return (
        f"{folder} holds another model than this checkpoint ({why}); rft-convert neither "
        f"skips it nor writes into it, --force included: move it away (mv {folder} "
        f"{folder}.other) and rerun with --base-model-dir set to the run's model.model_path "
        "(for the config and tokenizer)"
    )


def judge_complete(job: Job) -> tuple[str, str]:
    """(status, note) of a step whose ``huggingface/`` holds whole weights: skipped when they
    are the checkpoint's, failed when they are another model's (:func:`foreign_model`). A
    checkpoint that cannot be read (pruned after converting, say) leaves the folder as it is."""
    try:
        contents = open_checkpoint(job.ckpt_dir)
    except RftError as e:
        return "skipped", f"{job.out_dir} is complete; not compared with the checkpoint ({e})"
    try:
        foreign = foreign_model(job.out_dir, contents, reference_config(job))
    finally:
        contents.close()
    if foreign:
        return "failed", foreign
    return "skipped", f"{job.out_dir} is complete (--force redoes it)"
