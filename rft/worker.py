"""One worker process of a run: ``python -m rft.worker {explorer,trainer} --config F [k=v ...]``.

The same entry runs under ``srun`` (SLURM job steps), ``torchrun`` and the local launcher. It
translates the launcher's environment into what the roles read, then hands over:

- trainer: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` from
  ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID`` and the step's first node (left alone
  when torchrun already set them);
- explorer: its task rank and count come from ``SLURM_PROCID``/``SLURM_NTASKS`` of its step (or
  ``RFT_EXPLORER_RANK``/``RFT_EXPLORER_COUNT`` locally), read by :mod:`rft.explorer`.

Before either starts, the run directory is prepared and checked (:mod:`rft.rundir`), on the
first rank only.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys

from rft.errors import EXIT_REQUEUE

ROLES = ("explorer", "trainer")


def first_host(nodelist: str) -> str:
    """The first hostname of a SLURM nodelist expression (``n[1-3],m1`` -> ``n1``)."""
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                             text=True, timeout=30, check=True).stdout
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
    out = subprocess.run(["scontrol", "show", "node", host, "-o"], capture_output=True, text=True,
                         timeout=30).stdout
    for field in out.split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1]
    return host


def torch_env_from_slurm(env: dict[str, str]) -> dict[str, str]:
    """torch.distributed variables for a trainer rank launched by srun (empty if not srun)."""
    if "RANK" in env or "SLURM_PROCID" not in env:
        return {}
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "localhost")
    job = int(env.get("SLURM_JOB_ID", "0"))
    return {
        "RANK": env["SLURM_PROCID"],
        "WORLD_SIZE": env.get("SLURM_STEP_NUM_TASKS", env.get("SLURM_NTASKS", "1")),
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "MASTER_ADDR": env.get("MASTER_ADDR") or resolvable(first_host(nodelist)),
        "MASTER_PORT": env.get("MASTER_PORT") or str(20000 + job % 20000),
    }


def thread_env(env: dict[str, str]) -> dict[str, str]:
    """One OpenMP pool per task sized to its CPUs (SLURM), unless the user set it."""
    if "OMP_NUM_THREADS" in env:
        return {}
    return {"OMP_NUM_THREADS": env.get("SLURM_CPUS_PER_TASK", "1")}


def prepare_run_dir(role: str, args: list[str]) -> int:
    """Load the config and prepare/check the run directory; 2 with a message on a user error."""
    from rft.config import load_config
    from rft.errors import RftError
    from rft.rundir import prepare

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--config", required=True)
    known, overrides = parser.parse_known_args(args)
    try:
        prepare(load_config(known.config, overrides), role)
    except RftError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def het_task(role_by_group: list[str], args: list[str]) -> int:
    """Entry of every task of one ``srun --het-group=0,1`` step (submitit's hetjob launch).

    SLURM numbers the tasks of such a step globally; ``SLURM_NTASKS_HET_GROUP_<g>`` tells which
    group, hence which role, a task belongs to and its rank inside the group. The role runs as
    a child process (the roles leave through ``os._exit``), with SIGUSR1/SIGTERM forwarded to
    it; when the trainer stopped for a signal after checkpointing (exit 143), rank 0 requeues.
    """
    env = dict(os.environ)
    role, rank, count, group = _het_placement(role_by_group, env)
    if role == "trainer":
        nodes = env.get(f"SLURM_JOB_NODELIST_HET_GROUP_{group}", env.get("SLURM_JOB_NODELIST", ""))
        env.update(RANK=str(rank), WORLD_SIZE=str(count), LOCAL_RANK=env.get("SLURM_LOCALID", "0"),
                   MASTER_ADDR=resolvable(first_host(nodes)),
                   MASTER_PORT=str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000))
    else:
        env.update(RFT_EXPLORER_RANK=str(rank), RFT_EXPLORER_COUNT=str(count))
    child = subprocess.Popen([sys.executable, "-m", "rft.worker", role, *args], env=env)
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
    code = child.wait()
    stopped = code in (EXIT_REQUEUE, 128 + signal.SIGUSR1, 128 + signal.SIGTERM)
    if code == EXIT_REQUEUE and role == "trainer" and rank == 0:
        subprocess.run(["scontrol", "requeue", env.get("SLURM_JOB_ID", "")], timeout=60)
    if code and not stopped:
        raise RuntimeError(f"{role} rank {rank} failed with exit code {code}")
    return code


def _het_placement(role_by_group: list[str], env: dict[str, str]) -> tuple[str, int, int, int]:
    """(role, rank in its group, group size, group index) of this task."""
    procid, first = int(env["SLURM_PROCID"]), 0
    for group, role in enumerate(role_by_group):
        count = int(env.get(f"SLURM_NTASKS_HET_GROUP_{group}", env.get("SLURM_NTASKS", "1")))
        if procid < first + count:
            return role, procid - first, count, group
        first += count
    raise RuntimeError(f"SLURM_PROCID={procid} is outside the {first} tasks of groups "
                       f"{role_by_group}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ROLES:
        print(f"usage: python -m rft.worker {{{','.join(ROLES)}}} --config FILE [key=value ...]",
              file=sys.stderr)
        return 2
    role, rest = argv[0], argv[1:]
    os.environ.update(thread_env(dict(os.environ)))
    if role == "trainer":
        os.environ.update(torch_env_from_slurm(dict(os.environ)))
    if os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0":
        code = prepare_run_dir(role, rest)
        if code:
            return code
    if role == "trainer":
        from rft.trainer import main as role_main
    else:
        from rft.explorer import main as role_main
    return role_main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
