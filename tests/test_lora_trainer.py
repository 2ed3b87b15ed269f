"""LoRA in the trainer (``model.lora_configs``). Unmarked: the PEFT wrap (only the adapter
trains, step 0 is the base model), the adapter folder it writes (PEFT loads it with the same
logits), config rules. ``integration``: real DeepSpeed on CPU (two gloo ranks, tiny Llama,
ZeRO-2 and ZeRO-3): the reference is the base (KL 0 before the first update), every
published version is an adapter folder equal to the engine's adapter, checkpoints hold the
adapter only, and a SIGUSR1 stop + resume gives the uninterrupted run's losses."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers.trainer_runs import (
    STEPS,
    metrics,
    objective,
    run_interrupted,
    run_ok,
    torchrun_cmd,
    write_config,
    write_segments,
)

IDS = torch.tensor([[1, 5, 9, 2, 7, 3]])


def lora_cfg(**fields):
    from rft.config.schema import LoRAConfig

    return LoRAConfig(**{"lora_rank": 4, "lora_alpha": 8, **fields})


def test_wrap_trains_only_the_adapter_and_starts_at_the_base(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from rft.models import adapter_saved_name
    from rft.trainer.lora import ADAPTER, wrap
    from tests.helpers.trainer import trainable_names

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = base(input_ids=IDS).logits
    model = wrap(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
        lora_cfg(),
        str(tiny_model_dir),
    ).eval()
    names = trainable_names(model)
    assert names and all(".lora_A.default." in n or ".lora_B.default." in n for n in names)
    assert {n.split(".")[-4] for n in names} >= {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "down_proj",
    }
    assert adapter_saved_name(names[0], ADAPTER) == names[0].replace(".default.", ".")
    with torch.no_grad():
        assert torch.equal(model(input_ids=IDS).logits, expected)  # B = 0: the base model


def test_exclude_modules_leaves_those_modules_without_an_adapter(tiny_model_dir):
    """Trinity's LoRAConfig.exclude_modules, PEFT's: no adapter on the excluded modules."""
    from transformers import AutoModelForCausalLM

    from rft.trainer.lora import wrap
    from tests.helpers.trainer import trainable_names

    model = wrap(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
        lora_cfg(exclude_modules=["down_proj", "up_proj"]),
        str(tiny_model_dir),
    )
    kinds = {n.split(".")[-4] for n in trainable_names(model)}
    assert "q_proj" in kinds and not kinds & {"down_proj", "up_proj"}


def test_the_adapter_folder_loads_in_peft_with_the_same_logits(tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rft.models import ADAPTER_CONFIG, ADAPTER_WEIGHTS, is_adapter_folder
    from rft.trainer.lora import adapter_disabled, save_adapter_folder, wrap

    model = wrap(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
        lora_cfg(),
        str(tiny_model_dir),
    ).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.5)  # a trained adapter: outputs move
        trained, base = model(input_ids=IDS).logits, None
        with adapter_disabled(model):
            base = model(input_ids=IDS).logits
    assert not torch.allclose(trained, base)
    state = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    save_adapter_folder(model, state, tmp_path / "v1")
    assert is_adapter_folder(tmp_path / "v1") and (tmp_path / "v1" / ADAPTER_WEIGHTS).is_file()
    config = json.loads((tmp_path / "v1" / ADAPTER_CONFIG).read_text())
    assert (config["r"], config["lora_alpha"], config["base_model_name_or_path"]) == (
        4,
        8,
        str(tiny_model_dir),
    )
    loaded = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), tmp_path / "v1"
    ).eval()
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=IDS).logits, trained, atol=1e-6)


def test_lora_config_rules():
    from rft.config.load import config_from_dict
    from rft.config.queries import lora_config
    from rft.errors import ConfigError, NotSupportedError

    base = {
        "model": {"model_path": "/m"},
        "buffer": {"batch_size": 2, "explorer_input": {"taskset": {"path": "/d"}}},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 2},
    }

    def load(*loras, **sections):
        data = {**base, **sections}
        data["model"] = {**base["model"], "lora_configs": list(loras)}
        return config_from_dict(data)

    cfg = load({"name": "lora", "lora_rank": 16, "lora_alpha": 16})  # Trinity's example, as printed
    assert lora_config(cfg).lora_rank == 16 and lora_config(cfg).target_modules == "all-linear"
    assert lora_config(config_from_dict(base)) is None
    with pytest.raises(ConfigError, match=r"\[\] names no adapter"):
        load()
    with pytest.raises(NotSupportedError, match="2 adapters"):
        load({"lora_rank": 8}, {"lora_rank": 8})
    with pytest.raises(NotSupportedError, match="train_embeddings: true"):
        load({"train_embeddings": True})
    assert lora_config(load({"lora_rank": 8}, synchronizer={"sync_method": "nccl"})) is not None


# ----------------------------------------------------------------------------- DeepSpeed runs

LORA = {
    "algorithm": {
        "algorithm_type": "grpo",
        "repeat_times": 2,
        "optimizer": {"lr": 1e-2},
        "kl_loss_fn": "k2",
        "kl_loss_fn_args": {"kl_coef": 0.1},
    },
    "synchronizer": {"sync_interval": 1, "sync_timeout": 120},
}


@pytest.fixture(scope="module", params=[2, 3], ids=["zero2", "zero3"])
def lora_runs(request, tmp_path_factory, tiny_model_dir):
    """An uninterrupted LoRA run and a stopped-and-resumed one, same config (fp32)."""
    stage = request.param
    root = tmp_path_factory.mktemp(f"lora{stage}")
    extra = {
        **LORA,
        "model": {
            "model_path": str(tiny_model_dir),
            "lora_configs": [{"lora_rank": 4, "lora_alpha": 8}],
        },
        "trainer": {
            "zero_stage": stage,
            "precision": "fp32",
            "save_interval": 0,
            "use_dynamic_bsz": True,
            "max_token_len_per_gpu": 40,
        },
    }
    full, stopped = (
        write_config(root, name, tiny_model_dir, **extra) for name in ("full", "stopped")
    )
    write_segments(root / "t" / "full", range(1, STEPS + 1))
    run_ok(torchrun_cmd(full), root / "full.log")
    run_interrupted(stopped, root / "t" / "stopped", root / "stopped.log")
    return {"full": root / "t" / "full", "stopped": root / "t" / "stopped", "model": tiny_model_dir}


@pytest.mark.integration
def test_lora_starts_at_the_reference_and_learns(lora_runs):
    rows = metrics(lora_runs["full"])
    assert rows[1]["kl_loss"] == pytest.approx(0.0, abs=1e-9)  # adapter B = 0: policy = reference
    assert rows[STEPS]["kl_loss"] > 1e-6  # the adapter moved the policy away from the base


@pytest.mark.integration
def test_published_versions_and_checkpoints_are_the_adapter(lora_runs):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from rft.models import ADAPTER_WEIGHTS, is_adapter_folder

    run = lora_runs["full"]
    weights = run / "weights" / f"v{STEPS:06d}"
    assert is_adapter_folder(weights) and not (weights / "model.safetensors").exists()
    assert (
        load_file(str(weights / ADAPTER_WEIGHTS)).keys()
        == load_file(
            str(run / f"global_step_{STEPS}" / "actor" / "huggingface" / ADAPTER_WEIGHTS)
        ).keys()
    )
    base_bytes = sum(p.stat().st_size for p in lora_runs["model"].glob("*.safetensors"))
    ckpt_bytes = sum(
        p.stat().st_size for p in (run / f"global_step_{STEPS}" / "actor").rglob("*") if p.is_file()
    )
    assert ckpt_bytes < base_bytes  # shards of the adapter and its optimizer, not the base
    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(lora_runs["model"], dtype=torch.float32), weights
    ).eval()
    base = AutoModelForCausalLM.from_pretrained(lora_runs["model"], dtype=torch.float32).eval()
    with torch.no_grad():
        assert not torch.allclose(
            model(input_ids=IDS).logits, base(input_ids=IDS).logits, atol=1e-4
        )
    assert objective(model) > objective(base) + 1e-3  # GRPO's objective on the batch it trained on


@pytest.mark.integration
def test_a_lora_run_resumes_exactly(lora_runs):
    full, stopped = metrics(lora_runs["full"]), metrics(lora_runs["stopped"])
    assert sorted(stopped) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        for key in ("pg_loss", "kl_loss", "grad_norm", "logprob_mean"):
            assert stopped[step][key] == pytest.approx(full[step][key], abs=1e-5), (step, key)


@pytest.mark.integration
def test_rft_convert_merges_the_trained_adapter(lora_runs):
    """The trainer's last checkpoint through ``rft-convert --merge``: the adapter folder (PEFT)
    and the merged model (plain transformers) generate the same tokens, the trained ones."""
    import subprocess

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from tests.helpers.runs import REPO
    from tests.helpers.trainer_runs import PY

    step_dir = lora_runs["full"] / f"global_step_{STEPS}"
    proc = subprocess.run(
        [
            PY,
            str(REPO / "bin" / "rft-convert"),
            "--checkpoint-dir",
            str(step_dir),
            "--merge",
            "--force",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    actor = step_dir / "actor"
    adapter = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(lora_runs["model"], dtype=torch.float32),
        actor / "huggingface",
    ).eval()
    merged = AutoModelForCausalLM.from_pretrained(
        actor / "huggingface_merged", dtype=torch.float32
    ).eval()
    base = AutoModelForCausalLM.from_pretrained(lora_runs["model"], dtype=torch.float32).eval()
    kwargs = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        tokens = adapter.generate(input_ids=IDS, **kwargs)
        assert torch.equal(merged.generate(input_ids=IDS, **kwargs), tokens)
        assert torch.allclose(
            merged(input_ids=IDS).logits, adapter(input_ids=IDS).logits, atol=1e-4
        )
        assert not torch.allclose(
            base(input_ids=IDS).logits, merged(input_ids=IDS).logits, atol=1e-4
        )
