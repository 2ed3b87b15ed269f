"""How a config divides the cluster section's GPUs among the roles (:func:`split_gpus`).

Data in: a checked :class:`~rft.config.schema.Config` and a mode; data out:
:class:`rft.placement.GpuSplit`. The explorer's share counts the auxiliary models each explorer
task runs (a teacher the trainer holds takes none: :func:`rft.config.teacher.explorer_scorers`).
Read by the rules, the dry run, SLURM rendering and CHORD's batch arguments.
"""

from __future__ import annotations

from typing import Optional

from rft.config.schema import Config
from rft.config.teacher import explorer_scorers
from rft.placement import GpuSplit, auxiliary_gpus, gpu_split


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
