"""``mode: bench``: evaluate a run's checkpoints on the eval tasksets and print a table.

Input: a config whose run directory holds Hugging Face weights: the published ``weights/v*``
versions and ``global_step_N/actor/huggingface`` folders (written at save time or by
``rft-convert``). One vLLM engine starts on the first checkpoint and reloads the others in
place. Output: a table (checkpoint x taskset: mean@k, pass@k, reward, response length) on
stdout, the same numbers in ``monitor/bench/metrics.jsonl`` (step = checkpoint step).
``explorer.bench_on_latest_checkpoint`` evaluates only the newest checkpoint.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

from rft import explorer as X
from rft import tasksets as T
from rft.config import Config, load_config
from rft.errors import CheckpointError, ConfigError, RftError
from rft.models import check_model_dir
from rft.monitor import Monitor
from rft.sync import is_complete, list_versions, weights_dir

log = logging.getLogger("rft.bench")
_STEP_RE = re.compile(r"^global_step_(\d+)$")


def find_checkpoints(run_dir: Path) -> list[tuple[int, str, Path]]:
    """(step, label, HF folder) for every complete checkpoint, oldest first; one per step."""
    found: dict[int, tuple[str, Path]] = {}
    for version in list_versions(run_dir):
        folder = weights_dir(run_dir, version)
        if is_complete(folder):
            found[version] = (f"weights/v{version:06d}", folder)
    for step_dir in run_dir.glob("global_step_*") if run_dir.is_dir() else []:
        match = _STEP_RE.match(step_dir.name)
        hf = step_dir / "actor" / "huggingface"
        if match and _loadable(hf):
            found[int(match.group(1))] = (f"{step_dir.name}/actor/huggingface", hf)
    return [(step, label, folder) for step, (label, folder) in sorted(found.items())]


def _loadable(folder: Path) -> bool:
    try:
        check_model_dir(folder)
    except RftError:
        return False
    return True


def evaluate_checkpoint(cfg: Config, engine: X.Engine, eval_sets: list[T.Taskset],
                        step: int) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for ts in eval_sets:
        items = [(i, T.Task(0, i, 0)) for i in range(len(ts))]
        exps, _ = X.rollout(cfg, engine, [ts], items, step, step, "bench")
        groups = [[e for e in exps if e.group_id == g] for g in dict.fromkeys(e.group_id for e in exps)]
        metrics.update(X.eval_taskset_metrics(ts.name, ts.sampling.n, groups))
    return metrics


def format_table(rows: list[tuple[str, dict[str, float]]]) -> str:
    """One line per checkpoint and taskset."""
    lines = [f"{'checkpoint':<34} {'taskset':<20} {'mean@k':>8} {'pass@k':>8} {'reward':>8} {'length':>7}"]
    for label, metrics in rows:
        names = sorted({k.split("/")[1] for k in metrics if k.startswith("eval/")})
        for name in names:
            get = lambda suffix: next((v for k, v in metrics.items()  # noqa: E731
                                       if k.startswith(f"eval/{name}/{suffix}")), float("nan"))
            lines.append(f"{label:<34} {name:<20} {get('mean@'):>8.3f} {get('pass@'):>8.3f} "
                         f"{get('reward_mean'):>8.3f} {get('response_length_mean'):>7.1f}")
    return "\n".join(lines)


def run_bench(cfg: Config) -> str:
    """Evaluate the run's checkpoints; returns the printed table."""
    checkpoints = find_checkpoints(cfg.run_dir)
    if not checkpoints:
        raise CheckpointError(f"{cfg.run_dir} has no checkpoint with Hugging Face weights "
                              "(weights/v*, global_step_N/actor/huggingface); run "
                              f"`bin/rft-convert --checkpoint-dir {cfg.run_dir}` first")
    if cfg.explorer.bench_on_latest_checkpoint:
        checkpoints = checkpoints[-1:]
    eval_sets = T.eval_tasksets(cfg)
    if not eval_sets:
        raise ConfigError("mode 'bench' needs buffer.explorer_input.eval_tasksets")
    engine = X.Engine(cfg)
    rows = []
    with Monitor(cfg.run_dir, "bench", monitor_type=cfg.monitor.monitor_type) as monitor:
        for step, label, folder in checkpoints:
            engine.reload(folder)
            metrics = evaluate_checkpoint(cfg, engine, eval_sets, step)
            monitor.log(step, metrics)
            rows.append((label, metrics))
    return format_table(rows)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m rft.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args(argv)
    try:
        print(run_bench(load_config(args.config, [*args.overrides, "mode=bench"])))
    except RftError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
