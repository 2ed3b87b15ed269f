"""Reward models served next to the explorers (``explorer.auxiliary_models``): their rules.

Trinity-RFT lists reward models as ``explorer.auxiliary_models`` (``model_path``,
``engine_num``, ``tensor_parallel_size``...). rft serves each as a scorer inside every explorer
task (:mod:`rft.explorer.reward_model`): an explorer task holds its vLLM engine's GPUs, then one
scorer's GPUs per reward model (:mod:`rft.placement`), so a reward model's ``engine_num`` must
be the rollout model's. The reward of an experience combines both sources:

    reward = rule_weight * sum(rule parts) + reward_model_weight * sum(reward model scores)

with ``rule_weight`` and ``reward_model_weight`` (default 1.0) read from each taskset's
``reward_fn_args`` and removed from them before the rest reach the rule reward function
(:func:`split_reward_weights`). Without reward models those two keys are errors.

Input: a typed :class:`~rft.config.schema.Config`. :func:`check_auxiliary_models` is one of
the rules :func:`rft.config.rules.apply` runs; the rest are pure helpers that the placement,
the launchers and the explorer read here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from rft.config.schema import AuxiliaryModelConfig, Config
from rft.errors import ConfigError
from rft.placement import ENGINE_MODES, auxiliary_gpus, gpu_split, task_gpus

RULE_WEIGHT_KEY = "rule_weight"  # reward_fn_args key: weight of the rule reward's parts
REWARD_MODEL_WEIGHT_KEY = "reward_model_weight"  # reward_fn_args key: weight of the model scores
REWARD_WEIGHT_KEYS = (RULE_WEIGHT_KEY, REWARD_MODEL_WEIGHT_KEY)


@dataclass(frozen=True)
class RewardWeights:
    """How a taskset's reward combines its rule parts and its reward model scores."""

    rule_weight: float = 1.0  # times the sum of the rule reward's parts
    reward_model_weight: float = 1.0  # times the sum of the reward models' scores


def auxiliary_tp(cfg: Config) -> list[int]:
    """Each reward model's ``tensor_parallel_size``, in config order (GPUs of its scorer)."""
    return [m.tensor_parallel_size for m in cfg.explorer.auxiliary_models]


def scoring_max_len(model: AuxiliaryModelConfig) -> Optional[int]:
    """Most tokens a reward model scores in one conversation: ``max_model_len``, else
    ``max_prompt_tokens + max_response_tokens`` when both are set, else None (the model's
    own ``max_position_embeddings`` then)."""
    if model.max_model_len is not None:
        return model.max_model_len
    if model.max_prompt_tokens is not None and model.max_response_tokens is not None:
        return model.max_prompt_tokens + model.max_response_tokens
    return None


def split_reward_weights(args: Mapping[str, Any], reward_models: int,
                         label: str = "reward_fn_args") -> tuple[RewardWeights, dict[str, Any]]:
    """``reward_fn_args`` -> (the reward weights, the arguments left for the rule reward).

    ``reward_models``: how many ``explorer.auxiliary_models`` the run has; without any, the
    weight keys are errors (there is nothing to weigh the rule against). ``label`` prefixes
    messages (the taskset's key path).
    """
    args = dict(args or {})
    given = {key: args.pop(key) for key in REWARD_WEIGHT_KEYS if key in args}
    if given and not reward_models:
        raise ConfigError(f"{label}.{', '.join(sorted(given))}: weighs the rule reward against "
                          "reward models, but explorer.auxiliary_models is empty; remove the key "
                          "or add a reward model (explorer.auxiliary_models: [{model_path: ...}])")
    for key, value in given.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{label}.{key}: {value!r} is not a finite number; use e.g. "
                              f"{key}: 0.5")
    weights = RewardWeights(**{k: float(v) for k, v in given.items()})
    return weights, args


def check_auxiliary_models(cfg: Config) -> None:
    """Each reward model: a folder path, the rollout model's ``engine_num`` (one scorer per
    explorer task), consistent length limits; each explorer task's GPUs fit on one node and
    leave the trainer some; reward weights in ``reward_fn_args`` only with reward models."""
    models, rollout, cluster = cfg.explorer.auxiliary_models, cfg.explorer.rollout_model, cfg.cluster
    if cfg.mode in ENGINE_MODES:
        for label, ts in cfg.labelled_tasksets():
            split_reward_weights(ts.reward_fn_args, len(models), f"{label}.reward_fn_args")
    for i, model in enumerate(models):
        key = f"explorer.auxiliary_models[{i}]"
        if not model.model_path:
            raise ConfigError(f"{key}.model_path is empty: set it to a reward model folder (a "
                              "Hugging Face folder with a score head, *ForSequenceClassification)")
        if model.engine_num != rollout.engine_num:
            raise ConfigError(
                f"{key}.engine_num={model.engine_num} differs from explorer.rollout_model.engine_num="
                f"{rollout.engine_num}: rft runs one scorer of each reward model inside each "
                f"explorer task; set {key}.engine_num to {rollout.engine_num}")
        prompt, response, total = model.max_prompt_tokens, model.max_response_tokens, model.max_model_len
        if None not in (prompt, response, total) and prompt + response > total:
            raise ConfigError(f"{key}: max_prompt_tokens + max_response_tokens = {prompt + response} "
                              f"exceeds max_model_len={total}; lower one or unset max_model_len")
    if not models or cluster.gpu_per_node == 0:
        return  # CPU-only cluster description: scorers run on the explorer's CPUs
    per_task = task_gpus(rollout.tensor_parallel_size, auxiliary_tp(cfg))
    if per_task > cluster.gpu_per_node:
        raise ConfigError(f"an explorer task needs {per_task} GPUs (explorer.rollout_model."
                          f"tensor_parallel_size {rollout.tensor_parallel_size} plus its reward "
                          f"models' tensor_parallel_size) but cluster.gpu_per_node="
                          f"{cluster.gpu_per_node}: a task's GPUs must be on one node; lower the "
                          "tensor_parallel_size of the rollout or reward models")
    split = gpu_split(cfg.mode, node_num=cluster.node_num, gpu_per_node=cluster.gpu_per_node,
                      engine_num=rollout.engine_num, tensor_parallel_size=rollout.tensor_parallel_size,
                      auxiliary_gpus=auxiliary_gpus(models))
    if cfg.mode == "both" and split.trainer < 1:
        raise ConfigError(f"explorers take {split.explorer} GPUs ({split.auxiliary} of them for "
                          f"explorer.auxiliary_models), leaving none of cluster.node_num x "
                          f"gpu_per_node = {split.total} for the trainer; lower engine_num or "
                          "raise cluster.gpu_per_node/node_num")
    if cfg.mode == "explore" and split.explorer > split.total:
        raise ConfigError(f"explorers need {split.explorer} GPUs ({split.auxiliary} of them for "
                          f"explorer.auxiliary_models) but the cluster section has {split.total}; "
                          "lower explorer.rollout_model.engine_num")
