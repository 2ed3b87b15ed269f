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


@dataclass
class MemoryPeak:
    """The peak of a process tree's summed memory, sampled by :func:`sample_memory`:
    ``summed_gb`` the proportional set size (PSS: a page shared by n processes counts 1/n in
    each, so the sum is what the tree holds), ``summed_rss_gb`` the resident sets summed (shared
    pages counted in every process), ``at_peak_gb`` each role's PSS at the summed peak and
    ``by_role_gb`` each role's own peak (a role: the rft entry point a process runs; processes
    of one role, such as two trainer ranks, are summed under it)."""

    summed_gb: float = 0.0
    summed_rss_gb: float = 0.0
    by_role_gb: dict = field(default_factory=dict)
    at_peak_gb: dict = field(default_factory=dict)


def _role(proc) -> str:
    """A process's role for the memory table: the rft module or script it runs."""
    try:
        cmd = proc.cmdline()
    except Exception:
        return "?"
    for i, part in enumerate(cmd):
        if part == "-m" and i + 1 < len(cmd):  # a module, and its first argument if a word
            word = cmd[i + 2] if i + 2 < len(cmd) and cmd[i + 2].isidentifier() else ""
            return f"{cmd[i + 1]} {word}".strip()
        if part.endswith(("rft-run", "rft-launch")) or "/rft/" in part:
            return Path(part).name
    return Path(cmd[0]).name if cmd else "?"


def _pss(pid: int) -> int:
    """A process's PSS in bytes (/proc/PID/smaps_rollup: the kernel walks its pages, so a read
    costs milliseconds for a process of gigabytes; sampled less often than RSS)."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    raise OSError(f"no Pss in /proc/{pid}/smaps_rollup")


@contextlib.contextmanager
def sample_memory(pid: int, interval_s: float = 0.5, pss_every: int = 10) -> Iterator[MemoryPeak]:
    """Sample the memory of process ``pid`` and all its descendants while the block runs: RSS
    every ``interval_s`` (cheap), PSS every ``pss_every`` samples (a page walk; at 2 samples a
    second of every process it took a quarter of a core and slowed the run it measured). The
    peaks are in the yielded :class:`MemoryPeak` when the block ends."""
    import threading

    import psutil

    peak = MemoryPeak()
    stop = threading.Event()

    def sample() -> None:
        tick = 0
        while not stop.is_set():
            try:
                root = psutil.Process(pid)
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            with_pss = tick % pss_every == 0
            now: dict[str, float] = {}
            rss = 0.0
            for proc in procs:
                try:
                    rss += proc.memory_info().rss / 2**30
                    if with_pss:
                        role = _role(proc)
                        now[role] = now.get(role, 0.0) + _pss(proc.pid) / 2**30
                except (psutil.Error, OSError):
                    continue
            peak.summed_rss_gb = max(peak.summed_rss_gb, rss)
            if with_pss and sum(now.values()) > peak.summed_gb:
                peak.summed_gb, peak.at_peak_gb = sum(now.values()), now
            for role, gb in now.items():
                peak.by_role_gb[role] = max(gb, peak.by_role_gb.get(role, 0.0))
            tick += 1
            stop.wait(interval_s)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        stop.set()
        thread.join()


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
