"""Processes for the buffer stress tests (run as scripts; the tests kill them with SIGKILL).

    python tests/buffer_worker.py writer BUFFER_DIR NAME NUM_SEGMENTS
    python tests/buffer_worker.py reader BUFFER_DIR CKPT_JSON EXPECTED_TOTAL
    python tests/buffer_worker.py sqlwriter DB_PATH NAME NUM_BATCHES

A segment's content is a pure function of (writer, seq), so a writer killed and restarted
rewrites exactly what it would have written; the test computes the expected ids the same way.
The reader checkpoints (cursor + consumed ids) in one atomic file, like the trainer does.
"""

from __future__ import annotations

import json
import logging
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rft import atomic  # noqa: E402
from rft.buffer.experience import Experience  # noqa: E402
from rft.buffer.segments import SegmentReader, SegmentWriter  # noqa: E402
from rft.buffer.sqlite import SqlBufferWriter  # noqa: E402

GROUP_SIZE = 4
RESPONSE_TOKENS = 512


def batch(writer: str, seq: int) -> list[Experience]:
    """The deterministic batch of ``writer``'s segment ``seq``: 1-4 groups of GROUP_SIZE."""
    rng = random.Random(f"{writer}/{seq}")
    out = []
    for g in range(rng.randint(1, 4)):
        for k in range(GROUP_SIZE):
            n = rng.randint(1, RESPONSE_TOKENS)
            out.append(
                Experience(
                    experience_id=f"{writer}/{seq}/{g}/{k}",
                    task_id=f"{writer}/{seq}/{g}",
                    group_id=f"{writer}/{seq}/{g}",
                    writer=writer,
                    model_version=seq,
                    prompt_ids=[1, 2, 3],
                    response_ids=[rng.randrange(50000) for _ in range(n)],
                    logprobs=[-rng.random() for _ in range(n)],
                    reward=float(k),
                )
            )
    return out


def expected_ids(writers: list[str], num_segments: int) -> list[str]:
    return [e.experience_id for w in writers for s in range(num_segments) for e in batch(w, s)]


def run_writer(buffer_dir: str, name: str, num_segments: int) -> None:
    writer = SegmentWriter(buffer_dir, name)
    rng = random.Random()
    while writer.next_seq < num_segments:
        records = batch(name, writer.next_seq)
        time.sleep(rng.uniform(0.0, 0.08))
        writer.write(records)


def run_reader(buffer_dir: str, ckpt_path: str, expected_total: int) -> None:
    ckpt = Path(ckpt_path)
    state = json.loads(ckpt.read_text()) if ckpt.exists() else {"cursor": None, "ids": []}
    reader = SegmentReader(buffer_dir, cursor=state["cursor"])
    ids: list[str] = state["ids"]
    rng = random.Random()
    while len(ids) < expected_total:
        got = reader.read(rng.choice([4, 6, 8, 13, 16]), timeout_s=0.2, poll_s=0.02)
        counts: dict[str, int] = {}
        for exp in got:
            counts[exp.group_id] = counts.get(exp.group_id, 0) + 1
        cut = {g: c for g, c in counts.items() if c != GROUP_SIZE}
        if cut:
            sys.exit(f"partial groups returned: {cut}")
        ids.extend(exp.experience_id for exp in got)
        if got:
            cursor = reader.cursor()  # the trainer's checkpoint: cursor and state together
            atomic.write_json(ckpt, {"cursor": cursor, "ids": ids})
            reader.release(cursor)


def run_sql_writer(db_path: str, name: str, num_batches: int) -> None:
    writer = SqlBufferWriter(db_path, name)
    for seq in range(num_batches):
        writer.write(batch(name, seq))
    writer.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {sys.argv[1]} %(message)s")
    role, args = sys.argv[1], sys.argv[2:]
    if role == "writer":
        run_writer(args[0], args[1], int(args[2]))
    elif role == "reader":
        run_reader(args[0], args[1], int(args[2]))
    elif role == "sqlwriter":
        run_sql_writer(args[0], args[1], int(args[2]))
    else:
        sys.exit(f"unknown role {role!r}")
