"""A sandbox for model-written code: no network, one scratch directory, kernel resource limits.

Host code, standard library only. `run` executes a command (an argv list) or a Python program (a
string, run by a bare interpreter: `python -I -S`, no site-packages) in a fresh scratch directory
that is deleted after the run, so nothing the code writes survives the episode. A run never raises
for what the code does (a crash, a timeout, a flood of output, a tree it cannot delete): that is a
`SandboxResult`; bad arguments from the framework raise `ValueError`.

Backends: "bwrap" (bubblewrap, the default; `SandboxUnavailableError` names the reason and the fix
where it cannot start): its own user, pid, network, ipc, uts and cgroup namespaces and an empty
read-only root with read-only binds of the system and the Python install (packages hidden), the
scratch directory at /scratch the only writable place. "rlimits", the weak fallback for trusted
code and tests, chosen explicitly: its own user, network, pid, ipc and mount namespaces
(`unshare`), a private /proc and private tmpfs over /tmp, /var/tmp, /dev/shm, /run and the
temporary directory, where the host allows them; it still reads the host's other files.
`protections(backend)` reports what a probe run verified here; docs/sandbox.md has the table.

Limits (`SandboxLimits`, `sandbox_limits`): rlimits per process and, where the host allows it, a
cgroup per run bounding the memory and tasks of all its processes together; the parent kills the
whole sandbox at the wall-time deadline or past the output cap. Run by a root trainer, the sandbox
runs as `nobody` (uid 65534). The scratch directory is written and removed through descriptors
(`sandbox_fs`), so nothing the code leaves there leads the host to another file.

`killed_reason`: "wall_time", "output", "stopped" (the caller's stop event), "cpu_time" (RLIMIT_CPU:
SIGXCPU, or the SIGKILL at the hard limit once the CPU time is spent), "memory" (the kernel killed
a process for the run's cgroup limit, or an allocation failed), "processes", or None. Read from
stderr (MemoryError, a failed fork), "memory" and "processes" are labels for counting, which the
code could forge, never a security property.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import secrets
import selectors
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence

from rlvr_jax.config_types import UserError
from rlvr_jax.rewards import sandbox_fs, sandbox_limits
from rlvr_jax.rewards.sandbox_limits import SandboxLimits

BACKENDS = ("bwrap", "rlimits")
# What `protections` may report, in the order `describe` lists them.
PROTECTIONS = (
    *("network", "filesystem", "process_limit", "pid_namespace", "ipc_namespace"),
    *("mount_namespace", "private_proc", "memory_total", "pids_total"),
)
NOBODY = 65534
SCRATCH = "/scratch"  # Where the scratch directory appears inside the bwrap sandbox.
_READ_CHUNK = 65536
# The fallback's namespaces; "private" adds a mount namespace with a private /proc and tmpfs.
_UNSHARE = ("--user", "--map-root-user", "--net", "--pid", "--ipc", "--fork", "--kill-child")
_UNSHARE_PRIVATE = ("--mount", "--mount-proc")
_FALLBACK_LEVELS = ("private", "namespaces")
# Hidden from the fallback under a private tmpfs: where other processes leave sockets and files.
_HIDDEN = ("/tmp", "/var/tmp", "/dev/shm", "/run")
_STDERR_TAIL = 4096
# How long a run waits, after killing the sandbox, for its processes to be gone.
_REAP_SECONDS = 2.0
_INSTALL_HINT = (
    "install bubblewrap (apt-get install bubblewrap; the Debian and Ubuntu package `bubblewrap`), "
    "or, for trusted code and tests only, opt into the weak fallback with the setting "
    'reward.sandbox_backend="rlimits" (docs/sandbox.md)'
)

# Run by the sandboxed interpreter as the command: what the sandbox isolates, as seen inside.
_PROBE = r"""
import json, os, resource, sys
host = json.loads(sys.argv[1])
def ns(name):
    try:
        return os.readlink("/proc/self/ns/" + name)
    except OSError:
        return None
found = {name: ns(name) not in (None, value) for name, value in host["ns"].items()}
try:
    found["proc"] = found["pid"] and os.readlink("/proc/self") == str(os.getpid())
except OSError:
    found["proc"] = False
