"""Where the trainer's experiences come from, one step's batch at a time (rank 0 only).

Data in: the run directory's buffer (:class:`BufferSource`: sealed segments, or SQLite with
``storage_type: sql``) or, for SFT, a dataset (:class:`FileSource`; CHORD's ``mix``:
:class:`~rft.trainer.mix.MixSource`). Data out: ``next_batch(step, version)`` -> the step's
list of :class:`~rft.buffer.experience.Experience` (None when the input is exhausted),
``cursor()`` for the checkpoint, ``release(cursor)`` after one, and read statistics.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable

from rft.buffer.experience import Experience
from rft.buffer.segment_file import unsealed_writers
from rft.buffer.segments import open_archive, open_buffer_reader
from rft.config.schema import Config
from rft.errors import DataError, EpisodesFailedError, NotSupportedError
from rft.lease import NO_FENCE, Fence
from rft.rundir import writer_name
from rft.sync.failures import ExplorerFailure, read_failures
from rft.sync.heartbeat import explorers_finished, read_heartbeats, starting_explorers
from rft.trainer.experience_ops import ExperiencePipeline
from rft.trainer.sft import SftSource

log = logging.getLogger(__name__)
POLL_S = 0.5
WAIT_SLICE_S = 5.0  # a waiting read checks for a stop request this often


def explorer_writers(cfg: Config) -> list[str]:
    """Buffer writer names of the explorer tasks of this run (one per engine)."""
    return [
        writer_name(cfg.explorer.name, rank)
        for rank in range(cfg.explorer.rollout_model.engine_num)
    ]


def explorer_stopped(step: int, failure: ExplorerFailure) -> EpisodesFailedError:
    """The trainer's error when an explorer stopped on failures and no experiences will come."""
    return EpisodesFailedError(
        f"the trainer stops before step {step}: {failure.message} (its tracebacks are in that "
        "explorer's log)"
    )


