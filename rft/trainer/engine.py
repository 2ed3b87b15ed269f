"""DeepSpeed ZeRO for the trainer: the only module that imports ``deepspeed``.

Data in: the typed config (``trainer.*``, ``algorithm.optimizer``, ``model.model_path``) and
``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` from torchrun or srun (none: a single process). Data out:
an :class:`Actor` (the policy, and with ``advantage_fn: ppo`` the critic), an optional frozen
:class:`Reference`, per-token log-probs (and values) of micro-batches, 16-bit weights gathered
on rank 0, and DeepSpeed checkpoints. CUDA + NCCL on GPU nodes, CPU + gloo without a GPU.
"""

from __future__ import annotations

import json
import logging
import os
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

if not torch.cuda.is_available():  # device and backend come from DeepSpeed's accelerator
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import torch.distributed as dist  # noqa: E402
from deepspeed.accelerator import get_accelerator  # noqa: E402

from rft import placement  # noqa: E402
from rft.algo.logprobs import logprobs_from_hidden, logprobs_from_logits  # noqa: E402
from rft.config.queries import lora_config  # noqa: E402
from rft.config.schema import Config, LoRAConfig, OptimizerConfig  # noqa: E402
from rft.errors import CheckpointError, ConfigError  # noqa: E402
from rft.models import rope_overrides  # noqa: E402
from rft.safetensors_io import (  # noqa: E402
    SINGLE_FILE,
    plan_shards,
    shard_file_names,
    write_index,
    write_safetensors,
)
from rft.safetensors_io import TensorSpec as FileTensor  # noqa: E402
from rft.trainer import sequence_parallel  # noqa: E402
from rft.trainer.attention import (  # noqa: E402
    FLEX_ATTENTION,
    flash_attn_installed,
    packed_attention,
)
from rft.trainer.batching import COMPILED_LENGTH_MULTIPLE, MetricSums, MicroBatch  # noqa: E402
from rft.trainer.lr_schedule import lr_multiplier, warmup_steps  # noqa: E402

log = logging.getLogger(__name__)

PUBLISH_SHARD_BYTES = 5 << 30  # weight files of a published folder: at most this each
# Graphs each compiled layer may keep: batch dim 1 or more (dynamo specialises 1), attention
# mask or none (transformers drops an all-ones mask), grad or no-grad pass, with headroom.
COMPILED_GRAPHS_PER_LAYER = 16
VALUE_HEAD_SEED = 0  # a critic's new value head is the same in every run (and on every rank)


# ----------------------------------------------------------------------------- distributed


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    sp_size: int = 1  # ranks per sequence group (rft.trainer.sequence_parallel); 1: none

    @property
    def dp_rank(self) -> int:
        """This rank's data-parallel share: the ranks of a sequence group take the same rows."""
        return placement.sequence_group_layout(self.rank, self.world_size, self.sp_size)[0]

    @property
    def dp_size(self) -> int:
        """Data-parallel shares of each step (the trainer's ranks / the sequence group size)."""
        return placement.sequence_group_layout(self.rank, self.world_size, self.sp_size)[1]


def init_distributed(timeout_s: float = 1800.0) -> DistInfo:
    """Join the process group (torchrun/srun variables, or a group of one).

    ``timeout_s`` bounds every collective: the other ranks wait in one while rank 0 waits for
    experiences, so it must exceed ``synchronizer.sync_timeout``.
    """
    os.environ.update(placement.torch_env_from_slurm(os.environ))
    if "RANK" not in os.environ:
        os.environ.update(placement.single_process_env())
    accel = get_accelerator()
    backend = "nccl" if accel.device_name() == "cuda" else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if accel.device_name() == "cuda":
        accel.set_device(local_rank)
    deepspeed.init_distributed(dist_backend=backend, timeout=timedelta(seconds=timeout_s))
    device = torch.device(accel.device_name(local_rank))
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, device, backend)


