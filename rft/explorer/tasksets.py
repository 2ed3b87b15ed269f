"""Tasksets: dataset rows -> tasks in a resumable order -> prompt token ids.

Data in: ``buffer.explorer_input`` tasksets (local datasets found by :func:`rft.data.resolve`,
loaded with ``datasets``), ``buffer.batch_size``/``total_epochs``/``total_steps``, and the
explorer task's rank and count. Data out: per step, the step's tasks (:class:`Task`) and the
:class:`Cursor` after it (saved by :mod:`rft.explorer.cursor`, which deals the slots to ranks).
Every explorer task computes the same stream, so no coordination is needed (:class:`TaskStream`).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Union

from rft import data
from rft.config.auxiliary import split_reward_weights
from rft.config.queries import taskset_temperature
from rft.config.schema import Config, TasksetConfig
from rft.data import planned_steps
from rft.errors import ConfigError, DataError, NotSupportedError, WorkflowError
from rft.explorer import selectors
from rft.explorer.pass_rates import PassRateBoard
from rft.models import REWARD_MODEL, TEACHER, auxiliary_kinds
from rft.rundir import EXPLORER_META
from rft.workflow import single_turn
from rft.workflow.recording import WorkflowWithRecording
from rft.workflow.registry import workflow_class
from rft.workflow.requires import unmet
from rft.workflow.reward_fn import reward_fn_class
from rft.workflow.single_turn import Recipe, get_workflow

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- loading


@dataclass(frozen=True)
class SamplingArgs:
    """Sampling settings of one prompt, the one type the engine takes: a taskset's (model.*
    defaults overridden by its rollout_args), or a workflow's model call (:meth:`of`)."""

    n: int = 1  # samples per prompt (repeat_times)
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = -1  # -1: disabled
    max_tokens: int = 128  # response token limit
    min_tokens: int = 0  # response token floor
    stop: tuple[str, ...] = ()  # stop strings (kept at the end of the response)
    logprobs: int = 0  # extra top log-probs (the sampled token's is always returned)
    # log-probs of the prompt's tokens too (None: not computed; 0: each token's own)
    prompt_logprobs: Optional[int] = None
    # further vLLM SamplingParams keywords, (name, value) sorted by name (hashable when the
    # values are): repetition_penalty, seed, stop_token_ids, ...
    extra: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, keywords: Mapping[str, Any]) -> "SamplingArgs":
        """A model call's vLLM ``SamplingParams`` keywords (the model handle checked their
        names): this class's fields, the others in :attr:`extra`."""
        own = {f.name for f in fields(cls)} - {"extra"}
        stop = keywords.get("stop") or ()
        return cls(
            **{k: v for k, v in keywords.items() if k in own and k != "stop"},
            stop=(stop,) if isinstance(stop, str) else tuple(stop),
            extra=tuple(sorted((k, v) for k, v in keywords.items() if k not in own)),
        )


@dataclass(frozen=True)
class WorkflowClass:
    """A ``rft.workflow.Workflow`` subclass a taskset runs, with the reward its tasks carry."""

    cls: type
    reward_fn: Optional[type] = None  # a RewardFn subclass (Task.reward_fn), or None

    @property
    def name(self) -> str:
        return f"{self.cls.__module__}.{self.cls.__qualname__}"


WorkflowChoice = Union[Recipe, WorkflowClass]  # the explorer batches recipes, runs classes


