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
    config      typed, Trinity-compatible YAML config (OmegaConf), validation, overrides
    atomic      temp + fsync + rename publishing of files, folders and pointer files
    errors      the exceptions a user can cause, each saying what to do
    buffer      experiences as sealed JSONL segments; reader cursor; SQLite archive/transport
    sync        weights versions, the pointer file, explorer heartbeats
    rewards     reward functions (pure)            workflows  prompts and scoring per task
    algorithms  advantages, policy/KL/entropy losses (pure torch)
    explorer    the rollout loop (engine: vLLM)    trainer    the training loop (DeepSpeed)
    convert     DeepSpeed/FSDP checkpoints -> Hugging Face safetensors
    launch      local runs and SLURM submission
"""

__version__ = "0.1.0"
