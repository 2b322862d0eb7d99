"""The tool-call parser (table-driven, hostile inputs included), the tool environment's
bookkeeping, and the tool-integrated math environment with its sandboxed `python` tool."""

from __future__ import annotations

import json
import string

import numpy as np
import pytest

from rlvr_jax.data.example import Example
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs import tool_math
from rlvr_jax.envs.environment import (
    ToolCall,
    ToolCallError,
    ToolEnvironment,
    parse_tool_call,
    tool_call_text,
)
from rlvr_jax.rewards import sandbox
from rlvr_jax.rewards.config import RewardSettings
from rlvr_jax.types import Rollout
from tests.envs.fixtures import QWEN_STYLE

GOOD = '{"name": "python", "arguments": {"code": "print(1)"}}'


@pytest.mark.parametrize(
    "text, want",
    [
        (f"<tool_call>\n{GOOD}\n</tool_call>", ToolCall("python", {"code": "print(1)"})),
        (f"think first <tool_call>{GOOD}</tool_call>", ToolCall("python", {"code": "print(1)"})),
        # The last block is the call; an earlier one was text.
        (
            f'<tool_call>{{"name": "a"}}</tool_call> then <tool_call>{GOOD}</tool_call>',
            ToolCall("python", {"code": "print(1)"}),
        ),
        ('<tool_call>{"name": "f"}</tool_call>', ToolCall("f", {})),
        # Arguments written as a JSON string.
        (
            '<tool_call>{"name": "f", "arguments": "{\\"x\\": 2}"}</tool_call>',
            ToolCall("f", {"x": 2}),
        ),
    ],
)
def test_parses_the_last_tool_call(text, want):
    assert parse_tool_call(text) == want


@pytest.mark.parametrize(
    "text, message",
    [
        ("no call here", "no complete"),
        (f"<tool_call>{GOOD}", "no complete"),  # cut by the token budget
        (f"{GOOD}</tool_call>", "no complete"),
        ("<tool_call>{'name': 'f'}</tool_call>", "not valid JSON"),
        ("<tool_call></tool_call>", "not valid JSON"),
        ("<tool_call>[1, 2]</tool_call>", "must be a JSON object"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'no "name"'),
        ('<tool_call>{"name": 3}</tool_call>', 'no "name"'),
        ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', '"arguments" must be'),
        ('<tool_call>{"name": "f", "arguments": "x"}</tool_call>', "not a JSON object"),
        ("<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>", "too deeply"),
    ],
)
def test_malformed_calls_raise_tool_call_errors(text, message):
    with pytest.raises(ToolCallError, match=message):
        parse_tool_call(text)


@pytest.fixture(scope="module")
def env() -> tool_math.MathToolEnv:
    tok = Tokenizer.from_characters(string.printable, chat_template=QWEN_STYLE)
    return tool_math.MathToolEnv(tok)


def _call(code) -> str:
    payload = {"name": "python", "arguments": {"code": code}}
    return f"<tool_call>\n{json.dumps(payload)}\n</tool_call>"


def test_math_tool_episode(env):
    prompt = env.reset(Example("m/0", "What is 2^10 + 1?", "1025", "test"))
    assert prompt.startswith("<|im_start|>system\nPlease reason step by step")
    assert '"name": "python"' in prompt
    assert prompt.endswith("What is 2^10 + 1?<|im_end|>\n<|im_start|>assistant\n")
    r = env.step("Let me compute. " + _call("print(2**10)"))
    assert (r.observation, r.done, r.tool_calls, r.tool_errors) == ("1024", False, 1, 0)
    r = env.step(_call("1/0"))
    assert not r.done and r.tool_errors == 1
    assert "ZeroDivisionError" in r.observation and "[failed: exit status 1]" in r.observation
    r = env.step(_call("print('x' * 5000)"))
    assert r.observation.endswith("[output cut at 1024 characters]") and r.tool_errors == 0
    r = env.step("<tool_call>{oops</tool_call>")
    assert r.observation.startswith("Error: the tool call is not valid JSON") and r.tool_errors
    r = env.step("So the answer is \\boxed{1025}.")
    assert r.done
    assert dict(r.parts) == {"correct": 1.0, "tool_calls": 4.0, "tool_errors": 2.0}
    # A new episode starts from nothing; a wrong answer scores 0.
    env.reset(Example("m/1", "What is 1+1?", "2", "test"))
    r = env.step("\\boxed{3}")
    assert dict(r.parts) == {"correct": 0.0, "tool_calls": 0.0, "tool_errors": 0.0}


