"""A run's learning report: held-out accuracy and train reward per step, as a summary and a PNG.

Input: the explorer's ``monitor/<role>/metrics.jsonl`` (step rows with ``reward/mean``, eval rows
with ``eval/<taskset>/mean@k`` and ``eval/weights_version``). Output: :class:`Report` (pure),
:func:`format_summary` and ``learning_curve.png`` (:func:`plot_curve`). ``rft-run`` writes both
at its end; for any run directory: ``python -m rft.report RUN_DIR [--explorer NAME]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from rft.monitor import ACCURACY, EVAL_WEIGHTS_VERSION, REWARD_MEAN, read_metrics
from rft.rundir import explorer_role

CURVE_FILE = "learning_curve.png"
EDGE_STEPS = 3  # "first steps" / "last steps" in the summary: this many at each end


@dataclass
class Report:
    """A run's learning, read from its explorer metrics."""

    reward: dict[int, float] = field(default_factory=dict)  # explorer step -> mean train reward
    accuracy: dict[int, float] = field(default_factory=dict)  # explorer step -> train accuracy
    # taskset metric ("eval/<name>/mean@k") -> weights version -> held-out accuracy
    held_out: dict[str, dict[int, float]] = field(default_factory=dict)


def build_report(rows: Sequence[dict[str, Any]]) -> Report:
    """The report of a role's metric rows (the newest row wins for a repeated step/version)."""
    report = Report()
    for row in rows:
        step = row.get("step")
        if not isinstance(step, int):
            continue
        if REWARD_MEAN in row:
            report.reward[step] = float(row[REWARD_MEAN])
            if ACCURACY in row:
                report.accuracy[step] = float(row[ACCURACY])
        if EVAL_WEIGHTS_VERSION in row:
            version = int(row[EVAL_WEIGHTS_VERSION])
            for key, value in row.items():
                if key.startswith("eval/") and "/mean@" in key:
                    report.held_out.setdefault(key, {})[version] = float(value)
    return report


def edge_means(series: dict[int, float], n: int = EDGE_STEPS) -> tuple[float, float] | None:
    """Mean of the first ``n`` and of the last ``n`` values by step (halves if fewer than 2n)."""
    values = [series[k] for k in sorted(series)]
    if len(values) < 2:
        return None
    n = min(n, len(values) // 2)
    return statistics.fmean(values[:n]), statistics.fmean(values[-n:])


def format_summary(report: Report, n: int = EDGE_STEPS) -> str:
    """Held-out accuracy of the first and last model evaluated; train reward first vs last steps."""
    lines = []
    for key, by_version in sorted(report.held_out.items()):
        name = key.split("/")[1]
        first, last = min(by_version), max(by_version)
        if first == last:
            lines.append(
                f"held-out {name} ({key.split('/')[-1]}): {by_version[first]:.3f} "
                f"(weights v{first}, the only evaluation)"
            )
            continue
        gain = 100 * (by_version[last] - by_version[first])
        lines.append(
            f"held-out {name} ({key.split('/')[-1]}): {by_version[first]:.3f} "
            f"(weights v{first}) -> {by_version[last]:.3f} (weights v{last}), "
            f"{gain:+.1f} points"
        )
    if not report.held_out:
        lines.append(
            "held-out accuracy: no evaluation (set buffer.explorer_input.eval_tasksets "
            "and explorer.eval_interval > 0, eval_on_startup: true)"
        )
    edges = edge_means(report.reward, n)
    if edges is not None:
        k = min(n, len(report.reward) // 2)
        lines.append(
            f"train reward: {edges[0]:.3f} (mean of the first {k} steps) -> "
            f"{edges[1]:.3f} (mean of the last {k} steps)"
        )
    return "\n".join(lines)


def plot_curve(report: Report, path: Path, title: str = "") -> Path:
    """Train reward per step and held-out accuracy per weights version, one PNG; returns it."""
    import matplotlib

    matplotlib.use("Agg")  # files only: compute and login nodes have no display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    if report.reward:
        steps = sorted(report.reward)
        ax.plot(
            steps,
            [report.reward[s] for s in steps],
            color="tab:blue",
            alpha=0.8,
            label="train reward (mean per step)",
        )
    if report.accuracy:
        steps = sorted(report.accuracy)
        ax.plot(
            steps,
            [report.accuracy[s] for s in steps],
            color="tab:blue",
            alpha=0.35,
            linestyle="--",
            label="train accuracy (sampled)",
        )
    for key, by_version in sorted(report.held_out.items()):
        versions = sorted(by_version)
        ax.plot(
            versions,
            [by_version[v] for v in versions],
            marker="o",
            linewidth=2,
            label=f"held-out {key.split('/')[1]} {key.split('/')[-1]}",
        )
    ax.set_xlabel("step (held-out: trainer steps behind the evaluated weights)")
    ax.set_ylabel("reward / accuracy")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)
    return path


def write_report(run_dir: Path, explorer_name: str, title: str = "") -> str | None:
    """Plot the curve into ``run_dir`` and return the summary; None when there are no metrics."""
    report = build_report(read_metrics(run_dir, explorer_role(explorer_name)))
    if not report.reward and not report.held_out:
        return None
    path = plot_curve(report, Path(run_dir) / CURVE_FILE, title)
    return f"{format_summary(report)}\nlearning curve: {path}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rft.report", description=__doc__.split("\n")[0]
    )
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--explorer", default="explorer", help="explorer.name of the run")
    args = parser.parse_args(argv)
    summary = write_report(args.run_dir, args.explorer, title=str(args.run_dir))
    if summary is None:
        print(
            f"{args.run_dir}: no explorer metrics ({explorer_role(args.explorer)})", file=sys.stderr
        )
        return 1
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
