"""The explorer: generate rollouts with vLLM, score them, publish them to the buffer.

One explorer task (process) owns one vLLM engine (:mod:`rft.explorer.engine`). Data in: the
training tasksets (:mod:`rft.explorer.tasksets`), the trainer's published weights (``weights/vNNNNNN``
through :class:`rft.sync.WeightsWatcher`). Data out: per step one sealed buffer segment
``buffer/<explorer.name>-<rank>/seg-<step>.jsonl`` (experiences with token ids, logprobs,
reward and its parts, the weights version; with ``explorer.auxiliary_models`` the reward
models' scores are parts too, :mod:`rft.explorer.reward_model`), the heartbeat
``explorers/<writer>.json``, the task cursor in ``explorer_meta.json``, and metrics (role
``explorer_<name>``, or ``explorer_<name>-<rank>`` for ranks > 0) on the monitor. Evaluation
results go to the monitor only, never to the buffer.

Steps are numbered from 1; step s is sealed as segment seq s. Weights version v is the trainer
step that produced them; version 0 is ``model.model_path``. Before generating step s:

- ``mode: both``: wait until the published version is at least
  ``required_version(s) = ((s - 1 - sync_offset) // sync_interval) * sync_interval`` (never
  below 0: no wait while s <= 1 + sync_offset), i.e. the newest version the trainer publishes
  after its step s - 1 - sync_offset. Waiting longer than ``synchronizer.sync_timeout`` raises
  :class:`~rft.errors.SyncTimeoutError`;
- ``mode: explore``: the same wait with ``synchronizer.max_lead_steps`` for ``sync_offset``
  when it is set (a bound on how stale this explorer's rollouts get), else never wait;
- in both modes, load the newest published version if it differs from the loaded one.

Entry: ``python -m rft.explorer --config FILE [key=value ...]``; the task's rank and count come
from ``RFT_EXPLORER_RANK``/``RFT_EXPLORER_COUNT``, else ``SLURM_PROCID``/``SLURM_NTASKS``.
With ``synchronizer.sync_method: nccl`` the weights also arrive by broadcast
(:class:`~rft.explorer.receiver.BroadcastReceiver`), looked for at the same points; folders then
only bring versions newer than the loaded one (published at checkpoints, at the end, or when a
broadcast failed).

SIGTERM or SIGUSR1 exits at once: the unsealed batch is lost, sealed segments stay.
"""

from __future__ import annotations

import logging
import os
import signal
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from rft import atomic
from rft.buffer.experience import Experience
from rft.buffer.segments import open_buffer_writer
from rft.config.schema import Config
from rft.entry import config_parser, run_command, setup_logging
from rft.errors import EXIT_OK, ConfigError, SyncTimeoutError
from rft.explorer import tasksets as T
from rft.explorer.engine import Engine, Sample
from rft.explorer.episodes import EpisodeJob, episode_jobs, run_episodes, to_record
from rft.explorer.receiver import BroadcastReceiver
from rft.explorer.reward_model import RewardModel, conversation, load_reward_models
from rft.monitor import (
    ACCURACY,
    EVAL_WEIGHTS_VERSION,
    EXPLORER_RELOAD_S,
    EXPLORER_STEP_S,
    EXPLORER_WAIT_S,
    GENERATE_TIME_S,
    GENERATE_TOKENS_PER_S,
    GENERATED_TOKENS,
    LOOP_TOKENS_PER_S,
    RESPONSE_LENGTH_MAX,
    REWARD_MEAN,
    TOOL_CALLS,
    TOOL_ERRORS,
    TOOL_TIMEOUTS,
    WEIGHTS_VERSION,
    Monitor,
)
from rft.placement import EXPLORER_MODES, explorer_rank
from rft.rundir import EXPLORER_META, explorer_role, writer_name
from rft.stages import load_stage
from rft.workflow import tools
from rft.workflow.conversation import ChatTemplate
from rft.workflow.single_turn import Recipe
from rft.workflow.task import GenerationArgs
from rft.workflow.task import Task as WorkflowTask
from rft.sync import (
    EVALUATING_FIELD,
    FINISHED_FIELD,
    LOADED_FIELD,
    LOADING_FIELD,
    Heartbeat,
    WeightsWatcher,
    explorer_lead,
    required_version,
    weights_problem,
)

