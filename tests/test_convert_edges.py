"""rft-convert's output folder when it is not a plain folder (issue 36, item 6): a symlink to
another disk, a file, another model's weights or config. Checkpoints are the hand-made one-rank
ZeRO-2 ones of ``tests/helpers/zero_checkpoint.py`` (under a second each)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from rft.errors import EXIT_FAILED, EXIT_OK, EXIT_USER_ERROR
from rft.rundir import CONFIG_FILE
from rft.safetensors_io import TensorSpec, write_safetensors
from tests.helpers.zero_checkpoint import TRAINER_FILES, assert_converted, convert, make_checkpoint


def linked_step(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor], Path, Path]:
    """A step whose ``actor/huggingface`` links to a folder on "another disk" that holds the
    trainer's files (as a user who moved them there would have it)."""
    step = tmp_path / "run" / "global_step_1"
    expected = make_checkpoint(step)
    hf = step / "actor" / "huggingface"
    target = tmp_path / "other_disk" / "models" / "step1"
    target.parent.mkdir(parents=True)
    shutil.move(hf, target)
    os.symlink(target, hf)
    return step, expected, hf, target


# ----------------------------------------------------------------------------- symlinks, files


def test_a_symlinked_output_folder_is_written_where_it_points(tmp_path, capsys):
    step, expected, hf, target = linked_step(tmp_path)
    assert convert(step) == EXIT_OK
    assert hf.is_symlink() and Path(os.readlink(hf)) == target  # the link stays a link
    assert_converted(target, expected, user_files=False)
    assert sorted(p.name for p in hf.parent.iterdir()) == ["global_step1", "huggingface", "latest"]
    capsys.readouterr()
    assert convert(step) == EXIT_OK  # today: a traceback (the backup was the link)
    assert "0 converted, 1 skipped, 0 failed" in capsys.readouterr().out
    assert convert(step, "--force") == EXIT_OK
    assert "1 converted" in capsys.readouterr().out
    assert hf.is_symlink() and Path(os.readlink(hf)) == target
    assert_converted(target, expected, user_files=False)
    assert sorted(p.name for p in target.parent.iterdir()) == ["step1"]  # no debris there


def test_a_relative_symlink_is_followed_too(tmp_path):
    step, expected, hf, target = linked_step(tmp_path)
    hf.unlink()
    os.symlink(os.path.relpath(target, hf.parent), hf)
    assert convert(step) == EXIT_OK
    assert hf.is_symlink()
    assert_converted(target, expected, user_files=False)


def test_an_output_that_is_a_file_is_one_line_before_anything_starts(tmp_path, capsys):
    step = tmp_path / "global_step_1"
    make_checkpoint(step)
    hf = step / "actor" / "huggingface"
    shutil.rmtree(hf)
    hf.write_text("notes")
    assert convert(step) == EXIT_USER_ERROR
    err = capsys.readouterr().err.strip()
    assert err == (
        f"rft-convert: {hf} is a file, not a folder; rft-convert writes the Hugging Face "
        "folder there: move the file away (or point the link at a folder) and rerun"
    )
    assert hf.read_text() == "notes"


def test_a_link_into_a_missing_folder_says_to_create_it(tmp_path, capsys):
    step, _expected, hf, target = linked_step(tmp_path)
    hf.unlink()
    os.symlink(tmp_path / "unmounted" / "step1", hf)
    assert convert(step) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert f"but {tmp_path / 'unmounted'} does not exist; create it" in err
    assert err.count("\n") == 1
    hf.unlink()
    os.symlink(target / "config.json", hf)  # a link to a file
    assert convert(step) == EXIT_USER_ERROR
    assert "which is a file, not a folder" in capsys.readouterr().err


# ----------------------------------------------------------------------------- another model


def other_weights(hf: Path, shapes: dict[str, tuple[int, ...]]) -> None:
    specs = [TensorSpec(name, shape, torch.float32) for name, shape in shapes.items()]
    write_safetensors(hf / "model.safetensors", specs, lambda s: torch.ones(s.shape))


