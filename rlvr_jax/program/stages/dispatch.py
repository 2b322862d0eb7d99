"""One entry to run a stage: `run(settings, workdir)` dispatches on `settings.train.stage`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rlvr_jax.program.settings import Settings
from rlvr_jax.program.stages import rl_stage, rm_stage, sft_stage

STAGES = {"rl": rl_stage.run, "sft": sft_stage.run, "rm": rm_stage.run}


def run(
    settings: Settings,
    workdir: str | Path,
    log: Callable[[str], None] = print,
    allow_changed_settings: bool = False,
    resume_step: int | None = None,
) -> dict:
    """Runs the stage the settings name ("rl", "sft" or "rm") in `workdir`, resuming from it (see
    `program.runtime.run.run_stage` for what a resume may change)."""
    return STAGES[settings.train.stage](
        settings,
        workdir,
        log=log,
        allow_changed_settings=allow_changed_settings,
        resume_step=resume_step,
    )
