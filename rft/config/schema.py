"""The run configuration: Trinity-RFT's YAML keys as typed dataclasses, one commented field each.

Owns every key, its type, default and range; :mod:`rft.config.typed_dict` turns a dict into
these classes (unknown keys and bad values raise :class:`~rft.errors.ConfigError` naming the
key path). Derived values and cross-field checks are not here: :mod:`rft.config.rules` fills and
checks them; :mod:`rft.config.load` reads and writes the YAML.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional, Union

from rft.config.names import (
    ADVANTAGE_FN_NAMES,
    ALGORITHM_TYPES,
    ENTROPY_LOSS_FN_NAMES,
    EXPERIENCE_OPERATORS,
    KL_FN_NAMES,
    LOSS_AGG_MODES,
    POLICY_LOSS_FN_NAMES,
    ROLLOUT_CORRECTION_MODES,
    SAMPLE_STRATEGIES,
    SYNC_STYLE_ALIASES,
    SYNC_STYLES,
)
from rft.config.typed_dict import field, from_dict, not_supported
from rft.errors import ConfigError

Mode = Literal["both", "explore", "train", "bench"]
AlgorithmType = Literal[ALGORITHM_TYPES]
SyncStyle = Literal[(*SYNC_STYLES, *SYNC_STYLE_ALIASES)]
AdvantageFn = Literal[ADVANTAGE_FN_NAMES]
PolicyLossFn = Literal[POLICY_LOSS_FN_NAMES]
KlFn = Literal[KL_FN_NAMES]
EntropyLossFn = Literal[ENTROPY_LOSS_FN_NAMES]
LossAggMode = Literal[LOSS_AGG_MODES]
SampleStrategy = Literal[SAMPLE_STRATEGIES]
RolloutCorrectionMode = Literal[ROLLOUT_CORRECTION_MODES]
ExperienceOperatorName = Literal[EXPERIENCE_OPERATORS]
EngineDtype = Literal["bfloat16", "float16", "float32", "auto"]  # vLLM's dtype names
# Trinity's task selectors (trinity/buffer/selector/__init__.py SELECTORS), all built
# (rft.explorer.selectors)
DATA_SELECTORS = ("sequential", "shuffle", "random", "offline_easy2hard", "difficulty_based")
FEATURE_SELECTORS = ("offline_easy2hard", "difficulty_based")  # those reading feature_keys


def _alias(alias: str, value: object, key: str, current: object, default: object) -> object:
    """``key``'s value when Trinity's other spelling ``alias`` may set it: the alias wins over
    the default; two different explicit values raise."""
    if value is None:
        return current
    if current != default and current != value:
        raise ConfigError(f"{alias}={value!r} contradicts {key}={current!r}; set only one")
    return value


@dataclass
class OptimizerConfig:
    lr: float = field(1e-6, gt=0)  # peak learning rate (AdamW)
    lr_warmup_steps: int = field(-1, ge=-1)  # warm-up steps; -1: use lr_warmup_steps_ratio
    lr_warmup_steps_ratio: float = field(0.0, ge=0, le=1)  # warm-up as a fraction of total steps
    min_lr_ratio: float = field(0.0, ge=0, le=1)  # cosine schedule floor, as a fraction of lr
    warmup_style: Literal["constant", "cosine"] = "constant"  # schedule after warm-up
    lr_scheduler_type: Optional[Literal["constant", "cosine"]] = (
        None  # Trinity's newer name of warmup_style (sets it)
    )
    betas: list[float] = field(factory=lambda: [0.9, 0.999])  # AdamW betas
    weight_decay: float = field(0.01, ge=0)  # AdamW decoupled weight decay
    optimizer_type: Literal["adamw", "adam"] = "adamw"  # optimizer

    def __post_init__(self) -> None:
        self.warmup_style = _alias(
            "lr_scheduler_type",
            self.lr_scheduler_type,
            "warmup_style",
            self.warmup_style,
            "constant",
        )


@dataclass
class RolloutCorrectionConfig:
    # veRL's section name; the math is rft.algo.correction, docs/algorithms.md says which to use when.
    mode: RolloutCorrectionMode = (
        "none"  # none | tis (truncated IS) | decoupled (AReaL's decoupled PPO)
    )
    rollout_is_threshold: Optional[float] = field(
        None, ge=1
    )  # tis only: cap C of min(pi_old / pi_rollout, C); unset: 2.0 (veRL's)
    behav_imp_weight_cap: Optional[float] = field(
        None, ge=1
    )  # decoupled only: drop tokens whose weight exceeds it (AReaL's key)


@dataclass
class AlgorithmConfig:
    algorithm_type: AlgorithmType = "grpo"  # preset: fills the *_fn keys left unset
    repeat_times: int = field(1, ge=1)  # samples per task (the group size)
    optimizer: OptimizerConfig = field(factory=OptimizerConfig)  # actor optimizer
    advantage_fn: Optional[AdvantageFn] = None  # advantage estimator (preset if unset)
    advantage_fn_args: dict = field(factory=dict)  # e.g. {epsilon: 1e-6, std_threshold: 0.0}
    policy_loss_fn: Optional[PolicyLossFn] = None  # policy loss (preset if unset)
    policy_loss_fn_args: dict = field(factory=dict)  # e.g. {clip_range: 0.2}
    kl_loss_fn: Optional[KlFn] = None  # KL to the reference model, as a loss term
    kl_loss_fn_args: dict = field(factory=dict)  # e.g. {kl_coef: 0.001}
    kl_penalty_fn: Optional[KlFn] = None  # KL to the reference model, subtracted from rewards
    kl_penalty_fn_args: dict = field(factory=dict)  # e.g. {kl_coef: 0.001}
    entropy_loss_fn: Optional[EntropyLossFn] = None  # entropy bonus
    entropy_loss_fn_args: dict = field(factory=dict)  # e.g. {entropy_coef: 0.0}
    sample_strategy: Optional[SampleStrategy] = None  # "mix": rollouts + expert data (CHORD)
    sample_strategy_args: dict = field(factory=dict)  # e.g. {expert_data_ratio: 0.25}
    loss_agg_mode: Optional[LossAggMode] = None  # how token losses are averaged
    old_logprobs: Literal["recompute", "rollout"] = "recompute"  # old policy log-probs source
    bypass_old_logprobs: Optional[bool] = None  # Trinity's spelling: true = old_logprobs rollout
    rollout_correction: RolloutCorrectionConfig = field(
        factory=RolloutCorrectionConfig
    )  # off-policy correction (async)


@dataclass
class LoRAConfig:
    # Trinity-RFT's model.lora_configs entry (its spelling), plus rft's lora_dropout and train_embeddings.
    name: Optional[str] = None  # the adapter's name (vLLM's lora_name); null: "lora"
    path: Optional[str] = None  # a PEFT adapter folder to start from; null: a new adapter (B = 0)
    base_model_name: Optional[str] = None  # no effect: the base model is model.model_path
    lora_rank: int = field(32, ge=1)  # r
    lora_alpha: int = field(32, ge=1)  # scaling alpha / r
    lora_dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"  # vLLM's lora_dtype
    target_modules: Union[str, list[str]] = "all-linear"  # PEFT's target_modules
    lora_dropout: float = field(0.0, ge=0, le=0.99)  # rft: dropout on the adapter's input
    train_embeddings: bool = False  # rft: true refused (vLLM serves adapters of linear layers only)
    exclude_modules: Optional[Union[str, list[str]]] = None  # PEFT's exclude_modules


@dataclass
class ExternalModelConfig:
    """Trinity's ``model.external_model``: an OpenAI-compatible endpoint evaluated in mode
    bench instead of model.model_path (rft.explorer.external; checks: rft.config.external)."""

    enable: bool = False  # evaluate the endpoint (mode bench only), start no local engine
    base_url_env: str = "OPENAI_BASE_URL"  # env var holding the endpoint's URL (.../v1)
    api_key_env: str = "OPENAI_API_KEY"  # env var holding its API key
    model_name: Optional[str] = None  # the model the endpoint serves (required with enable)

    def __post_init__(self) -> None:
        for key in ("base_url_env", "api_key_env", "model_name"):
            if self.enable and not getattr(self, key):
                raise ConfigError(
                    f"model.external_model.{key} is empty: external_model.enable needs it "
                    "(base_url_env and api_key_env name environment variables, model_name the "
                    "model the endpoint serves)"
                )


@dataclass
class ModelConfig:
    model_path: str = ""  # local Hugging Face model folder (config.json + tokenizer)
    critic_model_path: Optional[str] = None  # critic (advantage_fn ppo = GAE); null: model_path
    max_model_len: Optional[int] = field(None, ge=1)  # prompt + response tokens
    max_prompt_tokens: Optional[int] = field(None, ge=1)  # longer prompts: left out (see below)
    max_response_tokens: Optional[int] = field(None, ge=1)  # generation limit per sample
    min_response_tokens: int = field(1, ge=0)  # generation floor per sample
    enable_prompt_truncation: bool = (
        True  # true: leave out (count) prompts > max_prompt_tokens; false: no prompt limit
    )
    temperature: float = field(
        1.0, ge=0
    )  # sampling temperature (tasksets may override); the trainer scores rollouts at it too
    top_p: float = field(1.0, gt=0, le=1)  # nucleus sampling
    top_k: int = field(-1, ge=-1)  # top-k sampling; -1 disables
    logprobs: int = field(0, ge=0)  # extra top log-probs per token (the sampled one is always kept)
    enable_thinking: Optional[bool] = None  # chat-template switch for thinking models (Qwen3)
    custom_chat_template: Optional[str] = None  # Jinja chat template replacing the tokenizer's
    # a file holding the chat template, read into custom_chat_template when that is unset
    chat_template_path: Optional[str] = None
    repetition_penalty: float = field(1.0, gt=0)  # vLLM's repetition_penalty (1: none)
    # the model config's RoPE settings, for the engine (vLLM's hf_overrides) and the trainer
    rope_scaling: Optional[dict] = None  # e.g. {rope_type: yarn, factor: 4.0, ...}
    rope_theta: Optional[float] = field(None, gt=0)  # RoPE base (null: the model's)
    lora_configs: Optional[list[LoRAConfig]] = (
        None  # train a LoRA adapter (one), sync only the adapter
    )
    fully_sharded_loras: bool = False  # vLLM's fully_sharded_loras (tensor-parallel engines)
    max_cpu_loras: Optional[int] = field(None, ge=1)  # vLLM's max_cpu_loras
    # an OpenAI-compatible endpoint to evaluate (mode bench) instead of a local engine
    external_model: ExternalModelConfig = field(factory=ExternalModelConfig)


@dataclass
class ClusterConfig:
    node_num: int = field(1, ge=1)  # nodes for the whole run
    ray_address: Optional[str] = None  # no effect: rft places its tasks with SLURM, not Ray
    gpu_per_node: int = field(8, ge=0)  # GPUs per node


@dataclass
class FormatConfig:
    prompt_key: str = "prompt"  # dataset column holding the question
    response_key: str = "response"  # dataset column holding the reference answer
    messages_key: Optional[str] = None  # column holding chat messages (instead of prompt/response)
    # SFT/DPO row shape (Trinity's): messages (messages_key: a chat ending with the reply),
    # plaintext (prompt_key/response_key text), chatpair (prompt_key and response_key hold
    # messages); unset: messages when messages_key is set, else plaintext
    prompt_type: Optional[Literal["messages", "plaintext", "chatpair"]] = None
    system_prompt: Optional[str] = None  # replaces the workflow's system prompt
    system_prompt_key: Optional[str] = None  # column holding each row's system prompt (first)
    chosen_key: str = "chosen"  # DPO: column holding the preferred reply
    rejected_key: str = "rejected"  # DPO: column holding the dispreferred reply
    tools_key: str = "tools"  # SFT: column of tool schemas for the chat template (if present)
    chat_template: Optional[str] = None  # SFT/DPO: Jinja chat template replacing the tokenizer's
    enable_concatenated_multi_turn: bool = False  # SFT messages: train on every assistant turn
    enable_thinking: Optional[bool] = (
        None  # SFT/DPO rows' chat template switch (null: model's); on tasksets no effect
    )
    reply_prefix: Optional[str] = None  # text the reply starts with (no effect on SFT/expert rows)
    workflow_key: Optional[str] = (
        None  # column naming each row's workflow (overrides the taskset's)
    )
    reward_fn_key: Optional[str] = None  # column naming each row's reward function


@dataclass
class RolloutArgs:
    temperature: Optional[float] = field(None, ge=0)  # overrides model.temperature
    top_p: Optional[float] = field(None, gt=0, le=1)  # overrides model.top_p
    top_k: Optional[int] = field(None, ge=-1)  # overrides model.top_k
    logprobs: Optional[int] = field(None, ge=0)  # overrides model.logprobs
    max_tokens: Optional[int] = field(None, ge=1)  # overrides model.max_response_tokens
    n: Optional[int] = field(None, ge=1)  # no effect: Trinity fills it from repeat_times (equal)


@dataclass
class DifficultyArgs:
    """``data_selector.kwargs`` of ``difficulty_based`` (Trinity's DifficultyBasedSelector,
    its defaults; rft.explorer.difficulty)."""

    m: int = field(16, ge=1)  # pseudo-count scale: the repeats one observation stands for
    lamb: float = field(0.2, ge=0, le=1)  # forgetting factor of the past estimate
    rho: float = field(0.2, ge=0, le=1)  # weight of the feature-interpolated prediction
    target_reward: float = 1.0  # the pass rate the selector seeks
    tau: float = field(1.0, ge=0)  # softmax temperature of the draw (0: the best scores)
    do_sample: bool = False  # score a Beta sample of each row's pass rate, not its mean
    adaptive_rho: bool = False  # halve rho when the prediction misses by 0.25 on average


@dataclass
class DataSelectorConfig:
    """Trinity's task selection (rft.explorer.selectors); eval tasksets read every row."""

    selector_type: Literal[DATA_SELECTORS] = "sequential"  # training task order
    seed: int = 42  # shuffle/random/difficulty_based seed
    # offline_easy2hard: numeric columns ordering the rows, highest first; difficulty_based:
    # two columns, a weaker and a stronger reference model's pass rate of each row
    feature_keys: list[str] = field(factory=list)
    kwargs: dict = field(factory=dict)  # difficulty_based's settings (DifficultyArgs)

    def __post_init__(self) -> None:
        kind = self.selector_type
        if self.feature_keys and kind not in FEATURE_SELECTORS:
            raise ConfigError(
                f"data_selector.feature_keys: {kind} reads no features; remove them or use "
                "selector_type: offline_easy2hard"
            )
        if kind == "offline_easy2hard" and not self.feature_keys:
            raise ConfigError(
                "data_selector: offline_easy2hard orders the rows by feature_keys: name at "
                "least one numeric column (higher values first)"
            )
        if kind == "difficulty_based":
            if len(self.feature_keys) != 2:
                raise ConfigError(
                    f"data_selector: difficulty_based reads exactly two feature_keys (a weaker "
                    f"and a stronger reference model's pass rate per row), got "
                    f"{self.feature_keys}"
                )
            self.difficulty_args()
        elif self.kwargs:
            raise ConfigError(
                f"data_selector.kwargs: {kind} takes none (in Trinity only difficulty_based "
                "reads them); remove them"
            )

    def difficulty_args(self) -> DifficultyArgs:
        """``kwargs`` typed; ConfigError naming a misspelt or out-of-range setting."""
        return from_dict(DifficultyArgs, self.kwargs, "data_selector.kwargs")


