"""The persistent compile cache's settings, the compile log, the step compiled ahead of the
loop (fused, or the host path's rollout and update), and the startup record's phases. A second
launch of an unchanged config reading its big programs from the cache is checked with the killed
launch of tests/test_main.py::test_sigkill_then_resume_gives_the_same_metrics."""

import json

from rlvr_jax.program.runtime import compilation


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


def _run_tiny(workdir, log=lambda _: None, **reward):
    """Two steps of a small tiny config (with `reward` settings) in `workdir`."""
    from configs import tiny
    from rlvr_jax.program import settings as settings_lib
    from rlvr_jax.program.stages import rl_stage

    c = tiny.get_config()
    c.reward.update(reward)
    c.data.num_train = 32
    c.data.num_eval = 8
    c.eval.batch_prompts = 8
    c.train.batch_prompts = 4
    c.train.steps = 2
    c.train.use_tensorboard = False
    rl_stage.run(settings_lib.settings_from_config(c), workdir, log=log)


def _compiled(*names: str) -> dict[str, int]:
    """How often each program has been compiled or read back so far in this process."""
    return {n: sum(p.name == n for p in compilation.COMPILES.programs) for n in names}


def test_the_fused_step_compiles_once_ahead_of_the_loop(tmp_path):
    """The run compiles the step on a thread during the evaluation before training; the first
    step then finds the executable: one compilation of jit(step) in the whole run."""
    before = _compiled("jit(step)")
    _run_tiny(tmp_path)
    assert _compiled("jit(step)")["jit(step)"] - before["jit(step)"] == 1


def test_the_host_path_compiles_its_rollout_and_update_once_ahead_of_the_loop(tmp_path):
    """With a host verifier the rollout and the update are two programs: both compile on
    threads during the evaluation before training, the update on the parts the task declares
    (`Task.part_names`), so that the steps' calls find their executables."""
    names = ("jit(rollout)", "jit(update_fn)")
    before = _compiled(*names)
    lines = []
    # The length reward: a shaping part the task does not return, added on the host.
    _run_tiny(tmp_path, lines.append, verifier="math", length_weight=0.1)
    assert {n: k - before[n] for n, k in _compiled(*names).items()} == dict.fromkeys(names, 1)
    assert not any("ahead of the loop failed" in line for line in lines)
    # The startup record splits the time to the first step into its phases.
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    (startup,) = [r for r in records if r["record"] == "startup"]
    phases = [f"startup/{p}_seconds" for p in ("eval_before", "compile_wait", "first_step")]
    assert all(startup[p] >= 0 for p in phases) and startup["startup/eval_before_seconds"] > 0
    assert sum(startup[p] for p in phases) < startup["startup/seconds"]
    (line,) = [x for x in lines if x.startswith("first step after")]
    assert "; set-up " in line and ", eval before " in line and ", first step " in line