found["hidden"] = bool(host["visible"]) and not any(map(os.path.exists, host["visible"]))
found["writes"] = False
for d in host["writable"]:
    try:
        os.close(os.open(os.path.join(d, host["name"]), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        os.unlink(os.path.join(d, host["name"]))
        found["writes"] = True
    except OSError:
        pass
found["nproc"] = resource.getrlimit(resource.RLIMIT_NPROC)[0] != resource.RLIM_INFINITY
print(json.dumps(found))
"""


class SandboxUnavailableError(UserError, ValueError):
    """The chosen backend cannot start on this host; the message names the reason and the fix."""


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """What one run did.

    Attributes:
      returncode: the command's exit status; minus the signal number when a signal ended it (the
        sandbox reports a signal as 128 + its number, so a status of 129..192 reads as a signal).
      stdout: the first bytes of stdout (with stderr, at most `max_output_bytes`).
      stderr: the first bytes of stderr.
      timed_out: the wall-time limit ended the run.
      killed_reason: why the run ended early, or None (see the module docstring).
      output_truncated: the output passed `max_output_bytes` and the run was killed.
      wall_seconds: wall time of the whole run, from writing its files to the end of clean-up.
      backend: "bwrap" or "rlimits".
    """

    returncode: int
    stdout: bytes
    stderr: bytes
    timed_out: bool
    killed_reason: str | None
    output_truncated: bool
    wall_seconds: float
    backend: str


@dataclasses.dataclass(frozen=True)
class _Job:
    argv: list  # [None, source] for Python source
    files: dict[str, bytes]
    stdin: bytes
    limits: SandboxLimits
    backend: str
    pass_fds: tuple[int, ...] = ()


def run(
    command: str | Sequence[str],
    *,
    files: Mapping[str, str | bytes] | None = None,
    stdin: bytes = b"",
    limits: SandboxLimits | None = None,
    backend: str = "bwrap",
    pass_fds: Sequence[int] = (),
    stop: threading.Event | None = None,
    started: threading.Event | None = None,
) -> SandboxResult:
    """Runs `command` in a fresh sandbox and returns what happened; never raises for the code.

    Args:
      command: Python source (a string, run with `python -I -S -c`) or an argv list (looked up
        on PATH=/usr/bin:/bin inside the sandbox).
      files: relative path -> content, written into the scratch directory (the working
        directory) before the run; the whole directory is deleted after it.
      stdin: bytes fed to the command's stdin, then closed.
      limits: the limits; `SandboxLimits()` when None.
      backend: "bwrap" or "rlimits" (see the module docstring).
      pass_fds: host file descriptors the command inherits under the same numbers (pipes to
        another sandbox); the caller keeps and closes its own copies.
      stop: when set by another thread, the run is killed (killed_reason "stopped").
      started: set once the sandbox's process exists (or failed to start), so the caller may
        close its copies of `pass_fds`.

    Returns:
      A SandboxResult.

    Raises:
      SandboxUnavailableError: backend "bwrap" where bubblewrap cannot start.
      ValueError: a bad argument, named.
    """
    limits = SandboxLimits() if limits is None else limits
    if not isinstance(limits, SandboxLimits):
        raise ValueError(f"limits={limits!r} is not a SandboxLimits")
    if not isinstance(stdin, bytes):
        raise ValueError(f"stdin={stdin!r:.80} is not bytes")
    argv = _command_argv(command)
    files = _checked_files(files or {})
    check_backend(backend)
    job = _Job(argv, files, stdin, limits, backend, tuple(pass_fds))
    level = _fallback_level() if backend == "rlimits" else None
    return _run(job, level, stop, started)


def check_backend(backend: str) -> None:
    """Raises unless `backend` can run here.

    Raises:
      ValueError: `backend` is not one of `BACKENDS`.
      SandboxUnavailableError: "bwrap" where bubblewrap cannot start (the reason and the fix).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
    if backend == "bwrap" and (reason := bwrap_unavailable_reason()) is not None:
        raise SandboxUnavailableError(
            f"the sandbox backend 'bwrap' cannot start here: {reason}. To run model-written "
            f"code, {_INSTALL_HINT}."
        )


def available_backends() -> list[str]:
    """The backends that can start on this host, best first ("rlimits" always can)."""
    return (["bwrap"] if bwrap_available() else []) + ["rlimits"]


def protections(backend: str) -> frozenset[str]:
    """What a probe run of `backend` verified on this host (once per process), from `PROTECTIONS`.

    "network": no network (its own network namespace); "filesystem": only the scratch directory
    is visible and writable on disk; "process_limit": RLIMIT_NPROC; "pid_namespace",
    "ipc_namespace", "mount_namespace": its own namespaces; "private_proc": /proc shows only its
    own processes; "memory_total", "pids_total": a cgroup per run bounds the memory and the tasks
    of all its processes together. The per-process CPU, address-space, file-size and open-file
    rlimits, the wall time and the output cap hold for every backend. Empty for a backend that
    cannot start.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
    if backend == "bwrap":
        return frozenset() if bwrap_unavailable_reason() is not None else _probe("bwrap", None)[1]
    return _probe("rlimits", _fallback_level())[1]


def describe(backend: str) -> str:
    """One line for a run's log: the backend, what it protects here and what it lacks."""
    has = protections(backend)
    if backend == "bwrap" and (reason := bwrap_unavailable_reason()) is not None:
        return f"backend 'bwrap' (bubblewrap) cannot start here: {reason}"
    label = "bubblewrap" if backend == "bwrap" else "the weak fallback, for trusted code only"
    protects = ", ".join(p for p in PROTECTIONS if p in has) or "nothing beyond the rlimits"
    lacks = ", ".join(p for p in PROTECTIONS if p not in has) or "none of those listed"
    return f"backend {backend!r} ({label}): protects {protects}; lacks {lacks}"


def bwrap_available() -> bool:
    """Whether bubblewrap is installed and starts a sandbox here (probed once per process)."""
    return _bwrap_probe() is None


def bwrap_unavailable_reason() -> str | None:
    """Why bubblewrap cannot be used here, or None when it can."""
    return _bwrap_probe()


def _command_argv(command: str | Sequence[str]) -> list:
    if isinstance(command, str):
        return [None, command]
    if isinstance(command, bytes) or not isinstance(command, Sequence) or not command:
        raise ValueError(f"command={command!r:.80} is neither Python source nor a non-empty argv")
    if not all(isinstance(a, str) and "\0" not in a for a in command):
        raise ValueError(f"command={command!r:.80} must be a list of strings without NUL")
    return list(command)


def _checked_files(files: Mapping[str, str | bytes]) -> dict[str, bytes]:
    checked = {}
    for name, content in files.items():
        parts = name.split("/") if isinstance(name, str) else []
        if not parts or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"files key {name!r} is not a plain relative path")
        if "\0" in name:
            raise ValueError(f"files key {name!r} contains NUL")
        if not isinstance(content, (str, bytes)):
            raise ValueError(f"files[{name!r}] is {type(content).__name__}, not str or bytes")
        checked[name] = content.encode() if isinstance(content, str) else content
    dirs = {name.rsplit("/", i)[0] for name in checked for i in range(1, name.count("/") + 1)}
    if both := sorted(dirs & checked.keys()):
        raise ValueError(f"files key {both[0]!r} is both a file and a directory")
    return checked


