"""Trinity-RFT's and veRL's own names for config keys and choices that rft does not act on.

Data only (no imports). :mod:`rft.config.typed_dict` reads :data:`KEYS` and :data:`CHOICES`,
:mod:`rft.workflow.registry` reads :data:`WORKFLOWS` and :mod:`rft.workflow.rewards` reads
:data:`REWARD_FNS`: a name found here is refused as "Trinity's `X` is not supported by rft:
<what to do>" (never a "did you mean" guess); only other names get the nearest-name hint.
A name rft implements is in its schema, so an entry here is reached only while rft lacks it.
The ``VERL_*`` tables name veRL keys with no effect, which :mod:`rft.config.verl_keys` removes.
"""

from __future__ import annotations

# Where the names come from (modelscope/Trinity-RFT; repository moved to agentscope-ai/Trinity-RFT).
SOURCES = {
    "config": "trinity/common/config.py at c3d094d (v0.3 era), plus keys of older releases "
    "that its examples still use (buffer.max_retry_times, trainer.ppo_max_token_len_per_gpu, "
    "synchronizer.sync_iteration_interval)",
    "verl": "trinity/common/verl_config.py at 3f14a35 and 02667a1 (veRL's ppo_trainer config as "
    "Trinity embeds it under trainer.trainer_config; synchronize_config for what it overwrites) "
    "and the examples' trainer_config sections and trainer_config_path files",
    "algorithms": "trinity/algorithm/__init__.py ALGORITHM_TYPE at cb89407, the policy_loss_fn/"
    "advantage_fn/sample_strategy registries of trinity/algorithm/*/__init__.py",
    "workflows": "trinity/common/workflows/__init__.py WORKFLOWS default_mapping (v0.3.x)",
    "rewards": "trinity/common/rewards/__init__.py REWARD_FUNCTIONS default_mapping (v0.3.x)",
    "operators": "trinity/buffer/operators/__init__.py EXPERIENCE_OPERATORS at 139d1c4 and "
    "DataProcessorConfig / ExperiencePipelineConfig of trinity/common/config.py",
}

_NO_RAY = "rft runs without Ray (SLURM tasks and files); remove it"
_AUTO = "Trinity sets it itself (its comment says DO NOT SET); remove it"
_SQL_RETRY = "remove it (rft reads datasets from files; the SQLite archive has one writer)"
_SAMPLING = (
    "set it once in model.{key} (or per taskset in rollout_args.{key}); the engine is "
    "configured from those"
)
_LENGTH = "set model.{key} (the engine and the trainer read one value)"
_NO_MULTIMODAL = "rft trains text-only models; remove it and give a text dataset"
_TASKSET_AUTO = "Trinity derives it from buffer.{key}; set that instead"
_SERVE = (
    "mode serve (the explorer as a standing server for outside agents) is not built in rft; "
    "train an agent program through the explorer's endpoint instead: "
    "explorer.rollout_model.enable_openai_api: true with agent_program_workflow or a "
    "WorkflowWithRecording (docs/agentic-workflows.md: Agents through the OpenAI API)"
)
_PIPELINE_BUFFERS = (
    "rft's operators read the trainer's one experience buffer and hand the batch to the "
    "trainer; remove it"
)
_WRITE_A_FILTER = (
    "rft applies mask_response_truncated, dapo_dynamic_sampling and the reward filters only; "
    "shape rewards in your workflow or reward function ('package.module:function') instead"
)
_LOG_PROB_PASS = (
    "the log-prob passes use trainer.use_dynamic_bsz / max_token_len_per_gpu like the actor; "
    "set those"
)


def _lengths(*keys: str) -> dict[str, str]:
    return {key: _LENGTH.format(key=key) for key in keys}


def _sampling(*keys: str) -> dict[str, str]:
    return {key: _SAMPLING.format(key=key) for key in keys}


# Trinity's FormatConfig (config.py); rft's FormatConfig holds the ones it reads.
_FORMAT = {
    "image_key": _NO_MULTIMODAL,
    "video_key": _NO_MULTIMODAL,
}

# Trinity's TasksetConfig / StorageConfig (config.py).
_TASKSET = {
    "index": "rft resumes the task position from explorer_meta.json; remove it",
    "is_eval": "list evaluation sets under buffer.explorer_input.eval_tasksets instead",
    "batch_size": _TASKSET_AUTO.format(key="batch_size"),
    "total_epochs": _TASKSET_AUTO.format(key="total_epochs"),
    "total_steps": _TASKSET_AUTO.format(key="total_steps"),
    "ray_namespace": _NO_RAY,
    "wrap_in_ray": _NO_RAY,
    "tokenizer_path": "rft tokenizes with model.model_path's tokenizer; remove it",
    "schema_type": _AUTO,
}

# Trinity's ExperienceBufferConfig (config.py).
_EXPERIENCE_BUFFER = {
    "index": "rft keeps its read cursor in trainer_meta.json; remove it",
    "batch_size": "set buffer.train_batch_size",
    "tokenizer_path": "rft tokenizes with model.model_path's tokenizer; remove it",
    "total_steps": "set buffer.total_steps",
    "ray_namespace": _NO_RAY,
}

# Trinity's InferenceModelConfig keys that default to model.<key> (its ExplorerConfigValidator
# set_if_none): on explorer.rollout_model rft reads them as model.<key> (one value for both;
# rft.config.trinity_rules), so they are not refused there.
ROLLOUT_MODEL_MIRRORS = (
    "temperature",
    "top_p",
    "top_k",
    "logprobs",
    "max_prompt_tokens",
    "max_response_tokens",
    "min_response_tokens",
    "enable_prompt_truncation",
    "repetition_penalty",
)