@dataclass
class Taskset:
    """A loaded taskset with its workflow and sampling settings."""

    label: str  # config key path, for messages
    name: str  # for task ids and metrics
    config: TasksetConfig
    rows: Any  # datasets.Dataset (row i: rows[i], a dict)
    workflow: WorkflowChoice  # the taskset's workflow (a row may name another: format.workflow_key)
    sampling: SamplingArgs  # n = repeat_times
    resolve: Callable[[Optional[str], Optional[str]], WorkflowChoice]  # per-row names -> choice
    _chosen: dict = field(default_factory=dict)  # (workflow, reward) names -> choice

    def __len__(self) -> int:
        return len(self.rows)

    def workflow_of(self, row: dict) -> WorkflowChoice:
        """The row's workflow: its ``format.workflow_key`` / ``reward_fn_key`` columns when set
        and not empty, else the taskset's."""
        fmt = self.config.format
        name = row.get(fmt.workflow_key) if fmt.workflow_key else None
        reward = row.get(fmt.reward_fn_key) if fmt.reward_fn_key else None
        if not name and not reward:
            return self.workflow
        key = (name or "", reward or "")
        if key not in self._chosen:
            self._chosen[key] = self.resolve(name or None, reward or None)
        return self._chosen[key]


def workflow_names(cfg: Config, ts: TasksetConfig, is_eval: bool) -> tuple[str, Optional[str]]:
    """The taskset's workflow and reward function names (its own, else explorer_input's)."""
    inputs = cfg.buffer.explorer_input
    default_wf = (
        (inputs.default_eval_workflow_type or inputs.default_workflow_type)
        if is_eval
        else inputs.default_workflow_type
    )
    return (
        ts.default_workflow_type or default_wf or "simple_workflow",
        ts.default_reward_fn_type or inputs.default_reward_fn_type,
    )


def resolve_workflow(
    cfg: Config, ts: TasksetConfig, label: str, name: str, reward: Optional[str]
) -> WorkflowChoice:
    """A single-turn recipe with its reward and ``reward_fn_args`` bound, or a workflow class
    with its reward's RewardFn class (both found in plugins too), checked; ConfigError naming
    ``label``. ``rule_weight`` /
    ``reward_model_weight`` are taken out of ``reward_fn_args`` first: they weigh the rule
    against ``explorer.auxiliary_models`` (:mod:`rft.config.auxiliary`)."""
    weights, rule_args = split_reward_weights(
        ts.reward_fn_args, len(cfg.explorer.auxiliary_models), f"{label}.reward_fn_args"
    )
    try:
        if name in single_turn.WORKFLOWS:
            return get_workflow(name, reward, rule_args or None, weights, ts.workflow_args)
        refuse_scorers(cfg, name)
        cls = workflow_class(name, single_turn.WORKFLOWS)
        return WorkflowClass(cls, reward_fn_class(reward, rule_args) if reward else None)
    except (ConfigError, WorkflowError) as e:
        kind = type(e) if isinstance(e, ConfigError) else ConfigError  # keeps NotSupportedError
        raise kind(f"{label}: {e}") from e


def refuse_scorers(cfg: Config, name: str) -> None:
    """A workflow class sets its own rewards: the ``explorer.auxiliary_models`` that score
    single-turn workflows' samples (a reward model, a distillation teacher) make no sense with
    it (ConfigError); a generative one (a judge) is the workflow's to call."""
    for i, kind in enumerate(auxiliary_kinds(cfg) if cfg.explorer.auxiliary_models else []):
        key = f"explorer.auxiliary_models[{i}]"
        if kind == TEACHER:
            raise ConfigError(
                f"workflow {name!r}: {key} is algorithm.advantage_fn "
                f"{cfg.algorithm.advantage_fn}'s teacher, which scores single-turn workflows' "
                "samples only (a workflow class's would reach the trainer without "
                "teacher_logprobs); use a single-turn workflow such as math_workflow"
            )
        if kind == REWARD_MODEL:
            raise ConfigError(
                f"workflow {name!r}: {key} is a reward model (a score head), which scores "
                "single-turn workflows' samples only, and a workflow class sets its own "
                "rewards; remove it, or point it at a causal LM (*ForCausalLM) that the "
                "workflow calls as a judge (self.auxiliary_model_wrappers[k], "
                "self.auxiliary_models[k])"
            )


def taskset_workflow(cfg: Config, ts: TasksetConfig, label: str, is_eval: bool) -> WorkflowChoice:
    """The taskset's workflow (preflight calls this too, so a misspelt name, a missing plugin
    module, a bad workflow signature or a recording agent without its endpoint fails on the
    login node)."""
    choice = resolve_workflow(cfg, ts, label, *workflow_names(cfg, ts, is_eval))
    check_endpoint(cfg, choice, label)
    check_requirements(choice, label)
    check_workflow_args(choice, ts, label)
    return choice


