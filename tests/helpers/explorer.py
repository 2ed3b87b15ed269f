"""Explorer configs for tests: arithmetic tasks, a taskset entry, a small explore-mode config
(as a dict or loaded), the training tasksets it opens, and a noisy copy of a model's weights
for reload tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rft.config.load import config_from_dict
from rft.explorer import tasksets as T


def arithmetic_rows(n: int, start: int = 0) -> list[dict]:
    return [
        {"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"}
        for i in range(start, start + n)
    ]


def taskset_dict(path: Path, name: str, **extra: Any) -> dict:
    return {
        "name": name,
        "path": str(path),
        "split": "train",
        "format": {"prompt_key": "question", "response_key": "answer"},
        **extra,
    }


def merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = (
            merge(out[key], value)
            if isinstance(value, dict) and isinstance(out.get(key), dict)
            else value
        )
    return out


def make_cfg(root: Path, model_dir: Path, train: list[dict], **extra: Any):
    return config_from_dict(cfg_dict(root, model_dir, train, **extra))


def cfg_dict(root: Path, model_dir: Path, train: list[dict], **extra: Any) -> dict:
    """A small explore-mode config as a dict: ``extra`` merged in (nested keys too)."""
    base = {
        "project": "p",
        "name": "run",
        "checkpoint_root_dir": str(root),
        "mode": "explore",
        "algorithm": {"repeat_times": 2},
        "model": {"model_path": str(model_dir), "max_response_tokens": 6, "max_model_len": 256},
        "cluster": {"gpu_per_node": 0},
        "buffer": {
            "batch_size": 3,
            "explorer_input": {"tasksets": train, "default_workflow_type": "math_workflow"},
        },
        "explorer": {"eval_on_startup": False, "eval_interval": 0, "heartbeat_interval_s": 1},
        "monitor": {"monitor_type": "console"},
    }
    return merge(base, extra)


def open_sets(cfg) -> list[T.Taskset]:
    return T.training_tasksets(cfg)


def perturbed_copy(src: Path, seed: int):
    """write_fn for WeightsPublisher: the model in ``src`` with noise on every tensor."""

    def write(dest: Path) -> None:
        import shutil

        import torch
        from safetensors.torch import load_file, save_file

        for f in src.iterdir():
            if f.is_file() and f.name != "model.safetensors":
                shutil.copy2(f, dest / f.name)
        gen = torch.Generator().manual_seed(seed)
        tensors = load_file(str(src / "model.safetensors"))
        noisy = {
            k: v + 0.5 * v.abs().mean() * torch.randn(v.shape, generator=gen).to(v.dtype)
            for k, v in tensors.items()
        }
        save_file(noisy, str(dest / "model.safetensors"), metadata={"format": "pt"})

    return write