# Trinity's InferenceModelConfig (config.py): explorer.rollout_model and auxiliary_models.
_INFERENCE_MODEL = {
    "name": "AgentScope's name for the model; rft's endpoint serves model.model_path under its "
    "own name (model.model_path in workflows): remove it",
    "trust_remote_code": "rft loads models with transformers' own classes; remove it",
    "gpu_per_engine": "Trinity derives it from the parallel sizes (DO NOT SET): set "
    "tensor_parallel_size",
    "enable_multimodal": _NO_MULTIMODAL,
    "enable_log_requests": "rft's endpoint logs no requests (each call is recorded as an "
    "experience); remove it",
    "base_port": "rft's endpoint takes a free port on each explorer and gives workflows its "
    "URL (model.base_url, get_openai_client()); remove it",
    "api_key": "rft's endpoint takes each run's key (task.api_key, model.api_key) to tell the "
    "runs apart; remove it",
    "external_model_config": "set model.external_model (Trinity copies it here)",
    "nnodes": "one engine spans the GPUs of one node in rft (tensor_parallel_size); engines "
    "across nodes are not built: remove it",
    "node_rank": _AUTO,
    "enable_return_routed_experts": "set algorithm.enable_router_replay (Trinity copies it here)",
    "engine_id": _AUTO,
    "ray_namespace": _NO_RAY,
    "ray_actor_name": _NO_RAY,
    "sync_method": "set synchronizer.sync_method (Trinity copies it here)",
    "checkpoint_job_dir": _AUTO,
    "cuda_visible_devices": "rft places each engine on its SLURM task's GPUs; remove it",
    "enable_runtime_lora_updating": "set model.lora_configs (Trinity derives it)",
    "rope_scaling": "set model.rope_scaling (Trinity copies it here)",
    "rope_theta": "set model.rope_theta (Trinity copies it here)",
    **_sampling("repetition_penalty"),
    **_lengths("enable_prompt_truncation"),
    "model_path": "set model.model_path (Trinity fills this key from it)",
    "ignore_eos": "rft always stops at the end-of-sequence token; remove it",
    "chat_template": "set model.custom_chat_template",
    "bundle_indices": _NO_RAY,
    "enable_lora": "set model.lora_configs (Trinity derives this key from it)",
    "lora_modules": "set model.lora_configs (Trinity derives this key from it)",
    "lora_kwargs": "set model.lora_configs (Trinity derives this key from it)",
    **_sampling("temperature", "top_p", "top_k", "logprobs"),
    **_lengths("max_prompt_tokens", "max_response_tokens", "min_response_tokens"),
}
_AUXILIARY_MODEL = {
    **_INFERENCE_MODEL,
    "model_path": "",  # rft reads it (listed here only to be dropped below)
    "engine_type": "no effect: a generative auxiliary model runs on vLLM's offline engine, a "
    "reward model scores with transformers; remove it",
    "enable_chunked_prefill": "remove it (a generative auxiliary model's engine keeps vLLM's "
    "default)",
    "use_v1": "no effect: vLLM's V1 engine is the only one; remove it",
    "enable_history": "remove it: an auxiliary model's calls are never recorded for training",
    "enable_openai_api": "remove it: a generative auxiliary model always has its "
    "OpenAI-compatible endpoint (model.get_openai_client()); a reward model only scores",
    "enable_auto_tool_choice": "remove it: auxiliary models' replies are not parsed for tool calls",
    "tool_call_parser": "remove it: auxiliary models' replies are not parsed for tool calls",
    "reasoning_parser": "remove it: auxiliary models' replies are not parsed for reasoning",
}
for _key in ("model_path", "max_prompt_tokens", "max_response_tokens"):  # fields rft reads
    del _AUXILIARY_MODEL[_key]
_AUXILIARY_MODEL.update(
    {
        key: "an auxiliary model's engine has rft's defaults; remove it"
        for key in (
            "data_parallel_size",
            "pipeline_parallel_size",
            "enable_expert_parallel",
            "extra_engine_args",
            "weight_sync_buffer_size",
        )
    }
)

_VERL_FSDP = {
    "wrap_policy": "DeepSpeed ZeRO shards whole parameters (no FSDP wrap policy); remove it",
    "min_num_params": "DeepSpeed ZeRO shards whole parameters (no FSDP wrap policy); remove it",
    "fsdp_size": "set trainer.zero_stage (DeepSpeed ZeRO over all trainer GPUs); remove it",
    "offload_policy": "set trainer.param_offload / optimizer_offload",
    "model_dtype": "set trainer.precision",
}