@dataclass
class TasksetConfig:
    name: str = ""  # label in logs and metrics
    storage_type: Literal["file"] = "file"  # tasksets are datasets on disk
    path: str = ""  # dataset folder or parquet/jsonl/json file
    subset_name: Optional[str] = None  # hub-style config folder, e.g. "main" for GSM8K
    split: str = "train"  # split to read
    format: FormatConfig = field(factory=FormatConfig)  # columns and prompt text
    rollout_args: RolloutArgs = field(factory=RolloutArgs)  # sampling overrides
    repeat_times: Optional[int] = field(None, ge=1)  # samples per task; default algorithm's
    data_selector: Optional[DataSelectorConfig] = None  # task order (null: sequential)
    task_selector: Optional[DataSelectorConfig] = None  # deprecated name of data_selector
    default_workflow_type: Optional[str] = None  # overrides explorer_input's
    default_reward_fn_type: Optional[str] = None  # overrides explorer_input's
    workflow_args: dict = field(factory=dict)  # extra arguments for the workflow
    reward_fn_args: dict = field(factory=dict)  # extra arguments for the reward function
    max_retry_times: int = field(3, ge=0)  # no effect: Trinity's SQL read retries (files here)
    max_retry_interval: int = field(1, ge=0)  # no effect: as max_retry_times
    enable_progress_bar: Optional[bool] = None  # no effect: rft shows no bar reading a taskset

    def __post_init__(self) -> None:
        # Trinity v0.6 renamed task_selector to data_selector and still reads the old name.
        if self.task_selector is not None and self.data_selector is not None:
            raise ConfigError(
                f"taskset {self.name or self.path!r}: data_selector and task_selector (its "
                "deprecated name) are both set; keep data_selector only"
            )
        self.data_selector = self.data_selector or self.task_selector or DataSelectorConfig()
        self.task_selector = None


