"""rft: reinforcement fine-tuning of language models on SLURM clusters.

No Ray and no long-lived service: rollout workers ("explorers", vLLM) and a trainer
(DeepSpeed ZeRO) run as separate processes, usually separate SLURM node groups of one
heterogeneous job, and talk only through files in one run directory on the shared
filesystem::

    tasksets (parquet/jsonl/arrow on disk)
         |
    explorer tasks (vLLM) --sealed JSONL segments--> buffer/ --> trainer ranks (DeepSpeed)
         ^                                                          |
         +--- reload weights <-- weights/vNNNNNN/ + latest_state_dict_iteration.txt
                                 global_step_N/ (full checkpoints, resume, rft-convert)

Modules, one role each:
    config      typed, Trinity-compatible config (config_load: YAML/overrides; config_rules:
                presets, derived values, conflicts; typed_dict: dicts <-> dataclasses)
    atomic      temp + fsync + rename publishing of files, folders and pointer files
    errors      the exceptions a user can cause, each saying what to do
    data        local datasets: find a split's files, read columns; tasksets: tasks, cursors
    models      local model folders: checks, SmolLM2 from its GGUF, tiny test models
    buffer      experiences as sealed JSONL segments (experience, sqlite_store)
    sync        weights versions, the pointer file, explorer heartbeats
    rewards     reward functions (pure)            workflows  prompts and scoring per task
    advantages, losses, algorithms   advantage estimators and losses (pure torch)
    explorer    the rollout loop (vllm_engine: the only vllm import)
    trainer     the training loop (ds_engine: the only deepspeed import; batching,
                policy_update, trainer_input, mix_input, sft_data, trainer_state)
    monitor     metrics to the log, TensorBoard and metrics.jsonl
    convert     DeepSpeed/FSDP checkpoints -> Hugging Face safetensors (ckpt_*, torchfile,
                safetensors_io)
    plan, cli   preflight checks and the plan; rft-run's entry
    local       local runs; worker: one process of a role (srun, torchrun or local)
    slurm, launch  sbatch rendering and submission; rft-launch / rft-add-explorer
    rundir, status, bench  run-directory config record; rft-status; mode bench
"""

__version__ = "0.1.0"
