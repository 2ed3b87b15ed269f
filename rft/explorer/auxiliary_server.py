"""Auxiliary models the explorer tasks share (Trinity's layout: ``engine_num`` engines of a judge
for all rollout engines; :func:`rft.config.auxiliary.shared_auxiliary`).

Each engine is a task of the auxiliary group (``python -m rft.launch.worker auxiliary``, one per
(model, engine) of :func:`rft.config.auxiliary.shared_engines`, on its own GPUs): it starts the
model's vLLM engine with its serving thread (:class:`rft.explorer.auxiliary.AuxiliaryModel`),
an OpenAI-compatible endpoint whose every request is one call (:meth:`rft.workflow.endpoint.
Endpoint.serve`), and publishes where it listens in ``<run>/auxiliary/<model>-<engine>.json``
(atomic; URL, key, model name, host, pid). It serves until every explorer of the run has
finished, or none is alive any more, or a signal, and then removes its file.

The explorer tasks' side (which engines a task calls, its handles on them) is
:mod:`rft.explorer.shared_auxiliary`.
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import signal
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from rft import atomic
from rft.config.auxiliary import shared_engines
from rft.config.schema import Config
from rft.entry import config_parser, run_command, setup_logging
from rft.errors import EXIT_OK, ConfigError
from rft.explorer.auxiliary import AuxiliaryModel
from rft.explorer.shared_auxiliary import POLL_S, START_WAIT_S, address_file
from rft.placement import TaskRank, auxiliary_rank
from rft.stages import load_stage
from rft.sync.heartbeat import explorers_finished, read_heartbeats, starting_explorers
from rft.workflow.endpoint import BIND_HOST_ENV, Endpoint
from rft.workflow.model import ModelWrapper

log = logging.getLogger(__name__)

# ----------------------------------------------------------------------------- the server


@dataclass(frozen=True)
class ServedEngine:
    """Which engine this auxiliary task serves."""

    model: int  # index in explorer.auxiliary_models
    engine: int  # of that model's engine_num
    rank: TaskRank


def served_engine(cfg: Config, env: dict[str, str]) -> ServedEngine:
    """The (model, engine) of this task from its rank in the auxiliary group."""
    rank = auxiliary_rank(env)
    engines = shared_engines(cfg)
    if rank.count != len(engines):
        raise ConfigError(
            f"the auxiliary task group has {rank.count} tasks ({rank.count_var}) but the config "
            f"shares {len(engines)} auxiliary engines (explorer.auxiliary_models whose "
            "engine_num differs from explorer.rollout_model.engine_num): launch it with "
            "rft-launch or rft-run, which size the group"
        )
    model, engine = engines[rank.rank]
    return ServedEngine(model, engine, rank)


class AuxiliaryServer:
    """One shared engine, its endpoint and its address file."""

    def __init__(self, cfg: Config, served: ServedEngine, engine: Any = None):
        self.cfg, self.served = cfg, served
        self.model = AuxiliaryModel(cfg, served.model, engine, first_gpu=0)
        host = os.environ.get(BIND_HOST_ENV) or "0.0.0.0"
        self.endpoint = Endpoint(self.model.path, host)
        reachable = socket.gethostname() if host == "0.0.0.0" else host
        self.base_url = f"http://{reachable}:{self.endpoint.port}"
        self.key = f"rft-auxiliary-{secrets.token_hex(16)}"
        self._calls = itertools.count()
        self.endpoint.serve(self.key, self._one_call)
        self.file = address_file(cfg.run_dir, served.model, served.engine)
        self.file.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_json(
            self.file,
            {
                "base_url": self.base_url,
                "api_key": self.key,
                "model_name": self.model.path,
                "host": reachable,
                "pid": os.getpid(),
                "started": time.time(),
            },
        )
        log.info(
            "%s engine %d serves the explorers at %s (%s)",
            self.model.key,
            served.engine,
            self.base_url,
            self.file,
        )

    @contextmanager
    def _one_call(self) -> Iterator[ModelWrapper]:
        call = next(self._calls)
        handle = self.model.handle(call, f"shared-{call}", None)
        try:
            yield handle
        finally:
            self.model.ended(call)

    def serve(self, stop: threading.Event, join_wait_s: float = START_WAIT_S) -> str:
        """Serve until the explorers are done (every one that joined finished, or none is
        alive after some joined), none joined within ``join_wait_s``, or ``stop``; returns why
        it stopped."""
        timeout = self.cfg.explorer.heartbeat_timeout_s
        run_dir = self.cfg.run_dir
        start = time.monotonic()
        while not stop.wait(POLL_S):
            if explorers_finished(run_dir, timeout):
                return "every explorer finished"
            statuses = read_heartbeats(run_dir, timeout)
            starting = starting_explorers(run_dir, timeout)
            if statuses and not any(s.live for s in statuses) and not starting:
                return "no explorer is alive"
            if not statuses and not starting and time.monotonic() - start > join_wait_s:
                return f"no explorer joined within {join_wait_s:.0f} s"
        return "stopped"

    def close(self) -> None:
        """Remove the address file (unless a newer server of this engine replaced it), stop
        serving."""
        try:
            if self.key in self.file.read_text():
                self.file.unlink(missing_ok=True)
        except FileNotFoundError:
            pass
        self.endpoint.close()
        self.model.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m rft.launch.worker auxiliary --config F``: serve one shared engine."""
    setup_logging()
    args = config_parser(
        "python -m rft.launch.worker auxiliary",
        "Serve one engine of an auxiliary model the explorer tasks share.",
        stage=True,
        take_over=True,
    ).parse_args(argv)
    return run_command(lambda: serve(load_stage(args.config, args.overrides, args.stage)))


def serve(cfg: Config) -> int:
    """The auxiliary task's body: start the engine, serve it, clean up."""
    if not shared_engines(cfg):
        raise ConfigError(
            "this config shares no auxiliary model (no explorer.auxiliary_models entry has an "
            "engine_num other than explorer.rollout_model.engine_num in mode both or explore): "
            "there is no engine for an auxiliary task to serve"
        )
    os.environ.update(cfg.explorer.env_vars)
    served = served_engine(cfg, dict(os.environ))
    stop = threading.Event()

    def _stop(signum: int, _frame: Any) -> None:
        log.warning("signal %d: the shared auxiliary engine stops", signum)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, _stop)
    server = AuxiliaryServer(cfg, served)
    try:
        why = server.serve(stop)
        log.info("shared auxiliary engine done (%s): %d calls", why, server.endpoint.calls)
    finally:
        server.close()
    return EXIT_OK