def check_requirements(choice: WorkflowChoice, label: str) -> None:
    """ConfigError naming what to install when the workflow class needs a package or program
    this machine lacks (its ``requires``, :mod:`rft.workflow.requires`)."""
    missing = unmet(choice.cls) if isinstance(choice, WorkflowClass) else []
    if missing:
        raise ConfigError(f"{label}: workflow {choice.name} needs " + "; and ".join(missing))


def check_workflow_args(choice: WorkflowChoice, ts: TasksetConfig, label: str) -> None:
    """ConfigError when the workflow class refuses the taskset's ``workflow_args`` (its
    ``check_workflow_args``); NotSupportedError when they name a Trinity option it lacks."""
    if isinstance(choice, WorkflowClass):
        try:
            choice.cls.check_workflow_args(ts.workflow_args)
        except NotSupportedError as e:  # a Trinity option the class names and lacks
            raise NotSupportedError(f"{label}.workflow_args: {e}") from e
        except WorkflowError as e:
            raise ConfigError(f"{label}.workflow_args: {e}") from e


def check_endpoint(cfg: Config, choice: WorkflowChoice, label: str) -> None:
    """A ``WorkflowWithRecording`` talks to the OpenAI-compatible endpoint only: ConfigError
    when ``explorer.rollout_model.enable_openai_api`` is off (else every episode would fail)."""
    if not isinstance(choice, WorkflowClass) or cfg.explorer.rollout_model.enable_openai_api:
        return
    if issubclass(choice.cls, WorkflowWithRecording):
        raise ConfigError(
            f"{label}: workflow {choice.name} is a WorkflowWithRecording: its agent reaches "
            "the model through the explorer's OpenAI-compatible endpoint, which is off; set "
            "explorer.rollout_model.enable_openai_api: true"
        )


def required_columns(
    ts: TasksetConfig, workflow: Optional[WorkflowChoice], label: str
) -> dict[str, str]:
    """Columns the taskset must have (config key -> column): a recipe's prompt and answer
    (:func:`rft.data.task_columns`; also when the workflow is not resolved here), else the
    per-row workflow/reward columns that are set (a workflow class reads the row its own way);
    and the ``data_selector.feature_keys`` columns."""
    features = {
        f"{label}.data_selector.feature_keys[{i}]": key
        for i, key in enumerate(ts.data_selector.feature_keys)
    }
    if workflow is None or isinstance(workflow, Recipe):
        return {**data.task_columns(ts.format, label), **features}
    keys = {"workflow_key": ts.format.workflow_key, "reward_fn_key": ts.format.reward_fn_key}
    return {f"{label}.format.{k}": column for k, column in keys.items() if column} | features


def open_taskset(cfg: Config, ts: TasksetConfig, label: str, is_eval: bool) -> Taskset:
    """Load one taskset and resolve its workflow, reward and sampling settings."""
    workflow = taskset_workflow(cfg, ts, label, is_eval)
    rows = data.load_split(
        ts.path, ts.split, ts.subset_name, label, required_columns(ts, workflow, label)
    )
    name = ts.name or Path(ts.path).name
    log.info(
        "%s: %d tasks from %s (%s), workflow %s", label, len(rows), ts.path, ts.split, workflow.name
    )
    resolve = lambda wf, reward: resolve_workflow(  # noqa: E731
        cfg,
        ts,
        label,
        wf or workflow_names(cfg, ts, is_eval)[0],
        reward or workflow_names(cfg, ts, is_eval)[1],
    )
    return Taskset(label, name, ts, rows, workflow, sampling_args(cfg, ts), resolve)


def sampling_args(cfg: Config, ts: TasksetConfig) -> SamplingArgs:
    """model.* generation settings, overridden by the taskset's rollout_args."""
    m, r = cfg.model, ts.rollout_args
    pick = lambda override, default: default if override is None else override  # noqa: E731
    return SamplingArgs(
        n=ts.repeat_times or cfg.algorithm.repeat_times,
        temperature=taskset_temperature(cfg, ts),
        top_p=pick(r.top_p, m.top_p),
        top_k=pick(r.top_k, m.top_k),
        logprobs=pick(r.logprobs, m.logprobs),
        max_tokens=pick(r.max_tokens, m.max_response_tokens or 128),
        min_tokens=m.min_response_tokens,
    )


def sampling_defaults(cfg: Config) -> dict[str, Any]:
    """SamplingParams keywords every call of the rollout model takes unless it sets them:
    ``model.repetition_penalty`` (Trinity's InferenceModelConfig default for chat/generate)."""
    penalty = cfg.model.repetition_penalty
    return {} if penalty == 1.0 else {"repetition_penalty": penalty}


def training_tasksets(cfg: Config) -> list[Taskset]:
    """``buffer.explorer_input.taskset`` / ``tasksets`` loaded, in config order."""
    return [
        open_taskset(cfg, ts, label, is_eval=False)
        for label, ts in cfg.labelled_tasksets(evaluation=False)
    ]


def eval_tasksets(cfg: Config) -> list[Taskset]:
    return [
        open_taskset(cfg, ts, label, is_eval=True)
        for label, ts in cfg.labelled_tasksets(training=False)
    ]


# ----------------------------------------------------------------------------- task order


@dataclass(frozen=True)
class Task:
    """One row of one taskset, as scheduled."""

    taskset: int  # index into the training (or eval) taskset list
    index: int  # row index
    epoch: int  # pass over the taskset (0-based)


@dataclass
class Cursor:
    """Where the task stream stands after ``step`` completed steps (JSON-serialisable)."""

    step: int = 0  # steps completed (steps are numbered from 1)
    positions: list[int] = field(default_factory=list)  # tasks taken from each training taskset
    turn: int = 0  # taskset whose turn is next in the round-robin

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Cursor":
        try:
            return cls(int(d["step"]), [int(p) for p in d["positions"]], int(d["turn"]))
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(
                f"{EXPLORER_META}: malformed task cursor {d!r} ({e}); delete the "
                "explorer's entry to restart its tasks from the beginning"
            ) from e


