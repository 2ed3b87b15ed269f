"""Reader for FSDP checkpoints of Trinity-RFT / veRL: ``model_world_size_{W}_rank_{R}.pt``.

Each rank's file is a ``torch.save``-d sharded state dict (FSDP2 / FSDP1-with-mesh DTensor
values, or FSDP1 ShardedTensor values). Files are loaded memory-mapped (``torch.load``, so
only trusted checkpoints) and each tensor is assembled from the rank pieces on demand, using
the placements and mesh stored with it. Tied weights show up as two keys sharing storage;
the later one becomes an alias. Data leaves as a :class:`rft.convert.types.CheckpointContents`.
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path
from typing import Any, Callable

import torch

from rft.convert.types import CheckpointContents, SourceTensor, check_ranks
from rft.errors import CheckpointError, NotSupportedError

FSDP_FILE_RE = re.compile(r"^model_world_size_(\d+)_rank_(\d+)\.pt$")
_WRAPPER_PREFIXES = ("_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


def read_fsdp(folder: Path) -> CheckpointContents:
    """Open ``model_world_size_W_rank_R.pt`` files (Trinity-RFT / veRL FSDP1 or FSDP2 checkpoints)."""
    found: dict[int, dict[int, Path]] = {}
    for p in folder.glob("model_world_size_*_rank_*.pt"):
        m = FSDP_FILE_RE.match(p.name)
        if m:
            found.setdefault(int(m.group(1)), {})[int(m.group(2))] = p
    if len(found) > 1:
        raise CheckpointError(
            f"{folder}: world-size mismatch: shard files for world sizes {sorted(found)} are "
            "mixed; remove the files of the older save"
        )
    world_size, files = next(iter(found.items()))
    paths = check_ranks(files, world_size, folder, f"model_world_size_{world_size}_rank_{{}}.pt")
    shards = [_load_fsdp_file(p) for p in paths]
    contents = CheckpointContents(kind="fsdp", world_size=world_size, tensors=[], files=paths)
    seen: dict[tuple, str] = {}
    for key, value in shards[0].items():
        if not isinstance(value, torch.Tensor):
            continue
        name = _strip_wrappers(key)
        ident = _storage_identity(value)
        if ident in seen:
            contents.aliases[name] = seen[ident]
            continue
        seen[ident] = name
        values = [s.get(key) for s in shards]
        if any(v is None for v in values):
            raise CheckpointError(
                f"{paths[values.index(None)]} lacks {key}, which rank 0 has; mixed saves?"
            )
        contents.tensors.append(
            SourceTensor(
                name, tuple(value.shape), _local(value).dtype, _fsdp_loader(values, paths, key)
            )
        )
    return contents


def _load_fsdp_file(path: Path) -> dict:
    # DTensor values unpickle their DeviceMesh without process groups (fine for reading); torch
    # warns about that once per mesh, which is noise here.
    logging.getLogger("torch.distributed.device_mesh").setLevel(logging.ERROR)
    try:
        sd = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
    except Exception as e:  # torch raises RuntimeError/EOFError/pickle errors for damaged files
        raise CheckpointError(
            f"{path} cannot be read ({type(e).__name__}: {e}); truncated or corrupt"
        ) from e
    if not isinstance(sd, dict):
        raise CheckpointError(f"{path} holds a {type(sd).__name__}, not a state dict")
    return sd


def _strip_wrappers(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def _local(value: torch.Tensor) -> torch.Tensor:
    if hasattr(value, "_local_tensor"):
        return value._local_tensor
    if hasattr(value, "local_shards"):
        shards = value.local_shards()
        return shards[0].tensor if shards else torch.empty(0)
    return value


def _storage_identity(value: torch.Tensor) -> tuple:
    t = _local(value)
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(value.shape))


def _fsdp_loader(
    values: list[torch.Tensor], paths: list[Path], key: str
) -> Callable[[], torch.Tensor]:
    def load() -> torch.Tensor:
        first = values[0]
        if hasattr(first, "placements"):
            return _assemble_dtensor(values, paths, key)
        if hasattr(first, "local_shards"):
            return _assemble_sharded_tensor(values, paths, key)
        return first.detach().clone()  # a replicated plain tensor

    return load


def _dtensor_box(
    shape: list[int], mesh: torch.Tensor, placements: Any, rank: int
) -> tuple[list, list, bool]:
    """(offsets, sizes, is_primary) of ``rank``'s local piece, following DTensor's chunk rule."""
    coord = [int(c) for c in (mesh == rank).nonzero()[0]]
    offsets, sizes, primary = [0] * len(shape), list(shape), True
    for dim, placement in enumerate(placements):
        n, idx = mesh.shape[dim], coord[dim]
        if hasattr(placement, "dim") and type(placement).__name__.endswith("Shard"):
            d = placement.dim
            chunk = math.ceil(sizes[d] / n)
            start = min(idx * chunk, sizes[d])
            offsets[d] += start
            sizes[d] = max(0, min(chunk, sizes[d] - start))
        elif type(placement).__name__ == "Replicate":
            primary = primary and idx == 0
        else:
            raise NotSupportedError(
                f"DTensor placement {placement} is not supported; save with Shard/Replicate"
            )
    return offsets, sizes, primary


def _assemble_dtensor(values: list[torch.Tensor], paths: list[Path], key: str) -> torch.Tensor:
    first = values[0]
    out = torch.empty(tuple(first.shape), dtype=first._local_tensor.dtype)
    mesh = first.device_mesh.mesh
    filled = 0
    for rank, (v, path) in enumerate(zip(values, paths)):
        offsets, sizes, primary = _dtensor_box(list(first.shape), mesh, first.placements, rank)
        local = v._local_tensor
        if list(local.shape) != sizes:
            raise CheckpointError(
                f"{path}: {key} has local shape {list(local.shape)} but rank {rank} of this "
                f"mesh should hold {sizes}; the files come from different saves"
            )
        if primary and local.numel():
            out[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))] = local
            filled += local.numel()
    if filled != out.numel():
        raise CheckpointError(
            f"{paths[0].parent}: the shards of {key} cover {filled} of {out.numel()} elements"
        )
    return out


def _assemble_sharded_tensor(
    values: list[torch.Tensor], paths: list[Path], key: str
) -> torch.Tensor:
    first = values[0]
    out = torch.empty(tuple(first.size()), dtype=_local(first).dtype)
    filled = 0
    for v in values:
        for shard in v.local_shards():
            md = shard.metadata
            out[tuple(slice(o, o + s) for o, s in zip(md.shard_offsets, md.shard_sizes))] = (
                shard.tensor
            )
            filled += shard.tensor.numel()
    if filled != out.numel():
        raise CheckpointError(
            f"{paths[0].parent}: the shards of {key} cover {filled} of {out.numel()} elements"
        )
    return out