@dataclass
class ExplorerInputConfig:
    taskset: Optional[TasksetConfig] = None  # one training taskset (or use tasksets)
    tasksets: list[TasksetConfig] = field(factory=list)  # several training tasksets
    eval_tasksets: list[TasksetConfig] = field(factory=list)  # evaluated every eval_interval
    default_workflow_type: Optional[str] = None  # e.g. math_workflow
    default_eval_workflow_type: Optional[str] = None  # workflow for eval tasksets
    default_reward_fn_type: Optional[str] = None  # reward by name or "pkg.module:function"


# Trinity's registered priority functions (trinity/buffer/storage: linear_decay,
# decay_limit_randomization; linear_decay_use_count_control_randomization is that one's earlier
# name, still in Trinity's docs); rft.buffer.replay implements them and checks it covers these.
PRIORITY_FN_NAMES = (
    "linear_decay",
    "decay_limit_randomization",
    "linear_decay_use_count_control_randomization",
)


@dataclass
class ReplayBufferConfig:
    enable: bool = False  # reuse experience groups by priority (trainer side, queue storage only)
    priority_fn: Literal[PRIORITY_FN_NAMES] = "linear_decay"  # model_version - decay * use_count
    reuse_cooldown_time: Optional[float] = field(
        None, ge=0
    )  # seconds before a used group may be drawn again; null: each group is used once
    priority_fn_args: dict = field(
        factory=lambda: {"decay": 2.0}
    )  # decay; decay_limit_randomization also use_count_limit, sigma


