"""One entry to run a stage: `run(settings, workdir)` dispatches on `settings.train.stage`.

Only the RL stage runs over several processes (`main --distributed`): its state and batches live
on the mesh of every process's devices. The SFT and reward-model stages train on one device of
one process.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import jax

from rlvr_jax.config_types import ConfigError
from rlvr_jax.program.runtime import finished
from rlvr_jax.program.runtime.run import GREEDY_UNIT
from rlvr_jax.program.settings import Settings
from rlvr_jax.program.stages import rl_stage, rm_stage, sft_stage

STAGES = {"rl": rl_stage.run, "sft": sft_stage.run, "rm": rm_stage.run}
MULTI_PROCESS = ("rl",)
# What each stage's evaluation counts and measures, and what it writes after that evaluation.
EVAL_UNITS = {"rl": GREEDY_UNIT, "sft": GREEDY_UNIT, "rm": rm_stage.EVAL_UNIT}
WRITTEN_AFTER_FINAL = {"sft": sft_stage.written_after_final}


def _length_field(settings: Settings) -> str | None:
    """The setting that sets the stage's length where raising it alone resumes the run (the
    epochs of SFT and RM change what the checkpoint means: none then)."""
    epochs = {"sft": settings.sft.epochs, "rm": settings.rm.epochs}.get(settings.train.stage)
    return None if epochs else "train.steps"


def run(
    settings: Settings,
    workdir: str | Path,
    log: Callable[[str], None] = print,
    allow_changed_settings: bool = False,
    resume_step: int | None = None,
    skip_finished: bool = False,
) -> dict:
    """Runs the stage the settings name ("rl", "sft" or "rm") in `workdir`, resuming from it (see
    `program.runtime.run.run_stage` for what a resume may change).

    With `skip_finished`, a finished run (`program.runtime.finished`: the same settings, its
    final evaluation recorded at its newest checkpoint) is not run again: its recorded result is
    logged and returned as {"eval_before", "eval_after", "steps", "resumed_from", "finished"}
    before anything is loaded. Otherwise the stage restores the newest checkpoint and, at its
    last step already, evaluates it again.

    Raises:
      ConfigError: a stage other than RL in a run of several processes.
    """
    stage = settings.train.stage
    if jax.process_count() > 1 and stage not in MULTI_PROCESS:
        raise ConfigError(
            f"train.stage={stage!r} trains in one process, on one device; this run has "
            f"{jax.process_count()} processes: run it without --distributed, on one host (the "
            "RL stage that follows can train over several)"
        )
    if skip_finished and resume_step is None:
        written = WRITTEN_AFTER_FINAL.get(stage)
        done = finished.find(workdir, settings, written(settings, workdir) if written else ())
        if done is not None:
            log(done.summary(EVAL_UNITS[stage], _length_field(settings)))
            return done.result()
    return STAGES[stage](
        settings,
        workdir,
        log=log,
        allow_changed_settings=allow_changed_settings,
        resume_step=resume_step,
    )
