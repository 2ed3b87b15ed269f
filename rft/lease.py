"""Run-directory ownership: one live trainer, and one live explorer task per writer name.

A role instance claims ``leases/<name>/`` (:func:`rft.rundir.lease_dir`) before it writes into
the run directory, beats in its claim, and checks before every save that it still owns it; a
second instance is refused at start with the holder's host, pid, job and heartbeat age. Works
on NFS and Lustre without file locks (PROTOCOL below). Data in: the environment (host, pid,
SLURM ids); data out: claim files. Must not import anything above :mod:`rft.rundir`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol

from rft import atomic
from rft.errors import LeaseError
from rft.rundir import LEASES_DIR, lease_dir, lease_file

log = logging.getLogger(__name__)

# PROTOCOL (no locks; only exclusive creation, which NFS v3+ and Lustre make atomic on the server)
# - A claim is ``leases/<name>/<gen:06d>.json``; the owner is the claim of the highest gen.
# - Acquire: read the newest claim g (none: g = 0). Unless it may be displaced
#   (:func:`takeover_reason`), refuse. Else create g+1 exclusively (write a temporary, then
#   ``link``: fails if the name exists). Of any number of instances racing for g+1 the server
#   lets exactly one create it; a loser reads g+1 (a fresh claim of a live winner) and is refused.
#   A loser that finds its own token there won (NFS: the link succeeded, its reply was lost).
#   ``--take-over`` displaces only the claim seen first, so two take-overs at once cannot
#   displace each other in turn; stale/dead/requeue displacements apply at every gen.
# - Only the holder ever writes its claim (heartbeat: atomic replace of its own file), so a
#   displaced holder still beating cannot hide the newer claim: nobody rewrites anyone's file.
# - Loss: before each save (checkpoint, weights, segment, cursor) the holder lists its folder;
#   a newer gen, or its own file gone, means it lost the lease and it stops with LeaseError.
#   NFS may cache a directory listing for up to its acdirmax (60 s by default): a take-over
#   is noticed at the first check after that.
# - The winner deletes claims older than the one it displaced (kept: one, for the record).

TAKE_OVER_ENV = "RFT_TAKE_OVER"  # "1": take the run directory over from a live holder
_CLAIM_RE = re.compile(r"^(\d{6,})\.json$")
_READ_TRIES = 5  # a claim replaced while read can fail once on NFS (stale file handle)


def take_over_requested(env: Mapping[str, str]) -> bool:
    return env.get(TAKE_OVER_ENV, "") == "1"


def identity(env: Mapping[str, str], token: str, now: float) -> dict[str, Any]:
    """This instance's claim: who it is (host, pid, SLURM job/step/restart count), a token unique
    to this acquire, and its start and heartbeat times."""
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "slurm_job_id": env.get("SLURM_JOB_ID"),
        "slurm_step_id": env.get("SLURM_STEP_ID"),
        "slurm_procid": env.get("SLURM_PROCID"),
        "slurm_restart_count": int(env.get("SLURM_RESTART_COUNT") or 0),
        "token": token,
        "start_time": now,
        "heartbeat_time": now,
        "released": False,
    }


def takeover_reason(
    holder: Mapping[str, Any],
    me: Mapping[str, Any],
    now: float,
    stale_s: float,
    take_over: bool,
    pid_alive: Callable[[int], bool] = atomic.pid_alive,
) -> str | None:
    """Why ``me`` may displace ``holder``'s claim, or None when it must be refused."""
    age_s = now - float(holder.get("heartbeat_time") or 0.0)
    if holder.get("released"):
        return "the holder released it"
    if age_s > stale_s:
        return f"the holder's heartbeat was {age_s:.0f} s old (stale after {stale_s:.0f} s)"
    if holder.get("host") == me["host"]:
        if holder.get("pid") == me["pid"]:
            return "this process held it"
        if not pid_alive(int(holder.get("pid") or 0)):
            return "the holder's process is gone"
    job = holder.get("slurm_job_id")
    if job and job == me["slurm_job_id"]:
        if int(holder.get("slurm_restart_count") or 0) < me["slurm_restart_count"]:
            # SLURM kills a job before it requeues it: the holder is this job's last incarnation
            return f"the holder was SLURM job {job}'s previous run (this is its requeue)"
    return "--take-over was given" if take_over else None


def describe(holder: Mapping[str, Any], now: float) -> str:
    """``host H pid P (SLURM job J step S), heartbeat N s ago`` for messages."""
    job = holder.get("slurm_job_id")
    step = holder.get("slurm_step_id")
    where = f" (SLURM job {job}{f' step {step}' if step else ''})" if job else ""
    age_s = now - float(holder.get("heartbeat_time") or 0.0)
    return f"host {holder.get('host')} pid {holder.get('pid')}{where}, heartbeat {age_s:.0f} s ago"


