"""A recipe as one command: ordered stages, each from the last one's weights, evaluated after each.

  python -m rlvr_jax.pipeline --config=configs/pipelines/r1_tiny.py --workdir=W [--platform=cpu]

The config is a training config plus a `pipeline` section (the stages with their overrides, an
optional equal-compute baseline, the evaluation suite's samples); `program.studies.pipeline`
documents it and runs it. Under W: `<index>_<stage>/` (each a stage workdir; a rerun skips finished
stages and resumes a partly trained one from its checkpoint), `pipeline.md` (the stage x metric
table, also printed), `pipeline.json` and `pipeline.png`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from rlvr_jax.program.runtime import compilation, config_file, user_errors
from rlvr_jax.program.studies import pipeline

_CONFIG = config_flags.DEFINE_config_file("config", None, "Pipeline config file.")
config_file.guard(_CONFIG)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Where the stages, table and plot go (default: runs/<config name>)."
)
_PLATFORM = flags.DEFINE_string("platform", None, "Force a JAX platform, e.g. cpu.")
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False, "Refused: a pipeline runs in one process (see rlvr_jax.main)."
)
_COMPILE_CACHE = flags.DEFINE_string(
    "compile_cache",
    str(compilation.default_cache_dir()),
    compilation.CACHE_FLAG_HELP,
)
flags.DEFINE_bool(user_errors.VERBOSE_FLAG, False, user_errors.VERBOSE_HELP)


def main(argv: Sequence[str]) -> None:
    del argv
    if _DISTRIBUTED.value:
        raise app.UsageError(
            "--distributed: rlvr_jax.pipeline runs in one process; to train over several, run "
            "each stage with python -m rlvr_jax.main --distributed"
        )
    # Orbax logs every checkpoint stage at INFO; the stages' ledgers and the table are the log.
    logging.set_verbosity(logging.WARNING)
    if _CONFIG.value is None:
        raise app.UsageError("--config=configs/pipelines/<name>.py is required")
    if _PLATFORM.value:
        jax.config.update("jax_platforms", _PLATFORM.value)
    compilation.enable_cache(_COMPILE_CACHE.value)
    name = Path(flags.FLAGS["config"].config_filename.split(":")[0]).stem
    workdir = _WORKDIR.value or os.path.join("runs", name)
    out = pipeline.run_pipeline(_CONFIG.value, workdir)
    print(f"wrote {workdir}/pipeline.md and {out['plot']} in {out['seconds']:.0f} s")


if __name__ == "__main__":
    user_errors.run("pipeline", main)