# rft schema class -> {Trinity/veRL key defined at that place: what to do in rft}.
KEYS: dict[str, dict[str, str]] = {
    "Config": {
        "checkpoint_job_dir": "set checkpoint_root_dir, project, group and name (the run "
        "directory is <checkpoint_root_dir>/<project>/<group>/<name>)",
        "service": "rft starts no outside services (Data-Juicer); remove it",
        "log": "rft logs with Python logging to <run>/log/ (level: RFT_LOG_LEVEL); remove it",
        "algorithm_type": "move it under algorithm: (algorithm.algorithm_type), as Trinity now "
        "spells it",
        "data": "this is Trinity's pre-0.2 layout: move the dataset to "
        "buffer.explorer_input.taskset (path, split, format)",
        "cod": "Trinity's research connect-the-dots (CoD) task packing is not built in rft; "
        "remove it and run the CoD workflows' tasks one per row",
    },
    "OptimizerConfig": {
        "clip_grad": "set trainer.grad_clip",
        "total_training_steps": "set buffer.total_steps",
        "lr_warmup_init": "warm-up starts from 0 in rft; remove it",
        "num_cycles": "rft's cosine schedule has one cycle; remove it",
        "beta1": "set algorithm.optimizer.betas: [beta1, beta2]",
        "beta2": "set algorithm.optimizer.betas: [beta1, beta2]",
    },
    "ModelConfig": {
        "tinker": "Tinker (a hosted training service) is not an rft backend: rft trains on your "
        "cluster's GPUs with DeepSpeed; remove it",
        "checkpoint_path": "this is Trinity's pre-0.2 layout: set checkpoint_root_dir",
        "trust_remote_code": "rft loads models with transformers' own classes; remove it",
    },
    "ClusterConfig": {
        **{
            key: "Trinity derives it from node_num, gpu_per_node and the engines (DO NOT SET); "
            "rft's split is in the dry run's plan: remove it"
            for key in (
                "total_gpu_num",
                "rollout_gpu_num",
                "auxiliary_model_gpu_num",
                "explorer_gpu_num",
                "trainer_gpu_num",
                "trainer_node_num",
                "trainer_gpu_num_per_node",
            )
        },
    },
    "LoRAConfig": {"is_dummy": _AUTO},
    "DataProcessorConfig": {
        "task_pipeline": "rft runs no Data-Juicer task pipeline: prepare the taskset before "
        "the run (e.g. rft-data) and point buffer.explorer_input.taskset at it",
        "data_processor_url": "older Trinity's Data-Juicer service address; rft runs no "
        "Data-Juicer service: prepare the taskset before the run and remove it",
        "data_workflow_url": "older Trinity's Data-Juicer service address; rft runs no "
        "Data-Juicer service: prepare the taskset before the run and remove it",
    },
    "ExperiencePipelineConfig": {
        "input_save_path": "rft keeps no copy of the operators' input beside the buffer; remove "
        "it (set buffer.trainer_input.experience_buffer.path: sqlite:///FILE to archive what "
        "the trainer consumed)",
        "inputs": _PIPELINE_BUFFERS,
        "output": _PIPELINE_BUFFERS,
    },
    "FormatConfig": _FORMAT,
    "TasksetConfig": _TASKSET,
    "ExperienceBufferConfig": _EXPERIENCE_BUFFER,
    "BufferConfig": {
        "explore_batch_size": "older Trinity's name of buffer.batch_size (tasks per explore "
        "step); set that",
        "explorer_output": _AUTO,
        "tokenizer_path": _AUTO,
        "pad_token_id": _AUTO,
        "cache_dir": _AUTO,
        "train_dataset": "this is Trinity's pre-0.2 layout: use "
        "buffer.trainer_input.experience_buffer",
    },
    # the length and sampling keys rft reads on the rollout model too (rft.config.trinity_rules)
    "RolloutModelConfig": {
        k: v for k, v in _INFERENCE_MODEL.items() if k not in ROLLOUT_MODEL_MIRRORS
    },
    "AuxiliaryModelConfig": _AUXILIARY_MODEL,
    "AlgorithmConfig": {
        "add_strategy": "older Trinity's experience grouping, removed from Trinity (its "
        "advantage functions group by task now); remove it and choose algorithm.advantage_fn",
        "mu": "older Trinity's MIX weight: set algorithm.policy_loss_fn_args.mu",
        "enable_router_replay": "replaying the explorer's MoE routing in the trainer is not "
        "built in rft; remove it",
    },
    "ExplorerConfig": {
        "mode": _AUTO,
        "runner_prepare_concurrency": "rft prepares no runners apart (each workflow run starts "
        "when its task is scheduled); remove it",
        "runner_prepare_max_retries": "rft prepares no runners apart (each workflow run starts "
        "when its task is scheduled); remove it",
        "concurrent_mode": "rft runs each of a task's repeat_times runs as its own workflow run "
        "(explorer.runner_per_model in flight per engine); remove it",
        "proxy_port": _SERVE,
        "db_url": _SERVE,
        "over_rollout": "ending a step before all its tasks finish is not built in rft; remove "
        "it (explorer.partial_rollout streams steps so slow runs do not stall the engine)",
        "dynamic_timeout": "rft's timeout per run is explorer.max_timeout, fixed; remove it",
        "runner_state_report_interval": "rft reports the explorer's progress in its heartbeat "
        "(rft-status); remove it",
        "api_port": _SERVE,
        "listen_address": _SERVE,
        "service_status_check_interval": _SERVE,
        "min_running_model_num": _SERVE,
        "engine_type": "move it under explorer.rollout_model (Trinity's pre-0.2 layout)",
        "engine_num": "move it under explorer.rollout_model (Trinity's pre-0.2 layout)",
    },
    "TrainerConfig": {
        "name": "rft's trainer is one role named trainer; remove it",
        "grad_offload": "set trainer.optimizer_offload (DeepSpeed offloads the optimizer step "
        "with its states)",
        "offload_policy": "set trainer.param_offload / optimizer_offload",
        "megatron": "rft trains with DeepSpeed ZeRO (no Megatron tensor/pipeline parallelism); "
        "remove it and set trainer.zero_stage",
        "trust_remote_code": _AUTO,
        "fix_actor_microbatch_loss_scale": "rft scales each micro-batch's loss by its share of "
        "the batch's tokens already; remove it",
        "save_strategy": "rft saves a full checkpoint every trainer.save_interval steps; remove it",
        "algorithm_type": "move it to algorithm.algorithm_type",
        "sft_warmup_steps": "add an SFT stage under stages: (algorithm_type: sft)",
        "sft_warmup_iteration": "add an SFT stage under stages: (algorithm_type: sft)",
        "eval_interval": "set explorer.eval_interval",
    },
    "MonitorConfig": {
        "monitor_args": "rft's wandb/mlflow/swanlab sinks read their own environment variables "
        "(WANDB_*, MLFLOW_TRACKING_URI, SWANLAB_*); remove it",
        "enable_ray_timeline": _NO_RAY,
        "cache_dir": "rft writes metrics under <run>/monitor/; remove it",
        "project": "set the top-level project (Trinity's pre-0.2 layout)",
        "name": "set the top-level name (Trinity's pre-0.2 layout)",
    },
    "SynchronizerConfig": {
        "sync_iteration_interval": "Trinity renamed it synchronizer.sync_interval; use that",
        "group_name": "rft forms its NCCL group itself (rendezvous files in the run "
        "directory); remove it",
        "wait_for_checkpoint": "an explorer always loads the newest complete weights; remove it",
        "explorer_world_size": _AUTO,
        "ray_namespace": _NO_RAY,
    },
    # veRL, as Trinity embeds it under trainer.trainer_config (verl_config.py). Keys Trinity
    # overwrites or never reads are in VERL_IGNORED below (accepted, no effect), not here.
    "VerlTrainerConfig": {
        "reward_model": "set explorer.auxiliary_models (reward models) or a reward function",
        "custom_reward_function": "set default_reward_fn_type: 'package.module:function'",
        "ray_init": _NO_RAY,
    },
    "VerlActorRolloutRefConfig": {
        "synchronizer": "set the top-level synchronizer section",
        "nccl_timeout": "set synchronizer.sync_timeout",
    },
    "VerlModelConfig": {
        "external_lib": "rft imports no model library by name; remove it",
        "override_config": "rft loads the model's config.json as it is; remove it",
        "custom_chat_template": "set model.custom_chat_template",
        "trust_remote_code": "rft loads models with transformers' own classes; remove it",
        "lora_rank": "set model.lora_configs",
        "lora_alpha": "set model.lora_configs",
        "target_modules": "set model.lora_configs",
    },
    "VerlActorConfig": {
        "strategy": "rft trains with DeepSpeed ZeRO (trainer.zero_stage): fsdp and fsdp2 are "
        "accepted as its equivalent; remove it",
        "ppo_micro_batch_size": "set ppo_micro_batch_size_per_gpu (veRL's deprecated spelling)",
        "shuffle": "rft trains the experiences of a step in arrival order; remove it",
        "use_torch_compile": "set trainer.compile_layers",
        "algorithm_type": "set algorithm.algorithm_type",
        "entropy_from_logits_with_chunking": "rft computes the entropy of each micro-batch at "
        "once; remove it",
        "entropy_checkpointing": "rft computes the entropy of each micro-batch at once; remove it",
        "tau": "Trinity 0.1's OPMD setting: set algorithm.algorithm_type: opmd and its "
        "policy_loss_fn_args",
        "opmd_baseline": "Trinity 0.1's OPMD setting: set algorithm.algorithm_type: opmd and "
        "its advantage_fn_args",
        "use_uid": "Trinity 0.1's pairwise OPMD setting: set algorithm.algorithm_type: opmd",
    },
    "VerlRefConfig": {
        "log_prob_micro_batch_size": "set trainer.log_prob_micro_batch_size_per_gpu",
        "entropy_from_logits_with_chunking": "rft computes no entropy in the reference pass; "
        "remove it",
        "entropy_checkpointing": "rft computes no entropy in the reference pass; remove it",
    },
    "VerlFsdpConfig": _VERL_FSDP,
    "VerlRolloutConfig": {
        "log_prob_micro_batch_size": "set log_prob_micro_batch_size_per_gpu",
    },
    "VerlCriticModelConfig": {
        "external_lib": "rft imports no model library by name; remove it",
        "override_config": "rft loads the critic's config.json as it is; remove it",
    },
    "VerlCriticConfig": {
        "strategy": "rft trains with DeepSpeed ZeRO (trainer.zero_stage): fsdp and fsdp2 are "
        "accepted as its equivalent; remove it",
        "ppo_micro_batch_size": "set ppo_micro_batch_size_per_gpu",
        "forward_micro_batch_size": "set ppo_micro_batch_size_per_gpu (one size for the "
        "critic's passes)",
        "forward_micro_batch_size_per_gpu": "set ppo_micro_batch_size_per_gpu (one size for "
        "the critic's passes)",
        "ppo_epochs": "the critic trains trainer.ppo_epochs passes, as the actor; set that",
        "shuffle": "rft trains the experiences of a step in arrival order; remove it",
    },
    "VerlTrainerSection": {
        "resume_from_path": "set continue_from_checkpoint (rft resumes from the run directory)",
        "default_hdfs_dir": "rft writes to the shared filesystem only; remove it",
        "del_local_ckpt_after_load": "remove it (rft never deletes the checkpoint it resumed)",
    },
}

