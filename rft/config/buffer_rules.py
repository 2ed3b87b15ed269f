"""Rules for a config's inputs: tasksets, the experience buffer, expert data, experience operators.

Input: a parsed :class:`~rft.config.Config` and the key paths the user wrote; output: the buffer
section completed in place (a dataset path without a storage type is a file) or a
:class:`ConfigError` naming the key to fix. Run by :func:`rft.config.rules.apply`.
"""

from __future__ import annotations

import logging

from rft.config.names import STD_THRESHOLD_SKIP
from rft.config.schema import Config, TasksetConfig
from rft.config.typed_dict import not_supported
from rft.errors import ConfigError

log = logging.getLogger(__name__)


def infer_file_storage(cfg: Config, seen: set[str]) -> None:
    """Trinity's SFT stages give the experience buffer a dataset path and no storage_type."""
    buf = cfg.buffer.trainer_input.experience_buffer
    written = "buffer.trainer_input.experience_buffer.storage_type" in seen
    if not written and buf.path and not buf.path.startswith("sqlite:///"):
        buf.storage_type = "file"


def check_inputs(cfg: Config) -> None:
    """The tasksets a mode needs (each with a path and one repeat count) and the trainer's
    experience buffer and expert data."""
    inputs = cfg.buffer.explorer_input
    if inputs.taskset is not None and inputs.tasksets:
        raise ConfigError(
            "set buffer.explorer_input.taskset or buffer.explorer_input.tasksets, not both"
        )
    if not cfg.model.model_path:
        raise ConfigError("model.model_path is empty: set it to a local Hugging Face model folder")
    needs_tasks = cfg.mode in ("both", "explore") and cfg.algorithm.algorithm_type != "sft"
    if needs_tasks and not cfg.training_tasksets():
        raise ConfigError(
            f"mode '{cfg.mode}' generates experiences but no taskset is configured: "
            "set buffer.explorer_input.taskset (path, split, format)"
        )
    if cfg.mode == "bench" and not inputs.eval_tasksets:
        raise ConfigError(
            "mode 'bench' evaluates checkpoints on buffer.explorer_input."
            "eval_tasksets, which is empty"
        )
    for label, taskset in cfg.labelled_tasksets():
        if not taskset.path:
            raise ConfigError(f"{label}.path is empty: set it to a dataset folder or file")
        _check_rollout_n(cfg, label, taskset)
    _check_adaptive_selector(cfg)
    _check_experience_buffer(cfg)


def _check_adaptive_selector(cfg: Config) -> None:
    """``difficulty_based`` draws a step's tasks from one taskset (rft.explorer.selectors)."""
    training = cfg.labelled_tasksets(evaluation=False)
    adaptive = [
        label for label, ts in training if ts.data_selector.selector_type == "difficulty_based"
    ]
    if adaptive and len(training) > 1:
        raise ConfigError(
            f"{adaptive[0]}.data_selector: rft runs difficulty_based on a single training "
            f"taskset (its draws are whole steps), and this config has {len(training)}; keep "
            "one taskset, or choose another selector_type for several"
        )


def _check_rollout_n(cfg: Config, label: str, taskset: TasksetConfig) -> None:
    """Trinity overwrites ``rollout_args.n`` with the repeat count (its config says DO NOT SET):
    accepted when equal, an error when it would ask for another count."""
    n, repeat = taskset.rollout_args.n, taskset.repeat_times or cfg.algorithm.repeat_times
    if n is not None and n != repeat:
        where = f"{label}.repeat_times" if taskset.repeat_times else "algorithm.repeat_times"
        raise ConfigError(
            f"{label}.rollout_args.n={n} contradicts {where}={repeat}: Trinity sets n from "
            "repeat_times (samples per task) and ignores n; set repeat_times and remove n"
        )


