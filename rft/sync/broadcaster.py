"""Trainer rank 0's side of ``sync_method: nccl``: broadcast each new weights version to the
explorers that registered for it (protocol: :mod:`rft.sync.broadcast`).

Data in: a version's state dict, explorers' registrations and heartbeats. Data out: the
rendezvous file, store events and the broadcast tensors, and whether every member loaded the
version (else the trainer publishes it as a folder). Must never make an explorer wait forever.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from rft.monitor import (
    SYNC_BROADCAST_OK,
    SYNC_BROADCAST_S,
    SYNC_GENERATION,
    SYNC_MEMBERS,
)
from rft.rundir import WEIGHTS_GROUP
from rft.sync import broadcast as B
from rft.sync.heartbeat import read_heartbeats

log = logging.getLogger(__name__)


class Cancelled(Exception):
    """A member could not take part in an event; ``tokens``: the registrations at fault."""

    def __init__(self, tokens: set[str], why: str):
        super().__init__(why)
        self.tokens = tokens


class WeightBroadcaster:
    def __init__(
        self,
        run_dir: Path | str,
        device: torch.device,
        timeout_s: float,
        heartbeat_live_s: float,
        bucket_bytes: int = B.BUCKET_BYTES,
    ):
        self.run_dir = Path(run_dir)
        self.bucket_bytes = bucket_bytes
        self.device = device if device.type == "cuda" else torch.device("cpu")
        self.timeout_s = timeout_s
        self.heartbeat_live_s = heartbeat_live_s
        host, port = B.store_address()
        self.store = B.open_store(host, port, timeout_s)
        self.rv = B.Rendezvous(
            host,
            int(self.store.port),
            uuid.uuid4().hex,
            B.backend_for(self.device),
            os.getpid(),
            time.time(),
        )
        B.write_rendezvous(self.run_dir, self.rv)
        log.info(
            "weights by broadcast (%s): explorers rendezvous at %s:%d",
            self.rv.backend,
            host,
            self.rv.port,
        )
        self.generation = 0
        self.members: list[B.Member] = []
        self.group: Any = None
        self.registrations: dict[str, B.Registration] = {}  # newest per explorer name
        self.retired: set[str] = set()  # tokens of registrations whose group failed
        self._joins_read = 0
        self.last: dict[str, float] = {}  # metrics of the last broadcast (trainer monitor)

    def broadcast(self, version: int, state: dict[str, torch.Tensor]) -> bool:
        """Send ``version`` to every live registered explorer; True when all loaded it.

        Called where the checkpoint method publishes a folder. Members: the explorers whose
        newest registration is not retired and whose heartbeat is live; when they differ from
        the current group's (an explorer joined, left or re-registered), a new generation is
        formed first. False when the version did not reach every member (no member yet, a
        member died or timed out: the group is then aborted and its registrations retired); the
        trainer then publishes the version as a folder, so no explorer waits forever, and those
        that re-register join the next generation.
        """
        start = time.monotonic()
        self.last = {SYNC_BROADCAST_OK: 0.0, SYNC_MEMBERS: 0.0}
        try:
            wanted = self._wanted()
            if not wanted:
                log.info(
                    "weights version %d: no explorer registered for the broadcast; "
                    "publishing it as a folder",
                    version,
                )
                self._close_group()
                return False
            if self.group is None or {m.token for m in self.members} != {r.token for r in wanted}:
                self._form(wanted)
            self._send(version, state)
        except Cancelled as e:
            log.warning(
                "weights version %d not broadcast: %s; publishing it as a folder, and "
                "the next sync forms a group without them",
                version,
                e,
            )
            self.retired |= e.tokens
            self._close_group()
            return False
        except (RuntimeError, OSError, B.BroadcastError) as e:
            names = [m.name for m in self.members]
            log.warning(
                "broadcast of weights version %d to %s failed (%s): publishing it as a "
                "folder; generation %d is torn down and the live explorers form the next "
                "one at the next sync",
                version,
                names,
                e,
                self.generation,
            )
            self.retired |= {m.token for m in self.members}
            self._close_group()
            return False
        self.last = {
            SYNC_BROADCAST_OK: 1.0,
            SYNC_BROADCAST_S: time.monotonic() - start,
            SYNC_MEMBERS: float(len(self.members)),
            SYNC_GENERATION: float(self.generation),
        }
        log.info(
            "weights version %d broadcast to %s in %.2fs",
            version,
            [m.name for m in self.members],
            self.last[SYNC_BROADCAST_S],
        )
        return True

    def close(self) -> None:
        """Tear the group down and withdraw the rendezvous file if it is still this trainer's."""
        self._close_group()
        try:
            current = B.read_rendezvous(self.run_dir)
        except B.BroadcastError:
            current = None
        if current is not None and current.session == self.rv.session:
            (self.run_dir / WEIGHTS_GROUP).unlink(missing_ok=True)

    # -- membership

    def _wanted(self) -> list[B.Registration]:
        """Registrations to broadcast to: the newest of each explorer, not withdrawn, not
        retired, with a live heartbeat."""
        new, self._joins_read = B.read_registrations(self.store, self._joins_read)
        for reg in new:
            self.registrations[reg.name] = reg
        live = {s.name for s in read_heartbeats(self.run_dir, self.heartbeat_live_s) if s.live}
        return [
            r
            for r in self.registrations.values()
            if r.tp > 0 and r.token not in self.retired and r.name in live
        ]

    def _form(self, wanted: list[B.Registration]) -> None:
        self._close_group()
        self.generation += 1
        self.members, world_size = B.assign_ranks(wanted)
        self._post(
            {
                "kind": "generation",
                "generation": self.generation,
                "world_size": world_size,
                "members": [asdict(m) for m in self.members],
            }
        )
        start = time.monotonic()
        self.group = B.new_group(
            self.store, self.generation, 0, world_size, self.rv.backend, self.timeout_s
        )
        log.info(
            "weight-sync group generation %d formed with %s in %.2fs",
            self.generation,
            [m.name for m in self.members],
            time.monotonic() - start,
        )

    def _send(self, version: int, state: dict[str, torch.Tensor]) -> None:
        buckets = B.plan_for(state, self.bucket_bytes)
        self._post(
            {
                "kind": "weights",
                "generation": self.generation,
                "version": version,
                "buckets": B.buckets_to_json(buckets),
            }
        )
        for bucket in buckets:
            B.broadcast(self.group, B.pack(bucket, state, self.device))
        if not B.all_loaded(self.group, True, self.device):
            raise B.BroadcastError("an explorer could not load the weights (see its log)")

    def _post(self, event: dict[str, Any]) -> None:
        """Post ``event``, wait until every member acknowledged it, and decide "go"; decide
        "cancel" and raise :class:`Cancelled` as soon as a member cannot come (its heartbeat
        died or says exited, it withdrew) or when the timeout passes."""
        index = B.post_event(self.store, event)
        deadline = time.monotonic() + self.timeout_s
        waiting = list(self.members)
        next_look = 0.0
        while True:
            waiting = [m for m in waiting if not B.acknowledged(self.store, index, m.token)]
            if not waiting:
                B.decide(self.store, index, go=True)
                return
            now = time.monotonic()
            if now >= next_look:  # heartbeats and registrations: once a second
                gone = {m.token for m in waiting} - {r.token for r in self._wanted()}
                if gone or now > deadline:
                    B.decide(self.store, index, go=False)
                    at_fault = gone or {m.token for m in waiting}
                    names = [m.name for m in waiting if m.token in at_fault]
                    why = (
                        "stopped or withdrew"
                        if gone
                        else f"did not answer within synchronizer.sync_timeout={self.timeout_s:.0f}s"
                    )
                    raise Cancelled(at_fault, f"explorer(s) {names} {why}")
                next_look = now + 1.0
            time.sleep(0.01)

    def _close_group(self) -> None:
        B.abort(self.group)
        self.group = None
        self.members = []
