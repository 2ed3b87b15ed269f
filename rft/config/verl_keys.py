"""veRL keys under ``trainer.trainer_config`` that have no effect, taken out before the schema check.

Input: the raw ``trainer_config`` mapping (inline, or read from ``trainer_config_path``); output:
the same mapping less the keys :mod:`rft.config.known_names` lists as having no effect (Trinity
overwrites or never reads them, or they hold a value that asks for nothing), each named in a
warning with what to set instead, and veRL's older ``optim.beta1/beta2`` as ``betas``. Any other
value of those keys stays, to be refused by name by the schema check.
"""

from __future__ import annotations

import logging
from typing import Any

from rft.config.known_names import (
    VERL_IGNORED,
    VERL_INERT,
    VERL_OPMD_ALG_TYPES,
    VERL_OPMD_ONLY,
    VERL_SAME_AS,
    VERL_SWITCHED_OFF,
)

log = logging.getLogger(__name__)

_MISSING = object()
_WHERE = "trainer.trainer_config"
_OPTIMS = ("actor_rollout_ref.actor.optim", "critic.optim")


def drop_no_effect_keys(verl: dict[str, Any]) -> list[str]:
    """Remove the no-effect keys from ``verl`` in place; return their paths (warned)."""
    _betas_from_beta1_beta2(verl)
    dropped = []
    for path, why in VERL_IGNORED.items():
        if _pop(verl, path) is not _MISSING:
            dropped.append(path)
            log.warning("%s.%s has no effect: %s", _WHERE, path, why)
    for path, values in VERL_INERT.items():
        value = _get(verl, path)
        if value is not _MISSING and any(_same(value, v) for v in values):
            _pop(verl, path)
            dropped.append(path)
            log.info("%s.%s: %r asks for nothing; no effect", _WHERE, path, value)
    for section, switch in VERL_SWITCHED_OFF.items():
        body = verl.get(section)
        if isinstance(body, dict) and not body.get(switch):
            del verl[section]
            dropped.append(section)
    actor = _get(verl, "actor_rollout_ref.actor")
    if isinstance(actor, dict) and actor.get("alg_type") not in VERL_OPMD_ALG_TYPES:
        for key in VERL_OPMD_ONLY:
            if actor.pop(key, _MISSING) is not _MISSING:
                dropped.append(f"actor_rollout_ref.actor.{key}")
    for path, other in VERL_SAME_AS.items():
        value, reference = _get(verl, path), _get(verl, other)
        if value is not _MISSING and _same(value, reference):
            _pop(verl, path)
            dropped.append(path)
    return dropped


BYPASS_MODE = "algorithm.rollout_correction.bypass_mode"


def lift_bypass_mode(verl: dict[str, Any]) -> bool | None:
    """veRL's ``algorithm.rollout_correction.bypass_mode`` taken out of ``verl`` (None when
    absent): Trinity 0.5's trainer reads it (true: the rollout's log-probs are the old ones, as
    ``algorithm.bypass_old_logprobs``), unlike the rest of veRL's algorithm section."""
    value = _pop(verl, BYPASS_MODE)
    return None if value is _MISSING else value


def _betas_from_beta1_beta2(verl: dict[str, Any]) -> None:
    """veRL's older ``optim.beta1``/``beta2`` (Trinity 0.1's examples) are ``betas: [b1, b2]``."""
    for path in _OPTIMS:
        optim = _get(verl, path)
        if not isinstance(optim, dict) or not {"beta1", "beta2"} <= optim.keys():
            continue
        if "betas" in optim:
            continue  # both spellings: the schema refuses beta1/beta2 by name
        optim["betas"] = [optim.pop("beta1"), optim.pop("beta2")]


def _same(a: object, b: object) -> bool:
    """Equal, with YAML's 0 vs False and 1 vs True kept apart."""
    return type(a) is type(b) and a == b


def _get(tree: dict[str, Any], path: str) -> Any:
    node: Any = tree
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _pop(tree: dict[str, Any], path: str) -> Any:
    *parents, last = path.split(".")
    node = _get(tree, ".".join(parents)) if parents else tree
    if not isinstance(node, dict):
        return _MISSING
    return node.pop(last, _MISSING)