log = logging.getLogger(__name__)

WEIGHTS_POLL_S = 1.0  # pointer checks while waiting for weights (mode both)


@dataclass(frozen=True)
class Placement:
    """Which explorer task this process is."""

    name: str  # explorer.name
    rank: int  # 0 .. count-1
    count: int  # tasks of this explorer name (engine_num)

    @property
    def writer(self) -> str:
        return writer_name(self.name, self.rank)

    @property
    def role(self) -> str:
        return explorer_role(self.name, self.rank)


def placement(cfg: Config, env: Optional[dict[str, str]] = None) -> Placement:
    """This task's rank and count (:func:`rft.placement.explorer_rank`), checked against the run."""
    task = explorer_rank(dict(os.environ) if env is None else env)
    engine_num = cfg.explorer.rollout_model.engine_num
    if task.count != engine_num and cfg.mode == "both":
        raise ConfigError(f"explorer.rollout_model.engine_num={engine_num} but {task.count} explorer "
                          f"task(s) run ({task.count_var}); in mode 'both' the trainer waits for "
                          "engine_num segments per step: launch engine_num tasks")
    return Placement(cfg.explorer.name, task.rank, task.count)


# ----------------------------------------------------------------------------- the loop


@dataclass
class ExplorerResult:
    """What a run of :func:`run_explorer` did (tests and benchmarks read it)."""

    steps: list[int] = field(default_factory=list)  # steps generated by this run
    metrics: list[dict[str, Any]] = field(default_factory=list)  # per step
    eval_metrics: list[dict[str, Any]] = field(default_factory=list)
    loaded_version: int = 0


