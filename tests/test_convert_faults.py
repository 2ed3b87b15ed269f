"""rft-convert under faults: kills while publishing, user files in ``huggingface/``, flipped bits.

Checkpoints here are hand-made DeepSpeed ZeRO-2 files (``torch.save`` of the dicts DeepSpeed
writes, one rank), built in well under a second, so the real ``bin/rft-convert`` can be run and
SIGKILLed many times. Deterministic tests kill it right after its n-th rename (each state the
publish protocol passes through); the ``faults`` test kills it at seeded random moments
(``RFT_FAULT_SEED=N`` replays a failure) and reruns it to completion after each kill.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rft.convert.cli import main
from rft.convert.output import backup_path, recover
from rft.convert.torchfile import open_torch_file
from rft.errors import EXIT_USER_ERROR, CheckpointError
from rft.safetensors_io import weights_complete
from tests.helpers.faults import fault_seed
from tests.helpers.zero_checkpoint import (
    TAG,
    add_user_files,
    assert_converted,
    make_checkpoint,
)

REPO = Path(__file__).resolve().parent.parent
PY = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv").is_dir() else sys.executable
CONVERT = str(REPO / "bin" / "rft-convert")

# Runs rft-convert and SIGKILLs it right after its n-th rename (argv[1]); the rest is its argv.
_KILL_AFTER_RENAME = """
import os, signal, sys
sys.path.insert(0, {repo!r})
from rft.convert.cli import main
n, calls = int(sys.argv[1]), [0]
def dying(real):
    def rename(*args, **kwargs):
        real(*args, **kwargs)
        calls[0] += 1
        if calls[0] == n:
            os.kill(os.getpid(), signal.SIGKILL)
    return rename
os.rename, os.replace = dying(os.rename), dying(os.replace)
sys.exit(main(sys.argv[2:]))
"""

# ----------------------------------------------------------------------------- checkpoints


def run_killed_after_rename(n: int, *argv: str) -> subprocess.CompletedProcess:
    code = _KILL_AFTER_RENAME.format(repo=str(REPO))
    return subprocess.run(
        [PY, "-c", code, str(n), *argv], capture_output=True, text=True, timeout=120
    )


# ----------------------------------------------------------------------------- kills while publishing


@pytest.mark.parametrize("force", [False, True], ids=["first", "reconvert"])
@pytest.mark.parametrize("kill_after", [1, 2])
def test_kill_while_swapping_folders_loses_nothing(
    tmp_path: Path, kill_after: int, force: bool
) -> None:
    """A kill between moving the old folder away and publishing the new one (rename 1) or
    before the old one is deleted (rename 2): the rerun restores or finishes, never loses the
    trainer's config and tokenizer (they exist only in the old folder: no --base-model-dir)."""
    step = tmp_path / "global_step_1"
    expected = make_checkpoint(step)
    hf = step / "actor" / "huggingface"
    args = ["--checkpoint-dir", str(step), "--dtype", "fp32"]
    if force:
        assert main(args) == 0
        args.append("--force")
    add_user_files(hf)
    proc = run_killed_after_rename(kill_after, *args)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    assert (hf.exists(), backup_path(hf).exists()) == (
        (False, True) if kill_after == 1 else (True, True)
    )
    assert main(args) == 0
    assert_converted(hf, expected)


def test_backup_is_deleted_only_after_the_new_folder_is_complete(tmp_path: Path) -> None:
    step = tmp_path / "global_step_1"
    expected = make_checkpoint(step)
    hf = step / "actor" / "huggingface"
    assert main(["--checkpoint-dir", str(step), "--dtype", "fp32"]) == 0
    backup = backup_path(hf)  # a kill while deleting it: partly gone
    backup.mkdir()
    (backup / "config.json").write_text("{}")
    assert main(["--checkpoint-dir", str(step)]) == 0  # skipped: complete
    assert_converted(hf, expected, user_files=False)
    (hf / "model.safetensors").unlink()  # the new folder is not complete: the backup must stay
    shutil.copytree(hf, backup, dirs_exist_ok=True)
    with pytest.raises(CheckpointError, match="huggingface.previous"):
        recover(hf)
    assert backup.is_dir()


# ----------------------------------------------------------------------------- user files, debris


