"""VerifierPool: deadlines, crashes, recovery, counters, start methods, throughput.

Workers import this module to find `call`, so it imports nothing heavy (no JAX).
"""

import math
import os
import signal
import subprocess
import sys
import time

import pytest

from rlvr_jax.rewards.pool import PoolStats, VerifierPool

DEADLINE_S = 1.0
SLACK_S = 1.5


def _spin() -> float:
    while True:
        pass


def _hog() -> float:
    return float(len(bytearray(8 * 2**30)))


def _die() -> float:
    os._exit(3)


def _boom() -> float:
    raise RuntimeError("verifier bug")


BEHAVIOURS = {
    "add": lambda a, b: a + b,
    "sleep": lambda seconds: time.sleep(seconds) or 1.0,
    "spin": _spin,
    "boom": _boom,
    "die": _die,
    "nan": lambda: math.nan,
    "text": lambda: "not a number",
    "hog": _hog,
    "has_jax": lambda: float("jax" in sys.modules),
    "pid": lambda: float(os.getpid()),
}


def call(name: str, *args) -> float:
    """The verifier the pools run: one behaviour per item."""
    return BEHAVIOURS[name](*args)


@pytest.fixture(scope="module")
def pool():
    with VerifierPool(call, num_workers=2, deadline_s=DEADLINE_S, memory_limit_mb=1024) as p:
        yield p


def _counters(stats: PoolStats) -> tuple[int, int, int, int]:
    return stats.checks, stats.timeouts, stats.crashes, stats.restarts


def test_results_in_order(pool):
    rewards, statuses = pool.map_with_status([("add", i, 0.5) for i in range(50)])
    assert rewards == [i + 0.5 for i in range(50)]
    assert statuses == ["ok"] * 50
    assert pool.map([]) == []


def test_workers_do_not_import_jax(pool):
    assert "jax" in sys.modules  # the test process has JAX (conftest); the workers must not
    assert pool.map([("has_jax",), ("has_jax",)]) == [0.0, 0.0]


def test_slow_item_within_deadline_is_ok(pool):
    assert pool.map_with_status([("sleep", 0.2)]) == ([1.0], ["ok"])


def test_timeouts_give_zero_count_and_replace_workers(pool):
    pids_before = set(pool.map([("pid",), ("pid",), ("pid",), ("pid",)]))
    checks, timeouts, crashes, restarts = _counters(pool.stats)
    items = [("sleep", 30.0), ("add", 1, 2), ("spin",), ("add", 3, 4)]
    start = time.monotonic()
    rewards, statuses = pool.map_with_status(items)
    elapsed = time.monotonic() - start
    assert rewards == [0.0, 3.0, 0.0, 7.0]
    assert statuses == ["timeout", "ok", "timeout", "ok"]
    assert _counters(pool.stats) == (checks + 4, timeouts + 2, crashes, restarts + 2)
    # Two workers: both stuck items run side by side, then a replacement takes the last one.
    assert elapsed < 2 * DEADLINE_S + SLACK_S, elapsed
    pids_after = set(pool.map([("pid",), ("pid",), ("pid",), ("pid",)]))
    assert pids_after.isdisjoint(pids_before)  # the stuck workers were replaced
    assert pool.map([("add", 2, 2)]) == [4.0]  # and the pool goes on


def test_crashes_give_zero_and_count(pool):
    checks, timeouts, crashes, restarts = _counters(pool.stats)
    items = [("boom",), ("die",), ("nan",), ("text",), ("hog",), ("add", 1, 1), ("die",)]
    rewards, statuses = pool.map_with_status(items)
    assert rewards == [0.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0]
    assert statuses == ["crash"] * 5 + ["ok", "crash"]
    # Only the two deaths cost a worker; raising, nan, and MemoryError under the cap do not.
    assert _counters(pool.stats) == (checks + 7, timeouts, crashes + 6, restarts + 2)
    assert pool.map([("add", 5, 5)]) == [10.0]


