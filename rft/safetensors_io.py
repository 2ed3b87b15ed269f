"""Streaming safetensors writer and completeness checks for Hugging Face weight folders.

:func:`write_safetensors` takes :class:`TensorSpec` s and a callback that produces each tensor,
and writes ``model.safetensors`` (or ``model-0000k-of-0000n.safetensors`` and the index) holding
one tensor in memory at a time. :func:`safetensors_problem` / :func:`weights_complete`,
:func:`weight_shapes` and :func:`is_weights_file` read headers and names only.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch

from rft.errors import CheckpointError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_SHARD_RE = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")  # the names of shard_file_names

_DTYPE_NAMES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


@dataclass(frozen=True)
class TensorSpec:
    """What one output tensor will be: its name, shape and dtype (known before reading data)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()


def parse_size(text: str) -> int:
    """Bytes from ``"5GB"``, ``"500MB"``, ``"2GiB"`` or a plain integer."""
    units = {
        "": 1,
        "B": 1,
        "KB": 10**3,
        "MB": 10**6,
        "GB": 10**9,
        "TB": 10**12,
        "KIB": 2**10,
        "MIB": 2**20,
        "GIB": 2**30,
        "TIB": 2**40,
    }
    s = text.strip().upper()
    digits = s.rstrip("KMGTIB")
    try:
        return int(float(digits) * units[s[len(digits) :]])
    except (ValueError, KeyError) as e:
        raise ValueError(f"cannot read size {text!r}; write e.g. 5GB, 500MB or 2GiB") from e


def plan_shards(specs: list[TensorSpec], max_shard_bytes: int) -> list[list[TensorSpec]]:
    """Split ``specs`` in order into shards of at most ``max_shard_bytes`` (a bigger tensor alone)."""
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        if shards[-1] and size + spec.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += spec.nbytes
    return shards


def shard_file_names(n_shards: int) -> list[str]:
    """Hugging Face's names: one ``model.safetensors``, or ``model-00001-of-0000n.safetensors``."""
    if n_shards == 1:
        return [SINGLE_FILE]
    return [f"model-{i:05d}-of-{n_shards:05d}.safetensors" for i in range(1, n_shards + 1)]


def is_weights_file(name: str) -> bool:
    """Whether ``name`` is a weight file of a Hugging Face folder as this module writes them
    (a reconversion replaces these; any other file in the folder is the user's)."""
    return name in (SINGLE_FILE, INDEX_FILE) or _SHARD_RE.match(name) is not None


def _header(specs: Iterable[TensorSpec], metadata: dict[str, str]) -> bytes:
    entries: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for spec in specs:
        if spec.dtype not in _DTYPE_NAMES:
            raise CheckpointError(
                f"tensor {spec.name} has dtype {spec.dtype}, which safetensors cannot hold"
            )
        entries[spec.name] = {
            "dtype": _DTYPE_NAMES[spec.dtype],
            "shape": list(spec.shape),
            "data_offsets": [offset, offset + spec.nbytes],
        }
        offset += spec.nbytes
    raw = json.dumps(entries, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw


def header_bytes(specs: Iterable[TensorSpec], metadata: dict[str, str] | None = None) -> bytes:
    """The header :func:`write_safetensors` writes for ``specs`` (length prefix included)."""
    return _header(specs, metadata or {"format": "pt"})


def _write_tensor(f, tensor: torch.Tensor) -> None:
    tensor = tensor.contiguous()
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes:
        f.write(memoryview((ctypes.c_char * nbytes).from_address(tensor.data_ptr())))


def write_safetensors(
    path: Path,
    specs: list[TensorSpec],
    produce: Callable[[TensorSpec], torch.Tensor],
    metadata: dict[str, str] | None = None,
) -> None:
    """Write one safetensors file, producing each tensor only when its turn comes; fsynced."""
    # The format: an 8-byte little-endian header length, a JSON header naming every tensor's
    # dtype, shape and byte range, then the raw bytes. The specs know all of it before any
    # tensor exists, so the header goes first and each tensor follows as it is produced.
    with open(path, "wb") as f:
        f.write(header_bytes(specs, metadata))
        for spec in specs:
            tensor = produce(spec)
            if tuple(tensor.shape) != spec.shape or tensor.dtype != spec.dtype:
                raise CheckpointError(
                    f"{spec.name}: produced {tuple(tensor.shape)} {tensor.dtype}, expected "
                    f"{spec.shape} {spec.dtype}; the checkpoint's metadata and data disagree"
                )
            _write_tensor(f, tensor)
            del tensor
        f.flush()
        os.fsync(f.fileno())


def write_index(folder: Path, shards: list[list[TensorSpec]], names: list[str]) -> None:
    """Write ``model.safetensors.index.json`` mapping every tensor to its shard file."""
    weight_map = {spec.name: name for shard, name in zip(shards, names) for spec in shard}
    total = sum(spec.nbytes for shard in shards for spec in shard)
    text = json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2, sort_keys=True
    )
    (folder / INDEX_FILE).write_text(text + "\n")


def read_header(path: Path) -> dict:
    """The JSON header of a safetensors file; raises CheckpointError if it is not one."""
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > 100 * 2**20:
                raise ValueError("header length is implausible")
            return json.loads(f.read(length))
    except (OSError, ValueError, struct.error) as e:
        raise CheckpointError(f"{path} is not a readable safetensors file ({e})") from e


def file_problem(path: Path) -> str | None:
    """Why ``path`` is not a whole safetensors file (missing, empty, no header, shorter than
    its header says), or None: the 8-byte header length and the JSON header are read, no data."""
    if not path.is_file():
        return f"{path.name} is missing"
    size = path.stat().st_size
    if size == 0:
        return f"{path.name} is empty (0 bytes)"
    try:
        header = read_header(path)
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    except (CheckpointError, AttributeError, KeyError, IndexError, TypeError) as e:
        return f"{path.name} has no readable safetensors header ({e.__cause__ or e})"
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
    needed = 8 + length + max(ends, default=0)
    if size < needed:
        return f"{path.name} is truncated ({size} of {needed} bytes)"
    return None


def file_complete(path: Path) -> bool:
    """True if ``path`` is a safetensors file whose size covers every tensor its header lists."""
    return file_problem(path) is None


def safetensors_problem(folder: Path) -> str | None:
    """Why the safetensors weights of ``folder`` are not whole (the index names a shard that is
    missing or damaged, or the single file is), or None (also when it holds none)."""
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            return f"{INDEX_FILE} is not a readable index ({type(e).__name__}: {e})"
        if not files:
            return f"{INDEX_FILE} names no shard files"
        missing = [name for name in files if not (folder / name).is_file()]
        if missing:
            return (
                f"{INDEX_FILE} names {len(files)} shard(s) of which {len(missing)} are "
                f"missing ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})"
            )
        return next(filter(None, (file_problem(folder / name) for name in files)), None)
    if (folder / SINGLE_FILE).is_file():
        return file_problem(folder / SINGLE_FILE)
    return None


def weights_complete(folder: Path) -> bool:
    """True if ``folder`` holds whole safetensors weights: a single file, or an index and all shards."""
    if not (folder / INDEX_FILE).is_file() and not (folder / SINGLE_FILE).is_file():
        return False
    return safetensors_problem(folder) is None


def weight_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of the safetensors weights in ``folder`` (headers only; {} if none)."""
    index = folder / INDEX_FILE
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = [SINGLE_FILE] if (folder / SINGLE_FILE).is_file() else []
    shapes = {}
    for name in files:
        header = read_header(folder / name)
        shapes.update({k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"})
    return shapes
