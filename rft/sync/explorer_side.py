"""The explorer's one door to sync: :class:`ExplorerSync`, opened by :func:`open_explorer_sync`.

It owns the explorer's heartbeat and :class:`WeightsIn`, whose ``wait_for(need)`` loads the
newest weights into the engine, waiting until version >= ``need``; behind it: folders
(:class:`~rft.sync.watcher.WeightsWatcher`), delta folders rebuilt in a node-local copy
(:class:`~rft.sync.local.LocalCopy`) and, with ``sync_method: nccl``, the trainer's broadcast
(:class:`~rft.sync.receiver.BroadcastReceiver`). The loops see versions and steps only.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Protocol

from rft.config.schema import Config
from rft.errors import SyncTimeoutError
from rft.lease import LeaseView
from rft.sync.heartbeat import (
    EVALUATING_FIELD,
    FINISHED_FIELD,
    LOADED_FIELD,
    STEPS_FIELD,
    TASKS_FIELD,
    Heartbeat,
)
from rft.sync.local import LocalCopy, delta_policy
from rft.sync.receiver import BroadcastReceiver
from rft.sync.schedule import explorer_lead
from rft.sync.versions import weights_problem
from rft.sync.watcher import WeightsWatcher

WEIGHTS_POLL_S = 1.0  # pointer checks while waiting for weights (mode both)


class Reloadable(Protocol):
    """What weight sync needs of an engine (:class:`rft.explorer.engine.Engine` has it all)."""

    def reload(self, folder: Path) -> object: ...

    def discard_received(self) -> None: ...


class WeightsIn:
    """Weights into one engine: :meth:`wait_for` a version, :attr:`loaded_version`, :meth:`close`."""

    def __init__(
        self,
        watcher: WeightsWatcher,
        engine: Reloadable,
        timeout_s: float,
        receiver: BroadcastReceiver | None = None,
        lead_key: str = "synchronizer.sync_offset",
    ):
        self.watcher = watcher
        self.engine = engine
        self.timeout_s = timeout_s  # synchronizer.sync_timeout
        self.receiver = receiver  # sync_method nccl: versions also come by broadcast
        self.lead_key = lead_key  # the key a timeout message suggests raising

    @property
    def loaded_version(self) -> int | None:
        """The engine's weights version; None after a voided load (the engine holds a mix)."""
        return self.watcher.loaded_version

    def wait_for(self, need: int) -> tuple[int, float, float]:
        """Load the newest weights, waiting until version >= ``need``: from the trainer's
        broadcast or from a published folder, whichever comes. The newest published version is
        loaded whenever it differs from the loaded one, so ``wait_for(0)`` is a non-blocking
        poll; waiting longer than ``timeout_s`` raises :class:`~rft.errors.SyncTimeoutError`.

        A load whose folder the trainer pruned or republished meanwhile is void
        (:meth:`WeightsWatcher.load`) and retried at once with the newest version; until one
        succeeds the engine's weights are unknown and the explorer must not generate. A delta
        whose anchor was deleted raises :class:`~rft.errors.DeltaError` within seconds when no
        trainer can replace it (:meth:`WeightsWatcher.check_anchor`), never a timeout.
        Returns (loaded version, reload seconds, wait seconds).
        """
        start = time.monotonic()
        reload_s = 0.0
        wait_s = 0.0  # the first look at the broadcast events does not wait
        while True:
            if self.receiver is not None:
                received = self.receiver.poll(wait_s)
                if received is not None:
                    self.watcher.loaded_by_broadcast(received)
                    reload_s += self.receiver.receive_s
            retry, load_s = self._load_newest()
            reload_s += load_s
            loaded = self.watcher.loaded_version
            if not retry and loaded is not None and loaded >= need:
                return loaded, reload_s, time.monotonic() - start - reload_s
            # a delta whose anchor is lost: DeltaError once waiting cannot help
            lost_anchor = None if retry else self.watcher.check_anchor()
            if time.monotonic() - start > self.timeout_s:
                raise SyncTimeoutError(self._timeout_message(need, loaded, lost_anchor))
            if retry:
                wait_s = 0.0
            elif self.receiver is not None:
                wait_s = WEIGHTS_POLL_S  # the receiver waits on the trainer's events meanwhile
            else:
                time.sleep(WEIGHTS_POLL_S)

    def _load_newest(self) -> tuple[bool, float]:
        """(whether the load was voided and must be retried, seconds it took)."""
        latest = self.watcher.poll()
        if latest is None:
            return False, 0.0
        start = time.monotonic()
        loaded = self.watcher.load(latest[0], self.engine.reload)
        return not loaded, time.monotonic() - start

    def _timeout_message(self, need: int, loaded: int | None, lost_anchor: str | None) -> str:
        run_dir = self.watcher.run_dir
        why = (
            weights_problem(run_dir)
            or lost_anchor
            or (
                f"is the trainer running? Check its log, or raise synchronizer.sync_timeout / "
                f"{self.lead_key}"
            )
        )
        return (
            f"waited {self.timeout_s:.0f}s for weights version >= {need} in {run_dir} "
            f"(loaded: {'none, a load was voided' if loaded is None else loaded}); {why}"
        )

    def close(self) -> None:
        """Leave the broadcast group (the trainer stops waiting for this engine)."""
        if self.receiver is not None:
            self.receiver.close()
            self.engine.discard_received()
            self.receiver = None