_OVERWRITTEN = "Trinity overwrites it from {key} (verl_config.py synchronize_config); set that"
_DO_NOT_SET = "Trinity marks it DO NOT SET and takes it from {key}; set that"
_ROLLOUT_ENGINE = (
    "veRL's rollout engine is replaced by the explorer's vLLM engine (Trinity's too); "
    "set explorer.rollout_model.{key}"
)
_ROLLOUT_ONLY = "veRL's rollout engine is replaced by the explorer's vLLM engine (Trinity's too)"
_ARR = "actor_rollout_ref"

# Paths under trainer.trainer_config -> why they have no effect (trinity/common/verl_config.py
# at 02667a1: synchronize_config overwrites them, its "DO NOT SET" fields, or veRL parts Trinity
# replaces). Accepted with a warning that says what to set instead; never refused, since a full
# veRL file (trainer_config_path) carries them all.
VERL_IGNORED: dict[str, str] = {
    "data": "Trinity fills veRL's data from buffer.* (tasksets, batch sizes); set those",
    "algorithm": "Trinity's own algorithm section replaces veRL's (advantage_fn_args gamma/lam, "
    "kl_penalty_fn, kl_loss_fn; its rollout_correction.bypass_mode alone is read, as "
    "algorithm.bypass_old_logprobs); set that",
    f"{_ARR}.model.path": _OVERWRITTEN.format(key="model.model_path"),
    f"{_ARR}.actor.ppo_mini_batch_size": _OVERWRITTEN.format(key="buffer.train_batch_size"),
    f"{_ARR}.actor.optim.total_training_steps": _OVERWRITTEN.format(key="buffer.total_steps"),
    f"{_ARR}.actor.use_kl_loss": _OVERWRITTEN.format(key="algorithm.kl_loss_fn"),
    f"{_ARR}.actor.kl_loss_coef": _DO_NOT_SET.format(key="algorithm.kl_loss_fn_args.kl_coef"),
    f"{_ARR}.actor.kl_loss_type": _DO_NOT_SET.format(key="algorithm.kl_loss_fn"),
    f"{_ARR}.actor.clip_ratio": _DO_NOT_SET.format(key="algorithm.policy_loss_fn_args.clip_range"),
    f"{_ARR}.actor.clip_ratio_low": _DO_NOT_SET.format(
        key="algorithm.policy_loss_fn_args.clip_range_low"
    ),
    f"{_ARR}.actor.clip_ratio_high": _DO_NOT_SET.format(
        key="algorithm.policy_loss_fn_args.clip_range_high"
    ),
    f"{_ARR}.actor.entropy_coeff": _DO_NOT_SET.format(
        key="algorithm.entropy_loss_fn_args.entropy_coef"
    ),
    f"{_ARR}.actor.loss_agg_mode": _DO_NOT_SET.format(key="algorithm.loss_agg_mode"),
    f"{_ARR}.ref.log_prob_micro_batch_size_per_gpu": "rft's reference pass takes "
    "trainer.log_prob_micro_batch_size_per_gpu (one size for both log-prob passes); set that",
    f"{_ARR}.rollout.temperature": _OVERWRITTEN.format(
        key="the taskset's rollout_args.temperature"
    ),
    f"{_ARR}.rollout.n": _OVERWRITTEN.format(key="algorithm.repeat_times"),
    f"{_ARR}.rollout.prompt_length": f"{_ROLLOUT_ONLY}; set model.max_prompt_tokens",
    f"{_ARR}.rollout.response_length": f"{_ROLLOUT_ONLY}; set model.max_response_tokens",
    f"{_ARR}.rollout.max_model_len": f"{_ROLLOUT_ONLY}; set model.max_model_len",
    f"{_ARR}.rollout.top_p": f"{_ROLLOUT_ONLY}; set model.top_p",
    f"{_ARR}.rollout.top_k": f"{_ROLLOUT_ONLY}; set model.top_k",
    f"{_ARR}.rollout.tensor_model_parallel_size": _ROLLOUT_ENGINE.format(
        key="tensor_parallel_size"
    ),
    **{
        f"{_ARR}.rollout.{key}": _ROLLOUT_ENGINE.format(key=key)
        for key in ("gpu_memory_utilization", "enforce_eager", "enable_chunked_prefill", "dtype")
    },
    **{
        f"{_ARR}.rollout.{key}": _ROLLOUT_ONLY
        for key in (
            "name",
            "ignore_eos",
            "use_fire_sampling",
            "free_cache_engine",
            "load_format",
            "max_num_batched_tokens",
            "max_num_seqs",
            "disable_log_stats",
            "do_sample",
        )
    },
    "critic.ppo_mini_batch_size": _OVERWRITTEN.format(key="buffer.train_batch_size"),
    "critic.rollout_n": _OVERWRITTEN.format(key="algorithm.repeat_times"),
    "critic.model.tokenizer_path": _OVERWRITTEN.format(key="model.critic_model_path"),
    "critic.optim.total_training_steps": _OVERWRITTEN.format(key="buffer.total_steps"),
    "trainer.total_training_steps": _OVERWRITTEN.format(key="trainer.total_steps"),
    "trainer.nnodes": _OVERWRITTEN.format(key="cluster.node_num"),
    "trainer.n_gpus_per_node": _OVERWRITTEN.format(key="cluster.gpu_per_node"),
    "trainer.sync_freq": _OVERWRITTEN.format(key="synchronizer.sync_interval"),
    "trainer.save_freq": _OVERWRITTEN.format(key="trainer.save_interval"),
    "trainer.project_name": _OVERWRITTEN.format(key="the top-level project"),
    "trainer.group_name": _OVERWRITTEN.format(key="the top-level group"),
    "trainer.experiment_name": _OVERWRITTEN.format(key="the top-level name"),
    "trainer.default_local_dir": _OVERWRITTEN.format(key="checkpoint_root_dir"),
    "trainer.resume_mode": _OVERWRITTEN.format(key="continue_from_checkpoint"),
    "trainer.total_epochs": "Trinity's trainer reads no epochs (buffer.total_epochs does)",
    "trainer.logger": "Trinity logs through its monitor section; set monitor.monitor_type",
    "trainer.test_freq": "Trinity's explorer evaluates, not veRL; set explorer.eval_interval",
    "trainer.val_before_train": "Trinity's explorer evaluates, not veRL; set "
    "explorer.eval_on_startup",
    "trainer.val_generations_to_log_to_wandb": "Trinity's explorer evaluates, not veRL",
}

