"""SLURM jobs from a config: size the node groups, render the sbatch script, submit it.

Input: a checked :class:`~rft.config.Config`, the config file and the overrides the workers get.
Output: an sbatch script (``--dry-run`` prints it), a submitit executor, or a submitted job id.
``mode: both`` is one heterogeneous job (component 0 the explorer tasks, component 1 the trainer
ranks); ``explore`` and ``train`` are one-component jobs. Checks nothing the config rules own.
"""

from __future__ import annotations

import math
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rft import stages
from rft.config.auxiliary import auxiliary_tp, shared_engines, shared_tp
from rft.config.gpus import check_gpu_split, split_gpus
from rft.config.load import stage_label
from rft.config.schema import Config
from rft.entry import PLUGIN_DIRS_ENV
from rft.errors import EXIT_REQUEUE, ConfigError, SlurmError
from rft.launch.worker import WORKER_MODULE
from rft.lease import TAKE_OVER_ENV
from rft.placement import EXPLORER_MODES, TRAINER_MODES, task_gpus
from rft.rundir import LOG_DIR, SUBMITIT_DIR

if TYPE_CHECKING:
    import submitit


@dataclass(frozen=True)
class Group:
    """One component of the job: which role, and the resources it asks for."""

    role: str  # "explorer", "trainer" or "auxiliary" (the shared judges' engines)
    nodes: int  # --nodes
    ntasks: int  # --ntasks: explorer engines, or trainer ranks
    gpus_per_task: int  # --gpus-per-task (0: a CPU cluster)


