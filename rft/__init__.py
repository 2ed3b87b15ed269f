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

One subpackage per role, lowest layer first (a module imports only its layer and lower ones):

    errors, atomic      exceptions and exit codes; temp + fsync + rename publishing
    rundir, placement   every run-directory name; GPUs per role, ranks, rendezvous ports
    config/             schema, load (YAML, overrides, stages), rules (cross-field checks), queries, auxiliary
    data, models        datasets (one loader, columns, chat messages, the step count); model folders
    sync, monitor       weights versions and their schedule, heartbeats, explorers' stop records;
                        metrics and their names
    entry               the commands' shared argparse / logging / error handling
    algo/               names, advantages, losses, logprobs (pure torch), registry
    buffer/             experience records, sealed segments, SQLite
    workflow/           the API workflow authors import: Workflow, Task, Experience, the model handle,
                        token-faithful turns, tools, rewards, the built-in workflows and environments
    explorer/           loop, tasksets, episodes, reward_model, auxiliary (judges), engine (the only
                        vllm import), bench, debug
    trainer/            loop, step, batching, inputs, state, engine (the only deepspeed import)
    convert/            rft-convert: DeepSpeed/FSDP checkpoints -> safetensors
    launch/, status     rft-run, rft-launch, rft-add-explorer (preflight, local, slurm, worker); rft-status
    devtools            development model folders (SmolLM2, tiny models); the library never imports it
"""

__version__ = "0.1.0"
