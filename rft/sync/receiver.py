"""The explorer's side of ``sync_method: nccl``: register with the trainer's weight-sync store,
join each group generation this explorer is a member of, receive the versions broadcast to it.

Data in: the trainer's rendezvous file and store events (:mod:`rft.sync.broadcast`). Data out:
weights loaded into the engine, and the version (:meth:`BroadcastReceiver.poll`). Nothing runs
in the background, and a failure must never stop the explorer: it starts over.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from rft.sync import broadcast as B

log = logging.getLogger(__name__)

RECONNECT_S = 30.0  # retry an unanswered rendezvous this often (at once when its session changes)


class BroadcastReceiver:
    """Weights by broadcast into ``engine`` (an :class:`rft.explorer.engine.Engine`).

    Everything that can go wrong on the way is a reason to start over, never to stop: no
    rendezvous file yet (the trainer is starting), a store that does not answer (the trainer was
    requeued: the file's session changes and the receiver reconnects at once), a group that
    failed (a member died; the trainer publishes that version as a folder, which the explorer
    loads like any other). Then the receiver leaves its group and registers again, with a new
    token, for the next one (:meth:`_start_over`).
    """

    def __init__(self, run_dir: Path | str, name: str, engine: Any, tp: int, timeout_s: float):
        self.run_dir = Path(run_dir)
        self.name = name  # writer/heartbeat name: the trainer checks its heartbeat
        self.engine = engine
        self.tp = tp
        self.timeout_s = timeout_s
        self.store: Any = None
        self.rv: B.Rendezvous | None = None
        self.registration: B.Registration | None = None
        self.next_event = 0
        self.generation: int | None = None  # the group this explorer's workers are in
        self._failed_session: str | None = None
        self._retry_at = 0.0
        self.receive_s = 0.0  # seconds the last received version took (receive, load, confirm)
        self._warned = ""  # the last warning logged by _warn_once

    def poll(self, wait_s: float = 0.0) -> int | None:
        """Handle the trainer's events, waiting up to ``wait_s`` for the first one; return the
        weights version loaded by a broadcast, if any (several: the newest).

        The explorer loop calls this wherever it would check the weights folder (before each
        step, and while it waits for a version in ``mode: both``); nothing runs in the
        background, so a broadcast never lands in the middle of a generation. The trainer
        blocks in a broadcast until its members take part: with ``sync_offset`` > 0 or in async
        mode, up to the rest of an explorer step.
        """
        if not self._connect():
            time.sleep(wait_s)
            return None
        loaded = None
        try:
            event = B.wait_event(self.store, self.next_event, wait_s)
            while event is not None:
                index, self.next_event = self.next_event, self.next_event + 1
                version, follow = self._handle(index, event)
                loaded = version if version is not None else loaded
                event = B.wait_event(self.store, self.next_event, self.timeout_s if follow else 0.0)
        except (RuntimeError, OSError, B.BroadcastError) as e:  # the store or the group failed
            self._start_over(
                f"weight sync with the trainer at {self.rv.host}:{self.rv.port} failed ({e})",
                reconnect_now=True,
            )
        return loaded

    def close(self) -> None:
        """Leave the group and withdraw the registration (the trainer stops waiting for us)."""
        self._leave()
        if self.store is not None:
            try:
                B.register(self.store, B.new_registration(self.name, tp=0))
            except (RuntimeError, OSError) as e:
                log.debug("withdrawing the registration: %s", e)
        self.store = None

    # -- events

    def _handle(self, index: int, event: dict[str, Any]) -> tuple[int | None, bool]:
        """(version loaded, whether the trainer's next event follows at once)."""
        if event["kind"] == "generation":
            return None, self._on_generation(index, event)
        if event["kind"] == "weights" and event["generation"] == self.generation:
            return self._on_weights(index, event), False
        return None, False

    def _go(self, index: int) -> bool:
        """Acknowledge event ``index`` and wait for the trainer's decision (go or cancel)."""
        B.acknowledge(self.store, index, self.registration.token)
        return B.wait_decision(self.store, index, self.timeout_s + 60)

    def _on_generation(self, index: int, event: dict[str, Any]) -> bool:
        token = self.registration.token if self.registration else None
        mine = next((m for m in event["members"] if m["token"] == token), None)
        self._leave()
        if mine is None:  # formed without this registration (too late, or retired): again
            self._register()
            return False
        if not self._go(index):  # another member could not come: the next sync re-forms
            log.info(
                "%s: weight-sync group generation %d was cancelled", self.name, event["generation"]
            )
            return False
        start = time.monotonic()
        self.engine.join_group(
            self.rv.host,
            self.rv.port,
            event["generation"],
            mine["rank"],
            event["world_size"],
            self.rv.backend,
            self.timeout_s,
        )
        self.generation = event["generation"]
        log.info(
            "%s joined weight-sync group generation %d as rank %d of %d (%.2fs)",
            self.name,
            self.generation,
            mine["rank"],
            event["world_size"],
            time.monotonic() - start,
        )
        return True  # the trainer broadcasts right after forming a group

    def _on_weights(self, index: int, event: dict[str, Any]) -> int | None:
        version = int(event["version"])
        if not self._go(index):
            self._leave()  # a member is gone: the next sync forms a new generation
            return None
        start = time.monotonic()
        why = self.engine.receive(event["buckets"], version)
        if why:
            self._start_over(
                f"broadcast of weights version {version} failed ({why}); the trainer "
                "publishes it as a folder",
                reconnect_now=True,
            )
            return None
        try:
            self.engine.confirm(True)
        except Exception as e:  # noqa: BLE001 - another member failed: our load stands
            self._start_over(
                f"weight-sync group generation {self.generation} failed after "
                f"version {version} was loaded ({e})",
                reconnect_now=True,
            )
        self.receive_s = time.monotonic() - start
        return version

    # -- connection, registration

    def _connect(self) -> bool:
        if self.store is not None:
            return True
        try:
            rv = B.read_rendezvous(self.run_dir)
        except B.BroadcastError as e:
            self._warn_once(str(e))
            return False
        if rv is None or (rv.session == self._failed_session and time.monotonic() < self._retry_at):
            return False
        if rv.backend == "nccl" and getattr(self.engine, "on_cpu", False):
            self._warn_once(
                f"{self.name}: the trainer broadcasts over NCCL but this explorer runs "
                "vLLM on CPU: weights come through folders only (written when a "
                "broadcast misses an explorer); run explorers on GPUs, or use "
                "synchronizer.sync_method=checkpoint"
            )
            return False
        try:
            self.store = B.connect_store(rv, self.timeout_s)
            self.rv = rv
            self.next_event = B.event_count(
                self.store
            )  # before registering: see rft.sync.broadcast
            self._register()
        except (RuntimeError, OSError, B.BroadcastError) as e:
            if rv.session != self._failed_session:
                log.warning(
                    "%s: weights come through folders until the store answers (retried "
                    "every %.0fs, at once when the trainer restarts): %s",
                    self.name,
                    RECONNECT_S,
                    e,
                )
            self.store = None
            self._failed_session, self._retry_at = rv.session, time.monotonic() + RECONNECT_S
            return False
        log.info(
            "%s registered for weights by broadcast with the trainer at %s:%d",
            self.name,
            rv.host,
            rv.port,
        )
        return True

    def _warn_once(self, message: str) -> None:
        """Log ``message`` once (polls come every second)."""
        if message != self._warned:
            log.warning("%s", message)
            self._warned = message

    def _register(self) -> None:
        self.registration = B.new_registration(self.name, self.tp)
        B.register(self.store, self.registration)

    def _leave(self) -> None:
        if self.generation is not None:
            self.engine.leave_group()
            self.generation = None

    def _start_over(self, why: str, reconnect_now: bool) -> None:
        log.warning("%s: %s; registering again for the next group", self.name, why)
        self._leave()
        if reconnect_now and self.store is not None:
            try:
                self._register()
                return
            except (RuntimeError, OSError) as e:
                log.warning("%s: the trainer's store does not answer (%s)", self.name, e)
        self.store = None
        if self.rv is not None:
            self._failed_session, self._retry_at = self.rv.session, time.monotonic() + RECONNECT_S
