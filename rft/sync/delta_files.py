"""Delta folders: ``weights/v<N>/`` as per-tensor frames (:mod:`rft.sync.delta`) against an anchor.

The trainer streams each weight file through :class:`DeltaEncoder` (``write_file``: the
signature of :func:`~rft.safetensors_io.write_safetensors`), coding every tensor as it comes
against the anchor's bytes in host RAM (:class:`Anchor`): no full file is written. The index
(:data:`DELTA_INDEX`) names the base (version, marker id) and each tensor's frame in
:data:`DELTA_PAYLOAD`. A reader applies the frames in place to a full copy of the anchor
(:func:`apply_delta`), checking each frame's crc32 before it writes. No run-directory logic.
"""

from __future__ import annotations

import base64
import math
import shutil
import struct
from collections import deque
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator

import numpy as np

from rft import atomic
from rft.errors import CheckpointError, DeltaError
from rft.safetensors_io import (
    TensorSpec,
    header_bytes,
    is_weights_file,
    read_header,
    write_safetensors,
)
from rft.sync.delta import Frame, apply, encode, new_buffer, tensor_bytes
from rft.sync.versions import COMPLETE_MARKER, DELTA_INDEX, index_text, read_index, read_marker

DELTA_PAYLOAD = "rft_delta.bin"  # the zstd frames, one per tensor, back to back
CODER_THREADS = 2  # tensors coded at once (zstd, numpy and crc32 release the GIL)
IN_FLIGHT = 4  # tensors handed to the coders and not yet written (each held in memory)
WriteFile = Callable[[Path, list[TensorSpec], Callable[[TensorSpec], Any]], None]
Dirty = dict[str, "np.ndarray | None"]  # tensor -> where a copy differs from the anchor
_EQUAL = np.empty(0, dtype=np.int64)  # a tensor missing from a Dirty map equals the anchor's


def weight_files(folder: Path) -> list[str]:
    return sorted(
        p.name for p in folder.iterdir() if p.suffix == ".safetensors" and is_weights_file(p.name)
    )


class Anchor:
    """The bytes of every weight file of the trainer's last full version, in host RAM: one
    copy, its buffers reused by the next anchor of the same sizes (no page faults)."""

    def __init__(self) -> None:
        self.files: dict[str, np.ndarray] = {}  # file name -> its bytes, header included
        self._spare: dict[str, np.ndarray] = {}

    def begin(self) -> None:
        """A new anchor is being written: the old one's buffers become spares."""
        self._spare, self.files = {**self._spare, **self.files}, {}

    def end(self) -> None:
        self._spare = {}  # buffers the new anchor did not reuse: freed

    def _buffer(self, name: str, nbytes: int) -> np.ndarray:
        buf = self._spare.pop(name, None)
        self.files[name] = buf if buf is not None and buf.size == nbytes else new_buffer(nbytes)
        return self.files[name]

    def write_file(self, path: Path, specs: list[TensorSpec], produce: Callable) -> None:
        """A :data:`WriteFile`: write the file in full, keeping its bytes."""
        head = header_bytes(specs)
        buf = self._buffer(path.name, len(head) + sum(s.nbytes for s in specs))
        buf[: len(head)] = np.frombuffer(head, np.uint8)
        offsets = dict(zip((s.name for s in specs), _starts(len(head), specs)))

        def keep(spec: TensorSpec) -> Any:
            tensor = produce(spec)
            raw = tensor_bytes(tensor)
            buf[offsets[spec.name] : offsets[spec.name] + raw.size] = raw
            return tensor

        write_safetensors(path, specs, keep)

    def read_file(self, path: Path) -> None:
        """Keep the bytes of a full weight file written by other means."""
        with open(path, "rb") as f:
            buf = self._buffer(path.name, path.stat().st_size)
            if f.readinto(memoryview(buf)) != buf.size:
                raise CheckpointError(f"{path} changed size while being read")


def _starts(head_len: int, specs: list[TensorSpec]) -> list[int]:
    return [head_len + s for s in np.cumsum([0] + [s.nbytes for s in specs[:-1]]).tolist()]


