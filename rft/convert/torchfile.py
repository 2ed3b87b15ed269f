"""Lazy, read-only access to files written by ``torch.save`` (the zip format), without torch.load.

:func:`open_torch_file` unpickles only the object tree: each tensor becomes a :class:`LazyTensor`
that reads its bytes on demand with ``pread`` (a shard's Adam moments are never read), and every
record read is checked against the CRC-32 in the zip directory (:meth:`TorchArchive.verify`
finishes partly read ones), so a flipped bit fails naming file and record. Only a short list of
safe globals is resolved; any other class becomes an inert :class:`Opaque`: reading a checkpoint
never runs code from it.
"""

from __future__ import annotations

import collections
import ctypes
import math
import os
import pickle
import struct
import warnings
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Sequence

import torch

from rft.errors import CheckpointError

_LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")  # zip local file header, 30 bytes
_LOCAL_HEADER_MAGIC = 0x04034B50
_CRC_CHUNK_BYTES = 16 * 2**20  # bytes read at a time to check a part of a record the caller skipped

# Globals a checkpoint may name that are safe to construct for real.
_SAFE_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("collections", "defaultdict"): collections.defaultdict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "slice"): slice,
    ("builtins", "complex"): complex,
    ("torch", "Size"): torch.Size,
    ("torch", "device"): torch.device,
}


class Opaque:
    """Stand-in for a class the reader does not construct; keeps whatever the pickle gave it."""

    qualname = "?"
    args: tuple = ()  # class defaults: pickle's NEWOBJ makes instances without __init__
    kwargs: dict = {}
    state: Any = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs

    def __setstate__(self, state: Any) -> None:
        self.state = state

    @property
    def items(self) -> dict:
        return self.__dict__.setdefault("_items", {})

    def __setitem__(self, key: Any, value: Any) -> None:
        self.items[key] = value

    def append(self, value: Any) -> None:
        self.items[len(self.items)] = value

    def extend(self, values: Any) -> None:
        for v in values:
            self.append(v)

    def __int__(self) -> int:  # enums (e.g. DeepSpeed's ZeroStageEnum) pickle as cls(value)
        if len(self.args) != 1:
            raise TypeError(f"{self.qualname} is not an int-like enum")
        return int(self.args[0])

    def __repr__(self) -> str:
        return f"<opaque {self.qualname}{self.args!r}>"


def _opaque_class(module: str, name: str) -> type:
    return type("Opaque_" + name, (Opaque,), {"qualname": f"{module}.{name}"})


@dataclass(frozen=True)
class LazyStorage:
    """One storage record of the archive: ``numel`` elements of ``dtype`` at ``byte_offset``."""

    archive: TorchArchive
    byte_offset: int
    dtype: torch.dtype
    numel: int