class BufferSource:
    """Rollout experiences from the buffer, optionally archived to SQLite as consumed."""

    def __init__(
        self,
        cfg: Config,
        run_dir: Path,
        cursor: dict[str, Any] | None,
        rollouts_per_step: int | None = None,
        fence: Fence = NO_FENCE,
    ):
        buf = cfg.buffer.trainer_input.experience_buffer
        self.cfg, self.run_dir = cfg, run_dir
        # mode train reads this many (whole groups); mix mode leaves room for expert samples
        self.rollouts_per_step = rollouts_per_step or cfg.buffer.train_batch_size
        self.synchronous = cfg.mode == "both"
        self.reader = open_buffer_reader(
            run_dir,
            buf.storage_type,
            buf.path or "",
            buf.name,
            cursor=cursor,
            max_staleness_versions=None if self.synchronous else cfg.trainer.max_staleness_versions,
            num_nodes=cfg.cluster.node_num,
        )
        self.archive = open_archive(run_dir, buf.storage_type, buf.path or "", buf.name)
        self.fence = fence  # checked before each archive write
        self.timed_out = False  # mode train: the input ended because nothing came in time
        # data_processor.experience_pipeline: applied to each read (rft.trainer.experience_ops)
        self.pipeline = ExperiencePipeline.from_config(cfg.data_processor.experience_pipeline)

    def next_batch(
        self, step: int, current_version: int, stop: Callable[[], bool] = lambda: False
    ) -> list[Experience] | None:
        """The step's batch; None when a stop was requested while waiting, or (``mode: train``)
        when nothing arrived within ``synchronizer.sync_timeout``."""
        self.pipeline.start_step()
        batch = (
            self._read_step(step, current_version, stop)
            if self.synchronous
            else self._read_available(step, current_version, stop)
        )
        if batch is None:
            return None
        batch = [e for e in batch if not e.eval]
        if self.archive is not None:
            self.fence.check(f"archiving the experiences of step {step}")
            self.archive.record(batch, step)
        return batch

    def _read_available(
        self, step: int, current_version: int, stop: Callable[[], bool]
    ) -> list[Experience] | None:
        """``mode: train``: up to ``rollouts_per_step`` experiences in whole groups, whatever is
        available within ``sync_timeout``; groups older than ``trainer.max_staleness_versions``
        weight versions are dropped (and counted) by the reader; groups the experience operators
        drop (dapo_dynamic_sampling) are replaced by reading on. Without ``total_steps`` the input
        ends once every explorer that joined the run has finished (heartbeat
        ``finished``) and the buffer is drained; an explorer still running keeps it open."""
        want = self.rollouts_per_step
        deadline = time.monotonic() + self.cfg.synchronizer.sync_timeout
        out: list[Experience] = []
        while len(out) < want and not stop():
            left = deadline - time.monotonic()
            if left <= 0:
                if not out:
                    self.timed_out = True
                    log.warning(
                        "no experiences %s in synchronizer.sync_timeout=%ds: stopping",
                        "kept by the experience operators" if self.pipeline.counts else "arrived",
                        self.cfg.synchronizer.sync_timeout,
                    )
                break
            # before the read: their last segments are sealed
            finished = explorers_finished(self.run_dir, self.cfg.explorer.heartbeat_timeout_s)
            stopped = self._all_stopped()
            got = self.reader.read(
                want - len(out),
                current_version=current_version,
                timeout_s=0.0 if finished or stopped else min(left, WAIT_SLICE_S),
                poll_s=POLL_S,
            )
            out += self.pipeline.apply(got)
            if stopped and not got:  # no explorer is left to write more
                raise explorer_stopped(step, stopped)
            if finished and not got:
                log.info(
                    "every explorer that joined the run has finished and the buffer is drained: %s",
                    "training on the last, partial batch" if out else "stopping",
                )
                break
        return out or None

    def _all_stopped(self) -> ExplorerFailure | None:
        """``mode: train``: the newest explorer stop on failures, when no explorer runs (or
        starts) any more; None while one does or none stopped on failures."""
        stopped = read_failures(self.run_dir)
        if not stopped:
            return None
        timeout_s = self.cfg.explorer.heartbeat_timeout_s
        if any(s.live for s in read_heartbeats(self.run_dir, timeout_s)):
            return None
        return None if starting_explorers(self.run_dir, timeout_s) else stopped[-1]

    def _read_step(
        self, step: int, current_version: int, stop: Callable[[], bool]
    ) -> list[Experience] | None:
        """``mode: both``: exactly the segments ``seq == step`` of every explorer rank
        (``<explorer.name>-<rank>`` for rank < ``engine_num``), waiting up to
        ``synchronizer.sync_timeout`` for them to be sealed. The experience operators apply to
        them with no refill: the next step's segments are the next step's (lockstep)."""
        if not hasattr(self.reader, "read_step"):
            raise NotSupportedError(
                "mode 'both' reads the buffer step by step, which needs "
                "buffer.trainer_input.experience_buffer.storage_type: queue"
            )
        writers = explorer_writers(self.cfg)
        deadline = time.monotonic() + self.cfg.synchronizer.sync_timeout
        while unsealed_writers(self.reader.buffer_dir, writers, step):
            if stop():
                return None
            stopped = read_failures(self.run_dir, writers)
            if stopped:  # lockstep: its segments will never come
                raise explorer_stopped(step, stopped[0])
            if time.monotonic() > deadline:
                missing = unsealed_writers(self.reader.buffer_dir, writers, step)
                raise DataError(
                    f"step {step}: explorer segments of {missing} not sealed after "
                    f"synchronizer.sync_timeout={self.cfg.synchronizer.sync_timeout}s; check the "
                    "explorer logs (is it running, and with the same explorer.name/engine_num?)"
                )
            time.sleep(POLL_S)
        return self.pipeline.apply(self.reader.read_step(step, writers, current_version))

    def cursor(self) -> dict[str, Any]:
        return self.reader.cursor()

    def release(self, cursor: dict[str, Any]) -> None:
        removed = self.reader.release(cursor)
        if removed:
            log.debug(
                "released %s consumed buffer segments",
                removed if isinstance(removed, int) else len(removed),
            )

    def stats(self) -> dict[str, int]:
        """The reader's counters and the experience operators' counts of the last step."""
        return {**self.reader.stats.as_dict(), **self.pipeline.counts}


class FileSource:
    """SFT: expert experiences from a dataset (``storage_type: file``)."""

    def __init__(self, cfg: Config, cursor: dict[str, Any] | None):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(cfg.model.model_path)
        self.batch_size = cfg.buffer.train_batch_size
        self.source = SftSource(
            cfg.buffer.trainer_input.experience_buffer, tokenizer, cfg.model.max_model_len, cursor
        )

    def next_batch(
        self, step: int, current_version: int, stop: Callable[[], bool] = lambda: False
    ) -> list[Experience] | None:
        return self.source.next_batch(self.batch_size)

    def cursor(self) -> dict[str, Any]:
        return self.source.cursor()

    def release(self, cursor: dict[str, Any]) -> None:
        pass  # a dataset is never consumed

    def stats(self) -> dict[str, int]:
        return {"rows_served": self.source.served}