def run_explorer(cfg: Config, engine: Engine | None = None, *, env: dict[str, str] | None = None,
                 max_steps: int | None = None, handle_signals: bool = False) -> ExplorerResult:
    """Explore until the tasks (or ``buffer.total_steps``) are done, or ``max_steps`` more steps."""
    place = placement(cfg, env)
    run_dir = cfg.run_dir
    train_sets = T.training_tasksets(cfg)
    eval_sets = T.eval_tasksets(cfg) if place.rank == 0 else []
    stream = T.TaskStream(train_sets, cfg.buffer.batch_size, cfg.buffer.total_epochs,
                          cfg.buffer.total_steps)
    buf = cfg.buffer.trainer_input.experience_buffer
    writer = open_buffer_writer(run_dir, place.writer, buf.storage_type, buf.path or "", buf.name,
                                cfg.cluster.node_num)
    cursor = resume_cursor(run_dir, place, stream, getattr(writer, "next_seq", 0))
    heartbeat = Heartbeat(run_dir, place.writer, cfg.explorer.heartbeat_interval_s).start()
    if handle_signals:
        install_exit_handlers(heartbeat)
    nccl = cfg.synchronizer.sync_method == "nccl"
    watcher = WeightsWatcher(run_dir, loaded_version=0, heartbeat=heartbeat, newer_only=nccl)
    monitor = Monitor(run_dir, place.role, monitor_type=cfg.monitor.monitor_type,
                      flush_interval_s=cfg.monitor.flush_interval_s, project=cfg.project,
                      name=cfg.name)
    engine = engine or Engine(cfg)
    engine.load_initial(cfg)  # a reused engine left with other weights goes back to version 0
    reward_models = load_reward_models(cfg)  # after vLLM started: this process touches CUDA only now
    receiver = BroadcastReceiver(run_dir, place.writer, engine,
                                 cfg.explorer.rollout_model.tensor_parallel_size,
                                 cfg.synchronizer.sync_timeout) if nccl else None
    result = ExplorerResult()
    sync = cfg.synchronizer
    lead, lead_key = explorer_lead(cfg.mode, sync.sync_offset, sync.max_lead_steps)

    def evaluate_now(step: int) -> dict[str, Any]:
        """:func:`evaluate`, said in the heartbeat while it runs (a launcher waits for it)."""
        heartbeat.beat(**{EVALUATING_FIELD: True})
        try:
            return evaluate(cfg, engine, eval_sets, monitor, step, watcher, reward_models)
        finally:
            heartbeat.beat(**{EVALUATING_FIELD: False})
    try:
        heartbeat.beat(**{LOADED_FIELD: 0}, steps_done=cursor.step)
        if eval_sets and cfg.explorer.eval_on_startup and cursor.step == 0:
            sync_weights(engine, watcher, 0, sync.sync_timeout, receiver)
            result.eval_metrics.append(evaluate_now(0))
        while not stream.finished(cursor) and (max_steps is None or len(result.steps) < max_steps):
            step_start = time.monotonic()
            step = cursor.step + 1
            need = 0 if lead is None else required_version(step, lead, sync.sync_interval)
            version, reload_s, wait_s = sync_weights(engine, watcher, need, sync.sync_timeout,
                                                     receiver, lead_key)
            share = T.rank_share(stream.next_batch(cursor), place.rank, place.count)
            exps, stats = rollout(cfg, engine, train_sets, share, step, version, place.writer,
                                  reward_models)
            writer.write(exps, seq=step)
            T.save_cursor(run_dir, place.name, place.rank, place.count, cursor)
            heartbeat.beat(steps_done=step, tasks_done=heartbeat.fields["tasks_done"] + len(share))
            metrics = {**stats, **step_metrics(exps), WEIGHTS_VERSION: version,
                       EXPLORER_RELOAD_S: reload_s, EXPLORER_WAIT_S: wait_s,
                       EXPLORER_STEP_S: time.monotonic() - step_start}
            metrics[LOOP_TOKENS_PER_S] = stats[GENERATED_TOKENS] / metrics[EXPLORER_STEP_S]
            monitor.log(step, metrics)
            result.steps.append(step)
            result.metrics.append(metrics)
            final_eval = evaluates_final(cfg, bool(eval_sets)) and stream.finished(cursor)
            if (eval_sets and cfg.explorer.eval_interval and step % cfg.explorer.eval_interval == 0
                    and not final_eval):
                result.eval_metrics.append(evaluate_now(step))
        if stream.finished(cursor):  # after the last segment was sealed: a trainer may now end
            heartbeat.beat(**{FINISHED_FIELD: True})
            if result.steps and evaluates_final(cfg, bool(eval_sets)):
                # The trained model: the trainer publishes its last step's weights (sync.py).
                sync_weights(engine, watcher, stream.total_steps, sync.sync_timeout, receiver)
                result.eval_metrics.append(
                    evaluate_now(result.steps[-1]))
        result.loaded_version = watcher.loaded_version or 0
    finally:
        if receiver is not None:
            receiver.close()
            engine.discard_received()
        heartbeat.stop()
        monitor.close()
    return result


def evaluates_final(cfg: Config, has_eval_sets: bool) -> bool:
    """Whether the explorer evaluates the trained model after its last step: in mode both
    with evaluation on (``eval_interval`` > 0). It waits for the trainer's final weights and logs
    the evaluation at the last step, in place of that step's periodic one (which would measure
    the weights the step generated with, one version older)."""
    return has_eval_sets and cfg.mode == "both" and cfg.explorer.eval_interval > 0


def resume_cursor(run_dir: Any, place: Placement, stream: T.TaskStream, next_seq: int) -> T.Cursor:
    """This rank's saved cursor (or a new one), replayed forward past steps it already sealed."""
    cursor = T.load_cursor(run_dir, place.name, place.rank, place.count) or stream.new_cursor()
    if len(cursor.positions) != len(stream.selectors):
        raise ConfigError(f"{EXPLORER_META}: the cursor of {place.name} has "
                          f"{len(cursor.positions)} tasksets but the config has "
                          f"{len(stream.selectors)}; delete its entry to restart the tasks")
    while cursor.step < next_seq - 1:  # sealed after the cursor was saved: skip those steps
        stream.next_batch(cursor)
    if cursor.step:
        log.info("%s resumes after step %d (task positions %s)", place.writer, cursor.step,
                 cursor.positions)
    return cursor


