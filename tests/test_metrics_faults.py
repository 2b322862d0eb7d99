"""The metrics ledger on a full disk or a read-only directory: one clear error, promptly, never a
hang; the ledger keeps no torn line; a run stopped that way resumes from its last checkpoint."""

import errno
import json
import logging
import os
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest
from tensorboardX.proto import event_pb2

from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.runtime import checkpoint as ckpt_lib
from rlvr_jax.program.runtime import event_files
from rlvr_jax.program.runtime import metrics as metrics_lib
from rlvr_jax.program.stages import rl_stage

# Every fault below must surface well within this; it only keeps a regression (a write that
# blocks forever) from hanging the suite.
HANG_GUARD_S = 30
ENOSPC = "[Errno 28] No space left on device"
EROFS = "[Errno 30] Read-only file system"


def _within(fn, timeout=HANG_GUARD_S):
    """Runs `fn` in a thread and returns the exception it raised (None if it returned); fails
    the test if it is still running after `timeout` seconds."""
    out = {}

    def target():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"still blocked after {timeout} s"
    return out.get("error")


class _Faulty:
    """A file whose writes fail with `code` while `armed()` is true; the first failing write
    gets half its bytes onto the disk first, as a disk that fills up mid-write does."""

    def __init__(self, f, armed, code=errno.ENOSPC, close_code=None):
        self._f, self._armed, self._code, self._close_code = f, armed, code, close_code
        self._partial_done = False

    def write(self, data):
        if self._armed(bytes(data)):
            if not self._partial_done and len(data) > 1:
                self._partial_done = True
                return self._f.write(data[: len(data) // 2])
            raise OSError(self._code, os.strerror(self._code))
        return self._f.write(data)

    def close(self):
        self._f.close()
        if self._close_code is not None:
            raise OSError(self._close_code, os.strerror(self._close_code))

    def __getattr__(self, name):
        return getattr(self._f, name)


def _inject(monkeypatch, which, armed, **kwargs):
    """Files opened for appending whose path satisfies `which` become `_Faulty`."""
    real = event_files.open_append

    def opener(path):
        f = real(path)
        return _Faulty(f, armed, **kwargs) if which(Path(path)) else f

    monkeypatch.setattr(event_files, "open_append", opener)


def _is_ledger(path):
    return path.name == metrics_lib.METRICS_FILE


def _is_events(path):
    return ".tfevents." in path.name


def _lines(path):
    """Every line of the ledger as strict JSON: a torn line is an error here."""
    text = Path(path).read_text()
    assert text == "" or text.endswith("\n"), f"torn last line: {text[-80:]!r}"
    return [json.loads(line) for line in text.splitlines()]


def _events(path) -> list[event_pb2.Event]:
    """The events of a TFRecord file (8-byte length, its crc, data, its crc); a partial record
    at the end is an error."""
    data, pos, events = path.read_bytes(), 0, []
    while pos < len(data):
        (n,) = struct.unpack("<Q", data[pos : pos + 8])
        assert pos + 12 + n + 4 <= len(data), f"partial record at byte {pos}"
        event = event_pb2.Event()
        event.ParseFromString(data[pos + 12 : pos + 12 + n])
        events.append(event)
        pos += 12 + n + 4
    return events


def _writer(workdir, **kwargs):
    return metrics_lib.MetricsWriter(workdir, stream=_Null(), **kwargs)


class _Null:
    def write(self, text):
        return len(text)

    def flush(self):
        pass


# ---------------------------------------------------------------------------------------------
# Injected faults: run everywhere


def test_a_full_disk_on_the_ledger_is_one_clear_error(tmp_path, monkeypatch):
    armed = threading.Event()
    _inject(monkeypatch, _is_ledger, lambda data: armed.is_set())
    w = _writer(tmp_path, use_tensorboard=False)
    w.write(1, {"x": 1.0})
    armed.set()
    err = _within(lambda: w.write(2, {"x": 2.0}))
    assert isinstance(err, metrics_lib.MetricsWriteError) and isinstance(err, OSError)
    path = tmp_path / "metrics.jsonl"
    assert str(err) == f"metrics: cannot write {path}: {ENOSPC}"
    assert err.errno == errno.ENOSPC and err.filename == str(path)
    # Half the line reached the disk before the failure; it was cut off again.
    assert [r["step"] for r in _lines(path)] == [1]
    # The writer is stopped: a later write says so instead of writing after a gap.
    again = _within(lambda: w.write(3, {"x": 3.0}))
    assert isinstance(again, metrics_lib.MetricsWriteError)
    assert str(again).startswith(str(err)) and "earlier write failed" in str(again)
    assert _within(w.close) is None  # the failure was raised once; closing adds nothing
    assert _within(w.close) is None


def test_a_dead_tensorboard_file_raises_at_the_next_write_instead_of_hanging(tmp_path, monkeypatch):
    armed = threading.Event()
    _inject(monkeypatch, _is_events, lambda data: armed.is_set())
    threads = threading.active_count()
    w = _writer(tmp_path, use_tensorboard=True)
    # Events are written in the caller's thread: no background writer to die silently.
    assert threading.active_count() == threads
    for step in (1, 2):
        w.write(step, {"x": float(step), "groups/success_hist": [1, 2, 0], "per_item": [1.0, 3.0]})
    armed.set()
    err = _within(lambda: w.write(3, {"x": 3.0}))
    assert isinstance(err, metrics_lib.MetricsWriteError)
    (events,) = (tmp_path / "tensorboard").glob("*.tfevents.*")
    assert str(err) == f"metrics: cannot write {events}: {ENOSPC}"
    assert isinstance(_within(lambda: w.write(4, {"x": 4.0})), metrics_lib.MetricsWriteError)
    assert _within(w.close) is None
    # The events of steps 1 and 2 are whole records; the failed step's partial record is gone.
    steps = {e.step for e in _events(events) if e.HasField("summary")}
    assert steps == {1, 2}


def test_a_read_only_workdir_fails_at_open_naming_the_file(tmp_path, monkeypatch):
    def opener(path):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr(event_files, "open_append", opener)
    err = _within(lambda: _writer(tmp_path, use_tensorboard=False))
    path = tmp_path / "metrics.jsonl"
    assert str(err) == f"metrics: cannot open {path} for appending: {EROFS}"
    assert err.errno == errno.EROFS


def test_close_reports_its_failure_but_never_hides_the_first_error(tmp_path, monkeypatch, caplog):
    _inject(monkeypatch, _is_ledger, lambda data: False, close_code=errno.EIO)
    w = _writer(tmp_path, use_tensorboard=True)
    w.write(1, {"x": 1.0})
    err = _within(w.close)
    path = tmp_path / "metrics.jsonl"
    assert str(err) == f"metrics: cannot close {path}: [Errno 5] Input/output error"
    assert _within(w.close) is None  # idempotent
    # The run skeleton's pattern: an error in flight, then close in the handler or `with` exit.
    for how in ("except", "with"):
        w = _writer(tmp_path / how, use_tensorboard=True)
        with caplog.at_level(logging.ERROR), pytest.raises(RuntimeError, match="the step broke"):
            if how == "with":
                with w:
                    raise RuntimeError("the step broke")
            else:
                try:
                    raise RuntimeError("the step broke")
                except RuntimeError:
                    w.close()
                    raise
        assert f"cannot close {tmp_path / how / 'metrics.jsonl'}" in caplog.text
        caplog.clear()


# ---------------------------------------------------------------------------------------------
# Real file systems: a tmpfs that is tiny, or read-only


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size) -> a fresh tmpfs directory; unmounted after the test."""
    mounted = []

    def mount(size="256k"):
        d = tmp_path / f"mnt{len(mounted)}"
        d.mkdir()
        cmd = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD_S)
        except FileNotFoundError:
            pytest.skip("no `mount` command: a real tmpfs needs root with CAP_SYS_ADMIN")
        if done.returncode:
            pytest.skip(
                "cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN): "
                f"{done.stderr.strip() or done.returncode}"
            )
        mounted.append(d)
        return d

    yield mount
    for d in mounted:
        subprocess.run(["umount", "-l", str(d)], capture_output=True, timeout=HANG_GUARD_S)


def _remount_read_only(d):
    cmd = ["mount", "-o", "remount,ro", str(d)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=HANG_GUARD_S)


def _fill(d):
    """Writes a file in `d` until the file system is full."""
    with open(d / "filler", "wb", buffering=0) as f:
        chunk = b"\0" * 4096
        try:
            while True:
                f.write(chunk)
        except OSError as e:
            assert e.errno == errno.ENOSPC, e


def test_a_full_tmpfs_stops_the_writer_with_the_path_and_enospc(tmpfs):
    d = tmpfs("256k")
    w = _writer(d, use_tensorboard=True)
    w.write(1, {"x": 1.0})
    _fill(d)
    # Larger than the slack left in the ledger's last page, so it cannot fit.
    big = {"x": 2.0, "per_item": [float(i) for i in range(2000)]}
    err = _within(lambda: w.write(2, big))
    assert isinstance(err, metrics_lib.MetricsWriteError)
    assert str(err) == f"metrics: cannot write {d / 'metrics.jsonl'}: {ENOSPC}"
    assert _within(w.close) is None
    assert [r["step"] for r in _lines(d / "metrics.jsonl")] == [1]
    # Resuming needs the step-1 history rewritten without later records: also refused, cleanly.
    with open(d / "metrics.jsonl", "a") as f:  # a record after the resume point (fits the page)
        f.write(json.dumps({"step": 2, "record": "step", "time": 0.0}) + "\n")
    err = _within(lambda: _writer(d, use_tensorboard=False, resume_step=1))
    why = "(dropping the records after step 1 on resume)"
    assert str(err) == f"metrics: cannot rewrite {d / 'metrics.jsonl'} {why}: {ENOSPC}"
    assert not (d / "metrics.jsonl.tmp").exists()
    assert [r["step"] for r in _lines(d / "metrics.jsonl")] == [1, 2]
    # Space freed: the same directory resumes and carries on.
    (d / "filler").unlink()
    with _writer(d, use_tensorboard=True, resume_step=1) as w:
        w.write(2, big)
    assert [r["step"] for r in _lines(d / "metrics.jsonl")] == [1, 2]


def test_a_read_only_mount_is_refused_at_open_naming_the_path(tmpfs):
    d = tmpfs("256k")
    with _writer(d, use_tensorboard=True) as w:
        for step in (1, 2, 3):
            w.write(step, {"x": float(step)})
    before = (d / "metrics.jsonl").read_text()
    _remount_read_only(d)
    ledger = d / "metrics.jsonl"
    cases = [
        # Resuming from step 2 must drop step 3: the rewrite is refused.
        (
            {"resume_step": 2},
            f"metrics: cannot rewrite {ledger} (dropping the records after step 2 on resume): "
            f"{EROFS}",
        ),
        # Nothing to drop: opening the ledger for appending is refused.
        ({"resume_step": 3}, f"metrics: cannot open {ledger} for appending: {EROFS}"),
    ]
    for kwargs, message in cases:
        err = _within(lambda kwargs=kwargs: _writer(d, use_tensorboard=True, **kwargs))
        assert isinstance(err, metrics_lib.MetricsWriteError), err
        assert str(err) == message
        assert err.errno == errno.EROFS
    err = _within(lambda: _writer(d / "new", use_tensorboard=False))
    assert str(err) == f"metrics: cannot create {d / 'new'}: {EROFS}"
    assert ledger.read_text() == before


# ---------------------------------------------------------------------------------------------
# A whole run


@pytest.mark.slow
def test_a_run_that_hits_a_full_disk_stops_at_once_and_resumes(tmp_path, monkeypatch):
    from configs import tiny

    config = tiny.get_config()
    config.train.steps = 4
    config.train.checkpoint_every = 2
    config.train.log_every = 1
    settings = settings_lib.settings_from_config(config)
    failed_at = []

    def armed(data):
        # The ledger's row for step 3: the disk is full from then on.
        if data.startswith(b'{"step": 3,') or failed_at:
            failed_at.append(time.monotonic())
            return True
        return False

    _inject(monkeypatch, _is_ledger, armed)
    ledger = tmp_path / "metrics.jsonl"
    with pytest.raises(metrics_lib.MetricsWriteError) as info:
        rl_stage.run(settings, tmp_path, log=lambda _: None)
    assert time.monotonic() - failed_at[0] < HANG_GUARD_S
    assert str(info.value) == f"metrics: cannot write {ledger}: {ENOSPC}"
    records = _lines(ledger)
    # The process's start-up record comes with its first step.
    first = [(0, "eval"), (1, "startup"), (1, "step"), (2, "step")]
    assert [(r["step"], r["record"]) for r in records] == first
    reader = ckpt_lib.Checkpointer(tmp_path / "checkpoints", every_steps=0, read_only=True)
    try:
        assert reader.all_steps() == [2]
    finally:
        reader.close()

    monkeypatch.undo()  # the disk has room again
    result = rl_stage.run(settings, tmp_path, log=lambda _: None)
    assert result["resumed_from"] == 2 and result["steps"] == 4
    records = _lines(ledger)
    kinds = [(r["step"], r["record"]) for r in records]
    assert kinds == [*first, (3, "startup"), (3, "step"), (4, "step"), (4, "final")]