def barrier() -> None:
    dist.barrier()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """``obj`` from rank ``src`` on every rank (pickled)."""
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (a process without a group: its own)."""
    if not dist.is_initialized():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def reduce_metric_sums(sums: MetricSums) -> dict[str, float]:
    """A step's metrics: every rank's micro-batch sums combined (collective)."""
    total = MetricSums()
    for part in all_gather_objects(sums):
        total.merge(part)
    return total.result()


def all_reduce_max(value: int) -> int:
    t = torch.tensor([value], dtype=torch.long, device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def _comm_device() -> torch.device:
    accel = get_accelerator()
    return (
        torch.device(accel.current_device_name())
        if accel.device_name() == "cuda"
        else torch.device("cpu")
    )


def teardown(exit_code: int = 0) -> None:
    """End the process group, then leave without running interpreter exit (DESIGN: gloo
    ZeRO-3 teardown race)."""
    if dist.is_initialized():
        try:
            dist.barrier()
            dist.destroy_process_group()
        except Exception as e:  # noqa: BLE001 - the run is over; report and leave
            log.warning("process group teardown: %s", e)
    logging.shutdown()
    os._exit(exit_code)


# ----------------------------------------------------------------------------- configs


def ds_config(
    cfg: Config,
    world_size: int,
    on_cpu: bool,
    *,
    train: bool = True,
    offload_params: bool = False,
    offload_optimizer: bool | None = None,
    optim: OptimizerConfig | None = None,
    grad_clip: float | None = None,
) -> dict[str, Any]:
    """The DeepSpeed config dict of the actor (``train``), of the critic (``train`` with its
    own ``optim``, ``grad_clip`` and offload) or of the reference model."""
    t = cfg.trainer
    opt = optim or cfg.algorithm.optimizer
    offload_optimizer = t.optimizer_offload if offload_optimizer is None else offload_optimizer
    zero: dict[str, Any] = {"stage": t.zero_stage}
    hidden = model_hidden_size(cfg.model.model_path)
    if hidden is not None:
        # DeepSpeed's default bucket, 5e8 elements, is a buffer as large as a small model's
        # whole gradient; transformers' "auto" (h^2 elements) cut one into ~400 all-reduces per
        # backward, each a round trip on gloo (measured slower); so h^2, at least 2^25
        zero["reduce_bucket_size"] = max(hidden * hidden, MIN_REDUCE_BUCKET)
    if t.zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
        if hidden is not None:
            zero.update(zero3_gather_settings(hidden, world_size, offload_params and not on_cpu))
    if on_cpu and (offload_params or (train and offload_optimizer)):
        log.info("offload settings have no effect on CPU: everything already is in CPU memory")
    if offload_params and not on_cpu:
        if t.zero_stage != 3:
            raise ConfigError(
                f"trainer.param_offload needs trainer.zero_stage=3 (got "
                f"{t.zero_stage}); ZeRO-1/2 keep full parameters on each GPU"
            )
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if train and offload_optimizer and not on_cpu:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "train_batch_size": world_size,
        "zero_optimization": zero,
        "bf16": {"enabled": t.precision == "bf16"},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if train:
        params: dict[str, Any] = {
            "lr": opt.lr,
            "betas": list(opt.betas),
            "weight_decay": opt.weight_decay,
            "adam_w_mode": opt.optimizer_type == "adamw",
        }
        # torch's Adam(W) ("torch_adam"), fused kernels on GPUs: DeepSpeed's own FusedAdam is
        # JIT-compiled on each node's first step (~1 min); optimizer states offloaded to the CPU
        # keep DeepSpeed's CPU Adam (a compiled op, vectorised; its build cache is node-local).
        params["torch_adam"] = on_cpu or not offload_optimizer
        if params["torch_adam"] and not on_cpu:
            params["fused"] = True
        config.update(
            # the caller drives accumulation: every backward adds to the gradients, every step
            # is one optimizer update, so micro-batch counts may vary per step
            managed_gradient_accumulation=False,
            gradient_clipping=float(t.grad_clip if grad_clip is None else grad_clip),
            zero_allow_untested_optimizer=True,
            zero_force_ds_cpu_optimizer=False,
            optimizer={
                "type": "AdamW" if opt.optimizer_type == "adamw" else "Adam",
                "params": params,
            },
        )
    return config


MIN_REDUCE_BUCKET = 2**25  # elements: 128 MiB of float32 gradients


def zero3_gather_settings(hidden_size: int, world_size: int, offload_params: bool) -> dict:
    """ZeRO-3's gather schedule for a model of ``hidden_size``: transformers' "auto" values
    (prefetch buckets of 0.9 h^2 elements, tensors under 10 h elements
    (norms, biases) kept whole), communication overlapped with compute. On one rank there is
    nothing to partition over, so every parameter stays whole (no gather per micro-batch)
    unless parameters are offloaded to the CPU, which persistence would undo."""
    persist = 10 * hidden_size
    if world_size == 1 and not offload_params:
        persist = 2**62  # larger than any tensor: all persistent, no gathers
    return {
        "overlap_comm": True,
        "stage3_prefetch_bucket_size": int(0.9 * hidden_size * hidden_size),
        "stage3_param_persistence_threshold": persist,
    }


def model_hidden_size(path: str) -> int | None:
    """``hidden_size`` of the model folder's ``config.json`` (None: not there or not given)."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    hidden = config.get("hidden_size", config.get("text_config", {}).get("hidden_size"))
    return int(hidden) if isinstance(hidden, int) else None


