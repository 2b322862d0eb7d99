"""Stopping a run: SIGTERM and SIGINT (Ctrl-C) become a request to stop after the current step,
and a process whose run failed ends promptly with a status that says so.

TPU VMs and cluster schedulers send SIGTERM some time before they kill a job; a researcher
presses Ctrl-C. The run skeleton installs `PreemptionGuard` around its loop, checks
`should_stop()` after each step, saves a checkpoint and stops (exit status 0: the same command
resumes); the first signal never interrupts a step or a save half-way. A second SIGINT stops at
once (`KeyboardInterrupt`, exit status 130) without waiting for the step or a save in flight; the
newest complete checkpoint stays as it was.

Outside the loop (loading, compiling, the evaluations before and after training) the entry
point's handlers (`install_outside_loop`) end the process with status 128 + the signal's number
and a message that says what is saved: during start-up nothing this process trained, after the
loop the step it saved (`loop_ended`).

`exit_after_error` is the entry points' error path (after `user_errors`, which says a user's
error in one line and ends with status 2 through it): it reports the error, flushes, and exits
with a non-zero status even when a library left a non-daemon thread waiting forever (orbax's
background savers after a failed save): after `EXIT_GRACE_S` the process ends regardless.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from types import FrameType
from typing import Any, NoReturn

import jax
import numpy as np

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# The exit status after a second SIGINT (the shell's for a process killed by SIGINT).
INTERRUPTED_EXIT_STATUS = 128 + signal.SIGINT
_SECOND_SIGINT = "a second SIGINT: stopping at once, without saving"
# How long an exiting process waits for its threads and exit handlers before it ends anyway.
EXIT_GRACE_S = 10.0


@dataclasses.dataclass
class PreemptionGuard:
    """Turns SIGTERM and SIGINT into a flag the training loop checks between steps.

    The loop then saves a checkpoint and exits cleanly instead of dying mid-step::

        with PreemptionGuard() as guard:
            for step in ...:
                ...
                if guard.should_stop():
                    ckpt.save(step, state, host, force=True)
                    break

    The handler only sets a flag (safe at any point of the interpreter), except for a second
    SIGINT, which raises `KeyboardInterrupt` there and then (in an entry point, which installed
    `install_outside_loop`, a watchdog also ends the process with status 130 within
    `EXIT_GRACE_S`): someone pressing Ctrl-C twice wants the process gone now.
    A repeated SIGTERM (schedulers resend it) only sets the flag again.
    The previous handlers come back on exit. Installing requires the main thread.

    Attributes:
      signals: the signals to catch.
      received: the signal numbers caught so far.
    """

    signals: Sequence[int] = STOP_SIGNALS
    received: list[int] = dataclasses.field(default_factory=list, init=False)
    _previous: dict[int, Any] = dataclasses.field(default_factory=dict, init=False, repr=False)

    def install(self) -> PreemptionGuard:
        """Installs the handlers, remembering the previous ones.

        Raises:
          StoppedOutsideLoop: a stop signal arrived during start-up and its exception was
            ignored where it landed: the loop must not start.
        """
        if _STOPPED_OUTSIDE:
            raise StoppedOutsideLoop(_STOPPED_OUTSIDE[0])
        if self._previous:
            raise RuntimeError("PreemptionGuard is already installed")
        for sig in self.signals:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError as e:
                self.uninstall()
                raise RuntimeError(
                    f"cannot install a handler for signal {sig} (not the main thread?): {e}"
                ) from e
        return self

    def uninstall(self) -> None:
        """Restores the handlers that were there before `install`."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        self.received.append(signum)
        if signum == signal.SIGINT and self.received.count(signal.SIGINT) > 1:
            if _ENTRY_POINT.installed:
                # The exception can land in a callback that ignores it (a garbage collection
                # hook): `should_stop` raises it again, and the watchdog ends the process if
                # neither reaches the entry point.
                _start_watchdog(INTERRUPTED_EXIT_STATUS, EXIT_GRACE_S)
            raise KeyboardInterrupt(_SECOND_SIGINT)
        if len(self.received) == 1:
            line = f"{signal.Signals(signum).name} received: stopping after this step, saved"
            if signum == signal.SIGINT:
                line += "; a second SIGINT stops at once, without saving"
            _say(line)

    @property
    def requested(self) -> bool:
        """Whether this process has received a stop signal."""
        return bool(self.received)

    @property
    def signal_name(self) -> str:
        """The first signal received ("SIGTERM"), or "a stop signal on another process"."""
        if not self.received:
            return "a stop signal on another process"
        return signal.Signals(self.received[0]).name

    def should_stop(self) -> bool:
        """Whether any process has received a stop signal.

        With several processes this is a collective (every process must call it at the same
        point), so all of them save the same step and stop together.

        Raises:
          KeyboardInterrupt: after a second SIGINT whose own exception did not end the loop.
        """
        if self.received.count(signal.SIGINT) > 1:
            raise KeyboardInterrupt(_SECOND_SIGINT)
        if jax.process_count() == 1:
            return self.requested
        from jax.experimental import multihost_utils

        flags = multihost_utils.process_allgather(np.array(self.requested, np.int32))
        return bool(np.max(flags))

    def __enter__(self) -> PreemptionGuard:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()


