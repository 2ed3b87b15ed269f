"""Metrics out: one ``key=value`` log line per step, a ``metrics.jsonl`` and the chosen sinks.

Each role owns a :class:`Monitor` writing ``monitor/<role>/metrics.jsonl`` (and tensorboard,
wandb, mlflow or swanlab folders) under the run directory; only rank 0 writes, one whole line at
a time, and a sink's package is imported only when chosen. The constants below are the metric names
that more than one module needs: writer and readers import them. The pure math's own metric
names live beside that math (``rft.algo``), which must not import this module.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import netrc
import os
import re
import socket
import sys
import time
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence
from urllib.parse import urlsplit

from rft.config.schema import MonitorType
from rft.errors import ConfigError
from rft.lease import NO_FENCE, Fence
from rft.rundir import MONITOR_DIR

log = logging.getLogger(__name__)

POLICY_LOSS = "pg_loss"  # trainer: the policy loss of the step
REWARD_MEAN = "reward/mean"  # explorer: mean reward of the step's experiences
ACCURACY = "accuracy"  # explorer: mean accuracy part (or reward) of the step's experiences
TOKENS_PER_S = "tokens_per_s"  # trainer: batch tokens per second of training compute
# The explorer's step times (rft.explorer.open_steps): the wall time from one seal to the next
# (a window) is shared out among the steps sealed at its end by the model tokens each generated,
# so with overlapping steps each shows the window's rate; with one step at a time a step's share
# is the whole window (the evaluation that follows a step is not in the next one's).
GENERATE_TOKENS_PER_S = (
    "generate_tokens_per_s"  # explorer: generated tokens / generate_time_s (the engine's rate)
)
LOOP_TOKENS_PER_S = "loop_tokens_per_s"  # explorer: generated tokens / step_time_s (the loop's)
WEIGHTS_VERSION = "weights_version"  # both: weights version in use after the step
STALENESS_MEAN = "staleness/mean"  # trainer: mean weights versions between rollout and update
STALENESS_MAX = "staleness/max"  # trainer: largest such gap in the step
STALENESS_COUNT = (
    "staleness/count_{versions}"  # trainer: rollouts of the step that many versions old
)
STEP_TIME_S = "time/step_s"  # trainer: wall time of the step (read, update, publish)
READ_TIME_S = "time/read_s"  # trainer: waiting for and reading the step's experiences
PUBLISH_TIME_S = "time/publish_s"  # trainer: gathering and publishing weights
EXPLORER_STEP_S = "step_time_s"  # explorer: the step's share of its window's wall time
EXPLORER_WAIT_S = "wait_time_s"  # explorer: waiting for weights in the window (first step's)
EXPLORER_RELOAD_S = "reload_time_s"  # explorer: loading weights in the window (first step's)
GENERATED_TOKENS = "generated_tokens"  # explorer: model tokens the step generated
GENERATE_TIME_S = "generate_time_s"  # explorer: its share of the window's seconds in vLLM steps
RESPONSE_LENGTH_MAX = "response_length/max"  # explorer: the step's longest response (tokens)
BATCH_TOKENS = "batch_tokens"  # trainer: prompt + response tokens the step trained on
BATCH_EXPERIENCES = "batch_experiences"  # trainer: experiences the step trained on
BATCH_PAIRS = "batch_pairs"  # trainer (DPO): preference pairs the step trained on
SKIPPED_NO_EXPERIENCES = "skipped_no_experiences"  # trainer: 1 on a step with nothing to train
UPDATES = (
    "updates"  # trainer: optimizer updates of the policy in the step (0: none, e.g. critic warm-up)
)
CRITIC_WARMUP = "critic_warmup"  # trainer: 1 on a step where only the critic learned
OLD_LOGPROBS_TIME_S = "time_old_logprobs_s"  # trainer: the no-grad pass recomputing old log-probs
EPISODES = "episodes/count"  # explorer (workflow classes): workflow runs in the step
EPISODE_FAILED = "episodes/failed"  # explorer: runs that raised (left out of the buffer)
EPISODE_TIMEOUTS = "episodes/timeouts"  # explorer: runs stopped at explorer.max_timeout
EPISODE_RETRIED = "episodes/retried"  # explorer: runs run again (explorer.max_retry_times)
# explorer (JSONL only, not numbers): the step's first failed run, "<workflow> on task <id>:
# <Type: message>", and {that one-line error: runs of the step that failed with it}
EPISODE_FIRST_ERROR = "episodes/first_error"
EPISODE_ERRORS = "episodes/errors"
EPISODE_TURNS = "episodes/model_calls_mean"  # explorer: model calls per finished run
EPISODE_SAMPLES = "episodes/samples"  # explorer: experiences the finished runs returned
EPISODE_PREFIX_BREAKS = (
    "episodes/prefix_breaks"  # explorer: calls whose chat template re-rendered history (new sample)
)
EPISODE_RETOKENIZED = (
    # explorer: assistant messages trained from the chat template's tokens (edited by the
    # workflow, or not the model's reply in the episode), not the engine's
    "episodes/retokenized_turns"
)
TOOL_CALLS = "tools/calls"  # explorer: tool calls the step's runs made
TOOL_ERRORS = "tools/errors"  # explorer: tool calls that raised or returned what JSON cannot hold
TOOL_TIMEOUTS = "tools/timeouts"  # explorer: tool calls stopped at their time limit
ROLLOUT_SPAN_SHARE = "rollout/span_share"  # explorer: share of samples spanning versions
ROLLOUT_SPAN_MEAN = "rollout/span_mean"  # explorer: mean versions such a sample spans
ROLLOUT_TOKENS_DISCARDED = "rollout/tokens_discarded"  # explorer: tokens of groups dropped
ROLLOUT_INFLIGHT = "rollout/inflight_samples"  # explorer: samples in flight at sealing
EVAL_WEIGHTS_VERSION = "eval/weights_version"  # explorer: weights version an evaluation measured
SYNC_BROADCAST_OK = "sync/broadcast_ok"  # trainer (nccl): 1 when the version reached every member
SYNC_BROADCAST_S = "sync/broadcast_s"  # trainer (nccl): forming the group, sending, confirming
SYNC_MEMBERS = "sync/members"  # trainer (nccl): explorers in the weight-sync group
SYNC_GENERATION = "sync/generation"  # trainer (nccl): the group's generation
BUFFER_STATS_PREFIX = "buffer/"  # trainer: the buffer reader's counters (ReaderStats.as_dict)
BUFFER_BACKLOG = f"{BUFFER_STATS_PREFIX}backlog_segments"  # trainer: sealed, not yet consumed
CRITIC_PREFIX = "critic/"  # trainer (advantage_fn ppo): the critic's metrics
VALUE_LOSS = f"{CRITIC_PREFIX}value_loss"  # clipped value loss of the critic's updates
VALUE_CLIP_FRAC = f"{CRITIC_PREFIX}value_clip_frac"  # share of tokens where the value clip bound
EXPLAINED_VARIANCE = f"{CRITIC_PREFIX}explained_variance"  # of the returns by the step's old values
VALUES_MEAN = f"{CRITIC_PREFIX}values_mean"  # mean old value over the rollout tokens
CRITIC_GRAD_NORM = f"{CRITIC_PREFIX}grad_norm"  # the critic's gradient norm, mean over its updates
CRITIC_LR = f"{CRITIC_PREFIX}lr"  # the critic's learning rate after the step
# What rft-run prints per step (the trainer's row merged with the explorer's of that step):
# the pipeline at a glance, who waits for whom (READ_TIME_S: the trainer for experiences;
# EXPLORER_WAIT_S: the explorer for weights) and the buffer's backlog.
PROGRESS_KEYS = (
    POLICY_LOSS,
    VALUE_LOSS,
    REWARD_MEAN,
    ACCURACY,
    TOKENS_PER_S,
    WEIGHTS_VERSION,
    STALENESS_MEAN,
    STEP_TIME_S,
    READ_TIME_S,
    EXPLORER_WAIT_S,
    BUFFER_BACKLOG,
)


def metrics_path(run_dir: Path | str, role: str) -> Path:
    return Path(run_dir) / MONITOR_DIR / role / "metrics.jsonl"


def tensorboard_dir(run_dir: Path | str, role: str | None = None) -> Path:
    """A role's TensorBoard folder, or (no role) the folder to point ``tensorboard --logdir`` at."""
    root = Path(run_dir) / MONITOR_DIR / "tensorboard"
    return root / role if role else root