def _check_experience_buffer(cfg: Config) -> None:
    buf = cfg.buffer.trainer_input.experience_buffer
    key = "buffer.trainer_input.experience_buffer"
    if cfg.algorithm.policy_loss_fn == "dpo" and (
        cfg.mode != "train" or buf.storage_type != "file" or not buf.path
    ):
        raise ConfigError(
            "algorithm.policy_loss_fn 'dpo' trains on a dataset of preference pairs: set mode: "
            f"train and {key}.path to the dataset (storage_type: file); got mode "
            f"{cfg.mode!r}, storage_type {buf.storage_type!r}, path {buf.path!r}"
        )
    if buf.storage_type == "sql" and cfg.cluster.node_num > 1:
        raise ConfigError(
            f"{key}.storage_type 'sql' uses SQLite as the transport, whose locking is unreliable "
            f"on network filesystems (NFS, Lustre), and cluster.node_num={cfg.cluster.node_num}. "
            "Use storage_type: queue (sealed segments; add path: sqlite:///x.db to also archive "
            "consumed experiences in SQLite)"
        )
    if buf.storage_type == "sql" and not (buf.path or "").startswith("sqlite:///"):
        raise ConfigError(f"{key}.path must be sqlite:///<file>.db with storage_type 'sql'")
    if buf.storage_type == "queue" and buf.path and not buf.path.startswith("sqlite:///"):
        raise ConfigError(
            f"{key}.path={buf.path!r}: with storage_type 'queue' the path is "
            "optional and, when set, must be sqlite:///<file>.db (an archive)"
        )
    if buf.storage_type == "file":
        if cfg.mode != "train":
            raise ConfigError(
                f"{key}.storage_type 'file' (a fixed dataset of experiences) needs "
                f"mode 'train', not '{cfg.mode}'"
            )
        if not buf.path:
            raise ConfigError(f"{key}.path is empty: set it to the SFT dataset folder or file")
    for name, aux in cfg.buffer.trainer_input.auxiliary_buffers.items():
        if aux.storage_type != "file" or not aux.path:
            raise ConfigError(
                f"buffer.trainer_input.auxiliary_buffers.{name}: expert data must "
                "be storage_type: file with a path to a dataset"
            )
    if cfg.algorithm.sample_strategy == "mix" and not cfg.buffer.trainer_input.auxiliary_buffers:
        raise ConfigError(
            "algorithm.sample_strategy 'mix' mixes in expert data: set "
            "buffer.trainer_input.auxiliary_buffers.<name> (storage_type: file, path)"
        )


def _group_skip(cfg: Config) -> str:
    """What drops whole groups as the trainer reads (named for the warning; "" if nothing):
    dapo_dynamic_sampling, and the std_threshold of a grpo or step_wise_grpo advantage."""
    pipeline = cfg.data_processor.experience_pipeline
    names = [op.name for op in (pipeline.operators if pipeline else [])]
    parts = ["dapo_dynamic_sampling"] if "dapo_dynamic_sampling" in names else []
    algo = cfg.algorithm
    if (
        algo.advantage_fn in STD_THRESHOLD_SKIP
        and algo.advantage_fn_args.get("std_threshold") is not None
    ):
        parts.append(f"algorithm.advantage_fn_args.std_threshold ({algo.advantage_fn})")
    return " and ".join(parts)


def check_experience_pipeline(cfg: Config) -> None:
    """The experience operators act where the trainer reads rollouts (rft.trainer.inputs), not
    in the explorer as in Trinity: refused where they would do nothing."""
    pipeline = cfg.data_processor.experience_pipeline
    skip = _group_skip(cfg)
    if cfg.mode == "both" and skip:
        log.warning(
            "%s in mode both: each step trains on the groups it keeps from its own rollouts (no "
            "refill from later steps, unlike Trinity's queue); for full batches run mode explore "
            "+ mode train with it in the trainer's config",
            skip,
        )
    if pipeline is None or not pipeline.operators:
        return
    key = "data_processor.experience_pipeline.operators"
    if cfg.mode == "explore":
        raise not_supported(
            f"{key} in mode explore",
            "rft applies them in the trainer as it reads each batch (the explorer writes every "
            "experience): move them to the trainer's config (mode train)",
        )
    if cfg.buffer.trainer_input.experience_buffer.storage_type == "file":
        raise ConfigError(
            f"{key}: they act on rollouts, but this trainer reads a dataset "
            "(buffer.trainer_input.experience_buffer.storage_type: file); remove them"
        )
