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

from rft.buffer import replay
from rft.buffer.experience import Experience
from rft.buffer.segment_file import unsealed_writers
from rft.buffer.segments import open_archive, open_buffer_reader
from rft.config.queries import read_timeout
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
REPLAY_KEY = "replay"  # the replay buffer's state in the buffer cursor (the checkpoint's)


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
        self.wait_s, self.wait_key = read_timeout(cfg)  # how long a read waits
        self.synchronous = cfg.mode == "both"
        # groups generated more weight versions ago than this are dropped (and counted), in
        # every mode: in mode both with the fixed style a step's are at most sync_offset +
        # sync_interval - 1 versions old, so a smaller bound drops some (staleness_control)
        self.max_staleness_versions = cfg.trainer.max_staleness_versions
        cursor = dict(cursor or {})
        replay_state = cursor.pop(REPLAY_KEY, None)
        self.reader = open_buffer_reader(
            run_dir,
            buf.storage_type,
            buf.path or "",
            buf.name,
            cursor=cursor or None,
            max_staleness_versions=self.max_staleness_versions,
            num_nodes=cfg.cluster.node_num,
        )
        self.archive = open_archive(run_dir, buf.storage_type, buf.path or "", buf.name)
        self.fence = fence  # checked before each archive write
        self.timed_out = False  # mode train: the input ended because nothing came in time
        # data_processor.experience_pipeline: applied to each read (rft.trainer.experience_ops)
        # then the advantage's std_threshold group skip
        self.pipeline = ExperiencePipeline.from_config(
            cfg.data_processor.experience_pipeline, cfg.algorithm
        )
        # replay_buffer.enable: groups go through Trinity's priority queue (rft.buffer.replay)
        self.replay = (
            replay.ReplayBuffer.from_config(buf.replay_buffer, buf.capacity)
            if buf.replay_buffer.enable
            else None
        )
        self.replay_missing = 0  # groups of the checkpoint's replay state not found again
        self.reused_share = 0.0
        if replay_state and self.replay is None:
            log.warning(
                "the checkpoint's replay buffer held %d groups; replay_buffer.enable is false "
                "now, so they are not trained on again",
                len(replay_state.get("queued", [])) + len(replay_state.get("cooling", [])),
            )
        elif replay_state:
            self._restore_replay(replay_state)

    def next_batch(
        self, step: int, current_version: int, stop: Callable[[], bool] = lambda: False
    ) -> list[Experience] | None:
        """The step's batch; None when a stop was requested while waiting, or (``mode: train``)
        when nothing arrived within ``synchronizer.sync_timeout``."""
        self.pipeline.start_step()
        if self.replay is not None:
            return self._replay_batch(step, current_version, stop)
        batch = (
            self._read_step(step, current_version, stop)
            if self.synchronous
            else self._read_available(step, current_version, stop)
        )
        if batch is None:
            return None
        batch = [e for e in batch if not e.eval]
        self._archive(batch, step)
        return batch

    def _archive(self, batch: list[Experience], step: int) -> None:
        if self.archive is not None:
            self.fence.check(f"archiving the experiences of step {step}")
            self.archive.record(batch, step)

    def _replay_batch(
        self, step: int, current_version: int, stop: Callable[[], bool]
    ) -> list[Experience] | None:
        """``replay_buffer.enable``: new groups (this step's segments in ``mode: both``, all
        sealed ones in ``mode: train``) enter the priority queue, and the batch is its best groups
        (Trinity's get_batch). ``mode: train`` waits up to ``sync_timeout`` for a full batch; once
        every explorer finished and the buffer is drained, reuse stops and the queue drains."""
        assert self.replay is not None
        want = self.rollouts_per_step
        lowest = (
            None
            if self.max_staleness_versions is None
            else current_version - self.max_staleness_versions
        )
        deadline = time.monotonic() + self.wait_s
        drawn: list[replay.ReplayItem] = []
        total = 0
        while not stop():
            if self.synchronous:
                new = self._read_step(step, current_version, stop)
                if new is None:
                    return None
                finished = stopped = None
            else:
                finished = explorers_finished(self.run_dir, self.cfg.explorer.heartbeat_timeout_s)
                stopped = self._all_stopped()
                new = self.pipeline.apply(self.reader.read(None, current_version=current_version))
            self._ingest(new, step)
            if finished and not new:
                self.replay.close(time.time())  # Trinity's close: no reuse, the queue drains
            got = self.replay.draw(want - total, time.time(), lowest)
            drawn += got
            total += sum(len(i.experiences) for i in got)
            if stopped and not new:
                raise explorer_stopped(step, stopped)
            if self.synchronous or total >= want or len(self.replay):
                break  # lockstep, full, or the next queued group does not fit
            if finished and not new and not len(self.replay):
                break  # drained: the last, partial batch (or the end)
            if time.monotonic() > deadline:
                self.timed_out = not drawn
                if not drawn:
                    log.warning(
                        "no experiences in the replay buffer within %s=%gs: stopping",
                        self.wait_key,
                        self.wait_s,
                    )
                break
            time.sleep(POLL_S)
        self.replay.settle(drawn, time.time())
        self.reused_share = replay.reused_share(drawn)
        batch = [e for item in drawn for e in item.experiences]
        if self.synchronous and not stop():
            return batch  # lockstep: an empty step is skipped, never the end of the input
        return batch or None

    def _ingest(self, new: list[Experience], step: int) -> None:
        """Archive the new experiences (once, however often reused) and queue their groups."""
        assert self.replay is not None
        self._archive(new, step)
        seqs = self.reader.group_seqs
        for group in replay.split_groups(new):
            key = (group[0].writer, group[0].group_id)
            ref = (key[0], seqs[key], key[1]) if key in seqs else None
            self.replay.put(replay.ReplayItem(group, ref))

    def _restore_replay(self, state: dict[str, Any]) -> None:
        """The checkpoint's replay buffer: its groups reloaded from their (unreleased) segments
        and passed through a fresh copy of the experience operators, as when first read."""
        assert self.replay is not None
        refs = [tuple(e["ref"]) for k in ("queued", "cooling") for e in state.get(k, [])]
        found = self.reader.reload_groups(refs)
        pipeline = ExperiencePipeline.from_config(
            self.cfg.data_processor.experience_pipeline, self.cfg.algorithm
        )
        groups = {}
        for ref, group in found.items():
            for kept in replay.split_groups(pipeline.apply(group)):
                groups[ref] = kept
        self.replay_missing = self.replay.restore(state, groups)
        log.info(
            "replay buffer restored: %d groups queued, %d cooling%s",
            len(self.replay),
            self.replay.cooling,
            f", {self.replay_missing} not found in the buffer" if self.replay_missing else "",
        )

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
        deadline = time.monotonic() + self.wait_s
        out: list[Experience] = []
        while len(out) < want and not stop():
            left = deadline - time.monotonic()
            if left <= 0:
                if not out:
                    self.timed_out = True
                    log.warning(
                        "no experiences %s in %s=%gs: stopping",
                        "kept by the experience operators" if self.pipeline.counts else "arrived",
                        self.wait_key,
                        self.wait_s,
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
        deadline = time.monotonic() + self.wait_s
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
                    f"{self.wait_key}={self.wait_s:g}s; check the "
                    "explorer logs (is it running, and with the same explorer.name/engine_num?)"
                )
            time.sleep(POLL_S)
        return self.pipeline.apply(self.reader.read_step(step, writers, current_version))

    def cursor(self) -> dict[str, Any]:
        if self.replay is None:
            return self.reader.cursor()
        return {**self.reader.cursor(), REPLAY_KEY: self.replay.state()}

    def release(self, cursor: dict[str, Any]) -> None:
        cursor = dict(cursor)
        state = cursor.pop(REPLAY_KEY, None) or {}
        if self.replay is None:
            removed = self.reader.release(cursor)
        else:  # the segments of groups the checkpoint's or the live replay buffer holds stay
            held = {tuple(e["ref"]) for k in ("queued", "cooling") for e in state.get(k, [])}
            keep = {(w, s) for w, s, _g in held | self.replay.refs()}
            removed = self.reader.release(cursor, keep=keep)
        if removed:
            log.debug(
                "released %s consumed buffer segments",
                removed if isinstance(removed, int) else len(removed),
            )

    def stats(self) -> dict[str, float]:
        """The reader's counters, the experience operators' counts of the last step and the
        replay buffer's (``replay/...``, with ``replay/reused_share`` of the last batch)."""
        out: dict[str, float] = {**self.reader.stats.as_dict(), **self.pipeline.counts}
        if self.replay is not None:
            out.update(replay.stats(self.replay))
            out[replay.REUSED_SHARE] = self.reused_share
            out[replay.REPLAY_PREFIX + "restored_missing"] = self.replay_missing
        return out


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