def attention_implementation(cfg: Config, dtype: torch.dtype | None = None) -> str | None:
    """The attention kernels the trainer's models load with (None: transformers' default,
    SDPA): for packed micro-batches (``trainer.padding_free``) those of
    :func:`rft.trainer.attention.packed_attention` (FlashAttention-2, else flex_attention on a
    GPU; SDPA with a block-diagonal mask, which loses the fused causal kernel, on CPU).
    ``dtype``: a frozen model's own (a float32 teacher gets no FlashAttention-2, whose kernels
    take bf16 only); None: the model trains in ``trainer.precision``."""
    if not cfg.trainer.padding_free:
        return None
    precision = cfg.trainer.precision  # packed_attention tells "bf16" from the others
    if dtype is not None:
        precision = "bf16" if dtype == torch.bfloat16 else "fp32"
    choice = packed_attention(torch.cuda.is_available(), flash_attn_installed(), precision)
    if choice == FLEX_ATTENTION:
        log.info(
            "trainer.padding_free: packed sequences attend with flex_attention and a block "
            "mask (FlashAttention-2 needs the flash_attn package and bf16)"
        )
    return choice


def _load_model(
    path: str,
    dtype: torch.dtype,
    config: dict[str, Any],
    *,
    value_head: bool = False,
    attention: str | None = None,
    overrides: dict[str, Any] | None = None,
):
    """HF ``from_pretrained`` (a causal LM, or with ``value_head`` a token-classification model
    with one label: a critic) with ``attention`` kernels (None: the default) and the model
    config's ``overrides`` (:func:`rft.models.rope_overrides`); under ZeRO-3 with
    ``HfDeepSpeedConfig`` alive (partitioned load with real weights; ``deepspeed.zero.Init``
    alone would skip HF's weight loading)."""
    kernels = {"attn_implementation": attention} if attention else {}
    kernels.update(overrides or {})
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForTokenClassification,
    )
    from transformers.integrations import HfDeepSpeedConfig

    keep_alive = HfDeepSpeedConfig(config) if config["zero_optimization"]["stage"] == 3 else None
    if value_head:  # veRL's critic: the LM body plus a freshly initialised score head [H, 1]
        with torch.random.fork_rng(devices=[]):  # the run's own random state is left as it was
            torch.manual_seed(VALUE_HEAD_SEED)
            head_config = AutoConfig.from_pretrained(path, num_labels=1, **(overrides or {}))
            head_config.classifier_dropout = (
                0.0  # transformers' default before the head is 0.1; veRL's 0
            )
            model = AutoModelForTokenClassification.from_pretrained(
                path,
                dtype=dtype,
                config=head_config,
                **({"attn_implementation": attention} if attention else {}),
            )
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kernels)
    model.config.use_cache = False
    sequence_parallel.check_attention(model, path)
    return model, keep_alive


# ----------------------------------------------------------------------------- actor


@dataclass
class Actor:
    """A DeepSpeed engine being trained: the policy, or the critic (:func:`build_critic`)."""

    engine: Any  # deepspeed.DeepSpeedEngine
    zero_stage: int
    hf_ds_config: Any  # HfDeepSpeedConfig kept alive for ZeRO-3 (None otherwise)
    lora: bool = False  # a PEFT model: only the adapter trains, publishes and is checkpointed

    @property
    def module(self) -> torch.nn.Module:
        return self.engine.module


def build_actor(cfg: Config, info: DistInfo, total_optimizer_steps: int | None) -> Actor:
    """The policy as a DeepSpeed engine with AdamW and the warm-up/decay schedule."""
    on_cpu = info.device.type == "cpu"
    config = ds_config(cfg, info.world_size, on_cpu, offload_params=cfg.trainer.param_offload)
    return _build_engine(
        cfg,
        cfg.model.model_path,
        config,
        cfg.algorithm.optimizer,
        cfg.trainer.gradient_checkpointing,
        total_optimizer_steps,
        value_head=False,
        lora=lora_config(cfg),
    )


