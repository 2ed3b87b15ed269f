"""Reading and writing config files: YAML -> OmegaConf (env interpolation, overrides) -> typed.

:func:`load_config` reads a file (``${oc.env:VAR,default}``), merges ``key=value`` overrides,
builds the typed :class:`Config`, recording the keys the user set, and applies
:mod:`rft.config.rules`; each ``stages`` entry is merged onto the base and checked the same way.
A ``trainer.trainer_config_path`` veRL file is read in as ``trainer.trainer_config``.
:func:`config_to_yaml` writes YAML that loads back to an equal config. Owns a stage's name.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rft.config import rules as config_rules
from rft.config.presets import PRESET_KEYS
from rft.config.schema import Config, StageConfig
from rft.config.typed_dict import from_dict, to_dict
from rft.config.verl_keys import BYPASS_MODE, drop_no_effect_keys, lift_bypass_mode
from rft.errors import ConfigError

_STAGE_KEYS = {"stage_name", "mode"}
_VERL_FILE_MODES = ("both", "train")  # Trinity reads the trainer's veRL file only in these

log = logging.getLogger(__name__)


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
    data = data or {}
    for section in (data, *(s for s in data.get("stages") or [] if isinstance(s, dict))):
        _locate_verl_file(section, path.parent)
    return data


def _locate_verl_file(section: dict[str, Any], config_dir: Path) -> None:
    """Make a relative ``trainer.trainer_config_path`` absolute. Trinity opens it from the
    working directory (its examples name ``examples/<x>/<file>`` from the repository root);
    failing that, rft looks in the config file's folder and the folders above it."""
    trainer = section.get("trainer")
    if not isinstance(trainer, dict) or not _reads_verl_file(section):
        return
    given = Path(trainer["trainer_config_path"])
    if given.is_absolute():
        return
    for root in (Path.cwd(), config_dir.resolve(), *config_dir.resolve().parents):
        if (root / given).is_file():
            trainer["trainer_config_path"] = str(root / given)
            return
    raise ConfigError(
        f"trainer.trainer_config_path: veRL file {str(given)!r} not found in the working "
        f"directory ({Path.cwd()}) nor in {config_dir.resolve()} or a folder above it; "
        "give an existing file (an absolute path is read as it is)"
    )


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
    written = copy.deepcopy(data)  # stages merge onto what was written (the path, not the file)
    verl_file = _read_verl_file(data)
    _drop_no_effect_verl_keys(data)
    seen: set[str] = set()
    with _naming_verl_file(verl_file):
        cfg = from_dict(Config, data, "", seen)
        cfg.stages, cfg.written = stages, written
        config_rules.apply(cfg, seen)
    for index in range(len(stages)):
        stage_config(cfg, index)  # each stage must be valid on its own
    return cfg


def _reads_verl_file(section: dict[str, Any]) -> bool:
    """Whether Trinity would read the section's ``trainer.trainer_config_path``: a path is set,
    ``trainer_config`` is empty (it wins) and the mode trains (trinity/common/config.py)."""
    trainer = section.get("trainer")
    if not isinstance(trainer, dict):
        return False
    path = trainer.get("trainer_config_path")
    return (
        isinstance(path, str)
        and bool(path)
        and not trainer.get("trainer_config")
        and section.get("mode", "both") in _VERL_FILE_MODES
    )


def _read_verl_file(data: dict[str, Any]) -> str | None:
    """Replace ``trainer.trainer_config_path`` by the veRL file's keys as an inline
    ``trainer.trainer_config`` (checked, mapped and refused exactly like one); return the file
    read, or None. Trinity's precedence (trinity/common/config.py, check_and_update): a
    non-empty ``trainer_config`` wins, and the file is read only in modes both and train."""
    trainer = data.get("trainer")
    if not isinstance(trainer, dict) or "trainer_config_path" not in trainer:
        return None
    path = trainer.pop("trainer_config_path")
    if path is None or path == "":
        return None
    if not isinstance(path, str):
        raise ConfigError(f"trainer.trainer_config_path: expected a file path, got {path!r}")
    mode = data.get("mode", "both")
    if trainer.get("trainer_config"):
        log.warning(
            "trainer.trainer_config_path %s has no effect: trainer.trainer_config is set, and "
            "it wins (as in Trinity)",
            path,
        )
        return None
    if mode not in _VERL_FILE_MODES:
        log.info("trainer.trainer_config_path has no effect in mode %s (no trainer)", mode)
        return None
    file = Path(path)
    if not file.is_file():
        raise ConfigError(
            f"trainer.trainer_config_path: veRL file not found: {file.resolve()}; "
            "give an existing file"
        )
    try:
        verl = OmegaConf.to_container(OmegaConf.load(file), resolve=True)
    except (OmegaConfBaseException, yaml.YAMLError) as e:
        raise ConfigError(f"trainer.trainer_config_path {file}: cannot read it: {e}") from e
    if not isinstance(verl, dict):
        raise ConfigError(f"trainer.trainer_config_path {file}: expected a mapping of veRL keys")
    trainer["trainer_config"] = verl
    return str(file)


def _drop_no_effect_verl_keys(data: dict[str, Any]) -> None:
    verl = (data.get("trainer") or {}).get("trainer_config") if isinstance(data, dict) else None
    if not isinstance(verl, dict):
        return
    bypass = lift_bypass_mode(verl)
    if bypass is not None:
        if not isinstance(bypass, bool):
            raise ConfigError(
                f"trainer.trainer_config.{BYPASS_MODE}: got {bypass!r}, expected true or false"
            )
        if data.get("algorithm") is None:
            data["algorithm"] = {}
        algorithm = data["algorithm"]
        written = algorithm.get("bypass_old_logprobs") if isinstance(algorithm, dict) else None
        if written is not None and written != bypass:
            raise ConfigError(
                f"trainer.trainer_config.{BYPASS_MODE}={bypass!r} contradicts "
                f"algorithm.bypass_old_logprobs={written!r}; set only one"
            )
        if isinstance(algorithm, dict):
            algorithm["bypass_old_logprobs"] = bypass
    drop_no_effect_keys(verl)


@contextlib.contextmanager
def _naming_verl_file(verl_file: str | None) -> Iterator[None]:
    """Errors about ``trainer.trainer_config.*`` keys that came from a veRL file name it."""
    try:
        yield
    except ConfigError as e:
        if verl_file is None or "trainer.trainer_config." not in str(e):
            raise
        raise type(e)(f"{e} (read from trainer.trainer_config_path {verl_file})") from e


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
        verl_file = _read_verl_file(merged)
        _drop_no_effect_verl_keys(merged)
        seen: set[str] = set()
        with _naming_verl_file(verl_file):
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
    for key in PRESET_KEYS:
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
