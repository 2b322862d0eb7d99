"""Generated repositories: deterministic from the seed, every bug kind, a bug the visible and the
hidden tests both catch and the fix passes (checked by running them in the sandbox)."""

from __future__ import annotations

import collections

import pytest

from rlvr_jax.data import datasets, swe_repos
from rlvr_jax.envs import swe_tools
from rlvr_jax.rewards import sandbox

RUN_TESTS = swe_tools.command_argv("python run_tests.py")


def _first_of_each_kind(seed: int = 0) -> dict[str, swe_repos.SweRepo]:
    out = {}
    for i in range(100):
        repo = swe_repos.swe_repo(seed, i)
        out.setdefault(repo.bug["kind"], repo)
        if len(out) == len(swe_repos.BUG_KINDS):
            return out
    raise AssertionError(f"only {sorted(out)} in 100 repositories")


def test_the_same_seed_gives_the_same_repository():
    a, b = swe_repos.swe_example(3, 5), swe_repos.swe_example(3, 5)
    assert swe_repos.example_json(a) == swe_repos.example_json(b)
    assert a.hidden["repo_hash"] == swe_repos.repo_hash(b.hidden["files"])
    others = {swe_repos.swe_example(s, i).hidden["repo_hash"] for s in (3, 4) for i in range(6)}
    assert len(others) == 12


def test_every_bug_kind_occurs_and_over_many_functions():
    repos = [swe_repos.swe_repo(0, i) for i in range(60)]
    kinds = collections.Counter(r.bug["kind"] for r in repos)
    assert set(kinds) == set(swe_repos.BUG_KINDS)
    assert len({r.bug["function"] for r in repos}) >= 6


def test_the_repository_layout_and_what_stays_hidden():
    repo = swe_repos.swe_repo(0, 1)
    pkg = repo.package
    assert set(repo.allowed) == {f"{pkg}/__init__.py", f"{pkg}/core.py", f"{pkg}/extra.py"}
    assert {"run_tests.py", "tests/test_core.py", "tests/test_extra.py"} <= set(repo.files)
    # The hidden tests are data: no file of the repository holds them or the fix.
    assert not any("hidden" in p for p in repo.files)
    ((path, fixed),) = repo.fix.items()
    assert repo.files[path] != fixed and path in repo.allowed
    assert repo.bug["function"] in repo.issue and "python run_tests.py" in repo.issue


def test_datasets_load_generates_them():
    examples, report = datasets.load("swe_repos", num=3, seed=2)
    assert report is None and [ex.id for ex in examples] == [f"swe_repos/2/{i}" for i in range(3)]
    assert all(ex.source == "swe_repos" and ex.hidden["hidden_tests"] for ex in examples)
    with pytest.raises(ValueError, match="num"):
        datasets.load("swe_repos")


@pytest.mark.parametrize("kind", swe_repos.BUG_KINDS)
def test_the_tests_catch_the_bug_and_pass_the_fix(kind):
    repo = _first_of_each_kind()[kind]
    limits = sandbox.SandboxLimits(cpu_seconds=5, wall_seconds=15.0)
    hidden = swe_tools.score_patch(repo.files, {}, repo.hidden_tests, repo.package, limits, "bwrap")
    fixed = swe_tools.score_patch(
        repo.files, repo.fix, repo.hidden_tests, repo.package, limits, "bwrap"
    )
    assert all(fixed) and not all(hidden), (repo.bug, hidden)
    visible = sandbox.run(RUN_TESTS, files=repo.files, limits=limits)
    assert visible.returncode == 1 and b"FAIL" in visible.stdout, visible
    files = {**repo.files, **repo.fix}
    visible = sandbox.run(RUN_TESTS, files=files, limits=limits)
    assert visible.returncode == 0 and b"0 failed" in visible.stdout, visible
