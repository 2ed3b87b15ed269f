"""LoRA checkpoints in ``rft-convert``: the PEFT adapter folder from the shards, and ``--merge``.

A ``model.lora_configs`` run saves only the adapter (``exclude_frozen_parameters``), under the
engine module's names (``base_model.model....q_proj.lora_A.default.weight``). Such a checkpoint
(:func:`is_lora_checkpoint`) becomes ``actor/huggingface/`` (``adapter_config.json`` +
``adapter_model.safetensors``, PEFT's names) and, with ``--merge``, ``actor/huggingface_merged/``
(the base model with the adapter merged in). Tensors stream CRC-checked, and both folders are
swapped in like a full conversion's. ``peft`` and ``transformers`` are imported only when needed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch
import yaml

from rft.atomic import tmp_name
from rft.config.schema import LoRAConfig
from rft.convert.ds_reader import read_deepspeed
from rft.convert.output import (
    backup_path,
    carry_user_files,
    output_target,
    publish_replacing,
    recover,
)
from rft.convert.readers import detect_format, open_checkpoint
from rft.convert.types import (
    DTYPE_JSON,
    DTYPES,
    Job,
    Options,
    Outcome,
    SourceTensor,
    resolve_dtype,
)
from rft.errors import CheckpointError, RftError
from rft.models import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    adapter_saved_name,
    has_tokenizer,
    is_adapter_folder,
    read_config,
    tokenizer_files,
)
from rft.rundir import CONFIG_FILE, MERGED_HF_DIR, STEP_RE
from rft.safetensors_io import (
    TensorSpec,
    file_complete,
    weight_shapes,
    weights_complete,
    write_safetensors,
)

log = logging.getLogger(__name__)

LORA_MARKS = (".lora_A.", ".lora_B.")  # in the names of a LoRA adapter's two matrices
RANK_DIM = {".lora_A.": 0, ".lora_B.": 1}  # A: [r, in], B: [out, r]
PEFT_PREFIX = "base_model.model."  # a PeftModel's parameter names start so (and PEFT saves them so)
GENERATION_CONFIG = "generation_config.json"


# ----------------------------------------------------------------------------- recognising


def is_lora(names: Iterable[str]) -> bool:
    """Whether tensor ``names`` include a LoRA adapter's matrices."""
    return any(mark in name for name in names for mark in LORA_MARKS)


def is_lora_checkpoint(job: Job) -> bool:
    """Whether ``job`` is a LoRA run's checkpoint. The DeepSpeed shards' names decide; when the
    shards cannot be read, an adapter folder at ``job.out_dir`` (or its backup) does. A step
    whose ``huggingface/`` holds whole model weights is a full one (whose skip compares them
    with the checkpoint: :func:`rft.convert.identity.judge_complete`)."""
    if weights_complete(job.out_dir):
        return False
    try:
        kind, shard_dir = detect_format(job.ckpt_dir)
        if kind != "deepspeed":
            return False
        with _quiet(read_deepspeed.__module__):  # the conversion itself logs what the reader finds
            contents = read_deepspeed(shard_dir)
    except RftError:
        return any(is_adapter_folder(p) for p in (job.out_dir, backup_path(job.out_dir)))
    try:
        return is_lora(t.name for t in contents.tensors)
    finally:
        contents.close()


@contextlib.contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    logger = logging.getLogger(logger_name)
    was = logger.disabled
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = was


def adapter_complete(folder: Path) -> bool:
    """Whether ``folder`` is a whole adapter folder: a readable config and whole weights."""
    try:
        return isinstance(
            json.loads((folder / ADAPTER_CONFIG).read_text()), dict
        ) and file_complete(folder / ADAPTER_WEIGHTS)
    except (OSError, ValueError):
        return False


def merged_complete(folder: Path) -> bool:
    """Whether ``folder`` is a whole merged model: config.json and whole weights."""
    return (folder / "config.json").is_file() and weights_complete(folder)


# ----------------------------------------------------------------------------- the adapter's tensors


def adapter_name(names: list[str]) -> str | None:
    """The adapter's name inside the live names (PEFT's ``default``); None if the names are
    saved names already (``...lora_A.weight``)."""
    for name in names:
        for mark in LORA_MARKS:
            if mark in name:
                segment = name.split(mark, 1)[1].split(".")[0]
                return None if segment == "weight" else segment
    raise CheckpointError("no lora_A/lora_B tensors in the checkpoint")


