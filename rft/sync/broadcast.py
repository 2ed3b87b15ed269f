"""Weights by broadcast (``synchronizer.sync_method: nccl``): the protocol both sides import.

Trainer rank 0 and the explorers' vLLM workers form a process group of their own (NCCL with a
GPU, gloo without: the same code). Trainer rank 0 opens a ``TCPStore`` and writes its address
atomically to :data:`rft.rundir.WEIGHTS_GROUP`; explorers register, acknowledge events and
learn decisions through the store (the records below), and weights travel in :class:`Bucket` s
that :func:`plan_buckets`, :func:`pack` and :func:`unpack` lay out alike on both sides. A failed
group is never waited on: the trainer cancels or aborts it and publishes that version as a folder.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import uuid
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch

from rft import atomic
from rft.errors import RftError
from rft.rundir import WEIGHTS_GROUP

log = logging.getLogger(__name__)

BUCKET_BYTES = 256 << 20  # one broadcast carries at most this much (a larger tensor: alone)
HOST_ENV = "RFT_SYNC_HOST"  # address explorers reach the trainer's store at (default: hostname)
PORT_ENV = "RFT_SYNC_PORT"  # the store's port (default: any free port)
CONNECT_TIMEOUT_S = 10.0  # an explorer connecting to the store gives up after this
NCCL_ERROR_HANDLING_ENV = "TORCH_NCCL_ASYNC_ERROR_HANDLING"


class BroadcastError(RftError):
    """The weight-sync group failed (a member died or timed out, the trainer left)."""


# ----------------------------------------------------------------------------- rendezvous file


@dataclass(frozen=True)
class Rendezvous:
    """What ``weights_group.json`` says: where the trainer's store listens, and for which start."""

    host: str
    port: int
    session: str  # new at every trainer start: explorers re-register when it changes
    backend: str  # "nccl" or "gloo"
    pid: int
    time: float


def write_rendezvous(run_dir: Path | str, rv: Rendezvous) -> Path:
    path = Path(run_dir) / WEIGHTS_GROUP
    atomic.write_json(path, asdict(rv))
    return path


def read_rendezvous(run_dir: Path | str) -> Rendezvous | None:
    """The rendezvous file, or None before a trainer wrote one. A damaged file raises (the
    trainer writes it atomically, so it will not repair itself)."""
    path = Path(run_dir) / WEIGHTS_GROUP
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise BroadcastError(
            f"{path} is unreadable ({e}); delete it: the trainer writes it again when it starts"
        ) from e
    try:
        return Rendezvous(**data)
    except TypeError as e:
        raise BroadcastError(
            f"{path} is not a weight-sync rendezvous file ({e}); delete it: "
            "the trainer writes it again when it starts"
        ) from e


def store_address() -> tuple[str, int]:
    """(host, port) the trainer's store listens on: ``RFT_SYNC_HOST``/``RFT_SYNC_PORT`` or this
    host's name and any free port."""
    port = os.environ.get(PORT_ENV, "0")
    if not port.isdigit():
        raise BroadcastError(f"{PORT_ENV}={port!r} is not a port number")
    return os.environ.get(HOST_ENV) or socket.gethostname(), int(port)


def open_store(rv_host: str, port: int, timeout_s: float) -> torch.distributed.TCPStore:
    """The trainer's store (server side); a port it cannot listen on raises, naming the fix."""
    try:
        return torch.distributed.TCPStore(
            rv_host, port, None, True, timedelta(seconds=timeout_s), wait_for_workers=False
        )
    except (RuntimeError, OSError) as e:
        raise BroadcastError(
            f"the trainer cannot open its weight-sync store on {rv_host}:{port or 'a free port'} "
            f"({e}); unset {PORT_ENV} or choose a free port, or use "
            "synchronizer.sync_method=checkpoint"
        ) from e


def connect_store(rv: Rendezvous, timeout_s: float) -> torch.distributed.TCPStore:
    """A client of the trainer's store; raises :class:`BroadcastError` naming what to check."""
    try:
        store = torch.distributed.TCPStore(
            rv.host, rv.port, None, False, timedelta(seconds=CONNECT_TIMEOUT_S)
        )
    except (RuntimeError, OSError) as e:
        raise BroadcastError(
            f"cannot reach the trainer's weight-sync store at {rv.host}:{rv.port} (from "
            f"{WEIGHTS_GROUP}, trainer pid {rv.pid}): {e}. If the trainer is running, check that "
            f"this node can open TCP connections to {rv.host} (firewall; with --het-group jobs, "
            f"the node groups' network), or set {HOST_ENV} to an address of the trainer node "
            "that explorers reach"
        ) from e
    store.set_timeout(timedelta(seconds=timeout_s))
    return store