def wandb_dir(run_dir: Path | str) -> Path:
    """The folder of the run's wandb run folders (what ``wandb sync`` is pointed at)."""
    return Path(run_dir) / MONITOR_DIR / "wandb"


def swanlab_dir(run_dir: Path | str) -> Path:
    """The folder of the run's SwanLab run folders (``swanlab sync`` takes each ``run-*`` in it)."""
    return Path(run_dir) / MONITOR_DIR / "swanlab"


def mlflow_uri(run_dir: Path | str) -> str:
    """The run's MLflow file store (``mlflow server --backend-store-uri`` takes it)."""
    return (Path(run_dir) / MONITOR_DIR / "mlflow").absolute().as_uri()


def monitor_names(monitor_type: str | Sequence[str]) -> tuple[str, ...]:
    """``monitor.monitor_type``, one name (Trinity) or a list (rft), as a tuple of names."""
    return (monitor_type,) if isinstance(monitor_type, str) else tuple(monitor_type)


class Monitor:
    """Writes a role's per-step metrics to the log, metrics.jsonl and the chosen sinks."""

    def __init__(
        self,
        run_dir: Path | str,
        role: str,
        *,
        monitor_type: str | Sequence[str] = "tensorboard",
        enabled: bool = True,
        flush_interval_s: float = 10.0,
        project: str = "rft",
        name: str | None = None,
        fence: Fence = NO_FENCE,
    ):
        self.role = role
        self.enabled = enabled
        self.fence = fence  # the role's lease: a displaced instance writes no more metrics
        self._jsonl = None
        self._sinks: list[Any] = []
        if not enabled:
            return
        path = metrics_path(run_dir, role)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._jsonl = path.open("a", encoding="utf-8")
        run = RunInfo(Path(run_dir), role, project, name or Path(run_dir).name, flush_interval_s)
        try:
            for kind in monitor_names(monitor_type):
                if SINKS[kind] is not None:
                    self._sinks.append(SINKS[kind](run))
        except BaseException:
            self.close()  # the sinks opened so far
            raise

    def log(self, step: int, metrics: dict[str, Any], prefix: str = "") -> None:
        """Record ``metrics`` for ``step``; sinks get the numbers (other values: JSONL only)."""
        if not self.enabled:
            return
        self.fence.check(f"writing the {self.role} metrics of step {step}")
        clean = {f"{prefix}{k}": _plain(v) for k, v in metrics.items()}
        assert self._jsonl is not None
        self._jsonl.write(json.dumps({"step": step, "time": time.time(), **clean}) + "\n")
        self._jsonl.flush()
        scalars = {
            k: v
            for k, v in clean.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        for sink in self._sinks:
            sink.log(step, scalars)
        log.info("%s step=%d %s", self.role, step, format_metrics(clean))

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        sinks, self._sinks = self._sinks, []
        for sink in sinks:
            sink.close()

    def __enter__(self) -> "Monitor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ----------------------------------------------------------------------------- the sinks


@dataclass(frozen=True)
class RunInfo:
    """What a sink needs to know about the run and the role it records."""

    run_dir: Path
    role: str  # trainer, explorer_<name>[-<rank>], bench
    project: str  # config `project`: the wandb/SwanLab project, the MLflow experiment
    name: str  # config `name`
    flush_interval_s: float  # TensorBoard flush period

    @property
    def run_name(self) -> str:
        """The wandb/MLflow/SwanLab run name: Trinity's ``<name>_<role>``."""
        return f"{self.name}_{self.role}"


class TensorBoardSink:
    """Event files in ``monitor/tensorboard/<role>/``."""

    kind, module, package = "tensorboard", "tensorboard", "tensorboard"  # name, import, pip

    def __init__(self, run: RunInfo):
        _require(type(self))
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(
            str(tensorboard_dir(run.run_dir, run.role)),
            flush_secs=max(1, int(run.flush_interval_s)),
        )

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            self._writer.add_scalar(key, value, step)

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """A wandb run ``<name>_<role>`` (group ``<name>``, tag ``<role>``) in project ``<project>``,
    its files in ``monitor/wandb/``; online or offline as :func:`wandb_mode` decides."""

    kind, module, package = "wandb", "wandb", "wandb"

    def __init__(self, run: RunInfo):
        _require(type(self))
        import wandb

        mode, why = wandb_mode()
        folder = wandb_dir(run.run_dir)
        effective = mode or os.environ.get("WANDB_MODE")
        later = f"; upload later: wandb sync {folder}" if effective in ("offline", "dryrun") else ""
        log.info("%s: wandb %s (%s)%s", run.role, effective, why, later)
        folder.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=run.project,
            name=run.run_name,
            group=run.name,
            tags=[run.role],
            dir=str(folder.parent),  # wandb adds "wandb/"
            mode=mode,
            reinit="create_new",
            config={"run_dir": str(run.run_dir)},
            settings=wandb.Settings(console="off", save_code=False),
        )

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self._run.log(scalars, step=step)

    def close(self) -> None:
        self._run.finish()


