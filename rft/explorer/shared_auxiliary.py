"""An explorer task's way to the auxiliary models the explorer tasks share (their engines run in
the auxiliary task group: :mod:`rft.explorer.auxiliary_server`).

A shared engine says where it listens in ``<run>/auxiliary/<model>-<engine>.json``
(:func:`address_file`: URL, key, model name). Explorer task ``k`` of ``m`` calls the engines of
:func:`engines_of` in turn, finds each one's file on first use (waiting while the engine starts),
and hands each episode a :class:`~rft.explorer.endpoint_client.ExternalModel` on it: text replies, no
token ids or log-probs, as an auxiliary model's replies are never trained on.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Optional

from rft.config.external import ExternalEndpoint
from rft.config.schema import Config
from rft.errors import RftError
from rft.rundir import AUXILIARY_DIR
from rft.workflow.task import GenerationConfig

log = logging.getLogger(__name__)

POLL_S = 2.0  # how often a server checks whether the explorers are done, and a caller the file
START_WAIT_S = 1800.0  # how long an explorer waits for a shared engine's file (vLLM starting)
WAIT_LOG_S = 60.0  # a waiting explorer says so this often


def address_file(run_dir: Path | str, model: int, engine: int) -> Path:
    """Where engine ``engine`` of auxiliary model ``model`` says where it listens."""
    return Path(run_dir) / AUXILIARY_DIR / f"{model}-{engine}.json"


def engines_of(task: int, tasks: int, engines: int) -> list[int]:
    """The engines of a shared model (``engines`` of them) that explorer task ``task`` of
    ``tasks`` calls, in turn: with fewer engines than tasks engine ``task mod engines``, with
    more every engine ``j`` with ``j mod tasks == task mod tasks``."""
    own = [j for j in range(engines) if j % tasks == task % tasks]
    return own or [task % engines]


class SharedAuxiliary:
    """An explorer task's way to a shared auxiliary model: its engines' endpoints (found in
    their address files on first use), called in turn, one handle per episode."""

    def __init__(self, cfg: Config, index: int, task: int, tasks: int):
        model = cfg.explorer.auxiliary_models[index]
        self.cfg, self.index = cfg, index
        self.key = f"explorer.auxiliary_models[{index}]"
        self.engines = engines_of(task, tasks, model.engine_num)
        self.defaults = GenerationConfig(max_tokens=model.max_response_tokens)
        self._clients: dict[int, Any] = {}
        self._turn = itertools.count()
        self._lock = threading.Lock()

    def handle(self, episode: int, run_name: str, time_limit_s: Optional[float]) -> Any:
        """Episode ``episode``'s handle: the next engine's endpoint, as a model handle."""
        from rft.explorer.endpoint_client import ExternalModel

        engine = self.engines[next(self._turn) % len(self.engines)]
        return ExternalModel(self._client(engine, time_limit_s), self.defaults, self.key)

    def ended(self, episode: int) -> None:
        """Nothing to release: the episode's calls are requests of their own."""

    def close(self) -> None:
        self._clients.clear()

    def _client(self, engine: int, time_limit_s: Optional[float]) -> Any:
        from rft.explorer.endpoint_client import ExternalClient

        with self._lock:
            if engine not in self._clients:
                found = wait_for_address(self.cfg.run_dir, self.index, engine, self.key)
                endpoint = ExternalEndpoint(
                    found["base_url"] + "/v1",
                    found["api_key"],
                    found["model_name"],
                    base_url_env=str(address_file(self.cfg.run_dir, self.index, engine)),
                    api_key_env=str(address_file(self.cfg.run_dir, self.index, engine)),
                )
                self._clients[engine] = ExternalClient(
                    endpoint, timeout_s=time_limit_s or self.cfg.explorer.max_timeout
                )
            return self._clients[engine]


def wait_for_address(run_dir: Path | str, model: int, engine: int, key: str) -> dict[str, Any]:
    """The address file of a shared engine, waiting up to :data:`START_WAIT_S` while it starts
    (saying so every :data:`WAIT_LOG_S`); RftError when it never appears."""
    path = address_file(run_dir, model, engine)
    start = last_log = time.monotonic()
    while True:
        try:
            return json.loads(path.read_text())  # written whole (rft.atomic)
        except FileNotFoundError:
            pass
        now = time.monotonic()
        if now - start > START_WAIT_S:
            raise RftError(
                f"{key}: engine {engine} of this shared auxiliary model never published its "
                f"address ({path}) within {START_WAIT_S:.0f} s: check the auxiliary task's log "
                "(<run>/log/auxiliary-*.log, or the job's output) for why its engine did not "
                "start"
            )
        if now - last_log > WAIT_LOG_S:
            log.info("%s: waiting for engine %d to start (%s)", key, engine, path)
            last_log = now
        time.sleep(POLL_S)
