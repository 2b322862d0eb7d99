"""Compile once: JAX's persistent compilation cache for every command, and a log of what compiled.

`enable_cache(directory)` points JAX's persistent cache at a directory (the commands' default is
`default_cache_dir()`, under the user's cache directory), so a second launch of an unchanged
config loads its big programs (the rollout, the update, the fused step, evaluation) instead of
compiling them again. Every program is stored, the small ones too (`MIN_COMPILE_SECONDS` is 0):
the random initialisation and the eager operations of a launch are dozens of programs of a tenth
of a second each, and reading them back is faster (benchmarks/README.md: a warm tiny launch).

`CompileLog` listens to JAX's monitoring events and keeps, per compiled program, its name, the
seconds spent and whether the persistent cache served it; the run skeleton writes its totals and
the time to the first step into the metrics ledger's "startup" record. With notices on (the
commands), a compilation still running after `NOTICE_AFTER_SECONDS` says so on stderr
("compiling jit(step) ..."), and how long it took once done, so a long compile does not look
like a hang.

`in_background(fn)` runs an ahead-of-time compilation (`jit(f).lower(...).compile()`) on a
thread: jax keeps the executable for the jitted function's next call with the same shapes and
shardings, so the run skeleton compiles the training step while the held-out evaluation before
training compiles and runs its own programs.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
from jax.experimental.compilation_cache import compilation_cache

from rlvr_jax.model import weight_cache

MIN_COMPILE_SECONDS = 0.0
CACHE_FLAG_HELP = (
    "Directory of JAX's persistent compilation cache (default: ~/.cache/rlvr_jax/jax, or under "
    "$XDG_CACHE_HOME); a second launch reads its programs back instead of compiling them. "
    "'none' turns it off."
)
NOTICE_AFTER_SECONDS = 5.0
_LOWERED = "/jax/core/compile/jaxpr_to_mlir_module_duration"  # reported as the compile starts
_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
_CACHE_HIT = "/jax/compilation_cache/cache_hits"


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/rlvr_jax/jax` (or `~/.cache/rlvr_jax/jax`), beside the weight cache."""
    return weight_cache.cache_root() / "jax"


def enable_cache(directory: str | os.PathLike | None) -> Path | None:
    """Turns JAX's persistent compilation cache on in `directory` (created if missing); None,
    "" or "none" leaves it off. Returns the directory in use."""
    if directory is None or str(directory) in ("", "none"):
        return None
    path = Path(directory).expanduser()
    if "://" not in str(directory):
        path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    # JAX opens its cache once, at the first compile: one that ran before this call (or a
    # JAX_COMPILATION_CACHE_DIR in the environment) would otherwise keep the old directory.
    compilation_cache.reset_cache()
    return path


@dataclasses.dataclass(frozen=True)
class Compiled:
    """One program that went through XLA: compiled, or read back from the persistent cache."""

    name: str
    seconds: float
    from_cache: bool


class CompileLog:
    """Every backend compilation of this process from `install()` on (see the module docstring).

    JAX reports a cache hit inside the compilation it serves, on the same thread, before that
    compilation's duration; so a hit marks the next duration reported on its thread.
    """

    def __init__(
        self,
        notice_after: float = NOTICE_AFTER_SECONDS,
        printer: Callable[[str], None] | None = None,
    ) -> None:
        self.started = time.time()
        self.programs: list[Compiled] = []
        self.notice_after = notice_after
        self.notices = False
        self._print = printer or (lambda line: print(line, file=sys.stderr, flush=True))
        self._hit = threading.local()
        self._timer = threading.local()
        self._installed = False
        self._lock = threading.Lock()

    def install(self, notices: bool = False) -> CompileLog:
        """Registers the listeners (once; later calls do nothing but turn notices on)."""
        with self._lock:
            self.notices = self.notices or notices
            if not self._installed:
                jax.monitoring.register_event_listener(self._event)
                jax.monitoring.register_event_duration_secs_listener(self._duration)
                self._installed = True
                self.started = time.time()
        return self

    def _event(self, event: str, **kwargs) -> None:
        if event == _CACHE_HIT:
            self._hit.value = True

    def _duration(self, event: str, seconds: float, **kwargs) -> None:
        name = str(kwargs.get("fun_name", "?"))
        if event == _LOWERED and self.notices:
            fired = threading.Event()

            def notice() -> None:
                fired.set()
                self._print(f"compiling {name} ...")

            timer = threading.Timer(self.notice_after, notice)
            timer.daemon = True
            timer.start()
            self._timer.value = (timer, fired)
        if event != _BACKEND_COMPILE:
            return
        hit = getattr(self._hit, "value", False)
        self._hit.value = False
        pending = getattr(self._timer, "value", None)
        self._timer.value = None
        if pending is not None:
            timer, fired = pending
            timer.cancel()
            timer.join()
            if fired.is_set():
                how = "read back from the compile cache" if hit else "compiled"
                self._print(f"{name} {how} in {seconds:.1f} s")
        with self._lock:
            self.programs.append(Compiled(name, seconds, hit))

    def metrics(self) -> dict[str, float]:
        """Seconds since `install()` ("startup/seconds") and, over the programs so far,
        "startup/compile_seconds" (compiled, not read back), "startup/programs_compiled",
        "startup/programs_from_cache", "startup/seconds_from_cache" (reading them back)."""
        with self._lock:
            programs = list(self.programs)
        compiled = [p for p in programs if not p.from_cache]
        cached = [p for p in programs if p.from_cache]
        return {
            "startup/seconds": time.time() - self.started,
            "startup/compile_seconds": sum(p.seconds for p in compiled),
            "startup/programs_compiled": len(compiled),
            "startup/programs_from_cache": len(cached),
            "startup/seconds_from_cache": sum(p.seconds for p in cached),
        }

    def slowest(self, n: int, from_cache: bool) -> list[Compiled]:
        """The n programs compiled (or read back from the cache) that took longest."""
        with self._lock:
            chosen = [p for p in self.programs if p.from_cache == from_cache]
        return sorted(chosen, key=lambda p: -p.seconds)[:n]

    def summary(self) -> str:
        """One line: the time so far, the programs compiled and those read back."""
        m = self.metrics()

        def names(from_cache: bool) -> str:
            slow = self.slowest(3, from_cache)
            return f" (slowest: {', '.join(f'{p.name} {p.seconds:.1f} s' for p in slow)})"

        line = (
            f"{m['startup/seconds']:.1f} s: {m['startup/programs_compiled']} programs compiled in "
            f"{m['startup/compile_seconds']:.1f} s"
        )
        if m["startup/programs_compiled"]:
            line += names(False)
        line += f", {m['startup/programs_from_cache']} read from the compile cache"
        if m["startup/programs_from_cache"]:
            line += f" in {m['startup/seconds_from_cache']:.1f} s" + names(True)
        return line


def in_background(
    fn: Callable[[], Any], what: str, log: Callable[[str], None] = print
) -> Callable[[], None]:
    """Starts `fn()` (ahead-of-time compilation) on a daemon thread; returns a function that
    waits for it. A failure is logged, not raised: the program then compiles at its first call,
    which raises the error where the run can report it."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - reported by wait(), raised again by the call
            errors.append(e)

    thread = threading.Thread(target=target, name=f"compile {what}", daemon=True)
    thread.start()

    def wait() -> None:
        thread.join()
        if errors:
            log(f"compiling {what} ahead of the loop failed ({errors[0]!r}); its call compiles it")

    return wait


# The process's log: entry scripts install it first thing, so that its clock starts with them.
COMPILES = CompileLog()