def build_critic(cfg: Config, info: DistInfo, total_optimizer_steps: int | None) -> Actor:
    """The critic (``model.critic_model_path`` with a one-label token-classification head) as
    its own DeepSpeed engine: its optimizer, schedule, gradient clip, offload and gradient
    checkpointing from ``trainer.trainer_config.critic`` (each null falls back to the policy's)."""
    critic, t = cfg.trainer.trainer_config.critic, cfg.trainer
    fsdp = critic.model.fsdp_config
    param_offload = t.param_offload if fsdp.param_offload is None else fsdp.param_offload
    on_cpu = info.device.type == "cpu"
    config = ds_config(
        cfg,
        info.world_size,
        on_cpu,
        offload_params=param_offload and t.zero_stage == 3,
        offload_optimizer=fsdp.optimizer_offload,
        optim=critic.optim,
        grad_clip=critic.grad_clip,
    )
    checkpointing = critic.model.enable_gradient_checkpointing
    assert cfg.model.critic_model_path is not None  # rft.config.rules: defaults to model_path
    return _build_engine(
        cfg,
        cfg.model.critic_model_path,
        config,
        critic.optim,
        t.gradient_checkpointing if checkpointing is None else checkpointing,
        total_optimizer_steps,
        value_head=True,
    )


# Models whose decoder layers are compiled: their forwards pad the sequence dimension to a
# multiple of COMPILED_LENGTH_MULTIPLE (see compile_layers).
_COMPILED_MODELS: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()


def compile_layers(model: torch.nn.Module) -> int:
    """``torch.compile`` each decoder layer in place (``trainer.compile_layers``): the classes
    transformers keeps whole when it shards a model (``_no_split_modules``). Parameter names,
    checkpoints and published weights are unchanged. Shapes stay few: batch and sequence dims
    are dynamic from the first compile, and the model's inputs are padded to a multiple of
    :data:`~rft.trainer.batching.COMPILED_LENGTH_MULTIPLE` (divisibility guards then hold for
    every micro-batch), so after the first micro-batches no step recompiles; the log-prob
    path never asks for transformers' output capture, whose hooks break the graph in every
    layer (:func:`forward_logprobs`). Returns the layers compiled."""
    kinds = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in kinds]
    if not layers:
        raise ConfigError(
            f"trainer.compile_layers: {type(model).__name__} names no decoder layer class "
            "(transformers' _no_split_modules); set trainer.compile_layers: false"
        )
    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = max(limit, COMPILED_GRAPHS_PER_LAYER)
    # No duck sizing: a sequence as long as the hidden size would share its symbol, and the
    # first other length would recompile.
    from torch.fx.experimental import _config as shape_config

    shape_config.use_duck_shape = False
    for layer in layers:
        layer.compile(dynamic=True)
    _COMPILED_MODELS.add(model)
    log.info(
        "torch.compile: %d %s layers (compiled on the first step)",
        len(layers),
        "/".join(sorted(kinds)),
    )
    return len(layers)


def _build_engine(
    cfg: Config,
    path: str,
    config: dict[str, Any],
    opt: OptimizerConfig,
    checkpointing: bool,
    total_optimizer_steps: int | None,
    *,
    value_head: bool,
    lora: LoRAConfig | None = None,
) -> Actor:
    dtype = (
        torch.bfloat16
        if cfg.trainer.precision == "bf16" and cfg.trainer.zero_stage == 3
        else torch.float32
    )
    model, keep_alive = _load_model(
        path,
        dtype,
        config,
        value_head=value_head,
        attention=attention_implementation(cfg),
        overrides=rope_overrides(cfg),
    )
    if checkpointing:  # every k-th decoder layer recomputes, the first included
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False},
            every_n_layers=cfg.trainer.gradient_checkpointing_every,
        )
    if cfg.trainer.compile_layers:
        compile_layers(model)
    if lora is not None:
        from rft.trainer.lora import wrap

        model = wrap(model, lora, path)
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        log.info(
            "LoRA r=%d alpha=%d on %s: %d trainable parameters",
            lora.lora_rank,
            lora.lora_alpha,
            lora.target_modules,
            trained,
        )
    warmup = warmup_steps(opt.lr_warmup_steps, opt.lr_warmup_steps_ratio, total_optimizer_steps)
    factor = lr_multiplier(opt.warmup_style, warmup, total_optimizer_steps, opt.min_lr_ratio)

    def scheduler(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)

    trainable = [p for p in model.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=trainable, config=config, lr_scheduler=scheduler
    )
    engine.train()
    return Actor(engine, cfg.trainer.zero_stage, keep_alive, lora=lora is not None)


