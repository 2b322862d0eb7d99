"""A process pool for host verifiers: per-item hard deadline, crash isolation, counters.

Host code, standard library only: workers import this module and the verifier's module, never
JAX. Workers are started with the "forkserver" (default) or "spawn" context, never "fork": the
trainer process runs JAX threads, which a fork would copy in an undefined state.

* Each worker verifies one item at a time. An item that is not done `deadline_s` after it was
  sent gets reward 0 and status "timeout", and its worker is killed (SIGKILL: sympy stuck in a C
  big-integer power ignores signals) and replaced.
* An item whose verifier raises, returns a non-finite value, or kills its process (segfault,
  `os._exit`, out of memory) gets reward 0 and status "crash"; a dead worker is replaced.
* Nothing of this stops the run: `map` always returns one reward per item, and `stats` counts
  checks, timeouts, crashes and restarts, and measures checks per second.
* The deadline clock starts when a ready worker receives the item, so the start-up of a
  replacement (imports) is never charged to an item.
* With "forkserver", the verifier's module is preloaded in the fork server, so a replacement
  worker starts in milliseconds instead of re-importing sympy.
* Each worker may cap its address space (`memory_limit_mb`, RLIMIT_AS): a verifier that blows
  up its memory raises MemoryError (a crash) instead of swapping the machine. A worker ends
  when the trainer dies, even inside a stuck computation (SIGIO on its parent pipe), so no
  verifier outlives the run.

Caveat: multiprocessing makes spawn and forkserver workers import the parent's `__main__`
module (to unpickle objects defined there). Start the trainer as a module whose `__main__` is
light (`python -m package` with a `__main__.py` is skipped by multiprocessing), or keep the
entry point's heavy imports (JAX) inside its `main()`, or every worker imports them too.

Usage:

    from rlvr_jax.rewards import math as math_reward
    from rlvr_jax.rewards.pool import VerifierPool

    with VerifierPool(
        math_reward.score, num_workers=8, deadline_s=5.0, warmup=math_reward.WARMUP
    ) as pool:
        rewards = pool.map([(text, gold) for text, gold in zip(texts, golds)])
        rewards, statuses = pool.map_with_status(items)  # statuses: "ok" | "timeout" | "crash"
        print(pool.stats.timeouts, pool.stats.crashes, pool.stats.checks_per_s)

The verifier `fn` must be a module-level function of an importable module (not `__main__`, not a
lambda); each item is the tuple of its positional arguments.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import multiprocessing
import os
import pickle
import signal
import time
import weakref
from collections.abc import Callable, Iterable
from multiprocessing import connection
from typing import Any

STATUS_OK = "ok"
STATUS_TIMEOUT = "timeout"
STATUS_CRASH = "crash"
START_METHODS = ("forkserver", "spawn")
_MAX_START_FAILURES = 3


@dataclasses.dataclass
class PoolStats:
    """Counters since the pool started; read them after `map`.

    Attributes:
      checks: items verified (any status).
      timeouts: items past their deadline.
      crashes: items whose verifier raised, returned a non-finite value or died.
      restarts: workers replaced.
      seconds: wall time spent inside `map`.
    """

    checks: int = 0
    timeouts: int = 0
    crashes: int = 0
    restarts: int = 0
    seconds: float = 0.0

    @property
    def checks_per_s(self) -> float:
        """Items per second of `map` wall time (0 before any)."""
        return self.checks / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self, prefix: str = "verifier/") -> dict[str, float]:
        """The counters as metrics."""
        out = {f"{prefix}{k}": float(v) for k, v in dataclasses.asdict(self).items()}
        out[f"{prefix}checks_per_s"] = self.checks_per_s
        return out


def _die_with_parent() -> None:
    """Make the kernel end this worker when the trainer dies, whatever the worker is doing.

    The parent sentinel is a pipe whose write end only the trainer holds; with O_ASYNC, its EOF
    raises SIGIO, whose default action ends the process. Unlike a watchdog thread this needs no
    GIL (a C big-integer power holds it for minutes), and unlike PR_SET_PDEATHSIG it works for
    forkserver workers, whose parent is the fork server (which itself lives as long as they do).
    """
    parent = multiprocessing.parent_process()
    if parent is None or not hasattr(os, "O_ASYNC"):
        return
    import fcntl

    fd = parent.sentinel
    fcntl.fcntl(fd, fcntl.F_SETOWN, os.getpid())
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_ASYNC)
    if connection.wait([fd], timeout=0):  # the trainer died before the signal was armed
        os._exit(1)


def _worker_main(
    conn, fn: Callable[..., float], memory_limit_mb: int | None, warmup: tuple | None
) -> None:
    """Worker loop: receive (index, args), send (index, value, status); None stops it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    _die_with_parent()
    if memory_limit_mb:
        import resource

        limit = int(memory_limit_mb) * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if warmup is not None:
        with contextlib.suppress(Exception):
            fn(*warmup)
    conn.send(("ready", os.getpid()))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        index, args = message
        try:
            value = float(fn(*args))
            status = STATUS_OK if math.isfinite(value) else STATUS_CRASH
        except Exception:  # the verifier's failure is the item's, never the worker's
            value, status = 0.0, STATUS_CRASH
        conn.send((index, value if status == STATUS_OK else 0.0, status))