def test_user_files_are_carried_and_stale_shards_are_not(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    step = tmp_path / "global_step_1"
    expected = make_checkpoint(step)
    hf = step / "actor" / "huggingface"
    assert main(["--checkpoint-dir", str(step), "--dtype", "fp32", "--max-shard-size", "10KB"]) == 0
    assert len(list(hf.glob("model-*-of-*.safetensors"))) == 4
    add_user_files(hf)
    capsys.readouterr()
    assert main(["--checkpoint-dir", str(step), "--dtype", "fp32", "--force"]) == 0
    assert "adapter_model.safetensors" in capsys.readouterr().out  # the summary says what was kept
    assert_converted(hf, expected)
    assert not list(hf.glob("model-*")) and not (hf / "model.safetensors.index.json").exists()


def test_skipped_rerun_removes_temporaries_of_killed_runs(tmp_path: Path) -> None:
    step = tmp_path / "global_step_1"
    expected = make_checkpoint(step)
    hf = step / "actor" / "huggingface"
    assert main(["--checkpoint-dir", str(step), "--dtype", "fp32"]) == 0
    debris = hf.with_name(
        f"huggingface.tmp.{socket.gethostname()}.{_dead_pid()}"
    )  # a killed --force
    shutil.copytree(hf, debris)
    assert main(["--checkpoint-dir", str(step)]) == 0
    assert_converted(hf, expected, user_files=False)


def _dead_pid() -> int:
    """The id of a process that has exited (a temporary named after it is stale)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


# ----------------------------------------------------------------------------- CRC


def _flip_byte(path: Path, needle: bytes) -> None:
    data = bytearray(path.read_bytes())
    pos = data.find(needle)
    assert pos >= 0 and data.find(needle, pos + 1) < 0
    data[pos + len(needle) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def test_flipped_bit_in_a_record_read_is_reported(tmp_path: Path) -> None:
    a, b = torch.randn(1000), torch.randn(1000)
    torch.save({"a": a, "b": b}, tmp_path / "x.pt")
    _flip_byte(tmp_path / "x.pt", a.numpy().tobytes()[:64])
    archive, tree = open_torch_file(tmp_path / "x.pt")
    with archive:
        assert torch.equal(tree["b"].load(), b)  # another record: fine
        with pytest.raises(CheckpointError, match=r"x\.pt.*record x/data/\d.*damaged"):
            tree["a"].load()
    archive, tree = open_torch_file(tmp_path / "x.pt")
    with archive:
        tree["a"].read(0, 5)  # bytes 0-19, before the flip: the rest is checked by verify()
        with pytest.raises(CheckpointError, match="damaged"):
            archive.verify()


def test_crc_check_accumulates_over_pieces_in_any_order(tmp_path: Path) -> None:
    a = torch.randn(1000)
    torch.save({"a": a}, tmp_path / "x.pt")
    archive, tree = open_torch_file(tmp_path / "x.pt")
    with archive:
        parts = [
            tree["a"].read(s, 100) for s in (300, 0, 100, 200, 400, 500, 600, 700, 800, 900, 0)
        ]
        archive.verify()
        assert torch.equal(torch.cat(parts[1:4] + parts[:1] + parts[4:10]), a)


def test_conversion_of_a_damaged_checkpoint_fails_and_publishes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    step = tmp_path / "global_step_1"
    params = make_checkpoint(step)
    optim = step / "actor" / TAG / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    _flip_byte(optim, params["model.layers.2.weight"].numpy().tobytes()[:64])
    assert main(["--checkpoint-dir", str(step), "--dtype", "fp32"]) == 1
    out = capsys.readouterr().out
    assert "zero_pp_rank_0_mp_rank_00_optim_states.pt" in out and "damaged" in out
    assert not weights_complete(step / "actor" / "huggingface")


def test_flipped_bit_in_a_record_not_read_is_ignored(tmp_path: Path) -> None:
    step = tmp_path / "global_step_1"
    expected = make_checkpoint(step)
    optim = step / "actor" / TAG / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    data = bytearray(optim.read_bytes())  # exp_avg: zeros, never read by a conversion
    pos = data.find(bytes(4096))
    data[pos + 100] = 1
    optim.write_bytes(bytes(data))
    assert main(["--checkpoint-dir", str(step), "--dtype", "fp32"]) == 0
    assert_converted(step / "actor" / "huggingface", expected, user_files=False)


# ----------------------------------------------------------------------------- messages


def test_a_file_given_as_a_folder_is_called_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    step = tmp_path / "global_step_1"
    make_checkpoint(step)
    shard = step / "actor" / TAG / "mp_rank_00_model_states.pt"
    for path in (shard, shard / "x"):
        assert main(["--checkpoint-dir", str(path)]) == EXIT_USER_ERROR
        err = capsys.readouterr().err
        assert f"{shard} is a file, not a folder" in err and str(shard.parent) in err, err
    model_file = step / "actor" / "huggingface" / "config.json"
    assert (
        main(["--checkpoint-dir", str(step), "--base-model-dir", str(model_file)])
        == EXIT_USER_ERROR
    )
    assert f"--base-model-dir {model_file} is a file, not a folder" in capsys.readouterr().err
    assert (
        main(["--checkpoint-dir", str(step), "--base-model-dir", str(tmp_path / "nope")])
        == EXIT_USER_ERROR
    )
    assert "nope does not exist" in capsys.readouterr().err


# ----------------------------------------------------------------------------- random kills


def _start(step: Path, force: bool) -> subprocess.Popen:
    argv = [
        PY,
        CONVERT,
        "--checkpoint-dir",
        str(step),
        "--dtype",
        "fp32",
        "--max-shard-size",
        "20MB",
    ]
    return subprocess.Popen(
        argv + ["--force"] * force,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _wait_for_tmp(proc: subprocess.Popen, actor: Path, present: bool = True) -> float:
    """Seconds until the conversion's temporary folder appears (``present``) or is gone (or the
    process ends)."""
    start = time.monotonic()
    while proc.poll() is None and any(".tmp." in p.name for p in actor.iterdir()) != present:
        time.sleep(0.002)
    return time.monotonic() - start


def _state(actor: Path) -> str:
    """What a kill left of the output folders, e.g. ``huggingface(complete) huggingface.tmp``."""
    names = sorted(p.name for p in actor.iterdir() if p.name.startswith("huggingface"))
    return " ".join(
        n.split(".tmp.")[0]
        + (".tmp" if ".tmp." in n else "")
        + ("(complete)" if weights_complete(actor / n) else "")
        for n in names
    )


@pytest.mark.faults
def test_random_kills_then_rerun_give_the_reference_output(tmp_path: Path) -> None:
    seed = fault_seed("rft-convert")
    rng = random.Random(seed)
    step = tmp_path / "global_step_1"
    expected = make_checkpoint(step, n_tensors=8, rows=2048, cols=1024)  # 64 MiB fp32, 4 shards
    actor, hf = step / "actor", step / "actor" / "huggingface"
    pristine = tmp_path / "pristine_hf"
    shutil.copytree(hf, pristine)
    proc = _start(step, force=False)  # timing of an undisturbed run: startup, then the work
    startup_s = _wait_for_tmp(proc, actor)
    conversion_s = [_wait_for_tmp(proc, actor, present=False)]  # kills aim at the shortest seen
    proc.wait(timeout=120)
    assert proc.returncode == 0, proc.stderr.read().decode()
    rounds, deadline = 0, time.monotonic() + 40
    while rounds < 4 or (time.monotonic() < deadline and rounds < 12):
        force = rng.random() < 0.5  # replace a complete folder, or convert for the first time
        if not force:
            shutil.rmtree(hf)
            shutil.copytree(pristine, hf)
        add_user_files(hf)
        in_work, fraction = rng.random() < 0.75, rng.random()
        proc = _start(step, force)
        if in_work:  # most kills land while the folder is built and swapped in
            _wait_for_tmp(proc, actor)
        delay_s = fraction * (min(conversion_s) + (0 if in_work else startup_s))
        time.sleep(delay_s)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        print(
            f"[faults] round {rounds}: force={force} killed {delay_s:.3f}s after "
            f"{'the temporary folder appeared' if in_work else 'start'}; left: {_state(actor)}"
        )
        rerun = _start(step, force=False)
        _wait_for_tmp(rerun, actor)
        if rerun.poll() is None:
            conversion_s.append(_wait_for_tmp(rerun, actor, present=False))
        _, err = rerun.communicate(timeout=120)
        assert rerun.returncode == 0, f"seed {seed} round {rounds}: {err.decode()[-3000:]}"
        assert_converted(hf, expected)
        rounds += 1