def test_stats_report_throughput(pool):
    before = (pool.stats.checks, pool.stats.seconds)
    assert pool.map([("add", i, 1) for i in range(2000)]) == [i + 1.0 for i in range(2000)]
    checks = pool.stats.checks - before[0]
    seconds = pool.stats.seconds - before[1]
    print(f"\npool throughput (trivial verifier, 2 workers): {checks / seconds:.0f} checks/s")
    metrics = pool.stats.as_dict()
    assert metrics["verifier/checks"] == pool.stats.checks
    assert metrics["verifier/checks_per_s"] > 0


def test_spawn_start_method():
    with VerifierPool(call, num_workers=1, deadline_s=DEADLINE_S, start_method="spawn") as p:
        assert p.map_with_status([("add", 1, 1), ("has_jax",), ("boom",)]) == (
            [2.0, 0.0, 0.0],
            ["ok", "ok", "crash"],
        )
        assert p.map_with_status([("spin",)]) == ([0.0], ["timeout"])
        assert p.map([("add", 2, 3)]) == [5.0]
        assert (p.stats.timeouts, p.stats.crashes, p.stats.restarts) == (1, 1, 1)


def test_warmup_runs_before_ready_and_a_dying_warmup_raises():
    with VerifierPool(call, num_workers=1, deadline_s=DEADLINE_S, warmup=("sleep", 1.5)) as p:
        # The warm-up sleeps longer than the deadline but is not charged to the item.
        assert p.map_with_status([("add", 1, 2)]) == ([3.0], ["ok"])
    with (
        VerifierPool(call, num_workers=1, deadline_s=DEADLINE_S, warmup=("die",)) as p,
        pytest.raises(RuntimeError, match="died 3 times before they were ready"),
    ):
        p.map([("add", 1, 2)])


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="start_method='fork'"):
        VerifierPool(call, 1, 1.0, start_method="fork")
    with pytest.raises(ValueError, match="lambda"):
        VerifierPool(lambda: 1.0, 1, 1.0)
    with pytest.raises(ValueError, match="num_workers=0"):
        VerifierPool(call, 0, 1.0)
    with pytest.raises(ValueError, match="deadline_s=0"):
        VerifierPool(call, 1, 0)
    with pytest.raises(TypeError, match="warmup="):
        VerifierPool(call, 1, 1.0, warmup=["add", 1, 1])


def test_items_must_be_tuples_and_closed_pool_refuses(pool):
    with pytest.raises(TypeError, match=r"items\[1\] is a list"):
        pool.map([("add", 1, 1), ["add", 1, 1]])
    p = VerifierPool(call, num_workers=1, deadline_s=DEADLINE_S)
    p.close()
    with pytest.raises(RuntimeError, match="closed"):
        p.map([("add", 1, 1)])


_ORPHAN_SCRIPT = """
import os, signal, sys, threading
from tests.rewards.test_pool import call
from rlvr_jax.rewards.pool import VerifierPool
pool = VerifierPool(call, 2, 100.0, start_method=sys.argv[1])
pool.map([("sleep", 0.2), ("sleep", 0.2)])  # both workers ready and busy once
print(" ".join(str(p) for p in pool.worker_pids), flush=True)
threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGKILL)).start()
pool.map([("spin",), ("spin",)])
"""


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()  # a zombie has ended
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_workers_end_when_the_trainer_is_killed(start_method, tmp_path):
    out = tmp_path / "pids.txt"
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    with open(out, "w") as f:
        proc = subprocess.run(
            [sys.executable, "-c", _ORPHAN_SCRIPT, start_method],
            stdout=f,
            stderr=subprocess.DEVNULL,
            env=env,
            timeout=60,
        )
    assert proc.returncode == -signal.SIGKILL
    pids = [int(p) for p in out.read_text().split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 10.0
    while any(map(_running, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [p for p in pids if _running(p)]
    for pid in alive:  # never leave a spinning orphan behind, even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"workers {alive} outlived the killed trainer"
