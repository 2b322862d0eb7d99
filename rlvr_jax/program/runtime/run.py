"""The run skeleton every stage shares: resume, evaluation, the step loop, checkpoints, metrics.

A stage (RL, SFT) builds a `Stage`: its initial train state, its data sampler, one step function
and an evaluator. `run_stage` does the rest the same way for all of them:

1. restore the newest checkpoint in `<workdir>/checkpoints` (train state and data position) or
   start fresh, and open the metrics ledger at the restored step;
2. evaluate before training (once: a resumed run keeps the first evaluation);
3. loop: one step -> periodic evaluation -> one ledger row -> checkpoint (periodic, on a
   termination signal, and at the last step); a SIGTERM or SIGINT stops after the step, saved,
   and a second SIGINT at once, giving up a save in flight (`program.runtime.preemption`);
4. wait for the last save, then evaluate after training, as the ledger's "final" record (not
   after a stop signal: the resumed run evaluates when it ends).

The workdir is locked while a run writes there (`program.runtime.workdir_lock`), so a second run on
it is refused at once, naming the first one's pid. Every error leaves the ledger closed and orbax's
background saving released, so the process can exit at once.

The checkpoint's host item holds {"step", "data" (the sampler's state), "eval_before",
"settings"}. A resume whose settings change what the checkpoint means (the group size, the data,
the optimizer's moments: every field outside `resume_settings.RESUME_FREE`) fails before the
first step, naming each field and both values, unless `allow_changed_settings`; only then, and
for a fresh run, is `<workdir>/settings.json` written.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import jax
import numpy as np

from rlvr_jax.config_types import ConfigError
from rlvr_jax.data import curriculum as curriculum_lib
from rlvr_jax.model.transformer import Params
from rlvr_jax.program.runtime import checkpoint as ckpt_lib
from rlvr_jax.program.runtime import compilation, finished, preemption, workdir_lock
from rlvr_jax.program.runtime import metrics as metrics_lib
from rlvr_jax.program.runtime.resume_settings import resume_differences
from rlvr_jax.program.settings import Settings, plain_settings, save_settings
from rlvr_jax.rl.state import TrainState

Evaluate = Callable[[Params], dict[str, float]]
# What the held-out evaluation counts and measures, for the log line (`Stage.eval_unit`).
GREEDY_UNIT = "prompts, greedy"


class DataSampler(Protocol):
    """The data order of a stage (`curriculum.EpochSampler`, `curriculum.CurriculumSampler`)."""

    def init(self, seed: int) -> Any: ...

    def state_dict(self, state: Any) -> dict: ...

    def load_state_dict(self, d: dict) -> Any: ...


# step(train state, sampler state) -> (train state, sampler state, host metrics of the step).
StepFn = Callable[[TrainState, Any], tuple[TrainState, Any, dict[str, Any]]]


@dataclasses.dataclass
class Stage:
    """What a stage gives `run_stage`.

    Attributes:
      name: "RL" or "SFT", for the log lines.
      steps: optimizer steps to reach.
      state: the initial train state, placed on the mesh.
      sampler: the data order; its state is checkpointed with the train state.
      step: one training step.
      evaluate: held-out evaluation of the policy, or None.
      ref_source: where the reference parameters can be rebuilt from (not saved then).
      precompile: compiles the step's programs for a state (`jit(...).lower(...).compile()`);
        run on a thread while the evaluation before training runs, or None.
      eval_unit: what the evaluation counts and measures, for the log line.
    """

    name: str
    steps: int
    state: TrainState
    sampler: DataSampler
    step: StepFn
    evaluate: Evaluate | None = None
    ref_source: str | None = None
    precompile: Callable[[TrainState], None] | None = None
    eval_unit: str = GREEDY_UNIT


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What a run reached.

    Attributes:
      state: the final train state.
      steps: the step the run stopped at (`Stage.steps`, or earlier on a termination signal).
      resumed_from: the checkpoint step it started from (0 for a fresh run).
      eval_before, eval_after: the evaluations (None without an evaluator).
      step_metrics: the host metrics of each step this process ran, in order.
    """

    state: TrainState
    steps: int
    resumed_from: int
    eval_before: dict[str, float] | None
    eval_after: dict[str, float] | None
    step_metrics: list[dict[str, Any]]


