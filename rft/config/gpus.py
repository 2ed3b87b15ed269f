"""How a config divides the cluster section's GPUs among the roles (:func:`split_gpus`), and
whether they fit (:func:`check_gpu_split`, a ConfigError naming the key to lower).

Data in: a checked :class:`~rft.config.schema.Config` and a mode; data out:
:class:`rft.placement.GpuSplit`. The explorer's share counts the auxiliary models each explorer
task runs (a teacher the trainer holds takes none: :func:`rft.config.teacher.explorer_scorers`).
Read by the rules, the dry run, SLURM rendering and CHORD's batch arguments.
"""

from __future__ import annotations

from typing import Optional

from rft.config.auxiliary import auxiliary_tp, shared_tp
from rft.config.schema import Config
from rft.config.teacher import explorer_scorers
from rft.errors import ConfigError
from rft.placement import GpuSplit, auxiliary_gpus, gpu_split, task_gpus


def split_gpus(cfg: Config, mode: Optional[str] = None) -> GpuSplit:
    """How ``mode`` (default: the config's) divides the cluster section's GPUs."""
    rollout = cfg.explorer.rollout_model
    return gpu_split(
        mode or cfg.mode,
        node_num=cfg.cluster.node_num,
        gpu_per_node=cfg.cluster.gpu_per_node,
        engine_num=rollout.engine_num,
        tensor_parallel_size=rollout.tensor_parallel_size,
        auxiliary_gpus=auxiliary_gpus(explorer_scorers(cfg)),  # a trainer's teacher: none
    )


def check_gpu_split(cfg: Config, mode: str | None = None) -> None:
    """The GPUs of ``mode`` (default: the config's) fit the cluster section: an explorer task
    (its engine, then each auxiliary model's engine or scorer) on one node, the explorers within the cluster,
    and at least one GPU left for a trainer. The config rules and the SLURM job sizing call it."""
    mode = mode or cfg.mode
    rollout, cluster = cfg.explorer.rollout_model, cfg.cluster
    if cluster.gpu_per_node == 0:
        return  # CPU-only cluster description: the local runner decides
    split = split_gpus(cfg, mode)
    per_task = task_gpus(rollout.tensor_parallel_size, auxiliary_tp(cfg))
    scorers = (
        " plus each auxiliary model's tensor_parallel_size" if cfg.explorer.auxiliary_models else ""
    )
    if per_task > cluster.gpu_per_node:
        raise ConfigError(
            f"an explorer task needs {per_task} GPUs (explorer.rollout_model."
            f"tensor_parallel_size {rollout.tensor_parallel_size}{scorers}) but "
            f"cluster.gpu_per_node={cluster.gpu_per_node}: a task's GPUs must be on "
            "one node; lower the tensor_parallel_size of the rollout or auxiliary models"
        )
    shared = shared_tp(cfg)
    if shared > cluster.gpu_per_node:
        raise ConfigError(
            f"an engine of the auxiliary models the explorers share needs {shared} GPUs "
            f"(their tensor_parallel_size) but cluster.gpu_per_node={cluster.gpu_per_node}: an "
            "engine's GPUs must be on one node; lower their tensor_parallel_size"
        )
    whose = (
        f"{split.auxiliary} of them for explorer.auxiliary_models"
        if split.auxiliary
        else "explorer.rollout_model.engine_num x tensor_parallel_size"
    )
    if mode == "both" and split.trainer < 1:
        raise ConfigError(
            f"explorers take {split.explorer} GPUs ({whose}), leaving none of "
            f"cluster.node_num x gpu_per_node = {split.total} for the trainer; lower "
            "engine_num or raise cluster.gpu_per_node/node_num"
        )
    if mode == "explore" and split.explorer > split.total:
        raise ConfigError(
            f"explorers need {split.explorer} GPUs ({whose}) but the cluster section "
            f"has {split.total}; lower explorer.rollout_model.engine_num"
        )