def adapter_tensors(tensors: list[SourceTensor], label: str) -> list[SourceTensor]:
    """The adapter's tensors under PEFT's saved names, in module order. Other tensors (base
    weights of a save that kept frozen parameters) are left out: the merge takes the base model
    from its folder."""
    adapter = adapter_name([t.name for t in tensors])
    if adapter is None:
        own = [t for t in tensors if "lora_" in t.name]
    else:
        own = [t for t in tensors if f".{adapter}." in t.name or t.name.endswith(f".{adapter}")]
    if len(own) < len(tensors):
        log.info(
            "%s: %d tensor(s) of the shards are not the adapter's (e.g. %s): left out",
            label,
            len(tensors) - len(own),
            next(t.name for t in tensors if t not in own),
        )
    outside = [t.name for t in own if not t.name.startswith(PEFT_PREFIX)]
    if outside:
        raise CheckpointError(
            f"{label}: adapter tensor {outside[0]} does not start with {PEFT_PREFIX!r}: the "
            "engine trained something else than a PEFT model (peft.get_peft_model), which "
            "rft-convert cannot name as PEFT does"
        )
    return [
        SourceTensor(
            adapter_saved_name(t.name, adapter) if adapter else t.name, t.shape, t.dtype, t.load
        )
        for t in own
    ]


def _module_of(name: str) -> tuple[str, str] | None:
    """(module name, mark) of a LoRA matrix name, e.g. (``base_model.model....q_proj``, ``.lora_A.``)."""
    return next(((name.split(mark, 1)[0], mark) for mark in LORA_MARKS if mark in name), None)


def _pattern_rank(patterns: dict, module: str, r: int) -> int:
    # PEFT's rule (peft.utils.other.get_pattern_key): a key matches a module name's end.
    return next((int(v) for k, v in patterns.items() if re.match(rf"(.*\.)?({k})$", module)), r)


def check_lora_ranks(config: dict, tensors: list[SourceTensor], source: str, label: str) -> int:
    """Every matrix's rank is the config's ``r`` (or its ``rank_pattern``); return ``r``."""
    r, patterns = config.get("r"), config.get("rank_pattern") or {}
    if not isinstance(r, int):
        raise CheckpointError(
            f"{label}: the {source} has no integer 'r'; it is not a LoRA adapter config"
        )
    for t in tensors:
        found = _module_of(t.name)
        if found is None or len(t.shape) < 2:
            continue
        module, mark = found
        want, got = _pattern_rank(patterns, module, r), t.shape[RANK_DIM[mark]]
        if got != want:
            raise CheckpointError(
                f"{label}: {t.name} has shape {list(t.shape)} (rank {got}) but the {source} "
                f"says r={want}: the config belongs to another adapter; restore the run's "
                f"{ADAPTER_CONFIG}, or delete it and rerun to rebuild it from the shards"
            )
    return r


def check_fits_base(tensors: list[SourceTensor], base: Path | None, label: str) -> None:
    """Refuse an adapter whose matrices do not fit the layers of the base model's weights
    (checked only when ``base`` holds safetensors weights)."""
    shapes = weight_shapes(base) if base is not None and base.is_dir() else {}
    if not shapes:
        return
    wrong, unknown, checked = [], [], 0
    for t in tensors:
        found = _module_of(t.name)
        if found is None or len(t.shape) != 2:
            continue
        module, mark = found
        key = module.removeprefix(PEFT_PREFIX) + ".weight"
        dim = 1 if mark == ".lora_A." else 0  # A reads the layer's input, B writes its output
        checked += 1
        ref = shapes.get(key)
        if ref is None:
            unknown.append(key)
        elif len(ref) != 2 or ref[dim] != t.shape[dim]:
            wrong.append(f"{t.name} {list(t.shape)} vs {key} {list(ref)}")
    if wrong or (checked and len(unknown) == checked):
        example = wrong[0] if wrong else f"{unknown[0]} is not in {base}"
        raise CheckpointError(
            f"{label}: the adapter does not fit the base model {base} (e.g. {example}); "
            "pass --base-model-dir with the model the run trained (model.model_path)"
        )


# ----------------------------------------------------------------------------- adapter_config.json


