"""No host file changes owner or content because of a sandbox run, whatever the code leaves in its
scratch directory or another sandbox does to it meanwhile; clean-up always completes."""

import os
import stat
import subprocess
import tempfile
import threading
import time
import uuid

import pytest

from rlvr_jax.rewards import sandbox, sandbox_fs, sandbox_limits
from rlvr_jax.rewards.sandbox import SandboxLimits


def _backend_param(name):
    reason = sandbox.bwrap_unavailable_reason() if name == "bwrap" else None
    return pytest.param(name, marks=pytest.mark.skipif(reason is not None, reason=str(reason)))


BACKENDS = [_backend_param("bwrap"), _backend_param("rlimits")]
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox runs as nobody only for root")


@pytest.fixture
def canary(tmp_path):
    """A root-only file (0600) in a root-only directory: (directory, file, content)."""
    secret_dir = tmp_path / "secret"
    secret_dir.mkdir(mode=0o700)
    path = secret_dir / "canary"
    content = b"canary " + uuid.uuid4().hex.encode()
    path.write_bytes(content)
    path.chmod(0o600)
    return str(secret_dir), str(path), content


def _assert_untouched(canary):
    secret_dir, path, content = canary
    info = os.stat(path, follow_symlinks=False)
    assert stat.S_ISREG(info.st_mode)
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (
        os.geteuid(),
        os.getegid(),
        0o600,
    )
    with open(path, "rb") as f:
        assert f.read() == content
    assert os.listdir(secret_dir) == ["canary"]
    assert os.stat(secret_dir).st_uid == os.geteuid()


def test_files_are_written_below_the_scratch_directory_and_owned_by_the_sandbox():
    files = {"a/b/c.txt": "1", "a/d.txt": b"2", "e.txt": "3", "a/b/f.txt": "4", "a-b/g": "5"}
    code = (
        "import os\n"
        "for name in sorted(os.listdir('.') + os.listdir('a') + os.listdir('a/b')):\n"
        "    print(name)\n"
        "uids = {os.stat(p).st_uid for p in ['.', 'a', 'a/b', 'a/b/c.txt', 'a/d.txt', 'a-b/g']}\n"
        "print(uids == {os.getuid()})\n"
        f"print(''.join(open(p).read() for p in sorted({sorted(files)!r})))\n"
    )
    result = sandbox.run(code, files=files, backend="rlimits")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode().split()
    assert lines[-2:] == ["True", "51423"]  # Sorted names: a-b/g, a/b/c, a/b/f, a/d, e.
    assert sorted(lines[:-2]) == sorted(["a", "a-b", "e.txt", "b", "d.txt", "c.txt", "f.txt"])


def test_a_name_that_is_both_a_file_and_a_directory_is_refused():
    with pytest.raises(ValueError, match="'a' is both a file and a directory"):
        sandbox.run("0", files={"a": "x", "a/b": "y"}, backend="rlimits")


@AS_ROOT
def test_the_scratch_parent_cannot_be_listed_by_the_sandbox_user():
    parent = sandbox_fs.scratch_parent()
    info = os.stat(parent)
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o711)
    probe = (
        "import os, sys\n"
        "try:\n"
        "    os.listdir(sys.argv[1])\n"
        "except OSError as e:\n"
        "    os._exit(e.errno)\n"
    )
    python = sandbox_fs.sandbox_python(sandbox.NOBODY)
    listed = subprocess.run(
        [python, "-I", "-S", "-c", probe, parent],
        user=sandbox.NOBODY,
        group=sandbox.NOBODY,
        extra_groups=[],
        capture_output=True,
    )
    assert listed.returncode == 13, listed.stderr  # EACCES


@pytest.mark.parametrize("backend", BACKENDS)
def test_links_and_locked_directories_left_by_the_code_are_not_followed(backend, canary):
    secret_dir, path, _ = canary
    code = (
        "import os, sys\n"
        "secret_dir, path = sys.argv[1:3]\n"
        "os.symlink(path, 'file_link')\n"
        "os.symlink(secret_dir, 'dir_link')\n"
        "os.makedirs('x/y')\n"
        "os.symlink(secret_dir, 'x/y/dir_link')\n"
        "os.symlink(path, 'x/y/file_link')\n"
        "os.rename('x/y', 'x/z')\n"
        "os.symlink(secret_dir, 'x/y')\n"
        "os.chmod('x/z', 0)\n"
        "os.chmod('x', 0o500)\n"
        "print('planted')\n"
    )
    result = sandbox.run(["python3", "-I", "-S", "-c", code, secret_dir, path], backend=backend)
    assert result.stdout == b"planted\n", result.stderr
    _assert_untouched(canary)
    assert os.listdir(sandbox_fs.scratch_parent()) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tree_thousands_of_levels_deep_is_removed(backend):
    code = (
        "import os\n"
        "for _ in range(3000):\n"
        "    os.mkdir('d')\n"
        "    os.chdir('d')\n"
        "open('bottom', 'w').write('x')\n"
        "os.chmod('.', 0)\n"
        "print('deep')\n"
    )
    limits = SandboxLimits(wall_seconds=25)
    result = sandbox.run(code, limits=limits, backend=backend)
    assert (result.returncode, result.stdout) == (0, b"deep\n"), result.stderr
    assert os.listdir(sandbox_fs.scratch_parent()) == []