def _sandbox_uid() -> int | None:
    return NOBODY if os.geteuid() == 0 else None


def _run(job: _Job, level: str | None, stop=None, started=None) -> SandboxResult:
    """One run: scratch directory, cgroup, processes, clean-up; wall_seconds covers it all."""
    start = time.monotonic()
    uid = _sandbox_uid()
    try:
        python = sandbox_fs.sandbox_python(uid)
        argv = job.argv if job.argv[0] is not None else [python, "-I", "-S", "-c", job.argv[1]]
        scratch = sandbox_fs.create(job.files, uid)
        try:
            result = _run_in(scratch.path, argv, python, uid, level, job, stop, started)
        finally:
            sandbox_fs.remove(scratch)
    finally:
        if started is not None:
            started.set()
    return dataclasses.replace(result, wall_seconds=time.monotonic() - start)


def _run_in(scratch, argv, python, uid, level, job, stop, started) -> SandboxResult:
    try:
        cgroup = sandbox_limits.create_run_cgroup(job.limits)
    except OSError as e:
        return _failed(f"sandbox: cannot make the run's cgroup: {e}", job.backend)
    try:
        cmd, cwd = _backend_argv(job.backend, level, scratch, python, job.limits, uid)
        cmd = sandbox_limits.join_prefix(cgroup, uid) + cmd + argv
        spawn = {} if cgroup is not None else _spawn_kwargs(uid)
        return _execute((cmd, cwd, scratch, spawn, cgroup), job, stop, started)
    finally:
        if cgroup is not None:
            cgroup.kill()
            cgroup.remove()


def _failed(message: str, backend: str) -> SandboxResult:
    return SandboxResult(127, b"", message.encode() + b"\n", False, None, False, 0.0, backend)


def _backend_argv(backend, level, scratch, python, limits, uid) -> tuple[list[str], str | None]:
    """The backend's argv up to the command, and the working directory to start it in."""
    launch = [python, "-I", "-S", "-c", sandbox_limits.LAUNCHER]
    if backend == "bwrap":
        bwrap = _bwrap_prefix(scratch, python, limits)
        return bwrap + launch + sandbox_limits.launcher_args(limits, True, []), None
    setup, prefix = [], []
    if level in _FALLBACK_LEVELS:
        prefix = [_tool("unshare", uid), *_UNSHARE]
    if level == "private":
        prefix += _UNSHARE_PRIVATE
        user = uid if uid is not None else os.geteuid()
        setup = [str(user), str(limits.max_file_bytes), *sandbox_fs.fallback_hidden(_HIDDEN)]
    # Without a user namespace, RLIMIT_NPROC would count every process of the trainer's user.
    nproc = level in _FALLBACK_LEVELS or uid is not None
    return prefix + launch + sandbox_limits.launcher_args(limits, nproc, setup), scratch