class MlflowSink:
    """An MLflow run ``<name>_<role>`` (tag ``role``) in experiment ``<project>``, in the run's
    file store (:func:`mlflow_uri`) or on the tracking server MLFLOW_TRACKING_URI names."""

    kind, module, package = "mlflow", "mlflow", "mlflow-skinny"

    def __init__(self, run: RunInfo):
        _require(type(self))
        from mlflow.entities import Metric
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or mlflow_uri(run.run_dir)
        if uri.startswith("file:"):
            # MLflow 3 keeps its file store behind this switch ("maintenance mode"); it is what
            # many processes on several nodes can write at once with no server (SQLite cannot).
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self._metric = Metric
        self._client = MlflowClient(tracking_uri=uri)
        experiment_id = _mlflow_experiment(self._client, run.project)
        tags = {"role": run.role, "rft.run_dir": str(run.run_dir)}
        self._run_id = self._client.create_run(
            experiment_id, run_name=run.run_name, tags=tags
        ).info.run_id

    def log(self, step: int, scalars: dict[str, float]) -> None:
        now_ms = int(time.time() * 1000)
        self._client.log_batch(
            self._run_id,
            metrics=[
                self._metric(_mlflow_key(k), float(v), now_ms, step) for k, v in scalars.items()
            ],
        )

    def close(self) -> None:
        self._client.set_terminated(self._run_id)


