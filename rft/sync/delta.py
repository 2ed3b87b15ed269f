"""Delta folders: ``weights/v<N>/`` as the XOR of each tensor's bits against a full anchor.

Per tensor of each safetensors file: ``new ^ base`` viewed as the integers of its item size
(int16 for bf16, int32 for fp32), compressed with zstd, with the crc32 of the *result* (the new
tensor's bytes) so the reader checks what it rebuilt. :data:`DELTA_INDEX` names the base
(version and marker id: always a full anchor, so a chain is one link) and where each tensor's
frame lies in :data:`DELTA_PAYLOAD`. Pure functions on bytes and files; no run-directory logic.
"""

from __future__ import annotations

import base64
import json
import math
import shutil
import struct
import zlib
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
import zstandard

from rft import atomic
from rft.errors import CheckpointError
from rft.safetensors_io import is_weights_file, read_header
from rft.sync.versions import DELTA_INDEX, read_index

DELTA_PAYLOAD = "rft_delta.bin"  # the zstd frames, one per tensor, back to back
ZSTD_LEVEL = 1  # XOR of close weights is mostly zero bytes: level 1 already shrinks it ~all
_INT_VIEWS = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}  # item size -> XOR view


class DeltaError(CheckpointError):
    """A delta cannot be applied: its base is gone or differs, or a checksum does not match."""


def checksum(data: bytes | memoryview | np.ndarray) -> int:
    """crc32 of raw bytes (what a delta records for each rebuilt tensor)."""
    return zlib.crc32(memoryview(data).cast("B")) & 0xFFFFFFFF


def _ints(data: bytes | memoryview | np.ndarray, itemsize: int) -> np.ndarray:
    view = np.frombuffer(data, dtype=np.uint8)
    kind = _INT_VIEWS.get(itemsize, np.uint8)
    return view.view(kind) if view.size % np.dtype(kind).itemsize == 0 else view


def encode_bytes(new: Any, base: Any, itemsize: int) -> tuple[bytes, int]:
    """(zstd frame of ``new ^ base``, crc32 of ``new``): both the same number of bytes."""
    a, b = _ints(new, itemsize), _ints(base, itemsize)
    if a.nbytes != b.nbytes:
        raise ValueError(f"delta of {a.nbytes} bytes against a base of {b.nbytes}")
    frame = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True).compress(
        np.bitwise_xor(a, b).tobytes()
    )
    return frame, checksum(new)


def decode_bytes(frame: bytes, base: Any, itemsize: int, crc: int) -> np.ndarray:
    """The new bytes (uint8) from a frame and its base; DeltaError if the frame is damaged or the
    result's crc32 differs (a corrupt delta, or a base other than the one it was made against)."""
    b = _ints(base, itemsize)
    try:
        xor = zstandard.ZstdDecompressor().decompress(frame, max_output_size=b.nbytes)
    except zstandard.ZstdError as e:
        raise DeltaError(f"a delta frame is damaged ({e})") from e
    if len(xor) != b.nbytes:
        raise DeltaError(f"a delta frame holds {len(xor)} bytes, its base {b.nbytes}")
    out = np.bitwise_xor(_ints(xor, itemsize), b).view(np.uint8)
    if checksum(out) != crc:
        raise DeltaError("a rebuilt tensor's checksum does not match the delta's")
    return out


def _int_dtype(t: torch.Tensor) -> torch.dtype:
    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]


def encode_tensor(new: torch.Tensor, base: torch.Tensor) -> tuple[bytes, int]:
    """:func:`encode_bytes` of two tensors of one shape and dtype (bf16, fp16, fp32...)."""
    assert new.shape == base.shape and new.dtype == base.dtype, (new.shape, base.shape)
    raw = [t.contiguous().view(_int_dtype(t)).numpy() for t in (new, base)]
    return encode_bytes(raw[0], raw[1], new.element_size())


def decode_tensor(frame: bytes, base: torch.Tensor, crc: int) -> torch.Tensor:
    """The tensor :func:`encode_tensor` encoded, rebuilt bit for bit from ``base``."""
    raw = base.contiguous().view(_int_dtype(base)).numpy()
    out = decode_bytes(frame, raw, base.element_size(), crc)
    return torch.from_numpy(out.copy()).view(base.dtype).reshape(base.shape)


