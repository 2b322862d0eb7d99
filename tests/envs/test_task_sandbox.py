"""A task that executes model output runs it in `reward.sandbox_backend` and refuses to build
where that sandbox cannot start, naming the package and the setting; a task that runs no model
code needs no sandbox; the backend and its protections are logged once per process."""

from __future__ import annotations

import dataclasses
import logging
import string

import numpy as np
import pytest

from configs import tiny
from rlvr_jax.data.example import Example
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs import code, single_turn, swe, tool_math
from rlvr_jax.envs import task as task_lib
from rlvr_jax.envs.environment import tool_call_text
from rlvr_jax.envs.single_turn import build_task
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.stages import rl_stage
from rlvr_jax.rewards import rg_scoring, sandbox
from rlvr_jax.rewards.config import RewardSettings
from rlvr_jax.types import FINISH_EOS, Rollout
from tests.envs.fixtures import QWEN_STYLE

REASON = "the bwrap binary is not installed (apt-get install bubblewrap)"
ADD = Example(
    "toy/0",
    "def add(a, b):\n",
    "    return a + b\n",
    "toy",
    hidden={"entry_point": "add", "tests": ["assert add(1, 2) == 3"]},
)
QUESTION = Example("q/0", "What is 6*7?", "42", "test")
REPO = Example("swe/0", "Fix the bug.", "", "swe_repos", hidden={"hidden_tests": "[]"})


def _rg(task: str) -> Example:
    hidden = {"rg_task": task, "rg_entry": "{}", "rg_config": "{}"}
    return Example(f"rg/{task}", "q", "1", f"reasoning_gym/{task}", hidden=hidden)


# The verifiers that execute model output, each with examples it takes.
RUNS_MODEL_OUTPUT = {
    "code_tests": [ADD],
    "math_tool": [QUESTION],
    "swe": [REPO],
    "reasoning_gym": [_rg("basic_arithmetic"), _rg("spiral_matrix")],  # spiral_matrix evals
}
# The verifiers that never do, each with examples it takes.
RUNS_NO_MODEL_CODE = {
    "arithmetic": [Example("a/0", "6*7", "42", "arithmetic")],
    "math": [QUESTION],
    "countdown": [Example("c/0", "q", "1+2", "countdown")],
    "reasoning_gym": [_rg("basic_arithmetic"), _rg("chain_sum")],  # string comparisons only
}


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_characters(string.printable, chat_template=QWEN_STYLE)


@pytest.fixture(autouse=True)
def fresh_log(monkeypatch):
    """Each test starts with no backend logged in this process."""
    monkeypatch.setattr(task_lib, "_LOGGED_BACKENDS", set())


@pytest.fixture
def no_bwrap(monkeypatch):
    """bubblewrap cannot start in this process for the test (its probe says so)."""
    monkeypatch.setattr(sandbox, "_bwrap_probe", lambda: REASON, raising=False)
    monkeypatch.setattr(sandbox, "bwrap_available", lambda: False)
    monkeypatch.setattr(sandbox, "bwrap_unavailable_reason", lambda: REASON)


def _reward(verifier: str, **kwargs) -> RewardSettings:
    return RewardSettings(verifier=verifier, workers=1, **kwargs)


@pytest.mark.parametrize("verifier", list(RUNS_MODEL_OUTPUT))
def test_a_task_that_runs_model_output_needs_bubblewrap_or_the_explicit_opt_in(
    tok, no_bwrap, verifier, caplog
):
    examples = RUNS_MODEL_OUTPUT[verifier]
    with pytest.raises(sandbox.SandboxUnavailableError) as refused:
        build_task(_reward(verifier), tok, tok.vocab_size, examples, "plain")
    assert "bubblewrap" in str(refused.value)
    assert "reward.sandbox_backend" in str(refused.value)
    caplog.set_level(logging.INFO)
    reward = _reward(verifier, sandbox_backend="rlimits")
    with build_task(reward, tok, tok.vocab_size, examples, "plain") as task:
        assert task.sandbox_backend == "rlimits"
    assert [r.getMessage() for r in caplog.records if "rlimits" in r.getMessage()]


@pytest.mark.parametrize("verifier", list(RUNS_NO_MODEL_CODE))
def test_a_task_that_runs_no_model_code_builds_without_bubblewrap(tok, no_bwrap, verifier, caplog):
    caplog.set_level(logging.INFO)
    examples = RUNS_NO_MODEL_CODE[verifier]
    with build_task(_reward(verifier), tok, tok.vocab_size, examples, "plain") as task:
        assert task.sandbox_backend is None
    assert not [r for r in caplog.records if "sandbox" in r.getMessage()]


