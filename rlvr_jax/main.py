"""Entry point: `python -m rlvr_jax.main --config=configs/X.py[:arg] [--config.a.b=v] --workdir=W`.

The only place with flags and `jax.config`: it turns the config file into typed settings (every
unknown or inconsistent field fails here, before anything compiles), then runs the stage the
config names (`program.stages.dispatch`): RL (`train.stage="rl"`, the default), supervised
fine-tuning on demonstrations (`train.stage="sft"`) or a reward model on preference pairs
(`train.stage="rm"`).

With `--distributed` it is one of several processes (TPU pod workers, GPU hosts) that train one
run on one mesh over all their devices: the same command on each, with `--coordinator`,
`--num_processes` and `--process_id` where jax cannot find them itself (docs/scaling.md).

Exit statuses: 0 when the run reached its last step, or stopped after a SIGTERM or SIGINT with
that step saved (the same command resumes); 1 for any other error, with its traceback (a bug, or
a fault of the machine such as a read-only workdir or a failed save); 2 for an error in what was
asked, printed as one "main: error: ..." line that names the bad value (a setting, an unknown
`--config.` key, a config file that is missing, refuses its argument or calls sys.exit, a path or
hub id that is not there; `program.runtime.user_errors`; its traceback with `--verbose` or
RLVR_JAX_TRACEBACK=1), and when another process holds the workdir
(`program.runtime.workdir_lock`; the message names its pid); 130 after a second SIGINT (stopped at
once, unsaved step lost);
128 + the signal's number for SIGTERM or SIGINT outside the training loop (start-up, or the
evaluation after training; the message says what is saved). After an error the process exits
within seconds even if a library left a thread waiting (`preemption.exit_after_error`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from rlvr_jax.program.runtime import (
    agreement,
    compilation,
    config_file,
    preemption,
    user_errors,
    workdir_lock,
)
from rlvr_jax.program.settings import settings_from_config
from rlvr_jax.program.stages import dispatch

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.")
config_file.guard(_CONFIG)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Where checkpoints, metrics and plots go (default: runs/<config name>)."
)
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed",
    False,
    "One of several processes that train together (a TPU pod slice, a GPU cluster): calls "
    "jax.distributed.initialize(), which finds the coordinator, the process count and this "
    "process's id on TPU pods, under SLURM and Open MPI; elsewhere give them with "
    "--coordinator (or JAX_COORDINATOR_ADDRESS), --num_processes and --process_id.",
)
_COORDINATOR = flags.DEFINE_string(
    "coordinator",
    None,
    "With --distributed: HOST:PORT of process 0's coordinator service, the same on every process "
    "(default: JAX_COORDINATOR_ADDRESS, or found by jax on TPU pods and SLURM).",
)
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", None, "With --distributed: how many processes train together.", lower_bound=1
)
_PROCESS_ID = flags.DEFINE_integer(
    "process_id",
    None,
    "With --distributed: this process's id, 0 to num_processes-1.",
    lower_bound=0,
)
_HEARTBEAT = flags.DEFINE_integer(
    "heartbeat_timeout",
    100,
    "With --distributed: seconds without a heartbeat after which the coordination service "
    "declares a process lost and ends every other one, naming it (jax's default, 100). It bounds "
    "how long the others wait in a collective for a process that was killed.",
    lower_bound=1,
)
_PLATFORM = flags.DEFINE_string("platform", None, "Force a JAX platform, e.g. cpu.")
_COMPILE_CACHE = flags.DEFINE_string(
    "compile_cache",
    str(compilation.default_cache_dir()),
    compilation.CACHE_FLAG_HELP,
)
_ALLOW_CHANGED = flags.DEFINE_bool(
    "allow_changed_settings",
    False,
    "Resume even though settings that change what the checkpoint means differ from the ones it "
    "was saved with (the group size, the data, the optimizer); they are listed either way.",
)

flags.DEFINE_bool(user_errors.VERBOSE_FLAG, False, user_errors.VERBOSE_HELP)
_STEP = flags.DEFINE_integer(
    "step",
    -1,
    "Resume from this checkpoint step instead of the newest readable one; newer checkpoints are "
    "removed and the metrics after it dropped.",
)

_REEVALUATE = flags.DEFINE_bool(
    "reevaluate",
    False,
    "Evaluate a finished run's final checkpoint again instead of printing the result its "
    "ledger recorded (a rerun of the same command otherwise loads nothing).",
)


def _initialize_distributed() -> None:
    """`jax.distributed.initialize` with what the flags give (None: jax finds it), under
    --distributed; the process flags without it are a usage error."""
    given = {
        f"--{name}": flag.value
        for name, flag in (
            ("coordinator", _COORDINATOR),
            ("num_processes", _NUM_PROCESSES),
            ("process_id", _PROCESS_ID),
        )
        if flag.value is not None
    }
    if _HEARTBEAT.present:
        given["--heartbeat_timeout"] = _HEARTBEAT.value
    if not _DISTRIBUTED.value:
        if given:
            raise app.UsageError(
                f"{' '.join(f'{k}={v}' for k, v in given.items())}: these set up a run over "
                "several processes; add --distributed"
            )
        return
    num, pid = _NUM_PROCESSES.value, _PROCESS_ID.value
    if num is not None and pid is not None and pid >= num:
        raise app.UsageError(f"--process_id={pid} must be below --num_processes={num}")
    jax.distributed.initialize(
        coordinator_address=_COORDINATOR.value,
        num_processes=num,
        process_id=pid,
        heartbeat_timeout_seconds=_HEARTBEAT.value,
    )


def main(argv: list[str]) -> None:
    del argv
    # Loading and compiling take minutes on a large model: a termination signal then ends the run
    # with a message. The training loop replaces these handlers with its own (save, then stop).
    preemption.install_outside_loop()
    compilation.COMPILES.install(notices=True)  # the time to the first step counts from here
    # Orbax logs every checkpoint stage at INFO; the metrics ledger is the run's log.
    logging.set_verbosity(logging.WARNING)
    if _PLATFORM.value:
        jax.config.update("jax_platforms", _PLATFORM.value)
    compilation.enable_cache(_COMPILE_CACHE.value)
    _initialize_distributed()

    config = _CONFIG.value
    if config is None:
        raise app.UsageError("--config=configs/<name>.py is required")
    name = Path(flags.FLAGS["config"].config_filename.split(":")[0]).stem
    workdir = _WORKDIR.value or os.path.join("runs", name)
    primary = not _DISTRIBUTED.value or jax.process_index() == 0
    settings = settings_from_config(config)  # a bad setting leaves no workdir behind
    if _DISTRIBUTED.value:
        agreement.check_processes_agree(settings)
    try:
        with workdir_lock.hold(workdir, "training", enabled=primary):
            dispatch.run(
                settings,
                workdir,
                allow_changed_settings=_ALLOW_CHANGED.value,
                resume_step=None if _STEP.value < 0 else _STEP.value,
                skip_finished=not _REEVALUATE.value,
            )
    except workdir_lock.WorkdirBusyError as e:
        print(f"main: {e}", file=sys.stderr)
        sys.exit(workdir_lock.BUSY_EXIT_STATUS)


if __name__ == "__main__":
    # Every error, in flag parsing or in main, ends the process promptly: a user's as one line.
    user_errors.run("main", main)
