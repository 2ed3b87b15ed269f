"""Plain dicts (parsed YAML) to typed dataclasses and back, with errors a user can act on.

Knows no rft schema: it walks a dataclass schema and a nested dict side by side. Every
error names the full key path (``buffer.explorer_input.taskset.fromat``), the value, and what
would be valid. A key or choice that Trinity-RFT or veRL defines but the schema lacks
(:mod:`rft.config.known_names`, by schema class name) raises NotSupportedError saying what to do;
any other unknown key gets the nearest valid key as a suggestion. Field ranges come from
``metadata`` set by :func:`field`. The keys present in the input are recorded.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, TypeVar, Union

from rft.config.known_names import CHOICES, KEYS, TRINITY_NAMES
from rft.errors import ConfigError, NotSupportedError, did_you_mean, nearest

_MISSING = dataclasses.MISSING
Schema = TypeVar("Schema")  # the dataclass from_dict builds


def field(
    default: Any = _MISSING,
    *,
    factory: Any = _MISSING,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    text_only: str | None = None,
) -> Any:
    """A dataclass field with optional numeric bounds checked at load time; ``text_only`` (a
    hint) refuses numbers in a string field instead of converting them."""
    meta = {
        k: v
        for k, v in (("ge", ge), ("gt", gt), ("le", le), ("text_only", text_only))
        if v is not None
    }
    if factory is not _MISSING:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def from_dict(
    cls: type[Schema], data: object, path: str = "", seen: set[str] | None = None
) -> Schema:
    """Build dataclass ``cls`` from ``data``; ``seen`` collects the key paths present."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path or 'config'}: expected a mapping of keys, got {_show(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        key_path = _join(path, str(key))
        if key not in fields:
            raise _unknown_key_error(cls, key_path, str(key), fields)
        if seen is not None:
            seen.add(key_path)
        hint = fields[key].metadata.get("text_only")
        if hint and value is not None and not isinstance(value, str):
            raise ConfigError(f"{key_path}: expected text, got {_show(value)}; {hint}")
        _check_foreign_choice(cls, key, hints[key], value, key_path)
        kwargs[key] = convert(hints[key], value, key_path, seen)
        _check_bounds(fields[key], kwargs[key], key_path)
    return cls(**kwargs)


def not_supported(name: str, what_to_do: str) -> NotSupportedError:
    """The refusal of a Trinity-RFT/veRL key or choice that rft does not act on."""
    return NotSupportedError(f"Trinity's `{name}` is not supported by rft: {what_to_do}")


def _unknown_key_error(cls: type, key_path: str, key: str, fields: dict) -> ConfigError:
    what_to_do = KEYS.get(cls.__name__, {}).get(key)
    if what_to_do:
        return not_supported(key_path, what_to_do)
    valid = sorted(fields)
    hint = None if key in TRINITY_NAMES else nearest(key, valid)
    guess = f" Did you mean '{key_path.rsplit(key, 1)[0]}{hint}'?" if hint else ""
    return ConfigError(
        f"unknown config key '{key_path}'.{guess} Valid keys here: {', '.join(valid)}"
    )


def _check_foreign_choice(cls: type, key: str, tp: Any, value: Any, key_path: str) -> None:
    """A value outside the field's choices that Trinity accepts there: NotSupportedError."""
    choices = [a for a in typing.get_args(tp) if typing.get_origin(a) is Literal]
    choices += [tp] if typing.get_origin(tp) is Literal else []
    if (
        not choices
        or not isinstance(value, str)
        or any(value in typing.get_args(c) for c in choices)
    ):
        return
    what_to_do = CHOICES.get(f"{cls.__name__}.{key}", {}).get(value)
    if what_to_do:
        raise not_supported(f"{key_path}: {value}", what_to_do)