# Paths under trainer.trainer_config accepted (no effect) only with these values: the ones
# that ask for nothing (null, {}, false) or that DeepSpeed ZeRO stands for (fsdp). Any other
# value is refused with the KEYS message above.
_FSDP_INERT = {
    "fsdp_size": (-1,),
    "wrap_policy": ({}, {"min_num_params": 0}),
    "forward_prefetch": (False,),
}
VERL_INERT: dict[str, tuple] = {
    **{
        f"{section}.fsdp_config.{key}": values
        for section in (f"{_ARR}.actor", f"{_ARR}.ref", "critic.model")
        for key, values in _FSDP_INERT.items()
    },
    **{
        f"{model}.{key}": values
        for model in (f"{_ARR}.model", "critic.model")
        for key, values in (("external_lib", (None,)), ("override_config", ({},)))
    },
    **{f"{role}.strategy": ("fsdp", "fsdp2") for role in (f"{_ARR}.actor", "critic")},
    **{f"{role}.shuffle": (False,) for role in (f"{_ARR}.actor", "critic")},
    **{
        f"{role}.{key}": (False,)
        for role in (f"{_ARR}.actor", f"{_ARR}.ref")
        for key in ("entropy_from_logits_with_chunking", "entropy_checkpointing")
    },
    "trainer.default_hdfs_dir": (None,),
    "trainer.resume_from_path": (None, ""),
    "trainer.del_local_ckpt_after_load": (False,),
}

