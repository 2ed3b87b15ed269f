"""GPUs and ranks: which GPUs each role gets, and which rank a process is, under every launcher.

Owns the GPU split of a cluster (:func:`gpu_split`) and of this machine (:func:`local_gpu_ids`,
:func:`local_trainer_ranks`), the GPUs inside an explorer task (the rollout engine's first,
then each auxiliary model's: a judge's vLLM engine or a reward model's scorer,
:func:`auxiliary_devices`), and the rank variables of explorer tasks and trainer ranks (local launcher,
torchrun, srun, heterogeneous jobs). Pure functions of numbers and environments: it imports
neither torch nor the config (the config rules check a config's split, :func:`rft.config.gpus.check_gpu_split`).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Protocol, Sequence

from rft.errors import ConfigError

EXPLORER_MODES = ("both", "explore")  # modes that run explorer tasks
ENGINE_MODES = (*EXPLORER_MODES, "bench")  # modes that start vLLM engines (bench: one, in-process)
TRAINER_MODES = ("both", "train")  # modes that run a trainer


# ----------------------------------------------------------------------------- devices


@dataclass(frozen=True)
class Devices:
    """Accelerators visible on this machine."""

    gpus: int  # visible NVIDIA GPUs (0 on CPU machines)


def local_devices() -> Devices:
    """Count GPUs without importing torch (nvidia-smi and CUDA_VISIBLE_DEVICES)."""
    if shutil.which("nvidia-smi") is None:
        return Devices(0)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return Devices(len([d for d in visible.split(",") if d.strip() not in ("", "-1")]))
    try:
        listing = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return Devices(0)  # a driver that does not answer: treat the machine as CPU-only
    return Devices(sum(1 for line in listing.splitlines() if line.startswith("GPU ")))


@dataclass(frozen=True)
class GpuSplit:
    """GPUs of each role in the cluster the config describes."""

    total: int  # cluster.node_num x gpu_per_node (0: a CPU-only description)
    explorer: int  # explorer tasks: vLLM engines plus their auxiliary models (0 if no explorer)
    trainer: int  # trainer ranks: the rest in mode both, all in mode train (0 if no trainer)
    auxiliary: int = 0  # of ``explorer``: the auxiliary models' (explorer.auxiliary_models)


def gpu_split(
    mode: str,
    *,
    node_num: int,
    gpu_per_node: int,
    engine_num: int,
    tensor_parallel_size: int,
    auxiliary_gpus: int = 0,
) -> GpuSplit:
    """How ``mode`` divides the cluster's GPUs (``Config.gpu_split`` passes the config's).

    ``auxiliary_gpus``: the auxiliary models' GPUs, the sum of ``engine_num x
    tensor_parallel_size`` over ``explorer.auxiliary_models``; they run inside the explorer tasks
    and count as theirs.
    """
    total = node_num * gpu_per_node
    engines = mode in ENGINE_MODES
    auxiliary = auxiliary_gpus if engines else 0
    explorer = engine_num * tensor_parallel_size + auxiliary if engines else 0
    trainer = {"both": total - explorer, "train": total}.get(mode, 0)
    return GpuSplit(total, explorer, trainer, auxiliary)


class EngineSize(Protocol):
    """What the GPU count of a model's engines reads (an ``explorer.auxiliary_models`` entry)."""

    engine_num: int
    tensor_parallel_size: int


def auxiliary_gpus(models: Iterable[EngineSize]) -> int:
    """GPUs of the auxiliary models ``models`` (``explorer.auxiliary_models``): the sum of their
    ``engine_num x tensor_parallel_size``."""
    return sum(m.engine_num * m.tensor_parallel_size for m in models)


def task_gpus(tensor_parallel_size: int, auxiliary_tp: Sequence[int] = ()) -> int:
    """GPUs of one explorer task: its vLLM engine's, then each auxiliary model's (a judge's
    engine, a reward model's scorer; ``auxiliary_tp``: each one's ``tensor_parallel_size``, in
    config order)."""
    return tensor_parallel_size + sum(auxiliary_tp)


def scorer_gpu_index(tensor_parallel_size: int, auxiliary_tp: Sequence[int], index: int) -> int:
    """Index, among the explorer task's visible GPUs, of the first GPU of auxiliary model
    ``index`` (a reward model scores on it): its GPUs follow the engine's and the earlier
    auxiliary models'."""
    return tensor_parallel_size + sum(auxiliary_tp[:index])


