"""The run directory on the shared filesystem: its layout and the config it was started with.

``<checkpoint_root_dir>/<project>/<name>/`` holds everything of a run (see DESIGN.md). The first
launch records the resolved config as ``config.yaml`` (atomic, no-clobber, so concurrent
workers agree on one); every later launch, of any role, is compared against it on the keys
that define the run, and a mismatch is refused before anything is written: two different
experiments must not share one buffer and one set of checkpoints.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import yaml

from rft import atomic
from rft.config import Config, config_to_yaml
from rft.errors import ConfigError

log = logging.getLogger("rft.rundir")

CONFIG_FILE = "config.yaml"
# Keys two launches into one run directory must agree on (roles may differ in everything else:
# mode, explorer name and engines, cluster size, tasksets of an added explorer).
RUN_KEYS = (
    ("model", "model_path"),
    ("algorithm", "algorithm_type"),
    ("algorithm", "repeat_times"),
    ("buffer", "trainer_input", "experience_buffer", "storage_type"),
)


def prepare(cfg: Config, role: str) -> Path:
    """Create the run directory, record or check its config, and save this launch's config."""
    run_dir = cfg.run_dir
    for sub in ("log", "explorers", "buffer", "monitor"):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    text = config_to_yaml(cfg)
    record = run_dir / CONFIG_FILE
    try:
        atomic.write_bytes(record, text.encode(), overwrite=False)
    except FileExistsError:
        pass  # recorded by an earlier launch, or by another worker of this one
    check_matches(yaml.safe_load(record.read_text()), yaml.safe_load(text), record)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    atomic.write_text(run_dir / "log" / f"config-{role}-{stamp}.yaml", text)
    return run_dir


def _lookup(data: dict, path: tuple[str, ...]):
    for key in path:
        data = (data or {}).get(key)
    return data


def check_matches(recorded: dict, current: dict, record: Path) -> None:
    """Raise if ``current`` differs from the run directory's recorded config on a run key."""
    diffs = [(".".join(p), _lookup(recorded, p), _lookup(current, p)) for p in RUN_KEYS
             if _lookup(recorded, p) != _lookup(current, p)]
    if diffs:
        lines = "; ".join(f"{key}: {old!r} there, {new!r} now" for key, old, new in diffs)
        raise ConfigError(f"{record.parent} was started with a different config ({lines}). "
                          f"Use another `name=...` for a new experiment, or restore the config "
                          f"recorded in {record}")
