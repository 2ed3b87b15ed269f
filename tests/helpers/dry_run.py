"""The CPU config a dry run is tried on, and the overrides that point it at a model folder and
the arithmetic tasks."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.runs import DATA, REPO

CPU_CONFIG = REPO / "configs" / "cpu" / "grpo_gsm8k.yaml"


def overrides(model: Path, *extra: str) -> list[str]:
    return [
        f"model.model_path={model}",
        f"buffer.explorer_input.taskset.path={DATA}",
        f"buffer.explorer_input.eval_tasksets.0.path={DATA}",
        "checkpoint_root_dir=/tmp/rft-plan-test",
        *extra,
    ]
