"""One entry to run a stage: `run(settings, workdir)` dispatches on `settings.train.stage`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rlvr_jax import sft, train
from rlvr_jax.program.settings import Settings


def run(settings: Settings, workdir: str | Path, log: Callable[[str], None] = print) -> dict:
    """Runs the stage the settings name ("rl" or "sft") in `workdir`, resuming from it."""
    if settings.train.stage == "sft":
        return sft.run(settings, workdir, log=log)
    return train.run(settings, workdir, log=log)
