"""Preemption: SIGTERM / SIGINT turn into a request to stop after the current step.

TPU VMs and cluster schedulers send SIGTERM some time before they kill a job. The run skeleton
installs `PreemptionGuard` around its loop, checks `should_stop()` after each step, saves a
checkpoint and stops; the signal never interrupts a step or a save half-way.
"""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Sequence
from types import FrameType
from typing import Any

import jax
import numpy as np


@dataclasses.dataclass
class PreemptionGuard:
    """Turns SIGTERM (a preemption notice) into a flag the training loop checks between steps.

    The loop then saves a checkpoint and exits cleanly instead of dying mid-step::

        with PreemptionGuard() as guard:
            for step in ...:
                ...
                if guard.should_stop():
                    ckpt.save(step, state, host, force=True)
                    break

    The handler only sets a flag (safe at any point of the interpreter). The previous handlers
    come back on exit. Installing requires the main thread.

    Attributes:
      signals: the signals to catch.
      received: the signal numbers caught so far.
    """

    signals: Sequence[int] = (signal.SIGTERM,)
    received: list[int] = dataclasses.field(default_factory=list, init=False)
    _previous: dict[int, Any] = dataclasses.field(default_factory=dict, init=False, repr=False)

    def install(self) -> PreemptionGuard:
        """Installs the handlers, remembering the previous ones."""
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

    @property
    def requested(self) -> bool:
        """Whether this process has received a stop signal."""
        return bool(self.received)

    def should_stop(self) -> bool:
        """Whether any process has received a stop signal.

        With several processes this is a collective (every process must call it at the same
        point), so all of them save the same step and stop together.
        """
        if jax.process_count() == 1:
            return self.requested
        from jax.experimental import multihost_utils

        flags = multihost_utils.process_allgather(np.array(self.requested, np.int32))
        return bool(np.max(flags))

    def __enter__(self) -> PreemptionGuard:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()