# veRL sections accepted (no effect) while their switch key is false or null: Trinity scores
# rewards in workflows and never runs veRL's reward model or reward function.
VERL_SWITCHED_OFF: dict[str, str] = {"reward_model": "enable", "custom_reward_function": "path"}

# Trinity 0.1's OPMD keys under actor_rollout_ref.actor, read only when its alg_type is opmd or
# pairwise_opmd: accepted (no effect) with any other alg_type, else refused (KEYS above).
VERL_OPMD_ONLY = ("tau", "opmd_baseline", "use_uid")
VERL_OPMD_ALG_TYPES = ("opmd", "pairwise_opmd")

# Paths under trainer.trainer_config accepted (no effect) when equal to another veRL key there:
# rft has one setting for both (veRL's own files interpolate one from the other).
VERL_SAME_AS: dict[str, str] = {
    "critic.ppo_epochs": f"{_ARR}.actor.ppo_epochs",
    "critic.forward_micro_batch_size_per_gpu": "critic.ppo_micro_batch_size_per_gpu",
}

_USE_PPO_FAMILY = "use a policy_loss_fn rft implements (e.g. ppo, gspo, opmd)"

# "rft class.key" -> {a value Trinity accepts there: what to do in rft}.
# Names Trinity-RFT's registries and enums accept (trinity/algorithm/*/__init__.py,
# trinity/common/workflows/__init__.py, trinity/common/rewards/__init__.py,
# trinity/buffer/operators, trinity/buffer/selector, trinity/utils/monitor.py and the enums of
# trinity/common/constants.py): upstream main at 9051d63 (2026-04-09, read in the
# yanxi-chen/Trinity-RFT fork, a full copy of it) plus the names only agentscope-ai/Trinity-RFT
# commits add (1d52c85, 139d1c4, 8b7fce3, cc24051, ea07093, d574dd1) and those Trinity's own
# example YAMLs still use. tests/test_trinity_names.py asserts that rft accepts each one or
# refuses it by name, never with a "did you mean".
TRINITY_REGISTRIES: dict[str, tuple[str, ...]] = {
    "algorithm_type": (
        "sft",
        "ppo",
        "grpo",
        "reinforceplusplus",
        "rloo",
        "opmd",
        "asymre",
        "dpo",
        "topr",
        "cispo",
        "gspo",
        "sapo",
        "mix",
        "mix_chord",
        "raft",
        "sppo",
        "rec",
        "multi_step_grpo",
        "on_policy_distill",
        "jsd",
        "grpo_verl",
        "cpt",
        "m2po",
        "dapo",
        "gigpo",
    ),
    "policy_loss_fn": (
        "ppo",
        "opmd",
        "dpo",
        "sft",
        "mix",
        "gspo",
        "topr",
        "cispo",
        "sft_is",
        "sft_phi",
        "mix_chord",
        "sppo",
        "rec",
        "sapo",
        "importance_sampling",
        "m2po",
    ),
    "advantage_fn": (
        "ppo",
        "grpo",
        "grpo_verl",
        "step_wise_grpo",
        "reinforceplusplus",
        "reinforce",
        "remax",
        "rloo",
        "opmd",
        "opmd_verl",
        "asymre",
        "asymre_verl",
        "rec",
        "on_policy_distill",
        "jsd",
        "clipb",
        "clipv",
        "gigpo",
        "cod",
    ),
    "kl_fn": (
        "none",
        "k1",
        "k2",
        "k3",
        "low_var_kl",
        "abs",
        "corrected_k3",
    ),
    "entropy_loss_fn": (
        "default",
        "mix",
        "none",
    ),
    "sample_strategy": (
        "default",
        "warmup",
        "staleness_control",
        "mix",
    ),
    "workflow": (
        "simple_workflow",
        "async_simple_workflow",
        "math_workflow",
        "async_math_workflow",
        "math_boxed_workflow",
        "async_math_boxed_workflow",
        "math_eval_workflow",
        "async_math_eval_workflow",
        "math_rm_workflow",
        "async_math_rm_workflow",
        "tool_call_workflow",
        "agentscope_workflow_adapter",
        "agentscope_workflow_adapter_v1",
        "agentscope_react_workflow",
        "agentscope_react_math_workflow",
        "as_react_workflow",
        "agentscopev0_react_math_workflow",
        "agentscope_v1_react_search_workflow",
        "email_search_workflow",
        "alfworld_workflow",
        "RAFT_alfworld_workflow",
        "RAFT_reflect_alfworld_workflow",
        "frozen_lake_workflow",
        "sciworld_workflow",
        "webshop_workflow",
        "step_wise_alfworld_workflow",
        "async_math_ruler_workflow",
        "math_ruler_workflow",
        "math_trainable_ruler_workflow",
        "rubric_judge_workflow",
        "rubric_judge_openai_workflow",
        "simple_mm_workflow",
        "async_simple_mm_workflow",
        "on_policy_distill_workflow",
        "on_policy_distill_math_workflow",
        "sudoku_workflow",
        "intercode_sql_workflow",
        "thinking_budget_workflow",
        "toolcall_workflow",
        "bots_ref_eval_collect_math_boxed_workflow",
        "synthetic_workflow",
    ),
    "reward_fn": (
        "rm_gallery_reward",
        "math_reward",
        "math_boxed_reward",
        "format_reward",
        "countdown_reward",
        "accuracy_reward",
        "math_dapo_reward",
        "openjudge_reward",
        "trajectory_accuracy_grader_reward",
        "openjudge_trajectory_accuracy_reward",
        "openjudge_multi_grader_reward",
        "rlcr_reward",
        "math_boxed_reward_naive_dapo",
    ),
    "experience_operator": (
        "reward_filter",
        "reward_std_filter",
        "reward_shaping_mapper",
        "pass_rate_calculator",
        "data_juicer",
        "invalid_reward_filter",
        "dapo_dynamic_sampling",
        "mask_response_truncated",
        "cod_advantage_fn",
        "cod_overwrite_reward_with_returns",
        "multi_step_padding",
    ),
    "selector": (
        "sequential",
        "shuffle",
        "random",
        "offline_easy2hard",
        "difficulty_based",
    ),
    "monitor": (
        "tensorboard",
        "wandb",
        "mlflow",
        "swanlab",
    ),
    "priority_fn": (
        "linear_decay",
        "decay_limit_randomization",
    ),
    "storage_type": (
        "sql",
        "queue",
        "file",
        "task_dir",
    ),
    "sync_method": (
        "nccl",
        "checkpoint",
        "memory",
        "online",
        "offline",
        "hccl",
    ),
    "sync_style": (
        "fixed",
        "trainer_driven",
        "explorer_driven",
        "dynamic_by_explorer",
        "dynamic_by_trainer",
        "fully_async",
    ),
    "prompt_type": (
        "messages",
        "plaintext",
    ),
    "save_strategy": (
        "single_thread",
        "single_process",
        "single_node",
        "unrestricted",
    ),
    "mode": (
        "explore",
        "train",
        "both",
        "bench",
        "serve",
        "colocate",
    ),
}