def current_lr(actor: Actor) -> float:
    return float(actor.engine.get_lr()[0])


def backward(actor: Actor, loss: torch.Tensor) -> None:
    """Accumulate gradients of ``loss`` (already scaled to its share of the batch loss)."""
    actor.engine.backward(loss, scale_wrt_gas=False)


def optimizer_step(actor: Actor) -> float:
    """Reduce, clip, update, advance the lr schedule; return the gradient norm (before clip).
    ZeRO-0 clips without keeping the norm (DeepSpeed's ``clip_fp32_gradients``), so it is
    taken here first, from the gradients the backward already all-reduced."""
    norm = _gradient_norm(actor.module) if actor.zero_stage == 0 else None
    actor.engine.step()
    if norm is None:
        norm = actor.engine.get_global_grad_norm()
    return float(norm) if norm is not None else float("nan")


def _gradient_norm(module: torch.nn.Module) -> float | None:
    """The L2 norm of ``module``'s gradients (each parameter once), None without any."""
    grads = [p.grad.detach() for p in module.parameters() if p.grad is not None]
    if not grads:
        return None
    return float(
        torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    )


# ----------------------------------------------------------------------------- reference


@dataclass
class Reference:
    module: (
        Any  # a plain module (ZeRO 0-2), a DeepSpeed inference engine (ZeRO-3), or LoRA's policy
    )
    offload: bool  # kept in CPU memory, moved to the device for each use (ZeRO 0-2 on GPU)
    device: torch.device
    hf_ds_config: Any
    adapter_off: bool = False  # LoRA: the policy's module with its adapter disabled (the base)


def build_reference(
    cfg: Config,
    info: DistInfo,
    actor: Actor | None = None,
    *,
    model_path: str | None = None,
    dtype: torch.dtype | None = None,
) -> Reference:
    """The frozen initial policy for KL terms (partitioned like the actor under ZeRO-3); with
    LoRA the ``actor``'s own base model (its adapter disabled): no second copy. ``model_path``
    in ``dtype``: another frozen model held the same way (the distillation teacher,
    :mod:`rft.trainer.distill`)."""
    if actor is not None and actor.lora:
        return Reference(actor.module, False, info.device, None, adapter_off=True)
    on_cpu = info.device.type == "cpu"
    dtype = dtype or (torch.bfloat16 if cfg.trainer.precision == "bf16" else torch.float32)
    # ZeRO-3 offloads the reference model's partitions; ZeRO 0-2 move it per use (below).
    config = ds_config(
        cfg,
        info.world_size,
        on_cpu,
        train=False,
        offload_params=cfg.trainer.ref_offload and cfg.trainer.zero_stage == 3,
    )
    config["bf16"] = {"enabled": dtype == torch.bfloat16}  # ZeRO-3 partitions in this dtype
    config["fp16"] = {"enabled": dtype == torch.float16}
    attention = attention_implementation(cfg, dtype)
    model, keep_alive = _load_model(
        model_path or cfg.model.model_path,
        dtype,
        config,
        attention=attention,
        overrides=rope_overrides(cfg) if model_path is None else None,
    )
    model.eval().requires_grad_(False)
    if cfg.trainer.zero_stage == 3:
        engine, *_ = deepspeed.initialize(model=model, config=config)
        engine.eval()
        return Reference(engine, False, info.device, keep_alive)
    offload = cfg.trainer.ref_offload and not on_cpu
    model.to("cpu" if offload else info.device)
    return Reference(model, offload, info.device, None)


# ----------------------------------------------------------------------------- forward

# Model types whose causal-LM forward is the decoder, then a bias-free ``lm_head`` on its last
# hidden states (no logit scaling or soft-capping): their log-probs can be taken from the hidden
# states (``logprobs_from_hidden``). Others go through the model's own forward and its logits.
PLAIN_HEAD_MODEL_TYPES = frozenset(
    {"llama", "mistral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3"}
)


def causal_lm(module: Any) -> Any:
    """The transformers model inside ``module`` (a DeepSpeed engine, a PEFT model or itself)."""
    model = getattr(module, "module", module)  # a DeepSpeed engine's model
    return model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT


def plain_head(module: Any) -> torch.nn.Linear | None:
    """The LM head of ``module`` (a DeepSpeed engine, a PEFT model or a plain causal LM) when
    its log-probs may be computed from the decoder's last hidden states: a bias-free linear head
    of a model type in :data:`PLAIN_HEAD_MODEL_TYPES`. Under ZeRO-3 its weight is partitioned;
    :func:`forward_logprobs` runs inside the head's own forward, where ZeRO gathers it."""
    model = causal_lm(module)
    if getattr(getattr(model, "config", None), "model_type", None) not in PLAIN_HEAD_MODEL_TYPES:
        return None
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        return None
    return head


@contextmanager
def _head_forward(head: torch.nn.Module, fn: Callable[[torch.Tensor], Any]) -> Iterator[None]:
    """``head``'s forward replaced by ``fn`` for the block: the model's own forward then computes
    ``fn(last hidden states [B, T, H])`` where it would compute logits. That keeps the work
    inside the head's ZeRO-3 gather (its hooks fetch the weight for the forward and again for
    the backward: once per micro-batch each way) and inside the DeepSpeed engine's forward
    (which hooks its outputs to set up the backward), with no logits and no hidden-state
    capture (transformers' capture hooks break compiled layers' graphs)."""
    head.forward = fn
    try:
        yield
    finally:
        del head.forward  # the class's forward again


def _length_multiple(module: Any) -> int:
    """Sequence dims of ``module``'s inputs are padded to a multiple of this (compiled layers)."""
    return COMPILED_LENGTH_MULTIPLE if causal_lm(module) in _COMPILED_MODELS else 1


