"""One worker process of a run: ``python -m rft.launch.worker {explorer,trainer} --config F [k=v ...]``.

The same entry runs under ``srun`` (SLURM job steps), ``torchrun`` and the local launcher. It
translates the launcher's environment into what the roles read, then hands over:

- trainer: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` from
  ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID`` and the step's first node (left alone
  when torchrun already set them);
- explorer: its task rank and count come from ``SLURM_PROCID``/``SLURM_NTASKS`` of its step (or
  ``RFT_EXPLORER_RANK``/``RFT_EXPLORER_COUNT`` locally), read by :mod:`rft.explorer.loop`.

Before either starts, the run directory is prepared and checked (:func:`rft.rundir.prepare`), on the
first rank only.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

from rft import placement
from rft.entry import run_command
from rft.errors import EXIT_REQUEUE, EXIT_USER_ERROR

ROLES = ("explorer", "trainer")
WORKER_MODULE = "rft.launch.worker"  # ``python -m`` target of every process of a run


def thread_env(env: dict[str, str]) -> dict[str, str]:
    """One OpenMP pool per task sized to its CPUs (SLURM), unless the user set it."""
    if "OMP_NUM_THREADS" in env:
        return {}
    return {"OMP_NUM_THREADS": env.get("SLURM_CPUS_PER_TASK", "1")}


def prepare_run_dir(role: str, args: list[str]) -> int:
    """Load the config and prepare/check the run directory; 2 with a message on a user error."""
    from rft.config.load import config_to_yaml, load_config
    from rft.rundir import prepare

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--config", required=True)
    known, overrides = parser.parse_known_args(args)

    def body() -> None:
        cfg = load_config(known.config, overrides)
        prepare(cfg.run_dir, config_to_yaml(cfg), role)

    return run_command(body)


def het_task(role_by_group: list[str], args: list[str]) -> int:
    """Entry of every task of one ``srun --het-group=0,1`` step (submitit's hetjob launch).

    SLURM numbers the tasks of such a step globally; ``SLURM_NTASKS_HET_GROUP_<g>`` tells which
    group, hence which role, a task belongs to and its rank inside the group. The role runs as
    a child process (the roles leave through ``os._exit``), with SIGUSR1/SIGTERM forwarded to
    it; when the trainer stopped for a signal after checkpointing (exit 143), rank 0 requeues.
    """
    env = dict(os.environ)
    task = placement.het_task_placement(role_by_group, env)
    role, rank = task.role, task.rank
    if role == "trainer":
        nodes = env.get(f"SLURM_JOB_NODELIST_HET_GROUP_{task.group}", env.get("SLURM_JOB_NODELIST", ""))
        env.pop("MASTER_ADDR", None)  # the trainer group's first node, not the job's
        env.update(placement.trainer_env(rank, task.count, env, nodes))
    else:
        env.update(RFT_EXPLORER_RANK=str(rank), RFT_EXPLORER_COUNT=str(task.count))
    child = subprocess.Popen([sys.executable, "-m", WORKER_MODULE, role, *args], env=env)
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
    code = child.wait()
    stopped = code in (EXIT_REQUEUE, 128 + signal.SIGUSR1, 128 + signal.SIGTERM)
    if code == EXIT_REQUEUE and role == "trainer" and rank == 0:
        subprocess.run(["scontrol", "requeue", env.get("SLURM_JOB_ID", "")], timeout=60)
    if code and not stopped:
        raise RuntimeError(f"{role} rank {rank} failed with exit code {code}")
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ROLES:
        print(f"usage: python -m {WORKER_MODULE} {{{','.join(ROLES)}}} --config FILE [key=value ...]",
              file=sys.stderr)
        return EXIT_USER_ERROR
    role, rest = argv[0], argv[1:]
    os.environ.update(thread_env(dict(os.environ)))
    if role == "trainer":
        os.environ.update(placement.torch_env_from_slurm(os.environ))
    if placement.process_rank(os.environ) == 0:
        code = prepare_run_dir(role, rest)
        if code:
            return code
    if role == "trainer":
        from rft.trainer.loop import main as role_main
    else:
        from rft.explorer.loop import main as role_main
    return role_main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