def _check_resume(host: dict, settings: Settings, allow_changed: bool, log) -> None:
    saved = host.get("settings")
    if saved is None:
        return
    changed = resume_differences(saved, settings)
    if not changed:
        return
    lines = "\n  ".join(changed)
    if not allow_changed:
        raise ConfigError(
            f"resuming step {host['step']} with settings that change what its checkpoint means:"
            f"\n  {lines}\nrestore them, use another workdir, or accept the change deliberately "
            "(python -m rlvr_jax.main --allow_changed_settings)"
        )
    log(f"resuming step {host['step']} with changed settings (allowed):\n  {lines}")


def _resume(
    checkpointer: ckpt_lib.Checkpointer,
    stage: Stage,
    settings: Settings,
    workdir: Path,
    allow_changed: bool,
    resume_step: int | None,
    log,
) -> tuple[TrainState, dict | None, int, metrics_lib.MetricsWriter]:
    state, host, start_step = stage.state, None, 0
    # The newest readable checkpoint (an unreadable newer one is skipped with a warning), or the
    # one asked for.
    restored = checkpointer.restore(state, step=resume_step)
    if restored is not None:
        state, host = restored
        _check_resume(host, settings, allow_changed, log)
        start_step = int(host["step"])
        # Newer steps (skipped as unreadable, or left behind by an explicit step) would collide
        # with the ones this run saves next.
        dropped = checkpointer.discard_after(start_step)
        if dropped:
            log(f"removed checkpoints {dropped}, newer than step {start_step}")
        log(f"resumed from step {start_step} in {workdir / 'checkpoints'}")
    elif resume_step is not None:
        raise ConfigError(f"--step={resume_step}: {workdir / 'checkpoints'} holds no checkpoint")
    # Written once the settings are known to fit the checkpoint: eval and export read it.
    save_settings(settings, workdir)
    writer = metrics_lib.MetricsWriter(
        workdir,
        process_index=jax.process_index(),
        use_tensorboard=settings.train.use_tensorboard,
        log_every=settings.train.log_every,
        total_steps=max(stage.steps, 1),
        resume_step=start_step,
    )
    return state, host, start_step, writer


# Metrics whose non-finite value means the update put NaN or inf into the parameters.
_UPDATE_HEALTH = ("grad_norm", "update_norm", "sft/loss")


class NonFiniteError(FloatingPointError):
    """The step's loss or gradient went non-finite: the parameters are lost from there on."""


def non_finite(metrics: dict[str, Any]) -> dict[str, float]:
    """The step's losses, gradient and update norms that are not finite.

    After such an update the parameters cannot be trusted (a NaN gradient survives clipping and
    reaches every weight), so the run stops before it saves them.
    """
    return {
        k: float(v)
        for k, v in metrics.items()
        if (k.endswith(_UPDATE_HEALTH) or k.startswith("loss/"))
        and np.ndim(v) == 0
        and not math.isfinite(float(v))
    }


def _startup(log: Callable[[str], None], phases: dict[str, float]) -> dict[str, float]:
    """The process's start-up so far (`compilation.COMPILES`) and the seconds of its `phases`
    ("startup/<phase>_seconds"), logged in one line. What the phases leave of
    "startup/seconds" is the set-up before the stage: imports, loading, building its programs."""
    m = compilation.COMPILES.metrics()
    m.update({f"startup/{k}_seconds": v for k, v in phases.items()})
    setup = m["startup/seconds"] - sum(phases.values())
    parts = ", ".join(f"{k.replace('_', ' ')} {v:.1f} s" for k, v in phases.items())
    log(f"first step after {compilation.COMPILES.summary()}; set-up {setup:.1f} s, {parts}")
    return m


