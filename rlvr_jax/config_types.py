"""ConfigDict -> typed, frozen dataclasses, with errors that name the field.

Library code never reads a ConfigDict; `main` converts it once with `from_config`, which refuses
unknown keys and wrong types (naming the dotted path, e.g. `rl.loss.clip_hihg`), and lets each
dataclass's own `__post_init__` validate values. `UserError` (and its `ConfigError` and
`NotFoundError`) marks the errors a user causes, at the bottom layer so that every layer raises
them.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class UserError(Exception):
    """An error in what the user asked for, not in the program: a setting, a path, a hub id, a
    directory that holds no run. The message names the bad value and the fix; the entry points
    print it alone, without a traceback, and exit with status 2
    (`program.runtime.user_errors`). Any other exception is a bug and keeps its traceback."""


class ConfigError(UserError, ValueError):
    """An unknown, missing, mistyped or inconsistent setting; the message names it."""


class MissingPackageError(UserError, ModuleNotFoundError):
    """An optional package that the asked-for setting needs is not installed; the message names
    the `pip install` that adds it."""


class NotFoundError(UserError, FileNotFoundError):
    """A file, directory, run, checkpoint or hub id the user named is not there (or, for a hub
    id, cannot be reached); the message names it and what to pass instead."""


def _plain(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    return value


def _coerce(value: Any, hint: Any, path: str) -> Any:
    """Converts `value` to the annotated type `hint` where that is lossless."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, path)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{path}={value!r} matches none of {hint}: {'; '.join(errors)}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{path}={value!r}; expected one of {args}")
        return value
    if dataclasses.is_dataclass(hint):
        return from_config(hint, value, path)
    if origin is tuple:
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}={value!r} must be a sequence")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], f"{path}[{i}]") for i, v in enumerate(value))
        if args and len(args) != len(value):
            raise ConfigError(f"{path}={value!r} must have {len(args)} items")
        return (
            tuple(
                _coerce(v, a, f"{path}[{i}]")
                for i, (v, a) in enumerate(zip(value, args, strict=True))
            )
            if args
            else tuple(value)
        )
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}={value!r} must be true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{path}={value!r} must be an integer")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}={value!r} must be a number")
        # No setting means anything at inf or nan: they would train to NaN, not fail.
        if not math.isfinite(value):
            raise ConfigError(f"{path}={value!r} must be a finite number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}={value!r} must be a string")
        return value
    return value


def from_config(cls: type[T], cfg: Mapping[str, Any] | Any, path: str = "config") -> T:
    """Builds dataclass `cls` from a mapping (a ConfigDict or dict).

    Keys absent from `cfg` take the dataclass defaults; unknown keys are refused.

    Raises:
      ConfigError: naming the dotted path of an unknown, missing or mistyped key, or wrapping the
        ValueError of the dataclass's own validation.
    """
    cfg = _plain(cfg)
    if dataclasses.is_dataclass(cfg):
        return cfg
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"{path} must be a mapping of settings, got {cfg!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(cfg) - set(fields))
    if unknown:
        raise ConfigError(f"unknown setting {path}.{unknown[0]}; {path} accepts {sorted(fields)}")
    kwargs = {}
    for name, f in fields.items():
        if name in cfg:
            kwargs[name] = _coerce(_plain(cfg[name]), hints[name], f"{path}.{name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"missing setting {path}.{name}")
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{path}: {e}") from e