def _check_bounds(f: dataclasses.Field, value: object, key_path: str) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    checks = (
        ("ge", lambda v, b: v >= b, ">="),
        ("gt", lambda v, b: v > b, ">"),
        ("le", lambda v, b: v <= b, "<="),
    )
    for name, ok, sign in checks:
        bound = f.metadata.get(name)
        if bound is not None and not ok(value, bound):
            raise ConfigError(f"{key_path}: {value!r} is out of range; it must be {sign} {bound}")


def convert(tp: Any, value: Any, path: str, seen: set[str] | None = None) -> Any:
    """Check ``value`` against the type annotation ``tp``; return it converted."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        return _convert_union(args, value, path, seen)
    if origin is Literal:
        return _convert_literal(args, value, path)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, path, seen)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected a list, got {_show(value)}")
        return [convert(args[0], v, _join(path, i), seen) for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        return _convert_dict(args, value, path, seen)
    return _convert_scalar(tp, value, path)


def _convert_union(args: tuple, value: Any, path: str, seen: set[str] | None) -> Any:
    """``Optional[X]``, or ``Union[X, list[X]]`` (one value or several: the list form is taken
    for a list)."""
    inner = [a for a in args if a is not type(None)]
    if value is None and len(inner) < len(args):
        return None
    if len(inner) == 2 and typing.get_origin(inner[1]) is list:
        return convert(inner[1] if isinstance(value, list) else inner[0], value, path, seen)
    assert len(inner) == 1, "only Optional[X] and Union[X, list[X]] are supported in config schemas"
    return convert(inner[0], value, path, seen)


def _convert_literal(args: tuple, value: Any, path: str) -> Any:
    if value in args and not isinstance(value, bool):
        return value
    valid = ", ".join(repr(a) for a in args)
    hint = did_you_mean(str(value), [str(a) for a in args], TRINITY_NAMES)
    raise ConfigError(f"{path}: {value!r} is not a valid choice.{hint} Valid: {valid}")


def _convert_dict(args: tuple, value: Any, path: str, seen: set[str] | None) -> dict:
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: expected a mapping, got {_show(value)}")
    if not args:
        return dict(value)
    return {str(k): convert(args[1], v, _join(path, str(k)), seen) for k, v in value.items()}


# Text a typed field takes as a boolean: OmegaConf's BooleanNode (omegaconf/nodes.py, 2.3), which
# Trinity's load_config applies by merging the YAML into its structured Config, so a quoted value
# or a `${oc.env:VAR,true}` default (always text) gets the field's type there too.
_TRUE_TEXT = ("yes", "y", "on", "true")
_FALSE_TEXT = ("no", "n", "off", "false")


def _convert_scalar(tp: type, value: Any, path: str) -> Any:
    if tp is bool:
        return _to_bool(value, path)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):  # OmegaConf's IntegerNode: int(text), e.g. ${oc.env:N,1}
            try:
                return int(value)
            except ValueError:
                pass
        raise ConfigError(f"{path}: expected an integer, got {_show(value)}")
    if tp is float:
        return _to_float(value, path)
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # e.g. `name: 2024`: a number is a fine name
        raise ConfigError(f"{path}: expected a string, got {_show(value)}")
    raise AssertionError(f"unsupported type {tp!r} in config schema at {path}")


def _to_bool(value: object, path: str) -> bool:
    """OmegaConf's BooleanNode: a bool, an integer (non-zero: true), or text naming either."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value != 0
    if isinstance(value, str):
        text = value.strip().lower()
        if text.lstrip("+-").isdigit():
            return int(text) != 0
        if text in _TRUE_TEXT or text in _FALSE_TEXT:
            return text in _TRUE_TEXT
    raise ConfigError(f"{path}: expected true or false, got {_show(value)}")


def _to_float(value: object, path: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):  # YAML 1.1 reads `1e-5` (no dot) as a string
        try:
            return float(value)
        except ValueError:
            pass
    raise ConfigError(f"{path}: expected a number, got {_show(value)}")


def _show(value: object) -> str:
    text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def to_dict(obj: Any) -> Any:
    """A dataclass tree as plain dicts and lists (for YAML), keeping field order."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
    if isinstance(obj, list):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj
