"""Generate the agentic tasksets: arithmetic to solve with a calculator tool, and hidden numbers
to guess with higher/lower feedback. Offline, standard library only; the same seed writes the
same bytes, and train and test share no task.

    python data/agent/generate.py                 # data/agent/{calculator,guess_number}/
    python data/agent/generate.py --seed 7 --out /tmp/agent

Rows: calculator ``{"question": "What is 37 * 48?", "answer": "1776"}``; guess_number
``{"target": 5, "low": 1, "high": 8}`` (the workflow reads these columns).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SEED = 20261126
SPLITS = {"train": 400, "test": 50}


def calculator_tasks(rng: random.Random) -> list[dict]:
    pairs = sorted({(a, b) for a in range(12, 100) for b in range(12, 100) if a <= b})
    rng.shuffle(pairs)
    return [{"question": f"What is {a} * {b}?", "answer": str(a * b)} for a, b in pairs]


def guess_tasks(rng: random.Random, low: int, high: int, count: int) -> list[dict]:
    return [{"target": rng.randint(low, high), "low": low, "high": high} for _ in range(count)]


def write(folder: Path, split: str, rows: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--high", type=int, default=8, help="guess_number: numbers 1..high")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    calc = calculator_tasks(rng)
    first = 0
    for split, count in SPLITS.items():
        write(args.out / "calculator", split, calc[first : first + count])
        first += count
        write(args.out / "guess_number", split, guess_tasks(rng, 1, args.high, count))
    print(f"wrote {args.out}/calculator and {args.out}/guess_number ({SPLITS})")


if __name__ == "__main__":
    main()
