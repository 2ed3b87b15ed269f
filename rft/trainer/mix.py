"""CHORD mixing (``algorithm.sample_strategy: mix``): each step's batch = rollouts + expert data.

Data in: the run's rollout buffer (through :class:`~rft.trainer.inputs.BufferSource`) and one
SFT-style dataset, ``buffer.trainer_input.auxiliary_buffers.<name>`` (``storage_type: file``,
tokenised by :mod:`rft.trainer.sft`). Data out: ``next_batch(step, version)`` -> the step's
rollouts followed by its expert experiences, and a cursor holding both positions.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

from rft.buffer.experience import Experience
from rft.config.batches import groups_per_update_of, mini_batch_count
from rft.config.mix import expert_buffer, mix_counts
from rft.config.schema import Config
from rft.lease import NO_FENCE, Fence
from rft.trainer.inputs import BufferSource
from rft.trainer.sft import SftSource

log = logging.getLogger(__name__)

# The expert dataset's position inside the checkpoint's buffer_cursor ({"row": n}: rows served
# so far), beside the rollout buffer's own keys, so a resumed run continues with the next row.
EXPERT_CURSOR_KEY = "expert"


def split_cursor(
    cursor: dict[str, Any] | None,
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """A checkpoint's ``buffer_cursor`` -> (rollout buffer's cursor, expert cursor)."""
    rest = dict(cursor or {})
    expert = rest.pop(EXPERT_CURSOR_KEY, None)
    return rest or None, expert


class MixSource:
    """The trainer's input in mix mode: the rollout buffer plus the expert dataset (rank 0).

    The expert dataset is read in order and wraps around at its end (epoch after epoch); with
    ``auxiliary_buffers.<name>.total_epochs`` set, after that many passes the input ends, and
    with it the run (Trinity's trainer stops when an auxiliary buffer runs out). The SQLite
    archive (``path: sqlite:///x.db``) records the rollouts only: expert rows are a fixed
    dataset, reproducible from it and the saved cursor.
    """

    def __init__(
        self,
        cfg: Config,
        run_dir: Path,
        cursor: dict[str, Any] | None,
        tokenizer: Any = None,
        fence: Fence = NO_FENCE,
    ):

        self.cfg = cfg
        self.counts = mix_counts(cfg)
        buffer_cursor, expert_cursor = split_cursor(cursor)
        self.rollouts = BufferSource(
            cfg, run_dir, buffer_cursor, rollouts_per_step=self.counts.rollout, fence=fence
        )
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(cfg.model.model_path)
        experts = expert_buffer(cfg)
        self.experts = SftSource(
            experts, tokenizer, cfg.model.max_model_len, expert_cursor, experts.total_epochs
        )
        log.info(
            "mix: %d rollouts + %d expert samples per step (expert data: %d rows, from row %d)",
            self.counts.rollout,
            self.counts.expert,
            len(self.experts),
            self.experts.served,
        )

    def next_batch(
        self, step: int, current_version: int, stop: Callable[[], bool] = lambda: False
    ) -> list[Experience] | None:
        """The step's rollouts, then its expert samples (``source: "expert"``, no logprobs,
        reward 0; the trainer turns them into an ``expert_mask`` for the ``mix_chord`` loss);
        None when the rollouts end. How many of each a mini-batch takes is
        :func:`rft.config.mix.mix_counts` (checked when the config is loaded)."""
        if self._used_up(step, self.counts.expert):
            return None
        rollouts = self.rollouts.next_batch(step, current_version, stop)
        if rollouts is None:
            return None
        # a step of several mini-batches (rft.config.batches) takes the expert count once per
        # mini-batch
        groups = len({e.group_id for e in rollouts})
        minis = mini_batch_count(groups, groups_per_update_of(self.cfg, len(rollouts), groups))
        if self._used_up(step, self.counts.expert * minis):
            return None
        return rollouts + self.experts.next_batch(self.counts.expert * minis)

    def _used_up(self, step: int, rows: int) -> bool:
        """Whether the expert data has fewer than ``rows`` rows left of its total_epochs
        passes (said once: the trainer stops there, as Trinity's when an auxiliary buffer runs
        out)."""
        if not self.experts.exhausted(rows):
            return False
        log.warning(
            "step %d: the expert data is used up (%d rows served of %d passes, "
            "auxiliary_buffers.<name>.total_epochs; the step needs %d): the trainer stops here",
            step,
            self.experts.served,
            self.experts.epochs,
            rows,
        )
        return True

    def cursor(self) -> dict[str, Any]:
        return {**self.rollouts.cursor(), EXPERT_CURSOR_KEY: self.experts.cursor()}

    def release(self, cursor: dict[str, Any]) -> None:
        buffer_cursor, _expert = split_cursor(cursor)
        if buffer_cursor:
            self.rollouts.release(buffer_cursor)

    def stats(self) -> dict[str, int]:
        return {**self.rollouts.stats(), "expert_rows_served": self.experts.served}