@dataclass
class ExperienceBufferConfig:
    name: str = "experience_buffer"  # label
    storage_type: Literal["queue", "sql", "file"] = "queue"  # queue: sealed segments on disk
    path: Optional[str] = None  # sqlite:///x.db archive (queue), the db (sql), or a dataset (file)
    capacity: int = field(
        10000, ge=1
    )  # replay buffer size in groups (lowest priority evicted); only with replay_buffer.enable
    replay_buffer: ReplayBufferConfig = field(factory=ReplayBufferConfig)  # prioritized reuse
    use_priority_queue: Optional[bool] = None  # Trinity's older spelling of replay_buffer.enable
    # file datasets (SFT/expert rows): Trinity's reader order; rft reads them in order, so only
    # sequential (rft.config.trinity_rules)
    data_selector: Optional[DataSelectorConfig] = None
    # Trinity's queue read timeout: seconds the trainer waits for experiences before its input
    # ends (null: synchronizer.sync_timeout)
    max_read_timeout: Optional[float] = field(None, gt=0)
    subset_name: Optional[str] = None  # for file datasets (SFT/expert data)
    split: str = "train"  # for file datasets
    format: FormatConfig = field(factory=FormatConfig)  # for file datasets
    # expert data (auxiliary_buffers): passes before the trainer stops (null: it cycles for the
    # whole run; Trinity's default is 1); the experience buffer: no effect, SFT reads
    # buffer.total_epochs
    total_epochs: Optional[int] = field(None, ge=1)
    max_retry_times: int = field(3, ge=0)  # no effect: Trinity's SQL read retries
    max_retry_interval: int = field(1, ge=0)  # no effect: as max_retry_times
    enable_progress_bar: Optional[bool] = None  # no effect: rft shows no bar reading data
    schema_type: Optional[Literal["sft"]] = (
        None  # no effect: file datasets here are read as SFT rows (Trinity's "sft")
    )

    def __post_init__(self) -> None:
        if self.replay_buffer.enable and self.storage_type != "queue":
            raise ConfigError(
                f"{self.name}: replay_buffer.enable needs storage_type: queue (Trinity's replay "
                f"buffer is its queue's), not {self.storage_type!r}; set storage_type: queue or "
                "replay_buffer.enable: false"
            )


@dataclass
class TrainerInputConfig:
    experience_buffer: ExperienceBufferConfig = field(factory=ExperienceBufferConfig)  # input
    auxiliary_buffers: dict[str, ExperienceBufferConfig] = field(factory=dict)  # expert/SFT data


@dataclass
class BufferConfig:
    batch_size: int = field(1, ge=1)  # tasks per explore step
    train_batch_size: Optional[int] = field(None, ge=1)  # experiences per gradient step
    total_epochs: int = field(1, ge=1)  # passes over the training tasksets
    total_steps: Optional[int] = field(None, ge=1)  # stop after this many steps (wins over epochs)
    explorer_input: ExplorerInputConfig = field(factory=ExplorerInputConfig)  # tasksets
    trainer_input: TrainerInputConfig = field(factory=TrainerInputConfig)  # experiences
    max_retry_times: int = field(3, ge=0)  # no effect: older Trinity's SQL read retries
    max_retry_interval: int = field(1, ge=0)  # no effect: as max_retry_times


@dataclass
class RolloutModelConfig:
    engine_type: Literal["vllm", "vllm_async", "external"] = (
        "vllm"  # vllm/vllm_async: rft's one engine; external: model.external_model (bench)
    )
    engine_num: int = field(1, ge=1)  # explorer tasks (one engine each)
    tensor_parallel_size: int = field(1, ge=1)  # GPUs per engine
    gpu_memory_utilization: float = field(0.9, gt=0, le=1)  # vLLM's share of GPU memory
    dtype: EngineDtype = "bfloat16"  # engine dtype
    enable_prefix_caching: bool = False  # reuse KV of shared prompt prefixes
    enable_chunked_prefill: Optional[bool] = None  # vLLM's chunked prefill; null: vLLM's default
    use_v1: bool = True  # no effect: vLLM's V1 engine is the only one
    enforce_eager: bool = False  # no CUDA graphs (always on for CPU engines)
    seed: int = 42  # sampling seed
    max_model_len: Optional[int] = field(None, ge=1)  # defaults to model.max_model_len
    enable_thinking: Optional[bool] = None  # chat-template switch for thinking models
    enable_auto_tool_choice: bool = (
        False  # parse tool calls in chat replies (needs tool_call_parser)
    )
    tool_call_parser: Optional[str] = None  # vLLM tool parser for chat replies, e.g. hermes
    reasoning_parser: Optional[str] = (
        None  # vLLM reasoning parser: chat replies get reasoning_content
    )
    enable_history: bool = False  # no effect: workflow model calls are always recorded
    # An OpenAI-compatible endpoint per explorer for agent code (model.get_openai_client(),
    # model.base_url/api_key, agent_program_workflow); calls with a run's key are trained on.
    enable_openai_api: bool = False
    # vLLM's data/pipeline parallelism inside one engine: 1 only (rft scales with engine_num)
    data_parallel_size: int = field(1, ge=1)
    pipeline_parallel_size: int = field(1, ge=1)  # as data_parallel_size: 1 only
    enable_expert_parallel: bool = False  # vLLM's expert parallelism for MoE models
    extra_engine_args: dict = field(factory=dict)  # more vllm.LLM arguments, as given
    # nccl weight sync: MiB per broadcast (a larger tensor goes alone); null: rft's 256
    weight_sync_buffer_size: Optional[int] = field(None, ge=1)
    # Trinity's per-engine copies of model.* (null: model's); rft reads each as model.<key>
    temperature: Optional[float] = field(None, ge=0)
    top_p: Optional[float] = field(None, gt=0, le=1)  # as model.top_p
    top_k: Optional[int] = field(None, ge=-1)  # as model.top_k
    logprobs: Optional[int] = field(None, ge=0)  # as model.logprobs
    max_prompt_tokens: Optional[int] = field(None, ge=1)  # as model.max_prompt_tokens
    max_response_tokens: Optional[int] = field(None, ge=1)  # as model.max_response_tokens
    min_response_tokens: Optional[int] = field(None, ge=0)  # as model.min_response_tokens
    enable_prompt_truncation: Optional[bool] = None  # as model.enable_prompt_truncation
    repetition_penalty: Optional[float] = field(None, gt=0)  # as model.repetition_penalty


