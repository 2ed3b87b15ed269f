"""Whether a Hugging Face folder holds this checkpoint's model, for ``rft-convert``.

A ``huggingface/`` holding another model's weights must be neither skipped as complete nor
mixed with the checkpoint's weights (its config.json would be kept). :func:`weights_mismatch`
compares the tensor names and shapes in the folder's safetensors headers with the checkpoint's;
:func:`config_mismatch` compares config.json's architecture and sizes with the run's model and
with the checkpoint's embedding shape. Same names and shapes can still be another step's (or
another run's) weights: each file rft-convert writes records, in its safetensors metadata,
digests of the checkpoint files it was converted from (:func:`checkpoint_record`), which
:func:`record_mismatch` compares with the checkpoint's now. Headers, JSON, zip directories and
the checkpoint's metadata only: no tensor is read.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path
from typing import Sequence

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
# Safetensors metadata keys of a conversion record (:func:`checkpoint_record`).
RECORD_PREFIX = "rft.checkpoint."
RECORD_MODEL = RECORD_PREFIX + "model"  # digest of the model-state files read
RECORD_OPTIM = RECORD_PREFIX + "optim"  # digest of the optimizer-state files read (absent: none)
RECORD_PATH = RECORD_PREFIX + "path"  # the checkpoint folder converted, for messages


def files_digest(paths: Sequence[Path]) -> str:
    """A digest of what ``paths`` hold, from their zip directories (``torch.save``'s format):
    each record's name, size and CRC-32, so no data is read; a copy of the files has the same
    digest, another save a different one. A file that is no zip counts by its size."""
    digest = hashlib.sha256()
    for path in sorted(paths, key=lambda p: p.name):
        digest.update(path.name.encode() + b"\0")
        try:
            with zipfile.ZipFile(path) as archive:
                for info in archive.infolist():
                    record = info.filename.split("/", 1)[-1]  # without the archive's folder
                    digest.update(f"{record}:{info.file_size}:{info.CRC:08x}\0".encode())
        except (zipfile.BadZipFile, OSError):
            digest.update(f"{_size(path)}\0".encode())
    return digest.hexdigest()[:32]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def checkpoint_record(contents: CheckpointContents, ckpt_dir: Path) -> dict[str, str]:
    """What the weight files of a conversion of ``contents`` record about it (safetensors
    metadata): digests of the model-state and optimizer-state files read, kept apart so that
    a checkpoint whose optimizer states were deleted after converting is still recognised."""
    model = [p for p in contents.files if "optim" not in p.name]
    optim = [p for p in contents.files if "optim" in p.name]
    record = {RECORD_MODEL: files_digest(model), RECORD_PATH: str(ckpt_dir)}
    if optim:
        record[RECORD_OPTIM] = files_digest(optim)
    return record


def weight_records(folder: Path) -> list[dict[str, str]]:
    """The conversion record of each whole safetensors file of ``folder`` (its
    :data:`RECORD_PREFIX` metadata; empty for a file the trainer or an older rft-convert wrote)."""
    records = []
    for name in _weight_files(folder):
        if file_problem(folder / name) is None:
            meta = read_header(folder / name).get("__metadata__") or {}
            records.append({k: v for k, v in meta.items() if k.startswith(RECORD_PREFIX)})
    return records


def record_mismatch(records: list[dict[str, str]], ours: dict[str, str]) -> str | None:
    """How the recorded checkpoint of a folder's weights (:func:`weight_records`) is not
    ``ours`` (:func:`checkpoint_record`), or None. Optimizer digests count only when both
    sides have one; a folder without any record is not judged here."""
    for record in records:
        if not record:
            return (
                "some of its weight files carry no rft-convert record: they come from other writes"
            )
        optim, our_optim = record.get(RECORD_OPTIM), ours.get(RECORD_OPTIM)
        if record.get(RECORD_MODEL) != ours[RECORD_MODEL] or (
            optim and our_optim and optim != our_optim
        ):
            source = record.get(RECORD_PATH) or "an unnamed checkpoint"
            if source == ours[RECORD_PATH]:
                return f"converted from {source} before its files were replaced"
            return f"converted from {source}"
    return None


def _weight_files(folder: Path) -> list[str]:
    """Names of ``folder``'s safetensors files: an index's shards, else ``model.safetensors``."""
    try:
        return sorted(set(json.loads((folder / INDEX_FILE).read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return [SINGLE_FILE]


def readable_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the tensors in ``folder``'s whole safetensors files (an index's
    shards, else ``model.safetensors``); missing or damaged files are left out."""
    shapes: dict[str, tuple[int, ...]] = {}
    for name in _weight_files(folder):
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
    are the checkpoint's, failed when they are another model's (:func:`foreign_model`) or
    were converted from another checkpoint (:func:`record_mismatch`; ``--force`` replaces
    them). Weights without a record (the trainer's, an older rft-convert's) are judged by names,
    shapes and config alone. A checkpoint that cannot be read (pruned after converting, say)
    leaves the folder as it is."""
    try:
        contents = open_checkpoint(job.ckpt_dir)
    except RftError as e:
        return "skipped", f"{job.out_dir} is complete; not compared with the checkpoint ({e})"
    try:
        foreign = foreign_model(job.out_dir, contents, reference_config(job))
        ours = checkpoint_record(contents, job.ckpt_dir)
    finally:
        contents.close()
    if foreign:
        return "failed", foreign
    records = weight_records(job.out_dir)
    if not any(records):
        return "skipped", (
            f"{job.out_dir} is complete; its weights carry no rft-convert record (the trainer "
            "wrote them, or an older rft-convert), so only names, shapes and config were "
            "compared (--force redoes it)"
        )
    other = record_mismatch(records, ours)
    if other:
        steps = f" --steps {job.step}" if job.step is not None else ""
        return "failed", (
            f"{job.out_dir} holds another checkpoint's weights ({other}), not those of "
            f"{job.ckpt_dir}; rft-convert does not skip it: rerun with --force{steps} to "
            "replace them with this checkpoint's (its config.json and tokenizer are kept)"
        )
    return "skipped", f"{job.out_dir} is complete (--force redoes it)"
