"""The objective-bias study in one command: every variant, several seeds, one table and plots.

  python -m rlvr_jax.ablate --config=configs/ablation.py --workdir=W [--platform=cpu]
      [--finished_only]

The config is a training config plus an `ablation` section (variants, seeds, the Kimi length
weight, an optional supervised warm start); `program.studies.ablation` documents it and runs the
study. Under W: `runs/<variant>/seed_<s>/` (a rerun skips finished runs), `ablation.md` (the table),
`summary.json` and `plots/*.png`. `--finished_only` trains nothing: the table and plots of the
runs finished so far (while the study runs, or after it was stopped), the others named.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from rlvr_jax.program.runtime import compilation, config_file, user_errors
from rlvr_jax.program.studies import ablation

_CONFIG = config_flags.DEFINE_config_file("config", None, "Ablation config file.")
config_file.guard(_CONFIG)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where the runs, table and plots go.")
_PLATFORM = flags.DEFINE_string("platform", None, "Force a JAX platform, e.g. cpu.")
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False, "Refused: a study runs in one process (see rlvr_jax.main)."
)
_COMPILE_CACHE = flags.DEFINE_string(
    "compile_cache",
    str(compilation.default_cache_dir()),
    compilation.CACHE_FLAG_HELP,
)
_FINISHED_ONLY = flags.DEFINE_bool(
    "finished_only",
    False,
    "Train nothing: the table and plots of the runs that finished, the others named.",
)
flags.DEFINE_bool(user_errors.VERBOSE_FLAG, False, user_errors.VERBOSE_HELP)


def main(argv: Sequence[str]) -> None:
    del argv
    if _DISTRIBUTED.value:
        raise app.UsageError(
            "--distributed: rlvr_jax.ablate runs its study in one process; to train over "
            "several, run python -m rlvr_jax.main --distributed"
        )
    # Orbax logs every checkpoint stage at INFO; the table and the ledgers are the study's log.
    logging.set_verbosity(logging.WARNING)
    if _CONFIG.value is None or not _WORKDIR.value:
        raise app.UsageError("--config=configs/ablation.py and --workdir=W are required")
    if _PLATFORM.value:
        jax.config.update("jax_platforms", _PLATFORM.value)
    # The seeds of one variant compile the same programs: compile them once.
    compilation.enable_cache(_COMPILE_CACHE.value)
    out = ablation.run_ablation(_CONFIG.value, _WORKDIR.value, finished_only=_FINISHED_ONLY.value)
    print(
        f"wrote {_WORKDIR.value}/ablation.md and {len(out['plots'])} plots in "
        f"{out['seconds']:.0f} s"
    )


if __name__ == "__main__":
    user_errors.run("ablate", main)