def _minimal_env(home: str) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def _bwrap_prefix(scratch: str, python: str, limits: SandboxLimits) -> list[str]:
    cmd = [_tool("bwrap", _sandbox_uid()), "--unshare-all", "--unshare-user", "--die-with-parent"]
    cmd.append("--new-session")
    # As pid 1 the launcher reaps the command, so the CPU time of both reaches the parent.
    cmd += [flag for flag in ("--disable-userns", "--as-pid-1") if flag in _bwrap_flags()]
    cmd += ["--hostname", "sandbox", "--clearenv"]
    for key, value in _minimal_env(SCRATCH).items():
        cmd += ["--setenv", key, value]
    return cmd + sandbox_fs.bwrap_view(scratch, SCRATCH, python, limits.max_file_bytes)


def _spawn_kwargs(uid: int | None) -> dict:
    if uid is None:
        return {}
    return {"user": uid, "group": uid, "extra_groups": []}


def _tool(name: str, uid: int | None) -> str | None:
    """A host program by absolute path, where the sandbox's user may execute it."""
    path = sandbox_limits.binary(name)
    return path if path is not None and sandbox_fs.executable_by(path, uid) else None


@functools.cache
def _bwrap_flags() -> frozenset[str]:
    """The optional flags this bwrap knows, of those the sandbox uses."""
    try:
        cmd = [_tool("bwrap", _sandbox_uid()), "--help"]
        out = subprocess.run(cmd, capture_output=True, timeout=10).stdout.decode(errors="replace")
    except (OSError, TypeError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(f for f in ("--disable-userns", "--as-pid-1") if f in out.split())


@functools.cache
def _bwrap_probe() -> str | None:
    if _tool("bwrap", _sandbox_uid()) is None:
        return "the bwrap binary is not installed (apt-get install bubblewrap)"
    return _probe("bwrap", None)[0]


@functools.cache
def _fallback_level() -> str:
    """The fallback's isolation here: "private", "namespaces" or "none" (probed once)."""
    if _tool("unshare", _sandbox_uid()) is not None:
        for level in _FALLBACK_LEVELS:
            if _probe("rlimits", level)[0] is None:
                return level
    return "none"


@functools.cache
def _probe(backend: str, level: str | None) -> tuple[str | None, frozenset[str]]:
    """Runs `_PROBE` in the sandbox: (why it failed or None, the protections it verified)."""
    host = {
        "ns": {n: os.readlink(f"/proc/self/ns/{n}") for n in ("net", "pid", "ipc", "mnt", "user")},
        "visible": [p for p in ("/etc/passwd", "/etc/hostname", "/etc/hosts") if _readable(p)],
        "writable": ["/tmp", "/var/tmp", tempfile.gettempdir()],
        "name": ".rlvr_sandbox_probe_" + secrets.token_hex(8),
    }
    python = sandbox_fs.sandbox_python(_sandbox_uid())
    argv = [python, "-I", "-S", "-c", _PROBE, json.dumps(host)]
    limits = SandboxLimits(wall_seconds=20.0)
    try:
        done = _run(_Job(argv, {}, b"", limits, backend), level)
        found = json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, ValueError) as e:
        return f"the probe failed: {e}", frozenset()
    if not isinstance(found, dict):
        name = "bwrap" if backend == "bwrap" else "the fallback"
        message = done.stderr.decode(errors="replace").strip()[:300]
        return f"{name} failed (exit {done.returncode}): {message}", frozenset()
    verified = {
        "network": found["net"],
        "filesystem": found["hidden"] and not found["writes"],
        "process_limit": found["nproc"],
        "pid_namespace": found["pid"],
        "ipc_namespace": found["ipc"],
        "mount_namespace": found["mnt"],
        "private_proc": found["proc"],
        # The run joined its cgroup before anything ran (the join fails closed).
        "memory_total": sandbox_limits.has_memory_total(),
        "pids_total": sandbox_limits.has_pids_total(),
    }
    return None, frozenset(name for name, ok in verified.items() if ok)


def _readable(path: str) -> bool:
    try:
        return bool(os.stat(path).st_mode & stat.S_IROTH)
    except OSError:
        return False