def generations(folder: Path) -> list[int]:
    """Claim generations in ``folder``, ascending (temporaries excluded)."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(_CLAIM_RE.match, names) if m)


def read_claim(path: Path) -> dict[str, Any] | None:
    """A claim as written, None if the file is gone; retried while it is being replaced."""
    for attempt in range(_READ_TRIES):
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            if attempt == _READ_TRIES - 1:
                raise LeaseError(
                    f"cannot read the run-directory claim {path} ({e}); if no rft process "
                    "runs on this run directory, delete that file"
                ) from e
            time.sleep(0.2)
    return None


def newest_claim(run_dir: Path, name: str) -> tuple[int, dict[str, Any] | None]:
    """(gen, claim) of the newest claim of ``name``; (0, None) when it was never claimed."""
    gens = generations(lease_dir(run_dir, name))
    for gen in reversed(gens):
        claim = read_claim(lease_file(run_dir, name, gen))
        if claim is not None:
            return gen, claim
    return (gens[-1] if gens else 0), None


def live_holders(run_dir: Path, stale_s: float, now: float | None = None) -> dict[str, dict]:
    """name -> the newest claim of every name in the run directory that is neither released
    nor stale."""
    now = time.time() if now is None else now
    root = Path(run_dir) / LEASES_DIR
    names = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    claims = {name: newest_claim(Path(run_dir), name)[1] for name in names}
    return {
        name: c
        for name, c in claims.items()
        if c is not None
        and not c.get("released")
        and now - float(c.get("heartbeat_time") or 0) <= stale_s
    }


def remove_dead_tmp(
    run_dir: Path, prefixes: tuple[str, ...], stale_s: float, folder: Path | None = None
) -> list[Path]:
    """Delete temporaries of ``folder`` (default: the run directory's root) that start with one
    of ``prefixes`` and whose writer is dead: on this host its pid is gone, on another host it
    holds no live claim (every writer of those names holds one while it writes). Call with the
    lease held."""
    holders = {(c.get("host"), c.get("pid")) for c in live_holders(run_dir, stale_s).values()}
    here = socket.gethostname()

    def alive(host: str, pid: int) -> bool:
        return atomic.pid_alive(pid) if host == here else (host, pid) in holders

    removed = [
        path
        for prefix in prefixes
        for path in atomic.remove_stale_tmp(folder or run_dir, prefix=prefix, alive=alive)
    ]
    for path in removed:
        log.info("removed %s (left by a writer that died)", path)
    return removed


class Fence(Protocol):
    """What a role's writes check immediately before each externally visible write (a rename
    into place, a pointer, metadata, a prune, a heartbeat, monitor output): LeaseError, with
    the lease-lost line, once a newer instance owns the role's lease."""

    def check(self, before: str) -> None: ...


class NoFence:
    """For writers that hold no lease (tools, tests of one module): every write may go."""

    def check(self, before: str) -> None:
        pass


NO_FENCE = NoFence()


@contextmanager
def fenced(fence: Fence, what: str) -> Iterator[None]:
    """Around writes a take-over can pull the floor from under (the new owner removed this
    instance's temporaries): an OSError once the lease is lost is the lease-lost line."""
    try:
        yield
    except OSError:
        fence.check(what)  # raises the lease-lost line if this instance lost it
        raise


class LeaseView:
    """Generation ``gen`` of ``name``'s lease, as any process of the holding role sees it (the
    trainer's other ranks): whether a newer instance took it over. Writes nothing."""

    def __init__(self, run_dir: Path | str, name: str, gen: int):
        self.run_dir, self.name, self.gen = Path(run_dir), name, gen
        self.path = lease_file(run_dir, name, gen)
        self.lost_to: str | None = None  # set once the lease is found lost

    def lost(self) -> str | None:
        """Who holds the lease now if this instance lost it (a newer claim, or its file gone)."""
        if self.lost_to is None:
            newest = max(generations(self.path.parent), default=0)
            if newest > self.gen:
                claim = read_claim(lease_file(self.run_dir, self.name, newest)) or {}
                why = (claim.get("took_over") or {}).get("why", "unknown")
                self.lost_to = f"{describe(claim, time.time())}, which took it over because {why}"
            elif not self.path.is_file():
                self.lost_to = f"nobody: its claim {self.path} was deleted"
        return self.lost_to

    def lost_message(self, before: str) -> str | None:
        """Why this instance must stop before ``before`` (what it would write), or None."""
        lost_to = self.lost()
        if lost_to is None:
            return None
        return (
            f"this {self.name} lost its lease on {self.run_dir} to {lost_to}; stopping before "
            f"{before}, so the new owner's files are not overwritten"
        )

    def check(self, before: str) -> None:
        """Raise :class:`LeaseError` if the lease was lost; ``before``: what would be written."""
        message = self.lost_message(before)
        if message is not None:
            raise LeaseError(message)


