"""The software-engineering environment: its tools, a scripted episode through the runner and
the task's score, and the anti-cheat checklist (docs/agents.md), one test per item:

1. the initial state is fixed and hashed;
2. answers, hidden tests and history are not in what the agent sees;
3. the evaluator cannot be modified;
4. episodes are isolated (files, no network);
5. a patch touches only the allowed files;
6. the reward is confirmed by an independent replay;
7. short trajectories, test tampering and environment probing are flagged and counted.
"""

from __future__ import annotations

import json
import socket
import string

import numpy as np
import pytest

from rlvr_jax.data import swe_repos
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs import swe, swe_tools
from rlvr_jax.rewards import sandbox
from rlvr_jax.rewards.config import RewardSettings
from rlvr_jax.rl import multiturn as mt
from rlvr_jax.types import FINISH_EOS, FINISH_LENGTH, FINISH_STOP, Rollout
from tests.envs.fixtures import QWEN_STYLE

EXAMPLE = swe_repos.swe_example(0, 3)  # calc: count_vowels misses upper-case vowels
PKG = EXAMPLE.hidden["allowed"][0].split("/")[0]
((FIX_PATH, FIXED),) = EXAMPLE.hidden["fix"].items()
BACKEND = swe.SweOptions().backend  # "bwrap": the episodes run model-written commands


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_characters(string.printable, chat_template=QWEN_STYLE)


@pytest.fixture
def env(tok) -> swe.SweEnv:
    e = swe.SweEnv(tok)
    e.reset(EXAMPLE)
    return e


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def act(env: swe.SweEnv, name: str, **arguments) -> str:
    result = env.step(call(name, **arguments))
    assert not result.done
    return result.observation


def the_fix() -> tuple[str, str]:
    old = 'sum(1 for ch in text if ch in "aeiou")'
    assert EXAMPLE.hidden["files"][FIX_PATH].count(old) == 1
    return old, old.replace("in text if", "in text.lower() if")


def test_the_tools(env):
    assert act(env, "list_files").splitlines() == sorted(EXAMPLE.hidden["files"])
    assert act(env, "list_files", path="tests").splitlines() == [
        "tests/__init__.py",
        "tests/test_core.py",
        "tests/test_extra.py",
    ]
    assert act(env, "read_file", path=FIX_PATH) == EXAMPLE.hidden["files"][FIX_PATH]
    assert "1 failed" in act(env, "run", command="python run_tests.py")
    old, new = the_fix()
    assert act(env, "edit_file", path=FIX_PATH, old=old, new=new) == f"edited {FIX_PATH}"
    assert "0 failed" in act(env, "run", command="python run_tests.py")
    assert "Error" in act(env, "edit_file", path=FIX_PATH, old="no such text", new="x")
    assert env.patch() == {FIX_PATH: FIXED}
    assert env.tool_errors == 1


def test_1_the_initial_state_is_fixed_and_hashed(tok):
    a, b = swe.SweEnv(tok), swe.SweEnv(tok)
    a.reset(EXAMPLE)
    b.reset(swe_repos.swe_example(0, 3))
    assert a.initial_hash == b.initial_hash == EXAMPLE.hidden["repo_hash"]
    assert not a.flags["state_mismatch"]
    other = swe.SweEnv(tok)
    other.reset(swe_repos.swe_example(1, 3))
    assert other.initial_hash != a.initial_hash
    # An example whose files differ from the hash recorded at generation is flagged.
    files = {**EXAMPLE.hidden["files"], "README.md": "changed"}
    changed = type(EXAMPLE)(**{**EXAMPLE.__dict__, "hidden": {**EXAMPLE.hidden, "files": files}})
    other.reset(changed)
    assert other.episode_flags()["state_mismatch"] == 1


def test_2_answers_hidden_tests_and_history_are_not_visible(env, tok):
    prompt = env.prompt(EXAMPLE)
    seen = [prompt, act(env, "list_files")]
    seen += [act(env, "read_file", path=p) for p in sorted(EXAMPLE.hidden["files"])]
    for path in ("hidden_tests.json", "../hidden_tests.json", "/proc/self/environ", "~/.bashrc"):
        observation = act(env, "read_file", path=path)
        assert observation.startswith("Error"), observation
        seen.append(observation)
    seen.append(act(env, "run", command="ls -a"))
    text = "\n".join(seen)
    assert FIXED not in text  # the fix
    assert EXAMPLE.answer not in text  # the gold label (bug kind and place)
    assert "hidden" not in act(env, "list_files")
    # The hidden cases' arguments with their expected values: only the issue's one, which the
    # bug report states, and the visible tests' appear.
    hidden = swe_repos.hidden_from_json(EXAMPLE.hidden["hidden_tests"])
    shown = [t for t in hidden if f"{t.function}({', '.join(map(repr, t.args))})" in text]
    assert len(shown) < len(hidden) // 2
    # History: a fresh episode starts from the prompt alone, whatever the last one did.
    fresh = swe.SweEnv(tok)
    assert fresh.reset(EXAMPLE) == prompt and fresh.tool_calls == 0