@dataclass
class AuxiliaryModelConfig:
    model_path: str = ""  # a causal LM (a judge), a reward model (a score head), or a teacher
    # the rollout model's engine_num: one engine (generative) or scorer (reward model) in each
    # explorer task; another: a generative model's engines shared by every explorer task, in
    # their own task group; a distillation teacher with another runs in the trainer
    engine_num: int = field(1, ge=1)
    tensor_parallel_size: int = field(1, ge=1)  # GPUs of each, after the rollout engine's
    # a generative model's vLLM share of its GPUs' memory (a reward model: unused)
    gpu_memory_utilization: float = field(0.9, gt=0, le=1)
    enable_thinking: Optional[bool] = None  # chat-template switch
    max_prompt_tokens: Optional[int] = field(None, ge=1)  # prompt limit
    max_response_tokens: Optional[int] = field(None, ge=1)  # a generative model's reply limit
    max_model_len: Optional[int] = field(None, ge=1)  # context limit
    # engine or forward-pass dtype (auto: the checkpoint's); null: bfloat16 on GPUs, float32 on CPUs
    dtype: Optional[EngineDtype] = None
    enable_prefix_caching: bool = False  # a generative model's vLLM prefix cache (else no effect)
    enforce_eager: bool = False  # a generative model's vLLM without CUDA graphs (else no effect)
    seed: int = 42  # a generative model's sampling seed (else no effect)


@dataclass
class ExplorerConfig:
    name: str = "explorer"  # explorer job name; another name joins a run as a new explorer
    runner_per_model: int = field(8, ge=1)  # workflow runs in flight per engine (workflow classes)
    runner_num: Optional[int] = field(None, ge=1)  # older spelling of runner_per_model
    max_timeout: float = field(900.0, gt=0)  # seconds one workflow run may take; then it is stopped
    # run a failed or timed-out workflow run again, from the start, up to this many times
    max_retry_times: int = field(2, ge=0)  # Trinity's default and meaning; 0: run each once
    # rft: dry run and start run each workflow class once on its first task, with a fake model
    first_task_check: bool = True
    env_vars: dict[str, str] = field(factory=dict)  # set in each explorer task's environment
    rollout_model: RolloutModelConfig = field(factory=RolloutModelConfig)  # vLLM engines
    # models next to the explorers: judges for workflow classes, reward models for recipes
    auxiliary_models: list[AuxiliaryModelConfig] = field(factory=list)
    eval_interval: int = field(100, ge=0)  # evaluate every N steps; 0: never
    eval_on_startup: bool = True  # evaluate before the first step
    # no effect: Trinity's split of a task's repeat_times among its runners; rft runs each of a
    # task's runs apart already (runner_per_model in flight)
    max_repeat_times_per_runner: Optional[int] = field(None, ge=1)
    # Trinity v0.6: train batches the explorer holds at once; with partial_rollout it sets
    # max_inflight_samples (batches x batch_size x repeat_times) when that is unset
    max_inflight_batches: Optional[int] = field(None, ge=1)
    bench_on_latest_checkpoint: bool = False  # mode bench: only the newest checkpoint
    heartbeat_interval_s: float = field(10.0, gt=0)  # explorers/<name>.json refresh period
    heartbeat_timeout_s: float = field(120.0, gt=0)  # an older heartbeat means a dead explorer
    # rft: asynchronous runs stream: the next steps' requests enter the engine as earlier ones
    # finish and new weights load between engine steps, requests kept (rft.explorer.steps)
    partial_rollout: bool = False
    # rft: with partial_rollout, the next step is admitted while fewer samples are in flight
    max_inflight_samples: Optional[int] = field(None, ge=1)  # null: one step's samples
    # rft: with partial_rollout, groups whose samples span more weights versions are dropped
    max_version_span: Optional[int] = field(None, ge=0)  # null: keep every group
    # rft: the explorer stops with the first episode's error after this many steps in a row whose
    # every episode failed (after its max_retry_times retries); 0: never
    max_failed_steps: int = field(2, ge=0)
    # rft: ... or when more than this share of the episodes of the last failed_share_window_steps
    # steps failed (checked once that many steps ran); 1.0: never
    max_failed_share: float = field(0.5, ge=0, le=1)
    failed_share_window_steps: int = field(4, ge=1)  # steps max_failed_share looks back over


@dataclass
class SynchronizerConfig:
    sync_method: Literal["checkpoint", "nccl", "memory", "online", "offline"] = (
        "checkpoint"  # weights transport; Trinity's online = nccl, offline = checkpoint
    )
    # when weights move (rft.sync.schedule); Trinity's older dynamic_by_* names are read as these
    sync_style: SyncStyle = "fixed"
    sync_interval: int = field(1, ge=1)  # publish weights every N trainer steps
    # Trinity's per-side intervals (null: sync_interval); a value other than it is refused
    explorer_sync_interval: Optional[int] = field(None, ge=1)
    trainer_sync_interval: Optional[int] = field(None, ge=1)  # as explorer_sync_interval
    sync_offset: int = field(0, ge=0)  # explorer may run N steps ahead of the weights (mode both)
    max_lead_steps: Optional[int] = field(
        None, ge=0
    )  # rft: the same bound for mode explore (null: none)
    sync_timeout: int = field(3600, ge=1)  # seconds to wait for weights/experiences before failing
    weights_versions_to_keep: int = field(2, ge=1)  # newest weights/v* folders kept on disk
    delta_sync: bool = False  # rft: publish weights/v* as XOR+zstd deltas against a full anchor
    delta_anchor_interval: int = field(8, ge=1)  # rft: with delta_sync, a full folder every N
    delta_local_dir: Optional[str] = None  # rft: node-local copies for delta sync (null: $TMPDIR)


@dataclass
class VerlFsdpConfig:
    param_offload: Optional[bool] = None  # -> trainer.param_offload
    optimizer_offload: Optional[bool] = None  # -> trainer.optimizer_offload


@dataclass
class VerlModelConfig:
    use_remove_padding: Optional[bool] = None  # -> trainer.padding_free
    enable_gradient_checkpointing: Optional[bool] = None  # -> trainer.gradient_checkpointing