def auxiliary_devices(visible: str | None, gpus: int, first: int, count: int) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for an auxiliary model's own engine: ``count`` GPUs from index
    ``first`` of the explorer task's (``visible``: its CUDA_VISIBLE_DEVICES, unset: all ``gpus``
    of the machine); None when the task sees fewer."""
    ids = [d.strip() for d in visible.split(",") if d.strip()] if visible else list(range(gpus))
    if first + count > len(ids):
        return None
    return ",".join(str(d) for d in ids[first : first + count])


def local_gpu_ids(
    mode: str,
    engine_num: int,
    tensor_parallel_size: int,
    gpus: int,
    auxiliary_tp: Sequence[int] = (),
    shared: Sequence[int] = (),
) -> tuple[list[list[int]], list[int]]:
    """GPU ids per explorer task (its engine's, then its auxiliary models', :func:`task_gpus`)
    and for the trainer on this machine (all empty without GPUs). ``shared``: the GPU count of
    each task of the shared auxiliary engines' group, whose GPUs follow the explorers'
    (:func:`shared_gpu_ids`); the trainer's follow theirs."""
    if gpus == 0:
        return [[] for _ in range(engine_num)], []
    per_task = task_gpus(tensor_parallel_size, auxiliary_tp)
    explorers = (
        [list(range(i * per_task, (i + 1) * per_task)) for i in range(engine_num)]
        if mode in EXPLORER_MODES
        else []
    )
    used = sum(len(ids) for ids in explorers) + (sum(shared) if explorers else 0)
    trainer = list(range(used, gpus)) if mode in TRAINER_MODES else []
    if used > gpus or (mode in TRAINER_MODES and not trainer):
        models = " (with their explorer.auxiliary_models)" if auxiliary_tp else ""
        raise ConfigError(
            f"this machine has {gpus} GPU(s): explorers need {used}{models} and the "
            "trainer at least 1; lower explorer.rollout_model.engine_num"
        )
    return explorers, trainer


def shared_gpu_ids(explorers: Sequence[Sequence[int]], shared: Sequence[int]) -> list[list[int]]:
    """GPU ids of each task of the shared auxiliary engines' group on this machine (``shared``:
    each task's count), after the explorer tasks' (``explorers``, :func:`local_gpu_ids`);
    empty lists without GPUs."""
    first = max((i + 1 for ids in explorers for i in ids), default=0)
    if not first:
        return [[] for _ in shared]
    out = []
    for count in shared:
        out.append(list(range(first, first + count)))
        first += count
    return out


LOCAL_TRAINER_RANKS_VAR = "RFT_LOCAL_TRAINER_RANKS"  # trainer ranks of a local run without GPUs


def local_trainer_ranks(trainer_gpus: int, env: Mapping[str, str], sequence_parallel: int = 1) -> int:  # fmt: skip
    """Trainer ranks of a run on this machine: one per trainer GPU; without GPUs
    ``RFT_LOCAL_TRAINER_RANKS`` DeepSpeed ranks on gloo, by default one, or the one sequence
    group ``trainer.ulysses_sequence_parallel_size`` (``sequence_parallel``) asks for. One rank
    with all the cores' threads and token-budgeted micro-batches steps as fast as two
    single-threaded ranks on 2 cores (no gradient all-reduce per micro-batch) and holds the
    model's states and a runtime once (docs/performance.md#memory)."""
    return trainer_gpus or int(env.get(LOCAL_TRAINER_RANKS_VAR, str(max(sequence_parallel, 1))))


def sequence_group_layout(rank: int, world_size: int, size: int) -> tuple[int, int, int]:
    """``(data-parallel rank, data-parallel size, place in its sequence group)`` of trainer
    ``rank`` of ``world_size`` with Ulysses groups of ``size`` consecutive ranks
    (rft.trainer.sequence_parallel)."""
    if size < 1 or world_size % size:
        raise ConfigError(
            f"trainer.ulysses_sequence_parallel_size={size} must divide the trainer's "
            f"{world_size} ranks (its GPUs; on a CPU machine RFT_LOCAL_TRAINER_RANKS): each "
            "sequence group holds whole data-parallel shares"
        )
    return rank // size, world_size // size, rank % size