class Lease(LeaseView):
    """One held claim: :meth:`acquire` it, :meth:`start` its heartbeat, :meth:`check` before
    each save (it is the role's :class:`Fence`), :meth:`release` at the end."""

    def __init__(
        self, run_dir: Path, name: str, gen: int, claim: dict[str, Any], interval_s: float
    ):
        super().__init__(run_dir, name, gen)
        self.claim = claim
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def acquire(
        cls,
        run_dir: Path | str,
        name: str,
        interval_s: float,
        stale_s: float,
        take_over: bool | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Lease:
        """Claim ``name`` in ``run_dir`` (PROTOCOL above) or raise :class:`LeaseError` naming
        the live holder. ``take_over`` None: from ``RFT_TAKE_OVER`` (``--take-over``)."""
        run_dir = Path(run_dir)
        env = os.environ if env is None else env
        take_over = take_over_requested(env) if take_over is None else take_over
        me = identity(env, uuid.uuid4().hex, time.time())
        folder = lease_dir(run_dir, name)
        folder.mkdir(parents=True, exist_ok=True)
        gen, holder = newest_claim(run_dir, name)
        first_seen = gen
        while True:
            if holder is not None and holder.get("token") == me["token"]:
                break  # our link succeeded though it reported the name taken (NFS retransmit)
            why = None
            if holder is not None:
                why = takeover_reason(
                    holder, me, time.time(), stale_s, take_over and gen == first_seen
                )
                if why is None:
                    raise LeaseError(refusal(run_dir, name, holder, stale_s))
            claim = dict(me, took_over=_displaced(gen, holder, why))
            try:
                atomic.write_bytes(
                    lease_file(run_dir, name, gen + 1), _dump(claim), overwrite=False
                )
            except FileExistsError:
                gen += 1
                holder = read_claim(lease_file(run_dir, name, gen))
                continue
            gen, holder = gen + 1, claim
            break
        lease = cls(run_dir, name, gen, holder, interval_s)
        if holder.get("took_over"):
            log.warning("took over the %s lease of %s: %s", name, run_dir, holder["took_over"])
        lease.prune()
        return lease

    def beat(self) -> None:
        """Rewrite the claim with the current time (only while this instance owns it)."""
        with self._lock:
            if self.lost() is None and not self.claim["released"]:
                self.claim["heartbeat_time"] = time.time()
                atomic.write_bytes(self.path, _dump(self.claim))

    def start(self) -> Lease:
        """Beat every ``interval_s`` from a daemon thread until :meth:`release` or a loss."""
        self._thread = threading.Thread(target=self._run, name=f"lease-{self.name}", daemon=True)
        self._thread.start()
        return self

    def release(self, blocking: bool = True) -> None:
        """Mark the claim released (the next instance starts at once). ``blocking=False`` from
        a signal handler: skipped if the interrupted code holds the lock."""
        self._stop.set()
        if not self._lock.acquire(blocking=blocking):
            return
        try:
            if self.lost() is None and not self.claim["released"]:
                self.claim["released"] = True
                atomic.write_bytes(self.path, _dump(self.claim))
        except (OSError, LeaseError) as e:
            log.warning("lease %s not released: %s", self.path, e)
        finally:
            self._lock.release()

    def prune(self) -> None:
        """Delete claims older than the one this one displaced, and dead writers' temporaries."""
        for gen in generations(self.path.parent):
            if gen < self.gen - 1:
                lease_file(self.run_dir, self.name, gen).unlink(missing_ok=True)
        atomic.remove_stale_tmp(self.path.parent)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except (OSError, LeaseError) as e:  # a filesystem hiccup must not kill the role
                log.warning("lease %s not refreshed: %s", self.path, e)
            if self.lost_to is not None:  # the role's next write stops it with the line
                log.info("lost the %s lease of %s to %s", self.name, self.run_dir, self.lost_to)
                return


def refusal(run_dir: Path, name: str, holder: Mapping[str, Any], stale_s: float) -> str:
    """The message that refuses a second instance of ``name``."""
    return (
        f"{run_dir} is in use: its {name} lease is held by {describe(holder, time.time())}; a second "
        f"{name} would overwrite its files. Stop that one first; if it is dead, its claim "
        f"expires {stale_s:.0f} s after its last heartbeat (explorer.heartbeat_timeout_s), or "
        "start with --take-over to take it over now (the holder stops at its next save)"
    )


def refusal_for_new(
    run_dir: Path | str, name: str, stale_s: float, env: Mapping[str, str]
) -> str | None:
    """The :func:`refusal` that :meth:`Lease.acquire` would raise now for a process not started
    yet (on this host, with ``env``: ``--take-over`` and SLURM ids) claiming ``name``; None when
    it would get the lease. Reads only: a launcher asks before it writes into the run directory,
    and the role's own acquire stays the guard."""
    _gen, holder = newest_claim(Path(run_dir), name)
    if holder is None:
        return None
    now = time.time()
    me = dict(identity(env, "", now), pid=None)  # its pid is not known: never the holder's
    if takeover_reason(holder, me, now, stale_s, take_over_requested(env)) is not None:
        return None
    return refusal(Path(run_dir), name, holder, stale_s)


def _displaced(gen: int, holder: Mapping[str, Any] | None, why: str | None) -> dict | None:
    if holder is None:
        return None
    return {"gen": gen, "host": holder.get("host"), "pid": holder.get("pid"), "why": why}


def _dump(claim: Mapping[str, Any]) -> bytes:
    return (json.dumps(claim, indent=1, sort_keys=True) + "\n").encode()
