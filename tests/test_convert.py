"""rft-convert: DeepSpeed ZeRO-1/2/3 and FSDP checkpoints -> HF folders whose logits match training.

Fast tests cover the lazy torch-file reader, the streaming safetensors writer and step discovery.
Integration tests train tiny models a few steps with real DeepSpeed (gloo, CPU; ZeRO-2/3 on two
ranks) and FSDP2, once per session, lay them out as an rft run directory
(``<run>/global_step_N/actor/...``), convert copies and load the result with transformers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from rft.convert import cli as convert
from rft.convert.cli import find_jobs, main
from rft.convert.readers import detect_format
from rft.convert.torchfile import open_torch_file
from rft.errors import CheckpointError
from rft.safetensors_io import (
    TensorSpec,
    parse_size,
    plan_shards,
    weights_complete,
    write_safetensors,
)
from tests.helpers.checkpoint_scripts import torchrun_script

REPO = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- fast unit tests


def test_lazy_reader_reads_tensors_without_torch_load(tmp_path: Path) -> None:
    a = torch.randn(5, 7)
    obj = {
        "a": a,
        "t": a.t(),
        "bf": torch.arange(10, dtype=torch.bfloat16)[3:],
        "p": torch.nn.Parameter(torch.ones(3)),
        "meta": {"stage": 3, "shape": torch.Size([2, 3])},
    }
    torch.save(obj, tmp_path / "x.pt")
    archive, tree = open_torch_file(tmp_path / "x.pt")
    with archive:
        assert torch.equal(tree["a"].load(), a) and torch.equal(tree["t"].load(), a.t())
        assert torch.equal(tree["bf"].read(2, 3), torch.tensor([5, 6, 7], dtype=torch.bfloat16))
        assert torch.equal(tree["p"].load(), torch.ones(3))
        assert tree["meta"] == {"stage": 3, "shape": torch.Size([2, 3])}


def test_lazy_reader_never_runs_code_from_the_file(tmp_path: Path) -> None:
    torch.save({"obj": Path("/etc"), "x": torch.zeros(2)}, tmp_path / "x.pt")
    archive, tree = open_torch_file(tmp_path / "x.pt")
    archive.close()
    assert not isinstance(tree["obj"], Path) and "PosixPath" in repr(tree["obj"])


class _Thing:
    """Pickled with NEWOBJ (no __init__ call on load), like DeepSpeed's LossScaler."""

    def __init__(self) -> None:
        self.a = 1


def test_lazy_reader_keeps_objects_made_without_init_inert(tmp_path: Path) -> None:
    torch.save({"obj": _Thing(), "x": torch.zeros(2)}, tmp_path / "x.pt")
    archive, tree = open_torch_file(tmp_path / "x.pt")
    archive.close()
    assert (
        "_Thing" in repr(tree["obj"]) and tree["obj"].state == {"a": 1} and tree["obj"].args == ()
    )