def _execute(spawn_args, job: _Job, stop, started) -> SandboxResult:
    cmd, cwd, home, spawn, cgroup = spawn_args
    try:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=_minimal_env(home),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            pass_fds=job.pass_fds,
            **spawn,
        )
    except (OSError, TypeError) as e:
        return _failed(f"sandbox: cannot start {cmd[0]}: {e}", job.backend)
    finally:
        if started is not None:
            started.set()
    deadline = time.monotonic() + job.limits.wall_seconds
    reason, out, err = _pump(proc, job.stdin, deadline, job.limits, stop)
    tree = sandbox_limits.process_tree(proc.pid)
    sandbox_limits.kill_group(proc)
    if cgroup is not None:
        cgroup.kill()
    returncode, cpu_seconds = sandbox_limits.reap(proc)
    # The kernel empties a killed pid namespace after its first process is gone, asynchronously:
    # return only once the processes seen before the kill are gone, so none outlives the run.
    sandbox_limits.wait_gone(tree, _REAP_SECONDS)
    if 128 < returncode <= 128 + 64:
        returncode = 128 - returncode
    reason = reason or _inferred_reason(returncode, err, cpu_seconds, job.limits, cgroup)
    return SandboxResult(
        returncode=returncode,
        stdout=out,
        stderr=err,
        timed_out=reason == "wall_time",
        killed_reason=reason,
        output_truncated=reason == "output",
        wall_seconds=0.0,
        backend=job.backend,
    )


def _pump(proc, stdin, deadline, limits, stop) -> tuple[str | None, bytes, bytes]:
    """Feeds stdin and reads stdout/stderr until both close, the deadline, the cap or `stop`."""
    chunks = {proc.stdout.fileno(): [], proc.stderr.fileno(): []}
    total = 0
    reason = None
    stdin_fd = proc.stdin.fileno()
    with selectors.DefaultSelector() as sel:
        for stream in (proc.stdout, proc.stderr):
            os.set_blocking(stream.fileno(), False)
            sel.register(stream.fileno(), selectors.EVENT_READ)
        pending = memoryview(stdin)
        if pending:
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        open_fds = set(chunks)
        while open_fds and reason is None:
            left = deadline - time.monotonic()
            if left <= 0:
                reason = "wall_time"
                break
            if stop is not None and stop.is_set():
                reason = "stopped"
                break
            for key, _ in sel.select(min(left, 0.05 if stop is not None else left)):
                if key.fd == stdin_fd:
                    pending = _write_some(proc, sel, pending)
                    continue
                data = _read_some(key.fd)
                if data is None:
                    continue
                if not data:
                    sel.unregister(key.fd)
                    open_fds.discard(key.fd)
                    continue
                keep = max(0, limits.max_output_bytes - total)
                chunks[key.fd].append(data[:keep])
                total += len(data)
                if total > limits.max_output_bytes:
                    reason = "output"
        if not proc.stdin.closed:
            proc.stdin.close()
    return reason, b"".join(chunks[proc.stdout.fileno()]), b"".join(chunks[proc.stderr.fileno()])


def _write_some(proc, sel, pending: memoryview) -> memoryview:
    try:
        written = os.write(proc.stdin.fileno(), pending[:_READ_CHUNK])
    except (BrokenPipeError, BlockingIOError, OSError) as e:
        written = 0 if isinstance(e, BlockingIOError) else len(pending)
    pending = pending[written:]
    if not pending:
        sel.unregister(proc.stdin.fileno())
        proc.stdin.close()
    return pending


def _read_some(fd: int) -> bytes | None:
    """Up to one chunk; b"" at end of file, None when there is nothing to read after all."""
    try:
        return os.read(fd, _READ_CHUNK)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def _inferred_reason(returncode, stderr, cpu_seconds, limits, cgroup) -> str | None:
    if returncode == 0:
        return None
    if cgroup is not None and cgroup.oom_kills() > 0:
        return "memory"
    # A program that handles SIGXCPU runs on to the hard limit, where the kernel sends SIGKILL.
    if returncode == -signal.SIGXCPU or (
        returncode == -signal.SIGKILL and cpu_seconds >= limits.cpu_seconds
    ):
        return "cpu_time"
    tail = stderr[-_STDERR_TAIL:]
    if b"MemoryError" in tail or b"Cannot allocate memory" in tail or b"bad_alloc" in tail:
        return "memory"
    if cgroup is not None and cgroup.pids_refusals() > 0:
        return "processes"
    if b"BlockingIOError" in tail or b"Resource temporarily unavailable" in tail:
        return "processes"
    return None