# ----------------------------------------------------------------------------- store records
# ``joins`` (a counter) and ``join/<i>``: explorer registrations. ``events`` and ``event/<n>``:
# what the trainer does, in order: a ``generation`` names a new group's members (rank 0 the
# trainer, then each member's workers); a ``weights`` event announces one version's bucket
# layout, then the buckets follow on the group, then an all-reduce where each member reports its
# load. ``ack/<n>/<token>`` and ``decision/<n>``: every member acknowledges event n (explorers
# look between steps), and only then does the trainer decide "go" and all enter the collective;
# a member that died, exited or withdrew meanwhile (heartbeats, registrations) makes it decide
# "cancel" at once. After a failure the registrations at fault are retired (all of them when the
# collective broke: who broke it is unknown); those explorers register again, and the next sync
# forms the next generation.


@dataclass(frozen=True)
class Registration:
    """An explorer's request to receive weights by broadcast."""

    name: str  # its writer/heartbeat name, e.g. explorer-0
    token: str  # unique to this registration: a re-registration has a new one
    tp: int  # workers of its engine (tensor_parallel_size): one group rank each; 0: withdrawn
    pid: int
    host: str


@dataclass(frozen=True)
class Member:
    name: str
    token: str
    rank: int  # rank of its first worker; worker i has rank + i
    tp: int


def new_registration(name: str, tp: int) -> Registration:
    """A registration (``tp`` 0: a withdrawal, the explorer leaves the run)."""
    return Registration(name, uuid.uuid4().hex, tp, os.getpid(), socket.gethostname())


def assign_ranks(registrations: Iterable[Registration]) -> tuple[list[Member], int]:
    """Members (sorted by name, ranks after the trainer's 0) and the group's world size."""
    members, rank = [], 1
    for reg in sorted(registrations, key=lambda r: r.name):
        members.append(Member(reg.name, reg.token, rank, reg.tp))
        rank += reg.tp
    return members, rank


