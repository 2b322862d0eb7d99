"""The persistent compile cache's settings, the compile log, and the step compiled ahead of the
loop. A second launch of an unchanged config reading its big programs from the cache is checked
with the killed launch of tests/test_main.py::test_sigkill_then_resume_gives_the_same_metrics."""

from rlvr_jax.program import compilation


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