def test_another_models_complete_weights_are_neither_skipped_nor_replaced(tmp_path, capsys):
    """Judged by file names only, these were "complete": the step was skipped and the other
    model's weights stood for the checkpoint."""
    step = tmp_path / "global_step_1"
    make_checkpoint(step)
    hf = step / "actor" / "huggingface"
    other_weights(hf, {f"transformer.h.{i}.weight": (128, 16) for i in range(4)})
    before = (hf / "model.safetensors").read_bytes()
    for extra in ([], ["--force"]):
        capsys.readouterr()
        assert convert(step, *extra) == EXIT_FAILED
        out = capsys.readouterr().out
        assert f"{hf} holds another model than this checkpoint (it holds transformer.h.0" in out
        assert "move it away (mv" in out and "0 converted, 0 skipped, 1 failed" in out
        assert (hf / "model.safetensors").read_bytes() == before


def test_same_names_with_other_shapes_are_another_model(tmp_path, capsys):
    step = tmp_path / "global_step_1"
    make_checkpoint(step)  # model.layers.{0..3}.weight, [64, 32]
    hf = step / "actor" / "huggingface"
    other_weights(hf, {f"model.layers.{i}.weight": (128, 32) for i in range(4)})
    assert convert(step) == EXIT_FAILED
    assert "its model.layers.0.weight is [128, 32], the checkpoint's [64, 32]" in (
        capsys.readouterr().out
    )


def test_a_config_of_another_model_is_refused(tmp_path, capsys):
    """No weights yet, but config.json (which the conversion keeps) describes a model whose
    embedding the checkpoint lacks; and one whose architecture is not the run's model's."""
    step = tmp_path / "run" / "global_step_1"
    make_checkpoint(step)
    config = step / "actor" / "huggingface" / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "vocab_size": 1000, "hidden_size": 32}))
    assert convert(step) == EXIT_FAILED
    assert "no [1000, 32] embedding" in capsys.readouterr().out
    config.write_text(json.dumps({"model_type": "llama", "vocab_size": 64, "hidden_size": 32}))
    model = tmp_path / "base"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 32}))
    (step.parent / CONFIG_FILE).write_text(f"model:\n  model_path: {model}\n")
    assert convert(step) == EXIT_FAILED
    assert f"its config.json says model_type='llama', the run's model {model} says 'qwen2'" in (
        capsys.readouterr().out
    )
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 32}))
    assert convert(step) == EXIT_OK


def test_rfts_own_partial_output_is_reconverted(tmp_path):
    """Some of the checkpoint's own tensors, the rest missing (shards lost): not another model,
    so it is converted over, the trainer's files kept."""
    step = tmp_path / "global_step_1"
    expected = make_checkpoint(step)
    hf = step / "actor" / "huggingface"
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    names = list(expected)
    (hf / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {n: shards[i // 2] for i, n in enumerate(names)}})
    )
    specs = [TensorSpec(n, tuple(expected[n].shape), torch.float32) for n in names[:2]]
    write_safetensors(hf / shards[0], specs, lambda s: torch.zeros(s.shape))
    assert convert(step) == EXIT_OK
    assert_converted(hf, expected, user_files=False)
    assert TRAINER_FILES <= {p.name for p in hf.iterdir()}


@pytest.mark.parametrize("pruned", [False, True])
def test_the_checkpoints_own_complete_weights_are_skipped(tmp_path, capsys, pruned):
    step = tmp_path / "global_step_1"
    expected = make_checkpoint(step)
    assert convert(step) == EXIT_OK
    if pruned:  # shards deleted after converting: nothing to compare with, the folder stays
        shutil.rmtree(step / "actor" / "global_step1")
    capsys.readouterr()
    assert convert(step) == EXIT_OK
    out = capsys.readouterr().out
    assert "0 converted, 1 skipped, 0 failed" in out
    assert ("not compared with the checkpoint" in out) == pruned
    assert_converted(step / "actor" / "huggingface", expected, user_files=False)