def _encode(record: dict[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True).encode()


def register(store: torch.distributed.Store, reg: Registration) -> None:
    index = store.add("joins", 1) - 1
    store.set(f"join/{index}", _encode(asdict(reg)))


def read_registrations(
    store: torch.distributed.Store, start: int, wait_s: float = CONNECT_TIMEOUT_S
) -> tuple[list[Registration], int]:
    """Registrations from index ``start`` on, and the index to read from next time. A slot
    whose record does not come within ``wait_s`` (its explorer died between counting and
    writing it) is skipped for good, so it cannot stall every later sync."""
    end = store.add("joins", 0)
    regs = []
    for index in range(start, end):
        key = f"join/{index}"
        try:
            store.wait([key], timedelta(seconds=wait_s))  # set right after its counter
        except RuntimeError as e:
            log.warning("weight-sync registration %d never written (%s): skipped", index, e)
            continue
        regs.append(Registration(**json.loads(store.get(key))))
    return regs, end


def post_event(store: torch.distributed.Store, event: dict[str, Any]) -> int:
    index = store.add("events", 1) - 1
    store.set(f"event/{index}", _encode(event))
    return index


def acknowledge(store: torch.distributed.Store, index: int, token: str) -> None:
    store.set(f"ack/{index}/{token}", b"1")


def acknowledged(store: torch.distributed.Store, index: int, token: str) -> bool:
    return store.check([f"ack/{index}/{token}"])


def decide(store: torch.distributed.Store, index: int, go: bool) -> None:
    store.set(f"decision/{index}", b"go" if go else b"cancel")


def wait_decision(store: torch.distributed.Store, index: int, timeout_s: float) -> bool:
    """True for "go", False for "cancel" (raises when no decision comes within the timeout)."""
    key = f"decision/{index}"
    store.wait([key], timedelta(seconds=timeout_s))
    return store.get(key) == b"go"


def event_count(store: torch.distributed.Store) -> int:
    return store.add("events", 0)


def wait_event(store: torch.distributed.Store, index: int, wait_s: float) -> dict[str, Any] | None:
    """Event ``index`` if it is posted within ``wait_s`` seconds (0: only if already there)."""
    key = f"event/{index}"
    if wait_s <= 0:
        return json.loads(store.get(key)) if store.check([key]) else None
    try:
        store.wait([key], timedelta(seconds=wait_s))
    except RuntimeError as e:  # the wait's timeout (the store raises a RuntimeError subclass)
        if "timeout" in str(e).lower() or "timed out" in str(e).lower():
            return None
        raise
    return json.loads(store.get(key))


# ----------------------------------------------------------------------------- buckets (pure)


@dataclass(frozen=True)
class BucketSlot:
    name: str
    shape: tuple[int, ...]
    offset: int  # first element in its bucket

    @property
    def numel(self) -> int:
        n = 1
        for dim in self.shape:
            n *= dim
        return n


@dataclass(frozen=True)
class Bucket:
    dtype: str  # torch dtype name without "torch.", e.g. "bfloat16"
    numel: int
    tensors: tuple[BucketSlot, ...]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def plan_buckets(
    specs: Iterable[tuple[str, str, tuple[int, ...]]], bucket_bytes: int = BUCKET_BYTES
) -> list[Bucket]:
    """Group ``(name, dtype, shape)`` in order into buckets of one dtype and at most
    ``bucket_bytes`` (a tensor larger than that gets a bucket of its own)."""
    buckets: list[Bucket] = []
    open_: dict[str, list[BucketSlot]] = {}
    sizes: dict[str, int] = {}

    def close(dtype: str) -> None:
        tensors = open_.pop(dtype)
        buckets.append(Bucket(dtype, sizes.pop(dtype), tuple(tensors)))

    for name, dtype, shape in specs:
        spec = BucketSlot(name, tuple(int(d) for d in shape), 0)
        itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
        if dtype in open_ and (sizes[dtype] + spec.numel) * itemsize > bucket_bytes:
            close(dtype)
        offset = sizes.get(dtype, 0)
        open_.setdefault(dtype, []).append(BucketSlot(spec.name, spec.shape, offset))
        sizes[dtype] = offset + spec.numel
    for dtype in list(open_):
        close(dtype)
    return buckets


def plan_for(state: dict[str, torch.Tensor], bucket_bytes: int = BUCKET_BYTES) -> list[Bucket]:
    return plan_buckets(
        ((name, dtype_name(t.dtype), tuple(t.shape)) for name, t in state.items()), bucket_bytes
    )


def pack(bucket: Bucket, state: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
    """The bucket's tensors flattened back to back into one tensor on ``device``."""
    flat = torch.empty(bucket.numel, dtype=getattr(torch, bucket.dtype), device=device)
    for spec in bucket.tensors:
        flat[spec.offset : spec.offset + spec.numel].copy_(state[spec.name].reshape(-1))
    return flat


def unpack(bucket: Bucket, flat: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` views into ``flat``, in the bucket's order."""
    for spec in bucket.tensors:
        yield spec.name, flat[spec.offset : spec.offset + spec.numel].view(spec.shape)


def buckets_to_json(buckets: list[Bucket]) -> list[list]:
    return [
        [b.dtype, b.numel, [[t.name, list(t.shape), t.offset] for t in b.tensors]] for b in buckets
    ]


def buckets_from_json(data: list[list]) -> list[Bucket]:
    return [
        Bucket(
            dtype,
            numel,
            tuple(BucketSlot(name, tuple(shape), offset) for name, shape, offset in tensors),
        )
        for dtype, numel, tensors in data
    ]


# ----------------------------------------------------------------------------- the group


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def new_group(
    store: torch.distributed.Store,
    generation: int,
    rank: int,
    world_size: int,
    backend: str,
    timeout_s: float,
) -> torch.distributed.Backend:
    """This process's member of generation ``generation``'s group (blocks until all members
    joined or the store's timeout passes). Keys of each generation have their own prefix."""
    prefixed = torch.distributed.PrefixStore(f"group/{generation}/", store)
    timeout = timedelta(seconds=timeout_s)
    if backend == "nccl":
        if not hasattr(torch.distributed, "ProcessGroupNCCL"):
            raise BroadcastError(
                "the trainer broadcasts weights over NCCL but this torch has no "
                "NCCL: explorers need a CUDA build of torch (the GPU setup)"
            )
        options = torch.distributed.ProcessGroupNCCL.Options()
        options._timeout = timeout
        # A timed-out collective of this group aborts its communicators and raises (2:
        # CleanUpOnly) instead of killing the process (torch's default, 3): the trainer must
        # survive a hung explorer. Read once, by the constructor; the trainer's own group keeps
        # the default.
        previous = os.environ.get(NCCL_ERROR_HANDLING_ENV)
        os.environ[NCCL_ERROR_HANDLING_ENV] = "2"
        try:
            return torch.distributed.ProcessGroupNCCL(prefixed, rank, world_size, options)
        finally:
            if previous is None:
                os.environ.pop(NCCL_ERROR_HANDLING_ENV, None)
            else:
                os.environ[NCCL_ERROR_HANDLING_ENV] = previous
    return torch.distributed.ProcessGroupGloo(prefixed, rank, world_size, timeout)


def broadcast(group: torch.distributed.Backend, tensor: torch.Tensor) -> None:
    """Broadcast ``tensor`` from rank 0 of ``group`` (in place on the others); waits."""
    options = torch.distributed.BroadcastOptions()
    options.rootRank = 0
    group.broadcast([tensor], options).wait()


def all_loaded(group: torch.distributed.Backend, ok: bool, device: torch.device) -> bool:
    """Every member says its load went well (an all-reduce MIN of 0/1 flags)."""
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    options = torch.distributed.AllreduceOptions()
    options.reduceOp = torch.distributed.ReduceOp.MIN
    group.allreduce([flag], options).wait()
    return bool(flag.item())


def abort(group: torch.distributed.Backend | None) -> None:
    """Tear ``group`` down without waiting for its members (they see errors)."""
    if group is None:
        return
    try:
        group.abort()
    except Exception as e:  # noqa: BLE001 - tearing down a failed group; nothing to save
        log.debug("aborting the weight-sync group: %s", e)