@dataclass(frozen=True)
class LazyTensor:
    """A tensor whose bytes stay on disk until :meth:`read` or :meth:`load` is called."""

    storage: LazyStorage
    offset: int  # in elements, into the storage
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    @property
    def dtype(self) -> torch.dtype:
        return self.storage.dtype

    def numel(self) -> int:
        return math.prod(self.shape)

    def is_contiguous(self) -> bool:
        expected, acc = [], 1
        for size in reversed(self.shape):
            expected.append(acc)
            acc *= size
        return all(s == e or n == 1 for s, e, n in zip(self.stride, reversed(expected), self.shape))

    def read(self, start: int, count: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Elements ``[start, start+count)`` of the flattened (contiguous) tensor, as a 1-D tensor
        (read straight into ``out``, a contiguous 1-D tensor of ``count`` elements, if given)."""
        assert self.is_contiguous(), "flat reads need a contiguous tensor"
        if start < 0 or start + count > self.numel():
            raise CheckpointError(
                f"{self.storage.archive.path}: asked for elements [{start}, {start + count}) of a "
                f"tensor with {self.numel()}; the checkpoint's metadata and shards disagree "
                "(mixed or overwritten checkpoint?)"
            )
        return self.storage.archive.read_elements(self.storage, self.offset + start, count, out)

    def load(self) -> torch.Tensor:
        """The whole tensor with its shape (copies strided tensors into a contiguous one)."""
        if self.is_contiguous():
            return self.read(0, self.numel()).view(self.shape)
        span = 1 + sum((n - 1) * s for n, s in zip(self.shape, self.stride)) if self.numel() else 0
        flat = self.storage.archive.read_elements(self.storage, self.offset, span)
        return flat.as_strided(self.shape, self.stride).contiguous()


@dataclass
class _RecordCrc:
    """Running CRC-32 of one zip record over its bytes ``[0, done)``, compared once ``done == size``."""

    name: str
    start: int  # file offset of the record's first data byte
    size: int
    expected: int  # from the zip directory
    done: int = 0
    crc: int = 0


class TorchArchive:
    """An open ``torch.save`` zip file; LazyTensors read from it through one file handle."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._zip = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError) as e:
            raise CheckpointError(
                f"{path} is not a readable torch checkpoint ({e}); it is truncated or corrupt: "
                "re-save it, or convert only the other steps (--steps)"
            ) from e
        self._fd = os.open(path, os.O_RDONLY)
        self._size = os.fstat(self._fd).st_size
        self._infos = {i.filename: i for i in self._zip.infolist()}
        self._records: dict[int, zipfile.ZipInfo] = {}  # data offset -> record, for CRC checks
        self._crcs: dict[int, _RecordCrc] = {}  # data offset -> running CRC of records read
        self.prefix = self._find_prefix()

    def _find_prefix(self) -> str:
        for name in self._infos:
            if name.endswith("/data.pkl"):
                return name[: -len("data.pkl")]
        raise CheckpointError(f"{self.path} holds no data.pkl: not a file written by torch.save")

    def close(self) -> None:
        self._zip.close()
        os.close(self._fd)

    def __enter__(self) -> TorchArchive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def record_offset(self, name: str) -> int:
        """File offset of the first data byte of zip record ``name`` (stored uncompressed)."""
        info = self._infos.get(name)
        if info is None:
            raise CheckpointError(f"{self.path} lacks record {name}: the file is damaged")
        if info.compress_type != zipfile.ZIP_STORED:
            raise CheckpointError(
                f"{self.path}: record {name} is compressed; torch never does that"
            )
        header = os.pread(self._fd, _LOCAL_HEADER.size, info.header_offset)
        fields = _LOCAL_HEADER.unpack(header)
        if fields[0] != _LOCAL_HEADER_MAGIC:
            raise CheckpointError(f"{self.path}: bad zip header for {name}; the file is corrupt")
        name_len, extra_len = fields[9], fields[10]
        offset = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
        self._records[offset] = info
        return offset

    def read_elements(
        self, storage: LazyStorage, start: int, count: int, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``count`` elements of ``storage`` from element ``start``, read straight into a tensor."""
        if out is None:
            out = torch.empty(count, dtype=storage.dtype)
        assert out.is_contiguous() and out.numel() == count and out.dtype == storage.dtype
        nbytes = count * out.element_size()
        pos = storage.byte_offset + start * out.element_size()
        if pos + nbytes > self._size:
            raise CheckpointError(
                f"{self.path} ends at byte {self._size} but a tensor needs bytes up to "
                f"{pos + nbytes}: the file is truncated; re-save the checkpoint"
            )
        # A zero-copy byte view of the new tensor, so the read lands in place (no numpy needed).
        view = (
            memoryview((ctypes.c_char * nbytes).from_address(out.data_ptr())).cast("B")
            if nbytes
            else memoryview(b"")
        )
        done = 0
        while done < nbytes:
            got = os.preadv(self._fd, [view[done:]], pos + done)
            if got <= 0:
                raise CheckpointError(
                    f"{self.path}: short read at byte {pos + done}; truncated file"
                )
            done += got
        self._fold_crc(storage.byte_offset, pos, view)
        return out

    def _fold_crc(self, record_offset: int, pos: int, data: memoryview) -> None:
        """Add ``data``, just read at file offset ``pos``, to the running CRC of its record."""
        rec = self._crcs.get(record_offset)
        if rec is None:
            info = self._records[record_offset]
            rec = self._crcs[record_offset] = _RecordCrc(
                info.filename, record_offset, info.file_size, info.CRC
            )
        lo = pos - rec.start
        if lo > rec.done:  # the caller skipped bytes: read them once for the check
            self._crc_from_disk(rec, min(lo, rec.size))
        hi = min(lo + len(data), rec.size)
        if lo <= rec.done < hi:
            rec.crc = zlib.crc32(data[rec.done - lo : hi - lo], rec.crc)
            rec.done = hi
            self._compare_crc(rec)

    def _crc_from_disk(self, rec: _RecordCrc, end: int) -> None:
        while rec.done < end:
            chunk = os.pread(self._fd, min(_CRC_CHUNK_BYTES, end - rec.done), rec.start + rec.done)
            if not chunk:
                raise CheckpointError(
                    f"{self.path}: short read at byte {rec.start + rec.done}; truncated file"
                )
            rec.crc = zlib.crc32(chunk, rec.crc)
            rec.done += len(chunk)
        self._compare_crc(rec)

    def _compare_crc(self, rec: _RecordCrc) -> None:
        if rec.done == rec.size and rec.crc != rec.expected:
            raise CheckpointError(
                f"{self.path}: record {rec.name} fails its CRC-32 check (stored {rec.expected:08x}, "
                f"read {rec.crc:08x}): the checkpoint is damaged (a flipped bit or a bad copy); "
                "convert the previous checkpoint instead, or re-save this one"
            )

    def verify(self) -> None:
        """Check the CRC of every record read from so far, reading the parts the caller skipped."""
        for rec in self._crcs.values():
            if rec.done < rec.size:
                self._crc_from_disk(rec, rec.size)

    def load_tree(self) -> Any:
        """Unpickle ``data.pkl`` into plain containers with LazyTensors in place of tensors."""
        byteorder = self._infos.get(self.prefix + "byteorder")
        if byteorder is not None and self._zip.read(byteorder).strip() != b"little":
            raise CheckpointError(f"{self.path} was saved on a big-endian machine; not supported")
        with self._zip.open(self.prefix + "data.pkl") as f:
            try:
                return _LazyUnpickler(f, self).load()
            except (pickle.UnpicklingError, EOFError, zipfile.BadZipFile) as e:
                raise CheckpointError(f"{self.path}: cannot unpickle its data.pkl ({e})") from e


def _rebuild_tensor(
    storage: LazyStorage, offset: int, size: Sequence[int], stride: Sequence[int], *_: object
) -> LazyTensor:
    return LazyTensor(
        storage, int(offset), tuple(int(s) for s in size), tuple(int(s) for s in stride)
    )


def _rebuild_parameter(data: LazyTensor, *_: object) -> LazyTensor:
    return data


def _rebuild_from_type(
    func: Callable[..., LazyTensor], _new_type: object, args: tuple, _state: object
) -> LazyTensor:
    return func(*args)


_TENSOR_BUILDERS = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type,
}


class _LazyUnpickler(pickle.Unpickler):
    def __init__(self, f: IO[bytes], archive: TorchArchive) -> None:
        super().__init__(f)
        self.archive = archive
        self.storages: dict[str, LazyStorage] = {}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _TENSOR_BUILDERS:
            return _TENSOR_BUILDERS[(module, name)]
        if (module, name) in _SAFE_GLOBALS:
            return _SAFE_GLOBALS[(module, name)]
        if module == "torch" and (
            name.endswith("Storage") or isinstance(getattr(torch, name, None), torch.dtype)
        ):
            return getattr(torch, name)
        return _opaque_class(module, name)

    def persistent_load(self, saved_id: Any) -> LazyStorage:
        kind, storage_type, key, _location, numel = saved_id
        assert kind in ("storage", b"storage"), f"unknown persistent id {kind!r}"
        with warnings.catch_warnings():  # legacy typed storage classes warn when touched
            warnings.simplefilter("ignore")
            dtype = torch.uint8 if storage_type is torch.UntypedStorage else storage_type.dtype
        key = key.decode() if isinstance(key, bytes) else str(key)
        if key not in self.storages:
            offset = self.archive.record_offset(f"{self.archive.prefix}data/{key}")
            self.storages[key] = LazyStorage(self.archive, offset, dtype, int(numel))
        return self.storages[key]


def open_torch_file(path: Path | str) -> tuple[TorchArchive, Any]:
    """Open ``path`` and return (archive, object tree); close the archive when done reading."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist")
    if not zipfile.is_zipfile(path):
        raise CheckpointError(
            f"{path} is not a zip-format torch file: it is truncated, corrupt, or was saved with "
            "_use_new_zipfile_serialization=False; re-save it with a current torch"
        )
    archive = TorchArchive(path)
    try:
        return archive, archive.load_tree()
    except BaseException:
        archive.close()
        raise
