"""Hand-made DeepSpeed ZeRO-2 checkpoints (``torch.save`` of the dicts DeepSpeed writes, one
rank, built in well under a second) for rft-convert's tests: the checkpoint, the user's extra
files, one in-process conversion, and what a finished ``huggingface/`` folder must hold."""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import torch

from rft.convert.cli import main
from rft.safetensors_io import weights_complete

TAG = "global_step1"
TRAINER_FILES = {"config.json", "tokenizer.json", "tokenizer_config.json"}
USER_FILES = {
    "adapter_model.safetensors": b"lora weights",
    "training_args.bin": b"args",
    "eval/results.json": b'{"acc": 0.5}',
}


def make_checkpoint(
    step_dir: Path, n_tensors: int = 4, rows: int = 64, cols: int = 32, seed: int = 0
) -> dict[str, torch.Tensor]:
    """A one-rank ZeRO-2 checkpoint in ``step_dir/actor/`` with a trainer's ``huggingface/`` files
    (config and tokenizer, no weights); returns the fp32 weights a conversion must produce."""
    gen = torch.Generator().manual_seed(seed)
    params = OrderedDict(
        (f"model.layers.{i}.weight", torch.randn(rows, cols, generator=gen))
        for i in range(n_tensors)
    )
    tag_dir = step_dir / "actor" / TAG
    tag_dir.mkdir(parents=True)
    torch.save(
        {
            "module": OrderedDict((k, v.bfloat16()) for k, v in params.items()),
            "buffer_names": [],
            "param_shapes": [OrderedDict((k, v.shape) for k, v in params.items())],
            "frozen_param_shapes": OrderedDict(),
            "frozen_param_fragments": OrderedDict(),
            "shared_params": {},
            "dp_world_size": 1,
        },
        tag_dir / "mp_rank_00_model_states.pt",
    )
    flat = torch.cat([v.flatten() for v in params.values()])  # [n_tensors * rows * cols]
    optim = {
        "zero_stage": 2,
        "partition_count": [1],
        "single_partition_of_fp32_groups": [flat],
        "param_alignment_paddings": [[0] * n_tensors],
        "base_optimizer_state": {"state": {0: {"exp_avg": torch.zeros_like(flat)}}},
    }
    torch.save(
        {"optimizer_state_dict": optim}, tag_dir / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    )
    (step_dir / "actor" / "latest").write_text(TAG)
    hf = step_dir / "actor" / "huggingface"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "llama", "torch_dtype": "float32"}))
    (hf / "tokenizer.json").write_text('{"version": "1.0"}')
    (hf / "tokenizer_config.json").write_text("{}")
    return params


def add_user_files(hf: Path) -> None:
    for name, data in USER_FILES.items():
        (hf / name).parent.mkdir(parents=True, exist_ok=True)
        (hf / name).write_bytes(data)


def output_tensors(hf: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(hf.glob("*.safetensors")):
        if f.name.startswith("model"):
            out.update(load_file(f))
    return out


def assert_converted(hf: Path, expected: dict[str, torch.Tensor], user_files: bool = True) -> None:
    """Whole weights equal to ``expected``, the trainer's (and the user's) files, no debris."""
    assert weights_complete(hf)
    got = output_tensors(hf)
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], v) for k, v in expected.items())
    assert TRAINER_FILES <= {p.name for p in hf.iterdir()}
    for name, data in USER_FILES.items() if user_files else ():
        assert (hf / name).read_bytes() == data, name
    debris = [p.name for p in hf.parent.iterdir() if p.name.startswith(hf.name) and p != hf]
    debris += [str(p) for p in hf.rglob("*.tmp*")]
    assert not debris, debris


ARGS = ["--dtype", "fp32"]


def convert(step: Path, *extra: str) -> int:
    return main(["--checkpoint-dir", str(step), *ARGS, *extra])