def test_lazy_reader_rejects_truncated_files(tmp_path: Path) -> None:
    torch.save({"x": torch.randn(1000)}, tmp_path / "x.pt")
    data = (tmp_path / "x.pt").read_bytes()
    (tmp_path / "x.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="x.pt"):
        open_torch_file(tmp_path / "x.pt")


def test_streaming_safetensors_writer_round_trips(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    tensors = {
        "a": torch.randn(3, 4),
        "b": torch.arange(6, dtype=torch.int64),
        "c": torch.randn(2).bfloat16(),
    }
    specs = [TensorSpec(k, tuple(v.shape), v.dtype) for k, v in tensors.items()]
    write_safetensors(tmp_path / "model.safetensors", specs, lambda s: tensors[s.name])
    back = load_file(tmp_path / "model.safetensors")
    assert all(torch.equal(back[k], v) for k, v in tensors.items())
    assert weights_complete(tmp_path)
    with open(tmp_path / "model.safetensors", "r+b") as f:
        f.truncate(40)
    assert not weights_complete(tmp_path)


def test_shard_planning_and_sizes() -> None:
    specs = [TensorSpec(str(i), (250,), torch.float32) for i in range(5)]  # 1000 bytes each
    assert [len(s) for s in plan_shards(specs, 2000)] == [2, 2, 1]
    assert [len(s) for s in plan_shards(specs, 10)] == [1, 1, 1, 1, 1]
    assert (
        parse_size("5GB") == 5 * 10**9
        and parse_size("2MiB") == 2 * 2**20
        and parse_size("123") == 123
    )
    with pytest.raises(ValueError):
        parse_size("lots")


def test_find_jobs_layouts(tmp_path: Path) -> None:
    run = tmp_path / "proj" / "run"
    for n in (10, 2):
        (run / f"global_step_{n}" / "actor" / f"global_step{n}").mkdir(parents=True)
    (run / "weights" / "v000002").mkdir(parents=True)
    assert [j.step for j in find_jobs(tmp_path)] == [2, 10]
    assert [j.step for j in find_jobs(run, {10})] == [10]
    inner = run / "global_step_10" / "actor" / "global_step10"
    (job,) = find_jobs(inner)
    assert job.step == 10 and job.ckpt_dir == inner.resolve()
    assert job.out_dir == (run / "global_step_10" / "actor" / "huggingface").resolve()
    (job,) = find_jobs(run / "global_step_2" / "actor")
    assert job.ckpt_dir.name == "actor"
    (run / "global_step_2" / "actor" / "huggingface").mkdir()
    (job,) = find_jobs(run / "global_step_2" / "actor" / "huggingface")
    assert job.ckpt_dir.name == "actor" and job.out_dir.parent.name == "actor"
    (run / "global_step_2" / "critic").mkdir()
    (job,) = find_jobs(run / "global_step_2" / "critic")
    assert job.ckpt_dir.name == "critic" and job.out_dir.parent.name == "critic"
    with pytest.raises(CheckpointError, match="global_step_7"):
        find_jobs(run, {7})
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        find_jobs(run / "weights")


def _fake_files(folder: Path, *names: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"not a real shard")


def test_megatron_checkpoints_are_refused_with_the_way_out(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from rft.errors import EXIT_USER_ERROR

    # veRL / Trinity with the Megatron backend: global_step_N/actor/dist_ckpt (torch_dist shards)
    run = tmp_path / "trinity_run"
    actor = run / "global_step_5" / "actor"
    _fake_files(
        actor / "dist_ckpt",
        "__0_0.distcp",
        "__1_0.distcp",
        ".metadata",
        "common.pt",
        "metadata.json",
    )
    _fake_files(actor / "huggingface", "config.json", "tokenizer.json")
    _fake_files(actor, "transformer_config.json")
    (run / "latest_checkpointed_iteration.txt").write_text("5")
    for path in (run, run / "global_step_5", actor, actor / "dist_ckpt"):
        assert main(["--checkpoint-dir", str(path)]) == EXIT_USER_ERROR
        err = capsys.readouterr().err
        assert "is a Megatron checkpoint" in err and "trinity convert" in err, err
        assert "--base-model-dir" not in err
    assert not (actor / "huggingface" / "model.safetensors").exists()
    # Megatron-LM's own save folder (legacy per-rank files), passed bare
    save = tmp_path / "megatron_save"
    _fake_files(save / "iter_0000100" / "mp_rank_00", "model_optim_rng.pt")
    (save / "latest_checkpointed_iteration.txt").write_text("100")
    for path in (save, save / "iter_0000100", save / "iter_0000100" / "mp_rank_00"):
        with pytest.raises(CheckpointError, match="Megatron checkpoint"):
            detect_format(path)
    # rft's own run root holds latest_checkpointed_iteration.txt and DeepSpeed's mp_rank_00_*
    # files: not Megatron
    ours = tmp_path / "rft_run"
    _fake_files(ours / "global_step_1" / "actor" / "global_step1", "mp_rank_00_model_states.pt")
    (ours / "latest_checkpointed_iteration.txt").write_text("1")
    assert [j.step for j in find_jobs(ours)] == [1]


# ----------------------------------------------------------------------------- checkpoints


@pytest.fixture(scope="session")
def untied_model_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_tokenizer_dir: Path) -> Path:
    """A GPT-NeoX layout with separate input/output embeddings: other names than Llama's."""
    from rft.devtools import make_tiny_model

    return make_tiny_model(
        tmp_path_factory.mktemp("models") / "neox",
        arch="gpt_neox",
        tie_word_embeddings=False,
        tokenizer_dir=smollm2_tokenizer_dir,
    )


@pytest.fixture(scope="session")
def ds_run(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, untied_model_dir: Path
) -> Path:
    """A run directory with three DeepSpeed checkpoints (built once per session, ~1 min):

    global_step_1  ZeRO-3, 2 ranks, fp32, tag folder + latest, trainer-written huggingface/ files
    global_step_2  ZeRO-2, 2 ranks, fp32, files directly in actor/, no HF files (plain DeepSpeed)
    global_step_3  ZeRO-1, 1 rank, bf16, GPT-NeoX untied, first layer frozen, huggingface/ files
    """
    run = tmp_path_factory.mktemp("ds") / "run"
    model = str(tiny_model_dir)
    torchrun_script(
        "make_ds_checkpoint.py",
        2,
        "--model-dir",
        model,
        "--step-dir",
        str(run / "global_step_1"),
        "--stage",
        "3",
        "--hf-files",
    )
    torchrun_script(
        "make_ds_checkpoint.py",
        2,
        "--model-dir",
        model,
        "--step-dir",
        str(run / "global_step_2"),
        "--stage",
        "2",
        "--flat",
    )
    torchrun_script(
        "make_ds_checkpoint.py",
        1,
        "--model-dir",
        str(untied_model_dir),
        "--step-dir",
        str(run / "global_step_3"),
        "--stage",
        "1",
        "--bf16",
        "--hf-files",
        "--freeze",
        "layers.0.",
    )
    return run


@pytest.fixture(scope="session")
def fsdp_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    run = tmp_path_factory.mktemp("fsdp") / "run"
    torchrun_script(
        "make_fsdp_checkpoint.py",
        2,
        "--model-dir",
        str(tiny_model_dir),
        "--step-dir",
        str(run / "global_step_5"),
    )
    return run


@pytest.fixture
def run_copy(ds_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(ds_run, tmp_path / "run"))


def _logits_diff(step_dir: Path, dtype: torch.dtype = torch.float32) -> float:
    from transformers import AutoModelForCausalLM

    ref = torch.load(step_dir / "reference_logits.pt")
    model = AutoModelForCausalLM.from_pretrained(step_dir / "actor" / "huggingface", dtype=dtype)
    with torch.no_grad():
        logits = model(input_ids=ref["input_ids"]).logits.float()
    return (logits - ref["logits"]).abs().max().item()


# ----------------------------------------------------------------------------- integration


@pytest.mark.integration
def test_batch_conversion_matches_engine_logits_and_is_idempotent(
    run_copy: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    base = ["--base-model-dir", str(tiny_model_dir)]
    assert (
        main(["--checkpoint-dir", str(run_copy), "--dtype", "fp32", "--steps", "1,2", *base]) == 0
    )
    assert _logits_diff(run_copy / "global_step_1") < 1e-5  # ZeRO-3, 2 ranks, tied embeddings
    assert _logits_diff(run_copy / "global_step_2") < 1e-5  # ZeRO-2, flat layout, base-model files
    hf = run_copy / "global_step_1" / "actor" / "huggingface"
    assert {"config.json", "generation_config.json", "tokenizer.json", "chat_template.jinja"} <= {
        p.name for p in hf.iterdir()
    }
    assert json.loads((hf / "config.json").read_text())["dtype"] == "float32"
    # bf16-trained GPT-NeoX (untied, a frozen layer): bf16 output equals the engine's bf16 weights.
    assert main(["--checkpoint-dir", str(run_copy / "global_step_3"), "--dtype", "bf16"]) == 0
    assert _logits_diff(run_copy / "global_step_3", torch.bfloat16) < 1e-2
    capsys.readouterr()
    before = (hf / "model.safetensors").stat().st_mtime_ns
    assert main(["--checkpoint-dir", str(run_copy), *base]) == 0
    out = capsys.readouterr().out
    assert out.count("skipped") >= 3 and "0 converted, 3 skipped, 0 failed" in out
    assert (hf / "model.safetensors").stat().st_mtime_ns == before
    assert (
        main(["--checkpoint-dir", str(run_copy), "--steps", "1", "--force", "--dtype", "fp32"]) == 0
    )
    assert (hf / "model.safetensors").stat().st_mtime_ns != before
    assert not [p for p in hf.parent.iterdir() if ".tmp" in p.name]


@pytest.mark.integration
def test_inside_path_and_single_step(run_copy: Path) -> None:
    tag_dir = run_copy / "global_step_1" / "actor" / "global_step2"
    assert main(["--checkpoint-dir", str(tag_dir), "--dtype", "fp32"]) == 0
    assert weights_complete(run_copy / "global_step_1" / "actor" / "huggingface")
    assert not (run_copy / "global_step_3" / "actor" / "huggingface" / "model.safetensors").exists()
    assert _logits_diff(run_copy / "global_step_1") < 1e-5


@pytest.mark.integration
def test_sharded_output_loads_identically(run_copy: Path) -> None:
    step = run_copy / "global_step_1"
    assert (
        main(["--checkpoint-dir", str(step), "--dtype", "fp32", "--max-shard-size", "100KB"]) == 0
    )
    hf = step / "actor" / "huggingface"
    index = json.loads((hf / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 3 and not (hf / "model.safetensors").exists()
    assert _logits_diff(step) < 1e-5


@pytest.mark.integration
def test_plain_deepspeed_checkpoint_needs_the_right_base_model(
    run_copy: Path, untied_model_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["--checkpoint-dir", str(run_copy / "global_step_2")]) == 1
    assert "--base-model-dir" in capsys.readouterr().out
    assert (
        main(
            [
                "--checkpoint-dir",
                str(run_copy / "global_step_2"),
                "--base-model-dir",
                str(untied_model_dir),
            ]
        )
        == 1
    )
    assert "does not match --base-model-dir" in capsys.readouterr().out


@pytest.mark.integration
def test_bad_inputs_fail_clearly_while_other_steps_convert(
    run_copy: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    for n in (4, 5, 6):
        shutil.copytree(run_copy / "global_step_1", run_copy / f"global_step_{n}")
    tag = "actor/global_step2"
    (run_copy / "global_step_4" / tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    trunc = run_copy / "global_step_5" / tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    with open(trunc, "r+b") as f:
        f.truncate(trunc.stat().st_size // 2)
    extra = run_copy / "global_step_6" / tag / "zero_pp_rank_2_mp_rank_00_optim_states.pt"
    shutil.copy(extra.with_name("zero_pp_rank_1_mp_rank_00_optim_states.pt"), extra)
    (run_copy / "global_step_7" / "actor").mkdir(parents=True)
    code = main(
        [
            "--checkpoint-dir",
            str(run_copy),
            "--base-model-dir",
            str(tiny_model_dir),
            "--dtype",
            "fp32",
        ]
    )
    out = capsys.readouterr().out
    assert code == 1
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("global_step_")}
    assert (
        "missing rank shard" in rows["global_step_4"]
        and "zero_pp_rank_1_mp_rank_00_optim" in rows["global_step_4"]
    )
    assert (
        "zero_pp_rank_0_mp_rank_00_optim_states.pt" in rows["global_step_5"]
        and "failed" in rows["global_step_5"]
    )
    assert "world-size mismatch" in rows["global_step_6"]
    assert "not a checkpoint" in rows["global_step_7"]
    assert all("converted" in rows[f"global_step_{n}"] for n in (1, 2, 3))
    assert "3 converted, 0 skipped, 4 failed" in out
    for n in (4, 5, 6):
        hf = run_copy / f"global_step_{n}" / "actor" / "huggingface"
        assert not weights_complete(hf) and (hf / "config.json").is_file()  # trainer's files kept


@pytest.mark.integration
def test_interrupted_conversion_leaves_nothing_complete(
    run_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    step = run_copy / "global_step_1"
    hf = step / "actor" / "huggingface"
    calls = []

    def dying_writer(path, specs, produce, metadata=None):
        calls.append(path)
        produce(specs[0])
        raise KeyboardInterrupt  # as if the job were killed mid-write

    monkeypatch.setattr(convert, "write_safetensors", dying_writer)
    with pytest.raises(KeyboardInterrupt):
        main(["--checkpoint-dir", str(step), "--dtype", "fp32"])
    assert calls and not weights_complete(hf) and (hf / "tokenizer.json").is_file()
    monkeypatch.undo()
    assert main(["--checkpoint-dir", str(step), "--dtype", "fp32"]) == 0
    assert weights_complete(hf) and not [p for p in hf.parent.iterdir() if ".tmp" in p.name]


@pytest.mark.integration
def test_fsdp_checkpoint_converts(fsdp_run: Path, tmp_path: Path) -> None:
    run = Path(shutil.copytree(fsdp_run, tmp_path / "run"))
    assert main(["--checkpoint-dir", str(run), "--dtype", "fp32"]) == 0
    assert _logits_diff(run / "global_step_5") < 1e-5
    assert main(["--checkpoint-dir", str(run), "--dtype", "bf16", "--force"]) == 0
    assert _logits_diff(run / "global_step_5", torch.bfloat16) < 0.1
    shard = run / "global_step_5" / "actor" / "model_world_size_2_rank_1.pt"
    shard.rename(shard.with_name("model_world_size_2_rank_3.pt"))
    assert main(["--checkpoint-dir", str(run), "--force"]) == 1


@pytest.mark.integration
def test_without_optimizer_shards(
    run_copy: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    """ZeRO-1/2 fall back to the module weights (full size); ZeRO-3 has none and says so."""
    for f in (run_copy / "global_step_2" / "actor").glob("*optim_states.pt"):
        f.unlink()
    for f in (run_copy / "global_step_1" / "actor" / "global_step2").glob("*optim_states.pt"):
        f.unlink()
    code = main(
        [
            "--checkpoint-dir",
            str(run_copy),
            "--steps",
            "1,2",
            "--dtype",
            "fp32",
            "--base-model-dir",
            str(tiny_model_dir),
        ]
    )
    out = capsys.readouterr().out
    assert code == 1 and "without optimizer shards" in out and "deepspeed-module" in out
    assert (
        _logits_diff(run_copy / "global_step_2") < 1e-5
    )  # fp32 training: module == master weights


@pytest.mark.integration
def test_several_tags_without_latest_asks_for_one(run_copy: Path) -> None:
    actor = run_copy / "global_step_1" / "actor"
    shutil.copytree(actor / "global_step2", actor / "global_step9")
    (actor / "latest").unlink()
    with pytest.raises(CheckpointError, match="several DeepSpeed tags"):
        detect_format(actor)
    assert main(["--checkpoint-dir", str(actor / "global_step9"), "--dtype", "fp32"]) == 0
    assert _logits_diff(run_copy / "global_step_1") < 1e-5
