"""What ``rft-run --dry-run`` sees before anything starts and once missed (issue 36, item 4):
a tokenizer without a chat template, damaged safetensors weights, a damaged parquet shard.
Each used to fail only after vLLM or DeepSpeed had loaded, with a traceback."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest

from rft import data
from rft.config.load import load_config
from rft.errors import CheckpointError, DataError
from rft.launch.preflight import preflight
from rft.models import check_model_dir
from rft.safetensors_io import SINGLE_FILE, file_problem

REPO = Path(__file__).resolve().parent.parent
CPU_CONFIG = REPO / "configs" / "cpu" / "grpo_gsm8k.yaml"
SFT_CONFIG = REPO / "configs" / "cpu" / "sft_warmup.yaml"
ARITHMETIC = REPO / "data" / "arithmetic"


def copy_model(src: Path, dest: Path) -> Path:
    """The tiny model's folder with its own copies of the small files and a link to the weights."""
    dest.mkdir()
    for f in src.iterdir():
        if f.name == SINGLE_FILE:
            os.symlink(f, dest / f.name)
        else:
            shutil.copyfile(f, dest / f.name)
    return dest


def without_chat_template(model: Path) -> Path:
    (model / "chat_template.jinja").unlink(missing_ok=True)
    tok = model / "tokenizer_config.json"
    tok.write_text(
        json.dumps({k: v for k, v in json.loads(tok.read_text()).items() if k != "chat_template"})
    )
    return model


def config(model: Path, *extra: str, path: Path = CPU_CONFIG, tmp: Path | None = None):
    return load_config(
        path,
        [
            f"model.model_path={model}",
            f"checkpoint_root_dir={tmp or '/tmp/rft-preflight-checks'}",
            *extra,
        ],
    )


# ----------------------------------------------------------------------------- chat template


def test_a_tokenizer_without_a_chat_template_is_one_line_at_dry_run(tiny_model_dir, tmp_path):
    model = without_chat_template(copy_model(tiny_model_dir, tmp_path / "base"))
    cfg = config(model, f"buffer.explorer_input.taskset.path={ARITHMETIC}")
    with pytest.raises(DataError) as info:
        preflight(cfg)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("buffer.explorer_input.taskset renders chat with the tokenizer's")
    assert f"model.model_path={model} has none" in message
    assert "set model.custom_chat_template" in message
    # A custom template (or the original folder) passes.
    preflight(config(model, "model.custom_chat_template='{{ messages[0].content }}'"))
    preflight(config(tiny_model_dir))


def test_an_sft_stage_needs_the_template_too_and_says_which_key_replaces_it(
    tiny_model_dir, tmp_path
):
    model = without_chat_template(copy_model(tiny_model_dir, tmp_path / "base"))
    with pytest.raises(DataError) as info:
        preflight(config(model, path=SFT_CONFIG, tmp=tmp_path))
    message = str(info.value)
    assert message.startswith("stages[0] (sft_warmup): buffer.trainer_input.experience_buffer")
    assert "set buffer.trainer_input.experience_buffer.format.chat_template" in message


# ----------------------------------------------------------------------------- weights


def test_an_empty_or_truncated_model_safetensors_is_refused(tiny_model_dir, tmp_path):
    model = copy_model(tiny_model_dir, tmp_path / "m")
    weights = model / SINGLE_FILE
    full = weights.resolve().read_bytes()
    weights.unlink()
    weights.write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"model.safetensors is empty \(0 bytes\)"):
        check_model_dir(model)
    weights.write_bytes(full[: len(full) // 2])
    with pytest.raises(CheckpointError) as info:
        preflight(config(model))
    assert f"model.safetensors is truncated ({len(full) // 2} of {len(full)} bytes)" in str(
        info.value
    )
    assert "copy them again" in str(info.value)
    weights.write_bytes(full[:5])  # not even the header's length
    with pytest.raises(CheckpointError, match="no readable safetensors header"):
        check_model_dir(model)
    weights.write_bytes(full)
    check_model_dir(model)


def tiny_safetensors(path: Path, values: int) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [values], "data_offsets": [0, 4 * values]}})
    raw = header.encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * (4 * values))


def test_an_index_whose_shards_are_missing_is_refused(tiny_model_dir, tmp_path):
    model = copy_model(tiny_model_dir, tmp_path / "m")
    (model / SINGLE_FILE).unlink()
    shards = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    weight_map = {f"w{i}": name for i, name in enumerate(shards)}
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    tiny_safetensors(model / shards[0], 4)
    with pytest.raises(CheckpointError) as info:
        check_model_dir(model)
    assert (
        "names 3 shard(s) of which 2 are missing (model-00002-of-00003.safetensors, "
        "model-00003-of-00003.safetensors)" in str(info.value)
    )
    tiny_safetensors(model / shards[1], 4)
    tiny_safetensors(model / shards[2], 4)
    check_model_dir(model)
    raw = (model / shards[2]).read_bytes()
    (model / shards[2]).write_bytes(raw[:-1])
    with pytest.raises(CheckpointError, match="model-00003-of-00003.safetensors is truncated"):
        check_model_dir(model)


def test_file_problem_reads_the_header_and_size_only(tmp_path):
    path = tmp_path / "x.safetensors"
    tiny_safetensors(path, 2)
    assert file_problem(path) is None
    assert file_problem(tmp_path / "absent.safetensors") == "absent.safetensors is missing"


# ----------------------------------------------------------------------------- parquet shards


def parquet_taskset(folder: Path, shards: int = 3, rows: int = 4) -> list[Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir()
    files = []
    for s in range(shards):
        table = pa.table(
            {
                "question": [f"{s}-{i} + 1 = ?" for i in range(rows)],
                "answer": [str(i + 1) for i in range(rows)],
            }
        )
        files.append(folder / f"train-{s:05d}-of-{shards:05d}.parquet")
        pq.write_table(table, files[-1])
    return files


def test_a_truncated_second_parquet_shard_is_named_at_dry_run(tiny_model_dir, tmp_path):
    files = parquet_taskset(tmp_path / "ts")
    cfg = config(
        tiny_model_dir,
        f"buffer.explorer_input.taskset.path={tmp_path / 'ts'}",
        "buffer.explorer_input.taskset.subset_name=null",
        "buffer.explorer_input.eval_tasksets=[]",
    )
    assert sum(i.rows for i in preflight(cfg)) == 12
    raw = files[1].read_bytes()
    files[1].write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DataError) as info:
        preflight(cfg)
    message = str(info.value)
    assert message.startswith("buffer.explorer_input.taskset: ")
    assert f"{files[1]} (shard 2 of 3): cannot read the parquet schema" in message
    assert "fetch it again" in message


def test_the_explorer_load_names_the_damaged_shard_not_the_first(tmp_path):
    files = parquet_taskset(tmp_path / "ts")
    raw = files[2].read_bytes()
    files[2].write_bytes(raw[:-9])  # the footer's length and magic bytes gone
    with pytest.raises(DataError) as info:
        data.load_split(str(tmp_path / "ts"), "train", None, "taskset", {})
    assert f"{files[2]} (shard 3 of 3)" in str(info.value)
    assert str(files[0]) not in str(info.value)
    with pytest.raises(DataError, match=r"train-00002-of-00003.parquet \(shard 3 of 3\)"):
        data.num_rows(data.resolve(str(tmp_path / "ts"), "train"))  # the trainer's step count