def run_stage(
    stage: Stage,
    settings: Settings,
    workdir: str | Path,
    log: Callable[[str], None] = print,
    allow_changed_settings: bool = False,
    resume_step: int | None = None,
) -> RunResult:
    """Runs `stage` to `stage.steps` in `workdir`, resuming from its last checkpoint (or from
    `resume_step`; newer checkpoints are then removed, and the ledger's later rows dropped).

    The workdir is locked for the run (`workdir_lock`; the primary process of a multi-host run).
    A SIGTERM or SIGINT stops the loop after its step, saved (`RunResult.steps` is then that
    step, and there is no evaluation after training); a second SIGINT raises
    `KeyboardInterrupt` at once, giving up the save in flight.

    Raises:
      ConfigError: resuming with settings that change the checkpoint's meaning (see the module
        docstring), unless `allow_changed_settings`.
      NonFiniteError: a step whose loss, gradient or update is not finite (nothing is saved).
      WorkdirBusyError: another process holds the workdir.
    """
    compilation.COMPILES.install()
    workdir = Path(workdir)
    with workdir_lock.hold(workdir, "training", enabled=jax.process_index() == 0):
        return _run_locked(stage, settings, workdir, log, allow_changed_settings, resume_step)


def _run_locked(
    stage: Stage,
    settings: Settings,
    workdir: Path,
    log: Callable[[str], None],
    allow_changed_settings: bool,
    resume_step: int | None,
) -> RunResult:
    preemption.loop_started()
    workdir.mkdir(parents=True, exist_ok=True)
    train = settings.train
    checkpointer = ckpt_lib.Checkpointer(
        workdir / "checkpoints",
        every_steps=train.checkpoint_every or max(stage.steps, 1),
        keep=train.keep_checkpoints,
        ref_source=stage.ref_source,
    )
    guard = preemption.PreemptionGuard()
    writer = None
    try:
        state, host, start_step, writer = _resume(
            checkpointer, stage, settings, workdir, allow_changed_settings, resume_step, log
        )
        data_state, eval_before, phases = _before_training(
            stage, settings, state, host, start_step, writer, log
        )
        guard.install()
        state, step, history, stopped = _train(
            stage,
            settings,
            _Progress(state, data_state, start_step, eval_before, phases),
            checkpointer,
            writer,
            guard,
            log,
        )
        # The handlers stay until the last save is on disk.
        checkpointer.close()
    except BaseException as e:
        guard.uninstall()
        if writer is not None:
            writer.close()
        # A failed background save is logged next to this error, not raised in its place; a
        # second SIGINT gives up the save in flight.
        checkpointer.__exit__(type(e), e, e.__traceback__)
        if isinstance(e, KeyboardInterrupt):
            log(
                f"interrupted by a second SIGINT: stopped at once, without saving the step in "
                f"progress; complete checkpoints in {checkpointer.directory}: "
                f"{checkpointer.complete_steps() or 'none'} (the same command resumes from the "
                "newest)"
            )
        raise
    preemption.loop_ended(step, checkpointer.directory)
    guard.uninstall()
    with writer:
        if stopped:
            log(
                f"stopped at step {step} by {guard.signal_name}: checkpoint step {step} is saved "
                f"in {checkpointer.directory}; the same command resumes from it"
            )
            return RunResult(state, step, start_step, eval_before, None, history)
        eval_after = None if stage.evaluate is None else stage.evaluate(state.params)
        if eval_after is not None:
            writer.write(step, eval_after, record="final")
    if eval_before is not None and eval_after is not None:
        log(finished.held_out_line(eval_before, eval_after, stage.eval_unit))
    return RunResult(state, step, start_step, eval_before, eval_after, history)


