"""Generative auxiliary models in an explorer task: the ``explorer.auxiliary_models`` entries
whose folder is a causal LM (:func:`rft.models.auxiliary_kinds`), e.g. an LLM-as-a-judge that
workflow classes call.

Each one gets its own vLLM engine in this process (:class:`rft.explorer.engine.AuxiliaryEngine`:
its own GPUs, or the explorer's CPUs next to the rollout engine), a thread of its own that
serves the engine, the calls of every episode as its requests (:class:`EngineCalls`; only that
thread touches that engine), and an OpenAI-compatible endpoint started on first use
(:class:`rft.workflow.endpoint.Endpoint`). Data in: a config. Data out: per episode, one
:class:`~rft.workflow.model.ModelWrapper` per model (:meth:`AuxiliaryModel.handle`), in config
order: the workflow's ``auxiliary_models``. Nothing it answers is trained on (its handles' replies
never reach a buffer) and it never receives weights.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Optional

from rft.config.auxiliary import auxiliary_tp, shared_auxiliary
from rft.config.schema import Config
from rft.explorer.calls import EngineCalls
from rft.explorer.engine import AuxiliaryEngine
from rft.explorer.shared_auxiliary import SharedAuxiliary
from rft.models import GENERATIVE, auxiliary_kinds, check_shared_kinds
from rft.placement import explorer_rank, scorer_gpu_index
from rft.workflow.conversation import ChatTemplate
from rft.workflow.endpoint import BIND_HOST_ENV, Endpoint
from rft.workflow.model import ModelWrapper
from rft.workflow.task import GenerationConfig

log = logging.getLogger(__name__)

SERVE_WAIT_S = 1.0  # the serving thread's longest sleep between checks for a stop


class AuxiliaryModel:
    """One generative auxiliary model of this explorer task: its engine, its serving thread,
    its endpoint (on first use), and the handles episodes call it through."""

    def __init__(
        self, cfg: Config, index: int, engine: Any = None, first_gpu: Optional[int] = None
    ):
        """Start ``explorer.auxiliary_models[index]``'s engine (``engine``: a stand-in with
        :class:`rft.explorer.engine.Requests`' methods, for tests) and its serving thread, on the
        task's GPUs from ``first_gpu`` (default: after the rollout engine's and the earlier
        models')."""
        model = cfg.explorer.auxiliary_models[index]
        self.key = f"explorer.auxiliary_models[{index}]"
        self.path = model.model_path
        if first_gpu is None:
            rollout_tp = cfg.explorer.rollout_model.tensor_parallel_size
            first_gpu = scorer_gpu_index(rollout_tp, auxiliary_tp(cfg), index)
        self.engine = engine or AuxiliaryEngine(model, self.key, first_gpu)
        self.service = EngineCalls(self.engine)
        self.template = model_template(self.path, model.enable_thinking)
        # vLLM's sampling defaults; a call without max_tokens: max_response_tokens, else up to
        # the context
        self.defaults = GenerationConfig(max_tokens=model.max_response_tokens)
        self._endpoint: Optional[Endpoint] = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._serve, daemon=True, name=f"rft-auxiliary-{index}"
        )
        self._thread.start()

    def handle(self, episode: int, run_name: str, time_limit_s: Optional[float]) -> ModelWrapper:
        """Episode ``episode``'s handle on this model (its calls fail once :meth:`ended`)."""
        self.service.started(episode)
        model = ModelWrapper(self.service.channel(episode), self.template, self.defaults, self.path)
        model.endpoint_factory = self.endpoint
        model.run_name = run_name
        model.time_limit_s = time_limit_s
        return model

    def ended(self, episode: int) -> None:
        """The episode is done or stopped: its waiting calls fail."""
        self.service.ended(episode)

    def endpoint(self) -> Endpoint:
        """This model's OpenAI-compatible endpoint, started on first use (named by its folder,
        as vLLM's server names a model); a key it hands out is one episode's."""
        with self._lock:
            if self._endpoint is None:
                self._endpoint = Endpoint(self.path, os.environ.get(BIND_HOST_ENV))
                log.info("%s (%s): endpoint at %s", self.key, self.path, self._endpoint.base_url)
            return self._endpoint

    def close(self) -> None:
        """Stop serving (calls waiting then are never answered) and close the endpoint."""
        self._stop.set()
        self._thread.join(timeout=2 * SERVE_WAIT_S)
        with self._lock:
            if self._endpoint is not None:
                self._endpoint.close()
                self._endpoint = None

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                self.service.serve_once(SERVE_WAIT_S)
            except Exception:  # an engine step failed: its calls' episodes time out and report it
                log.exception("%s: an engine step serving its calls failed", self.key)


def model_template(path: str, enable_thinking: Optional[bool]) -> ChatTemplate:
    """The model's own chat template (not the policy's): its tokenizer, loaded for its handles
    (the engine's own is used by the serving thread meanwhile)."""
    from transformers import AutoTokenizer

    return ChatTemplate(AutoTokenizer.from_pretrained(path), None, enable_thinking)


# One set per process and settings: an explorer that runs again in this process (tests, stages
# with the same judges) reuses the engines, as it reuses the rollout engine.
_STARTED: dict[tuple, list[AuxiliaryModel]] = {}
_START_LOCK = threading.Lock()


def auxiliary_models(cfg: Config) -> list[AuxiliaryModel | SharedAuxiliary]:
    """This process's generative auxiliary models of ``cfg``, in config order, started on the
    first call: an engine of its own, or for a model the explorer tasks share
    (:func:`rft.config.auxiliary.shared_auxiliary`) the way to its engines in the auxiliary
    task group. Reward models and a distillation teacher are not among them: they score."""
    models = cfg.explorer.auxiliary_models
    if not models:
        return []
    rollout = cfg.explorer.rollout_model
    task = explorer_rank(os.environ).rank
    # what decides the list: the entries, where they run (shared or not), and this task's rank
    settings = (
        tuple(repr(m) for m in models),
        rollout.tensor_parallel_size,
        rollout.engine_num,
        cfg.mode,
        task,
    )
    with _START_LOCK:
        if settings not in _STARTED:
            kinds = auxiliary_kinds(cfg)
            check_shared_kinds(cfg, kinds)
            shared = set(shared_auxiliary(cfg))
            _STARTED[settings] = [
                SharedAuxiliary(cfg, i, task, rollout.engine_num)
                if i in shared
                else AuxiliaryModel(cfg, i)
                for i, kind in enumerate(kinds)
                if kind == GENERATIVE
            ]
        return _STARTED[settings]
