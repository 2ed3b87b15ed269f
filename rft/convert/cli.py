"""``rft-convert``: training checkpoints -> Hugging Face safetensors folders, in place.

For each step that the given path names (:func:`find_jobs`), ``actor/`` (DeepSpeed ZeRO 1/2/3 or
FSDP, :mod:`rft.convert.readers`) becomes ``actor/huggingface/``, and a PPO critic's ``critic/``
``critic/huggingface/``; LoRA checkpoints go to :mod:`rft.convert.adapter`. Tensors stream one
at a time into the shards, CRC-checked, each recording the checkpoint it came from; the folder
is swapped in atomically (:mod:`.output`), a complete one of the checkpoint's model skipped
unless ``--force`` (:mod:`.identity`). One failed step never stops the others: a summary table
ends, exit code 1 if a step failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path

import torch

from rft.atomic import is_tmp, tmp_name
from rft.convert.adapter import convert_lora, is_lora_checkpoint
from rft.convert.identity import checkpoint_record, foreign_model, judge_complete, reference_config
from rft.convert.output import (
    carry_user_files,
    output_problem,
    output_target,
    publish_replacing,
    recover,
)
from rft.convert.readers import (
    CheckpointContents,
    SourceTensor,
    detect_format,
    open_checkpoint,
    refuse_megatron,
)
from rft.convert.types import DTYPE_JSON, DTYPES, Job, Options, Outcome, resolve_dtype
from rft.errors import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USER_ERROR,
    CheckpointError,
    RftError,
    storage_errors,
)
from rft.models import has_tokenizer
from rft.rundir import ACTOR_DIR, CRITIC_DIR, HF_DIR, MERGED_HF_DIR, STEP_RE
from rft.safetensors_io import (
    TensorSpec,
    parse_size,
    plan_shards,
    shard_file_names,
    weight_shapes,
    weights_complete,
    write_index,
    write_safetensors,
)

log = logging.getLogger(__name__)

WEIGHT_SUFFIXES = (
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".gguf",
    ".h5",
    ".msgpack",
    ".ckpt",
    ".index.json",
)


# ----------------------------------------------------------------------------- finding steps


def _step_jobs(step_dir: Path, given: Path | None = None) -> list[Job]:
    """The jobs of one step folder: the policy's (``actor/``) and, when the run trained one,
    the critic's (``critic/``, a value model); ``given`` is a path inside the step folder (a
    role folder or a tag folder), which names one job."""
    rel = given.relative_to(step_dir).parts if given else ()
    if rel and rel[-1] in (HF_DIR, MERGED_HF_DIR):
        rel = rel[:-1]
    step = int(STEP_RE.match(step_dir.name).group(1))
    if rel:
        role = step_dir / rel[0]
        label = step_dir.name if rel[0] == ACTOR_DIR else f"{step_dir.name}/{rel[0]}"
        ckpt_dir = step_dir.joinpath(*rel) if len(rel) > 1 else role
        return [Job(label, step, ckpt_dir, role / HF_DIR)]
    if not (step_dir / ACTOR_DIR).is_dir():
        return [Job(step_dir.name, step, step_dir, step_dir / HF_DIR)]
    jobs = [Job(step_dir.name, step, step_dir / ACTOR_DIR, step_dir / ACTOR_DIR / HF_DIR)]
    if (step_dir / CRITIC_DIR).is_dir():
        critic = step_dir / CRITIC_DIR
        jobs.append(Job(f"{step_dir.name}/{CRITIC_DIR}", step, critic, critic / HF_DIR))
    return jobs


def find_jobs(path: Path, steps: set[int] | None = None) -> list[Job]:
    """The checkpoints that ``path`` names, filtered by ``steps``: a run directory (every
    ``global_step_N`` below it), one ``global_step_N``, a path inside one
    (``.../global_step_N/actor``), or a bare DeepSpeed/FSDP checkpoint folder. A Megatron
    checkpoint (``actor/dist_ckpt/``) is refused before anything is written."""
    path = path.resolve()
    problem = folder_problem(
        path, "", "pass a run directory, a global_step_N folder or a checkpoint folder"
    )
    if problem:
        raise CheckpointError(problem)
    jobs = _jobs_for(path)
    if steps is not None:
        jobs = [j for j in jobs if j.step in steps]
        missing = steps - {j.step for j in jobs}
        if missing:
            raise CheckpointError(
                f"no global_step_{min(missing)} under {path}; steps found: "
                f"{sorted(j.step for j in _jobs_for(path))}"
            )
    for job in jobs:  # refused before anything is written, not once per step as a failure
        refuse_megatron(job.out_dir.parent)
        refuse_megatron(job.ckpt_dir)
        problem = output_problem(job.out_dir)
        if problem:
            raise CheckpointError(problem)
    return jobs


def _jobs_for(path: Path) -> list[Job]:
    for parent in [path, *path.parents]:
        if STEP_RE.match(parent.name):
            return _step_jobs(parent, None if parent == path else path)
    found = sorted(
        _walk_steps(path), key=lambda p: (str(p.parent), int(STEP_RE.match(p.name).group(1)))
    )
    if found:
        return [job for p in found for job in _step_jobs(p)]
    detect_format(path)  # raises a clear "not a checkpoint" error
    return [Job(path.name, None, path, path / HF_DIR)]


def folder_problem(path: Path, label: str, hint: str) -> str | None:
    """Why ``path`` is not a folder (missing, a file, or below a file), as a message; None if it is one."""
    for p in [path, *path.parents]:
        if p.is_dir():
            return None if p == path else f"{label}{path} does not exist; {hint}"
        if p.exists():
            below = "" if p == path else f"{path} does not exist: "
            return f"{label}{below}{p} is a file, not a folder; {hint}, e.g. {p.parent}"
    return f"{label}{path} does not exist; {hint}"


def _walk_steps(root: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, _files in os.walk(root):
        for name in list(dirnames):
            if STEP_RE.match(name):
                out.append(Path(dirpath) / name)
                dirnames.remove(name)  # a step folder holds no further steps
            elif is_tmp(name):
                dirnames.remove(name)
    return out


# ----------------------------------------------------------------------------- HF side files


def _hf_sources(job: Job, base: Path | None) -> list[Path]:
    """Folders to take config/tokenizer files from, lowest priority first."""
    sources = [base] if base else []
    if job.out_dir.is_dir():
        sources.append(job.out_dir)  # the checkpoint's own HF files win
    return sources


def _side_files(folder: Path) -> list[Path]:
    return [
        p
        for p in sorted(folder.iterdir())
        if p.is_file() and not is_tmp(p) and not p.name.endswith(WEIGHT_SUFFIXES)
    ]


def check_base_model(base: Path | None) -> None:
    """Refuse a --base-model-dir that is not a Hugging Face model folder (before any step starts)."""
    if base is None:
        return
    problem = folder_problem(
        base, "--base-model-dir ", "pass the Hugging Face model folder the run started from"
    )
    if problem:
        raise CheckpointError(problem)
    if not (base / "config.json").is_file():
        raise CheckpointError(
            f"--base-model-dir {base} has no config.json; pass a Hugging Face model folder"
        )


def copy_side_files(job: Job, base: Path | None, dest: Path) -> dict:
    """Copy config, tokenizer and template files into ``dest``; return the parsed config.json.

    They come from the checkpoint's own ``huggingface/`` folder (the trainer's files live there,
    which is why replacing it must never lose it: :mod:`rft.convert.output`), else from
    ``--base-model-dir``.
    """
    check_base_model(base)
    for folder in _hf_sources(job, base):
        for p in _side_files(folder):
            shutil.copyfile(p, dest / p.name)
    if not (dest / "config.json").is_file():
        raise CheckpointError(
            f"{job.label}: no config.json in {job.out_dir}; pass --base-model-dir "
            "(the Hugging Face model folder the run started from)"
        )
    if not has_tokenizer(dest):
        raise CheckpointError(
            f"{job.label}: no tokenizer files in {job.out_dir}"
            + (f" or {base}" if base else "")
            + "; pass --base-model-dir with a tokenizer"
        )
    try:
        return json.loads((dest / "config.json").read_text())
    except ValueError as e:
        raise CheckpointError(f"{dest / 'config.json'} is not valid JSON ({e})") from e


def write_configs(dest: Path, config: dict, dtype: torch.dtype) -> None:
    """Record the output dtype in config.json; add a generation_config.json if none came along."""
    keys = [k for k in ("dtype", "torch_dtype") if k in config] or [
        "torch_dtype"
    ]  # new and old spelling
    for key in keys:
        config[key] = DTYPE_JSON[dtype]
    (dest / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if not (dest / "generation_config.json").is_file():
        gen = {
            k: config[k]
            for k in ("bos_token_id", "eos_token_id", "pad_token_id")
            if config.get(k) is not None
        }
        gen["_from_model_config"] = True
        (dest / "generation_config.json").write_text(
            json.dumps(gen, indent=2, sort_keys=True) + "\n"
        )


# ----------------------------------------------------------------------------- weights


def output_tensors(
    contents: CheckpointContents, config: dict
) -> tuple[list[SourceTensor], dict[str, str]]:
    """Unique tensors to write, plus aliases written as copies (tied weights the config unties).

    Tied aliases are dropped only when config.json says ``tie_word_embeddings: true``, because
    then transformers re-ties them on load; otherwise each alias gets its own copy.
    """
    if config.get("tie_word_embeddings") is True:
        return contents.tensors, {}
    names = {t.name for t in contents.tensors}
    copies = {a: s for a, s in contents.aliases.items() if s in names and a not in names}
    return contents.tensors, copies


def check_against_reference(contents: CheckpointContents, base: Path | None) -> None:
    """Refuse a --base-model-dir whose weights have other names or shapes than the checkpoint."""
    ref = weight_shapes(base) if base else {}
    if not ref:
        return
    ours = {t.name: t.shape for t in contents.tensors}
    wrong = [f"{n} {ours[n]} vs {ref[n]}" for n in ours if n in ref and tuple(ref[n]) != ours[n]]
    unknown = [n for n in ours if n not in ref]
    if wrong or len(unknown) == len(ours):
        example = wrong[0] if wrong else f"{unknown[0]} is not in {base}"
        raise CheckpointError(
            f"the checkpoint does not match --base-model-dir {base} (e.g. {example}); "
            "pass the model folder the run started from"
        )
    if unknown:
        log.warning(
            "%d tensor(s) of the checkpoint are not in %s, e.g. %s", len(unknown), base, unknown[0]
        )


def _out_dtype(src: torch.dtype, dtype: torch.dtype) -> torch.dtype:
    return dtype if src.is_floating_point else src


def write_weights(
    contents: CheckpointContents,
    config: dict,
    dtype: torch.dtype,
    dest: Path,
    max_shard_bytes: int,
    label: str,
    metadata: dict[str, str] | None = None,
) -> int:
    """Stream every tensor into safetensors shard(s) in ``dest``, each with ``metadata`` in its
    header; return the bytes written."""
    from tqdm import tqdm

    tensors, copies = output_tensors(contents, config)
    by_name = {t.name: t for t in tensors}
    specs = [TensorSpec(t.name, t.shape, _out_dtype(t.dtype, dtype)) for t in tensors]
    specs += [
        TensorSpec(a, by_name[s].shape, _out_dtype(by_name[s].dtype, dtype))
        for a, s in copies.items()
    ]
    shards = plan_shards(specs, max_shard_bytes)
    names = shard_file_names(len(shards))
    total = sum(s.nbytes for s in specs)
    with tqdm(
        total=total, unit="B", unit_scale=True, desc=f"{label}", leave=True, disable=None
    ) as bar:

        def produce(spec: TensorSpec) -> torch.Tensor:
            src = by_name[copies.get(spec.name, spec.name)]
            tensor = src.load().to(spec.dtype)
            bar.update(spec.nbytes)
            return tensor

        for shard, name in zip(shards, names):
            write_safetensors(dest / name, shard, produce, metadata)
    if len(shards) > 1:
        write_index(dest, shards, names)
    return total


# ----------------------------------------------------------------------------- one step


def build_folder(job: Job, opts: Options, tmp: Path) -> tuple[int, str]:
    """Fill ``tmp`` with the new Hugging Face folder of ``job``; return (bytes, summary note)."""
    tmp.mkdir(parents=True)
    config = copy_side_files(job, opts.base_model_dir, tmp)
    dtype = resolve_dtype(opts.dtype, config)
    contents = open_checkpoint(job.ckpt_dir)
    try:
        foreign = foreign_model(job.out_dir, contents, reference_config(job))
        if foreign:  # its config.json would be kept beside the checkpoint's weights
            raise CheckpointError(foreign)
        if not (job.out_dir / "config.json").is_file():  # the config comes from the base model
            check_against_reference(contents, opts.base_model_dir)
        # the record lets a later run tell this checkpoint's weights from another's
        record = {"format": "pt", **checkpoint_record(contents, job.ckpt_dir)}
        nbytes = write_weights(
            contents, config, dtype, tmp, opts.max_shard_bytes, job.label, record
        )
        contents.verify()  # CRCs of the records read: a damaged checkpoint is never published
    finally:
        contents.close()
    write_configs(tmp, config, dtype)
    kept = carry_user_files(job.out_dir, tmp)
    note = f"{contents.kind}, {contents.world_size} rank(s), {DTYPE_JSON[dtype]} -> {job.out_dir}"
    if kept:
        log.info("%s: kept files rft-convert does not write: %s", job.label, ", ".join(kept))
        note += f" (kept {', '.join(kept)})"
    return nbytes, note


def convert_job(job: Job, opts: Options) -> Outcome:
    """Convert one checkpoint; never raises for bad input (the outcome says what failed)."""
    start = time.monotonic()
    final = output_target(job.out_dir)  # a symlinked huggingface/ is written where it points
    tmp = tmp_name(final)
    try:
        if is_lora_checkpoint(job):
            return convert_lora(job, opts)  # the adapter folder, and --merge (rft.convert.adapter)
        recover(final)  # first, so that a skipped step leaves no debris either
        if weights_complete(final) and not opts.force:
            status, note = judge_complete(job)
            return Outcome(job.label, status, note, time.monotonic() - start)
        shutil.rmtree(tmp, ignore_errors=True)
        with storage_errors(job.out_dir):  # a full disk, a read-only folder: a message, no trace
            nbytes, note = build_folder(job, opts, tmp)
            publish_replacing(tmp, final)
        if opts.merge or opts.lora_alpha is not None:
            note += " (not a LoRA checkpoint: --merge and --lora-alpha do nothing)"
    except RftError as e:
        return Outcome(job.label, "failed", str(e), time.monotonic() - start)
    except Exception as e:  # an unexpected bug must not stop the other steps
        log.exception("%s: unexpected error", job.label)
        return Outcome(job.label, "failed", f"{type(e).__name__}: {e}", time.monotonic() - start)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone after a publish; debris after a failure
    return Outcome(job.label, "converted", note, time.monotonic() - start, nbytes)


# ----------------------------------------------------------------------------- command line


def summary_table(outcomes: list[Outcome]) -> str:
    """A plain-text table: one row per step, then totals per status."""
    rows = [("step", "status", "size", "time", "note")]
    for o in outcomes:
        size = f"{o.nbytes / 2**20:.1f} MiB" if o.nbytes else "-"
        rows.append((o.label, o.status, size, f"{o.seconds:.1f}s", o.note))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4] for r in rows]
    counts = {s: sum(o.status == s for o in outcomes) for s in ("converted", "skipped", "failed")}
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()))
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="rft-convert",
        description="Convert DeepSpeed ZeRO / FSDP checkpoints to Hugging Face safetensors "
        "(written to global_step_N/actor/huggingface/). LoRA checkpoints become a PEFT "
        "adapter folder there and, with --merge, a merged model in huggingface_merged/.",
    )
    p.add_argument(
        "--checkpoint-dir",
        required=True,
        type=Path,
        help="run directory, one global_step_N, a path inside one, or a bare checkpoint folder",
    )
    p.add_argument(
        "--base-model-dir",
        type=Path,
        default=None,
        help="HF model folder for config/tokenizer when the checkpoint lacks them; LoRA "
        "checkpoints: the base model (overrides adapter_config.json's "
        "base_model_name_or_path)",
    )
    p.add_argument(
        "--dtype",
        choices=["auto", *DTYPES],
        default="auto",
        help="output dtype of floating tensors (auto: as config.json declares; a LoRA "
        "adapter: as the shards hold it; a merged model: as the base's config)",
    )
    p.add_argument(
        "--steps", default=None, help="comma-separated step numbers to convert, e.g. 100,200"
    )
    p.add_argument(
        "--max-shard-size", default="5GB", help="largest safetensors file before sharding"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="reconvert steps whose huggingface/ (and huggingface_merged/) is complete",
    )
    p.add_argument(
        "--merge",
        action="store_true",
        help="LoRA checkpoints: also write actor/huggingface_merged/, the base model with "
        "the adapter merged in (a full HF model; the base model from "
        "adapter_config.json's base_model_name_or_path or --base-model-dir)",
    )
    p.add_argument(
        "--lora-alpha",
        type=int,
        default=None,
        help="LoRA checkpoints without adapter_config.json and without the run's "
        "config.yaml: the run's model.lora_configs[0].lora_alpha, to rebuild it",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p.parse_args(argv)


def _parse_steps(text: str | None) -> set[int] | None:
    if text is None:
        return None
    try:
        return {int(s) for s in text.split(",") if s.strip()}
    except ValueError as e:
        raise CheckpointError(
            f"--steps {text!r}: write step numbers separated by commas, e.g. 100,200"
        ) from e


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``bin/rft-convert``; returns the exit code."""
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        opts = Options(
            args.base_model_dir.resolve() if args.base_model_dir else None,
            args.dtype,
            parse_size(args.max_shard_size),
            args.force,
            args.merge,
            args.lora_alpha,
        )
        check_base_model(opts.base_model_dir)
        jobs = find_jobs(args.checkpoint_dir, _parse_steps(args.steps))
    except (RftError, ValueError) as e:
        print(f"rft-convert: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    if not jobs:
        print(f"rft-convert: no global_step_N folders under {args.checkpoint_dir}", file=sys.stderr)
        return EXIT_USER_ERROR
    outcomes = []
    for job in jobs:
        outcome = convert_job(job, opts)
        log.info("%s: %s %s", outcome.label, outcome.status, outcome.note)
        outcomes.append(outcome)
    print(summary_table(outcomes))
    return EXIT_FAILED if any(o.status == "failed" for o in outcomes) else EXIT_OK