def open_weights_in(cfg: Config, writer: str, engine: Any, heartbeat: Heartbeat) -> WeightsIn:
    """The :class:`WeightsIn` of explorer ``writer`` (its heartbeat says what it loads)."""
    sync = cfg.synchronizer
    nccl = sync.sync_method == "nccl"
    local = None
    policy = delta_policy(cfg)
    if policy is not None:  # engines load node-local rebuilt folders, not weights/
        local = LocalCopy(cfg.run_dir, policy.scratch(cfg.run_dir, writer))
    # with nccl, folders only bring versions newer than the loaded one (published at
    # checkpoints, at the end, or when a broadcast failed)
    watcher = WeightsWatcher(
        cfg.run_dir,
        loaded_version=0,
        heartbeat=heartbeat,
        newer_only=nccl,
        trainer_live_s=cfg.explorer.heartbeat_timeout_s,
        local=local,
    )
    receiver = None
    if nccl:
        tp = cfg.explorer.rollout_model.tensor_parallel_size
        receiver = BroadcastReceiver(cfg.run_dir, writer, engine, tp, sync.sync_timeout)
    lead_key = explorer_lead(cfg.mode, sync.sync_offset, sync.max_lead_steps, sync.sync_style)[1]
    return WeightsIn(watcher, engine, sync.sync_timeout, receiver, lead_key)


class ExplorerSync:
    """One explorer's side of sync: the weights into its engine (:class:`WeightsIn`) and its
    heartbeat, which says what the engine holds and how far the explorer got."""

    def __init__(self, heartbeat: Heartbeat, weights: WeightsIn):
        self.heartbeat = heartbeat
        self.weights = weights

    @property
    def loaded_version(self) -> int | None:
        """The engine's weights version (None after a voided load)."""
        return self.weights.loaded_version

    def wait_for(self, need: int) -> tuple[int, float, float]:
        """:meth:`WeightsIn.wait_for`: (loaded version, reload seconds, wait seconds)."""
        return self.weights.wait_for(need)

    def sealed(self, step: int, tasks: int, finished: bool) -> None:
        """Step ``step`` is sealed with ``tasks`` more tasks generated; ``finished``: it was the
        explorer's last (a trainer may end once every explorer says so)."""
        done = self.heartbeat.fields[TASKS_FIELD] + tasks
        self.heartbeat.beat(**{STEPS_FIELD: step, TASKS_FIELD: done, FINISHED_FIELD: finished})

    @contextmanager
    def evaluating(self, need: int | None = None) -> Iterator[int]:
        """Said in the heartbeat while the body evaluates (a launcher waits for it): the weights
        loaded, or first those >= ``need`` when given; yields their version."""
        if need is not None:
            self.wait_for(need)
        self.heartbeat.beat(**{EVALUATING_FIELD: True})
        try:
            yield self.loaded_version or 0
        finally:
            self.heartbeat.beat(**{EVALUATING_FIELD: False})

    def close(self) -> None:
        """Leave the broadcast group, stop the heartbeat and mark the explorer exited."""
        try:
            self.weights.close()
        finally:
            self.heartbeat.stop()


def open_explorer_sync(
    cfg: Config,
    writer: str,
    engine: Any,
    steps_done: int,
    finished: bool = False,
    lease: LeaseView | None = None,
) -> ExplorerSync:
    """Explorer ``writer``'s :class:`ExplorerSync` for ``engine`` (holding version 0, the model
    path), its heartbeat beating from now on. ``steps_done``: the steps it sealed before this
    run; ``finished``: it has no task left (a resume after its last step). Open it once the
    engine runs: until then the explorer's lease says it is starting
    (:func:`~rft.sync.heartbeat.starting_explorers`). ``lease``: the writer's; a displaced
    instance's heartbeat writes no more."""
    heartbeat = Heartbeat(cfg.run_dir, writer, cfg.explorer.heartbeat_interval_s, lease)
    heartbeat.fields.update({STEPS_FIELD: steps_done, FINISHED_FIELD: finished, LOADED_FIELD: 0})
    heartbeat.start()
    try:
        return ExplorerSync(heartbeat, open_weights_in(cfg, writer, engine, heartbeat))
    except BaseException:
        heartbeat.stop()
        raise
