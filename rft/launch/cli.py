"""The entry points of ``bin/rft-run``, ``bin/rft-launch`` and ``bin/rft-add-explorer``.

``rft-run`` checks a config and everything it points at (:mod:`rft.launch.preflight`), then
prints the plan (``--dry-run``) or runs it here (:mod:`rft.launch.local`); ``rft-launch`` makes
the same checks and submits it to SLURM (:mod:`rft.launch.submit`; ``--dry-run`` prints the
sbatch script); ``rft-add-explorer`` submits an explorer-only job joining a running asynchronous
run. A user error prints one ``error: ...`` line and exits 2, without a traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

from rft.config.load import config_to_yaml, load_config
from rft.config.schema import Config
from rft.entry import config_parser, run_command, setup_logging
from rft.errors import EXIT_OK, ConfigError
from rft.launch import slurm, submit
from rft.launch.preflight import describe, preflight, warn_memory
from rft.placement import local_devices
from rft.rundir import LOG_DIR

SLURM_FLAGS = ("partition", "account", "qos", "time", "constraint")


def dry_run(cfg: Config, config_path: str) -> str:
    """Resolved config and plan, as printed by ``rft-run --dry-run``."""
    here = local_devices()
    infos = preflight(cfg, here)
    return (
        f"# resolved config ({config_path})\n{config_to_yaml(cfg)}\n"
        f"# plan\n{describe(cfg, infos, here)}\n"
    )


def run_main(argv: list[str] | None = None) -> int:
    """``rft-run``: run a config on this machine."""
    setup_logging(timestamps=False)
    parser = config_parser(
        "rft-run",
        "Run an rft config on this machine (explorer and trainer processes).",
        take_over=True,
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="validate the config, model folder and datasets; print the plan",
    )
    args = parser.parse_args(argv)

    def body() -> int:
        cfg = load_config(args.config, args.overrides)
        if args.dry_run:
            sys.stdout.write(dry_run(cfg, args.config))
            print("dry run: config and inputs are valid; nothing was started")
            return EXIT_OK
        from rft.launch.local import run

        here = local_devices()
        preflight(cfg, here)  # fail here, before any process starts
        if here.gpus == 0:
            warn_memory(cfg)
        return run(cfg)

    return run_command(body)


def _slurm_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = config_parser(prog, description, take_over=True)
    parser.add_argument("--dry-run", action="store_true", help="print the sbatch script only")
    parser.add_argument(
        "--sbatch",
        action="store_true",
        help="submit the rendered script with sbatch instead of through submitit",
    )
    parser.add_argument(
        "--wait",
        action="store_true",
        help="wait for the job to end; on failure show the tail of its log",
    )
    for flag in SLURM_FLAGS:
        parser.add_argument(f"--{flag}", help=f"overrides slurm.{flag}")
    return parser


def _submit(
    args: argparse.Namespace, overrides: list[str], mode_of: Callable[[Config], str]
) -> int:
    overrides = list(overrides) + [
        f"slurm.{f}={getattr(args, f)}" for f in SLURM_FLAGS if getattr(args, f)
    ]
    cfg = load_config(args.config, overrides)
    mode = mode_of(cfg)
    config_path = Path(args.config).resolve()
    if args.dry_run:  # the script only: it may be rendered away from the cluster's files
        sys.stdout.write(slurm.render(cfg, config_path, overrides, mode=mode))
        return EXIT_OK
    preflight(cfg)  # everything a role checks at start, before anything is queued
    job_id = submit.submit(cfg, config_path, overrides, mode, use_sbatch=args.sbatch)
    print(
        f"submitted job {job_id} ({mode})\nrun directory: {cfg.run_dir}\n"
        f"logs: {cfg.run_dir / LOG_DIR}\nstatus: bin/rft-status {cfg.run_dir}\n"
        f"{submit.tunnel_hint(cfg)}",
        flush=True,
    )
    return submit.wait_for(job_id, cfg, args.sbatch) if args.wait else EXIT_OK


def launch_main(argv: list[str] | None = None) -> int:
    """``rft-launch``: submit a config to SLURM."""
    setup_logging(timestamps=False)
    args = _slurm_parser(
        "rft-launch",
        "Submit a config to SLURM: mode both as one heterogeneous "
        "job (explorers + trainer), explore/train as single-role jobs.",
    ).parse_args(argv)
    return run_command(lambda: _submit(args, args.overrides, submit.launch_mode))


def add_explorer_main(argv: list[str] | None = None) -> int:
    """``rft-add-explorer``: an explorer-only job joining a running asynchronous run."""
    setup_logging(timestamps=False)
    parser = _slurm_parser(
        "rft-add-explorer",
        "Submit an explorer-only job that joins a running "
        "asynchronous run directory and starts from its newest weights.",
    )
    parser.add_argument("--name", required=True, help="explorer.name of the new explorer")
    parser.add_argument("--nodes", type=int, help="fill this many nodes with engines")
    args = parser.parse_args(argv)

    def body() -> int:
        extra = [f"explorer.name={args.name}"]
        if args.nodes is not None:
            if args.nodes < 1:
                raise ConfigError(f"--nodes must be at least 1, got {args.nodes}")
            base = load_config(args.config, list(args.overrides))
            per_node = slurm.explorer_tasks_per_node(base)
            extra += [
                f"cluster.node_num={args.nodes}",
                f"explorer.rollout_model.engine_num={args.nodes * per_node}",
            ]
        return _submit(args, [*args.overrides, *extra], submit.explorer_mode)

    return run_command(body)