class SwanlabSink:
    """A SwanLab run ``<name>_<role>`` (group ``<name>``, tags ``<role>`` and ``<name>`` as Trinity
    tags it) in project ``<project>``, its files in ``monitor/swanlab/``; online or offline as
    :func:`swanlab_mode` decides. SwanLab holds one run per process: one role per process."""

    kind, module, package = "swanlab", "swanlab", "swanlab"

    def __init__(self, run: RunInfo):
        _require(type(self))
        import swanlab

        mode, why = swanlab_mode()
        folder = swanlab_dir(run.run_dir)
        effective = mode or os.environ.get("SWANLAB_MODE")
        later = f"; upload later: swanlab sync {folder}/run-*" if effective == "offline" else ""
        log.info("%s: swanlab %s (%s)%s", run.role, effective, why, later)
        self._run = swanlab.init(
            project=run.project,
            name=run.run_name,
            group=run.name,
            tags=[run.role, run.name],
            log_dir=str(folder),  # wins over SWANLAB_LOG_DIR: the run's files stay in the run
            mode=mode,
            config={"run_dir": str(run.run_dir)},
            # no copy of stdout/stderr into the run: the log line per step is rft's own
            settings=swanlab.Settings(terminal={"proxy_type": "none"}),
        )

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self._run.log(scalars, step=step)

    def close(self) -> None:
        self._run.finish()


# monitor_type name -> sink; console adds none (the log line and metrics.jsonl only).
SINKS: dict[str, type | None] = {
    s.kind: s for s in (TensorBoardSink, WandbSink, MlflowSink, SwanlabSink)
}
SINKS["console"] = None
assert set(SINKS) == set(typing.get_args(MonitorType)), "a sink per name the config accepts"


def check_packages(monitor_type: str | Sequence[str]) -> None:
    """Raise :class:`ConfigError` naming what to install when a chosen sink's package is missing
    (a login-node check: it finds the packages without importing them)."""
    for kind in monitor_names(monitor_type):
        if SINKS[kind] is not None:
            _require(SINKS[kind])


def _require(sink: type) -> None:
    if importlib.util.find_spec(sink.module) is None:
        raise ConfigError(
            f"monitor.monitor_type '{sink.kind}' needs the {sink.package} package, "
            f"which {sys.executable} cannot import; install the pinned "
            "requirements: bash env/setup.sh (or pip install -r requirements.txt)"
        )


PROBE_TIMEOUT_S = 2.0  # how long wandb_mode/swanlab_mode wait for the API host to answer


def wandb_mode(env: Mapping[str, str] = os.environ) -> tuple[str | None, str]:
    """wandb's mode on this node and why. ``WANDB_MODE`` wins when set (mode None: wandb reads
    it). Otherwise 'online' needs an API key (``WANDB_API_KEY``, or a login in ``~/.netrc`` as
    ``wandb login`` writes) and the API host (``WANDB_BASE_URL``, default api.wandb.ai) taking a
    TCP connection within ``PROBE_TIMEOUT_S``; else 'offline' (compute nodes often have no
    internet)."""
    if env.get("WANDB_MODE"):
        return None, f"WANDB_MODE={env['WANDB_MODE']}"
    url = env.get("WANDB_BASE_URL") or "https://api.wandb.ai"
    host = urlsplit(url).hostname or ""
    if not env.get("WANDB_API_KEY") and not _netrc_login(host, env):
        return "offline", f"no WANDB_API_KEY and no login for {host} in ~/.netrc"
    return _probe(url)