@dataclass
class VerlRefConfig:
    fsdp_config: VerlFsdpConfig = field(
        factory=VerlFsdpConfig
    )  # param_offload -> trainer.ref_offload
    engine: VerlFsdpConfig = field(factory=VerlFsdpConfig)  # newer veRL's name of fsdp_config
    log_prob_use_dynamic_bsz: Optional[bool] = None  # -> trainer.log_prob_use_dynamic_bsz
    log_prob_max_token_len_per_gpu: Optional[int] = field(
        None, ge=1
    )  # -> trainer.log_prob_max_token_len_per_gpu
    ulysses_sequence_parallel_size: Optional[int] = None  # = trainer's (the policy's layout)


@dataclass
class VerlCheckpointConfig:
    # A full checkpoint holds model, optimizer and extra (trainer state): lists naming all three
    # are what rft does; fewer are warned (saving: rft saves them anyway) or refused (loading);
    # "hf_model" in save_contents -> save_hf_checkpoint always (trinity_rules._check_checkpoint_contents).
    contents: Optional[list[str]] = None  # veRL's older spelling of save_contents
    load_contents: Optional[list[str]] = None  # what a resume restores (model required)
    save_contents: Optional[list[str]] = None  # hf_model: save_hf_checkpoint always


@dataclass
class VerlActorConfig:
    ppo_micro_batch_size_per_gpu: Optional[int] = field(
        None, ge=1
    )  # -> trainer.micro_batch_size_per_gpu
    ppo_epochs: Optional[int] = field(None, ge=1)  # -> trainer.ppo_epochs
    grad_clip: Optional[float] = field(None, ge=0)  # -> trainer.grad_clip
    # Trinity 0.1's loss switch (its examples' veRL files): must agree with policy_loss_fn.
    alg_type: Optional[Literal["ppo", "opmd", "pairwise_opmd", "dpo", "sft"]] = None
    use_dynamic_bsz: Optional[bool] = None  # -> trainer.use_dynamic_bsz
    ppo_max_token_len_per_gpu: Optional[int] = field(None, ge=1)  # -> trainer.max_token_len_per_gpu
    ulysses_sequence_parallel_size: Optional[int] = field(
        None, ge=1
    )  # -> trainer.ulysses_sequence_parallel_size
    optim: Optional[OptimizerConfig] = None  # -> algorithm.optimizer
    fsdp_config: VerlFsdpConfig = field(factory=VerlFsdpConfig)  # -> trainer offload
    engine: VerlFsdpConfig = field(factory=VerlFsdpConfig)  # newer veRL's name of fsdp_config
    checkpoint: VerlCheckpointConfig = field(
        factory=VerlCheckpointConfig
    )  # what a checkpoint holds


@dataclass
class VerlRolloutConfig:
    log_prob_micro_batch_size_per_gpu: Optional[int] = field(
        None, ge=1
    )  # -> trainer.log_prob_micro_batch_size_per_gpu
    log_prob_use_dynamic_bsz: Optional[bool] = None  # -> trainer.log_prob_use_dynamic_bsz
    log_prob_max_token_len_per_gpu: Optional[int] = field(
        None, ge=1
    )  # -> trainer.log_prob_max_token_len_per_gpu


@dataclass
class VerlActorRolloutRefConfig:
    hybrid_engine: Optional[bool] = None  # no effect: rft never colocates rollout and training
    model: VerlModelConfig = field(factory=VerlModelConfig)  # actor model switches
    actor: VerlActorConfig = field(factory=VerlActorConfig)  # actor update
    ref: VerlRefConfig = field(factory=VerlRefConfig)  # reference model (its fsdp offload)
    rollout: VerlRolloutConfig = field(factory=VerlRolloutConfig)  # log-prob recompute


@dataclass
class VerlCriticModelConfig:
    path: Optional[str] = None  # -> model.critic_model_path
    use_remove_padding: Optional[bool] = (
        None  # no effect: the critic packs as the actor (trainer.padding_free)
    )
    enable_gradient_checkpointing: Optional[bool] = (
        None  # critic's (null: trainer.gradient_checkpointing)
    )
    fsdp_config: VerlFsdpConfig = field(
        factory=VerlFsdpConfig
    )  # critic's offload (null: the trainer's)


@dataclass
class VerlCriticConfig:
    model: VerlCriticModelConfig = field(factory=VerlCriticModelConfig)  # value model
    optim: OptimizerConfig = field(factory=OptimizerConfig)  # critic's own AdamW and schedule
    ppo_micro_batch_size_per_gpu: Optional[int] = field(
        None, ge=1
    )  # null: trainer.micro_batch_size_per_gpu
    cliprange_value: float = field(0.5, gt=0)  # value clip around the old values
    grad_clip: Optional[float] = field(None, ge=0)  # null: trainer.grad_clip
    # No effect: the critic's passes batch like the actor's (trainer.use_dynamic_bsz, ...).
    use_dynamic_bsz: Optional[bool] = None  # no effect
    ppo_max_token_len_per_gpu: Optional[int] = None  # no effect
    forward_max_token_len_per_gpu: Optional[int] = None  # no effect
    ulysses_sequence_parallel_size: Optional[int] = None  # > 1 refused: not split for critics
    checkpoint: VerlCheckpointConfig = field(
        factory=VerlCheckpointConfig
    )  # what a checkpoint holds


@dataclass
class VerlTrainerSection:
    critic_warmup: int = field(
        0, ge=0
    )  # first N steps train only the critic (needs advantage_fn ppo)
    balance_batch: Optional[bool] = None  # no effect: micro-batches are packed by token budget
    max_actor_ckpt_to_keep: Optional[int] = field(None, ge=1)  # -> trainer.max_checkpoints_to_keep
    max_critic_ckpt_to_keep: Optional[int] = field(
        None, ge=1
    )  # the critic is saved in the same global_step_N: must match the actor's
    # veRL's older switch: true keeps the newest checkpoint only (max_checkpoints_to_keep 1)
    remove_previous_ckpt_in_save: bool = False

    def __post_init__(self) -> None:
        if self.remove_previous_ckpt_in_save:  # as veRL and Trinity 0.5: one of each kept
            for key in ("max_actor_ckpt_to_keep", "max_critic_ckpt_to_keep"):
                if getattr(self, key) not in (None, 1):
                    raise ConfigError(
                        f"trainer.trainer_config.trainer.remove_previous_ckpt_in_save: true keeps "
                        f"one checkpoint, but {key}={getattr(self, key)}; set only one of them"
                    )
            self.max_actor_ckpt_to_keep = 1
        actor, critic = self.max_actor_ckpt_to_keep, self.max_critic_ckpt_to_keep
        if actor is not None and critic is not None and actor != critic:
            raise ConfigError(
                f"trainer.trainer_config.trainer.max_critic_ckpt_to_keep={critic} differs from "
                f"max_actor_ckpt_to_keep={actor}: rft saves both models in one global_step_N "
                "folder; give them the same value"
            )


