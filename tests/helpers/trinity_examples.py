"""What the Trinity-example tests share: the expected outcome of a dry run (loads, refused by
name, or a misspelled key) and the dry run itself. Input: a fixture file (Trinity's YAML,
unchanged below a one- or two-line source header); output: the rft config, or the ConfigError."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rft.config.load import config_from_dict, load_config
from rft.explorer.tasksets import taskset_workflow
from rft.trainer.algorithm import build_loss_fns

LOADS = None  # the EXPECTED value of an example that dry-runs as written


@dataclass(frozen=True)
class Refused:
    """Loading raises NotSupportedError "Trinity's `<name>` is not supported by rft: ..."."""

    name: str  # the key path (or "key: value", "workflow x") the message names first


@dataclass(frozen=True)
class Typo:
    """The example misspells a key (Trinity would reject it too): the nearest name is offered."""

    key: str


@dataclass(frozen=True)
class Rejected:
    """Loading raises a plain ConfigError (not "not supported", no nearest-name guess) whose
    message holds ``text``: an unknown workflow, a removed key, a missing veRL file."""

    text: str


def dry_run(raw_or_path: dict | Path, tmp_path: Path, overrides: tuple[str, ...] = ()):
    """What ``rft-run --dry-run`` checks without the files: config, losses, workflows
    (``overrides``: more ``key=value`` paths, e.g. an auxiliary model's folder)."""
    if isinstance(raw_or_path, Path):
        cfg = load_config(raw_or_path, [f"checkpoint_root_dir={tmp_path}", *overrides])
    else:
        cfg = config_from_dict(raw_or_path)
    build_loss_fns(cfg.algorithm)
    for label, taskset in cfg.labelled_tasksets():
        taskset_workflow(cfg, taskset, label, is_eval="eval_tasksets" in label)
    return cfg
