"""A verifiers environment's taskset as rft taskset files:
``python -m rft.workflow.envs.verifiers_data ENV_ID OUT_DIR [--env-args JSON] [--test N]``.

Loads the environment's ``vf.Taskset`` (``ENV_ID`` importable: add its folder with
``--plugin-dir``, as for a run) and writes each task's data, one JSON row a task, the fields
that differ from their defaults: ``OUT_DIR/train.jsonl`` and, with ``--test N``, the last ``N``
tasks in ``OUT_DIR/test.jsonl``. These are the rows the ``verifiers_env`` workflow reads back
into the task class. An infinite taskset needs ``--limit``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Optional

from rft.atomic import write_jsonl_splits
from rft.errors import WorkflowError
from rft.workflow.envs.verifiers_env import VerifiersArgs, load_taskset


def task_rows(env_id: str, env_args: dict, limit: Optional[int] = None) -> list[dict]:
    """The taskset's tasks' data as JSON rows (at most ``limit``)."""
    taskset = load_taskset(VerifiersArgs(env_id=env_id, env_args=env_args))
    if limit is None and not taskset.bounded:
        raise WorkflowError(f"the verifiers taskset {env_id!r} is infinite: pass --limit N")
    tasks = itertools.islice(taskset, limit)
    return [{"idx": t.data.idx, **t.data.model_dump(mode="json", exclude_defaults=True)} for t in tasks]  # fmt: skip


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("env_id", help="the verifiers taskset id (an importable module)")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--env-args", default="{}", help="the taskset config's fields, as JSON")
    parser.add_argument("--test", type=int, default=0, help="the last N tasks go to test.jsonl")
    parser.add_argument("--limit", type=int, default=None, help="at most N tasks")
    parser.add_argument("--plugin-dir", action="append", default=[], help="a folder to import from")
    args = parser.parse_args(argv)
    sys.path[:0] = [str(Path(d).resolve()) for d in args.plugin_dir]
    try:
        env_args = json.loads(args.env_args)
        if not isinstance(env_args, dict):
            raise ValueError("not a JSON object")
    except ValueError as e:
        parser.error(f"--env-args must be a JSON object ({e})")
    try:
        rows = task_rows(args.env_id, env_args, args.limit)
    except WorkflowError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not 0 <= args.test < len(rows):
        parser.error(f"--test {args.test} must leave training tasks (the taskset has {len(rows)})")
    splits = {"train": rows[: len(rows) - args.test]}
    if args.test:
        splits["test"] = rows[len(rows) - args.test :]
    write_jsonl_splits(args.out_dir, splits)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
