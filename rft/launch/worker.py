"""One worker process of a run: ``python -m rft.launch.worker {explorer,trainer} --config F [k=v ...]``.

The same entry under ``srun``, ``torchrun`` and the local launcher: it turns the launcher's
environment into the rank variables the roles read (:mod:`rft.placement`), prepares the run
directory on the first rank (:func:`rft.rundir.prepare`), and hands over to the role's ``main``.
A staged config runs its stages in order inside the same task (:func:`run_stages`), so the SLURM
script of a staged config is the same as any other.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time

from rft import placement, stages
from rft.config.schema import Config
from rft.entry import add_take_over, run_command, setup_logging
from rft.errors import EXIT_FAILED, EXIT_OK, EXIT_REQUEUE, EXIT_USER_ERROR, RftError

log = logging.getLogger(__name__)

ROLES = (
    "explorer",
    "trainer",
    "auxiliary",
)  # auxiliary: shared judges (rft.explorer.auxiliary_server)
STOPPED = (EXIT_REQUEUE, 128 + signal.SIGUSR1, 128 + signal.SIGTERM)  # a signal, not a failure
WORKER_MODULE = "rft.launch.worker"  # ``python -m`` target of every process of a run


def thread_env(env: dict[str, str]) -> dict[str, str]:
    """One OpenMP pool per task sized to its CPUs (SLURM), unless the user set it."""
    if "OMP_NUM_THREADS" in env:
        return {}
    return {"OMP_NUM_THREADS": env.get("SLURM_CPUS_PER_TASK", "1")}


CACHE_VARS = {  # compile and extension caches: node-local under SLURM (see cache_env)
    "TORCH_EXTENSIONS_DIR": "torch_extensions",  # DeepSpeed's JIT ops (CPU Adam with optimizer offload)
    "TRITON_CACHE_DIR": "triton",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
}


def cache_env(env: dict[str, str]) -> dict[str, str]:
    """Under SLURM, the JIT/compile caches a user did not place go to node-local storage
    (``$TMPDIR``, else ``/tmp``): the defaults in ``$HOME`` sit on the shared filesystem, where
    nodes building the same op at once race on one lock and one folder."""
    if "SLURM_JOB_ID" not in env:
        return {}
    root = os.path.join(env.get("TMPDIR") or "/tmp", f"rft-cache-{os.getuid()}")
    return {var: os.path.join(root, sub) for var, sub in CACHE_VARS.items() if var not in env}


def _parse(args: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--config", required=True)
    parser.add_argument("--stage", type=int, default=None)
    add_take_over(parser)  # passed on to the role, which takes its lease over
    return parser.parse_known_args(args)


def prepare_run_dir(role: str, args: list[str]) -> int:
    """Load the config (its stage, with ``--stage``) and prepare/check the run directory; 2
    with a message on a user error."""
    from rft.config.load import config_to_yaml
    from rft.rundir import prepare

    known, overrides = _parse(args)

    def body() -> None:
        cfg = stages.load_stage(known.config, overrides, known.stage)
        prepare(cfg.run_dir, config_to_yaml(cfg), role)

    return run_command(body)


def _staged(config: str, overrides: list[str]) -> bool:
    """Whether the config has stages (an unreadable one is left for the role to report)."""
    from rft.config.load import read_raw

    try:
        return bool(read_raw(config, overrides).get("stages"))
    except RftError:
        return False


def role_rank(role: str, env: dict[str, str]) -> int:
    return placement.explorer_rank(env).rank if role == "explorer" else placement.process_rank(env)


class Forwarder:
    """SIGUSR1/SIGTERM go to the running child; with none running, they are remembered."""

    def __init__(self) -> None:
        self.child: subprocess.Popen | None = None
        self.signum: int | None = None
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        self.signum = signum
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def run(self, command: list[str], env: dict[str, str] | None = None) -> int:
        self.child = subprocess.Popen(command, env=env)
        try:
            return self.child.wait()
        finally:
            self.child = None


def run_stages(role: str, args: list[str]) -> int:
    """Run a staged config's stages in order for this task (see :mod:`rft.stages`).

    For each unfinished stage: a task whose role the stage runs starts it as a child
    (``--stage I``); then every task except rank 0 of the stage's main role waits for the
    stage's finished marker, which that rank writes when its child ended normally (a failure
    it records instead, and the waiting tasks leave with it). Exit codes pass through, so a
    trainer stopped for a signal (143) requeues the job, which resumes here.
    """
    from rft.config.load import load_config, stage_label

    known, overrides = _parse(args)
    cfg = load_config(known.config, overrides)
    rank = role_rank(role, dict(os.environ))
    forward = Forwarder()
    for index in range(len(cfg.stages)):
        label = stage_label(cfg, index)
        stage = stages.resolve(cfg, index, chain=False)
        if stages.is_finished(stage):
            log.info("%s already finished: skipped", label)
            continue
        started = time.time()
        code = EXIT_OK
        if role in stages.roles(stage.mode):
            log.info("%s: starting the %s (mode %s)", label, role, stage.mode)
            code = forward.run(
                [sys.executable, "-m", WORKER_MODULE, role, "--stage", str(index), *args]
            )
        leads = role == stages.main_role(stage.mode) and rank == 0
        if leads and code == EXIT_OK:
            stages.mark_finished(stage)
        elif leads and code not in STOPPED:
            stages.mark_failed(stage, code)
        elif code == EXIT_OK:
            code = _wait_for(stage, label, started, forward)
        if code:
            return code
    return EXIT_OK


def _wait_for(
    stage: Config, label: str, since: float, forward: Forwarder, poll_s: float = 2.0
) -> int:
    """Wait until the stage is finished (EXIT_OK), failed, or a signal came."""
    log.info("%s: waiting for its %s to finish", label, stages.main_role(stage.mode))
    while not stages.is_finished(stage):
        failed = stages.failed_since(stage, since)
        if failed is not None:
            log.error("%s failed (exit code %d): stopping", label, failed)
            return EXIT_FAILED
        if forward.signum is not None:
            return 128 + forward.signum
        time.sleep(poll_s)
    return EXIT_OK


def het_task(role_by_group: list[str], args: list[str]) -> int:
    """Entry of every task of one ``srun --het-group=0,1`` step (submitit's hetjob launch).

    The task's role (:func:`rft.placement.het_group_task`) runs as a child process, since the
    roles leave through ``os._exit``, with SIGUSR1/SIGTERM forwarded to it; when the trainer
    stopped for a signal after checkpointing (exit 143), rank 0 requeues the job.
    """
    env = dict(os.environ)
    task = placement.het_group_task(role_by_group, env)
    role, rank = task.role, task.rank
    if role == "trainer":
        nodes = env.get(
            f"SLURM_JOB_NODELIST_HET_GROUP_{task.group}", env.get("SLURM_JOB_NODELIST", "")
        )
        env.pop("MASTER_ADDR", None)  # the trainer group's first node, not the job's
        env.update(placement.trainer_env(rank, task.count, env, nodes))
    elif role == "auxiliary":
        env.update(RFT_AUXILIARY_RANK=str(rank), RFT_AUXILIARY_COUNT=str(task.count))
    else:
        env.update(RFT_EXPLORER_RANK=str(rank), RFT_EXPLORER_COUNT=str(task.count))
    code = Forwarder().run([sys.executable, "-m", WORKER_MODULE, role, *args], env=env)
    stopped = code in STOPPED
    if code == EXIT_REQUEUE and role == "trainer" and rank == 0:
        subprocess.run(["scontrol", "requeue", env.get("SLURM_JOB_ID", "")], timeout=60)
    if code and not stopped:
        raise RuntimeError(f"{role} rank {rank} failed with exit code {code}")
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ROLES:
        print(
            f"usage: python -m {WORKER_MODULE} {{{','.join(ROLES)}}} --config FILE "
            "[--take-over] [key=value ...]",
            file=sys.stderr,
        )
        return EXIT_USER_ERROR
    role, rest = argv[0], argv[1:]
    os.environ.update(thread_env(dict(os.environ)))
    os.environ.update(cache_env(dict(os.environ)))
    if role == "trainer":
        os.environ.update(placement.torch_env_from_slurm(os.environ))
    known, overrides = _parse(rest)
    if known.stage is None and _staged(known.config, overrides):
        setup_logging()
        return run_command(lambda: run_stages(role, rest))
    if placement.process_rank(os.environ) == 0:
        code = prepare_run_dir(role, rest)
        if code:
            return code
    if role == "trainer":
        from rft.trainer.loop import main as role_main
    elif role == "auxiliary":
        from rft.explorer.auxiliary_server import main as role_main
    else:
        from rft.explorer.loop import main as role_main
    return role_main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