def _say(line: str) -> None:
    """One line on stderr from a signal handler: a raw write, which cannot re-enter a `print`
    the handler interrupted."""
    with contextlib.suppress(OSError):
        os.write(sys.stderr.fileno(), (line + "\n").encode())


# ---------------------------------------------------------------------------------------------
# Outside the training loop


class StoppedOutsideLoop(SystemExit):
    """SIGTERM or SIGINT while no training loop had the signals; the code is 128 + signal."""


@dataclasses.dataclass
class _LoopEnd:
    step: int | None = None
    directory: str | None = None


_LAST_LOOP = _LoopEnd()


def loop_started() -> None:
    """The run skeleton starts a stage: a signal from here on is in its start-up."""
    _LAST_LOOP.step = _LAST_LOOP.directory = None


def loop_ended(step: int, directory: str | os.PathLike) -> None:
    """The run skeleton's loop ended with checkpoint `step` complete in `directory`."""
    _LAST_LOOP.step, _LAST_LOOP.directory = step, str(directory)


def outside_loop_message(signum: int) -> str:
    """What a stop signal outside the training loop leaves behind, in one line."""
    name = signal.Signals(signum).name
    if _LAST_LOOP.step is None:
        return (
            f"stopped by {name} outside the training loop, during start-up: this process has "
            "trained nothing yet, and the workdir's checkpoints are unchanged"
        )
    return (
        f"stopped by {name} outside the training loop, after it: step {_LAST_LOOP.step} is "
        f"saved in {_LAST_LOOP.directory}; what came after the loop (the evaluation after "
        "training, an export) did not finish"
    )


@dataclasses.dataclass
class _EntryPoint:
    installed: bool = False


_ENTRY_POINT = _EntryPoint()


# The exit status of a stop signal received outside the loop (at most one entry).
_STOPPED_OUTSIDE: list[int] = []


def _stop_outside_loop(signum: int, frame: FrameType | None) -> None:
    del frame
    _say(outside_loop_message(signum))
    # The exception can land in a callback that ignores it (Python runs a handler between any
    # two bytecodes, a finaliser's included): the watchdog ends the process then, and the
    # training loop does not start (`PreemptionGuard.install`).
    _start_watchdog(128 + signum, EXIT_GRACE_S)
    _STOPPED_OUTSIDE[:] = [128 + signum]
    raise StoppedOutsideLoop(128 + signum)


def install_outside_loop() -> None:
    """The entry point's handlers for SIGTERM and SIGINT: end the process with a message
    (`outside_loop_message`). The training loop replaces them with its own while it runs; in
    such a process its second SIGINT ends the process itself (`os._exit(130)`)."""
    _ENTRY_POINT.installed = True
    for sig in STOP_SIGNALS:
        signal.signal(sig, _stop_outside_loop)


# ---------------------------------------------------------------------------------------------
# Ending the process after an error


def exit_status(error: BaseException) -> int:
    """The exit status for a run that ended with `error`: a `SystemExit`'s own code (1 for a
    message), 130 after a second SIGINT, 1 otherwise."""
    if isinstance(error, SystemExit):
        code = error.code
        if code is None:
            return 0
        return code if isinstance(code, int) else 1
    if isinstance(error, KeyboardInterrupt):
        return INTERRUPTED_EXIT_STATUS
    return 1


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()


def _end_anyway(status: int, grace_s: float) -> None:
    time.sleep(grace_s)
    main = threading.main_thread()
    stuck = [t.name for t in threading.enumerate() if not t.daemon and t is not main]
    with contextlib.suppress(Exception):
        sys.stderr.write(
            f"exiting with status {status} after {grace_s:.0f} s without waiting further for "
            f"{len(stuck)} background threads ({', '.join(sorted(set(stuck))) or 'exit handlers'})"
            "\n"
        )
    _flush()
    os._exit(status)


def exit_after_error(error: BaseException, grace_s: float = EXIT_GRACE_S) -> NoReturn:
    """Reports `error` (a traceback, except for `SystemExit` and a second SIGINT, whose
    message is already out) and exits with `exit_status(error)`.

    The exit is the interpreter's own (exit handlers run, non-daemon threads are joined), with a
    watchdog: if that has not finished after `grace_s` seconds, the process ends with the same
    status through `os._exit`, so no thread left waiting by a failed library call can keep it
    alive. Files the run wrote were closed by the code that raised (`run_stage` closes the ledger
    and the checkpoints before the error reaches here).
    """
    status = exit_status(error)
    if isinstance(error, SystemExit):
        if error.code is not None and not isinstance(error.code, int):
            print(error.code, file=sys.stderr)
    elif not isinstance(error, KeyboardInterrupt):  # the run skeleton said what it left
        traceback.print_exception(error, file=sys.stderr)
    _flush()
    _start_watchdog(status, grace_s)
    raise SystemExit(status)


def _start_watchdog(status: int, grace_s: float) -> None:
    threading.Thread(
        target=_end_anyway, args=(status, grace_s), name="exit-watchdog", daemon=True
    ).start()
