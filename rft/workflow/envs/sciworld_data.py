"""The ``sciworld_workflow`` taskset: ``python -m rft.workflow.envs.sciworld_data OUT_DIR``.

Writes ``OUT_DIR/train.jsonl`` and ``OUT_DIR/test.jsonl`` as Trinity's
examples/grpo_sciworld/get_sciworld_data.py does: one row per (task, variation), its
``task_desc`` the JSON ``{"task_name", "var_num"}`` (plus ``jar_path`` with ``--jar-path``),
the first ``--share`` (0.5) of each task's variations, train on Trinity's 17 training tasks and
test on the other tasks, each file shuffled with seed 42. Task names and variation counts come
from the installed scienceworld package (one JVM, a few seconds).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Optional

from rft.atomic import write_jsonl_splits

# Trinity's training tasks; the package's other tasks are the test split.
TRAIN_TASKS = (
    *("boil", "melt", "change-the-state-of-matter-of", "use-thermometer"),
    *("measure-melting-point-known-substance", "power-component", "test-conductivity"),
    *("find-living-thing", "find-plant", "grow-plant", "chemistry-mix"),
    *("chemistry-mix-paint-secondary-color", "lifespan-shortest-lived", "identify-life-stages-2"),
    *("inclined-plane-determine-angle", "inclined-plane-friction-named-surfaces"),
    "mendelian-genetics-known-plant",
)


def variation_counts() -> dict[str, int]:
    """Each ScienceWorld task's number of variations, from the installed package."""
    from scienceworld import ScienceWorldEnv

    from rft.workflow.envs.sciworld import close_env

    env = ScienceWorldEnv("")
    try:
        return {name: int(env.get_max_variations(name)) for name in env.get_task_names()}
    finally:
        close_env(env)


def make_rows(
    counts: dict[str, int],
    share: float = 0.5,
    jar_path: str = "",
    max_per_task: Optional[int] = None,
) -> dict[str, list[dict]]:
    """{"train": rows, "test": rows}: the first ``share`` of each task's variations (at most
    ``max_per_task``), shuffled (seed 42)."""
    missing = sorted(set(TRAIN_TASKS) - set(counts))
    if missing:
        raise ValueError(f"the installed scienceworld lacks Trinity's training tasks {missing}")
    rng = random.Random(42)
    splits: dict[str, list[dict]] = {}
    for split, names in (
        ("train", list(TRAIN_TASKS)),
        ("test", sorted(set(counts) - set(TRAIN_TASKS))),
    ):
        rows = []
        for name in names:
            n = int(counts[name] * share)
            for var in range(n if max_per_task is None else min(n, max_per_task)):
                spec = {"task_name": name, "var_num": var, **({"jar_path": jar_path} if jar_path else {})}  # fmt: skip
                rows.append({"task_desc": json.dumps(spec)})
        rng.shuffle(rows)
        splits[split] = rows
    return splits


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--share", type=float, default=0.5, help="share of each task's variations")
    parser.add_argument(
        "--max-per-task", type=int, default=None, help="variations per task, at most"
    )
    parser.add_argument("--jar-path", default="", help="a simulator jar to name in each row")
    args = parser.parse_args(argv)
    splits = make_rows(variation_counts(), args.share, args.jar_path, args.max_per_task)
    write_jsonl_splits(args.out_dir, splits)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