def forward_logprobs(
    module: Any, micro: MicroBatch, *, with_entropy: bool, entropy_grad: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ``[B, R]`` of the response tokens (and their entropies) under ``module``; 0
    where ``micro.response_mask`` is 0 (padding and tokens the loss does not count).

    Only counted positions are scored, in float32 chunks that are recomputed in the backward
    (:mod:`rft.algo.logprobs`): with a :func:`plain_head` model from the decoder's last hidden
    states and the head's weight, inside the head's forward (:func:`_head_forward`), so
    ``[tokens, vocab]`` logits exist one chunk at a time; otherwise from the model's logits at
    the counted positions only. The entropy has no graph unless ``entropy_grad`` (an entropy
    term in the loss).

    The logits are divided by ``micro.temperature`` (in float32, as veRL's actor does), one
    per row: for a rollout the temperature it was sampled at (``Experience.temperature``, via
    ``rft.config.queries.scoring_temperature``), and
    the explorer's vLLM reports the log-probs of that same tempered distribution
    (``logprobs_mode: processed_logprobs``), so recomputed old, current, reference and
    behaviour log-probs all describe the distribution sampled from (top-p/top-k truncation
    aside, which only vLLM applies). Expert/SFT rows are data, not samples: temperature 1.
    """
    rows, cols = (micro.response_mask > 0).nonzero(as_tuple=True)  # [M] each
    positions = micro.logit_positions[rows, cols]  # [M] position whose logits predict the token
    inputs = micro.model_inputs(sequence_parallel.length_multiple(_length_multiple(module)))
    sp = sequence_parallel.active()
    if sp is not None:  # this rank holds positions [start, start + t) of each row
        inputs, start = sp.shard(inputs)
        mine = (positions >= start) & (positions < start + inputs["input_ids"].shape[1])
        rows, cols, positions = rows[mine], cols[mine], positions[mine] - start
    seqs = micro.sequence_index()[rows, 0]  # [M] the input row that holds the token
    labels = micro.response_ids[rows, cols]  # [M]
    temperature = micro.temperature
    if isinstance(temperature, torch.Tensor):
        temperature = temperature.to(rows.device)[rows]  # [M]
    entropy_wanted = with_entropy and entropy_grad and torch.is_grad_enabled()
    head = plain_head(module)
    if head is not None:

        def score(hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
            # hidden: [B, T, H], what the head reads; the counted positions only: [M, H]
            return logprobs_from_hidden(
                hidden[seqs, positions],
                head.weight,
                labels,
                temperature=temperature,
                with_entropy=with_entropy,
            )

        with _head_forward(head, score):  # logits_to_keep=0: the head sees every position
            logprob, entropy = module(**inputs, use_cache=False, logits_to_keep=0).logits
    else:
        # The LM head runs only on positions that predict a counted token (never on prompts).
        keep = positions.unique() if positions.numel() else positions.new_zeros(1)  # [K] sorted
        logits = module(**inputs, use_cache=False, logits_to_keep=keep).logits  # [B, K, V]
        logprob, entropy = logprobs_from_logits(
            logits[seqs, torch.searchsorted(keep, positions)],
            labels,
            temperature=temperature,
            with_entropy=with_entropy,
        )
    out = torch.zeros(micro.response_mask.shape, dtype=torch.float32, device=logprob.device)
    logprobs = out.index_put((rows, cols), logprob)  # [B, R]
    if entropy is not None:
        entropy = out.index_put((rows, cols), entropy if entropy_wanted else entropy.detach())
    if sp is not None:  # every rank of the group gets the tokens of all its positions
        logprobs = sequence_parallel.gather_tokens(logprobs, sp)
        if entropy is not None:
            entropy = sequence_parallel.gather_tokens(entropy, sp)
    return logprobs, entropy


def forward_values(module: Any, micro: MicroBatch) -> torch.Tensor:
    """The critic's values ``[B, R]``: V of the state before each response token, read at the
    position whose logits predict it (veRL: ``values[:, -R - 1:-1]``), in float32."""
    inputs = micro.model_inputs(_length_multiple(module))
    values = module(**inputs, use_cache=False).logits.squeeze(-1)  # [B, T] (packed [1, S])
    return values.float()[micro.sequence_index(), micro.logit_positions]  # [B, R]


@torch.no_grad()
def reference_logprobs(ref: Reference, micro: MicroBatch) -> torch.Tensor:
    """Reference log-probs ``[B, R]`` (the module visits the device only for this call)."""
    if ref.adapter_off:
        from rft.trainer.lora import adapter_disabled

        with adapter_disabled(ref.module):
            return forward_logprobs(ref.module, micro, with_entropy=False)[0]
    if ref.offload:
        ref.module.to(ref.device)
    try:
        return forward_logprobs(ref.module, micro, with_entropy=False)[0]
    finally:
        if ref.offload:
            ref.module.to("cpu")


# ----------------------------------------------------------------------------- weights, checkpoints


def gather_weights(actor: Actor) -> dict[str, torch.Tensor] | None:
    """Full 16-bit (or fp32) state dict on rank 0, None elsewhere, each tied tensor once (as an
    HF folder holds it). Collective: call on all ranks."""
    if actor.zero_stage == 3:
        state = actor.engine._zero3_consolidated_16bit_state_dict()  # a tied tensor named twice
        if state is None:
            return None
        held = _hf_tensors(actor)
        return {name: tensor for name, tensor in state.items() if name in held}
    if dist.get_rank() != 0:
        return None
    return without_tied_duplicates(actor.module.state_dict())


def untied(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state_dict`` without the names that alias an earlier tensor (a tied ``lm_head.weight``
    after ``model.embed_tokens.weight``), as ``save_pretrained`` writes it; the tensors as they
    are (aliasing is told by memory, so this runs before any copy)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[tuple[Any, ...]] = set()
    for name, tensor in state_dict.items():
        key = (
            tensor.device,
            tensor.data_ptr(),
            tuple(tensor.shape),
            tensor.stride(),
        )  # same memory
        if key in seen and tensor.numel():
            continue
        seen.add(key)
        out[name] = tensor.detach()
    return out


def without_tied_duplicates(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """:func:`untied`, on CPU."""
    return {name: tensor.cpu() for name, tensor in untied(state_dict).items()}


def save_hf_config(actor: Actor, folder: Path) -> None:
    """The model's ``config.json`` (and generation config) into ``folder``."""
    module = actor.module
    module.config.architectures = [
        type(module).__name__
    ]  # as save_pretrained records it (a critic's head)
    module.config.save_pretrained(folder)
    if getattr(module, "generation_config", None) is not None:
        module.generation_config.save_pretrained(folder)


def save_hf_folder(
    actor: Actor,
    state_dict: dict[str, torch.Tensor] | None,
    folder: Path,
    write_file: Callable = write_safetensors,
) -> None:
    """An HF folder of the gathered weights (rank 0): config, and the weights as
    ``save_pretrained`` names them, or only the config (``state_dict`` None). ``write_file``:
    as in :func:`stream_hf_folder`."""
    save_hf_config(actor, folder)
    if state_dict is not None:
        specs = [FileTensor(name, tuple(t.shape), t.dtype) for name, t in state_dict.items()]
        _write_weight_files(folder, specs, lambda spec: state_dict[spec.name].cpu(), write_file)


def stream_hf_folder(
    actor: Actor, folder: Path | None, write_file: Callable = write_safetensors
) -> None:
    """An HF folder of the live weights, written tensor by tensor as each is gathered, so the
    gather overlaps the write and memory holds one tensor, not a state dict. Collective under
    ZeRO-3: every rank calls it in step, rank 0 with the ``folder`` to write, the others with
    None (they only take part in each parameter's gather). ``write_file``: what writes each
    safetensors file (delta sync codes the tensors instead: ``rft.sync.local.StreamedFolder``)."""
    named = _hf_tensors(actor)
    specs = [FileTensor(name, shape, t.dtype) for name, (shape, t) in named.items()]

    def produce(spec: FileTensor) -> torch.Tensor:
        tensor = named[spec.name][1]
        if actor.zero_stage == 3 and hasattr(tensor, "ds_id"):
            with deepspeed.zero.GatheredParameters([tensor]):
                return tensor.detach().to("cpu", copy=True)  # the gathered copy is freed at exit
        return tensor.detach().cpu()

    if folder is None:
        for spec in specs:
            produce(spec)
        return
    save_hf_config(actor, folder)
    _write_weight_files(folder, specs, produce, write_file)


def _hf_tensors(actor: Actor) -> dict[str, tuple[tuple[int, ...], torch.Tensor]]:
    """name -> (full shape, live tensor) of what an HF folder of the model holds: each parameter
    once (tied ones under their first name) and the persistent buffers."""
    module = actor.module
    if actor.zero_stage != 3:
        return {name: (tuple(t.shape), t) for name, t in untied(module.state_dict()).items()}
    out = {name: (tuple(p.ds_shape), p) for name, p in module.named_parameters()}  # tie: once
    skip = {
        f"{prefix}.{b}" if prefix else b
        for prefix, sub in module.named_modules()
        for b in getattr(sub, "_non_persistent_buffers_set", ())
    }
    out.update(
        (name, (tuple(b.shape), b)) for name, b in module.named_buffers() if name not in skip
    )
    return out


def _write_weight_files(
    folder: Path,
    specs: list[FileTensor],
    produce: Callable[[FileTensor], torch.Tensor],
    write_file: Callable = write_safetensors,
) -> None:
    """``model.safetensors``, or shards of at most :data:`PUBLISH_SHARD_BYTES` and their index."""
    shards = plan_shards(specs, PUBLISH_SHARD_BYTES)
    if len(shards) == 1:
        write_file(folder / SINGLE_FILE, specs, produce)
        return
    names = shard_file_names(len(shards))
    for shard, name in zip(shards, names):
        write_file(folder / name, shard, produce)
    write_index(folder, shards, names)


def gather_adapter(actor: Actor) -> dict[str, torch.Tensor] | None:
    """A LoRA policy's adapter tensors (live names) on rank 0, None elsewhere. Collective."""
    params = [(name, p) for name, p in actor.module.named_parameters() if p.requires_grad]
    if actor.zero_stage == 3:
        with deepspeed.zero.GatheredParameters([p for _, p in params]):
            state = {name: p.detach().to("cpu", copy=True) for name, p in params}
    else:
        state = {name: p.detach().cpu() for name, p in params}
    return state if dist.get_rank() == 0 else None


def save_checkpoint(actor: Actor, folder: Path, tag: str) -> None:
    """DeepSpeed's model and optimizer shards (every rank writes its own); a LoRA policy's
    adapter only (the frozen base is ``model.model_path``). Collective."""
    actor.engine.save_checkpoint(str(folder), tag=tag, exclude_frozen_parameters=actor.lora)


def load_checkpoint(
    actor: Actor, folder: Path, parts: frozenset[str] = frozenset({"optimizer", "extra"})
) -> None:
    """Restore the model from ``folder`` (its ``latest`` tag) and, as ``parts`` says (veRL's
    ``load_contents``), the optimizer (``"optimizer"``) and the lr scheduler (``"extra"``)."""
    path, _client = actor.engine.load_checkpoint(
        str(folder),
        load_optimizer_states="optimizer" in parts,
        load_lr_scheduler_states="extra" in parts,
        load_module_strict=not actor.lora,
    )
    if path is None:
        raise CheckpointError(
            f"DeepSpeed found no checkpoint in {folder}; delete the damaged "
            "global_step folder (and fix latest_checkpointed_iteration.txt) to "
            "resume from an earlier one, or set continue_from_checkpoint: false"
        )