class DeltaEncoder:
    """One delta folder being written into ``out_dir``: each weight file's tensors coded
    against ``anchor`` on ``pool`` as they come, frames appended to the payload in order;
    :meth:`finish` writes the index. A file whose layout differs from the anchor's (names,
    shapes, dtypes, offsets) is written in full; the folder stays a delta for the others."""

    def __init__(self, out_dir: Path, anchor: Anchor, pool: Executor):
        self.out_dir, self.anchor, self.pool = out_dir, anchor, pool
        self.payload = open(out_dir / DELTA_PAYLOAD, "wb")
        self.offset = 0
        self.files: dict[str, Any] = {}

    def write_file(self, path: Path, specs: list[TensorSpec], produce: Callable) -> None:
        """A :data:`WriteFile`: ``path``'s tensors as frames (its name is what counts)."""
        head = header_bytes(specs)
        size = len(head) + sum(s.nbytes for s in specs)
        if not self._matches(path.name, head, size):
            write_safetensors(path, specs, produce)
            return

        def tensors() -> Iterator[tuple[str, int, int, np.ndarray]]:
            for spec, start in zip(specs, _starts(len(head), specs)):
                tensor = produce(spec)  # the gather: on this thread, in step with other ranks
                if tuple(tensor.shape) != spec.shape or tensor.dtype != spec.dtype:
                    raise CheckpointError(
                        f"{spec.name}: produced {tuple(tensor.shape)} {tensor.dtype}, "
                        f"expected {spec.shape} {spec.dtype}"
                    )
                yield spec.name, start, tensor.element_size(), tensor_bytes(tensor)

        self._code(path.name, head, size, tensors())

    def copy_file(self, path: Path) -> None:
        """A full weight file written elsewhere: coded from its bytes (mapped, not read in)."""
        start, spans = _layout(path)
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(start)
        covered = [start] + [b for _n, _a, b, _s in spans]
        back_to_back = all(a == end for (_n, a, _b, _s), end in zip(spans, covered))
        if not back_to_back or covered[-1] != size or not self._matches(path.name, head, size):
            shutil.copyfile(path, self.out_dir / path.name)
            return
        data = np.memmap(path, dtype=np.uint8, mode="r") if size else np.empty(0, np.uint8)
        self._code(path.name, head, size, ((n, a, s, data[a:b]) for n, a, b, s in spans))

    def _matches(self, name: str, head: bytes, size: int) -> bool:
        buf = self.anchor.files.get(name)
        return buf is not None and buf.size == size and buf[: len(head)].tobytes() == head

    def _code(self, name: str, head: bytes, size: int, tensors: Iterable) -> None:
        base = self.anchor.files[name]
        pending: deque[tuple[list, Future]] = deque()
        rows: list[list] = []
        try:
            for tensor, start, itemsize, new in tensors:
                end = start + new.size
                job = self.pool.submit(encode, new, base[start:end], itemsize)
                pending.append(([tensor, start, end, itemsize], job))
                while len(pending) > IN_FLIGHT:
                    self._write(*pending.popleft(), rows)
            while pending:
                self._write(*pending.popleft(), rows)
        finally:
            for _row, job in pending:  # an error: no coder still reads a tensor after this
                job.cancel() or job.exception()
        self.files[name] = {"head": base64.b64encode(head).decode(), "size": size, "tensors": rows}

    def _write(self, row: list, job: Future, rows: list[list]) -> None:
        frame: Frame = job.result()
        self.payload.write(frame.data)
        rows.append(row + [self.offset, len(frame.data), frame.crc, frame.kind])
        self.offset += len(frame.data)

    def finish(self, base: dict[str, Any]) -> None:
        """Write the index; ``base``: what it records of the anchor (``version``, ``id``)."""
        self.payload.close()
        index = {"base_version": base["version"], "base_id": base["id"], "files": self.files}
        (self.out_dir / DELTA_INDEX).write_text(index_text(index))

    def close(self) -> None:
        self.payload.close()


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


class FileMaps:
    """Memory maps of weight files, kept open from version to version. A write through a new
    map of a file faults once per 4 KiB page, and a sparse delta (1% of bf16 elements) touches
    nearly every page: on the 2-core VM, 1 M scattered writes to 310 MiB took 0.12 s through a
    new map, 0.004 s through one kept open (until the kernel writes the pages back, after
    ``vm.dirty_expire_centisecs``, 30 s: then they fault again; never on tmpfs)."""

    def __init__(self) -> None:
        self._maps: dict[Path, tuple[tuple[int, int, int], np.ndarray]] = {}

    def get(self, path: Path, writable: bool) -> np.ndarray:
        """A uint8 map of ``path`` (a kept one if the file is still the one it maps)."""
        st = path.stat()
        ident = (st.st_dev, st.st_ino, st.st_size)
        kept = self._maps.get(path)
        if kept is None or kept[0] != ident or (writable and not kept[1].flags.writeable):
            data = np.memmap(path, dtype=np.uint8, mode="r+" if writable else "r")
            self._maps[path] = kept = (ident, data)
        return kept[1]

    def drop(self, path: Path | None = None) -> None:
        """Forget the map of ``path`` (before it is truncated or replaced), or of every file."""
        if path is None:
            self._maps.clear()
        else:
            self._maps.pop(path, None)


