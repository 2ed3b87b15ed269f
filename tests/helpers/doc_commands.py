"""Checks documented rft commands in one process (tests/test_docs.py runs it as a subprocess).

Reads a JSON list of commands from stdin, each ``{"argv": [...], "env": {...}}`` whose argv[0]
is a repository script (``bin/rft-run``) or ``-m rft.module`` / ``-m benchmarks.name``. Each
program runs until its argparse parser has parsed the arguments (then it is stopped: nothing
starts); a ``--config`` that names a repository file is loaded with the command's overrides, and
a ``--dry-run`` of the launchers is run for real when every path it names (and, for rft-run,
which checks them, the config's model folders) exists. Writes a JSON list of problems (empty:
all good) as the last line of stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import runpy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MARKER = "doc-commands-problems: "  # the result line (programs may print on stdout too)
DRY_RUNNERS = {"bin/rft-run", "bin/rft-launch", "bin/rft-add-explorer"}


class Parsed(Exception):
    """Raised once the program's parser accepted its arguments."""

    def __init__(self, namespace: argparse.Namespace) -> None:
        super().__init__("parsed")
        self.namespace = namespace


def _stop_after_parsing(parse_args):  # noqa: ANN001, ANN202
    def parse(self, args=None, namespace=None):  # noqa: ANN001, ANN202
        raise Parsed(parse_args(self, args, namespace))

    return parse


def run_program(argv: list[str], stop_at_parse: bool) -> tuple[int, argparse.Namespace | None, str]:
    """(exit code, parsed namespace or None, captured output) of one program run in-process."""
    original = argparse.ArgumentParser.parse_args
    if stop_at_parse:
        argparse.ArgumentParser.parse_args = _stop_after_parsing(original)
    out = io.StringIO()
    saved_argv = sys.argv
    code, namespace = 0, None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            if argv[0] == "-m":
                sys.argv = [argv[1], *argv[2:]]
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = list(argv)
                runpy.run_path(str(REPO / argv[0]), run_name="__main__")
    except Parsed as parsed:
        namespace = parsed.namespace
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except Exception as e:  # a program that crashes while parsing is a finding, not a test crash
        code, out = 1, io.StringIO(f"{type(e).__name__}: {e}")
    finally:
        argparse.ArgumentParser.parse_args = original
        sys.argv = saved_argv
    return code, namespace, out.getvalue()


def _paths_exist(argv: list[str]) -> bool:
    """Whether every absolute path the command names (in a flag or an override) exists."""
    values = [a.split("=", 1)[-1] for a in argv]
    return all(Path(v).exists() for v in values if v.startswith("/"))


def _models_exist(cfg) -> bool:  # noqa: ANN001 (rft.config.schema.Config, imported late)
    """Whether the config's model folders are on this machine: the dry run checks them, and
    a reward model the tests build (or a site's model) is not the docs' to provide."""
    folders = [cfg.model.model_path, cfg.model.critic_model_path]
    folders += [m.model_path for m in cfg.explorer.auxiliary_models]
    return all(Path(f).exists() for f in folders if f)


def check(command: dict) -> str | None:
    """The problem with one command, or None."""
    argv, shown = command["argv"], " ".join(command["argv"])
    os.environ.update(command.get("env", {}))
    code, namespace, output = run_program(argv, stop_at_parse=True)
    if namespace is None:
        return None if code == 0 else f"{shown}: exit {code}: {output.strip()[-400:]}"
    config, models_here = getattr(namespace, "config", None), True
    if config and (REPO / config).is_file():
        from rft.config.load import load_config
        from rft.errors import RftError

        try:
            cfg = load_config(REPO / config, list(getattr(namespace, "overrides", []) or []))
        except RftError as e:
            return f"{shown}: the config does not load: {e}"
        models_here = _models_exist(cfg)
    dry = getattr(namespace, "dry_run", False) and argv[0] in DRY_RUNNERS
    if dry and (models_here or argv[0] != "bin/rft-run") and _paths_exist(argv):
        code, _, output = run_program(argv, stop_at_parse=False)
        if code != 0:
            return f"{shown}: the dry run failed (exit {code}): {output.strip()[-600:]}"
    return None


def main() -> int:
    os.chdir(REPO)
    sys.path.insert(0, str(REPO))
    base_env = dict(os.environ)
    problems = []
    for command in json.load(sys.stdin):
        problem = check(command)
        os.environ.clear()
        os.environ.update(base_env)
        if problem:
            problems.append(problem)
    print(f"\n{MARKER}{json.dumps(problems)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