def _before_training(
    stage: Stage,
    settings: Settings,
    state: TrainState,
    host: dict | None,
    start_step: int,
    writer: metrics_lib.MetricsWriter,
    log: Callable[[str], None],
) -> tuple[Any, dict | None, dict[str, float]]:
    """The sampler's state, the evaluation before training (run once, or the checkpoint's) and
    the seconds of the phases before the first step; the step's programs compile meanwhile."""
    data_state = stage.sampler.init(settings.data.seed)
    compiled = lambda: None  # noqa: E731
    ahead = settings.train.compile_ahead and start_step < stage.steps
    if stage.precompile is not None and ahead:
        precompile = stage.precompile
        compiled = compilation.in_background(
            lambda: precompile(state), f"the {stage.name} step", log
        )
    eval_before = None
    if host is not None:
        data_state = stage.sampler.load_state_dict(curriculum_lib.state_from_json(host["data"]))
        eval_before = host.get("eval_before")
        if eval_before is not None and writer.missing_eval:
            writer.write(0, eval_before, record=metrics_lib.EVAL)  # the ledger lost it
    # Where this process's time to its first step goes, besides setting up.
    phases = {"eval_before": 0.0}
    start = time.perf_counter()
    if stage.evaluate is not None and eval_before is None:
        eval_before = stage.evaluate(state.params)
        writer.write(0, eval_before, record=metrics_lib.EVAL)
        phases["eval_before"] = time.perf_counter() - start
    if eval_before is not None:
        log(f"held-out accuracy before {stage.name}: {eval_before['eval/accuracy']:.3f}")
    start = time.perf_counter()
    compiled()
    phases["compile_wait"] = time.perf_counter() - start
    return data_state, eval_before, phases


@dataclasses.dataclass
class _Progress:
    """Where the loop starts: the restored (or initial) state and what came before it."""

    state: TrainState
    data_state: Any
    start_step: int
    eval_before: dict | None
    phases: dict[str, float]


def _train(
    stage: Stage,
    settings: Settings,
    at: _Progress,
    checkpointer: ckpt_lib.Checkpointer,
    writer: metrics_lib.MetricsWriter,
    guard: preemption.PreemptionGuard,
    log: Callable[[str], None],
) -> tuple[TrainState, int, list[dict[str, Any]], bool]:
    """The step loop: step, periodic evaluation, ledger row, checkpoint. Returns the state, the
    step and the host metrics of each step it ran, and whether a stop signal (on any process)
    ended it, saved, before `stage.steps`."""
    train = settings.train
    state, data_state, step, history = at.state, at.data_state, at.start_step, []
    saved_settings = plain_settings(settings)
    while step < stage.steps:
        start = time.perf_counter()
        state, data_state, metrics = stage.step(state, data_state)
        step += 1
        if step == at.start_step + 1:  # this process's first step: what starting it cost
            at.phases["first_step"] = time.perf_counter() - start
            writer.write(step, _startup(log, at.phases), record=metrics_lib.STARTUP)
        history.append(metrics)
        bad = non_finite(metrics)
        if bad:
            writer.write(step, metrics)  # the failing step's row, for the post-mortem
            last = checkpointer.latest_step()
            raise NonFiniteError(
                f"step {step}: {', '.join(f'{k}={v}' for k, v in sorted(bad.items()))}; the "
                "update is not finite, so the run stops without saving its parameters (last "
                f"checkpoint: {'none' if last is None else f'step {last}'})"
            )
        periodic = train.eval_every and step % train.eval_every == 0 and step < stage.steps
        if stage.evaluate is not None and periodic:
            metrics.update(stage.evaluate(state.params))
        writer.write(step, metrics)
        host = {
            "step": step,
            "data": curriculum_lib.state_to_json(stage.sampler.state_dict(data_state)),
            "eval_before": at.eval_before,
            "settings": saved_settings,
        }
        stop = guard.should_stop()
        if checkpointer.should_save(step) or stop or step == stage.steps:
            checkpointer.save(step, state, host, force=True)
        if stop:
            return state, step, history, True
    return state, step, history, False
