"""Buffer throughput: sealed JSONL segments vs one SQLite row per experience.

Writes N experiences of ``--tokens`` response tokens (ids + logprobs) in batches of
``--batch`` (one segment / one transaction each) and reads them back in batches, through

* ``jsonl``: rft's sealed segments (:class:`rft.buffer.SegmentWriter` / ``SegmentReader``);
* ``rft-sql``: rft's single-node SQLite transport (same record encoding, one row each);
* ``sqlite-pickle``: the baseline, a table with one pickled record per row, the way
  Trinity-RFT's SQL storage keeps experiences;

and prints experiences/s and MB/s (bytes on disk) for each, per wall second and per CPU second
of this process (``time.process_time``: what a loaded machine's other jobs do not change), the
wall and CPU seconds, and jsonl's ratio to the baseline both ways. One process, so one core.
Each storage runs ``--trials`` times, interleaved (jsonl, rft-sql, baseline, jsonl, ...), each
trial in a fresh folder; the tables show the best trial of each phase (the first trials also
grow the process's memory arenas, which would charge whichever storage runs first).

"read" returns the records; "read+rows" also tabulates each read batch with the trainer's
:func:`rft.trainer.batching.rows_from_experiences` (token and logprob tensors): what a trainer
pays per experience before its forward pass. rft's records keep their arrays packed (a list is
built only when one is asked for), so the two columns tell whether a saving at the read is
real or just moved to the consumer. Usage::

    python -m benchmarks.buffer_bench --num 20000 --tokens 1280 --trials 3
"""

from __future__ import annotations

import argparse
import pickle
import random
import shutil
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from benchmarks.common import print_table, run_recorded
from rft.buffer.experience import Experience
from rft.buffer.segments import SegmentReader, SegmentWriter
from rft.buffer.sqlite import SqlBufferReader, SqlBufferWriter
from rft.trainer.batching import rows_from_experiences

POOL = 32  # distinct token/logprob arrays, reused (content does not change the cost)


def make_batches(
    num: int, tokens: int, prompt_tokens: int, batch: int, group: int
) -> list[list[Experience]]:
    """Lists of ``batch`` experiences (groups of ``group``), ``num`` in all (built untimed)."""
    rng = random.Random(0)
    prompts = [[rng.randrange(150_000) for _ in range(prompt_tokens)] for _ in range(POOL)]
    responses = [[rng.randrange(150_000) for _ in range(tokens)] for _ in range(POOL)]
    logprobs = [[-rng.random() * 5 for _ in range(tokens)] for _ in range(POOL)]
    return [
        [
            Experience(
                task_id=f"t{i // group}",
                group_id=f"g{i // group}",
                prompt_ids=prompts[i % POOL],
                response_ids=responses[i % POOL],
                logprobs=logprobs[i % POOL],
                reward=1.0,
                reward_parts={"accuracy": 1.0},
                model_version=3,
            )
            for i in range(start, min(start + batch, num))
        ]
        for start in range(0, num, batch)
    ]


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


PHASES = ("write", "read", "read+rows")


@dataclass
class Trial:
    wall_s: dict[str, float] = field(default_factory=dict)  # phase -> wall seconds
    cpu_s: dict[str, float] = field(default_factory=dict)  # phase -> CPU seconds of this process
    disk_bytes: int = 0


def timed(trial: Trial, phase: str, fn: Callable[[], int], expect: int) -> None:
    """Run ``fn`` (returns the experiences it handled) and record its wall and CPU seconds."""
    start, start_cpu = time.perf_counter(), time.process_time()
    count = fn()
    trial.cpu_s[phase] = time.process_time() - start_cpu
    trial.wall_s[phase] = time.perf_counter() - start
    assert count == expect, (phase, count, expect)


def time_reads(
    trial: Trial,
    new_reader: Callable[[], Callable[[int], list[Experience]]],
    args: argparse.Namespace,
) -> None:
    """Read everything back with a fresh reader (read), then again with another, tabulating
    each batch as the trainer does (read+rows)."""

    def read(tabulate: bool) -> int:
        read_batch, n = new_reader(), 0
        while records := read_batch(args.batch):
            if tabulate:
                rows_from_experiences(records)
            n += len(records)
        return n

    timed(trial, "read", lambda: read(False), args.num)
    timed(trial, "read+rows", lambda: read(True), args.num)


def write_all(write: Callable[[list[Experience]], object], args: argparse.Namespace) -> int:
    for batch in args.batches:
        write(batch)
    return args.num


def bench_jsonl(root: Path, args: argparse.Namespace) -> Trial:
    trial, writer = Trial(), SegmentWriter(root / "buffer", "explorer-0")
    timed(trial, "write", lambda: write_all(writer.write, args), args.num)
    time_reads(trial, lambda: SegmentReader(root / "buffer").read, args)
    trial.disk_bytes = disk_bytes(root / "buffer")
    return trial


def bench_rft_sql(root: Path, args: argparse.Namespace) -> Trial:
    db = root / "rft.db"
    trial, writer = Trial(), SqlBufferWriter(db, "explorer-0")
    timed(trial, "write", lambda: write_all(writer.write, args), args.num)
    time_reads(trial, lambda: SqlBufferReader(db).read, args)
    trial.disk_bytes = db.stat().st_size
    return trial


