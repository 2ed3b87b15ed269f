"""``mode: bench``: evaluate the starting model and a run's checkpoints on the eval tasksets.

Data in: ``model.model_path`` (step 0, weights version 0) and the run directory's Hugging Face
checkpoints (:func:`find_checkpoints`). Data out: a table on stdout and the same numbers in
``monitor/bench/metrics.jsonl`` (:func:`run_bench`). Writes nothing to the buffer or weights.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from rft.config.external import uses_external_model
from rft.config.load import load_config
from rft.config.schema import Config
from rft.entry import config_parser, run_command, setup_logging
from rft.errors import ConfigError, RftError
from rft.explorer import external
from rft.explorer import tasksets as T
from rft.explorer.engine import Engine
from rft.explorer.eval import eval_metrics
from rft.explorer.reward_model import load_reward_models
from rft.models import check_model_dir
from rft.monitor import Monitor
from rft.rundir import hf_dir, step_of, weights_dir
from rft.sync.versions import is_complete, is_delta, list_versions
from rft.workflow.rewards import answer_extractor

log = logging.getLogger("rft.bench")

BASE_LABEL = "base (model.model_path)"  # the step-0 row


def find_checkpoints(run_dir: Path) -> list[tuple[int, str, Path]]:
    """(step, label, HF folder) for every complete checkpoint, oldest first; one per step: the
    published ``weights/v*`` versions and ``global_step_N/actor/huggingface`` folders (written
    at save time or by ``rft-convert``)."""
    found: dict[int, tuple[str, Path]] = {}
    for version in list_versions(run_dir):
        folder = weights_dir(run_dir, version)
        if is_complete(folder) and not is_delta(folder):  # a delta needs its anchor
            found[version] = (f"weights/v{version:06d}", folder)
    for folder in run_dir.iterdir() if run_dir.is_dir() else []:
        step = step_of(folder)
        hf = hf_dir(run_dir, step) if step is not None else None
        if hf is not None and _loadable(hf):
            found[step] = (str(hf.relative_to(run_dir)), hf)
    return [(step, label, folder) for step, (label, folder) in sorted(found.items())]


def bench_plan(
    model_path: str | Path, checkpoints: list[tuple[int, str, Path]], latest_only: bool = False
) -> list[tuple[int, str, Path]]:
    """What the bench evaluates, in order: the base (``model.model_path``, step 0) first, then
    the checkpoints (all, or the newest with ``latest_only``). Each model once: a checkpoint at
    step 0 is the base (weights version 0 is ``model.model_path``), and when ``model_path`` is
    itself one of the checkpoints, that checkpoint stands for the base, under its own step."""
    base = Path(model_path)
    later = [c for c in checkpoints if c[0] != 0]
    if len(later) < len(checkpoints):
        log.info(
            "the step-0 checkpoint is the base model (weights version 0): evaluated once, as %s",
            BASE_LABEL,
        )
    same = [c for c in later if _same_folder(c[2], base)]
    if same:
        log.info("model.model_path %s is the checkpoint %s: no separate base row", base, same[0][1])
        return sorted({*same, *later[-1:]}) if latest_only else later
    return [(0, BASE_LABEL, base), *(later[-1:] if latest_only else later)]


def _same_folder(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def _loadable(folder: Path) -> bool:
    try:
        check_model_dir(folder)
    except RftError:
        return False
    return True


def format_table(
    rows: list[tuple[str, dict[str, float]]], extractors: dict[str, str] | None = None
) -> str:
    """One line per model and taskset, then how each taskset's accuracy was read.

    ``rows``: (label, bench metrics ``eval/<taskset>/...``); ``extractors``: taskset name ->
    answer extractor (:func:`rft.workflow.rewards.answer_extractor`)."""
    lines = [
        f"{'checkpoint':<34} {'taskset':<20} {'accuracy':>8} {'pass@k':>8} {'reward':>8} {'length':>7}"
    ]
    for label, metrics in rows:
        names = sorted({k.split("/")[1] for k in metrics if k.startswith("eval/")})
        for name in names:
            get = lambda suffix: next(
                (
                    v
                    for k, v in metrics.items()  # noqa: E731
                    if k.startswith(f"eval/{name}/{suffix}")
                ),
                float("nan"),
            )
            lines.append(
                f"{label:<34} {name:<20} {get('mean@'):>8.3f} {get('pass@'):>8.3f} "
                f"{get('reward_mean'):>8.3f} {get('response_length_mean'):>7.1f}"
            )
    lines.append(
        "accuracy: mean@k, the mean of the reward's 'accuracy' part over every sample "
        "(the reward when it has no such part); pass@k: tasks with an accurate sample"
    )
    for name, extractor in (extractors or {}).items():
        lines.append(f"answer extractor of {name}: {extractor}")
    return "\n".join(lines)


def run_bench(cfg: Config) -> str:
    """Evaluate the base model and the run's checkpoints; returns the printed table.

    One vLLM engine starts on ``model.model_path`` and reloads the checkpoints in place. The
    table has a row per model and taskset (accuracy = mean@k, pass@k, reward, response length;
    first row the base), each taskset's answer extractor under it; the monitor gets the same
    numbers at step = checkpoint step (0 for the base). With no checkpoint yet the base alone
    is evaluated (a model folder on a benchmark).
    """
    if uses_external_model(cfg):
        return run_external_bench(cfg)
    checkpoints = find_checkpoints(cfg.run_dir)
    if not checkpoints:
        log.warning(
            "%s has no checkpoint yet (weights/v*, global_step_N/actor/huggingface; "
            "`bin/rft-convert --checkpoint-dir %s` writes the latter): evaluating the base "
            "model %s only",
            cfg.run_dir,
            cfg.run_dir,
            cfg.model.model_path,
        )
    plan = bench_plan(cfg.model.model_path, checkpoints, cfg.explorer.bench_on_latest_checkpoint)
    eval_sets, extractors = _eval_sets(cfg)
    engine = Engine(cfg)
    reward_models = load_reward_models(cfg)
    loaded = Path(engine.weights_path)  # the base model (or model.lora_configs[0].path's adapter)
    rows = []
    with _monitor(cfg) as monitor:
        for step, label, folder in plan:
            if not _same_folder(folder, loaded):
                engine.reload(folder)
                loaded = folder
            metrics = eval_metrics(cfg, engine, eval_sets, step, step, "bench", reward_models)
            monitor.log(step, metrics)
            rows.append((label, metrics))
    return format_table(rows, extractors)


def run_external_bench(cfg: Config) -> str:
    """Evaluate ``model.external_model`` (an OpenAI-compatible endpoint) on the eval tasksets:
    no engine, no checkpoints; one row per taskset, at step 0. The endpoint is checked first."""
    client = external.connect(cfg)
    eval_sets, extractors = _eval_sets(cfg)
    with _monitor(cfg) as monitor:
        metrics = external.evaluate_external(cfg, client, eval_sets)
        monitor.log(0, metrics)
    return format_table([(f"external: {client.model_name}", metrics)], extractors)


def _eval_sets(cfg: Config) -> tuple[list[T.Taskset], dict[str, str]]:
    """The eval tasksets, and each one's answer extractor (logged)."""
    eval_sets = T.eval_tasksets(cfg)
    if not eval_sets:
        raise ConfigError("mode 'bench' needs buffer.explorer_input.eval_tasksets")
    extractors = {
        ts.name: answer_extractor(ts.workflow.reward_fn)
        if isinstance(ts.workflow, T.Recipe)
        else f"set by the workflow class {ts.workflow.name}"
        for ts in eval_sets
    }
    for name, extractor in extractors.items():
        log.info("%s: answer extractor: %s", name, extractor)
    return eval_sets, extractors


def _monitor(cfg: Config) -> Monitor:
    return Monitor(
        cfg.run_dir,
        "bench",
        monitor_type=cfg.monitor.monitor_type,
        project=cfg.project,
        name=cfg.name,
    )


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    args = config_parser("python -m rft.explorer.bench", __doc__.split("\n")[0]).parse_args(argv)
    return run_command(
        lambda: print(run_bench(load_config(args.config, [*args.overrides, "mode=bench"])))
    )


if __name__ == "__main__":
    sys.exit(main())
