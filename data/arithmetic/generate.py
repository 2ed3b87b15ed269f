"""Generate the quick start's taskset: two-number additions and subtractions in GSM8K form.

Each row is ``{"question": ..., "answer": "<working>\\n#### N"}``, half plain ("What is 12 + 7?")
and half short word problems ("Mia has 12 coins and gets 7 more. How many coins does Mia have
now?"); subtractions never go below zero. Train and test hold no question in common, and the
same seed writes the same bytes. Offline, standard library only.

    python data/arithmetic/generate.py                       # data/arithmetic/quickstart/
    python data/arithmetic/generate.py --seed 7 --max-operand 50 --out /tmp/harder

Writes ``<out>/<subset>/train.jsonl`` and ``<out>/<subset>/test.jsonl`` (the hub layout rft's
taskset ``path`` / ``subset_name`` / ``split`` keys read).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

SEED = 20261123
NAMES = ("Tom", "Sara", "Ali", "Mia", "Ben", "Lena", "Omar", "Yuki", "Nina", "Raj")
ITEMS = ("apples", "stickers", "marbles", "books", "coins", "pencils", "shells", "cards")
ADD_STORIES = (
    "{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?",
    "{name} had {a} {item}. A friend gave {name} {b} more. How many {item} does {name} have?",
)
SUB_STORIES = (
    "{name} has {a} {item} and gives away {b}. How many {item} does {name} have left?",
    "{name} had {a} {item} and lost {b} of them. How many {item} are left?",
)


def make_row(rng: random.Random, max_operand: int, word: bool) -> dict[str, str]:
    """One task: operands in 1..max_operand, the larger first for a subtraction."""
    a, b = rng.randint(1, max_operand), rng.randint(1, max_operand)
    add = rng.random() < 0.5
    if not add and b > a:
        a, b = b, a
    result = a + b if add else a - b
    sign = "+" if add else "-"
    if word:
        story = rng.choice(ADD_STORIES if add else SUB_STORIES)
        question = story.format(name=rng.choice(NAMES), item=rng.choice(ITEMS), a=a, b=b)
    else:
        question = f"What is {a} {sign} {b}?"
    return {"question": question, "answer": f"{a} {sign} {b} = {result}\n#### {result}"}


def generate(seed: int, train: int, test: int, max_operand: int) -> tuple[list[dict], list[dict]]:
    """(train rows, test rows): distinct questions, alternating plain and word problems."""
    if max_operand < 2:
        raise ValueError(f"max_operand must be at least 2, got {max_operand}")
    rng = random.Random(seed)
    rows: dict[str, dict[str, str]] = {}
    attempts = 0
    while len(rows) < train + test:
        attempts += 1
        if attempts > 50 * (train + test):
            raise ValueError(
                f"only {len(rows)} distinct questions with operands up to "
                f"{max_operand}; ask for fewer rows or a larger --max-operand"
            )
        row = make_row(rng, max_operand, word=len(rows) % 2 == 1)
        rows.setdefault(row["question"], row)
    ordered = list(rows.values())
    return ordered[:train], ordered[train:]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--subset", default="quickstart")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--train", type=int, default=800, help="train rows")
    parser.add_argument("--test", type=int, default=100, help="held-out test rows")
    parser.add_argument("--max-operand", type=int, default=20)
    args = parser.parse_args(argv)
    if args.train < 1 or args.test < 1:
        parser.error(f"--train and --test must be at least 1 (got {args.train}, {args.test})")
    try:
        train, test = generate(args.seed, args.train, args.test, args.max_operand)
    except ValueError as e:
        parser.error(str(e))
    for split, rows in (("train", train), ("test", test)):
        path = args.out / args.subset / f"{split}.jsonl"
        write_jsonl(path, rows)
        print(f"wrote {len(rows)} rows to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