def apply_delta(
    delta_dir: Path,
    index: dict[str, Any],
    base_dir: Path,
    out_dir: Path,
    dirty: dict[str, Dirty],
    pool: Executor,
    maps: FileMaps | None = None,
) -> None:
    """Make ``out_dir`` (a full copy of ``base_dir``, then changed only by this function) hold
    the folder ``delta_dir`` encodes, rewriting its files in place (through ``maps``).

    ``dirty``: per weight file of ``out_dir``, where it differs from the base (a file missing
    from it is copied from the base first); updated. The caller checked that ``base_dir`` is
    the base the index names. DeltaError on a base file of another size or a frame whose crc32
    differs: ``out_dir`` may then hold a mix (drop ``dirty``: rebuild it from the base).
    """
    maps = FileMaps() if maps is None else maps
    try:
        with open(delta_dir / DELTA_PAYLOAD, "rb") as payload:
            for name, entry in index["files"].items():
                out = out_dir / name
                if name not in dirty or not out.is_file() or out.stat().st_size != entry["size"]:
                    maps.drop(out)
                    shutil.copyfile(base_dir / name, out)
                    dirty[name] = {}
                base = maps.get(base_dir / name, writable=False)
                _apply_file(payload, entry, base, maps.get(out, writable=True), dirty[name], pool)
        kept = set(index["files"]) | {DELTA_INDEX, DELTA_PAYLOAD}
        for path in delta_dir.iterdir():  # config, tokenizer, a file written in full
            if path.is_file() and path.name not in kept:
                maps.drop(out_dir / path.name)
                shutil.copyfile(path, out_dir / path.name)
                dirty.pop(path.name, None)
        for name in weight_files(out_dir):  # an anchor's shard this version does not have
            if not (delta_dir / name).exists() and name not in index["files"]:
                maps.drop(out_dir / name)
                (out_dir / name).unlink()
                dirty.pop(name, None)
    except (OSError, KeyError, ValueError, TypeError) as e:
        raise DeltaError(f"cannot rebuild {delta_dir} from {base_dir} ({e})") from e


def _apply_file(
    payload: BinaryIO, entry: dict[str, Any], base: np.ndarray, out: np.ndarray, dirty: Dirty, pool
) -> None:
    if base.size != entry["size"]:
        raise DeltaError(f"{base.filename} is not the base this delta was made from")
    head = base64.b64decode(entry["head"])
    out[: len(head)] = np.frombuffer(head, np.uint8)
    jobs = []
    for tensor, a, b, itemsize, offset, length, crc, kind in entry["tensors"]:
        payload.seek(offset)
        data = payload.read(length)
        if len(data) != length:
            raise DeltaError(f"{payload.name} ends before byte {offset + length}")
        frame = Frame(kind, data, crc)
        jobs.append(
            (
                tensor,
                pool.submit(apply, frame, base[a:b], out[a:b], itemsize, dirty.get(tensor, _EQUAL)),
            )
        )
    errors = [job.exception() for _t, job in jobs]  # every job ends before anything is raised
    for (tensor, job), error in zip(jobs, errors):
        if error is None:
            dirty[tensor] = job.result()
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first


def apply_folder(delta_dir: Path, base_dir: Path, out_dir: Path) -> None:
    """Rebuild the full folder ``delta_dir`` encodes into ``out_dir`` (created: it must not
    exist; filled under a temporary name, renamed last), checking that ``base_dir`` is the
    anchor the index names and every frame's crc32. DeltaError (and no ``out_dir``) on another
    base, a missing base file or a damaged frame."""
    from concurrent.futures import ThreadPoolExecutor

    index = read_index(delta_dir)
    if index is None:
        raise DeltaError(f"{delta_dir} has no readable {DELTA_INDEX}")
    marker = read_marker(base_dir)
    if marker is None or marker.get("id") != index["base_id"]:
        raise DeltaError(f"{base_dir} is not the anchor {delta_dir} was made against")
    tmp = atomic.tmp_name(out_dir)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        shutil.copytree(base_dir, tmp, ignore=shutil.ignore_patterns(COMPLETE_MARKER))
        with ThreadPoolExecutor(CODER_THREADS) as pool:
            dirty: dict[str, Dirty] = {name: {} for name in weight_files(tmp)}
            apply_delta(delta_dir, index, base_dir, tmp, dirty, pool)
        atomic.publish_dir(tmp, out_dir)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise DeltaError(f"cannot rebuild {delta_dir} from {base_dir} ({e})") from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