def test_a_runaway_program_is_killed_and_counted(env):
    env.reset(Example("m/2", "q", "1", "test"))
    limits = sandbox.SandboxLimits(cpu_seconds=1, wall_seconds=2.0)
    out, failed = tool_math.run_python("while True: pass", limits)
    assert failed and "[failed: " in out
    with pytest.raises(ToolCallError):
        tool_math.run_python(["not", "code"])
    r = env.step(_call(5))
    assert r.tool_errors == 1 and '"code" must be a string' in r.observation
    assert env.truncate() == {"correct": 0.0, "tool_calls": 1.0, "tool_errors": 1.0}


def test_the_task_scores_the_last_turn_only():
    """A tool's output that holds the gold answer earns nothing: only the model's tokens after
    the last observation are its final answer."""
    tok = Tokenizer.from_characters(string.printable, chat_template=QWEN_STYLE)
    with tool_math.MathToolTask(tok, RewardSettings(verifier="math_tool", workers=1)) as task:
        assert task.stop_sequences == (tuple(tok.encode("</tool_call>")),)
        assert isinstance(task.environment(), tool_math.MathToolEnv)
        rows = [  # (model turn, observation, final turn)
            ("call", "\\boxed{7}", "no idea"),
            ("call", "6", "so \\boxed{7}"),
            ("\\boxed{7}", "", ""),  # single turn: the whole response
        ]
        T = 40
        tokens = np.zeros((3, T), np.int32)
        injected = np.zeros((3, T), bool)
        lengths = np.zeros(3, np.int32)
        for n, (turn, obs, final) in enumerate(rows):
            ids = tok.encode(turn) + tok.encode(obs) + tok.encode(final)
            tokens[n, : len(ids)] = ids
            a = len(tok.encode(turn))
            injected[n, a : a + len(tok.encode(obs))] = True
            lengths[n] = len(ids)
        mask = np.arange(T)[None] < lengths[:, None]
        rollout = Rollout(
            *(np.zeros((3, 1), np.int32), np.ones(3, np.int32)),
            tokens,
            np.zeros((3, T), np.float32),
            mask,
            injected,
            lengths,
            np.ones(3, np.int32),
        )
        assert task.final_answers(rollout) == ["no idea", "so \\boxed{7}", "\\boxed{7}"]
        ex = Example("m/0", "q", "7", "test")
        parts = task.score(rollout, [ex] * 3)
    assert parts["correct"].tolist() == [0.0, 1.0, 1.0]


class _Faulty(ToolEnvironment):
    """Tools that fail in the ways a tool's own code can."""

    def __init__(self):
        super().__init__()
        self.tools = {"recurse": self.recurse, "crash": self.crash, "typo": self.typo}

    def recurse(self, depth: int) -> str:
        return self.recurse(depth + 1)

    def crash(self) -> str:
        raise RuntimeError("the tool's own bug")

    def typo(self, text: str) -> str:
        return text + 1  # a TypeError inside the tool, not in its arguments

    def prompt(self, example: Example) -> str:
        return example.prompt_text

    def answer_parts(self, text: str) -> dict[str, float]:
        return {"correct": float(text == "7")}


@pytest.mark.parametrize(
    "name, arguments, observation",
    [
        ("recurse", {"depth": 0}, "Error: the tool 'recurse' failed: RecursionError"),
        ("crash", {}, "Error: the tool 'crash' failed: RuntimeError: the tool's own bug"),
        ("typo", {"text": "a"}, "Error: the tool 'typo' failed: TypeError"),
        ("typo", {"txt": "a"}, "Error: bad arguments for 'typo'"),
    ],
)
def test_a_tool_that_raises_is_a_failed_call_and_the_episode_goes_on(name, arguments, observation):
    env = _Faulty()
    env.reset(Example("f/0", "q", "7", "test"))
    r = env.step(tool_call_text(name, arguments))
    assert r.observation.startswith(observation), r.observation
    assert (r.done, r.tool_calls, r.tool_errors) == (False, 1, 1)
    r = env.step("7")
    assert r.done and dict(r.parts) == {"correct": 1.0, "tool_calls": 1.0, "tool_errors": 1.0}