def test_the_backend_and_its_protections_are_logged_once(tok, caplog):
    caplog.set_level(logging.INFO)
    for backend in ("rlimits", "rlimits", "bwrap", "bwrap"):
        reward = _reward("code_tests", sandbox_backend=backend)
        build_task(reward, tok, tok.vocab_size, [ADD], "plain").close()
    lines = [r.getMessage() for r in caplog.records if "sandbox" in r.getMessage()]
    assert len(lines) == 2, lines
    assert sandbox.describe("rlimits") in lines[0] and "code_tests" in lines[0]
    assert sandbox.describe("bwrap") in lines[1]
    levels = [r.levelno for r in caplog.records if "sandbox" in r.getMessage()]
    assert levels == [logging.WARNING, logging.INFO]  # the weak fallback stands out


class _Recorder:
    """Stands in for `sandbox.run`: records each call's backend, answers "42"."""

    def __init__(self):
        self.backends = []

    def __call__(self, command, *, backend="bwrap", started=None, **kwargs):
        self.backends.append(backend)
        if started is not None:
            started.set()
        return sandbox.SandboxResult(0, b"42\n", b"", False, None, False, 0.0, backend)


@pytest.mark.parametrize("backend", ["rlimits", "bwrap"])
def test_every_task_runs_model_output_in_the_configured_backend(tok, monkeypatch, backend):
    recorder = _Recorder()
    monkeypatch.setattr(sandbox, "run", recorder)
    # The code tests: the candidate and the tester.
    with code.CodeTestsTask(tok, _reward("code_tests", sandbox_backend=backend)) as task:
        task.check("    return a + b\n", ADD)
    # The math tool, in an episode and in a demonstration.
    with tool_math.MathToolTask(tok, _reward("math_tool", sandbox_backend=backend)) as task:
        env = task.environment()
        env.reset(QUESTION)
        assert env.step(tool_call_text("python", {"code": "print(6*7)"})).observation == "42"
        meta = {"expression": "6*7"}
        env, _ = task.demonstration(dataclasses.replace(QUESTION, meta=meta))
        env.reset(QUESTION)
        env.step(tool_call_text("python", {"code": "print(6*7)"}))
    # The SWE tools and the scoring of a patch.
    with swe.SweTask(tok, _reward("swe", sandbox_backend=backend)) as task:
        assert task.options.backend == backend
        env = task.environment()
        env.files = {"run_tests.py": ""}
        env.run("python run_tests.py")
    # reasoning-gym's sandboxed eval.
    assert rg_scoring.sandboxed_eval("6*7", backend=backend) == 42
    assert recorder.backends == [backend] * 6


def test_the_reasoning_gym_items_carry_the_backend(tok):
    reward = _reward("reasoning_gym", sandbox_backend="rlimits")
    with single_turn.ReasoningGymTask.build(tok, reward, [_rg("spiral_matrix")], False) as task:
        items = []
        task.pool.map = lambda batch: items.extend(batch) or [0.0] * len(batch)
        task.score(_text_rollout(tok, ["<answer>[1]</answer>"]), [_rg("spiral_matrix")])
    assert [item[-1] for item in items] == ["rlimits"]


def _text_rollout(tok, texts):
    rows = [tok.encode(t) for t in texts]
    T = max(len(r) for r in rows)
    tokens = np.zeros((len(rows), T), np.int32)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = r
    N = len(rows)
    ones = np.ones((N, T), bool)
    return Rollout(
        np.ones((N, 1), np.int32),
        np.ones(N, np.int32),
        tokens,
        np.zeros((N, T), np.float32),
        ones,
        ~ones,
        np.asarray([len(r) for r in rows], np.int32),
        np.full(N, FINISH_EOS, np.int32),
    )


def test_a_training_run_with_a_tool_task_refuses_to_start_before_compiling(
    tmp_path, no_bwrap, monkeypatch
):
    c = tiny.get_config()
    c.model.tokenizer = "chars:" + string.printable
    c.reward.verifier = "math_tool"
    c.reward.format_weight = 0.0
    c.reward.workers = 1
    c.data.num_train, c.data.num_eval = 32, 4
    settings = settings_lib.settings_from_config(c)
    compiled = []
    monkeypatch.setattr(rl_stage, "build_rl_step", lambda *a, **k: compiled.append(a))
    with pytest.raises(sandbox.SandboxUnavailableError, match="reward.sandbox_backend"):
        rl_stage.run(settings, tmp_path, log=lambda line: None)
    assert compiled == []
