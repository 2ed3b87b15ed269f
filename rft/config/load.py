"""Reading and writing config files: YAML -> OmegaConf (env interpolation, overrides) -> typed.

:func:`load_config` reads a file (``${oc.env:VAR,default}``), merges ``key=value`` overrides,
builds the typed :class:`Config`, recording the keys the user set, and applies
:mod:`rft.config.rules`; each ``stages`` entry is merged onto the base and checked the same way.
:func:`config_to_yaml` writes YAML that loads back to an equal config. Owns a stage's name.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rft.config import rules as config_rules
from rft.config.schema import Config, StageConfig
from rft.config.typed_dict import from_dict, to_dict
from rft.errors import ConfigError

_STAGE_KEYS = {"stage_name", "mode"}


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read ``path``, apply ``key=value`` overrides, and return the checked config."""
    return config_from_dict(read_raw(path, overrides))


def read_raw(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """The config file as a plain dict, overrides merged and interpolations resolved."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path} (pass an existing YAML file to --config)")
    try:
        base = OmegaConf.load(path)
    except (OmegaConfBaseException, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(base, DictConfig):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, not a list")
    _apply_overrides(base, overrides)
    try:
        data = OmegaConf.to_container(base, resolve=True)
    except OmegaConfBaseException as e:
        raise ConfigError(f"{path}: {_interpolation_message(e)}") from e
    return data or {}


def _apply_overrides(cfg: DictConfig, overrides: list[str] | tuple[str, ...]) -> None:
    """Apply ``key.path=value`` items; list items are addressed by index (``tasksets.0.split``)."""
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(
                f"override {item!r} must look like key.path=value, e.g. buffer.batch_size=4"
            )
        try:
            value = yaml.safe_load(text) if text else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"override {item!r}: cannot parse the value ({e})") from e
        if ":" in text and isinstance(value, int):
            value = text  # 12:00:00 is a time of day, not YAML 1.1's base-60 integer
        try:
            OmegaConf.update(cfg, key, value, merge=True)
        except (OmegaConfBaseException, TypeError, IndexError, ValueError) as e:
            raise ConfigError(f"override {item!r} does not fit the config: {e}") from e


def _interpolation_message(e: OmegaConfBaseException) -> str:
    key = getattr(e, "full_key", None)
    where = f"key '{key}': " if key else ""
    text = str(e).splitlines()[0]
    if "oc.env" in text or "Environment variable" in text:
        return (
            f"{where}{text}. Set the environment variable, or give a default: "
            "${oc.env:VAR,default}"
        )
    return f"{where}{text}"


def config_from_dict(data: dict[str, Any]) -> Config:
    """Typed config from a resolved mapping: schema check, stages, then the rules."""
    data = copy.deepcopy(data)
    stages = _split_stages(data.pop("stages", None) or [])
    seen: set[str] = set()
    cfg = from_dict(Config, data, "", seen)
    cfg.stages, cfg.written = stages, data
    config_rules.apply(cfg, seen)
    for index in range(len(stages)):
        stage_config(cfg, index)  # each stage must be valid on its own
    return cfg


def _split_stages(raw: object) -> list[StageConfig]:
    if not isinstance(raw, list):
        raise ConfigError("stages: expected a list of stages, each with a stage_name")
    stages = []
    for i, entry in enumerate(raw):
        entry = entry or {}
        if not isinstance(entry, dict):
            raise ConfigError(f"stages[{i}]: expected a mapping with stage_name, got {entry!r}")
        head = {k: entry[k] for k in _STAGE_KEYS if k in entry}
        rest = {k: v for k, v in entry.items() if k not in _STAGE_KEYS}
        if "stages" in rest:
            raise ConfigError(f"stages[{i}]: stages cannot be nested")
        stage = from_dict(StageConfig, head, f"stages[{i}]")
        stage.overrides = rest
        stages.append(stage)
    return stages


def stage_name(cfg: Config, index: int) -> str:
    """Stage ``index``'s name, also its folder under the base run directory: its
    ``stage_name``, else ``stage<index>``."""
    return cfg.stages[index].stage_name or f"stage{index}"


def stage_label(cfg: Config, index: int) -> str:
    """``stages[i] (name)``: how messages, the plan and the sbatch script name stage ``index``."""
    return f"stages[{index}] ({stage_name(cfg, index)})"


def stage_config(cfg: Config, index: int) -> Config:
    """The full config of stage ``index``: its keys merged onto the base config, with its own
    run directory ``<run_dir>/<stage_name(cfg, index)>``.

    A stage that changes ``algorithm.algorithm_type`` does not inherit the base's loss and
    advantage choices: they come from the stage itself or from its algorithm's preset.
    """
    stage = cfg.stages[index]
    base = copy.deepcopy(cfg.written or _base_dict(cfg))
    _drop_inherited_algorithm(base, stage.overrides)
    _drop_inherited_storage(base, stage.overrides)
    merged = OmegaConf.to_container(OmegaConf.merge(base, stage.overrides))
    if stage.mode:
        merged["mode"] = stage.mode
    merged["name"] = f"{merged.get('name', cfg.name)}/{stage_name(cfg, index)}"
    try:
        seen: set[str] = set()
        sub = from_dict(Config, merged, "", seen)
        config_rules.apply(sub, seen)
    except ConfigError as e:
        raise type(e)(f"{stage_label(cfg, index)}: {e}") from e
    return sub


def _drop_inherited_storage(base: dict[str, Any], overrides: dict[str, Any]) -> None:
    """A stage giving the experience buffer a new path without a storage_type re-infers it."""
    stage_buf = ((overrides.get("buffer") or {}).get("trainer_input") or {}).get(
        "experience_buffer"
    )
    if stage_buf and "path" in stage_buf and "storage_type" not in stage_buf:
        base_buf = ((base.get("buffer") or {}).get("trainer_input") or {}).get("experience_buffer")
        (base_buf or {}).pop("storage_type", None)


def _drop_inherited_algorithm(base: dict[str, Any], overrides: dict[str, Any]) -> None:
    new_type = (overrides.get("algorithm") or {}).get("algorithm_type")
    base_algo = base.get("algorithm") or {}
    if new_type is None or new_type == base_algo.get("algorithm_type", "grpo"):
        return
    for key in config_rules.PRESET_KEYS:
        base_algo.pop(key, None)
        base_algo.pop(f"{key}_args", None)


def _base_dict(cfg: Config) -> dict[str, Any]:
    data = to_dict(cfg)
    data.pop("stages")
    return data


def config_to_yaml(cfg: Config) -> str:
    """YAML of the resolved config; stages are written back in Trinity's flat form."""
    data = to_dict(cfg)
    data["stages"] = [_stage_to_dict(s) for s in cfg.stages]
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def _stage_to_dict(stage: StageConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"stage_name": stage.stage_name}
    if stage.mode:
        out["mode"] = stage.mode
    out.update(stage.overrides)
    return out
