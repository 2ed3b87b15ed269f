"""On-policy distillation in the trainer: the inputs of a teacher-based advantage
(``algorithm.advantage_fn`` in :data:`rft.config.names.NEEDS_TEACHER`) from a step's rows, and
the teacher's pass when the trainer holds it (:func:`rft.config.teacher.teacher_in_trainer`).

Data in: the step's :class:`~rft.trainer.plan.Plan` (teacher log-probs read from the
experiences, or computed here for the rows that came without) and the student's old log-probs
``[N, R]``; data out: the keyword arguments the advantage takes. ``DataError`` when a rollout
row has no teacher log-probs and the trainer holds no teacher.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch

from rft.config.auxiliary import forward_dtype
from rft.config.schema import Config
from rft.config.teacher import TEACHER_KEY, teacher_in_trainer
from rft.errors import DataError
from rft.models import read_config
from rft.trainer.batching import MicroBatch, Rows

if TYPE_CHECKING:  # DeepSpeed loads with the engine: only where a teacher pass runs
    from rft.trainer import engine
    from rft.trainer.plan import Plan

log = logging.getLogger(__name__)

TEACHER_ROWS = "teacher_trainer_rows"  # metric: rows the trainer's teacher scored in the step
TEACHER_TIME_S = "teacher_trainer_time_s"  # metric: seconds of the trainer's teacher pass
# The teacher's log-probs are of its own distribution, untempered, as the explorer's teacher
# pass (rft.explorer.teacher) and Trinity's workflow (workflow_args temperature, default 1.0).
TEACHER_TEMPERATURE = 1.0


def teacher_inputs(rows: Rows, rollout: list[int], old: torch.Tensor) -> dict[str, torch.Tensor]:
    """``old_logprobs`` and ``teacher_logprobs`` ``[n, R]`` of the ``rollout`` rows."""
    missing = _missing(rows, rollout)
    if missing:
        raise DataError(
            f"{len(missing)} of {len(rollout)} rollout experiences carry no teacher_logprobs, "
            "which the distillation advantage (on_policy_distill, jsd) needs: they were written "
            "by an explorer without a teacher; set explorer.auxiliary_models to the teacher "
            "model and start the run with an empty buffer"
        )
    assert rows.teacher_logprobs is not None
    return {"old_logprobs": old[rollout], "teacher_logprobs": rows.teacher_logprobs[rollout]}


def _missing(rows: Rows, rollout: list[int]) -> list[int]:
    """The ``rollout`` rows without teacher log-probs."""
    has = rows.has_teacher
    return [i for i in rollout if has is None or not bool(has[i])]


@dataclass
class TrainerTeacher:
    """The teacher as the trainer's ranks hold it: like the reference model."""

    ref: engine.Reference  # the frozen model (partitioned under ZeRO-3, else moved per use)
    max_len: Optional[int]  # its max_position_embeddings (None: unknown)


_LOADED: dict[str, TrainerTeacher] = {}  # one teacher per trainer process, loaded at first use


def load_teacher(cfg: Config, info: engine.DistInfo) -> TrainerTeacher:
    """``explorer.auxiliary_models[0]`` on this rank (a collective under ZeRO-3), once."""
    from rft.trainer import engine

    model = cfg.explorer.auxiliary_models[0]
    if model.model_path not in _LOADED:
        start = time.monotonic()
        folder = read_config(model.model_path, f"{TEACHER_KEY}.model_path")
        dtype = forward_dtype(model.dtype, info.device.type == "cpu", folder)
        ref = engine.build_reference(
            cfg, info, model_path=model.model_path, dtype=getattr(torch, dtype)
        )
        limit = folder.get("max_position_embeddings")
        _LOADED[model.model_path] = TrainerTeacher(ref, limit)
        log.info(
            "teacher %s in the trainer (%s), loaded in %.1fs",
            model.model_path,
            dtype,
            time.monotonic() - start,
        )
    return _LOADED[model.model_path]


def _teacher_logprobs(teacher: TrainerTeacher, micro: MicroBatch) -> torch.Tensor:
    """The teacher's log-probs ``[B, R]`` of a micro-batch's counted response tokens."""
    from rft.trainer import engine

    micro.temperature = TEACHER_TEMPERATURE
    return engine.reference_logprobs(teacher.ref, micro)


def add_trainer_teacher_logprobs(
    cfg: Config, plan: Plan, pad_id: int, info: engine.DistInfo
) -> dict[str, float]:
    """When the trainer holds the teacher, fill ``plan.rows``' teacher log-probs of the rollout
    rows that arrived without them (every rank scores its own rows, then all share them; a
    collective); return the pass's metrics ({} when no row needed it)."""
    rows = plan.rows
    rollout = [i for i in range(len(rows)) if not bool(rows.expert[i])]
    missing = _missing(rows, rollout)  # the same on every rank: each holds the whole batch
    if not missing or not teacher_in_trainer(cfg):
        return {}
    from rft.trainer.plan import gather_rows, local_pass

    start = time.perf_counter()
    teacher = load_teacher(cfg, info)
    longest = max(len(rows.input_ids[i]) for i in missing)
    if teacher.max_len and longest > teacher.max_len:
        raise DataError(
            f"an experience of {longest} tokens exceeds the teacher's max_position_embeddings="
            f"{teacher.max_len} ({cfg.explorer.auxiliary_models[0].model_path}); lower "
            "model.max_model_len to at most that"
        )
    local = local_pass(lambda m: _teacher_logprobs(teacher, m), plan, pad_id, info.device)
    scored = gather_rows(plan, local)  # [N, R] every rank's rows
    if rows.teacher_logprobs is None or rows.has_teacher is None:
        rows.teacher_logprobs = torch.zeros_like(rows.response_mask)  # [N, R]
        rows.has_teacher = torch.zeros(len(rows), dtype=torch.bool)  # [N]
    rows.teacher_logprobs[missing] = scored[missing]  # [n, R]
    rows.has_teacher[missing] = True
    return {TEACHER_ROWS: len(missing), TEACHER_TIME_S: time.perf_counter() - start}
