"""``mode: bench`` without an engine: which models it evaluates (the base as step 0, then the
checkpoints, each once), the answer extractor it names per taskset, and its table."""

from __future__ import annotations

import json
import math
from pathlib import Path

from rft.explorer.bench import BASE_LABEL, bench_plan, find_checkpoints, format_table
from rft.rundir import hf_dir
from rft.sync.publisher import WeightsPublisher


def hf_folder(folder: Path) -> Path:
    """A folder that passes the model-folder check (config, tokenizer, weights); never loaded."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "tokenizer.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"\x02" + b"\0" * 7 + b"{}")  # no tensors, whole
    return folder


def publish(run_dir: Path, *versions: int) -> None:
    publisher = WeightsPublisher(run_dir, keep_versions=len(versions) + 1)
    for version in versions:
        publisher.publish(version, lambda tmp: (tmp / "model.safetensors").write_bytes(b"w"))


def test_checkpoints_are_listed_oldest_first_with_the_hf_folder_winning(tmp_path):
    run_dir = tmp_path / "run"
    publish(run_dir, 1, 2)
    hf_folder(hf_dir(run_dir, 2))
    hf_folder(hf_dir(run_dir, 3))
    (run_dir / "global_step_4" / "actor").mkdir(parents=True)  # no huggingface/: not listed
    found = find_checkpoints(run_dir)
    assert [(step, label) for step, label, _ in found] == [
        (1, "weights/v000001"),
        (2, "global_step_2/actor/huggingface"),
        (3, "global_step_3/actor/huggingface"),
    ]
    assert find_checkpoints(tmp_path / "missing") == []


def test_the_base_is_step_zero_and_comes_first(tmp_path):
    base = tmp_path / "model"
    ckpts = [(1, "weights/v000001", tmp_path / "v1"), (2, "weights/v000002", tmp_path / "v2")]
    assert bench_plan(base, ckpts) == [(0, BASE_LABEL, base), *ckpts]
    assert bench_plan(str(base), ckpts, latest_only=True) == [(0, BASE_LABEL, base), ckpts[1]]


def test_without_checkpoints_the_base_alone_is_evaluated(tmp_path):
    assert bench_plan(tmp_path / "model", []) == [(0, BASE_LABEL, tmp_path / "model")]
    assert bench_plan(tmp_path / "model", [], latest_only=True) == [
        (0, BASE_LABEL, tmp_path / "model")
    ]


def test_a_step_zero_checkpoint_is_the_base_and_is_evaluated_once(tmp_path):
    run_dir = tmp_path / "run"
    publish(run_dir, 0, 1)
    plan = bench_plan(tmp_path / "model", find_checkpoints(run_dir))
    assert [(step, label) for step, label, _ in plan] == [(0, BASE_LABEL), (1, "weights/v000001")]


def test_a_model_path_that_is_a_checkpoint_gets_no_second_row(tmp_path):
    run_dir = tmp_path / "run"
    first, second = hf_folder(hf_dir(run_dir, 1)), hf_folder(hf_dir(run_dir, 2))
    ckpts = find_checkpoints(run_dir)
    assert [label for _, label, _ in bench_plan(first, ckpts)] == [
        "global_step_1/actor/huggingface",
        "global_step_2/actor/huggingface",
    ]
    assert bench_plan(first, ckpts, latest_only=True) == ckpts  # the "base" and the newest
    assert bench_plan(second, ckpts, latest_only=True) == ckpts[1:]
    assert [folder for _, _, folder in ckpts] == [first, second]


def metrics(name: str, accuracy: float, k: int = 4) -> dict[str, float]:
    return {
        f"eval/{name}/mean@{k}": accuracy,
        f"eval/{name}/pass@{k}": 0.75,
        f"eval/{name}/reward_mean": accuracy - 0.1,
        f"eval/{name}/response_length_mean": 42.0,
        f"eval/{name}/tasks": 8,
    }


def test_table_has_the_base_row_first_accuracy_and_each_extractor():
    table = format_table(
        [
            (BASE_LABEL, metrics("gsm8k", 0.25)),
            ("global_step_2/actor/huggingface", metrics("gsm8k", 0.5)),
        ],
        {"gsm8k": "last <answer>...</answer> tag"},
    )
    lines = table.splitlines()
    assert lines[0].split() == ["checkpoint", "taskset", "accuracy", "pass@k", "reward", "length"]
    assert lines[1].startswith(BASE_LABEL)
    assert lines[1].split()[-5:] == ["gsm8k", "0.250", "0.750", "0.150", "42.0"]
    assert lines[2].split() == [
        "global_step_2/actor/huggingface",
        "gsm8k",
        "0.500",
        "0.750",
        "0.400",
        "42.0",
    ]
    assert "mean of the reward's 'accuracy' part" in table
    assert lines[-1] == "answer extractor of gsm8k: last <answer>...</answer> tag"


def test_table_rows_per_taskset_and_missing_metrics_show_nan():
    row = {**metrics("a", 1.0), **metrics("b", 0.0, k=1), "eval/c/tasks": 0}
    lines = format_table([(BASE_LABEL, row)]).splitlines()
    assert [line.split()[2] for line in lines[1:4]] == ["a", "b", "c"]
    assert math.isnan(float(lines[3].split()[3]))