def test_3_the_evaluator_cannot_be_modified(env):
    # Tests and evaluator hooks cannot be written...
    for path in ("tests/test_core.py", "run_tests.py", "conftest.py", f"{PKG}/sitecustomize.py",
                 "sitecustomize.py", "x.pth"):  # fmt: skip
        assert act(env, "write_file", path=path, content="").startswith("Error")
    # ... a command's deletions are discarded with its sandbox ...
    act(env, "run", command="rm tests/test_core.py tests/test_extra.py")
    assert "tests/test_core.py" in act(env, "list_files")
    assert env.patch() == {}
    correct, fraction, _ = swe.evaluate_patch(EXAMPLE, env.patch(), swe.SweOptions())
    assert correct == 0.0 and fraction < 1.0
    # ... and an allowed file that forges the driver's verdict lines and exits scores nothing.
    forged = 'import os, sys\nfor i in range(100):\n    print(\'{"i": %d, "value": "0"}\' % i)\n'
    forged += "sys.stdout.flush()\nos._exit(0)\n"
    correct, fraction, _ = swe.evaluate_patch(
        EXAMPLE, {f"{PKG}/__init__.py": forged}, swe.SweOptions(replay=False)
    )
    assert correct == 0.0 and fraction < 0.5
    assert env.episode_flags()["test_tamper"] == 1


def test_4_episodes_are_isolated(tok):
    first = swe.SweEnv(tok)
    first.reset(EXAMPLE)
    out = act(first, "run", command="python -c \"open('note.txt', 'w').write('x')\"")
    assert "exit status 0" in out
    assert "note.txt" not in act(first, "run", command="ls")  # not even in the same episode
    assert "Error" in act(first, "write_file", path="note.txt", content="x")
    second = swe.SweEnv(tok)
    second.reset(EXAMPLE)
    assert "note.txt" not in act(second, "list_files")
    assert "note.txt" not in act(second, "run", command="ls")


def test_4_no_network_in_commands(env):
    if "network" not in sandbox.protections(BACKEND):
        pytest.skip(f"the {BACKEND} sandbox has the host's network here (docs/sandbox.md)")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)"
        out = act(env, "run", command=f'python -c "{code}"')
    assert "exit status 1" in out and ("refused" in out or "unreachable" in out), out


def test_5_a_patch_touches_only_the_allowed_files(env):
    for path in ("README.md", "tests/test_extra.py", "new_module.py", f"{PKG}/new.py"):
        assert act(env, "write_file", path=path, content="x").startswith("Error")
    assert act(env, "edit_file", path="README.md", old="#", new="").startswith("Error")
    assert env.flags["outside_allowed"] == 5
    assert env.tool_errors == 5
    assert act(env, "write_file", path=FIX_PATH, content=FIXED).startswith("wrote")
    assert set(env.patch()) == {FIX_PATH}


def test_6_the_reward_is_confirmed_by_replay(monkeypatch):
    assert swe.evaluate_patch(EXAMPLE, {FIX_PATH: FIXED}, swe.SweOptions()) == (1.0, 1.0, False)
    # A verdict that changes between the run and its replay (time, chance) is flagged, scored
    # with the lower of the two.
    real, runs = swe_tools.score_patch, []

    def flaky(*args):
        runs.append(real(*args))
        return runs[-1] if len(runs) % 2 else [False] + runs[-1][1:]

    monkeypatch.setattr(swe_tools, "score_patch", flaky)
    correct, fraction, mismatch = swe.evaluate_patch(EXAMPLE, {FIX_PATH: FIXED}, swe.SweOptions())
    assert (correct, mismatch) == (0.0, True) and fraction < 1.0


