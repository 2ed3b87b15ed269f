"""Atomic publishing on shared filesystems (NFS, Lustre, GPFS): no locks, no shared appends.

A file is written as ``X.tmp.<host>.<pid>``, flushed, fsynced and renamed to ``X``; a folder is
filled under a temporary name, its files fsynced, then renamed. Readers never open names that
contain ``.tmp``. A pointer file is replaced the same way, only after what it points to is
complete, so a reader that follows the pointer always finds a whole object.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any, Callable, Iterable

from rft.errors import CheckpointError, storage_errors

TMP_MARK = ".tmp"


def tmp_name(path: Path) -> Path:
    """A temporary sibling of ``path``, unique per host and process (no two writers collide)."""
    return path.with_name(f"{path.name}{TMP_MARK}.{socket.gethostname()}.{os.getpid()}")


def is_tmp(path: Path | str) -> bool:
    """True for names written by :func:`tmp_name` (readers skip them)."""
    return TMP_MARK in Path(path).name


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in ``path`` durable (a no-op where dirs cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the rename is still atomic
    finally:
        os.close(fd)


def write_bytes(path: Path | str, data: bytes, overwrite: bool = True) -> None:
    """Write ``data`` to ``path`` atomically: readers see the old file or the new, never a mix.

    ``overwrite=False`` raises FileExistsError instead of replacing an existing ``path`` (for
    immutable files with a single writer, such as sealed buffer segments).
    """
    path = Path(path)
    tmp = tmp_name(path)
    with storage_errors(path):  # a full disk, a read-only folder: one message naming path
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if overwrite:
                os.replace(tmp, path)
            else:  # link() fails if path exists: no check-then-replace window between writers
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    raise FileExistsError(f"{path} already exists and is never rewritten") from None
                tmp.unlink()
        except BaseException:
            discard(tmp)
            raise
    fsync_dir(path.parent)


def discard(path: Path) -> None:
    """Delete a temporary file after a failed write, if the filesystem lets us (a read-only one
    refuses even that: then the write's own error is the one to report)."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def write_text(path: Path | str, text: str) -> None:
    """Atomic text write (UTF-8)."""
    write_bytes(path, text.encode("utf-8"))


def write_json(path: Path | str, obj: Any) -> None:
    """Atomic JSON write, pretty-printed and newline-terminated."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def fsync_tree(path: Path) -> None:
    """fsync every file under ``path`` and every folder in it (before publishing the folder)."""
    for root, _dirs, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(Path(root))


def publish_dir(tmp_dir: Path | str, final_dir: Path | str) -> None:
    """Publish a filled temporary folder as ``final_dir`` in one rename.

    ``final_dir`` must not exist: published folders are immutable, so an existing one means two
    writers chose one name, which is a bug in the caller.
    """
    tmp_dir, final_dir = Path(tmp_dir), Path(final_dir)
    with storage_errors(final_dir, "publish"):
        fsync_tree(tmp_dir)
        if final_dir.exists():
            raise FileExistsError(f"{final_dir} already exists; published folders never change")
        os.rename(tmp_dir, final_dir)
    fsync_dir(final_dir.parent)


def read_pointer(path: Path | str) -> int | None:
    """Read an integer pointer file (e.g. ``latest_state_dict_iteration.txt``); None if absent.

    A pointer that exists but does not hold an integer is a damaged run directory: raise.
    """
    path = Path(path)
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    try:
        return int(text)
    except ValueError as e:
        from rft.errors import CheckpointError

        raise CheckpointError(
            f"{path} should hold one integer (a step), found {text[:40]!r}; "
            "fix or delete the file (it is rewritten at the next save)"
        ) from e


def write_pointer(path: Path | str, value: int) -> None:
    """Replace an integer pointer file atomically (call only after its target is complete)."""
    write_text(path, f"{int(value)}\n")


def tmp_owner(path: Path | str) -> tuple[str, int] | None:
    """(host, pid) of the process that made a :func:`tmp_name` name; None if it is not one."""
    name = Path(path).name
    _, mark, owner = name.partition(f"{TMP_MARK}.")
    host, dot, pid = owner.rpartition(".")
    if not mark or not dot or not host or not pid.isdigit():
        return None
    return host, int(pid)


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this host (signal 0 probes without sending)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    return True


def remove_stale_tmp(
    folder: Path | str, prefix: str = "", alive: Callable[[str, int], bool] | None = None
) -> list[Path]:
    """Delete temporaries in ``folder`` (names starting with ``prefix``) whose writer is dead;
    return them.

    ``alive(host, pid)`` says whether a writer still runs; by default only this host's pids
    are probed and temporaries of other hosts are left alone (this host cannot tell). A
    restarted writer calls this before writing, so a crash leaves no lasting debris.
    """
    import shutil

    host = socket.gethostname()
    alive = alive or (lambda h, pid: h != host or pid_alive(pid))
    removed = []
    for entry in sorted(Path(folder).iterdir()):
        owner = tmp_owner(entry)
        if (
            not entry.name.startswith(prefix)
            or owner is None
            or owner == (host, os.getpid())
            or alive(*owner)
        ):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


def copy_files(files: Iterable[Path | str], dest: Path | str) -> None:
    """Copy extra files (tokenizer, generation config...) into a folder being published."""
    for src in map(Path, files):
        if not src.is_file():
            raise CheckpointError(f"{src} does not exist or is not a file; cannot publish it")
        shutil.copy2(src, Path(dest) / src.name)


def write_jsonl_splits(out_dir: Path, splits: dict) -> None:
    """Each split's rows as ``OUT_DIR/<split>.jsonl`` (one JSON object a line, each file written
    atomically), printing each file and its row count: the taskset scripts' output."""

    out_dir.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        write_text(out_dir / f"{split}.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        print(f"{out_dir / f'{split}.jsonl'}: {len(rows)} tasks")
