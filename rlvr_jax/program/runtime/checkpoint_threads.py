"""Orbax's background threads of a save that failed or was given up: woken, so they end.

Host code for `program.runtime.checkpoint`. An asynchronous orbax save runs its writes in non-daemon
threads, each waiting for a signal ("the step directory exists") before it writes. When the step
that sends the signal fails (the checkpoints path is a file, a read-only file system) or the save
is abandoned half-way (a second Ctrl-C), the others wait for it until orbax's coordination
timeout (300 s), and the interpreter waits for them at exit: the process looks hung. `release`
cancels the threads of the given save operations and sets the signals they wait for, so each of
them wakes, sees that it is cancelled and returns without writing.

This reaches into orbax's internals (`orbax.checkpoint._src.futures`); where they differ from
the version this was written against, `release` does nothing and says so in a warning, and the
entry points' exit watchdog (`program.runtime.preemption.exit_after_error`) still ends the process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection

try:
    from orbax.checkpoint._src.futures import future as _future
    from orbax.checkpoint._src.futures import synchronization as _synchronization
except ImportError:  # another orbax layout: nothing to release through
    _future = _synchronization = None


def current_operation() -> str | None:
    """The id of orbax's latest save operation (each save draws a new one), or None."""
    if _synchronization is None:
        return None
    try:
        return str(_synchronization.OperationIdGenerator.get_current_operation_id())
    except Exception:  # noqa: BLE001 - an unknown orbax: no id to release by
        return None


def _threads(operations: Collection[str]) -> list[threading.Thread]:
    kind = getattr(_future, "_SignalingThread", None)
    if kind is None:
        return []
    return [
        t
        for t in threading.enumerate()
        if isinstance(t, kind)
        and t.is_alive()
        and str(getattr(t, "_operation_id", None)) in operations
    ]


def release(operations: Collection[str], timeout_s: float = 10.0) -> list[str]:
    """Cancels and wakes orbax's live background threads of the save `operations`.

    Only for saves that failed or are given up: a cancelled thread writes nothing more, and the
    save's temporary directory is never read (a writer removes it when it next opens the
    checkpoints).

    Args:
      operations: the operation ids of those saves (`current_operation` after each save).
      timeout_s: how long to wait for the woken threads to end.

    Returns:
      The names of the threads still alive after `timeout_s` (none normally).
    """
    if _future is None or not operations:
        return []
    threads = _threads(operations)
    try:
        for t in threads:
            t.cancel()
        for t in threads:
            _future.set_signals(t._receive_signals, operation_id=t._operation_id)
    except Exception as e:  # noqa: BLE001 - an unknown orbax: the exit watchdog remains
        logging.warning("cannot wake orbax's background threads of a failed save: %r", e)
    deadline = time.monotonic() + timeout_s
    for t in threads:
        threading.Thread.join(t, max(deadline - time.monotonic(), 0.0))
    stuck = [t.name for t in threads if t.is_alive()]
    if stuck:
        logging.warning(
            "%d of orbax's background threads of a failed save did not end within %.0f s: %s",
            len(stuck),
            timeout_s,
            stuck,
        )
    return stuck