def explorer_tasks_per_node(cfg: Config) -> int:
    """Explorer tasks (an engine and its scorers) one node holds (1 on a CPU-only description)."""
    per_task = task_gpus(cfg.explorer.rollout_model.tensor_parallel_size, auxiliary_tp(cfg))
    return max(1, cfg.cluster.gpu_per_node // per_task)


def groups(cfg: Config, mode: str | None = None) -> list[Group]:
    """Size the job's components from ``cluster`` and ``explorer.rollout_model``."""
    mode = mode or cfg.mode
    check_gpu_split(cfg, mode)  # a staged config's job mode may be none of its stages' modes
    rollout, cluster = cfg.explorer.rollout_model, cfg.cluster
    gpn = cluster.gpu_per_node
    split = split_gpus(cfg, mode)
    out = []
    if mode in EXPLORER_MODES:
        per_task = task_gpus(rollout.tensor_parallel_size, auxiliary_tp(cfg))  # <= gpn: on one node
        nodes = math.ceil(rollout.engine_num / explorer_tasks_per_node(cfg)) if gpn else 1
        out.append(Group("explorer", nodes, rollout.engine_num, per_task if gpn else 0))
    if mode in TRAINER_MODES:
        nodes = math.ceil(split.trainer / gpn) if gpn else cluster.node_num
        out.append(
            Group("trainer", nodes, split.trainer if gpn else cluster.node_num, 1 if gpn else 0)
        )
    shared = shared_engines(cfg) if mode in EXPLORER_MODES else []
    if shared:  # the judges the explorer tasks share: one task per engine, after the others
        if cfg.stages:
            raise ConfigError(
                "explorer.auxiliary_models shared by the explorer tasks (an engine_num other "
                "than explorer.rollout_model.engine_num) in a config with stages: a SLURM job "
                "runs them only for an unstaged config; run the stages with rft-run, or give "
                "the model the rollout model's engine_num (a copy in each explorer task)"
            )
        tp = shared_tp(cfg)
        nodes = math.ceil(len(shared) / max(1, gpn // tp)) if gpn else 1
        out.append(Group("auxiliary", nodes, len(shared), tp if gpn else 0))
    return out


def _resource_line(group: Group, cfg: Config) -> str:
    parts = [f"--nodes={group.nodes}", f"--ntasks={group.ntasks}"]
    if group.gpus_per_task:
        parts.append(f"--gpus-per-task={group.gpus_per_task}")
        if cfg.slurm.cpus_per_gpu:
            parts.append(f"--cpus-per-gpu={cfg.slurm.cpus_per_gpu}")
    if cfg.slurm.mem:
        parts.append(f"--mem={cfg.slurm.mem}")
    return "#SBATCH " + " ".join(parts) + f"  # {group.role}"


def job_name(cfg: Config) -> str:
    """The SLURM job name of a run: ``rft-<project>-<group>-<name>`` (``/`` as ``-``)."""
    return f"rft-{cfg.run_label}".replace("/", "-")


def sbatch_log(cfg: Config, job_id: str = "%j") -> Path:
    """The output file of a job submitted as the rendered script (``%j``: sbatch's pattern)."""
    return cfg.run_dir / LOG_DIR / f"slurm-{job_id}.out"


def header(cfg: Config) -> list[str]:
    """The job-wide #SBATCH lines."""
    s = cfg.slurm
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name(cfg)}",
        f"#SBATCH --output={sbatch_log(cfg)}",
        "#SBATCH --open-mode=append",
        f"#SBATCH --time={s.time}",
        f"#SBATCH --signal=USR1@{s.signal_delay_s}",
    ]
    lines += ["#SBATCH --requeue"] if s.requeue else ["#SBATCH --no-requeue"]
    for flag, value in (
        ("partition", s.partition),
        ("account", s.account),
        ("qos", s.qos),
        ("constraint", s.constraint),
    ):
        if value:
            lines.append(f"#SBATCH --{flag}={value}")
    lines += [f"#SBATCH {arg}" for arg in s.extra_sbatch_args]
    return lines


def render(
    cfg: Config,
    config_path: Path,
    overrides: list[str],
    *,
    python: str | None = None,
    workdir: Path | None = None,
    mode: str | None = None,
) -> str:
    """The sbatch script that runs ``cfg`` (``mode`` picks both/explore/train)."""
    mode = mode or cfg.mode
    parts = groups(cfg, mode)
    lines = header(cfg)
    for i, group in enumerate(parts):
        if i:
            lines.append("#SBATCH hetjob")
        lines.append(_resource_line(group, cfg))
    lines += _stage_lines(cfg)
    lines += [
        "set -euo pipefail",
        *cfg.slurm.setup,
        f"cd {shlex.quote(str(workdir or Path.cwd()))}",
    ]
    for var in (PLUGIN_DIRS_ENV, TAKE_OVER_ENV):  # also where sites submit with --export=NONE
        if os.environ.get(var):
            lines.append(f"export {var}={shlex.quote(os.environ[var])}")
    args = " ".join(shlex.quote(a) for a in ["--config", str(config_path), *overrides])
    py = shlex.quote(python or sys.executable)
    het = len(parts) > 1
    for i, group in enumerate(parts):
        where = f"--het-group={i} " if het else ""
        lines += [f"srun {where}{py} -m {WORKER_MODULE} {group.role} {args} &", f"{group.role}=$!"]
    lines += _epilogue([g.role for g in parts], stages.main_role(mode))
    return "\n".join(lines) + "\n"


def _stage_lines(cfg: Config) -> list[str]:
    """Comments naming the stages each worker runs in order (rft.launch.worker.run_stages)."""
    if not cfg.stages:
        return []
    lines = ["# stages, run in order by every task (finished ones are skipped on requeue):"]
    for index in range(len(cfg.stages)):
        stage = stages.resolve(cfg, index, chain=False)
        who = " and ".join(stages.roles(stage.mode))
        lines.append(
            f"#   {stage_label(cfg, index)}: mode {stage.mode} ({who}), "
            f"from {stages.starts_from(index)}, in {stage.run_dir}"
        )
    return lines


def _epilogue(roles: list[str], main: str) -> list[str]:
    """Wait for the groups (``main``'s exit code is the job's), then stop the shared auxiliary
    engines (their explorers are done even if none ever joined); requeue when the trainer
    stopped for a signal after checkpointing."""
    lines = ["code=0", f'wait "${main}" || code=$?']
    lines += [f'wait "${r}" || true' for r in roles if r not in (main, "auxiliary")]
    if "auxiliary" in roles:  # the shared judges serve until the explorers are done: now they are
        lines += ['kill "$auxiliary" 2>/dev/null || true', 'wait "$auxiliary" || true']
    lines += [
        f'if [ "$code" = {EXIT_REQUEUE} ]; then',
        '  echo "rft: checkpoint saved after a signal; requeueing $SLURM_JOB_ID"',
        '  scontrol requeue "$SLURM_JOB_ID"',
        "fi",
        'exit "$code"',
    ]
    return lines


def sbatch(script: str, env: dict[str, str] | None = None) -> str:
    """Submit ``script`` with sbatch; return the job id or raise a clear SlurmError."""
    if shutil.which("sbatch") is None:
        raise SlurmError(
            "sbatch is not on PATH: run this on a SLURM login node (or `module load "
            "slurm`); `--dry-run` prints the script without submitting"
        )
    proc = subprocess.run(
        ["sbatch", "--parsable"], input=script, text=True, capture_output=True, env=env, timeout=120
    )
    if proc.returncode != 0:
        raise SlurmError(explain_sbatch_error(proc.stderr.strip()))
    return proc.stdout.strip().split(";")[0]


def explain_sbatch_error(stderr: str) -> str:
    """sbatch's refusal with a hint for the common causes."""
    hint = ""
    if "invalid partition" in stderr.lower():
        hint = " Set slurm.partition to one that `sinfo -s` lists."
    elif "invalid account" in stderr.lower() or "association" in stderr.lower():
        hint = " Set slurm.account (and slurm.qos) to ones `sacctmgr show assoc user=$USER` lists."
    elif "gres" in stderr.lower() or "generic resource" in stderr.lower():
        hint = " The cluster has fewer GPUs per node than cluster.gpu_per_node; lower it."
    return f"sbatch refused the job: {stderr}.{hint}"


def job_state(job_id: str, env: dict[str, str] | None = None) -> str | None:
    """The job's state from scontrol (works without accounting); None once it is forgotten."""
    proc = subprocess.run(
        ["scontrol", "show", "job", job_id, "-o"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    for field in proc.stdout.split():
        if field.startswith("JobState="):
            return field.split("=", 1)[1]
    return None


def submitit_folder(cfg: Config) -> Path:
    """Where submitit keeps a run's job files and logs."""
    return cfg.run_dir / LOG_DIR / SUBMITIT_DIR


def submitit_log(cfg: Config, job_id: str) -> Path:
    """The output of a job submitted through submitit (its first task's, by submitit's naming)."""
    from submitit.core.utils import JobPaths

    return JobPaths(submitit_folder(cfg), job_id=job_id, task_id=0).stdout


def submitit_executor(cfg: Config, mode: str) -> submitit.SlurmExecutor:
    """A submitit executor for the job: component 0 from its parameters, component 1 (if any)
    as ``#SBATCH hetjob`` setup lines, one srun over both (submitit 1.5 has no hetjob API)."""
    import submitit

    parts = groups(cfg, mode)
    first, rest = parts[0], parts[1:]
    s = cfg.slurm
    params: dict = dict(
        nodes=first.nodes,
        ntasks_per_node=math.ceil(first.ntasks / first.nodes),
        time=_minutes(s.time),
        signal_delay_s=s.signal_delay_s,
        job_name=job_name(cfg),
        stderr_to_stdout=True,
    )
    if first.gpus_per_task:
        params["gpus_per_task"] = first.gpus_per_task
        if s.cpus_per_gpu:
            params["cpus_per_gpu"] = s.cpus_per_gpu
    for key in ("partition", "account", "qos", "constraint", "mem"):
        if getattr(s, key):
            params[key] = getattr(s, key)
    # Further #SBATCH lines: submitit writes setup lines right after its own header, before
    # any command, so sbatch still reads them (the user's extras for the job head, as render()
    # places them, then the other components).
    setup = [f"#SBATCH {arg}" for arg in s.extra_sbatch_args]
    for group in rest:
        setup += ["#SBATCH hetjob", _resource_line(group, cfg).split("  #")[0]]
    setup += list(s.setup)
    executor = submitit.SlurmExecutor(folder=str(submitit_folder(cfg)), max_num_timeout=3)
    executor.update_parameters(
        **params,
        setup=setup,
        srun_args=[f"--het-group={','.join(str(i) for i in range(len(parts)))}"] if rest else [],
        additional_parameters={"requeue": s.requeue} if s.requeue else {},
    )
    return executor


def _minutes(time_limit: str) -> int:
    """SLURM's [D-]HH:MM:SS (or minutes) as whole minutes, for submitit."""
    days, _, clock = time_limit.rpartition("-")
    fields = [int(x) for x in clock.split(":")]
    if len(fields) == 1:
        minutes = fields[0]
    else:
        fields = ([0] * (3 - len(fields))) + fields
        minutes = fields[0] * 60 + fields[1] + (1 if fields[2] else 0)
    return minutes + int(days or 0) * 24 * 60
