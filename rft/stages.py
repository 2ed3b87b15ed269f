"""A config's ``stages`` (Trinity's SFT warm-up, then RFT), run in order on every launch path.

Owns the stage rules: stage ``i`` is :func:`rft.config.load.stage_config` in its own run
directory, started from stage ``i-1``'s newest published weights; it is finished once its main
role ended normally (:data:`~rft.rundir.STAGE_FINISHED`), and reruns skip finished stages. The
local launcher and the SLURM worker call it; it starts no process itself.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Sequence

from rft import atomic
from rft.config.load import load_config, stage_config, stage_label
from rft.config.schema import Config
from rft.errors import ConfigError
from rft.placement import EXPLORER_MODES, TRAINER_MODES
from rft.rundir import STAGE_FAILED, STAGE_FINISHED
from rft.sync.versions import is_delta, latest_weights


def roles(mode: str) -> tuple[str, ...]:
    """The roles a mode runs: ``both`` -> explorer and trainer."""
    return tuple(
        r
        for r, modes in (("explorer", EXPLORER_MODES), ("trainer", TRAINER_MODES))
        if mode in modes
    )


def main_role(mode: str) -> str:
    """The main role of a mode, the trainer when there is one: its normal end finishes a stage,
    its exit code is the run's (local runs, SLURM jobs)."""
    return "trainer" if mode in TRAINER_MODES else "explorer"


def starts_from(index: int) -> str:
    """Where stage ``index``'s model comes from, as the plan and the sbatch script say it."""
    return "model.model_path" if index == 0 else "the previous stage's final weights"


def modes(cfg: Config) -> list[str]:
    """The mode of each stage (or of the config itself, without stages)."""
    return [resolve(cfg, i, chain=False).mode for i in range(len(cfg.stages))] or [cfg.mode]


def job_mode(cfg: Config) -> str:
    """The mode whose roles a SLURM job of ``cfg`` must hold: every stage's roles together."""
    wanted = {role for mode in modes(cfg) for role in roles(mode)}
    if wanted == {"explorer", "trainer"}:
        return "both"
    return next(mode for mode in modes(cfg) if set(roles(mode)) == wanted)


def resolve(cfg: Config, index: int, chain: bool = True) -> Config:
    """Stage ``index``'s config; with ``chain``, its model is :func:`starts_from` ``index``."""
    stage = stage_config(cfg, index)
    if chain and index > 0:
        previous = stage_config(cfg, index - 1)
        newest = latest_weights(previous.run_dir)
        if newest is None:
            raise ConfigError(
                f"{stage_label(cfg, index)} starts from the weights of "
                f"{stage_label(cfg, index - 1)}, but {previous.run_dir} has none "
                "published (weights/v*): run that stage first"
            )
        if is_delta(newest[1]):  # synchronizer.delta_sync; its last step is full
            raise ConfigError(
                f"{stage_label(cfg, index)} starts from {newest[1]}, a delta folder (the stage "
                "stopped before its last step): run that stage to its end, or start from its "
                "checkpoint converted by rft-convert (model.model_path)"
            )
        stage.model.model_path = str(newest[1])
    return stage


def load_stage(config: str | Path, overrides: Sequence[str], index: int | None) -> Config:
    """The config a role runs: the file's, or its stage ``index`` (chained)."""
    cfg = load_config(config, list(overrides))
    if index is None:
        return cfg
    if not 0 <= index < len(cfg.stages):
        raise ConfigError(f"--stage {index}: {config} has {len(cfg.stages)} stage(s)")
    return resolve(cfg, index)


def is_finished(stage: Config) -> bool:
    return (stage.run_dir / STAGE_FINISHED).is_file()


def mark_finished(stage: Config) -> None:
    """Record that the stage ended normally (its run directory exists by then)."""
    atomic.write_json(stage.run_dir / STAGE_FINISHED, {"time": time.time(), "mode": stage.mode})
    (stage.run_dir / STAGE_FAILED).unlink(missing_ok=True)


def mark_failed(stage: Config, code: int) -> None:
    """Tell the roles waiting for this stage (not part of it) that its main role failed."""
    stage.run_dir.mkdir(parents=True, exist_ok=True)
    atomic.write_json(stage.run_dir / STAGE_FAILED, {"time": time.time(), "exit_code": code})


def failed_since(stage: Config, since: float) -> int | None:
    """The exit code of a failure of the stage recorded after ``since``, if any."""
    try:
        record = json.loads((stage.run_dir / STAGE_FAILED).read_text())
    except FileNotFoundError:
        return None
    return int(record["exit_code"]) if float(record["time"]) >= since else None
