"""rft-convert skips a complete ``huggingface/`` only when its weights are this checkpoint's
(issue 51): same names and shapes are not enough, since another step's (or another run's)
converted weights have them too. Each file rft-convert writes records digests of the checkpoint
files it came from; a folder converted from another checkpoint fails its step with the way out
(``--force``), a genuinely converted one is still skipped. Checkpoints are the hand-made
one-rank ZeRO-2 ones of ``tests/helpers/zero_checkpoint.py`` (under a second each)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors import safe_open

from rft.convert.identity import RECORD_MODEL, RECORD_OPTIM, RECORD_PATH
from rft.errors import EXIT_FAILED, EXIT_OK
from rft.safetensors_io import TensorSpec, write_safetensors
from tests.helpers.zero_checkpoint import TAG, assert_converted, convert, make_checkpoint


def hf_of(step: Path) -> Path:
    return step / "actor" / "huggingface"


def summary(capsys) -> str:
    return capsys.readouterr().out


def test_a_genuine_conversion_records_its_checkpoint_and_is_skipped(tmp_path, capsys):
    step = tmp_path / "run" / "global_step_1"
    expected = make_checkpoint(step)
    assert convert(step) == EXIT_OK
    with safe_open(str(hf_of(step) / "model.safetensors"), "pt") as f:
        meta = f.metadata()
    assert meta["format"] == "pt"  # transformers still loads it
    assert meta[RECORD_PATH] == str((step / "actor").resolve())
    assert len(meta[RECORD_MODEL]) == 32 and len(meta[RECORD_OPTIM]) == 32
    summary(capsys)
    assert convert(step) == EXIT_OK
    out = summary(capsys)
    assert "0 converted, 1 skipped, 0 failed" in out
    assert f"{hf_of(step).resolve()} is complete (--force redoes it)" in out
    assert_converted(hf_of(step), expected, user_files=False)


def test_another_checkpoints_weights_of_the_same_shapes_are_not_skipped(tmp_path, capsys):
    """The issue: a huggingface/ copied from another checkpoint (other weights, same names and
    shapes, same config) was skipped as complete and stood for this step."""
    other, step = tmp_path / "a" / "global_step_3", tmp_path / "b" / "global_step_3"
    make_checkpoint(other, seed=1)
    expected = make_checkpoint(step, seed=0)
    assert convert(other) == EXIT_OK
    shutil.rmtree(hf_of(step))
    shutil.copytree(hf_of(other), hf_of(step))
    before = (hf_of(step) / "model.safetensors").read_bytes()
    summary(capsys)
    assert convert(step) == EXIT_FAILED
    out = summary(capsys)
    hf, ckpt = hf_of(step).resolve(), (step / "actor").resolve()
    source = (other / "actor").resolve()
    assert (
        f"{hf} holds another checkpoint's weights (converted from {source}), not those of "
        f"{ckpt}; rft-convert does not skip it: rerun with --force --steps 3 to replace them "
        "with this checkpoint's (its config.json and tokenizer are kept)"
    ) in out
    assert "0 converted, 0 skipped, 1 failed" in out
    assert (hf_of(step) / "model.safetensors").read_bytes() == before  # nothing written
    assert convert(step, "--force") == EXIT_OK
    assert_converted(hf_of(step), expected, user_files=False)
    summary(capsys)
    assert convert(step) == EXIT_OK  # now its own: skipped
    assert "0 converted, 1 skipped, 0 failed" in summary(capsys)


def test_another_step_of_the_same_run_names_that_step(tmp_path, capsys):
    run = tmp_path / "run"
    make_checkpoint(run / "global_step_1", seed=1)
    make_checkpoint(run / "global_step_2", seed=2)
    assert convert(run) == EXIT_OK
    shutil.rmtree(hf_of(run / "global_step_2"))
    shutil.copytree(hf_of(run / "global_step_1"), hf_of(run / "global_step_2"))
    summary(capsys)
    assert convert(run) == EXIT_FAILED
    out = summary(capsys)
    assert "1 skipped, 1 failed" in out
    assert f"converted from {(run / 'global_step_1' / 'actor').resolve()})" in out
    assert "--force --steps 2" in out


def test_a_checkpoint_saved_again_in_place_is_not_its_old_conversion(tmp_path, capsys):
    """A trainer that resumed from an earlier step rewrites a step's shards: the conversion of
    the old shards names the same folder, but its files no longer match."""
    step = tmp_path / "run" / "global_step_1"
    make_checkpoint(step, seed=0)
    assert convert(step) == EXIT_OK
    kept = tmp_path / "hf"
    shutil.move(hf_of(step), kept)
    shutil.rmtree(step)
    make_checkpoint(step, seed=5)
    shutil.rmtree(hf_of(step))
    shutil.move(kept, hf_of(step))
    summary(capsys)
    assert convert(step) == EXIT_FAILED
    assert "before its files were replaced" in summary(capsys)


def test_copies_and_pruned_optimizer_states_are_still_the_same_checkpoint(tmp_path, capsys):
    """The record is of the files' contents (zip directories: names, sizes, CRCs), not of
    paths or times: a copied run is still recognised, and so is a step whose optimizer states
    were deleted after converting (its module weights remain)."""
    step = tmp_path / "run" / "global_step_1"
    expected = make_checkpoint(step)
    assert convert(step) == EXIT_OK
    moved = tmp_path / "elsewhere" / "global_step_1"
    shutil.copytree(step, moved)
    (moved / "actor" / TAG / "zero_pp_rank_0_mp_rank_00_optim_states.pt").unlink()
    summary(capsys)
    assert convert(moved) == EXIT_OK
    assert "0 converted, 1 skipped, 0 failed" in summary(capsys)
    assert_converted(hf_of(moved), expected, user_files=False)


def test_weights_without_a_record_are_judged_by_names_and_shapes(tmp_path, capsys):
    """The trainer's own huggingface/ weights (trainer.save_hf_checkpoint) and older
    conversions carry no record: skipped as before, saying so."""
    step = tmp_path / "global_step_1"
    expected = make_checkpoint(step)
    specs = [TensorSpec(n, tuple(t.shape), torch.float32) for n, t in expected.items()]
    write_safetensors(hf_of(step) / "model.safetensors", specs, lambda s: expected[s.name])
    assert convert(step) == EXIT_OK
    out = summary(capsys)
    assert "0 converted, 1 skipped, 0 failed" in out
    assert "carry no rft-convert record" in out
