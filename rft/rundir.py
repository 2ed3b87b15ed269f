"""The run directory on the shared filesystem: every name in it, and the config it was started with.

``<checkpoint_root_dir>/<project>/<name>/`` holds everything of a run; every module that reads
or writes a name in it imports the name from here. :func:`prepare` records the first launch's
resolved config (atomic, no-clobber) and refuses a later launch whose config differs on the
keys that define the run: two experiments must never share one buffer and one set of checkpoints.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import yaml

from rft import atomic
from rft.errors import ERROR_PREFIX, ConfigError

CONFIG_FILE = "config.yaml"  # resolved config of the first launch
BUFFER_DIR = "buffer"  # buffer/<writer>/seg-NNNNNN.jsonl: experiences (rft.buffer.segments)
WEIGHTS_DIR = "weights"  # weights/vNNNNNN/: published weights (rft.sync)
WEIGHTS_POINTER = "latest_state_dict_iteration.txt"  # newest complete weights version
WEIGHTS_GROUP = (
    "weights_group.json"  # where the trainer's weight-sync store listens (nccl; rft.sync.broadcast)
)
CHECKPOINT_POINTER = "latest_checkpointed_iteration.txt"  # newest complete full checkpoint
TRAINER_META = "trainer_meta.json"  # the newest checkpoint's metadata
EXPLORERS_DIR = "explorers"  # explorers/<writer>.json: explorer heartbeats
AUXILIARY_DIR = "auxiliary"  # auxiliary/<model>-<engine>.json: where a shared judge listens
EXPLORER_META = "explorer_meta.json"  # explorer task cursors
FAILURES_DIR = (
    "failures"  # failures/<writer>.json: why an explorer task stopped (rft.sync.failures)
)
SYNC_REQUESTS_DIR = "sync_requests"  # sync_requests/<writer>.json: explorer_driven's asks
GROUPS_DIR = "groups"  # groups/<writer>/: finished groups of unsealed steps (explorer loop)
# pass_rates/<explorer>/step-NNNNNN/<writer>.json: what a step's tasks scored, for the
# difficulty_based selector (rft.explorer.pass_rates)
PASS_RATES_DIR = "pass_rates"
LEASES_DIR = "leases"  # leases/<name>/<gen>.json: who owns a role here (rft.lease)
TRAINER_LEASE = "trainer"  # the trainer's lease name (an explorer task's: its writer)
LEASE_GENERATION = "lease_generation"  # in metadata and heartbeats: the writer's lease then
MONITOR_DIR = "monitor"  # metrics.jsonl and the monitors' files (rft.monitor)
LOG_DIR = "log"  # process logs, the configs of each launch
SUBMITIT_DIR = (
    "submitit"  # inside LOG_DIR: submitit's job files and logs (rft-launch's default path)
)
# A staged config runs each stage in <run_dir>/<stage name>/, a run directory of its own.
STAGE_FINISHED = "stage_finished.json"  # in a stage's run directory: the stage ended normally
STAGE_FAILED = "stage_failed.json"  # in a stage's run directory: its main role failed
# global_step_N/{actor,critic}/[huggingface/]: full checkpoints (rft.trainer.state)
ACTOR_DIR = "actor"  # inside global_step_N: the policy's checkpoint
CRITIC_DIR = "critic"  # inside global_step_N: the critic's checkpoint (advantage_fn ppo)
HF_DIR = (
    "huggingface"  # inside global_step_N/actor: the Hugging Face folder (a LoRA run: the adapter)
)
MERGED_HF_DIR = (
    "huggingface_merged"  # beside it, a LoRA run's: base + adapter merged (rft-convert --merge)
)
STEP_PREFIX = "global_step_"  # global_step_N: one full checkpoint
STEP_RE = re.compile(rf"^{STEP_PREFIX}(\d+)$")

# Keys two launches into one run directory must agree on (roles may differ in everything else:
# mode, explorer name and engines, cluster size, tasksets of an added explorer).
RUN_KEYS = (
    ("model", "model_path"),
    ("algorithm", "algorithm_type"),
    ("algorithm", "repeat_times"),
    ("buffer", "trainer_input", "experience_buffer", "storage_type"),
)


def writer_name(explorer_name: str, rank: int) -> str:
    """Buffer writer and heartbeat name of explorer task ``rank``: ``<explorer.name>-<rank>``."""
    return f"{explorer_name}-{rank}"


def explorer_role(explorer_name: str, rank: int = 0) -> str:
    """Monitor role of an explorer task: ``explorer_<name>`` for rank 0, else with the rank."""
    return (
        f"explorer_{explorer_name}" if rank == 0 else f"explorer_{writer_name(explorer_name, rank)}"
    )


def lease_dir(run_dir: Path | str, name: str) -> Path:
    """``leases/<name>``: the claims on role instance ``name`` (``trainer`` or a writer name)."""
    return Path(run_dir) / LEASES_DIR / name


def lease_file(run_dir: Path | str, name: str, gen: int) -> Path:
    """``leases/<name>/<gen:06d>.json``: one claim; the highest generation owns the role."""
    return lease_dir(run_dir, name) / f"{gen:06d}.json"


def step_dir(run_dir: Path | str, step: int) -> Path:
    """``global_step_<step>``: one full checkpoint."""
    return Path(run_dir) / f"{STEP_PREFIX}{step}"


def step_of(folder: Path | str) -> int | None:
    """The step of a ``global_step_N`` folder name, or None for any other name."""
    match = STEP_RE.match(Path(folder).name)
    return int(match.group(1)) if match else None


def hf_dir(run_dir: Path | str, step: int) -> Path:
    """The Hugging Face folder of checkpoint ``step``."""
    return step_dir(run_dir, step) / ACTOR_DIR / HF_DIR


def weights_dir(run_dir: Path | str, version: int) -> Path:
    """``weights/v<version:06d>``: one published weights version."""
    return Path(run_dir) / WEIGHTS_DIR / f"v{version:06d}"


def newest_checkpoint(run_dir: Path | str) -> int | None:
    """The step the checkpoint pointer names (None before the first full checkpoint)."""
    return atomic.read_pointer(Path(run_dir) / CHECKPOINT_POINTER)


def recorded_mode(run_dir: Path | str) -> str | None:
    """The ``mode`` of the config the run directory was started with, if any."""
    record = Path(run_dir) / CONFIG_FILE
    return (yaml.safe_load(record.read_text()) or {}).get("mode") if record.is_file() else None


def prepare(run_dir: Path, config_yaml: str, role: str) -> Path:
    """Create the run directory, record or check its config, and save this launch's config."""
    for sub in (LOG_DIR, EXPLORERS_DIR, BUFFER_DIR, MONITOR_DIR):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    record = run_dir / CONFIG_FILE
    try:
        atomic.write_bytes(record, config_yaml.encode(), overwrite=False)
    except FileExistsError:
        pass  # recorded by an earlier launch, or by another worker of this one
    check_matches(yaml.safe_load(record.read_text()), yaml.safe_load(config_yaml), record)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    atomic.write_text(run_dir / LOG_DIR / f"config-{role}-{stamp}.yaml", config_yaml)
    return run_dir


def tail_log(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file, for failure messages (a note when it is missing)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def last_error(path: Path) -> str | None:
    """The last user-error line a role printed into its log (``error: ...``), if any: the line to
    show after a log tail that a launcher (torchrun) filled with its own traceback."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    return next((line for line in reversed(lines) if line.startswith(ERROR_PREFIX)), None)


def _lookup(data: dict, path: tuple[str, ...]) -> object:
    for key in path:
        data = (data or {}).get(key)
    return data


def check_matches(recorded: dict, current: dict, record: Path) -> None:
    """Raise if ``current`` differs from the run directory's recorded config on a run key."""
    diffs = [
        (".".join(p), _lookup(recorded, p), _lookup(current, p))
        for p in RUN_KEYS
        if _lookup(recorded, p) != _lookup(current, p)
    ]
    if diffs:
        lines = "; ".join(f"{key}: {old!r} there, {new!r} now" for key, old, new in diffs)
        raise ConfigError(
            f"{record.parent} was started with a different config ({lines}). "
            f"Use another `name=...` for a new experiment, or restore the config "
            f"recorded in {record}"
        )
