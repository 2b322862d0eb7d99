"""The entry points' way out after an error: a user's error as one message, a bug as a traceback.

Host code. A user error is a `UserError` (`rlvr_jax.config_types`: `ConfigError` for a setting,
`NotFoundError` for a path, run, checkpoint or hub id that is not there, and the errors built on
them: a hub dataset that cannot be loaded, a checkpoint step that does not exist, a sandbox that
cannot start), a flag absl cannot parse (`flags.Error`: also a config file that does not load,
refuses its argument, or lacks a key an override names, `config_file`), or an `app.UsageError`.
The entry point prints

    eval: error: /tmp/x/settings.json does not exist: '/tmp/x' is not a run's workdir
    (set RLVR_JAX_TRACEBACK=1 or pass --verbose for the traceback)

on stderr and exits with status 2 (`USER_ERROR_EXIT_STATUS`, the status argparse gives a command
line it refuses); with `--verbose` or `RLVR_JAX_TRACEBACK=1` the traceback comes first.
Any other exception is a bug: `preemption.exit_after_error` prints its traceback and exits with
its status (1; 130 after a second SIGINT; a `SystemExit`'s own code). Either way the process
ends within `preemption.EXIT_GRACE_S`, even when a library left a thread waiting.

`run(entry, main)` is `app.run(main)` with this applied to the flags' parsing (which absl does
before `main`) and to `main`; `call(entry, main)` is the same for an entry point without absl.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from absl import app, flags

from rlvr_jax.config_types import UserError
from rlvr_jax.program.runtime import preemption

USER_ERROR_EXIT_STATUS = 2
TRACEBACK_ENV = "RLVR_JAX_TRACEBACK"
VERBOSE_FLAG = "verbose"
VERBOSE_HELP = (
    "After an error in what was asked (a setting, a path, a flag), print its traceback as well "
    f"as its message (also {TRACEBACK_ENV}=1)."
)
_TRUE = ("1", "true", "yes", "on")


def is_user_error(error: BaseException) -> bool:
    """Whether `error` is the user's to fix (see the module docstring) rather than a bug."""
    return isinstance(error, UserError | flags.Error | app.UsageError)


def message(error: BaseException) -> str:
    """The message of a user error: its text, or its type's name when it has none."""
    return str(error).strip() or type(error).__name__


def traceback_requested(flag_values: flags.FlagValues | None = None) -> bool:
    """Whether `RLVR_JAX_TRACEBACK` is set true, or the `--verbose` flag of `flag_values`.

    When the flags failed to parse, `--verbose` may not have been reached: the command line is
    read for it then.
    """
    if os.environ.get(TRACEBACK_ENV, "").strip().lower() in _TRUE:
        return True
    if flag_values is None or VERBOSE_FLAG not in flag_values:
        return False
    if flag_values.is_parsed() or flag_values[VERBOSE_FLAG].present:
        return bool(flag_values[VERBOSE_FLAG].value)
    given = [a.lstrip("-").lower() for a in sys.argv[1:] if a.startswith("-")]
    return any(a == VERBOSE_FLAG or a in (f"{VERBOSE_FLAG}={t}" for t in _TRUE) for a in given)


def hint(flag_values: flags.FlagValues | None = None) -> str:
    """The line after a user error's message: how to see its traceback."""
    if flag_values is not None and VERBOSE_FLAG in flag_values:
        return f"(set {TRACEBACK_ENV}=1 or pass --{VERBOSE_FLAG} for the traceback)"
    return f"(set {TRACEBACK_ENV}=1 for the traceback)"


def report(entry: str, error: BaseException, flag_values: flags.FlagValues | None = None) -> None:
    """Prints a user error on stderr: `<entry>: error: <message>`, then the hint line, or the
    traceback first where one was asked for."""
    verbose = traceback_requested(flag_values)
    if verbose:
        traceback.print_exception(error, file=sys.stderr)
    print(f"{entry}: error: {message(error)}", file=sys.stderr)
    if not verbose:
        print(hint(flag_values), file=sys.stderr)


def exit_after_error(
    entry: str, error: BaseException, flag_values: flags.FlagValues | None = None
) -> NoReturn:
    """Ends the process after `error`: a user error is `report`ed and exits with status 2;
    anything else goes to `preemption.exit_after_error` (its traceback, its status)."""
    if is_user_error(error):
        report(entry, error, flag_values)
        preemption.exit_after_error(SystemExit(USER_ERROR_EXIT_STATUS))
    preemption.exit_after_error(error)


def run(
    entry: str,
    main: Callable[[list[str]], Any],
    *,
    flags_parser: Callable[[list[str]], Any] | None = None,
    flag_values: flags.FlagValues = flags.FLAGS,
) -> None:
    """`app.run(main, flags_parser)` where an error while parsing the flags or in `main` ends
    the process through `exit_after_error`.

    Args:
      entry: the command's name in messages ("eval").
      main: the absl main.
      flags_parser: absl's `flags_parser` (default: parse `flag_values`).
      flag_values: the flags that hold `--verbose` (absl's global ones unless the entry point
        has its own).
    """
    parse = flags_parser or flag_values

    def parse_flags(argv: list[str]) -> Any:
        try:
            return parse(argv)
        except SystemExit:  # --help, or a parser that has said why already
            raise
        except BaseException as e:  # noqa: BLE001 - every way out ends the process promptly
            exit_after_error(entry, e, flag_values)

    def guarded_main(argv: list[str]) -> Any:
        try:
            return main(argv)
        except BaseException as e:  # noqa: BLE001 - every way out ends the process promptly
            exit_after_error(entry, e, flag_values)

    app.run(guarded_main, flags_parser=parse_flags)


def call(entry: str, main: Callable[[Sequence[str] | None], Any]) -> None:
    """`main(None)` (an entry point that parses `sys.argv` itself, e.g. with argparse) with its
    errors ending the process through `exit_after_error`; `RLVR_JAX_TRACEBACK=1` shows a user
    error's traceback."""
    try:
        main(None)
    except SystemExit:  # argparse's usage errors (status 2) and --help have said why
        raise
    except BaseException as e:  # noqa: BLE001 - every way out ends the process promptly
        exit_after_error(entry, e)
