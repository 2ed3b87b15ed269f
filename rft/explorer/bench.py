"""``mode: bench``: evaluate a run's checkpoints on the eval tasksets and print a table.

Input: a config whose run directory holds Hugging Face weights: the published ``weights/v*``
versions and ``global_step_N/actor/huggingface`` folders (written at save time or by
``rft-convert``). One vLLM engine starts on the first checkpoint and reloads the others in
place. Output: a table (checkpoint x taskset: mean@k, pass@k, reward, response length) on
stdout, the same numbers in ``monitor/bench/metrics.jsonl`` (step = checkpoint step).
``explorer.bench_on_latest_checkpoint`` evaluates only the newest checkpoint.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from rft.config.load import load_config
from rft.config.schema import Config
from rft.entry import config_parser, run_command, setup_logging
from rft.errors import CheckpointError, ConfigError, RftError
from rft.explorer import loop as X
from rft.explorer import tasksets as T
from rft.models import check_model_dir
from rft.monitor import Monitor
from rft.rundir import hf_dir, step_of, weights_dir
from rft.sync import is_complete, list_versions

log = logging.getLogger("rft.bench")


def find_checkpoints(run_dir: Path) -> list[tuple[int, str, Path]]:
    """(step, label, HF folder) for every complete checkpoint, oldest first; one per step."""
    found: dict[int, tuple[str, Path]] = {}
    for version in list_versions(run_dir):
        folder = weights_dir(run_dir, version)
        if is_complete(folder):
            found[version] = (f"weights/v{version:06d}", folder)
    for folder in run_dir.iterdir() if run_dir.is_dir() else []:
        step = step_of(folder)
        hf = hf_dir(run_dir, step) if step is not None else None
        if hf is not None and _loadable(hf):
            found[step] = (str(hf.relative_to(run_dir)), hf)
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
    with Monitor(cfg.run_dir, "bench", monitor_type=cfg.monitor.monitor_type,
                 project=cfg.project, name=cfg.name) as monitor:
        for step, label, folder in checkpoints:
            engine.reload(folder)
            metrics = evaluate_checkpoint(cfg, engine, eval_sets, step)
            monitor.log(step, metrics)
            rows.append((label, metrics))
    return format_table(rows)


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    args = config_parser("python -m rft.explorer.bench", __doc__.split("\n")[0]).parse_args(argv)
    return run_command(lambda: print(run_bench(load_config(args.config, [*args.overrides, "mode=bench"]))))


if __name__ == "__main__":
    sys.exit(main())
