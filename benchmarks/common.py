"""What every benchmark shares: the repository's paths, a timer, one markdown table printer, and
the result record (machine, commit, date, command and what the benchmark printed) written to a
dated file ``benchmarks/results/YYYY-MM-DD-<benchmark>.md``.

Run a benchmark from the repository root as a module, ``python -m benchmarks.<name> ARGS``:
``rft`` is installed (editable) in the venv and ``benchmarks`` is found from the working
directory, so no script edits ``sys.path``. ``RFT_BENCH_RESULTS_DIR`` sends the record elsewhere
(tests set it to a temporary folder); ``RFT_BENCH_RECORD=0`` writes none.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "benchmarks"
RESULTS = BENCHMARKS / "results"
RESULTS_DIR_ENV = "RFT_BENCH_RESULTS_DIR"
RECORD_ENV = "RFT_BENCH_RECORD"  # "0": no record (also set for the benchmark's own children)


@dataclass
class Timer:
    """Wall seconds of a ``with timer() as t:`` block, in ``t.s`` once it ends."""

    start: float = field(default_factory=time.perf_counter)
    s: float = 0.0


@contextlib.contextmanager
def timer() -> Iterator[Timer]:
    t = Timer()
    try:
        yield t
    finally:
        t.s = time.perf_counter() - t.start


def markdown_table(
    header: Sequence[str], rows: Sequence[Sequence[object]], align: str | None = None
) -> str:
    """A markdown table: ``header``, a rule, one line per row (cells as ``str`` gives them).
    ``align``: ``l`` or ``r`` per column; by default the first left, the numbers right."""

    def line(cells: Sequence[object]) -> str:
        return "| " + " | ".join(str(c) for c in cells) + " |"

    align = align or "l" + "r" * (len(header) - 1)
    rule = "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"
    return "\n".join([line(header), rule, *(line(row) for row in rows)])


def print_table(
    header: Sequence[str], rows: Sequence[Sequence[object]], align: str | None = None
) -> None:
    print(markdown_table(header, rows, align), flush=True)


def module_cmd(name: str) -> list[str]:
    """The command that runs ``benchmarks/<name>.py`` in a child process (with ``cwd=REPO``)."""
    return [sys.executable, "-m", f"benchmarks.{name}"]


def commit() -> str:
    """The short commit of the working tree, ``+dirty`` when it has uncommitted changes."""
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return (rev or "unknown") + ("+dirty" if dirty else "")


def machine() -> str:
    """Host, CPU cores and, when torch sees one, the GPU."""
    gpu = ""
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            gpu = f", {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return f"{platform.node()} ({os.cpu_count()} CPU cores, {platform.machine()}{gpu})"


def record_path(name: str, day: datetime.date | None = None) -> Path:
    """``<results>/YYYY-MM-DD-<name>.md`` (``$RFT_BENCH_RESULTS_DIR`` or benchmarks/results)."""
    folder = Path(os.environ.get(RESULTS_DIR_ENV) or RESULTS)
    return folder / f"{(day or datetime.date.today()).isoformat()}-{name}.md"


def write_record(name: str, output: str, argv: Sequence[str] | None = None) -> Path:
    """Append one run (machine, commit, date, command, printed output) to today's record."""
    now = datetime.datetime.now(datetime.timezone.utc)
    path = record_path(name, now.date())
    path.parent.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["python", "-m", f"benchmarks.{name}", *(argv or sys.argv[1:])])
    entry = (
        f"## {now:%Y-%m-%d %H:%M} UTC\n\n"
        f"- machine: {machine()}\n- commit: {commit()}\n- command: `{command}`\n\n"
        f"```\n{output.rstrip()}\n```\n"
    )
    head = "" if path.exists() else f"# {name}: measured {now.date().isoformat()}\n\n"
    with path.open("a") as f:
        f.write(head + entry + "\n")
    return path


class _Tee(io.TextIOBase):
    """Writes to the real stream and keeps a copy."""

    def __init__(self, stream) -> None:  # noqa: ANN001 (a text stream)
        self.stream, self.copy = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


def run_recorded(name: str, main: Callable[[], int | None]) -> int:
    """``main()``, its stdout recorded by :func:`write_record` when it succeeds. Children the
    benchmark starts inherit ``RFT_BENCH_RECORD=0``: only the top run writes a record."""
    if os.environ.get(RECORD_ENV) == "0":
        return main() or 0
    os.environ[RECORD_ENV] = "0"
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        code = main() or 0
    if code == 0:
        print(f"recorded in {write_record(name, tee.copy.getvalue())}", file=sys.stderr)
    return code
