"""Loading a `--config=file.py[:arg]` for the entry points: a file that ends the process while
loading is a config error.

Host code. ml_collections runs the config file (its module body, then `get_config(arg)`) while
absl parses the flags, before `main`. A file that calls `sys.exit` there (a script turned into a
config, a guard such as `if not os.environ.get(...): sys.exit(0)`) would end the command with
that status before it did anything: with `sys.exit(0)`, a training command "succeeds" having
trained nothing. `guard(flag)` makes such a file a flag error naming it; absl then prints
"FATAL Flags parsing error: ..." and exits with status 1.
"""

from __future__ import annotations

from typing import Any

from absl import flags


class ExitSafeParser(flags.ArgumentParser):
    """A config file parser (ml_collections') with `SystemExit` from the file turned into a
    `ValueError` that names the file and the status it tried to exit with."""

    def __init__(self, inner: flags.ArgumentParser):
        self._inner = inner

    def parse(self, argument: str) -> Any:
        try:
            return self._inner.parse(argument)
        except SystemExit as e:
            raise ValueError(
                f"config file {argument.split(':', 1)[0]} ended the process while loading "
                f"(sys.exit({e.code!r})); a config file defines get_config() and returns its "
                "ConfigDict, so nothing was run"
            ) from None

    def flag_type(self) -> str:
        return self._inner.flag_type()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def guard(holder: flags.FlagHolder, flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Gives the config flag of `holder` (from `config_flags.DEFINE_config_file`) an
    `ExitSafeParser`; call it right after defining the flag."""
    flag = flag_values[holder.name]
    flag.parser = ExitSafeParser(flag.parser)