@dataclasses.dataclass
class _Worker:
    process: Any
    conn: Any
    ready: bool = False
    index: int | None = None
    deadline: float = math.inf


def _stop(workers: list[_Worker]) -> None:
    for w in workers:
        with contextlib.suppress(OSError, ValueError):
            w.conn.send(None)
    for w in workers:
        w.process.join(timeout=1.0)
        if w.process.is_alive():
            w.process.kill()
            w.process.join(timeout=5.0)
        w.conn.close()
    workers.clear()


def _check_fn(fn: Callable[..., float]) -> None:
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", "")
    if module in (None, "__main__") or "<" in qualname:
        raise ValueError(
            f"fn={fn!r} must be a module-level function of an importable module "
            "(not __main__, not a lambda or a local function)"
        )
    try:
        pickle.dumps(fn)
    except Exception as e:
        raise ValueError(f"fn={fn!r} cannot be pickled by reference: {e}") from e


class VerifierPool:
    """Worker processes that run `fn(*item)` with a hard deadline per item.

    Args:
      fn: the verifier, `fn(*args) -> float`; module-level in an importable module.
      num_workers: processes.
      deadline_s: seconds an item may run before it is abandoned (reward 0, "timeout").
      start_method: "forkserver" or "spawn" ("fork" is refused).
      memory_limit_mb: address-space cap per worker; None for no cap.
      startup_timeout_s: how long `map` waits with no worker ready (all starting) before it
        raises.
      warmup: arguments of one call each worker makes before it takes items (its result and
        errors are ignored), so that lazy imports and caches are not charged to a deadline;
        `math.WARMUP` for `math.score`.
    """

    def __init__(
        self,
        fn: Callable[..., float],
        num_workers: int,
        deadline_s: float,
        *,
        start_method: str = "forkserver",
        memory_limit_mb: int | None = 4096,
        startup_timeout_s: float = 120.0,
        warmup: tuple | None = None,
    ):
        if num_workers < 1:
            raise ValueError(f"num_workers={num_workers} must be at least 1")
        if not deadline_s > 0:
            raise ValueError(f"deadline_s={deadline_s} must be positive")
        if start_method not in START_METHODS:
            raise ValueError(f"start_method={start_method!r} must be one of {START_METHODS}")
        if memory_limit_mb is not None and memory_limit_mb < 64:
            raise ValueError(f"memory_limit_mb={memory_limit_mb} is below 64 MiB")
        _check_fn(fn)
        self.fn = fn
        self.num_workers = num_workers
        self.deadline_s = float(deadline_s)
        self.start_method = start_method
        self.memory_limit_mb = memory_limit_mb
        self.startup_timeout_s = float(startup_timeout_s)
        if warmup is not None and not isinstance(warmup, tuple):
            raise TypeError(f"warmup={warmup!r} must be a tuple of arguments or None")
        self.warmup = warmup
        self.stats = PoolStats()
        self._ctx = multiprocessing.get_context(start_method)
        if start_method == "forkserver":
            # Takes effect only if this process's fork server is not running yet.
            self._ctx.set_forkserver_preload([fn.__module__])
        self._start_failures = 0
        self._workers: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _stop, self._workers)
        for _ in range(num_workers):
            self._workers.append(self._start())

    def _start(self) -> _Worker:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(
            target=_worker_main,
            args=(child_conn, self.fn, self.memory_limit_mb, self.warmup),
            name="verifier",
            daemon=True,
        )
        process.start()
        child_conn.close()
        return _Worker(process, parent_conn)

    def _replace(self, slot: int) -> None:
        old = self._workers[slot]
        if not old.ready:
            self._start_failures += 1
            if self._start_failures >= _MAX_START_FAILURES:
                code = old.process.exitcode
                raise RuntimeError(
                    f"verifier workers for {self.fn!r} died {self._start_failures} times before "
                    f"they were ready (last exit code {code}); check that its module imports"
                )
        if old.process.is_alive():
            old.process.kill()
        old.process.join(timeout=5.0)
        old.conn.close()
        self._workers[slot] = self._start()
        self.stats.restarts += 1

    @property
    def worker_pids(self) -> list[int | None]:
        """Process ids of the current workers."""
        return [w.process.pid for w in self._workers]

    def map(self, items: Iterable[tuple]) -> list[float]:
        """Rewards of `fn(*item)` for each item, in order; 0.0 for timeouts and crashes."""
        return self.map_with_status(items)[0]

    def map_with_status(self, items: Iterable[tuple]) -> tuple[list[float], list[str]]:
        """Rewards and statuses ("ok", "timeout", "crash") of `fn(*item)` for each item."""
        if not self._workers:
            raise RuntimeError("the pool is closed")
        todo = list(items)
        for i, item in enumerate(todo):
            if not isinstance(item, tuple):
                raise TypeError(f"items[{i}] is a {type(item).__name__}, not a tuple of arguments")
        rewards = [0.0] * len(todo)
        statuses = [""] * len(todo)
        queue = collections.deque(range(len(todo)))
        remaining = len(todo)
        start = time.monotonic()
        last_ready = start  # when a worker was last seen ready

        def finish(slot: int, value: float, status: str) -> None:
            nonlocal remaining
            w = self._workers[slot]
            rewards[w.index], statuses[w.index] = value, status
            w.index, w.deadline = None, math.inf
            remaining -= 1
            self.stats.checks += 1
            self.stats.timeouts += int(status == STATUS_TIMEOUT)
            self.stats.crashes += int(status == STATUS_CRASH)

        def handle(slot: int, message: tuple) -> None:
            w = self._workers[slot]
            if message[0] == "ready":
                w.ready = True
                self._start_failures = 0
            elif w.index is not None and message[0] == w.index:
                finish(slot, message[1], message[2])

        try:
            while remaining:
                self._dispatch(todo, queue)
                now = time.monotonic()
                if any(w.ready for w in self._workers):
                    last_ready = now
                elif now > last_ready + self.startup_timeout_s:
                    raise RuntimeError(
                        f"no verifier worker was ready for {self.startup_timeout_s} s"
                    )
                next_deadline = min(w.deadline for w in self._workers)
                stall_deadline = last_ready + self.startup_timeout_s if queue else math.inf
                wait_s = min(next_deadline, stall_deadline) - now
                owner = {}
                for slot, w in enumerate(self._workers):
                    owner[w.conn] = slot
                    owner[w.process.sentinel] = slot
                ready = connection.wait(list(owner), timeout=max(0.0, min(wait_s, 60.0)))
                dead = set()
                for obj in ready:
                    slot = owner[obj]
                    w = self._workers[slot]
                    if obj is not w.conn:
                        dead.add(slot)
                        continue
                    try:
                        handle(slot, w.conn.recv())
                    except (EOFError, OSError):
                        dead.add(slot)
                for slot in sorted(dead):
                    w = self._workers[slot]
                    try:  # results sent just before the process ended still count
                        while w.conn.poll():
                            handle(slot, w.conn.recv())
                    except (EOFError, OSError):
                        pass
                    if w.index is not None:
                        finish(slot, 0.0, STATUS_CRASH)
                    self._replace(slot)
                now = time.monotonic()
                for slot, w in enumerate(self._workers):
                    if w.index is not None and now >= w.deadline:
                        finish(slot, 0.0, STATUS_TIMEOUT)
                        self._replace(slot)
        finally:
            self.stats.seconds += time.monotonic() - start
        return rewards, statuses

    def _dispatch(self, todo: list[tuple], queue: collections.deque) -> None:
        for slot, w in enumerate(self._workers):
            if not queue:
                return
            if not w.ready or w.index is not None:
                continue
            index = queue.popleft()
            try:
                w.conn.send((index, todo[index]))
            except (OSError, ValueError):  # died while idle: the item was never run
                queue.appendleft(index)
                self._replace(slot)
                continue
            w.index, w.deadline = index, time.monotonic() + self.deadline_s

    def close(self) -> None:
        """Stops the workers; the pool cannot be used afterwards."""
        self._finalizer()

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
