"""OS faults a user can cause: a full disk, a read-only folder, a file where a folder belongs.

Each ends in one ``error:`` line naming the path and the fix (no traceback), and loses nothing
already written: the previous segment, weights version, pointer and converted folder stay whole
and no temporary is left. Disk full is simulated by an fsync that fails with ENOSPC (as NFS
reports it) and, where this process may mount, by a real 1 MiB tmpfs; read-only by a read-only
bind mount (root ignores chmod) and by an ``open`` that fails with EROFS.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from rft import atomic
from rft.buffer.segments import SegmentReader, SegmentWriter
from rft.entry import run_command
from rft.errors import EXIT_FAILED, EXIT_USER_ERROR, StorageError
from rft.rundir import WEIGHTS_POINTER, weights_dir
from rft.sync.publisher import WeightsPublisher
from rft.sync.versions import is_complete, list_versions
from tests.helpers.synthetic import make_batch
from tests.helpers.zero_checkpoint import make_checkpoint

NO_SPACE = "(No space left on device)"
FREE_SPACE = "free space on that filesystem, or move the run (checkpoint_root_dir)"


def fail_fsync(monkeypatch: pytest.MonkeyPatch, code: int = errno.ENOSPC) -> None:
    """Every fsync fails with ``code``: network filesystems report a full disk there."""

    def fsync(fd: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", fsync)


def error_line(capsys: pytest.CaptureFixture, body) -> str:
    """Run ``body`` as a command does; the one line it printed (exit code 2, no traceback)."""
    assert run_command(body) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err.strip()


def temporaries(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if atomic.is_tmp(p)]


def _mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


@pytest.fixture
def tiny_fs(tmp_path: Path):
    """A 1 MiB tmpfs (a disk that really fills up); skipped where mounting is not permitted."""
    folder = tmp_path / "fs"
    folder.mkdir()
    if not _mount("-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


@pytest.fixture
def read_only(tmp_path: Path):
    """``read_only(folder)`` remounts ``folder`` read-only in place (a bind mount)."""
    mounted: list[Path] = []

    def remount(folder: Path) -> None:
        if not _mount("--bind", str(folder), str(folder)):
            pytest.skip("cannot bind-mount here (needs root)")
        mounted.append(folder)
        if not _mount("-o", "remount,bind,ro", str(folder)):
            pytest.skip("cannot remount read-only here")

    yield remount
    for folder in reversed(mounted):
        subprocess.run(["umount", str(folder)], check=True)


def fill(fs: Path, leave_bytes: int) -> None:
    """Fill ``fs`` up to ``leave_bytes`` free."""
    stat = os.statvfs(fs)
    (fs / "filler").write_bytes(b"\0" * max(0, stat.f_bavail * stat.f_frsize - leave_bytes))


# ----------------------------------------------------------------------------- disk full


def assert_segments_intact(folder: Path, seqs: list[int]) -> None:
    assert sorted(p.name for p in folder.iterdir()) == [f"seg-{s:06d}.jsonl" for s in seqs]
    reader = SegmentReader(folder.parent)
    assert len(reader.read()) == 8 * len(seqs)
    assert reader.stats.corrupt_records == 0


def test_sealing_a_segment_on_a_full_disk_is_one_line_and_loses_nothing(
    tmp_path, monkeypatch, capsys
):
    writer = SegmentWriter(tmp_path / "buffer", "explorer-0")
    writer.write(make_batch("a", 2))
    with monkeypatch.context() as patch:
        fail_fsync(patch)
        line = error_line(capsys, lambda: writer.write(make_batch("b", 2)))
    segment = tmp_path / "buffer" / "explorer-0" / "seg-000001.jsonl"
    assert line.startswith(f"error: cannot write {segment} {NO_SPACE}: {FREE_SPACE}"), line
    assert_segments_intact(writer.folder, [0])  # no partial seg-000001, no temporary
    writer.write(make_batch("b", 2))  # space freed: the same seq seals
    assert_segments_intact(writer.folder, [0, 1])


def test_sealing_a_segment_on_a_really_full_disk(tiny_fs, capsys):
    writer = SegmentWriter(tiny_fs / "buffer", "explorer-0")
    writer.write(make_batch("a", 2))
    fill(tiny_fs, 4096)
    big = make_batch("b", 400)  # about 100 KB of JSON
    line = error_line(capsys, lambda: writer.write(big))
    assert f"seg-000001.jsonl {NO_SPACE}: {FREE_SPACE}" in line
    assert_segments_intact(writer.folder, [0])


def test_an_atomic_rewrite_that_fails_keeps_the_previous_file(tiny_fs):
    target = tiny_fs / "explorer_meta.json"
    atomic.write_json(target, {"step": 1})
    fill(tiny_fs, 4096)
    with pytest.raises(StorageError, match=f"cannot write {target}"):
        atomic.write_bytes(target, b"x" * 200_000)
    assert target.read_text() == '{\n  "step": 1\n}\n' and not temporaries(tiny_fs)


def write_weights(size: int):
    def fill_folder(folder: Path) -> None:
        (folder / "config.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(b"\1" * size)

    return fill_folder


def assert_weights_intact(run_dir: Path, version: int) -> None:
    assert atomic.read_pointer(run_dir / WEIGHTS_POINTER) == version
    assert list_versions(run_dir) == [version] and is_complete(weights_dir(run_dir, version))
    assert not temporaries(run_dir)


def test_publishing_weights_on_a_full_disk_keeps_the_last_version(tmp_path, monkeypatch, capsys):
    publisher = WeightsPublisher(tmp_path)
    publisher.publish(1, write_weights(1000))
    with monkeypatch.context() as patch:
        fail_fsync(patch)
        line = error_line(capsys, lambda: publisher.publish(2, write_weights(1000)))
    folder = weights_dir(tmp_path, 2)
    assert line.startswith(f"error: cannot publish {folder} {NO_SPACE}"), line
    assert FREE_SPACE in line
    assert_weights_intact(tmp_path, 1)


def test_publishing_weights_on_a_really_full_disk(tiny_fs, capsys):
    publisher = WeightsPublisher(tiny_fs)
    publisher.publish(1, write_weights(1000))
    line = error_line(capsys, lambda: publisher.publish(2, write_weights(2 << 20)))
    assert f"cannot publish {weights_dir(tiny_fs, 2)} {NO_SPACE}" in line
    assert_weights_intact(tiny_fs, 1)


def convert_step(root: Path) -> Path:
    step = root / "global_step_1"
    make_checkpoint(step, n_tensors=4, rows=64, cols=64)  # fp32 output: 64 KiB
    return step


def assert_convert_failed_cleanly(step: Path, capsys, expected: str) -> None:
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, out + err
    hf = step / "actor" / "huggingface"
    assert f"cannot write {hf} {expected}" in out, out  # the summary table's note
    assert sorted(p.name for p in hf.iterdir()) == sorted(
        ["config.json", "tokenizer.json", "tokenizer_config.json"]
    )  # the trainer's files are intact; no weights half written, no temporary beside them
    assert not [p for p in hf.parent.iterdir() if p.name.startswith("huggingface.")]


def test_rft_convert_on_a_full_disk_says_so_and_keeps_the_old_folder(tmp_path, monkeypatch, capsys):
    from rft.convert.cli import main

    step = convert_step(tmp_path)
    with monkeypatch.context() as patch:
        fail_fsync(patch)
        assert main(["--checkpoint-dir", str(step), "--dtype", "fp32"]) == EXIT_FAILED
    assert_convert_failed_cleanly(step, capsys, NO_SPACE)


def test_rft_convert_on_a_really_full_disk(tiny_fs, capsys):
    from rft.convert.cli import main

    step = convert_step(tiny_fs)
    fill(tiny_fs, 16 << 10)
    assert main(["--checkpoint-dir", str(step), "--dtype", "fp32"]) == EXIT_FAILED
    assert_convert_failed_cleanly(step, capsys, NO_SPACE)


# ----------------------------------------------------------------------------- read-only


READ_ONLY_FIX = "remount it read-write, or put the run (checkpoint_root_dir) on a writable"


def test_a_read_only_buffer_folder_is_one_line(tmp_path, read_only, capsys):
    writer = SegmentWriter(tmp_path / "buffer", "explorer-0")
    writer.write(make_batch("a", 1))
    read_only(writer.folder)
    line = error_line(capsys, lambda: writer.write(make_batch("b", 1)))
    assert f"cannot write {writer.folder / 'seg-000001.jsonl'} (Read-only file system" in line
    assert READ_ONLY_FIX in line
    read_only(tmp_path / "buffer")
    line = error_line(capsys, lambda: SegmentWriter(tmp_path / "buffer", "explorer-1"))
    assert f"cannot create {tmp_path / 'buffer' / 'explorer-1'} (Read-only file system)" in line


def test_a_read_only_filesystem_refusing_writes_is_one_line(tmp_path, monkeypatch, capsys):
    writer = SegmentWriter(tmp_path / "buffer", "explorer-0")

    def refuse(path, *args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr(atomic, "open", refuse, raising=False)
    line = error_line(capsys, lambda: writer.write(make_batch("a", 1)))
    assert f"cannot write {writer.folder / 'seg-000000.jsonl'} (Read-only file system): " in line
    assert READ_ONLY_FIX in line
    line = error_line(capsys, lambda: atomic.write_json(tmp_path / "meta.json", {}))
    assert line.startswith(f"error: cannot write {tmp_path / 'meta.json'} (Read-only")


def test_permission_denied_is_one_line(tmp_path, monkeypatch, capsys):
    def refuse(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(atomic, "open", refuse, raising=False)
    line = error_line(capsys, lambda: atomic.write_text(tmp_path / "x.txt", "x"))
    assert f"cannot write {tmp_path / 'x.txt'} (Permission denied): " in line
    assert "give your user access to it (chmod/chown)" in line


# ----------------------------------------------------------------------------- wrong kind


def test_the_explorer_names_the_file_that_checkpoint_root_dir_is(tmp_path, capsys):
    root = tmp_path / "ckpt"
    root.write_text("not a folder")
    buffer = root / "project" / "name" / "buffer"
    line = error_line(capsys, lambda: SegmentWriter(buffer, "explorer-0"))
    assert f"{root} is a file, not a folder: move the file away" in line, line
    assert "checkpoint_root_dir must name a folder" in line
    assert "explorer-0 exists" not in line


def test_a_file_named_like_a_writer_folder_is_named(tmp_path, capsys):
    (tmp_path / "explorer-0").write_text("x")
    line = error_line(capsys, lambda: SegmentWriter(tmp_path, "explorer-0"))
    assert f"{tmp_path / 'explorer-0'} is a file, not a folder" in line


def test_a_folder_where_the_pointer_file_belongs_is_named(tmp_path, capsys):
    (tmp_path / WEIGHTS_POINTER).mkdir()
    line = error_line(capsys, lambda: atomic.write_pointer(tmp_path / WEIGHTS_POINTER, 3))
    assert f"{tmp_path / WEIGHTS_POINTER} is a folder, not a file" in line
    assert not temporaries(tmp_path)


def test_the_trainer_names_the_file_that_checkpoint_root_dir_is(tiny_model_dir, tmp_path, capsys):
    """What the trainer's task does first (rank 0 prepares the run directory); its loop's own
    ``run_dir.mkdir`` ends the same way (rft.entry.run_command)."""
    from rft.launch.worker import prepare_run_dir
    from tests.helpers.dry_run import CPU_CONFIG, overrides

    root = tmp_path / "ckpt"
    root.write_text("not a folder")
    args = ["--config", str(CPU_CONFIG), *overrides(tiny_model_dir, f"checkpoint_root_dir={root}")]
    assert prepare_run_dir("trainer", args) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{root} is a file, not a folder" in err, err
    line = error_line(capsys, lambda: (root / "p" / "n").mkdir(parents=True, exist_ok=True))
    assert f"{root} is a file, not a folder" in line


# ----------------------------------------------------------------------------- dry run


def preflight_error(model: Path, *extra: str) -> str:
    from rft.config.load import load_config
    from rft.errors import ConfigError
    from rft.launch.preflight import check_run_root
    from tests.helpers.dry_run import CPU_CONFIG, overrides

    with pytest.raises(ConfigError) as info:
        check_run_root(load_config(CPU_CONFIG, overrides(model, *extra)))
    return str(info.value)


def test_the_dry_run_refuses_a_read_only_root_and_run_folders(tiny_model_dir, tmp_path, read_only):
    root = tmp_path / "ckpt"
    buffer = root / "p" / "n" / "buffer"
    buffer.mkdir(parents=True)
    read_only(buffer)
    msg = preflight_error(tiny_model_dir, f"checkpoint_root_dir={root}", "project=p", "name=n")
    assert f"cannot write in {buffer} (read-only filesystem)" in msg
    read_only(root)
    msg = preflight_error(tiny_model_dir, f"checkpoint_root_dir={root}/new", "project=p")
    assert f"cannot write in {root} (read-only filesystem)" in msg


def test_the_dry_run_refuses_a_file_in_the_run_directory(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "p" / "n"
    run_dir.mkdir(parents=True)
    (run_dir / "weights").write_text("x")
    msg = preflight_error(tiny_model_dir, f"checkpoint_root_dir={tmp_path}", "project=p", "name=n")
    assert f"{run_dir / 'weights'} is a file, not a folder" in msg