CHOICES: dict[str, dict[str, str]] = {
    "Config.mode": {
        "serve": _SERVE,
        "colocate": "rft runs explorers and the trainer on their own GPUs (one GPU: a CPU "
        "explorer, or mode explore and mode train one after the other); use both",
    },
    "TrainerConfig.trainer_strategy": {
        "megatron": "rft trains with DeepSpeed ZeRO (no Megatron parallelism); use fsdp2 (read "
        "as DeepSpeed ZeRO) and trainer.zero_stage",
    },
    "AlgorithmConfig.algorithm_type": {
        **{
            name: f"Trinity's {name} algorithm is not built in rft; use one rft implements "
            "(e.g. grpo, ppo, opmd, gspo, rloo, reinforceplusplus, sft, mix_chord)"
            for name in TRINITY_REGISTRIES["algorithm_type"]
        },
        "cpt": "Trinity's continued pre-training (cpt) is not built in rft; train on text "
        "with algorithm_type: sft (mode train)",
    },
    "AlgorithmConfig.policy_loss_fn": {
        name: _USE_PPO_FAMILY for name in (*TRINITY_REGISTRIES["policy_loss_fn"], "trpo")
    },
    "AlgorithmConfig.advantage_fn": {
        name: "use an advantage_fn rft implements (e.g. grpo, ppo, rloo, opmd)"
        for name in (*TRINITY_REGISTRIES["advantage_fn"], "mix")
    }
    | {
        "opmd_verl": "use opmd (rft's OPMD advantage over each task's group)",
        "asymre_verl": "use asymre (rft's AsymRE advantage over each task's group)",
        "clipv": "Trinity's Clip-V reads a per-token signal (necs) that only its example's "
        "patched veRL actor (examples/entropy/clipv_dp_actor.py) computes; rft does not build "
        "it: use clipb, the same paper's other entropy filter (built in rft)",
        "cod": "CoD's advantage is not built in rft; use an advantage_fn rft implements",
    },
    "AlgorithmConfig.kl_loss_fn": {"corrected_k3": "use k3 or low_var_kl"},
    "AlgorithmConfig.kl_penalty_fn": {"corrected_k3": "use k3 or low_var_kl"},
    "AlgorithmConfig.entropy_loss_fn": {
        "mix": "use default (rft's CHORD loss has no separate entropy term for expert data)"
    },
    "RolloutModelConfig.engine_type": {
        "tinker": "rft generates with vLLM on the cluster's GPUs; use vllm",
        "sglang": "rft generates with vLLM; use vllm",
    },
    "SynchronizerConfig.sync_style": {
        "fully_async": "use explorer_driven (the explorer never waits for a version) with "
        "explorer.partial_rollout (steps stream through the engine; rft.sync.schedule)",
    },
    "SynchronizerConfig.sync_method": {
        "hccl": "rft syncs weights with NCCL (GPUs) or gloo (CPU); Ascend NPUs are not "
        "supported: use nccl or checkpoint",
    },
    "ExperienceBufferConfig.storage_type": {
        "task_dir": "rft reads tasks from dataset files (buffer.explorer_input.taskset.path); "
        "use queue for experiences",
    },
    "TasksetConfig.storage_type": {
        "env_service": "rft runs environments inside its workflows (no environment service); "
        "give a dataset path (storage_type file) and a workflow that drives the environment",
        "task_dir": "point buffer.explorer_input.taskset.path at a dataset folder or file "
        "(storage_type file)",
        "queue": "rft's tasksets are dataset files; use file",
        "sql": "rft's tasksets are dataset files; export the table and use file",
    },
    "TrainerConfig.trainer_type": {
        "megatron": "rft trains with DeepSpeed ZeRO; use deepspeed (or verl, mapped onto it)",
        "tinker": "rft trains with DeepSpeed ZeRO on the cluster's GPUs; use deepspeed",
    },
    "ExperienceBufferConfig.schema_type": {
        name: "rft derives the row kind from algorithm.algorithm_type; remove it"
        for name in ("task", "experience", "dpo")
    },
    # Trinity's other experience operators (trinity/buffer/operators/__init__.py).
    "OperatorConfig.name": {
        "reward_shaping_mapper": _WRITE_A_FILTER,
        "data_juicer": "rft runs no Data-Juicer service; remove it",
        "cod_advantage_fn": "CoD's advantage is not built in rft; use an advantage_fn rft "
        "implements",
        "cod_overwrite_reward_with_returns": "CoD's advantage is not built in rft; remove it",
        "multi_step_padding": "rft's trainer takes each step-wise experience as it is "
        "(no padding of runs to one length); remove it",
    },
}

