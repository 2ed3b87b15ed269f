"""Shared types of ``rft-convert``: one conversion's job, options and outcome, the output dtypes,
what a checkpoint reader returns, and the rank-file check.

A reader (:mod:`rft.convert.ds_reader`, :mod:`rft.convert.fsdp_reader`) returns a :class:`CheckpointContents`:
the model's full-size tensors as :class:`SourceTensor` records whose ``load()`` assembles the
tensor from the rank shards only when called, plus tied-weight aliases, the open files and the
integrity checks to run once every tensor has been loaded (:meth:`CheckpointContents.verify`).
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from rft.errors import CheckpointError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}  # --dtype choices
DTYPE_JSON = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def resolve_dtype(choice: str, config: dict) -> torch.dtype:
    """``auto``: the dtype config.json declares (fp32 when it declares none)."""
    if choice != "auto":
        return DTYPES[choice]
    declared = str(config.get("torch_dtype") or config.get("dtype") or "float32").replace(
        "torch.", ""
    )
    return {v: k for k, v in DTYPE_JSON.items()}.get(declared, torch.float32)


@dataclass(frozen=True)
class Job:
    """One checkpoint to convert: its label, the folder with the shards, where the output goes."""

    label: str
    step: int | None
    ckpt_dir: Path  # actor/ (or a DeepSpeed tag folder inside it)
    out_dir: Path  # .../actor/huggingface


@dataclass
class Outcome:
    label: str
    status: str  # converted | skipped | failed
    note: str = ""
    seconds: float = 0.0
    nbytes: int = 0


@dataclass(frozen=True)
class Options:
    base_model_dir: Path | None
    dtype: str  # auto | fp32 | bf16 | fp16
    max_shard_bytes: int
    force: bool
    merge: bool = False  # LoRA checkpoints: also write the merged model (rft.convert.adapter)
    lora_alpha: int | None = None  # LoRA: alpha for an adapter_config.json rebuilt from the shards


@dataclass
class SourceTensor:
    """One full tensor of the model, assembled from the shards by ``load()`` on demand."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    load: Callable[[], torch.Tensor]


@dataclass
class CheckpointContents:
    """What a reader found: unique tensors in module order and tied aliases (alias -> source)."""

    kind: str  # e.g. "deepspeed-zero3", "fsdp"
    world_size: int
    tensors: list[SourceTensor]
    aliases: dict[str, str] = field(default_factory=dict)
    stack: ExitStack = field(default_factory=ExitStack)  # open shard files; closed by close()
    # the checkpoint files read (their zip directories identify it: rft.convert.identity)
    files: list[Path] = field(default_factory=list)
    checks: list[Callable[[], None]] = field(
        default_factory=list
    )  # raise CheckpointError if damaged

    def verify(self) -> None:
        """Run the integrity checks (CRCs of the records read); call after loading every tensor."""
        for check in self.checks:
            check()

    def close(self) -> None:
        self.stack.close()


def check_ranks(files: dict[int, Path], world_size: int, folder: Path, example: str) -> list[Path]:
    """The shard paths in rank order; raise naming missing or surplus rank files."""
    missing = [r for r in range(world_size) if r not in files]
    if missing:
        names = ", ".join(example.format(r) for r in missing)
        raise CheckpointError(
            f"{folder}: missing rank shard(s) {names} (world size {world_size}); "
            "the save did not finish on every rank: use another step"
        )
    extra = sorted(r for r in files if r >= world_size)
    if extra:
        raise CheckpointError(
            f"{folder}: world-size mismatch: the checkpoint says {world_size} ranks but there are "
            f"shards for rank(s) {extra} ({files[extra[0]].name}); an older save with more ranks "
            "was overwritten in place: remove the extra files or use another step"
        )
    return [files[r] for r in range(world_size)]