def sync_weights(engine: Engine, watcher: WeightsWatcher, need: int, timeout_s: float,
                 receiver: BroadcastReceiver | None = None,
                 lead_key: str = "synchronizer.sync_offset") -> tuple[int, float, float]:
    """Load the newest weights, waiting until version >= ``need``: from the trainer's broadcast
    (``receiver``, with ``sync_method: nccl``) or from a published folder, whichever comes.

    A load whose folder the trainer pruned or republished meanwhile is void
    (:meth:`WeightsWatcher.load`) and retried at once with the newest version; until one
    succeeds the engine's weights are unknown and the explorer does not generate.
    Returns (loaded version, reload seconds, wait seconds).
    """
    start = time.monotonic()
    reload_s = 0.0
    wait_s = 0.0  # the first look at the broadcast events does not wait
    while True:
        if receiver is not None:
            received = receiver.poll(wait_s)
            if received is not None:
                watcher.loaded_by_broadcast(received)
                reload_s += receiver.receive_s
        latest = watcher.poll()
        retry = False
        if latest is not None:
            load_start = time.monotonic()
            retry = not watcher.load(latest[0], engine.reload)
            reload_s += time.monotonic() - load_start
        loaded = watcher.loaded_version
        if not retry and loaded is not None and loaded >= need:
            return loaded, reload_s, time.monotonic() - start - reload_s
        if time.monotonic() - start > timeout_s:
            why = weights_problem(watcher.run_dir) or (
                f"is the trainer running? Check its log, or raise synchronizer.sync_timeout / "
                f"{lead_key}")
            raise SyncTimeoutError(
                f"waited {timeout_s:.0f}s for weights version >= {need} in {watcher.run_dir} "
                f"(loaded: {'none, a load was voided' if loaded is None else loaded}); {why}")
        if retry:
            wait_s = 0.0
        elif receiver is not None:
            wait_s = WEIGHTS_POLL_S  # the receiver waits on the trainer's events meanwhile
        else:
            time.sleep(WEIGHTS_POLL_S)


# ----------------------------------------------------------------------------- generation


@dataclass
class PromptJob:
    """A task whose prompt fits: what generation and scoring need."""

    slot: int
    task: T.Task
    taskset: T.Taskset
    row: dict
    ids: list[int]
    recipe: Recipe  # the row's single-turn workflow


def build_prompts(cfg: Config, tokenizer: Any, items: list[tuple[int, T.Task]],
                  tasksets: list[T.Taskset]) -> tuple[list[PromptJob], dict[str, int]]:
    """Prompt ids per task; a prompt over :func:`~rft.explorer.tasksets.prompt_token_limit` is
    left out (its task yields no experiences), counted in ``prompts_filtered`` and logged."""
    counts = {"prompts_filtered": 0}
    limit = T.prompt_token_limit(cfg)
    thinking = enable_thinking(cfg)
    jobs = []
    for slot, task in items:
        ts = tasksets[task.taskset]
        row = ts.rows[task.index]
        fmt = ts.config.format
        recipe = ts.workflow_of(row)
        ids = T.prompt_ids(tokenizer, recipe.build_messages(row, fmt),
                           reply_prefix=fmt.reply_prefix, enable_thinking=thinking,
                           chat_template=cfg.model.custom_chat_template)
        if limit is not None and len(ids) > limit:
            counts["prompts_filtered"] += 1
            continue
        jobs.append(PromptJob(slot, task, ts, row, ids, recipe))
    if counts["prompts_filtered"]:
        log.warning("%d of %d prompts are longer than %d tokens and were left out "
                    "(model.enable_prompt_truncation=%s)", counts["prompts_filtered"], len(items),
                    limit, cfg.model.enable_prompt_truncation)
    return jobs, counts


