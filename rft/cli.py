"""Command-line entry of ``bin/rft-run``: parse arguments, load the config, act.

``rft-run --config FILE [--dry-run] [key=value ...]``. With ``--dry-run`` it validates the
config and everything it points at, prints the resolved config and the plan, and exits;
without, it checks the same, then runs the config on this machine (:mod:`rft.local`). Errors
a user can cause print as one ``error: ...`` line (exit 2), without a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys

from rft.config import Config, config_to_yaml, load_config
from rft.errors import RftError
from rft.plan import describe, local_devices, preflight


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="rft-run",
        description="Run an rft config on this machine (explorer and trainer processes).",
        epilog="Overrides use dotted key paths, e.g. buffer.batch_size=4 "
               "buffer.explorer_input.taskset.split=test",
    )
    parser.add_argument("--config", required=True, help="YAML config (Trinity-RFT keys)")
    parser.add_argument("--dry-run", action="store_true",
                        help="validate the config, model folder and datasets; print the plan")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    return parser.parse_args(argv)


def dry_run(cfg: Config, config_path: str) -> str:
    """Resolved config and plan, as printed by ``--dry-run``."""
    infos = preflight(cfg)
    return (f"# resolved config ({config_path})\n{config_to_yaml(cfg)}\n"
            f"# plan\n{describe(cfg, infos, local_devices())}\n")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        if args.dry_run:
            sys.stdout.write(dry_run(cfg, args.config))
            print("dry run: config and inputs are valid; nothing was started")
            return 0
        from rft.local import run

        preflight(cfg)  # fail here, before any process starts
        return run(cfg)
    except RftError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
