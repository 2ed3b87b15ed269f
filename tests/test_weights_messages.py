"""What a user reads when the weights pointer or the model folder is wrong: the exact fault and
what to do, never a guess such as "is the trainer running?"."""

from __future__ import annotations

import pytest

from rft import atomic
from rft.errors import CheckpointError, SyncTimeoutError
from rft.models import check_model_dir
from rft.rundir import WEIGHTS_POINTER, weights_dir
from rft.sync.explorer_side import WeightsIn
from rft.sync.publisher import WeightsPublisher
from rft.sync.versions import COMPLETE_MARKER
from rft.sync.watcher import WeightsWatcher
from tests.helpers.weights import NullEngine, write_tiny


def timeout_message(run_dir, need: int, error: type = SyncTimeoutError) -> str:
    with pytest.raises(error) as info:
        WeightsIn(WeightsWatcher(run_dir, loaded_version=0), NullEngine(), 0).wait_for(need)
    return str(info.value)


def test_a_pointer_to_a_missing_or_partial_version_is_named(tmp_path):
    assert "is the trainer running?" in timeout_message(tmp_path, 1)  # nothing published yet
    publisher = WeightsPublisher(tmp_path)
    for version in (5, 6):
        publisher.publish(version, write_tiny)
    assert "is the trainer running?" in timeout_message(tmp_path, 7)  # v6 is there: just wait
    atomic.write_pointer(tmp_path / WEIGHTS_POINTER, 7)
    message = timeout_message(tmp_path, 7, CheckpointError)  # no trainer: at the first poll
    assert (
        f"{WEIGHTS_POINTER} names version 7 but weights/v000007 is missing or incomplete" in message
    )
    assert "copied partially" in message and "write 6" in message
    assert "is the trainer running?" not in message
    (weights_dir(tmp_path, 6) / COMPLETE_MARKER).unlink()  # a partial copy of the run directory
    atomic.write_pointer(tmp_path / WEIGHTS_POINTER, 6)
    message = timeout_message(tmp_path, 7, CheckpointError)
    assert "names version 6 but weights/v000006 is missing or incomplete" in message
    assert "write 5" in message


@pytest.mark.parametrize("text", ["-3", "-1\n"])
def test_a_negative_pointer_is_called_damaged(tmp_path, text):
    WeightsPublisher(tmp_path).publish(2, write_tiny)
    (tmp_path / WEIGHTS_POINTER).write_text(text)
    with pytest.raises(CheckpointError, match="the file is damaged; write 2 .* or delete it"):
        WeightsWatcher(tmp_path, loaded_version=0).poll()
    with pytest.raises(CheckpointError, match="damaged"):
        timeout_message(tmp_path, 1)


def test_a_garbage_pointer_says_what_to_do(tmp_path):
    (tmp_path / WEIGHTS_POINTER).write_text("v7\n")
    with pytest.raises(CheckpointError, match="should hold one integer.*fix or delete the file"):
        WeightsWatcher(tmp_path, loaded_version=0).poll()


def test_model_path_naming_a_file_asks_for_the_folder(tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\0")
    with pytest.raises(CheckpointError, match=f"is a file, not a folder.*perhaps {tmp_path}"):
        check_model_dir(weights)