def generate(engine: Engine, jobs: list[PromptJob]) -> tuple[list[list[Sample]], dict[str, float]]:
    """Samples per job (taskset sampling settings), with generation throughput."""
    start = time.monotonic()
    groups = engine.generate([j.ids for j in jobs], [j.taskset.sampling for j in jobs])
    seconds = time.monotonic() - start
    tokens = sum(len(s.response_ids) for g in groups for s in g)
    return groups, {GENERATED_TOKENS: tokens, GENERATE_TIME_S: seconds,
                    GENERATE_TOKENS_PER_S: tokens / seconds if seconds > 0 else 0.0}


def score(job: PromptJob, sample: Sample) -> dict[str, float]:
    """The rule reward's parts of one sample (the workflow's reward function)."""
    fmt = job.taskset.config.format
    truth = job.recipe.ground_truth(job.row, fmt)
    return job.recipe.score(sample.text, truth, fmt.reply_prefix)


def score_all(jobs: list[PromptJob], groups: list[list[Sample]], reward_models: Sequence[RewardModel] = (),
              ) -> tuple[list[list[tuple[float, dict[str, float]]]], dict[str, float]]:
    """(reward, parts) of every sample, grouped as ``groups``: the rule's parts, and with reward
    models their scores, each model scoring all the samples in one call; combined by the
    taskset's weights (:meth:`rft.workflow.single_turn.Recipe.reward`)."""
    flat = [(job, sample) for job, group in zip(jobs, groups) for sample in group]
    scores: list[list[float]] = [[] for _ in flat]
    stats: dict[str, float] = {}
    if reward_models and flat:
        start = time.monotonic()
        prompts = {id(job): job.recipe.build_messages(job.row, job.taskset.config.format)
                   for job in jobs}
        conversations = [conversation(prompts[id(job)], sample.text) for job, sample in flat]
        for model in reward_models:
            for mine, value in zip(scores, model.score(conversations)):
                mine.append(value)
        stats = {"reward_model_time_s": time.monotonic() - start,
                 "reward_model_truncated": sum(m.last_truncated for m in reward_models)}
    rewards = [job.recipe.reward(score(job, sample), mine)
               for (job, sample), mine in zip(flat, scores)]
    out, first = [], 0
    for group in groups:
        out.append(rewards[first:first + len(group)])
        first += len(group)
    return out, stats


def rollout(cfg: Config, engine: Engine, tasksets: list[T.Taskset], items: list[tuple[int, T.Task]],
            step: int, version: int, writer: str, reward_models: Sequence[RewardModel] = (),
            ) -> tuple[list[Experience], dict[str, float]]:
    """Generate and score this task's share of a step: experiences (groups adjacent) + stats.
    Tasks of single-turn recipes go to the engine in one call; tasks of workflow classes run
    as concurrent episodes (:func:`rollout_episodes`)."""
    by_class = [(slot, t) for slot, t in items
                if isinstance(tasksets[t.taskset].workflow_of(tasksets[t.taskset].rows[t.index]),
                              T.WorkflowClass)]
    if by_class:
        episode_exps, episode_stats = rollout_episodes(cfg, engine, tasksets, by_class, step,
                                                       version, writer)
        items = [item for item in items if item not in by_class]
    else:
        episode_exps, episode_stats = [], {}
    jobs, counts = build_prompts(cfg, engine.tokenizer, items, tasksets)
    groups, stats = generate(engine, jobs)
    rewards, score_stats = score_all(jobs, groups, reward_models)
    exps = []
    for job, group, group_rewards in zip(jobs, groups, rewards):
        group_id = f"{writer}:{step}:{job.slot}"
        for sample, (reward, parts) in zip(group, group_rewards):
            exps.append(Experience(
                task_id=f"{job.taskset.name}/{job.task.index}", group_id=group_id,
                prompt_ids=sample.prompt_ids, response_ids=sample.response_ids,
                logprobs=sample.logprobs, reward=reward, reward_parts=parts,
                model_version=version, temperature=job.taskset.sampling.temperature,
                truncated=sample.truncated, response_text=sample.text,
                info={"step": step, "epoch": job.task.epoch, "taskset": job.taskset.name}))
    generated = stats[GENERATED_TOKENS] + episode_stats.get(GENERATED_TOKENS, 0)
    return exps + episode_exps, {**counts, **stats, **score_stats, **episode_stats,
                                 GENERATED_TOKENS: generated, "tasks": len(items) + len(by_class)}