def swanlab_mode(env: Mapping[str, str] = os.environ) -> tuple[str | None, str]:
    """SwanLab's mode on this node and why, decided as :func:`wandb_mode` decides wandb's:
    ``SWANLAB_MODE`` wins when set (mode None: SwanLab reads it); 'online' needs an API key
    (``SWANLAB_API_KEY``, or the ``.netrc`` that ``swanlab login`` writes) and the API host
    (``SWANLAB_API_HOST``, else the logged-in host, else api.swanlab.cn) taking a TCP connection
    within ``PROBE_TIMEOUT_S``; else 'offline' (files for ``swanlab sync``)."""
    if env.get("SWANLAB_MODE"):
        return None, f"SWANLAB_MODE={env['SWANLAB_MODE']}"
    login = _swanlab_login(env)
    if not env.get("SWANLAB_API_KEY") and login is None:
        return "offline", "no SWANLAB_API_KEY and no `swanlab login`"
    return _probe(env.get("SWANLAB_API_HOST") or login or "https://api.swanlab.cn")


def _probe(url: str) -> tuple[str, str]:
    """'online' when the host of ``url`` takes a TCP connection within ``PROBE_TIMEOUT_S``."""
    parts = urlsplit(url if "://" in url else f"https://{url}")
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
    except OSError as e:
        return "offline", f"{host}:{port} not reachable ({e})"
    return "online", f"{host}:{port} reachable"


def _swanlab_login(env: Mapping[str, str]) -> str | None:
    """The API host ``swanlab login`` saved a key for, or None. SwanLab reads ``./.swanlab/.netrc``
    first, then ``.netrc`` in its root folder (``SWANLAB_ROOT``, default ``~/.swanlab``)."""
    home = env.get("HOME") or os.path.expanduser("~")
    root = env.get("SWANLAB_ROOT") or env.get("SWANLAB_SAVE_DIR") or os.path.join(home, ".swanlab")
    for path in (os.path.join(".swanlab", ".netrc"), os.path.join(root, ".netrc")):
        try:
            hosts = netrc.netrc(path).hosts
        except (OSError, netrc.NetrcParseError):
            continue
        if hosts:
            return next(iter(hosts))
    return None


def _netrc_login(host: str, env: Mapping[str, str]) -> bool:
    path = env.get("NETRC") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def _mlflow_experiment(client: Any, name: str) -> str:
    """The id of experiment ``name``, created when missing (another role may create it first)."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is None:
        try:
            return client.create_experiment(name)
        except MlflowException:  # created by another role in between
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
    return found.experiment_id


def _mlflow_key(key: str) -> str:
    """MLflow refuses '@' and most punctuation: ``eval/x/mean@4`` -> ``eval/x/mean_at_4``."""
    return re.sub(r"[^\w./\- :]", "_", key.replace("@", "_at_"))


def _plain(value: Any) -> Any:
    """Tensors and numpy scalars to Python numbers; NaN/inf kept as floats."""
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    return value


def failed_episodes(metrics: Mapping[str, Any]) -> str | None:
    """``episodes 3/16 failed: <first error>`` for an explorer step with failed (or timed out)
    runs; None for a step without."""
    failed = int(metrics.get(EPISODE_FAILED, 0) or 0) + int(metrics.get(EPISODE_TIMEOUTS, 0) or 0)
    if not failed:
        return None
    first = metrics.get(EPISODE_FIRST_ERROR) or "unknown error"
    return f"episodes {failed}/{int(metrics.get(EPISODES, 0) or 0)} failed: {first}"


def format_metrics(metrics: dict[str, Any]) -> str:
    """``key=value`` pairs, numbers shortened to 4 significant digits; values JSON alone holds
    (dicts, lists: e.g. :data:`EPISODE_ERRORS`) are left out."""
    parts = []
    for key, value in metrics.items():
        if isinstance(value, (dict, list)):
            continue
        if isinstance(value, float) and math.isfinite(value):
            value = f"{value:.4g}"
        parts.append(f"{key}={value}")
    return " ".join(parts)


def read_metrics(run_dir: Path | str, role: str) -> list[dict[str, Any]]:
    """All complete lines of a role's metrics.jsonl (a torn last line is skipped)."""
    path = metrics_path(run_dir, role)
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            log.warning("%s: skipping a torn metrics line", path)
    return rows
