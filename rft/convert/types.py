"""Shared types of the checkpoint readers: what a reader returns, and the rank-file check.

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
    checks: list[Callable[[], None]] = field(default_factory=list)  # raise CheckpointError if damaged

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
        raise CheckpointError(f"{folder}: missing rank shard(s) {names} (world size {world_size}); "
                              "the save did not finish on every rank: use another step")
    extra = sorted(r for r in files if r >= world_size)
    if extra:
        raise CheckpointError(
            f"{folder}: world-size mismatch: the checkpoint says {world_size} ranks but there are "
            f"shards for rank(s) {extra} ({files[extra[0]].name}); an older save with more ranks "
            "was overwritten in place: remove the extra files or use another step"
        )
    return [files[r] for r in range(world_size)]

