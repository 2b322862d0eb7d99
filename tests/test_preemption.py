"""Stopping: SIGINT is a request to stop like SIGTERM, a second SIGINT stops at once, a signal
outside the loop says truly what is saved, and a process whose run failed exits even when a
thread it started never ends."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlvr_jax.program.runtime import preemption

REPO = Path(__file__).resolve().parents[1]


def _deliver(guard, count):
    """Waits until the guard's handler ran `count` times (it runs between bytecodes)."""
    for _ in range(100000):
        if len(guard.received) >= count:
            return
    raise AssertionError(f"handler ran {len(guard.received)} times, expected {count}")


def test_sigint_is_a_request_to_stop_and_a_second_one_stops_at_once(capfd):
    before = {s: signal.getsignal(s) for s in preemption.STOP_SIGNALS}
    with preemption.PreemptionGuard() as guard:
        os.kill(os.getpid(), signal.SIGINT)
        _deliver(guard, 1)
        assert guard.should_stop() and guard.signal_name == "SIGINT"
        os.kill(os.getpid(), signal.SIGTERM)  # a repeated request, not an abort
        _deliver(guard, 2)
        with pytest.raises(KeyboardInterrupt, match="a second SIGINT"):
            os.kill(os.getpid(), signal.SIGINT)
            _deliver(guard, 3)
    assert {s: signal.getsignal(s) for s in preemption.STOP_SIGNALS} == before
    err = capfd.readouterr().err
    assert err.count("received: stopping after this step") == 1
    assert "SIGINT received: stopping after this step, saved; a second SIGINT stops at once" in err


def test_a_signal_outside_the_loop_says_what_is_saved(tmp_path):
    preemption.loop_started()
    message = preemption.outside_loop_message(signal.SIGINT)
    assert message == (
        "stopped by SIGINT outside the training loop, during start-up: this process has trained "
        "nothing yet, and the workdir's checkpoints are unchanged"
    )
    preemption.loop_ended(15, tmp_path / "checkpoints")
    message = preemption.outside_loop_message(signal.SIGTERM)
    assert message.startswith(
        f"stopped by SIGTERM outside the training loop, after it: step 15 is saved in "
        f"{tmp_path / 'checkpoints'}"
    )
    assert "nothing" not in message
    preemption.loop_started()


@pytest.mark.parametrize(
    "error, status",
    [
        (RuntimeError("x"), 1),
        (KeyboardInterrupt(), 130),
        (preemption.StoppedOutsideLoop(143), 143),
        (SystemExit("a message"), 1),
        (SystemExit(2), 2),
    ],
)
def test_exit_statuses(error, status):
    assert preemption.exit_status(error) == status


def _python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,  # a process kept alive by its thread would be killed here, failing
    )


def test_an_error_exits_even_with_a_thread_that_never_ends():
    done = _python(
        """
        import threading
        from rlvr_jax.program.runtime import preemption

        threading.Thread(target=threading.Event().wait, name="stuck-saver").start()
        try:
            raise RuntimeError("the save failed")
        except RuntimeError as e:
            preemption.exit_after_error(e, grace_s=1.0)
        """
    )
    assert done.returncode == 1, done.stderr
    assert "RuntimeError: the save failed" in done.stderr
    assert "without waiting further for 1 background threads (stuck-saver)" in done.stderr


def test_an_error_with_nothing_left_running_exits_normally():
    done = _python(
        """
        import atexit
        from rlvr_jax.program.runtime import preemption

        atexit.register(lambda: print("exit handlers ran"))
        try:
            raise KeyboardInterrupt("a second SIGINT")
        except KeyboardInterrupt as e:
            preemption.exit_after_error(e, grace_s=60.0)
        """
    )
    assert done.returncode == 130, done.stderr
    assert "exit handlers ran" in done.stdout and "without waiting" not in done.stderr


def test_a_stop_signal_ignored_where_it_landed_still_keeps_the_loop_from_starting():
    """Python runs a signal handler between any two bytecodes, a finaliser's too, and an
    exception raised there is printed and ignored: the loop's guard must still refuse to start
    (the run would otherwise train and exit 0)."""
    script = textwrap.dedent(
        """
        import os, signal
        from rlvr_jax.program.runtime import preemption

        preemption.install_outside_loop()

        class Finalised:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGTERM)  # the handler runs in here

        Finalised()  # collected at once: the StoppedOutsideLoop is ignored in __del__
        print("start-up went on", flush=True)
        preemption.PreemptionGuard().install()
        print("the loop started", flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Exception ignored in" in done.stderr, done.stderr
    assert "start-up went on" in done.stdout
    assert "the loop started" not in done.stdout
    assert done.returncode == 128 + signal.SIGTERM, (done.stdout, done.stderr)