def run_lora_settings(job: Job) -> tuple[dict, Path | None]:
    """``model.model_path`` and ``model.lora_configs[0]`` of the run's config.yaml (beside the
    step folder), defaults filled in; ({}, path or None) when there is none."""
    step_dir = next((p for p in job.out_dir.parents if STEP_RE.match(p.name)), None)
    path = step_dir.parent / CONFIG_FILE if step_dir else None
    if path is None or not path.is_file():
        return {}, None
    try:
        model = (yaml.safe_load(path.read_text()) or {}).get("model") or {}
        lora = (model.get("lora_configs") or [None])[0]
    except (OSError, yaml.YAMLError, AttributeError, TypeError, KeyError, IndexError) as e:
        log.warning("%s: cannot read model.lora_configs from %s (%s)", job.label, path, e)
        return {}, path
    if not isinstance(lora, dict):
        return {}, path
    defaults = LoRAConfig()
    settings = {
        k: lora.get(k, getattr(defaults, k)) for k in ("lora_alpha", "lora_dropout", "path")
    }
    settings["model_path"] = model.get("model_path") or None
    return settings, path


def write_adapter_config(
    job: Job, opts: Options, tensors: list[SourceTensor], dest: Path
) -> tuple[dict, str]:
    """Put adapter_config.json into ``dest``: the old folder's, else rebuilt; return its fields
    and where they came from."""
    existing = job.out_dir / ADAPTER_CONFIG
    why = f"{existing} is missing"
    if existing.is_file():
        try:
            config = json.loads(existing.read_text())
            if not isinstance(config, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as e:
            why = f"{existing} is damaged ({e})"
            log.warning("%s: %s; rebuilding it", job.label, why)
        else:
            if opts.lora_alpha is not None and opts.lora_alpha != config.get("lora_alpha"):
                raise CheckpointError(
                    f"{job.label}: --lora-alpha {opts.lora_alpha} conflicts with {existing} "
                    f"(lora_alpha {config.get('lora_alpha')}), which is kept; drop the flag, or "
                    "delete that file to rebuild it with this alpha"
                )
            shutil.copyfile(existing, dest / ADAPTER_CONFIG)
            return config, f"{ADAPTER_CONFIG} kept"
    return rebuild_adapter_config(job, opts, tensors, dest, why)


def rebuild_adapter_config(
    job: Job, opts: Options, tensors: list[SourceTensor], dest: Path, why: str
) -> tuple[dict, str]:
    """adapter_config.json from the shapes (r, target modules) and the run's ``config.yaml``
    (``model.model_path``, ``model.lora_configs[0]``), which ``--base-model-dir`` and
    ``--lora-alpha`` override or replace."""
    run, run_config = run_lora_settings(job)
    base = opts.base_model_dir or run.get("model_path")
    start = Path(run["path"]) if run.get("path") else None
    if start is not None and is_adapter_folder(
        start
    ):  # the run began from this adapter: its config
        config = json.loads((start / ADAPTER_CONFIG).read_text())
        if base:
            config["base_model_name_or_path"] = str(base)
        (dest / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        return config, f"{ADAPTER_CONFIG} from model.lora_configs[0].path {start}"
    alpha = opts.lora_alpha or run.get("lora_alpha")
    missing = [
        flag for flag, value in (("--base-model-dir", base), ("--lora-alpha", alpha)) if not value
    ]
    if missing:
        seen = (
            f"{run_config} has no model.lora_configs"
            if run_config
            else f"the run has no {CONFIG_FILE}"
        )
        raise CheckpointError(
            f"{job.label}: {why} and {seen} to rebuild it from; pass {' and '.join(missing)} (the run's "
            "model.model_path and model.lora_configs[0].lora_alpha), or restore the trainer's "
            f"{ADAPTER_CONFIG}"
        )
    modules = {
        found[0]: t.shape[0]
        for t in tensors
        if (found := _module_of(t.name)) and found[1] == ".lora_A."
    }
    others = [t.name for t in tensors if _module_of(t.name) is None]
    ranks = sorted(set(modules.values()))
    if others or len(ranks) != 1:
        example = (
            f"it holds {others[0]}" if others else f"its ranks differ between layers ({ranks})"
        )
        raise CheckpointError(
            f"{job.label}: {why}, and a plain LoRA config cannot describe this adapter "
            f"({example}); restore the trainer's {ADAPTER_CONFIG}"
        )
    from peft import LoraConfig

    targets = sorted({module.rsplit(".", 1)[-1] for module in modules})
    dropout = float(run.get("lora_dropout") or 0.0)
    LoraConfig(
        r=ranks[0],
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=str(base),
    ).save_pretrained(str(dest))
    source = "--lora-alpha" if opts.lora_alpha else str(run_config)
    log.info(
        "%s: %s; rebuilt it (r=%d, lora_alpha=%s from %s, base %s)",
        job.label,
        why,
        ranks[0],
        alpha,
        source,
        base,
    )
    return json.loads((dest / ADAPTER_CONFIG).read_text()), f"{ADAPTER_CONFIG} rebuilt"


# ----------------------------------------------------------------------------- the two folders


def build_adapter_folder(job: Job, opts: Options, tmp: Path) -> tuple[int, str]:
    """Fill ``tmp`` with the adapter folder of ``job``; return (bytes, summary note)."""
    contents = open_checkpoint(job.ckpt_dir)
    try:
        tensors = adapter_tensors(contents.tensors, job.label)
        config, source = write_adapter_config(job, opts, tensors, tmp)
        r = check_lora_ranks(config, tensors, source, job.label)
        named = config.get("base_model_name_or_path")
        check_fits_base(tensors, opts.base_model_dir or (Path(named) if named else None), job.label)
        specs = [
            TensorSpec(
                t.name,
                t.shape,
                DTYPES.get(opts.dtype, t.dtype) if t.dtype.is_floating_point else t.dtype,
            )
            for t in tensors
        ]
        by_name = {t.name: t for t in tensors}
        write_safetensors(
            tmp / ADAPTER_WEIGHTS, specs, lambda s: by_name[s.name].load().to(s.dtype)
        )
        contents.verify()  # CRCs of the records read: a damaged checkpoint is never published
    finally:
        contents.close()
    kept = carry_user_files(job.out_dir, tmp)
    dtypes = ", ".join(sorted({DTYPE_JSON.get(s.dtype, str(s.dtype)) for s in specs}))
    note = (
        f"lora r={r}, {len(specs)} tensors, {contents.kind}, {contents.world_size} rank(s), {dtypes}, "
        f"{source} -> {job.out_dir}"
    )
    if kept:
        note += f" (kept {', '.join(kept)})"
    return sum(s.nbytes for s in specs), note


def merge_base_dir(config: dict, override: Path | None, label: str) -> Path:
    """The base model to merge into: ``--base-model-dir``, else the config's base_model_name_or_path."""
    if override is not None:
        return override
    named = config.get("base_model_name_or_path")
    if named and (Path(named) / "config.json").is_file():
        return Path(named)
    said = f"names {named!r}, which is not a model folder here" if named else "names none"
    raise CheckpointError(
        f"{label}: --merge needs the base model, and {ADAPTER_CONFIG}'s "
        f"base_model_name_or_path {said}; pass --base-model-dir (the run's model.model_path)"
    )


def build_merged(job: Job, opts: Options, tmp: Path, merged_dir: Path) -> tuple[int, str]:
    """Fill ``tmp`` with the base model of ``job``'s adapter with the adapter merged in."""
    config = json.loads((job.out_dir / ADAPTER_CONFIG).read_text())
    base = merge_base_dir(config, opts.base_model_dir, job.label)
    base_config = read_config(base, key="--base-model-dir")
    dtype = resolve_dtype(opts.dtype, base_config)
    load_dtype = dtype if resolve_dtype("auto", base_config) == dtype else torch.float32
    start = time.monotonic()
    model = _merged_model(job, base, load_dtype, dtype)
    log.info(
        "%s: merge 4/4: writing %s (%s) to %s",
        job.label,
        type(model).__name__,
        DTYPE_JSON[dtype],
        merged_dir,
    )
    model.save_pretrained(str(tmp), max_shard_size=opts.max_shard_bytes)
    del model
    for folder in (
        base,
        job.out_dir,
    ):  # tokenizer files, the trainer's (beside the adapter) winning
        for path in tokenizer_files(folder):
            shutil.copyfile(path, tmp / path.name)
    if (base / GENERATION_CONFIG).is_file():
        shutil.copyfile(base / GENERATION_CONFIG, tmp / GENERATION_CONFIG)
    if not has_tokenizer(tmp):
        raise CheckpointError(
            f"{job.label}: no tokenizer files in {base} or {job.out_dir}; pass "
            "--base-model-dir with a tokenizer"
        )
    assert merged_complete(tmp), f"save_pretrained left no whole weights in {tmp}"
    kept = carry_user_files(merged_dir, tmp)
    nbytes = sum(p.stat().st_size for p in tmp.glob("*.safetensors"))
    log.info("%s: merged in %.1fs", job.label, time.monotonic() - start)
    note = f"merged: base {base} + adapter, {DTYPE_JSON[dtype]} -> {merged_dir}"
    return nbytes, note + (f" (kept {', '.join(kept)})" if kept else "")


def _merged_model(
    job: Job, base: Path, load_dtype: torch.dtype, dtype: torch.dtype
) -> torch.nn.Module:
    """The base model with the adapter of ``job.out_dir`` merged in (PEFT's merge_and_unload)."""
    from peft import PeftModel
    from peft.utils import get_peft_model_state_dict
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    log.info(
        "%s: merge 1/4: loading the base model %s (%s)", job.label, base, DTYPE_JSON[load_dtype]
    )
    try:
        model = AutoModelForCausalLM.from_pretrained(str(base), dtype=load_dtype)
        log.info("%s: merge 2/4: applying the adapter %s", job.label, job.out_dir)
        model = PeftModel.from_pretrained(model, str(job.out_dir))
    except (OSError, ValueError, RuntimeError, KeyError) as e:
        raise CheckpointError(
            f"{job.label}: the adapter in {job.out_dir} does not load onto the base model "
            f"{base} ({type(e).__name__}: {e}); pass --base-model-dir with the run's "
            "model.model_path"
        ) from e
    for (
        config
    ) in model.peft_config.values():  # else PEFT looks for the named base (for its vocabulary)
        config.base_model_name_or_path = str(base)
    with safe_open(str(job.out_dir / ADAPTER_WEIGHTS), "pt") as f:
        saved = set(f.keys())
    loaded = set(get_peft_model_state_dict(model))
    if saved != loaded:
        example = sorted(saved ^ loaded)[0]
        raise CheckpointError(
            f"{job.label}: the adapter's tensors and the adapted layers of {base} differ "
            f"(e.g. {example}, {'unused' if example in saved else 'missing'}); pass "
            "--base-model-dir with the run's model.model_path"
        )
    log.info("%s: merge 3/4: merging %d adapted layers", job.label, len(loaded) // 2)
    return model.merge_and_unload().to(dtype)


def _replace(final: Path, build: Callable[[Path], tuple[int, str]]) -> tuple[int, str]:
    """Build a new ``final`` in a temporary folder and swap it in (:mod:`rft.convert.output`;
    a symlinked ``final`` is written where it points)."""
    final = output_target(final)
    tmp = tmp_name(final)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        result = build(tmp)
        publish_replacing(tmp, final)
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone after a publish; debris after a failure


def convert_lora(job: Job, opts: Options) -> Outcome:
    """Convert one LoRA checkpoint: the adapter folder and, with ``opts.merge``, the merged
    model; each skipped when complete unless ``opts.force``. Raises RftError for bad input."""
    start = time.monotonic()
    merged_dir = job.out_dir.with_name(MERGED_HF_DIR)
    recover(output_target(job.out_dir), complete=adapter_complete)  # first: a skip leaves no debris
    if opts.merge:
        recover(output_target(merged_dir), complete=merged_complete)
    notes, nbytes, built = [], 0, False
    todo = [(job.out_dir, adapter_complete, lambda tmp: build_adapter_folder(job, opts, tmp))]
    if opts.merge:
        todo.append(
            (merged_dir, merged_complete, lambda tmp: build_merged(job, opts, tmp, merged_dir))
        )
    for final, complete, build in todo:
        if complete(final) and not opts.force:
            notes.append(f"{final} is complete (--force redoes it)")
            continue
        n, note = _replace(final, build)
        nbytes, built = nbytes + n, True
        notes.append(note)
    status = "converted" if built else "skipped"
    return Outcome(job.label, status, "; ".join(notes), time.monotonic() - start, nbytes)