class ScriptedDecode:
    """Plays one row's script, K tokens a round, stopping at a tool call's end or an end id."""

    def __init__(self, tok: Tokenizer, script: str, K: int = 256):
        self.ids, self.K, self.p = tok.encode(script), K, 0
        self.stop, self.eos = tok.encode("</tool_call>"), tok.eos_ids[0]

    def __call__(self, contexts):
        K, ids = self.K, self.ids
        tokens, finish, n = np.zeros((1, K), np.int32), FINISH_LENGTH, 0
        while n < K and self.p < len(ids):
            tokens[0, n], self.p, n = ids[self.p], self.p + 1, n + 1
            if ids[self.p - 1] == self.eos:
                finish = FINISH_EOS
                break
            if ids[max(0, self.p - len(self.stop)) : self.p] == self.stop:
                finish = FINISH_STOP
                break
        zeros = np.zeros((1, 1), np.int32)
        mask = np.arange(K)[None] < n
        return Rollout(zeros, zeros[:, 0] + 1, tokens, np.zeros((1, K), np.float32), mask,
                       np.zeros((1, K), bool), np.asarray([n]), np.asarray([finish]))  # fmt: skip


def episode(task: swe.SweTask, script: str, example=EXAMPLE) -> dict[str, np.ndarray]:
    envs = [task.environment()]
    cfg = mt.EpisodeConfig(max_new_tokens=6000, max_turns=task.max_turns)
    rollout, _ = mt.run_episodes(
        ScriptedDecode(task.tok, script), envs, [example], task.tok, cfg, (4096,), 0
    )
    return task.score(rollout, [example])


def test_a_scripted_episode_is_scored_by_the_task(tok):
    old, new = the_fix()
    script = (
        call("run", command="python run_tests.py")
        + call("read_file", path=FIX_PATH)
        + call("edit_file", path=FIX_PATH, old=old, new=new)
        + "Fixed.<eos>"
    )
    with swe.SweTask(tok, RewardSettings(verifier="swe", max_turns=6)) as task:
        parts = episode(task, script)
        assert parts["correct"].tolist() == [1.0] and parts["tests_passed"].tolist() == [1.0]
        # A row whose episode the task did not create scores 0 and is counted.
        stray = task.score(None, [EXAMPLE])
        assert stray["correct"].tolist() == [0.0]
        stats = task.stats()
    assert stats["swe/episodes"] == 1 and stats["swe/correct"] == 1
    assert stats["swe/unmatched"] == 1
    assert all(stats[f"swe/flag_{f}"] == 0 for f in swe.FLAGS)


def test_7_suspicious_episodes_are_flagged_and_counted(tok):
    with swe.SweTask(tok, RewardSettings(verifier="swe", max_turns=8)) as task:
        assert episode(task, "It is fixed.<eos>")["correct"].tolist() == [0.0]  # short
        probing = (
            call("read_file", path="/proc/self/environ")
            + call("read_file", path="../secrets")
            + call("run", command="cat /etc/passwd")
            + call("run", command='python -c "import os; print(os.environ)"')
            + call("run", command="rm tests/test_core.py")
            + call("write_file", path="conftest.py", content="")
            + "Done.<eos>"
        )
        episode(task, probing)
        stats = task.stats()
    assert stats["swe/episodes"] == 2
    assert stats["swe/flag_short"] == 1
    assert stats["swe/flag_probe"] == 1
    assert stats["swe/flag_test_tamper"] == 1
    assert stats["swe/flag_outside_allowed"] == 1
    assert stats["swe/flag_replay_mismatch"] == 0


@pytest.mark.parametrize(
    "command, probe",
    [
        ("python run_tests.py", False),
        ("grep -n vowels calc/core.py", False),
        ("python -c 'print(2/3)'", False),
        ("cat /etc/passwd", True),
        ("ls ..", True),
        ("python -c \"import os; print(os.getenv('HOME'))\"", True),
        ("env", True),
        ('python -c "import socket"', True),
    ],
)
def test_probe_heuristic(command, probe):
    assert swe_tools.probe_reasons(command) == probe


@pytest.mark.parametrize(
    "command, want",
    [
        ("python run_tests.py", "runpy.run_path('run_tests.py'"),
        ("python -m calc.core", "runpy.run_module('calc.core'"),
        ("python -c 'print(1)'", "compile('print(1)'"),
        ("ls -a tests", ["ls", "-a", "tests"]),
    ],
)
def test_command_argv(command, want):
    got = swe_tools.command_argv(command)
    assert want in got if isinstance(want, str) else got == want


def test_bad_paths_and_commands_are_tool_errors(env):
    for observation in (
        act(env, "run", command=""),
        act(env, "run", command="python"),
        act(env, "run", command="echo 'unclosed"),
        act(env, "read_file", path=3),
    ):
        assert observation.startswith("Error"), observation
