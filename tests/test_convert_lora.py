"""rft-convert on LoRA checkpoints: the PEFT adapter folder from the DeepSpeed shards, and --merge.

Fast tests cover the name mapping, the rank and base-model checks and the recognition of a LoRA
step whose shards cannot be read. Integration tests train a LoRA adapter (r=4, alpha 8, every
linear layer) of the tiny Llama a few steps with real DeepSpeed (gloo, CPU, one rank; ZeRO-2 and
ZeRO-3), once per module, saved as rft's LoRA trainer saves it (``exclude_frozen_parameters``,
``actor/huggingface/`` written by PEFT's ``save_pretrained``); they convert copies and load the
results with PEFT and transformers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from rft.convert.adapter import (
    adapter_tensors,
    check_fits_base,
    check_lora_ranks,
    is_lora_checkpoint,
)
from rft.convert.cli import main
from rft.convert.types import Job, SourceTensor
from rft.errors import CheckpointError
from rft.models import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from tests.helpers.checkpoint_scripts import torchrun_script

LORA_RANK, LORA_ALPHA = 4, 8  # make_ds_checkpoint.py --lora 4 sets alpha = 2 * r
STEPS = {1: "ZeRO-2", 2: "ZeRO-3"}
PREFIX = "base_model.model.model.layers.0.self_attn.q_proj"


# ----------------------------------------------------------------------------- fast unit tests


def _tensor(name: str, *shape: int) -> SourceTensor:
    return SourceTensor(name, shape, torch.float32, lambda: torch.zeros(shape))


def test_adapter_tensors_get_peft_saved_names_and_base_weights_are_left_out() -> None:
    tensors = [
        _tensor(f"{PREFIX}.base_layer.weight", 64, 64),
        _tensor(f"{PREFIX}.lora_A.default.weight", 4, 64),
        _tensor(f"{PREFIX}.lora_B.default.weight", 64, 4),
    ]
    assert [t.name for t in adapter_tensors(tensors, "s")] == [
        f"{PREFIX}.lora_A.weight",
        f"{PREFIX}.lora_B.weight",
    ]
    with pytest.raises(CheckpointError, match="does not start with 'base_model.model.'"):
        adapter_tensors([_tensor("model.layers.0.q_proj.lora_A.default.weight", 4, 64)], "s")


def test_ranks_are_checked_against_the_adapter_config() -> None:
    tensors = [_tensor(f"{PREFIX}.lora_A.weight", 4, 64), _tensor(f"{PREFIX}.lora_B.weight", 64, 4)]
    assert check_lora_ranks({"r": 4}, tensors, "adapter_config.json", "s") == 4
    with pytest.raises(
        CheckpointError, match=r"lora_A.weight has shape \[4, 64\] \(rank 4\).*says r=8"
    ):
        check_lora_ranks({"r": 8}, tensors, "adapter_config.json", "s")
    assert (
        check_lora_ranks(
            {"r": 8, "rank_pattern": {"q_proj": 4}}, tensors, "adapter_config.json", "s"
        )
        == 8
    )


def test_the_adapter_must_fit_the_base_models_layers(tiny_model_dir: Path) -> None:
    fits = [_tensor(f"{PREFIX}.lora_A.weight", 4, 64), _tensor(f"{PREFIX}.lora_B.weight", 64, 4)]
    check_fits_base(fits, tiny_model_dir, "s")
    check_fits_base(fits, None, "s")  # no base at hand: nothing to check
    with pytest.raises(CheckpointError, match="does not fit the base model.*q_proj.weight"):
        check_fits_base([_tensor(f"{PREFIX}.lora_A.weight", 4, 32)], tiny_model_dir, "s")


def test_an_adapter_folder_marks_a_lora_step_whose_shards_cannot_be_read(tmp_path: Path) -> None:
    actor = tmp_path / "global_step_1" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    (actor / "mp_rank_00_model_states.pt").write_bytes(b"not a real shard")
    job = Job("global_step_1", 1, actor, actor / "huggingface")
    assert not is_lora_checkpoint(job)
    (actor / "huggingface" / ADAPTER_CONFIG).write_text("{}")
    assert is_lora_checkpoint(job)


# ----------------------------------------------------------------------------- checkpoints


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """global_step_1: ZeRO-2, global_step_2: ZeRO-3; one rank, fp32, adapter only in the shards."""
    run = tmp_path_factory.mktemp("lora") / "run"
    for step, stage in ((1, 2), (2, 3)):
        torchrun_script(
            "make_ds_checkpoint.py",
            1,
            "--model-dir",
            str(tiny_model_dir),
            "--step-dir",
            str(run / f"global_step_{step}"),
            "--stage",
            str(stage),
            "--hf-files",
            "--lora",
            str(LORA_RANK),
        )
    return run


@pytest.fixture
def run_copy(lora_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(lora_run, tmp_path / "run"))


def _adapter_dir(run: Path, step: int) -> Path:
    return run / f"global_step_{step}" / "actor" / "huggingface"


def _merged_dir(run: Path, step: int) -> Path:
    return run / f"global_step_{step}" / "actor" / "huggingface_merged"


def _peft_model(base: Path, adapter: Path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    return PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), adapter
    ).eval()


def _logits(model, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=input_ids).logits.float()


def _engine_logits_diff(run: Path, step: int, base: Path) -> float:
    """Max |logits| difference between base + the converted adapter and the trained engine."""
    ref = torch.load(run / f"global_step_{step}" / "reference_logits.pt")
    return (
        (_logits(_peft_model(base, _adapter_dir(run, step)), ref["input_ids"]) - ref["logits"])
        .abs()
        .max()
        .item()
    )


def _no_temporaries(run: Path) -> bool:
    return not [p for p in run.rglob("*") if ".tmp" in p.name or p.name.endswith(".previous")]


# ----------------------------------------------------------------------------- integration


@pytest.mark.integration
def test_adapter_folder_from_the_shards_equals_peft_and_the_engine(
    run_copy: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    from safetensors.torch import load_file

    before = {
        s: (
            load_file(_adapter_dir(run_copy, s) / ADAPTER_WEIGHTS),
            (_adapter_dir(run_copy, s) / ADAPTER_CONFIG).read_bytes(),
        )
        for s in STEPS
    }
    assert any(t.abs().max() > 0 for name, t in before[1][0].items() if "lora_B" in name)  # trained
    assert main(["--checkpoint-dir", str(run_copy), "--force"]) == 0
    out = capsys.readouterr().out
    assert "2 converted" in out and "lora r=4" in out and "deepspeed-zero3" in out
    for step, stage in STEPS.items():
        hf = _adapter_dir(run_copy, step)
        rebuilt, (peft_saved, config) = load_file(hf / ADAPTER_WEIGHTS), before[step]
        assert rebuilt.keys() == peft_saved.keys(), stage  # PeftModel.save_pretrained's names
        assert all(torch.equal(rebuilt[k], peft_saved[k]) for k in rebuilt), stage
        assert (hf / ADAPTER_CONFIG).read_bytes() == config and (hf / "README.md").is_file()
        assert _engine_logits_diff(run_copy, step, tiny_model_dir) < 1e-5, stage
    assert main(["--checkpoint-dir", str(run_copy)]) == 0
    assert "0 converted, 2 skipped, 0 failed" in capsys.readouterr().out
    assert _no_temporaries(run_copy)


@pytest.mark.integration
def test_missing_or_damaged_adapter_is_rebuilt_from_the_shards(
    run_copy: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    (_adapter_dir(run_copy, 1) / ADAPTER_WEIGHTS).unlink()
    damaged = _adapter_dir(run_copy, 2) / ADAPTER_WEIGHTS
    with open(damaged, "r+b") as f:
        f.truncate(damaged.stat().st_size // 2)
    assert main(["--checkpoint-dir", str(run_copy)]) == 0
    assert "2 converted" in capsys.readouterr().out
    for step in STEPS:
        assert _engine_logits_diff(run_copy, step, tiny_model_dir) < 1e-5
    # No adapter_config.json either: rebuilt from the shapes, given the base model and alpha ...
    step1 = run_copy / "global_step_1"
    shutil.rmtree(_adapter_dir(run_copy, 1))
    assert main(["--checkpoint-dir", str(step1)]) == 1
    out = capsys.readouterr().out
    assert "adapter_config.json is missing" in out and "--base-model-dir and --lora-alpha" in out
    assert (
        main(
            [
                "--checkpoint-dir",
                str(step1),
                "--base-model-dir",
                str(tiny_model_dir),
                "--lora-alpha",
                str(LORA_ALPHA),
            ]
        )
        == 0
    )
    config = json.loads((_adapter_dir(run_copy, 1) / ADAPTER_CONFIG).read_text())
    assert config["r"] == LORA_RANK and config["base_model_name_or_path"] == str(
        tiny_model_dir.resolve()
    )
    assert _engine_logits_diff(run_copy, 1, tiny_model_dir) < 1e-5
    assert (
        main(["--checkpoint-dir", str(step1), "--force", "--lora-alpha", "16"]) == 1
    )  # not silently ignored
    assert "--lora-alpha 16 conflicts with" in capsys.readouterr().out
    # ... or from the run's config.yaml (model.model_path, model.lora_configs[0])
    shutil.rmtree(_adapter_dir(run_copy, 1))
    (run_copy / "config.yaml").write_text(
        f"model:\n  model_path: {tiny_model_dir}\n  lora_configs:\n"
        f"  - lora_rank: {LORA_RANK}\n    lora_alpha: {LORA_ALPHA}\n"
    )
    assert main(["--checkpoint-dir", str(step1)]) == 0
    assert "adapter_config.json rebuilt" in capsys.readouterr().out
    assert _engine_logits_diff(run_copy, 1, tiny_model_dir) < 1e-5
    assert _no_temporaries(run_copy)


@pytest.mark.integration
def test_merge_writes_a_full_model_equal_to_base_plus_adapter(
    run_copy: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    from transformers import AutoModelForCausalLM

    assert main(["--checkpoint-dir", str(run_copy), "--merge"]) == 0
    out = capsys.readouterr().out
    assert (
        "2 converted" in out and "huggingface_merged" in out and "merge 3/4" not in out
    )  # logged, not printed
    ids = torch.load(run_copy / "global_step_1" / "reference_logits.pt")["input_ids"]
    base_logits = _logits(AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval(), ids)
    for step, stage in STEPS.items():
        merged_dir = _merged_dir(run_copy, step)
        assert {
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer.json",
            "chat_template.jinja",
        } <= {p.name for p in merged_dir.iterdir()}
        assert json.loads((merged_dir / "config.json").read_text())["dtype"] == "float32"
        merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
        peft = _peft_model(tiny_model_dir, _adapter_dir(run_copy, step))
        expected = _logits(peft, ids)
        assert (_logits(merged, ids) - expected).abs().max() < 1e-4, stage
        assert (expected - base_logits).abs().max() > 1e-2, stage  # the adapter changes the model
        prompt = ids[:1, :6]
        with torch.no_grad():
            tokens = merged.generate(input_ids=prompt, max_new_tokens=8, do_sample=False)
            assert torch.equal(
                tokens, peft.generate(input_ids=prompt, max_new_tokens=8, do_sample=False)
            ), stage
    assert main(["--checkpoint-dir", str(run_copy), "--merge"]) == 0
    assert "0 converted, 2 skipped, 0 failed" in capsys.readouterr().out
    assert (
        main(
            [
                "--checkpoint-dir",
                str(run_copy),
                "--merge",
                "--steps",
                "1",
                "--force",
                "--dtype",
                "bf16",
            ]
        )
        == 0
    )
    assert json.loads((_merged_dir(run_copy, 1) / "config.json").read_text())["dtype"] == "bfloat16"
    assert _no_temporaries(run_copy)


@pytest.mark.integration
def test_merge_needs_a_base_model_that_fits(
    run_copy: Path, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from rft.devtools import make_tiny_model

    step1 = run_copy / "global_step_1"
    config_path = _adapter_dir(run_copy, 1) / ADAPTER_CONFIG
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = str(tmp_path / "moved-away")
    config_path.write_text(json.dumps(config))
    assert main(["--checkpoint-dir", str(step1), "--merge"]) == 1
    out = capsys.readouterr().out
    assert (
        "--merge needs the base model" in out
        and "moved-away" in out
        and "pass --base-model-dir" in out
    )
    assert not _merged_dir(run_copy, 1).exists() and _no_temporaries(run_copy)
    narrow = make_tiny_model(tmp_path / "narrow", hidden_size=32, tokenizer_dir=tiny_model_dir)
    assert main(["--checkpoint-dir", str(step1), "--merge", "--base-model-dir", str(narrow)]) == 1
    assert "does not load onto the base model" in capsys.readouterr().out
    assert (
        main(["--checkpoint-dir", str(step1), "--merge", "--base-model-dir", str(tiny_model_dir)])
        == 0
    )
    assert (_merged_dir(run_copy, 1) / "model.safetensors").is_file()


@pytest.mark.integration
def test_a_damaged_shard_or_a_wrong_config_fails_and_keeps_the_adapter(
    run_copy: Path, capsys: pytest.CaptureFixture
) -> None:
    from safetensors.torch import load_file

    hf = _adapter_dir(run_copy, 1)
    adapter_bytes = (hf / ADAPTER_WEIGHTS).read_bytes()
    b = load_file(hf / ADAPTER_WEIGHTS)[f"{PREFIX}.lora_B.weight"]
    optim = (
        run_copy
        / "global_step_1"
        / "actor"
        / "global_step2"
        / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    )
    data = bytearray(optim.read_bytes())
    needle = b.numpy().tobytes()[:64]  # the fp32 master weights of a trained lora_B
    pos = data.find(needle)
    assert pos >= 0 and data.find(needle, pos + 1) < 0
    data[pos + 32] ^= 0x10
    optim.write_bytes(bytes(data))
    assert main(["--checkpoint-dir", str(run_copy / "global_step_1"), "--force"]) == 1
    out = capsys.readouterr().out
    assert "zero_pp_rank_0_mp_rank_00_optim_states.pt" in out and "damaged" in out
    assert (hf / ADAPTER_WEIGHTS).read_bytes() == adapter_bytes and _no_temporaries(run_copy)
    config = json.loads((_adapter_dir(run_copy, 2) / ADAPTER_CONFIG).read_text())
    (_adapter_dir(run_copy, 2) / ADAPTER_CONFIG).write_text(json.dumps({**config, "r": 8}))
    assert main(["--checkpoint-dir", str(run_copy / "global_step_2"), "--force"]) == 1
    assert "(rank 4) but the adapter_config.json kept says r=8" in capsys.readouterr().out
