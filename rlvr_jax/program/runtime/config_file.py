"""Loading a `--config=file.py[:arg]` for the entry points: every way the file or an override
can be wrong is a flag error that names the file or the key.

Host code. ml_collections runs the config file (its module body, then `get_config(arg)`) while
absl parses the flags, before `main`, and then resolves each `--config.a.b=v` override. Left to
itself it reports these as tracebacks or odd statuses; `guard(flag)` gives the config flag a
parser (`GuardedParser`) that raises `flags.IllegalFlagValueError` instead, which the entry
points print as one line with exit status 2 (`user_errors`):

- a file that does not exist: named, with the closest file beside it;
- a file whose `get_config(arg)` raises ValueError or TypeError (an argument it does not
  accept): named, with the argument and its message;
- a file that calls `sys.exit` while loading (a script turned into a config, a guard such as
  `if not os.environ.get(...): sys.exit(0)`): with `sys.exit(0)` a training command would
  otherwise "succeed" having trained nothing;
- an override of a key the config does not have (`--config.train.stepz=3`): named, with the
  closest key (`train.steps`).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from absl import flags
from ml_collections.config_flags import config_path


class GuardedParser(flags.ArgumentParser):
    """A config file parser (ml_collections') whose failures name the file or the key.

    Args:
      inner: ml_collections' parser of the flag.
      overrides: the dotted keys of the command line's `--config.<key>=` overrides, or None
        where unknown keys are accepted (ml_collections then adds them).
    """

    def __init__(
        self,
        inner: flags.ArgumentParser,
        overrides: Callable[[], Sequence[str]] | None = None,
    ):
        self._inner = inner
        self._overrides = overrides

    def parse(self, argument: str) -> Any:
        file, _, arg = argument.partition(":")
        if not Path(file).is_file():
            raise flags.IllegalFlagValueError(f"config file {file} does not exist{_near(file)}")
        try:
            config = self._inner.parse(argument)
        except SystemExit as e:
            raise flags.IllegalFlagValueError(
                f"config file {file} ended the process while loading (sys.exit({e.code!r})); a "
                "config file defines get_config() and returns its ConfigDict, so nothing was run"
            ) from None
        except (TypeError, ValueError) as e:
            # ml_collections raises a copy whose message is the traceback; the original is the
            # context, and its message is the config file's own.
            cause = e.__context__ if isinstance(e.__context__, type(e)) else e
            called = f"get_config({arg!r})" if arg else "get_config()"
            raise flags.IllegalFlagValueError(
                f"config file {file}: {called} raised {type(cause).__name__}: {cause}"
            ) from cause
        if self._overrides is not None:
            for key in self._overrides():
                check_key(config, key)
        return config

    def flag_type(self) -> str:
        return self._inner.flag_type()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _near(file: str) -> str:
    """ " (did you mean configs/tiny.py?)" for the closest file beside a missing one, or ""."""
    directory = Path(file).parent
    if not directory.is_dir():
        return f" (nor does its directory {directory})"
    names = [p.name for p in directory.iterdir() if p.suffix == ".py"]
    close = difflib.get_close_matches(Path(file).name, names, n=1)
    return f" (did you mean {os.path.join(directory, close[0])}?)" if close else ""


def _keys(node: Any) -> list[str] | None:
    """The keys of a config section, or None for a value that is no section."""
    try:
        keys = node.keys()  # only sections have keys (a string iterates too)
    except Exception:  # no section; or a file that failed to load, whose error comes when used
        return None
    return [str(k) for k in keys]


def check_key(config: Any, key: str) -> None:
    """Raises unless the dotted `key` names a field of `config` (a ConfigDict).

    Indices (`a.b[0]`) and keys under a field that is not a section are left to ml_collections.

    Raises:
      flags.IllegalFlagValueError: "unknown config key train.stepz (did you mean train.steps?)".
    """
    try:
        fields = config_path.split(key)
    except ValueError:
        return  # not a path ml_collections can parse: its own error says so
    node, path = config, []
    for field in fields:
        keys = _keys(node) if isinstance(field, str) else None
        if keys is None:
            return
        if field not in keys:
            where = ".".join(path)
            close = difflib.get_close_matches(field, keys, n=1)
            if close:
                hint = f"did you mean {'.'.join([*path, close[0]])}?"
            else:
                hint = f"the keys of {where or 'the config'}: {', '.join(sorted(keys))}"
            bad = ".".join([*path, field])
            within = f" in {key}" if bad != key else ""
            raise flags.IllegalFlagValueError(f"unknown config key {bad}{within} ({hint})")
        node = node[field]
        path.append(field)


def guard(holder: flags.FlagHolder, flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Gives the config flag of `holder` (from `config_flags.DEFINE_config_file`) a
    `GuardedParser`; call it right after defining the flag."""
    flag = flag_values[holder.name]
    overrides = None
    # The overrides as ml_collections itself finds them on the command line (private methods of
    # its flag; without them, unknown keys are left to its own error).
    if not getattr(flag, "_accept_new_attributes", False) and hasattr(flag, "_GetOverrides"):

        def overrides() -> Sequence[str]:
            return list(flag._GetOverrides(flag._GetArgv()))

    flag.parser = GuardedParser(flag.parser, overrides)