class TaskStream:
    """The training tasks in order, step by step, from a :class:`Cursor`; every explorer task
    computes the same stream, so no coordination is needed.

    Each taskset's rows come in its ``data_selector`` order (:mod:`rft.explorer.selectors`).
    Several training tasksets are interleaved round-robin in config order, one task from each in
    turn; a taskset that has run out (after ``total_epochs`` passes) drops out of the rotation;
    with ``buffer.total_steps`` set, tasksets cycle past their epochs until that step.
    """

    def __init__(
        self,
        tasksets: list[Taskset],
        batch_size: int,
        total_epochs: int,
        total_steps: Optional[int],
        board: Optional[PassRateBoard] = None,
        check: Callable[[], None] = lambda: None,
    ):
        if not tasksets:
            raise DataError("no training taskset: set buffer.explorer_input.taskset")
        draw = selectors.draw_size(batch_size, len(tasksets))
        self.tasksets = tasksets
        self.selectors = [
            selectors.build(t.config.data_selector, len(t), t.rows, t.label, draw, i)
            for i, t in enumerate(tasksets)
        ]
        self.adaptive = [s for s in self.selectors if isinstance(s, selectors.DifficultySelector)]
        assert not self.adaptive or len(tasksets) == 1, "config rules: one taskset"
        assert board is not None or not self.adaptive, "difficulty_based reads a pass-rate board"
        self.board, self.check = board, check
        self.batch_size = batch_size
        self.total_steps = planned_steps(
            [len(t) for t in tasksets], total_epochs, batch_size, total_steps
        )
        # With total_steps set, tasksets cycle; otherwise each stops after total_epochs passes.
        self.limits = [None if total_steps else len(t) * total_epochs for t in tasksets]

    def new_cursor(self) -> Cursor:
        return Cursor(0, [0] * len(self.selectors), 0)

    def finished(self, cursor: Cursor) -> bool:
        return cursor.step >= self.total_steps

    def _has_more(self, cursor: Cursor, i: int) -> bool:
        return self.limits[i] is None or cursor.positions[i] < self.limits[i]

    def _next(self, cursor: Cursor) -> Task | None:
        count = len(self.selectors)
        for k in range(count):
            i = (cursor.turn + k) % count
            if self._has_more(cursor, i):
                index, epoch = self.selectors[i].row(cursor.positions[i])
                cursor.positions[i] += 1
                cursor.turn = (i + 1) % count
                return Task(i, index, epoch)
        return None

    def ready(self, step: int) -> bool:
        """Whether :meth:`next_batch` of ``step`` can draw without waiting (difficulty_based:
        the pass rates it follows are posted by every explorer task)."""
        return all(s.ready(self.board, step) for s in self.adaptive)

    def next_batch(self, cursor: Cursor) -> list[Task]:
        """The next step's ``batch_size`` tasks (all ranks; the last step of a finite run may
        take fewer); advances ``cursor`` (its step included). difficulty_based: first reads
        the pass rates the step follows, waiting for their posts."""
        assert len(cursor.positions) == len(self.selectors), "cursor matches the tasksets"
        for selector in self.adaptive:
            selector.feed(self.board, cursor.step + 1, self.check)
        batch: list[Task] = []
        while len(batch) < self.batch_size:
            task = self._next(cursor)
            if task is None:
                break
            batch.append(task)
        cursor.step += 1
        return batch


def rank_share(batch: list[Task], rank: int, count: int) -> list[tuple[int, Task]]:
    """(slot, task) pairs of ``rank``: slots rank, rank + count, ... of the step's batch."""
    return [(slot, task) for slot, task in enumerate(batch) if slot % count == rank]


# ----------------------------------------------------------------------------- prompts


def prompt_ids(
    tokenizer: Any,
    messages: list[dict[str, str]],
    *,
    reply_prefix: str | None = None,
    chat_template: str | None = None,
    enable_thinking: bool | None = None,
) -> list[int]:
    """Token ids of ``messages`` rendered with the tokenizer's chat template (or
    ``chat_template``: ``model.custom_chat_template``), never cut; a reply prefix is continued."""
    extra = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    text = tokenizer.apply_chat_template(
        messages,
        tokenize=False,
        chat_template=chat_template,
        add_generation_prompt=not reply_prefix,
        continue_final_message=bool(reply_prefix),
        **extra,
    )
    return list(tokenizer.encode(text, add_special_tokens=False))


def prompt_token_limit(cfg: Config) -> int | None:
    """Most prompt tokens (after the chat template) a task may have to be generated, or None.

    ``enable_prompt_truncation: true`` (Trinity's default, veRL's ``filter_overlong_prompts``):
    ``model.max_prompt_tokens``; a longer prompt is left out, not cut (Trinity emits a masked
    placeholder experience for it, which trains on nothing either). ``false``: the prompt is not
    held to ``max_prompt_tokens`` (as Trinity); only a prompt vLLM would refuse, with no room
    for a response token in ``max_model_len``, is left out (under true too, when no
    ``max_prompt_tokens`` is set). ``true`` is the default.

    The explorer leaves such a task out of its step and counts it; the task stream (and so the
    cursor and every step boundary) is unchanged, so resuming replays the same decision.
    """
    max_model_len = (
        cfg.explorer.rollout_model.max_model_len or cfg.model.max_model_len
    )  # as the engine's
    room = None if max_model_len is None else max_model_len - 1
    prompt_limit = cfg.model.max_prompt_tokens if cfg.model.enable_prompt_truncation else None
    if prompt_limit is None or room is None:
        return room if prompt_limit is None else prompt_limit
    return min(prompt_limit, room)