@dataclass
class VerlTrainerConfig:
    actor_rollout_ref: VerlActorRolloutRefConfig = field(factory=VerlActorRolloutRefConfig)  # actor
    critic: VerlCriticConfig = field(factory=VerlCriticConfig)  # value model (advantage_fn ppo)
    trainer: VerlTrainerSection = field(factory=VerlTrainerSection)  # veRL trainer flags


@dataclass
class TrainerConfig:
    trainer_type: Literal["deepspeed", "verl"] = "deepspeed"  # no effect: always DeepSpeed ZeRO
    # Trinity's veRL backend: fsdp and fsdp2 read as DeepSpeed ZeRO (megatron refused)
    trainer_strategy: Optional[Literal["fsdp", "fsdp2"]] = None
    use_remove_padding: Optional[bool] = None  # Trinity's spelling of padding_free
    balance_batch: Optional[bool] = None  # no effect: micro-batches are packed by token budget
    critic_warmup: Optional[int] = field(None, ge=0)  # -> trainer_config.trainer.critic_warmup
    save_interval: int = field(0, ge=0)  # full checkpoint every N steps (0: only at the end)
    grad_clip: float = field(1.0, ge=0)  # max gradient norm (0: no clipping)
    use_dynamic_bsz: bool = True  # micro-batches by token budget instead of fixed size
    max_token_len_per_gpu: int = field(16384, ge=1)  # token budget per micro-batch
    padding_free: bool = False  # pack each micro-batch's sequences into one row (no padding)
    micro_batch_size_per_gpu: int = field(1, ge=1)  # fixed micro-batch size (use_dynamic_bsz false)
    log_prob_micro_batch_size_per_gpu: Optional[int] = field(
        None, ge=1
    )  # log-prob passes (None: as above)
    # the log-prob passes (old policy, reference, critic values), which need no gradients: their
    # micro-batches by token budget (null: use_dynamic_bsz) of log_prob_max_token_len_per_gpu
    # tokens (null: max_token_len_per_gpu), veRL's rollout/ref.log_prob_* keys
    log_prob_use_dynamic_bsz: Optional[bool] = None
    log_prob_max_token_len_per_gpu: Optional[int] = field(None, ge=1)  # null: the actor's budget
    ppo_epochs: int = field(1, ge=1)  # optimisation passes over each batch
    ppo_max_token_len_per_gpu: Optional[int] = field(
        None, ge=1
    )  # Trinity 0.2's name of max_token_len_per_gpu (sets it)
    # ranks that split each sequence (Ulysses: rft.trainer.sequence_parallel); 1: whole per GPU
    ulysses_sequence_parallel_size: int = field(1, ge=1)
    enable_preview: bool = True  # no effect: Trinity's rollout preview in wandb
    zero_stage: int = field(2, ge=0, le=3)  # DeepSpeed ZeRO stage
    param_offload: bool = False  # ZeRO-3 parameters in CPU memory
    optimizer_offload: bool = False  # optimizer states in CPU memory
    ref_offload: bool = True  # reference model kept in CPU memory between uses
    gradient_checkpointing: bool = True  # recompute activations in backward
    gradient_checkpointing_every: int = field(
        1, ge=1
    )  # of those, every k-th decoder layer (1: all)
    compile_layers: bool = (
        False  # torch.compile each decoder layer of the trained models (not ZeRO-3)
    )
    precision: Literal["bf16", "fp32"] = "bf16"  # training dtype (fp16 is refused on CPU)
    save_hf_checkpoint: Literal["last", "always", "never"] = "last"  # write actor/huggingface/
    max_checkpoints_to_keep: Optional[int] = field(None, ge=1)  # older global_step_* removed
    total_steps: Optional[int] = field(None, ge=1)  # veRL's total_training_steps; see buffer
    max_staleness_versions: Optional[int] = field(None, ge=0)  # drop older groups (any mode)
    trainer_config: VerlTrainerConfig = field(factory=VerlTrainerConfig)  # veRL-style settings

    def __post_init__(self) -> None:
        self.max_token_len_per_gpu = _alias(
            "trainer.ppo_max_token_len_per_gpu",
            self.ppo_max_token_len_per_gpu,
            "trainer.max_token_len_per_gpu",
            self.max_token_len_per_gpu,
            16384,
        )


MonitorType = Literal["tensorboard", "console", "wandb", "mlflow", "swanlab"]  # rft.monitor sinks


@dataclass
class MonitorConfig:
    # One name (Trinity) or a list (rft: [tensorboard, wandb]); metrics.jsonl is always written.
    monitor_type: Union[MonitorType, list[MonitorType]] = "tensorboard"  # metric sinks
    flush_interval_s: float = field(10.0, gt=0)  # TensorBoard flush period
    # evaluation metrics also as std/max/min over each taskset's tasks (Trinity's detailed_stats)
    detailed_stats: bool = False


@dataclass
class SlurmConfig:
    partition: Optional[str] = None  # --partition
    account: Optional[str] = None  # --account
    qos: Optional[str] = None  # --qos
    time: str = field(
        "24:00:00",
        text_only="quote it, e.g. time: '12:00:00' (YAML reads an "
        "unquoted 12:00:00 as the number 43200)",
    )  # --time, [D-]HH:MM:SS
    constraint: Optional[str] = None  # --constraint, e.g. a100
    signal_delay_s: int = field(300, ge=0)  # --signal=USR1@N: checkpoint N s before the limit
    requeue: bool = True  # requeue after preemption or the warning signal
    cpus_per_gpu: Optional[int] = field(None, ge=1)  # --cpus-per-gpu
    mem: Optional[str] = None  # --mem per node, e.g. 200G
    setup: list[str] = field(factory=list)  # shell lines before srun (module load ...)
    extra_sbatch_args: list[str] = field(factory=list)  # more #SBATCH lines, e.g. "--exclusive"


