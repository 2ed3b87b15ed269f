"""Generate FrozenLake tasks for ``frozen_lake_workflow``: one row per map, ``{"seed": 17,
"size": 4, "p": 0.8}`` (the workflow builds the map from these). Offline, standard library only;
the same seed writes the same bytes, and train and test share no map seed.

    python data/frozen_lake/generate.py              # data/frozen_lake/{train,test}.jsonl
    python data/frozen_lake/generate.py --sizes 3 4 5 --out /tmp/lake
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SEED = 20261126
SPLITS = {"train": 400, "test": 50}


def tasks(rng: random.Random, seeds: list[int], sizes: list[int], p: float) -> list[dict]:
    return [{"seed": s, "size": rng.choice(sizes), "p": p} for s in seeds]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4], help="grid sides to draw")
    parser.add_argument("--p", type=float, default=0.8, help="share of frozen (safe) tiles")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    seeds = rng.sample(range(10**6), sum(SPLITS.values()))
    args.out.mkdir(parents=True, exist_ok=True)
    first = 0
    for split, count in SPLITS.items():
        rows = tasks(rng, seeds[first : first + count], args.sizes, args.p)
        first += count
        (args.out / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {args.out}/train.jsonl and test.jsonl ({SPLITS})")


if __name__ == "__main__":
    main()