def cpu_trainer_threads(ranks: int, cores: Optional[int] = None) -> int:
    """OpenMP threads of each CPU trainer rank: the machine's cores shared by the ranks (in a
    synchronous run the explorer waits while the trainer steps)."""
    if cores is None:
        cores = os.cpu_count() or 1
    return max(1, cores // max(ranks, 1))


# ----------------------------------------------------------------------------- ranks


@dataclass(frozen=True)
class TaskRank:
    """Which task of a group this process is, and which variables said so (for messages)."""

    rank: int
    count: int
    rank_var: str
    count_var: str


def explorer_rank(env: Mapping[str, str]) -> TaskRank:
    """RFT_EXPLORER_RANK/COUNT, else SLURM_PROCID/NTASKS, else task 0 of 1."""
    keys = (
        ("RFT_EXPLORER_RANK", "RFT_EXPLORER_COUNT")
        if "RFT_EXPLORER_RANK" in env
        else ("SLURM_PROCID", "SLURM_NTASKS")
    )
    rank, count = int(env.get(keys[0], 0)), int(env.get(keys[1], 1))
    if not 0 <= rank < count:
        raise ConfigError(f"{keys[0]}={rank} is outside 0..{count - 1} ({keys[1]}={count})")
    return TaskRank(rank, count, *keys)


def auxiliary_rank(env: Mapping[str, str]) -> TaskRank:
    """A task of the shared auxiliary engines' group (rft.explorer.auxiliary_server):
    RFT_AUXILIARY_RANK/COUNT, else SLURM_PROCID/NTASKS."""
    keys = (
        ("RFT_AUXILIARY_RANK", "RFT_AUXILIARY_COUNT")
        if "RFT_AUXILIARY_RANK" in env
        else ("SLURM_PROCID", "SLURM_NTASKS")
    )
    rank, count = int(env.get(keys[0], 0)), int(env.get(keys[1], 1))
    if not 0 <= rank < count:
        raise ConfigError(f"{keys[0]}={rank} is outside 0..{count - 1} ({keys[1]}={count})")
    return TaskRank(rank, count, *keys)


def process_rank(env: Mapping[str, str]) -> int:
    """This process's rank in its role: RANK (torchrun), else SLURM_PROCID, else 0."""
    return int(env.get("RANK", env.get("SLURM_PROCID", "0")))


def master_port(job_id: str | int) -> int:
    """The trainer's rendezvous port in SLURM job ``job_id`` (distinct for concurrent jobs)."""
    return 20000 + int(job_id or 0) % 20000


def first_host(nodelist: str) -> str:
    """The first hostname of a SLURM nodelist expression (``n[1-3],m1`` -> ``n1``)."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        if out.split():
            return out.split()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    match = re.match(r"([^,\[]+)(?:\[(\d+))?", nodelist)
    return "".join(g for g in match.groups() if g) if match else nodelist


def resolvable(host: str) -> str:
    """``host`` if it resolves, else its SLURM NodeAddr (local clusters name nodes n1, n2...)."""
    try:
        socket.gethostbyname(host)
        return host
    except OSError:
        pass
    out = subprocess.run(
        ["scontrol", "show", "node", host, "-o"], capture_output=True, text=True, timeout=30
    ).stdout
    for field in out.split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1]
    return host


def trainer_env(
    rank: int, world_size: int, env: Mapping[str, str], nodelist: str
) -> dict[str, str]:
    """torch.distributed variables of trainer ``rank`` in a SLURM job (rank 0 on the first node)."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "MASTER_ADDR": env.get("MASTER_ADDR") or resolvable(first_host(nodelist)),
        "MASTER_PORT": env.get("MASTER_PORT") or str(master_port(env.get("SLURM_JOB_ID", "0"))),
    }


def torch_env_from_slurm(env: Mapping[str, str]) -> dict[str, str]:
    """torch.distributed variables for a trainer rank launched by srun (empty if torchrun set
    them, or if this is not an srun task)."""
    if "RANK" in env or "SLURM_PROCID" not in env:
        return {}
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "localhost")
    world = env.get("SLURM_STEP_NUM_TASKS", env.get("SLURM_NTASKS", "1"))
    return trainer_env(int(env["SLURM_PROCID"]), int(world), env, nodelist)


def single_process_env() -> dict[str, str]:
    """A group of one on this host (a trainer started by hand, without torchrun or srun)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


@dataclass(frozen=True)
class HetTask:
    """A task of one ``srun --het-group=0,1`` step: its role and its rank inside its group."""

    role: str
    rank: int
    count: int
    group: int


def het_group_task(role_by_group: list[str], env: Mapping[str, str]) -> HetTask:
    """SLURM numbers the tasks of a heterogeneous step globally; ``SLURM_NTASKS_HET_GROUP_<g>``
    tells which group (hence role) a task belongs to and its rank inside the group."""
    procid, first = int(env["SLURM_PROCID"]), 0
    for group, role in enumerate(role_by_group):
        count = int(env.get(f"SLURM_NTASKS_HET_GROUP_{group}", env.get("SLURM_NTASKS", "1")))
        if procid < first + count:
            return HetTask(role, procid - first, count, group)
        first += count
    raise RuntimeError(
        f"SLURM_PROCID={procid} is outside the {first} tasks of groups {role_by_group}"
    )