# Trinity's data_processor (trinity/common/config.py DataProcessorConfig) with the experience
# operators rft applies as the trainer reads a batch (rft.trainer.experience_ops).
@dataclass
class NoOperatorArgs:
    """mask_response_truncated and invalid_reward_filter take no arguments."""


@dataclass
class DynamicSamplingArgs:
    metric_key: str = "accuracy"  # reward part that says right or wrong (the reward if absent)
    correct_threshold: float = 0.0  # a response is right when that score is above this


@dataclass
class RewardThresholdArgs:
    threshold: float = 0.0  # reward_filter: keep reward >= it; reward_std_filter: group std > it


OPERATOR_ARGS: dict[str, type] = {
    "mask_response_truncated": NoOperatorArgs,
    "dapo_dynamic_sampling": DynamicSamplingArgs,
    "reward_filter": RewardThresholdArgs,
    "reward_std_filter": RewardThresholdArgs,
    "invalid_reward_filter": NoOperatorArgs,
    "pass_rate_calculator": NoOperatorArgs,
}
_OPERATORS_PATH = "data_processor.experience_pipeline.operators"


@dataclass
class OperatorConfig:
    name: Optional[ExperienceOperatorName] = None  # the operator (required)
    args: dict = field(factory=dict)  # dapo_dynamic_sampling: metric_key, correct_threshold; ...

    def typed_args(
        self, path: str = _OPERATORS_PATH
    ) -> NoOperatorArgs | DynamicSamplingArgs | RewardThresholdArgs:
        """``args`` as the operator's typed arguments; ConfigError naming ``path`` if wrong."""
        return from_dict(OPERATOR_ARGS[self.name], self.args, f"{path}.args")


@dataclass
class ExperiencePipelineConfig:
    operators: list[OperatorConfig] = field(factory=list)  # applied in order to each batch read
    # no effect: the buffer's segments are the operators' input until a checkpoint releases
    # them (buffer.trainer_input.experience_buffer.path: sqlite:///FILE archives what was read)
    save_input: bool = True

    def __post_init__(self) -> None:
        for i, op in enumerate(self.operators):
            if op.name is None:
                raise ConfigError(
                    f"{_OPERATORS_PATH}[{i}].name is missing: name one of "
                    f"{', '.join(EXPERIENCE_OPERATORS)}"
                )
            op.typed_args(f"{_OPERATORS_PATH}[{i}]")


@dataclass
class DataProcessorConfig:
    experience_pipeline: Optional[ExperiencePipelineConfig] = field(
        factory=ExperiencePipelineConfig
    )  # operators on rollouts before training


@dataclass
class StageConfig:
    stage_name: str = ""  # label; each stage runs after the previous one
    mode: Optional[Mode] = None  # mode of this stage
    overrides: dict = field(factory=dict)  # other top-level sections, merged onto the base


@dataclass
class Config:
    project: str = "rft"  # run directory: <checkpoint_root_dir>/<project>/<group>/<name>
    group: str = ""  # Trinity's experiment group: a folder between project and name ("": none)
    name: str = "run"  # experiment name
    mode: Mode = "both"  # both: synchronous; explore / train: separate async jobs; bench: eval
    checkpoint_root_dir: str = "./checkpoints"  # on the shared filesystem
    continue_from_checkpoint: bool = True  # resume from the run directory's newest checkpoint
    # no effect: Trinity's GPU-memory advice at start; rft's dry run checks memory (rft-run)
    ignore_validator_suggestions: bool = False
    ray_namespace: Optional[str] = None  # no effect: rft's run directory names a run, not Ray
    stages: list[StageConfig] = field(factory=list)  # e.g. SFT warm-up then RFT
    algorithm: AlgorithmConfig = field(factory=AlgorithmConfig)  # RL algorithm
    model: ModelConfig = field(factory=ModelConfig)  # policy model and generation limits
    cluster: ClusterConfig = field(factory=ClusterConfig)  # GPUs of the run
    buffer: BufferConfig = field(factory=BufferConfig)  # tasks in, experiences out
    explorer: ExplorerConfig = field(factory=ExplorerConfig)  # rollout workers
    synchronizer: SynchronizerConfig = field(factory=SynchronizerConfig)  # weight sync
    trainer: TrainerConfig = field(factory=TrainerConfig)  # DeepSpeed trainer
    monitor: MonitorConfig = field(factory=MonitorConfig)  # metrics sinks
    slurm: SlurmConfig = field(factory=SlurmConfig)  # sbatch resources
    data_processor: DataProcessorConfig = field(factory=DataProcessorConfig)  # experience ops
    # Not a key: the mapping the user wrote (overrides merged), onto which each stage merges its
    # keys, so that a stage re-derives what the rules derived for the base (rft.config.load).
    written: dict = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def run_dir(self) -> Path:
        """Absolute run directory, Trinity's ``checkpoint_job_dir``
        ``<checkpoint_root_dir>/<project>/<group>/<name>`` (an empty group adds no folder;
        relative roots are relative to the working directory)."""
        root = Path(self.checkpoint_root_dir).expanduser()
        return (root / self.project / self.group / self.name).absolute()

    @property
    def run_label(self) -> str:
        """``project/group/name`` with empty parts left out (Trinity's ray_namespace)."""
        return "/".join(part for part in (self.project, self.group, self.name) if part)

    def labelled_tasksets(
        self, *, training: bool = True, evaluation: bool = True
    ) -> list[tuple[str, TasksetConfig]]:
        """Tasksets (training, then eval) with their key paths, for messages."""
        inputs = self.buffer.explorer_input
        out = []
        if training:
            out += [("buffer.explorer_input.taskset", inputs.taskset)] if inputs.taskset else []
            out += [
                (f"buffer.explorer_input.tasksets[{i}]", taskset)
                for i, taskset in enumerate(inputs.tasksets)
            ]
        if evaluation:
            out += [
                (f"buffer.explorer_input.eval_tasksets[{i}]", taskset)
                for i, taskset in enumerate(inputs.eval_tasksets)
            ]
        return out

    def training_tasksets(self) -> list[TasksetConfig]:
        """The training tasksets, whether written as ``taskset`` or ``tasksets``."""
        return [taskset for _, taskset in self.labelled_tasksets(evaluation=False)]