def enable_thinking(cfg: Config) -> bool | None:
    """The chat template's thinking switch: ``model.enable_thinking``, else the rollout model's."""
    return cfg.model.enable_thinking if cfg.model.enable_thinking is not None \
        else cfg.explorer.rollout_model.enable_thinking


_TEMPLATES: dict[tuple[str, str | None], ChatTemplate] = {}


def episode_template(cfg: Config) -> ChatTemplate:
    """The chat template episodes render with: a tokenizer of their own (the engine's is used by
    the engine's thread meanwhile), loaded once per model folder."""
    key = (cfg.model.model_path, cfg.model.custom_chat_template)
    if key not in _TEMPLATES:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(cfg.model.model_path)
        _TEMPLATES[key] = ChatTemplate(tokenizer, cfg.model.custom_chat_template)
    template = _TEMPLATES[key]
    template.extra = {} if enable_thinking(cfg) is None else {"enable_thinking": enable_thinking(cfg)}
    return template


def rollout_episodes(cfg: Config, engine: Engine, tasksets: list[T.Taskset],
                     items: list[tuple[int, T.Task]], step: int, version: int, writer: str,
                     ) -> tuple[list[Experience], dict[str, float]]:
    """Run the workflow classes of ``items`` (``explorer.runner_per_model`` episodes at once,
    each stopped at ``explorer.max_timeout``); their experiences, one group per task."""
    jobs: list[EpisodeJob] = []
    where: dict[int, tuple[T.Taskset, T.Task]] = {}
    for slot, task in items:
        ts = tasksets[task.taskset]
        row = dict(ts.rows[task.index])
        choice = ts.workflow_of(row)
        s = ts.sampling
        workflow_task = WorkflowTask(
            workflow=choice.cls, repeat_times=s.n, format_args=ts.config.format,
            rollout_args=GenerationArgs(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                        logprobs=s.logprobs, max_tokens=s.max_tokens),
            workflow_args=dict(ts.config.workflow_args), reward_fn_args=dict(ts.config.reward_fn_args),
            is_eval=writer == "eval", reward_fn=choice.reward_fn, raw_task=row, batch_id=step,
            task_id=f"{ts.name}/{task.index}")
        jobs += episode_jobs(slot, workflow_task, choice.cls)
        where[slot] = (ts, task)
    rollout = cfg.explorer.rollout_model
    parser = rollout.tool_call_parser if rollout.enable_auto_tool_choice else None
    before = tools.COUNTS.snapshot()
    results, stats = run_episodes(jobs, engine, episode_template(cfg), version,
                                  concurrency=cfg.explorer.runner_per_model,
                                  timeout_s=cfg.explorer.max_timeout,
                                  max_model_len=engine.max_model_len, tool_parser=parser)
    used = tools.counts_since(before)
    stats.update({TOOL_CALLS: used["calls"], TOOL_ERRORS: used["errors"],
                  TOOL_TIMEOUTS: used["timeouts"],
                  GENERATED_TOKENS: sum(sum(e.action_mask) if e.action_mask else len(e.response_ids)
                                        for r in results for e in r.experiences)})
    exps: list[Experience] = []
    for result in sorted(results, key=lambda r: r.job.slot):  # groups adjacent
        ts, task = where[result.job.slot]
        info = {"step": step, "epoch": task.epoch, "taskset": ts.name}
        for exp in result.experiences:
            record = to_record(exp, result.job.task, f"{writer}:{step}:{result.job.slot}", version,
                               ts.sampling.temperature, info)
            if record is not None:
                exps.append(record)
    return exps, stats


# ----------------------------------------------------------------------------- metrics, eval


def accuracy_of(exp: Experience) -> float:
    """The ``accuracy`` reward part, or the reward when the reward function has no such part."""
    return float(exp.reward_parts.get("accuracy", exp.reward))


