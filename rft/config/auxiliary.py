"""Models served next to the explorers (``explorer.auxiliary_models``): their rules.

An entry is a generative model (a judge workflow classes call), a reward model (scores
single-turn recipes) or a distillation teacher; its folder decides which
(:func:`rft.models.auxiliary_kinds`). Owns each entry's config checks
(:func:`check_auxiliary_models`, run by :func:`rft.config.rules.apply`), the dtype of an
auxiliary model's forward pass (:func:`forward_dtype`) and the reward weights a taskset's
``reward_fn_args`` carry (:func:`split_reward_weights`). Pure functions of a typed :class:`~rft.config.schema.Config`;
where a distillation teacher runs is :mod:`rft.config.teacher`, the GPU split
:func:`rft.config.gpus.check_gpu_split`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from rft.config.schema import AuxiliaryModelConfig, Config
from rft.config.teacher import explorer_scorers, teacher_in_trainer
from rft.errors import ConfigError
from rft.placement import ENGINE_MODES, EXPLORER_MODES

RULE_WEIGHT_KEY = "rule_weight"  # reward_fn_args key: weight of the rule reward's parts
REWARD_MODEL_WEIGHT_KEY = "reward_model_weight"  # reward_fn_args key: weight of the model scores
REWARD_WEIGHT_KEYS = (RULE_WEIGHT_KEY, REWARD_MODEL_WEIGHT_KEY)


@dataclass(frozen=True)
class RewardWeights:
    """How a taskset's reward combines its parts: ``rule_weight * sum(rule parts) +
    reward_model_weight * sum(reward model scores)``."""

    rule_weight: float = 1.0  # times the sum of the rule reward's parts
    reward_model_weight: float = 1.0  # times the sum of the reward models' scores


FORWARD_DTYPES = ("bfloat16", "float16", "float32")  # torch dtype names a forward pass runs in


def shared_auxiliary(cfg: Config) -> list[int]:
    """Indices of the auxiliary models the explorer tasks share, Trinity's layout: an
    ``engine_num`` other than the rollout model's means that many engines serve every rollout
    engine. They run in the auxiliary task group, one task per engine
    (:func:`shared_engines`, :mod:`rft.explorer.auxiliary_server`); a distillation teacher
    with another ``engine_num`` runs in the trainer instead (:func:`rft.config.teacher.
    teacher_in_trainer`). An entry with the rollout model's ``engine_num`` runs inside each
    explorer task; in bench mode and rft-debug the one process serves every model."""
    if cfg.mode not in EXPLORER_MODES:
        return []  # bench and rft-debug: one process serves every model
    engines = cfg.explorer.rollout_model.engine_num
    return [
        i
        for i, m in enumerate(explorer_scorers(cfg))
        if m.engine_num != engines and not (i == 0 and teacher_in_trainer(cfg))
    ]


def shared_engines(cfg: Config) -> list[tuple[int, int]]:
    """The auxiliary task group's tasks in rank order: (model index, engine index) for each
    engine of each shared auxiliary model (:func:`shared_auxiliary`)."""
    models = cfg.explorer.auxiliary_models
    return [(i, j) for i in shared_auxiliary(cfg) for j in range(models[i].engine_num)]


def shared_tp(cfg: Config) -> int:
    """GPUs of one auxiliary task (the shared models' common ``tensor_parallel_size``, checked
    equal by :func:`check_auxiliary_models`); 0 without shared models."""
    shared = shared_auxiliary(cfg)
    return cfg.explorer.auxiliary_models[shared[0]].tensor_parallel_size if shared else 0


def auxiliary_tp(cfg: Config) -> list[int]:
    """The ``tensor_parallel_size`` of each auxiliary model inside an explorer task, in config
    order (GPUs of its engine or scorer; a teacher the trainer holds has none there, a shared
    model 0: it runs in the auxiliary task group)."""
    shared = set(shared_auxiliary(cfg))
    return [
        0 if i in shared else m.tensor_parallel_size for i, m in enumerate(explorer_scorers(cfg))
    ]


def forward_dtype(requested: Optional[str], on_cpu: bool, folder: Mapping[str, Any]) -> str:
    """The torch dtype name an auxiliary model's forward pass runs in: its ``dtype`` as set
    (the rollout model's choices, :data:`rft.config.schema.EngineDtype`); ``auto`` the
    checkpoint's (``folder``: its config.json, ``dtype`` or older ``torch_dtype``, when one of
    :data:`FORWARD_DTYPES`); unset, or auto without one: bfloat16 on a GPU, float32 on CPUs."""
    saved = folder.get("dtype") or folder.get("torch_dtype")
    if requested == "auto" and saved in FORWARD_DTYPES:
        return saved
    if requested in FORWARD_DTYPES:
        return requested
    return "float32" if on_cpu else "bfloat16"


def scoring_max_len(model: AuxiliaryModelConfig) -> Optional[int]:
    """Most tokens a reward model scores in one conversation: ``max_model_len``, else
    ``max_prompt_tokens + max_response_tokens`` when both are set, else None (the model's
    own ``max_position_embeddings`` then)."""
    if model.max_model_len is not None:
        return model.max_model_len
    if model.max_prompt_tokens is not None and model.max_response_tokens is not None:
        return model.max_prompt_tokens + model.max_response_tokens
    return None


def split_reward_weights(
    args: Mapping[str, Any], reward_models: int, label: str = "reward_fn_args"
) -> tuple[RewardWeights, dict[str, Any]]:
    """``reward_fn_args`` -> (the reward weights, the arguments left for the rule reward).

    ``reward_models``: how many ``explorer.auxiliary_models`` the run has; without any, the
    weight keys are errors (there is nothing to weigh the rule against). ``label`` prefixes
    messages (the taskset's key path).
    """
    args = dict(args or {})
    given = {key: args.pop(key) for key in REWARD_WEIGHT_KEYS if key in args}
    if given and not reward_models:
        raise ConfigError(
            f"{label}.{', '.join(sorted(given))}: weighs the rule reward against "
            "reward models, but explorer.auxiliary_models is empty; remove the key "
            "or add a reward model (explorer.auxiliary_models: [{model_path: ...}])"
        )
    for key, value in given.items():
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise ConfigError(
                f"{label}.{key}: {value!r} is not a finite number; use e.g. {key}: 0.5"
            )
    weights = RewardWeights(**{k: float(v) for k, v in given.items()})
    return weights, args


def check_auxiliary_models(cfg: Config) -> None:
    """Each auxiliary model: a folder path; the shared ones (another
    ``engine_num`` than the rollout model's: :func:`shared_auxiliary`) of one
    ``tensor_parallel_size``; reward weights in ``reward_fn_args`` only with reward models."""
    models = cfg.explorer.auxiliary_models
    shared = shared_auxiliary(cfg)
    sizes = {models[i].tensor_parallel_size for i in shared}
    if len(sizes) > 1:
        listed = ", ".join(f"[{i}]: {models[i].tensor_parallel_size}" for i in shared)
        raise ConfigError(
            f"explorer.auxiliary_models shared by the explorers (an engine_num other than "
            f"explorer.rollout_model.engine_num={cfg.explorer.rollout_model.engine_num}) have "
            f"different tensor_parallel_size ({listed}): rft runs their engines as one SLURM "
            "task group with one GPU count per task; give them one tensor_parallel_size, or "
            "give a model the rollout model's engine_num to run a copy inside each explorer task"
        )
    if cfg.mode in ENGINE_MODES:
        for label, taskset in cfg.labelled_tasksets():
            split_reward_weights(taskset.reward_fn_args, len(models), f"{label}.reward_fn_args")
    for i, model in enumerate(models):
        key = f"explorer.auxiliary_models[{i}]"
        if not model.model_path:
            raise ConfigError(
                f"{key}.model_path is empty: set it to the auxiliary model's Hugging Face "
                "folder: a causal LM (*ForCausalLM) that workflow classes call, e.g. as a "
                "judge, or a reward model (*ForSequenceClassification) that scores "
                "single-turn recipes"
            )
