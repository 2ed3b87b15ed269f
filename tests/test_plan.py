"""`rft-run --dry-run`: validation of the model folder and datasets, the printed plan, and the
dataset layouts users have (hub folders with subsets, single files, saved datasets)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rft import data
from rft.launch.cli import dry_run, run_main as main
from rft.config.load import load_config
from rft.errors import ConfigError, DataError

REPO = Path(__file__).resolve().parent.parent
CPU_CONFIG = REPO / "configs" / "cpu" / "grpo_gsm8k.yaml"
ARITHMETIC = REPO / "data" / "arithmetic"


def overrides(model: Path, *extra: str) -> list[str]:
    return [f"model.model_path={model}", f"buffer.explorer_input.taskset.path={ARITHMETIC}",
            f"buffer.explorer_input.eval_tasksets.0.path={ARITHMETIC}",
            "checkpoint_root_dir=/tmp/rft-plan-test", *extra]


def test_dry_run_prints_resolved_config_and_plan(tiny_model_dir):
    cfg = load_config(CPU_CONFIG, overrides(tiny_model_dir))
    text = dry_run(cfg, str(CPU_CONFIG))
    assert "train_batch_size: 4" in text  # resolved: 2 tasks x 2 samples
    assert "run directory" in text and "/tmp/rft-plan-test/grpo_gsm8k_cpu/smollm2-135m (new)" in text
    assert "256 rows, columns question, answer" in text
    assert "1 vLLM task(s) x TP 1" in text
    assert "1 DeepSpeed rank(s), ZeRO-2" in text
    assert "steps             2 (buffer.total_steps)" in text


def test_bin_rft_run_dry_run_end_to_end(tiny_model_dir):
    proc = subprocess.run([sys.executable, str(REPO / "bin" / "rft-run"), "--config",
                           str(CPU_CONFIG), "--dry-run", *overrides(tiny_model_dir)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "dry run: config and inputs are valid" in proc.stdout


def test_missing_column_names_key_and_columns(tiny_model_dir, capsys):
    code = main(["--config", str(CPU_CONFIG), "--dry-run",
                 *overrides(tiny_model_dir, "buffer.explorer_input.taskset.format.prompt_key=questoin")])
    err = capsys.readouterr().err
    assert code == 2
    assert "buffer.explorer_input.taskset.format.prompt_key='questoin' is not a column" in err
    assert "did you mean 'question'" in err
    assert "Traceback" not in err


def test_missing_split_lists_the_splits(tiny_model_dir):
    cfg = load_config(CPU_CONFIG, overrides(tiny_model_dir, "buffer.explorer_input.taskset.split=validation"))
    with pytest.raises(DataError, match=r"no files for split 'validation'.*found splits: test, train"):
        dry_run(cfg, "x")


def test_missing_model_folder(tmp_path):
    cfg = load_config(CPU_CONFIG, overrides(tmp_path / "no-model"))
    with pytest.raises(Exception, match="does not exist; set model.model_path"):
        dry_run(cfg, "x")


def test_hub_id_instead_of_a_folder_says_to_download(tiny_model_dir):
    cfg = load_config(CPU_CONFIG, overrides(tiny_model_dir, "buffer.explorer_input.taskset.path=openai/gsm8k"))
    with pytest.raises(DataError, match="rft reads local datasets only; download"):
        dry_run(cfg, "x")


def test_unknown_subset_lists_subsets():
    with pytest.raises(DataError, match=r"subset_name 'socratic'.*subsets found: main, sft"):
        data.resolve(ARITHMETIC, "train", "socratic")


def test_layouts(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"prompt": ["1+1?", "2+2?"], "answer": ["2", "4"]})
    (tmp_path / "hub" / "data").mkdir(parents=True)
    pq.write_table(table, tmp_path / "hub" / "data" / "train-00000-of-00002.parquet")
    pq.write_table(table, tmp_path / "hub" / "data" / "train-00001-of-00002.parquet")
    pq.write_table(table, tmp_path / "hub" / "data" / "test-00000-of-00001.parquet")
    source = data.resolve(tmp_path / "hub", "train")
    assert source.format == "parquet" and len(source.files) == 2
    assert data.read_columns(source) == ["prompt", "answer"]
    assert data.count_rows(source) == 4

    single = tmp_path / "rows.json"
    single.write_text(json.dumps([{"q": "a", "a": "b"}]))
    assert data.read_columns(data.resolve(single)) == ["q", "a"]

    import datasets

    datasets.Dataset.from_dict({"question": ["x"], "answer": ["y"]}).save_to_disk(str(tmp_path / "saved"))
    saved = data.resolve(tmp_path / "saved", "train")
    assert saved.format == "saved" and data.read_columns(saved) == ["question", "answer"]
    datasets.DatasetDict({"test": datasets.Dataset.from_dict({"q": ["x"]})}).save_to_disk(
        str(tmp_path / "saved_dict"))
    with pytest.raises(DataError, match="has no split 'train'; it has: test"):
        data.resolve(tmp_path / "saved_dict", "train")


def test_empty_and_damaged_files(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DataError, match="is empty"):
        data.read_columns(data.resolve(empty))
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 not really")
    with pytest.raises(DataError, match="cannot read the parquet schema"):
        data.read_columns(data.resolve(broken))


def test_context_longer_than_the_model_is_refused(tiny_model_dir):
    cfg = load_config(CPU_CONFIG, overrides(tiny_model_dir, "model.max_model_len=4096"))
    with pytest.raises(ConfigError, match="model.max_model_len=4096 exceeds the model's "
                                          "max_position_embeddings=1024"):
        dry_run(cfg, "x")