def step_metrics(exps: list[Experience]) -> dict[str, float]:
    """Reward statistics, each reward part, accuracy, response lengths, truncation rate."""
    if not exps:
        return {"experiences": 0}
    rewards = [e.reward for e in exps]
    lengths = [len(e.response_ids) for e in exps]
    out = {"experiences": len(exps), REWARD_MEAN: statistics.fmean(rewards),
           "reward/std": statistics.pstdev(rewards), "reward/max": max(rewards),
           "reward/min": min(rewards), ACCURACY: statistics.fmean(map(accuracy_of, exps)),
           "response_length/mean": statistics.fmean(lengths),
           RESPONSE_LENGTH_MAX: max(lengths),
           "truncation_rate": sum(e.truncated for e in exps) / len(exps)}
    for part in sorted({p for e in exps for p in e.reward_parts}):
        out[f"reward/{part}/mean"] = statistics.fmean(e.reward_parts.get(part, 0.0) for e in exps)
    return out


def eval_taskset_metrics(name: str, k: int, groups: list[list[Experience]]) -> dict[str, float]:
    """mean@k (mean accuracy over all samples) and pass@k (tasks with an accurate sample)."""
    samples = [e for g in groups for e in g]
    if not samples:
        return {f"eval/{name}/tasks": 0}
    return {f"eval/{name}/mean@{k}": statistics.fmean(map(accuracy_of, samples)),
            f"eval/{name}/pass@{k}": statistics.fmean(
                float(any(accuracy_of(e) >= 1.0 for e in g)) for g in groups),
            f"eval/{name}/reward_mean": statistics.fmean(e.reward for e in samples),
            f"eval/{name}/response_length_mean": statistics.fmean(len(e.response_ids) for e in samples),
            f"eval/{name}/tasks": len(groups)}


def evaluate(cfg: Config, engine: Engine, eval_sets: list[T.Taskset], monitor: Monitor,
             step: int, watcher: WeightsWatcher,
             reward_models: Sequence[RewardModel] = ()) -> dict[str, Any]:
    """Every row of every eval taskset with its rollout_args; metrics to the monitor only."""
    version = watcher.loaded_version or 0
    metrics: dict[str, Any] = {EVAL_WEIGHTS_VERSION: version}
    start = time.monotonic()
    for ts in eval_sets:
        items = [(i, T.Task(0, i, 0)) for i in range(len(ts))]
        exps, _ = rollout(cfg, engine, [ts], items, step, version, "eval", reward_models)
        groups = [[e for e in exps if e.group_id == g] for g in dict.fromkeys(e.group_id for e in exps)]
        metrics.update(eval_taskset_metrics(ts.name, ts.sampling.n, groups))
    metrics["eval/time_s"] = time.monotonic() - start
    monitor.log(step, metrics)
    return metrics


# ----------------------------------------------------------------------------- entry


def install_exit_handlers(heartbeat: Heartbeat) -> None:
    """SIGTERM/SIGUSR1: mark the heartbeat exited and leave at once (unsealed batch lost)."""
    def _exit(signum: int, _frame: Any) -> None:
        log.warning("signal %d: exiting now (sealed segments are kept)", signum)
        try:  # not heartbeat.beat(): the interrupted code may hold its lock
            atomic.write_json(heartbeat.path, {**heartbeat.fields, "exited": True,
                                               LOADING_FIELD: None, "time": time.time()})
        finally:
            os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, _exit)


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    args = config_parser("python -m rft.explorer", "Run one explorer task (one vLLM engine).",
                         stage=True).parse_args(argv)

    def body() -> int:
        cfg = load_stage(args.config, args.overrides, args.stage)
        if cfg.mode not in EXPLORER_MODES:
            raise ConfigError(f"mode '{cfg.mode}' runs no explorer loop; use mode both or explore")
        result = run_explorer(cfg, handle_signals=True)
        log.info("explorer done: %d steps, weights version %d", len(result.steps), result.loaded_version)
        return EXIT_OK

    return run_command(body)
