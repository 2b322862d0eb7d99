"""Entry point: `python -m rlvr_jax.main --config=configs/X.py[:arg] [--config.a.b=v] --workdir=W`.

The only place with flags and `jax.config`: it turns the config file into typed settings (every
unknown or inconsistent field fails here, before anything compiles), then runs the stage the
config names: `train.run` for RL (`train.stage="rl"`, the default) or `sft.run` for supervised
fine-tuning on demonstrations (`train.stage="sft"`).
"""

from __future__ import annotations

import os
from pathlib import Path

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.")
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Where checkpoints, metrics and plots go (default: runs/<config name>)."
)
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed",
    False,
    "Call jax.distributed.initialize() (multi-host TPU pods and GPU clusters).",
)
_PLATFORM = flags.DEFINE_string("platform", None, "Force a JAX platform, e.g. cpu.")


def main(argv: list[str]) -> None:
    del argv
    # Orbax logs every checkpoint stage at INFO; the metrics ledger is the run's log.
    logging.set_verbosity(logging.WARNING)
    import jax

    if _PLATFORM.value:
        jax.config.update("jax_platforms", _PLATFORM.value)
    if _DISTRIBUTED.value:
        jax.distributed.initialize()
    from rlvr_jax import train
    from rlvr_jax.program import settings as settings_lib

    config = _CONFIG.value
    if config is None:
        raise app.UsageError("--config=configs/<name>.py is required")
    settings = settings_lib.settings_from_config(config)
    name = Path(flags.FLAGS["config"].config_filename.split(":")[0]).stem
    workdir = _WORKDIR.value or os.path.join("runs", name)
    if settings.train.stage == "sft":
        from rlvr_jax import sft

        sft.run(settings, workdir)
    else:
        train.run(settings, workdir)


if __name__ == "__main__":
    app.run(main)
