"""Running rft as a user does, and reading back what a run wrote (for integration tests):
``bin/rft-run`` as a subprocess, a JSONL taskset, the buffer's sealed segments by writer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rft.buffer.experience import Experience

REPO = Path(__file__).resolve().parent.parent.parent


def rft_run(*args: str, timeout: int = 900, **popen) -> subprocess.CompletedProcess:
    """``bin/rft-run ARGS`` from the repository root, one trainer rank, output captured."""
    env = dict(os.environ, OMP_NUM_THREADS="1", RFT_LOCAL_TRAINER_RANKS="1")
    return subprocess.run(
        [sys.executable, str(REPO / "bin" / "rft-run"), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        **popen,
    )


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_segments(run_dir: Path) -> dict[str, dict[int, list[Experience]]]:
    """writer -> seq -> the records of each sealed segment of the run's buffer."""
    out: dict[str, dict[int, list[Experience]]] = {}
    for seg in sorted((run_dir / "buffer").glob("*/seg-*.jsonl")):
        lines = seg.read_text().splitlines()
        header = json.loads(lines[0])
        records = [Experience.from_dict(json.loads(line)) for line in lines[1:]]
        out.setdefault(header["writer"], {})[header["seq"]] = records
    return out