_ENV = "it drives the {env} environment"
_EXAMPLE = (
    "a workflow registered by a file of Trinity's examples/{folder} folder (Trinity users pass "
    "that folder as --plugin-dir), not by Trinity's package"
)
# Trinity's other AgentScope workflows build agentscope v0/v1 agents (ReActAgent, its search
# and adapter variants), an API agentscope 2.0 replaced; rft serves as_react_workflow.
_AGENTSCOPE_V1 = (
    "it runs an AgentScope v0/v1 agent (agentscope's API before 2.0); rft ships "
    "as_react_workflow (agentscope 2.0) and runs any other agent as a WorkflowWithRecording"
)
_ALFWORLD = (
    "it is Trinity's reflecting RAFT variant of the ALFWorld agent (a second attempt guided by "
    "the first's outcome), not built; rft ships RAFT_alfworld_workflow (Trinity's RAFT agent "
    "without the second attempt), alfworld_workflow, step_wise_alfworld_workflow and R3L's "
    "raft_baseline_alfworld_workflow on the same games"
)
_WEBSHOP = _ENV.format(
    env="WebShop in-process (the web_agent_site package from princeton-nlp/WebShop, not on "
    "PyPI, with the product catalogue and search index its setup.sh downloads; the full "
    "catalogue takes about 15 GB of memory per environment; pyserini's index needs Java)"
)

# Trinity workflows rft does not ship -> what each does (rft.workflow.registry says how to
# bring one as a plugin).
WORKFLOWS: dict[str, str] = {
    "RAFT_reflect_alfworld_workflow": _ALFWORLD,
    "webshop_workflow": _WEBSHOP,
    "agentscopev1_react_workflow": _AGENTSCOPE_V1,
    "agentscope_react_math_workflow": _AGENTSCOPE_V1,
    "agentscopev0_react_math_workflow": _AGENTSCOPE_V1,
    "agentscope_v1_react_search_workflow": _AGENTSCOPE_V1,
    "agentscope_workflow_adapter": _AGENTSCOPE_V1,
    "agentscope_workflow_adapter_v1": _AGENTSCOPE_V1,
    "email_search_workflow": _ENV.format(env="email-search (its SQLite corpus)"),
    "tool_call_workflow": "ToolACE-style function calls scored against reference calls",
    "math_eval_workflow": "Trinity's math evaluation prompt; use math_boxed_workflow for "
    "eval_tasksets",
    "async_math_eval_workflow": "Trinity's math evaluation prompt; use math_boxed_workflow",
    "math_ruler_workflow": "RULER (an LLM judge ranks the group's answers)",
    "async_math_ruler_workflow": "RULER (an LLM judge ranks the group's answers)",
    "math_trainable_ruler_workflow": "RULER with a trained judge",
    "simple_mm_workflow": "multi-modal (image) prompts; rft trains text-only models",
    "async_simple_mm_workflow": "multi-modal (image) prompts; rft trains text-only models",
    "rubric_judge_openai_workflow": "rubric scores from an LLM judge called over the OpenAI API",
    "sudoku_workflow": "Trinity's multi-turn Sudoku game",
    "intercode_sql_workflow": _ENV.format(env="InterCode-SQL (a SQL database in Docker)"),
    "thinking_budget_workflow": "Trinity's math workflow with a thinking-token budget",
    "bots_ref_eval_collect_math_boxed_workflow": "BOTS' reference-evaluation collector (its "
    "example names it; Trinity registers it no more)",
    "synthetic_workflow": "Trinity's synthetic-task example workflow",
    # Registered by a file of Trinity's examples/ folder, not by its package: Trinity users
    # run them with --plugin-dir examples/<name>/workflow.
    "bots_math_boxed_workflow": _EXAMPLE.format(folder="bots/workflow"),
    "bcp_simple_react_workflow": _EXAMPLE.format(folder="browse_comp_plus"),
    "medicine_ruler_workflow": _EXAMPLE.format(folder="grpo_medicine_ruler"),
    "learn2ask_workflow": _EXAMPLE.format(folder="learn_to_ask/workflow"),
    "raft_baseline_webshop_workflow": _WEBSHOP,
}

# Trinity reward functions rft does not ship -> what to do (rft.workflow.rewards).
REWARD_FNS: dict[str, str] = {
    "trajectory_accuracy_grader_reward": "it asks an OpenJudge LLM grader; write a "
    "'package.module:function' reward that calls your judge",
    "openjudge_multi_grader_reward": "it asks OpenJudge LLM graders; write a "
    "'package.module:function' reward that calls your judge",
    "math_boxed_reward_naive_dapo": "a benchmark plugin's boxed-answer reward (DAPO's naive "
    "check); use math_dapo_reward or math_boxed_reward",
    "rm_gallery_reward": "it calls RM-Gallery; use explorer.auxiliary_models (a reward model) "
    "or a 'package.module:function' reward",
    "openjudge_reward": "it asks an OpenJudge LLM grader; write a 'package.module:function' "
    "reward that calls your judge (with math_rm_workflow: a RewardFn taking auxiliary_models)",
    "openjudge_trajectory_accuracy_reward": "it asks an OpenJudge LLM grader; write a "
    "'package.module:function' reward that calls your judge (with math_rm_workflow: a RewardFn "
    "taking auxiliary_models)",
}


# Every name above: never answered with a "did you mean" (rft.errors.did_you_mean).
TRINITY_NAMES: frozenset[str] = frozenset(
    {key for section in KEYS.values() for key in section}
    | {value for section in CHOICES.values() for value in section}
    | set(WORKFLOWS)
    | set(REWARD_FNS)
    | {name for names in TRINITY_REGISTRIES.values() for name in names}
)
