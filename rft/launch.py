"""``rft-launch`` and ``rft-add-explorer``: submit a config to SLURM from the login node.

Both check the config and what it points at first (:mod:`rft.plan`), so mistakes fail before
anything is queued, then render the job (:mod:`rft.slurm`) and either print it (``--dry-run``)
or submit it: through submitit (the default; the heterogeneous job as one ``srun`` over both
groups) or as the rendered sbatch script (``--sbatch``). After submitting they print the job
id, the run directory, and how to watch TensorBoard through an SSH tunnel.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
import time
from pathlib import Path

import yaml

from rft import slurm
from rft.config import Config, load_config
from rft.errors import ConfigError, RftError
from rft.plan import preflight
from rft.rundir import prepare

SLURM_FLAGS = ("partition", "account", "qos", "time", "constraint")


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", required=True, help="YAML config (Trinity-RFT keys)")
    parser.add_argument("--dry-run", action="store_true", help="print the sbatch script only")
    parser.add_argument("--sbatch", action="store_true",
                        help="submit the rendered script with sbatch instead of through submitit")
    parser.add_argument("--wait", action="store_true",
                        help="wait for the job to end; on failure show the tail of its log")
    for flag in SLURM_FLAGS:
        parser.add_argument(f"--{flag}", help=f"overrides slurm.{flag}")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    return parser


def _load(args: argparse.Namespace, extra: list[str]) -> tuple[Config, list[str]]:
    overrides = list(args.overrides) + extra
    overrides += [f"slurm.{f}={getattr(args, f)}" for f in SLURM_FLAGS if getattr(args, f)]
    return load_config(args.config, overrides), overrides


def tunnel_hint(cfg: Config) -> str:
    host = socket.getfqdn()
    logdir = cfg.run_dir / "monitor" / "tensorboard"
    return (f"TensorBoard: on {host} run `tensorboard --logdir {logdir} --port 6006`, then on "
            f"your laptop `ssh -N -L 6006:localhost:6006 {host}` and open http://localhost:6006")


def submit(cfg: Config, config_path: Path, overrides: list[str], args: argparse.Namespace,
           mode: str) -> str:
    """Submit the job for ``mode``; returns the job id."""
    prepare(cfg, f"launch-{mode}")
    if args.sbatch:
        return slurm.sbatch(slurm.render(cfg, config_path, overrides, mode=mode))
    from rft.worker import het_task

    folder = cfg.run_dir / "log" / "submitit"
    executor = slurm.submitit_executor(cfg, mode, folder)
    roles = [g.role for g in slurm.groups(cfg, mode)]
    worker_args = ["--config", str(config_path), *overrides]
    try:
        job = executor.submit(het_task, roles, worker_args)
    except Exception as e:  # submitit wraps sbatch's refusal in its own error types
        raise slurm.SlurmError(slurm.explain_sbatch_error(str(e).strip())) from e
    return str(job.job_id)


def _run(prog: str, argv: list[str] | None, mode_of, extra_of, description: str) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = _parser(prog, description).parse_args(argv)
    try:
        cfg, overrides = _load(args, extra_of(args))
        mode = mode_of(cfg)
        config_path = Path(args.config).resolve()
        if args.dry_run:
            sys.stdout.write(slurm.render(cfg, config_path, overrides, mode=mode))
            return 0
        preflight(cfg)
        job_id = submit(cfg, config_path, overrides, args, mode)
    except RftError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"submitted job {job_id} ({mode})\nrun directory: {cfg.run_dir}\n"
          f"logs: {cfg.run_dir / 'log'}\nstatus: bin/rft-status {cfg.run_dir}\n{tunnel_hint(cfg)}",
          flush=True)
    return wait_for(job_id, cfg, args.sbatch) if args.wait else 0


def job_log(cfg: Config, job_id: str, sbatch: bool) -> Path:
    log_dir = cfg.run_dir / "log"
    return log_dir / f"slurm-{job_id}.out" if sbatch else log_dir / "submitit" / f"{job_id}_0_log.out"


def wait_for(job_id: str, cfg: Config, sbatch: bool, poll_s: float = 5.0) -> int:
    """Block until the job ends; 0 if it completed, else 1 with the tail of its log."""
    ended = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
             "PREEMPTED", "BOOT_FAIL", "DEADLINE")
    state = slurm.job_state(job_id)
    while state is not None and state.split()[0] not in ended:
        time.sleep(poll_s)
        state = slurm.job_state(job_id)
    if state == "COMPLETED":
        print(f"job {job_id} completed")
        return 0
    log = job_log(cfg, job_id, sbatch)
    print(f"error: job {job_id} ended {state or 'and is no longer known to SLURM'}; the last "
          f"lines of {log}:\n{slurm.tail_log(log)}", file=sys.stderr)
    return 1


def _launch_mode(cfg: Config) -> str:
    if cfg.mode == "bench":
        raise ConfigError("mode 'bench' runs on one node: use bin/rft-run")
    if cfg.stages:
        raise ConfigError("configs with stages run stage after stage with bin/rft-run for now; "
                          "submit each stage's config separately with rft-launch")
    return cfg.mode


def main(argv: list[str] | None = None) -> int:
    """``rft-launch --config F [--dry-run] [--sbatch] [--partition P ...] [key=value ...]``."""
    return _run("rft-launch", argv, _launch_mode, lambda a: [],
                "Submit a config to SLURM: mode both as one heterogeneous job (explorers + "
                "trainer), explore/train as single-role jobs.")


def _explorer_mode(cfg: Config) -> str:
    recorded = cfg.run_dir / "config.yaml"
    run_mode = yaml.safe_load(recorded.read_text()).get("mode") if recorded.is_file() else None
    if "both" in (cfg.mode, run_mode):
        raise ConfigError("an explorer joins asynchronous runs only: in mode 'both' the trainer "
                          "waits for a fixed set of explorers each step. Run the explorer and "
                          "trainer as separate jobs (mode explore / mode train, configs/async/)")
    if cfg.mode != "explore":
        raise ConfigError(f"rft-add-explorer needs a mode 'explore' config, not '{cfg.mode}' "
                          "(see configs/async/explorer_new.yaml)")
    return "explore"


def add_explorer_main(argv: list[str] | None = None) -> int:
    """``rft-add-explorer --config F --name NAME [--nodes N] [--dry-run] [key=value ...]``."""
    parser_extra = argparse.ArgumentParser(add_help=False)
    parser_extra.add_argument("--name", required=True)
    parser_extra.add_argument("--nodes", type=int)
    known, rest = parser_extra.parse_known_args(argv if argv is not None else sys.argv[1:])

    def extra(args: argparse.Namespace) -> list[str]:
        items = [f"explorer.name={known.name}"]
        if known.nodes:
            if known.nodes < 1:
                raise ConfigError(f"--nodes must be at least 1, got {known.nodes}")
            base = load_config(args.config, list(args.overrides))
            per_node = max(1, base.cluster.gpu_per_node // base.explorer.rollout_model.tensor_parallel_size)
            items += [f"cluster.node_num={known.nodes}",  # fill the nodes with engines
                      f"explorer.rollout_model.engine_num={known.nodes * per_node}"]
        return items

    return _run("rft-add-explorer", rest, _explorer_mode, extra,
                "Submit an explorer-only job that joins a running asynchronous run directory "
                "and starts from its newest weights.")
