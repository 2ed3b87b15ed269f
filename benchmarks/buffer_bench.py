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
Usage::

    python benchmarks/buffer_bench.py --num 20000 --tokens 1024
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
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rft.buffer.experience import Experience  # noqa: E402
from rft.buffer.segments import SegmentReader, SegmentWriter  # noqa: E402
from rft.buffer.sqlite import SqlBufferReader, SqlBufferWriter  # noqa: E402

POOL = 32  # distinct token/logprob arrays, reused (content does not change the cost)


def make_batches(num: int, tokens: int, prompt_tokens: int, batch: int, group: int
                 ) -> list[list[Experience]]:
    """Lists of ``batch`` experiences (groups of ``group``), ``num`` in all (built untimed)."""
    rng = random.Random(0)
    prompts = [[rng.randrange(150_000) for _ in range(prompt_tokens)] for _ in range(POOL)]
    responses = [[rng.randrange(150_000) for _ in range(tokens)] for _ in range(POOL)]
    logprobs = [[-rng.random() * 5 for _ in range(tokens)] for _ in range(POOL)]
    return [[
            Experience(task_id=f"t{i // group}", group_id=f"g{i // group}",
                       prompt_ids=prompts[i % POOL], response_ids=responses[i % POOL],
                       logprobs=logprobs[i % POOL], reward=1.0, reward_parts={"accuracy": 1.0},
                       model_version=3)
            for i in range(start, min(start + batch, num))
    ] for start in range(0, num, batch)]


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


CPU_SECONDS: list[float] = []  # process CPU time of each timed() call, in order


def timed(fn: Callable[[], int]) -> tuple[float, int]:
    """Wall seconds and result of ``fn()``; its CPU seconds go to CPU_SECONDS."""
    start, start_cpu = time.perf_counter(), time.process_time()
    count = fn()
    CPU_SECONDS.append(time.process_time() - start_cpu)
    return time.perf_counter() - start, count


def bench_jsonl(root: Path, args: argparse.Namespace) -> tuple[float, float, int]:
    writer = SegmentWriter(root / "buffer", "explorer-0")

    def write() -> int:
        n = 0
        for batch in args.batches:
            writer.write(batch)
            n += len(batch)
        return n

    write_s, _ = timed(write)
    reader = SegmentReader(root / "buffer")
    read_s, got = timed(lambda: sum(1 for _ in iter_reads(reader.read, args.batch)))
    assert got == args.num, got
    return write_s, read_s, disk_bytes(root / "buffer")


def bench_rft_sql(root: Path, args: argparse.Namespace) -> tuple[float, float, int]:
    db = root / "rft.db"
    writer = SqlBufferWriter(db, "explorer-0")

    def write() -> int:
        for batch in args.batches:
            writer.write(batch)
        return args.num

    write_s, _ = timed(write)
    reader = SqlBufferReader(db)
    read_s, got = timed(lambda: sum(1 for _ in iter_reads(reader.read, args.batch)))
    assert got == args.num, got
    return write_s, read_s, db.stat().st_size


def bench_sqlite_pickle(root: Path, args: argparse.Namespace) -> tuple[float, float, int]:
    """The baseline: one pickled record per row, one transaction per batch, id cursor."""
    db = root / "baseline.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE experiences (id INTEGER PRIMARY KEY AUTOINCREMENT, data BLOB)")

    def write() -> int:
        for batch in args.batches:
            rows = [(pickle.dumps(e.to_dict(), protocol=pickle.HIGHEST_PROTOCOL),) for e in batch]
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany("INSERT INTO experiences (data) VALUES (?)", rows)
        return args.num

    def read() -> int:
        cursor, n = 0, 0
        while True:
            rows = conn.execute("SELECT id, data FROM experiences WHERE id > ? ORDER BY id "
                                "LIMIT ?", (cursor, args.batch)).fetchall()
            if not rows:
                return n
            n += len([Experience(**pickle.loads(data)) for _id, data in rows])
            cursor = rows[-1][0]

    write_s, _ = timed(write)
    read_s, got = timed(read)
    assert got == args.num, got
    return write_s, read_s, db.stat().st_size


def iter_reads(read: Callable[[int], list[Experience]], batch: int):
    while True:
        records = read(batch)
        if not records:
            return
        yield from records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num", type=int, default=20_000, help="experiences to write and read")
    parser.add_argument("--tokens", type=int, default=1024, help="response tokens each")
    parser.add_argument("--prompt-tokens", type=int, default=256, help="prompt tokens each")
    parser.add_argument("--batch", type=int, default=256, help="experiences per segment/read")
    parser.add_argument("--group", type=int, default=8, help="repeat_times (group size)")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()
    args.batches = make_batches(args.num, args.tokens, args.prompt_tokens, args.batch, args.group)
    root = Path(tempfile.mkdtemp(prefix="rft-buffer-bench-", dir=args.dir))
    results = {}
    try:
        for name, bench in (("jsonl", bench_jsonl), ("rft-sql", bench_rft_sql),
                            ("sqlite-pickle", bench_sqlite_pickle)):
            results[name] = bench(root, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{args.num} experiences, {args.tokens} response + {args.prompt_tokens} prompt tokens, "
          f"batches of {args.batch}, in {root.parent}")
    print(f"{'storage':<14} {'write exp/s':>12} {'write MB/s':>11} {'read exp/s':>11} "
          f"{'read MB/s':>10} {'MB on disk':>11} {'write exp/cpu-s':>16} {'read exp/cpu-s':>15}")
    cpu = iter(CPU_SECONDS)
    cpu_s = {}  # name -> (write, read) CPU seconds
    for name, (write_s, read_s, size) in results.items():
        mb, write_cpu, read_cpu = size / 1e6, next(cpu), next(cpu)
        cpu_s[name] = (write_cpu, read_cpu)
        print(f"{name:<14} {args.num / write_s:>12,.0f} {mb / write_s:>11.1f} "
              f"{args.num / read_s:>11,.0f} {mb / read_s:>10.1f} {mb:>11.1f} "
              f"{args.num / write_cpu:>16,.0f} {args.num / read_cpu:>15,.0f}")
    print(f"{'storage':<14} {'write wall s':>12} {'write cpu s':>11} {'read wall s':>11} "
          f"{'read cpu s':>10}")
    for name, (write_s, read_s, _size) in results.items():
        print(f"{name:<14} {write_s:>12.2f} {cpu_s[name][0]:>11.2f} {read_s:>11.2f} "
              f"{cpu_s[name][1]:>10.2f}")
    jw, jr, _ = results["jsonl"]
    bw, br, _ = results["sqlite-pickle"]
    (jwc, jrc), (bwc, brc) = cpu_s["jsonl"], cpu_s["sqlite-pickle"]
    print(f"jsonl / sqlite-pickle: write x{bw / jw:.2f}, read x{br / jr:.2f} (experiences/s); "
          f"write x{bwc / jwc:.2f}, read x{brc / jrc:.2f} (experiences per CPU-second)")


if __name__ == "__main__":
    main()