def _layout(path: Path) -> tuple[int, list[tuple[str, int, int, int]]]:
    """(data start, [(name, start, end, item size)]) of a safetensors file, by file offset."""
    header = read_header(path)
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
    start = 8 + length
    spans = []
    for name, v in header.items():
        if name == "__metadata__":
            continue
        a, b = (start + o for o in v["data_offsets"])
        count = math.prod(v["shape"])
        spans.append((a, b, name, (b - a) // count if count else 1))
    return start, [(name, a, b, size) for a, b, name, size in sorted(spans)]


def _read(f: BinaryIO, start: int, end: int) -> bytes:
    f.seek(start)
    data = f.read(end - start)
    if len(data) != end - start:
        raise DeltaError(f"{f.name} ends before byte {end}")
    return data


def _covers(path: Path, start: int, spans: list[tuple[str, int, int, int]]) -> bool:
    """Whether the tensors of a file follow its header back to back up to its end."""
    ends = [start] + [b for _n, _a, b, _s in spans]
    return all(a == end for (_n, a, _b, _s), end in zip(spans, ends)) and ends[-1] == (
        path.stat().st_size
    )


def weight_files(folder: Path) -> list[str]:
    return sorted(
        p.name for p in folder.iterdir() if p.suffix == ".safetensors" and is_weights_file(p.name)
    )


def encode_folder(new_dir: Path, base_dir: Path, out_dir: Path, base: dict[str, Any]) -> bool:
    """Write the delta of ``new_dir`` against ``base_dir`` (both full folders) into ``out_dir``:
    the index, the payload, and every other file of ``new_dir`` as it is. False (nothing written)
    when the weights' layout differs from the base's: then only a full folder will do.
    ``base``: what the index records of the base (``version``, ``id``)."""
    names = weight_files(new_dir)
    if not names or names != weight_files(base_dir):
        return False
    layouts = {n: (_layout(new_dir / n), _layout(base_dir / n)) for n in names}
    if any(new != old for new, old in layouts.values()):
        return False  # names, shapes, dtypes or offsets changed
    if not all(_covers(new_dir / n, *layouts[n][0]) for n in names):
        return False  # bytes between tensors: a rebuild from head + tensors would miss them
    index: dict[str, Any] = {"base_version": base["version"], "base_id": base["id"], "files": {}}
    offset = 0
    with open(out_dir / DELTA_PAYLOAD, "wb") as payload:
        for name in names:
            (start, spans), _ = layouts[name]
            with open(new_dir / name, "rb") as new, open(base_dir / name, "rb") as old:
                tensors = []
                for tensor, a, b, itemsize in spans:
                    frame, crc = encode_bytes(_read(new, a, b), _read(old, a, b), itemsize)
                    payload.write(frame)
                    tensors.append([tensor, a, b, itemsize, offset, len(frame), crc])
                    offset += len(frame)
                head = _read(new, 0, start)
            index["files"][name] = {
                "head": base64.b64encode(head).decode(),
                "size": (new_dir / name).stat().st_size,
                "tensors": tensors,
            }
    for path in new_dir.iterdir():
        if path.is_file() and path.name not in names:
            shutil.copy2(path, out_dir / path.name)
    (out_dir / DELTA_INDEX).write_text(json.dumps(index))
    return True


def apply_folder(delta_dir: Path, base_dir: Path, out_dir: Path) -> None:
    """Rebuild the full folder ``delta_dir`` encodes into ``out_dir`` (created: it must not
    exist; filled under a temporary name, renamed last), checking every tensor's crc32.
    DeltaError (and no ``out_dir``) on any mismatch, missing base file or damaged frame."""
    index = read_index(delta_dir)
    if index is None:
        raise DeltaError(f"{delta_dir} has no readable {DELTA_INDEX}")
    tmp = atomic.tmp_name(out_dir)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        with open(delta_dir / DELTA_PAYLOAD, "rb") as payload:
            for name, entry in index["files"].items():
                if (base_dir / name).stat().st_size != entry["size"]:
                    raise DeltaError(f"{base_dir / name} is not the base this delta was made from")
                with open(base_dir / name, "rb") as base, open(tmp / name, "wb") as out:
                    out.write(base64.b64decode(entry["head"]))
                    for _tensor, a, b, itemsize, offset, length, crc in entry["tensors"]:
                        frame = _read(payload, offset, offset + length)
                        out.write(decode_bytes(frame, _read(base, a, b), itemsize, crc))
        for path in delta_dir.iterdir():
            if path.is_file() and path.name not in (DELTA_INDEX, DELTA_PAYLOAD):
                if path.name not in index["files"]:
                    shutil.copy2(path, tmp / path.name)
        atomic.publish_dir(tmp, out_dir)
    except (OSError, KeyError, ValueError, TypeError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise DeltaError(f"cannot rebuild {delta_dir} from {base_dir} ({e})") from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
