"""On-policy distillation in the trainer: the inputs of a teacher-based advantage
(``algorithm.advantage_fn`` in :data:`rft.config.names.NEEDS_TEACHER`) from a step's rows.

Data in: the step's :class:`~rft.trainer.batching.Rows` (teacher log-probs read from the
experiences) and the student's old log-probs ``[N, R]``; data out: the keyword arguments the
advantage takes. ``DataError`` when a rollout row came without teacher log-probs.
"""

from __future__ import annotations

import torch

from rft.errors import DataError
from rft.trainer.batching import Rows


def teacher_inputs(rows: Rows, rollout: list[int], old: torch.Tensor) -> dict[str, torch.Tensor]:
    """``old_logprobs`` and ``teacher_logprobs`` ``[n, R]`` of the ``rollout`` rows."""
    has = rows.has_teacher
    missing = [i for i in rollout if has is None or not bool(has[i])]
    if missing:
        raise DataError(
            f"{len(missing)} of {len(rollout)} rollout experiences carry no teacher_logprobs, "
            "which the distillation advantage (on_policy_distill, jsd) needs: they were written "
            "by an explorer without a teacher; set explorer.auxiliary_models to the teacher "
            "model and start the run with an empty buffer"
        )
    assert rows.teacher_logprobs is not None
    return {"old_logprobs": old[rollout], "teacher_logprobs": rows.teacher_logprobs[rollout]}
