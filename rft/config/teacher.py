"""Where on-policy distillation's teacher runs: the one owner of that placement rule.

``explorer.auxiliary_models[0]`` is the teacher when the advantage reads one (:func:`uses_teacher`).
With the rollout model's ``engine_num`` it runs inside each explorer task (rft.explorer.teacher);
with another (Trinity's layout: one teacher engine shared by the explorers) the trainer's ranks
hold it like the reference model and score the rows that arrive without ``teacher_logprobs``
(rft.trainer.distill). Pure functions of a config; the schema, the rules, the launchers, the
explorer and the trainer read them. Imports no config class at run time (the schema imports it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from rft.config.names import NEEDS_TEACHER

if TYPE_CHECKING:
    from rft.config.schema import AuxiliaryModelConfig, Config

TEACHER_KEY = "explorer.auxiliary_models[0]"  # the teacher's key path in messages


def uses_teacher(cfg: Config) -> bool:
    """Whether the run distils: its advantage reads a teacher's log-probs, and
    ``explorer.auxiliary_models[0]`` is that teacher, not a reward model."""
    return cfg.algorithm.advantage_fn in NEEDS_TEACHER


def teacher_in_trainer(cfg: Config) -> bool:
    """Whether the trainer computes the teacher's log-probs: a distillation run whose teacher's
    ``engine_num`` differs from ``explorer.rollout_model.engine_num`` (the explorers share one
    teacher, so no explorer task holds it). Otherwise each explorer task runs its own."""
    models = cfg.explorer.auxiliary_models
    return (
        uses_teacher(cfg)
        and bool(models)
        and models[0].engine_num != cfg.explorer.rollout_model.engine_num
    )


def explorer_scorers(cfg: Config) -> Sequence[AuxiliaryModelConfig]:
    """The auxiliary models that run inside each explorer task (and take GPUs there): all of
    them, less a teacher the trainer holds."""
    return [] if teacher_in_trainer(cfg) else cfg.explorer.auxiliary_models


def teacher_placement(cfg: Config) -> str:
    """Where the teacher runs, for the dry run's summary (a distillation run's)."""
    teacher, rollout = cfg.explorer.auxiliary_models[0], cfg.explorer.rollout_model
    advantage = f"its log-prob of each sampled token makes the {cfg.algorithm.advantage_fn} advantage (the reward is logged only)"  # fmt: skip
    if not teacher_in_trainer(cfg):
        return (
            f"{teacher.model_path}: a forward pass in each explorer task after each step's "
            f"generation (GPU {rollout.tensor_parallel_size} of the task, else its CPUs); "
            f"{advantage}"
        )
    held = (
        "ZeRO-3 partitions over its ranks"
        if cfg.trainer.zero_stage == 3
        else "a whole copy per rank, moved to the GPU for each use"
        if cfg.trainer.ref_offload
        else "a whole copy per rank"
    )
    return (
        f"{teacher.model_path}: in the trainer ({TEACHER_KEY}.engine_num={teacher.engine_num} "
        f"differs from explorer.rollout_model.engine_num={rollout.engine_num}: one teacher "
        f"for all explorers), held like the reference model ({held}, on the trainer's GPUs: "
        f"none of its own, its tensor_parallel_size unused); a forward pass over each step's "
        f"rows that arrive without "
        f"teacher_logprobs; {advantage}"
    )