def test_remove_tree_never_recurses_nor_follows_links(tmp_path, canary):
    secret_dir, path, _ = canary
    root = tmp_path / "tree"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(5000):  # Deeper than the recursion limit and than a path may be long.
        os.symlink(path, "link", dir_fd=fd)
        os.symlink(secret_dir, "dir_link", dir_fd=fd)
        os.mkdir("d", dir_fd=fd)
        below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = below
    os.close(fd)
    parent = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert sandbox_fs.remove_tree(parent, "tree")
    finally:
        os.close(parent)
    assert not root.exists()
    _assert_untouched(canary)


def test_wall_seconds_include_the_clean_up(monkeypatch):
    remove = sandbox_fs.remove

    def slow_remove(scratch):
        time.sleep(1.0)
        return remove(scratch)

    monkeypatch.setattr(sandbox_fs, "remove", slow_remove)
    result = sandbox.run("0", backend="rlimits")
    assert result.returncode == 0
    assert result.wall_seconds >= 1.0


SWAPPER = """
import os, sys, time
parent, secret_dir, path = sys.argv[1:4]
mine = os.path.basename(os.getcwd())
swaps = 0
def swap(full, is_dir):
    global swaps
    link = full + '.swap'
    try:
        if is_dir:
            os.rename(full, full + '.moved')
        os.symlink(secret_dir if is_dir else path, link)
        os.rename(link, full)
        swaps += 1
    except OSError:
        pass
while True:
    try:
        runs = [r for r in os.listdir(parent) if r != mine]
    except OSError:
        runs = []
    for run in runs:
        for root, dirs, names in os.walk(os.path.join(parent, run)):
            for name in names:
                swap(os.path.join(root, name), False)
            for name in dirs:
                swap(os.path.join(root, name), True)
    print(swaps, flush=True)
"""


@AS_ROOT
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_swapping_sandbox_never_gets_a_host_file_chowned_or_written(
    backend, canary, monkeypatch, request
):
    """Another sandbox of the same user replaces every entry it can reach in the other runs'
    scratch directories with a link to a root-only file (or its directory) while runs of a
    40-file workspace write, run and clean up. To give it every chance, the scratch parent is
    listable here and the fallback hides nothing: only the descriptor discipline protects."""
    secret_dir, path, _ = canary
    listable = tempfile.mkdtemp(prefix="sandbox_test_listable_")
    os.chmod(listable, 0o755)
    request.addfinalizer(lambda: os.rmdir(listable))
    parent_fd = os.open(listable, os.O_RDONLY | os.O_DIRECTORY)
    monkeypatch.setattr(sandbox_fs, "_private_parent", lambda: (listable, parent_fd))
    monkeypatch.setattr(sandbox_fs, "fallback_hidden", lambda always: [])
    stop = threading.Event()
    swapper = {}
    argv = ["python3", "-I", "-S", "-c", SWAPPER, listable, secret_dir, path]
    limits = SandboxLimits(cpu_seconds=100, wall_seconds=100)
    thread = threading.Thread(
        target=lambda: swapper.update(
            result=sandbox.run(argv, backend="rlimits", limits=limits, stop=stop)
        )
    )
    thread.start()
    files = {f"pkg{i % 4}/sub{i % 3}/mod{i}.py": f"VALUE = {i}\n" for i in range(40)}
    code = "import os\nprint(sum(len(fs) for _, _, fs in os.walk('.')))\nos.symlink('/', 'root')"
    try:
        for _ in range(40):
            sandbox.run(code, files=files, backend=backend)
    finally:
        stop.set()
        thread.join()
        os.close(parent_fd)
    counts = swapper["result"].stdout.split()
    assert counts and int(counts[-1]) > 0, swapper["result"]  # It did swap entries.
    _assert_untouched(canary)
    assert os.listdir(listable) == []


def test_directories_of_killed_trainer_processes_are_swept_an_hour_later(tmp_path):
    """Scratch parents and cgroups of a process that died without clean-up go; a live process's
    and a recent one's stay."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    hour_ago = time.time() - 2 * 3600
    names = {
        f"rlvr_sandbox_{dead.pid}_old": hour_ago,
        f"rlvr_sandbox_{dead.pid}_new": time.time(),
        f"rlvr_sandbox_{os.getpid()}_live": hour_ago,
        "unrelated": hour_ago,
    }
    for sweep in (sandbox_fs._sweep, sandbox_limits._sweep):
        for name, mtime in names.items():
            os.makedirs(tmp_path / name / "run_x")
            os.utime(tmp_path / name, (mtime, mtime))
        sweep(str(tmp_path))
        assert sorted(os.listdir(tmp_path)) == sorted(set(names) - {f"rlvr_sandbox_{dead.pid}_old"})
        for name in os.listdir(tmp_path):
            os.rmdir(tmp_path / name / "run_x")
            os.rmdir(tmp_path / name)
