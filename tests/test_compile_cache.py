"""A second launch of an unchanged config reads its big programs from the persistent compile
cache, and the ledger says what the start-up cost."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr_jax.program import compilation

ROOT = Path(__file__).resolve().parents[1]


def _launch(workdir: Path, cache: Path) -> tuple[str, dict]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [
            sys.executable, "-m", "rlvr_jax.main", "--config=configs/tiny.py",
            f"--workdir={workdir}", f"--compile_cache={cache}", "--config.train.steps=1",
            "--config.train.use_tensorboard=False",
        ],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("first step after"))
    records = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    (startup,) = [r for r in records if r["record"] == "startup"]
    return line, startup


@pytest.mark.slow
def test_a_second_launch_reads_the_step_from_the_cache(tmp_path):
    cache = tmp_path / "cache"
    line, first = _launch(tmp_path / "a", cache)
    compiled, _, _ = line.partition("read from the compile cache")
    assert "jit(step)" in compiled and first["startup/programs_from_cache"] == 0
    assert any(cache.iterdir())
    # Another workdir, so nothing but the cache is shared.
    line, second = _launch(tmp_path / "b", cache)
    compiled, _, cached = line.partition("read from the compile cache")
    assert "jit(step)" in cached and "jit(step)" not in compiled
    assert second["startup/programs_from_cache"] >= 2  # the fused step and the sampler
    total = lambda r: r["startup/programs_compiled"] + r["startup/programs_from_cache"]  # noqa: E731
    assert total(second) == total(first)
    assert second["step"] == 1 and second["startup/seconds"] > 0


def test_the_cache_is_off_for_none_and_defaults_under_the_users_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compilation.default_cache_dir() == tmp_path / "rlvr_jax" / "jax"
    assert compilation.enable_cache("none") is None
    assert compilation.enable_cache("") is None


def test_a_long_compilation_says_so_and_a_short_one_does_not():
    lines = []
    log = compilation.CompileLog(notice_after=0.0, printer=lines.append)
    log.notices = True
    lowered, compiled = compilation._LOWERED, compilation._BACKEND_COMPILE
    log._duration(lowered, 0.1, fun_name="jit(step)")
    log._timer.value[0].join()  # the notice fires at once with notice_after=0
    log._duration(compiled, 12.5, fun_name="jit(step)")
    assert lines == ["compiling jit(step) ...", "jit(step) compiled in 12.5 s"]
    quiet = compilation.CompileLog(notice_after=3600.0, printer=lines.append)
    quiet.notices = True
    quiet._duration(lowered, 0.1, fun_name="jit(small)")
    quiet._duration(compiled, 0.2, fun_name="jit(small)")
    assert len(lines) == 2
    assert [p.name for p in quiet.programs] == ["jit(small)"]
    assert quiet.metrics()["startup/programs_compiled"] == 1


def test_the_fused_step_compiles_once_ahead_of_the_loop(tmp_path):
    """The run compiles the step on a thread during the evaluation before training; the first
    step then finds the executable: one compilation of jit(step) in the whole run."""
    from configs import tiny
    from rlvr_jax.program import rl_stage
    from rlvr_jax.program import settings as settings_lib

    c = tiny.get_config()
    c.data.num_train = 32
    c.data.num_eval = 8
    c.eval.batch_prompts = 8
    c.train.batch_prompts = 4
    c.train.steps = 2
    c.train.use_tensorboard = False
    steps = lambda: [p for p in compilation.COMPILES.programs if p.name == "jit(step)"]  # noqa: E731
    before = len(steps())
    rl_stage.run(settings_lib.settings_from_config(c), tmp_path, log=lambda _: None)
    assert len(steps()) - before == 1