def bench_sqlite_pickle(root: Path, args: argparse.Namespace) -> Trial:
    """The baseline: one pickled record per row, one transaction per batch, id cursor."""
    db = root / "baseline.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE experiences (id INTEGER PRIMARY KEY AUTOINCREMENT, data BLOB)")

    def write(batch: list[Experience]) -> None:
        rows = [(pickle.dumps(e.to_dict(), protocol=pickle.HIGHEST_PROTOCOL),) for e in batch]
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany("INSERT INTO experiences (data) VALUES (?)", rows)

    def reader() -> Callable[[int], list[Experience]]:
        cursor = 0

        def read(batch: int) -> list[Experience]:
            nonlocal cursor
            rows = conn.execute(
                "SELECT id, data FROM experiences WHERE id > ? ORDER BY id LIMIT ?", (cursor, batch)
            ).fetchall()
            if rows:
                cursor = rows[-1][0]
            return [Experience(**pickle.loads(data)) for _id, data in rows]

        return read

    trial = Trial()
    timed(trial, "write", lambda: write_all(write, args), args.num)
    time_reads(trial, reader, args)
    conn.close()
    trial.disk_bytes = db.stat().st_size
    return trial


BENCHES = {"jsonl": bench_jsonl, "rft-sql": bench_rft_sql, "sqlite-pickle": bench_sqlite_pickle}


def best(trials: list[Trial]) -> Trial:
    """Per phase, the trial with the least CPU time (its wall time alongside)."""
    out = Trial(disk_bytes=trials[0].disk_bytes)
    for phase in PHASES:
        top = min(trials, key=lambda t: t.cpu_s[phase])
        out.cpu_s[phase], out.wall_s[phase] = top.cpu_s[phase], top.wall_s[phase]
    return out


def print_tables(results: dict[str, Trial], args: argparse.Namespace) -> None:
    n = args.num
    print(
        f"{n} experiences, {args.tokens} response + {args.prompt_tokens} prompt tokens, "
        f"batches of {args.batch}, best of {args.trials} trials"
    )
    rates = []
    for name, t in results.items():
        mb = t.disk_bytes / 1e6
        per_cpu = [f"{n / t.cpu_s[p]:,.0f}" for p in PHASES]
        rates.append(
            [
                name,
                f"{n / t.wall_s['write']:,.0f}",
                f"{n / t.wall_s['read']:,.0f}",
                f"{mb / t.wall_s['read']:.1f}",
                f"{mb:.1f}",
                *per_cpu,
            ]
        )
    header = ["storage", "write exp/s", "read exp/s", "read MB/s", "MB on disk"]
    print_table([*header, "write exp/cpu-s", "read exp/cpu-s", "read+rows exp/cpu-s"], rates)
    seconds = [
        [
            name,
            f"{t.wall_s['write']:.2f}",
            f"{t.cpu_s['write']:.2f}",
            f"{t.wall_s['read']:.2f}",
            f"{t.cpu_s['read']:.2f}",
            f"{t.cpu_s['read+rows']:.2f}",
        ]
        for name, t in results.items()
    ]
    print()
    header = ["storage", "write wall s", "write cpu s", "read wall s", "read cpu s"]
    print_table([*header, "read+rows cpu s"], seconds)
    mine, base = results["jsonl"], results["sqlite-pickle"]
    ratios = [base.cpu_s[p] / mine.cpu_s[p] for p in PHASES]
    print(
        "jsonl / sqlite-pickle, experiences per CPU-second: write x{:.2f}, read x{:.2f}, "
        "read+rows x{:.2f}".format(*ratios)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num", type=int, default=20_000, help="experiences to write and read")
    parser.add_argument("--tokens", type=int, default=1280, help="response tokens each")
    parser.add_argument("--prompt-tokens", type=int, default=256, help="prompt tokens each")
    parser.add_argument("--batch", type=int, default=256, help="experiences per segment/read")
    parser.add_argument("--group", type=int, default=8, help="repeat_times (group size)")
    parser.add_argument(
        "--trials", type=int, default=3, help="rounds over the storages (best kept)"
    )
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to write (default: a temp dir)"
    )
    args = parser.parse_args()
    args.batches = make_batches(args.num, args.tokens, args.prompt_tokens, args.batch, args.group)
    root = Path(tempfile.mkdtemp(prefix="rft-buffer-bench-", dir=args.dir))
    trials: dict[str, list[Trial]] = {name: [] for name in BENCHES}
    try:
        for trial in range(args.trials):
            for name, bench in BENCHES.items():
                print(f"trial {trial + 1}/{args.trials}: {name}", file=sys.stderr, flush=True)
                folder = root / f"{name}-{trial}"
                folder.mkdir()
                trials[name].append(bench(folder, args))
                shutil.rmtree(folder)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_tables({name: best(ts) for name, ts in trials.items()}, args)


if __name__ == "__main__":
    sys.exit(run_recorded("buffer_bench", main))
