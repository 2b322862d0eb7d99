"""Multi-turn rollouts: scripted policies make exact episodes (tool calls, malformed calls,
budgets, metrics); a tiny random model checks that the sampled positions hold what the sampler
drew, with the log-probs a teacher-forced forward gives them over the whole trajectory."""

from __future__ import annotations

import json
import re
import string
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax.data.example import Example
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs.environment import StepResult, ToolEnvironment, ToolResponseFormat
from rlvr_jax.model import hf
from rlvr_jax.rl import multiturn as mt
from rlvr_jax.rl.config import RLConfig
from rlvr_jax.rl.rows import _loss_mask
from rlvr_jax.sampling.config import SamplerConfig
from rlvr_jax.types import FINISH_EOS, FINISH_LENGTH, FINISH_STOP, Rollout
from tests.model.hf_fixtures import make_tiny_hf
from tests.sampling.fixtures import teacher_forced_logp

FMT = ToolResponseFormat()
OBSERVATION = re.compile(re.escape(FMT.prefix) + ".*?" + re.escape(FMT.suffix), re.DOTALL)
EXAMPLE = Example("t/0", "What is 3+4?", "7", "test")


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_characters(string.printable)


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


class AddEnv(ToolEnvironment):
    """An `add` tool (optionally slow); the final answer is correct when it holds \\boxed{7}."""

    def __init__(self, delay: float = 0.0):
        super().__init__()
        self.delay = delay
        self.tools = {"add": self.add}

    def add(self, a: int, b: int) -> str:
        time.sleep(self.delay)
        return str(a + b)

    def prompt(self, example: Example) -> str:
        return f"<|im_start|>user\n{example.prompt_text}<|im_end|>\n<|im_start|>assistant\n"

    def answer_parts(self, text: str) -> dict[str, float]:
        return {"correct": float("\\boxed{7}" in text)}


class ScriptedDecode:
    """A decode function that plays each row's script: K tokens a round at most, stopping after
    an end id or a stop sequence as the sampler does. Token j of a row's script gets log-prob
    -(j + 1) / 1000, so a test can tell where every sampled token went."""

    def __init__(self, tok: Tokenizer, scripts: list[str], K: int, stop: str = "</tool_call>"):
        self.eos = tok.eos_ids[0]
        self.scripts = [tok.encode(s) for s in scripts]
        self.stop = tok.encode(stop)
        self.K = K
        self.tok = tok
        self.prompt_len = len(tok.encode(AddEnv().prompt(EXAMPLE)))
        self.calls = 0

    def played(self, context: list[int]) -> int:
        """How much of its script a row holds: its tokens after the prompt, observations out
        (a row's tokens from a round in which it had ended or waited for its tool are not
        there, so it plays them again)."""
        text = self.tok.decode(context[self.prompt_len :])
        return len(self.tok.encode(OBSERVATION.sub("", text)))

    def __call__(self, contexts: list[list[int]]) -> Rollout:
        self.calls += 1
        N, K = len(contexts), self.K
        tokens = np.zeros((N, K), np.int32)
        logp = np.zeros((N, K), np.float32)
        lengths = np.zeros(N, np.int32)
        finish = np.full(N, FINISH_LENGTH, np.int32)
        for n in range(N):
            script, p = self.scripts[n], self.played(contexts[n])
            for k in range(K):
                if p >= len(script):
                    break
                tokens[n, k], logp[n, k] = script[p], -(p + 1) / 1000
                p, lengths[n] = p + 1, k + 1
                if script[p - 1] == self.eos:
                    finish[n] = FINISH_EOS
                    break
                if script[max(0, p - len(self.stop)) : p] == self.stop:
                    finish[n] = FINISH_STOP
                    break
        mask = np.arange(K)[None] < lengths[:, None]
        zeros = np.zeros((N, 1), np.int32)
        return Rollout(
            zeros, zeros[:, 0] + 1, tokens, logp, mask, np.zeros((N, K), bool), lengths, finish
        )


def _run(tok, scripts, envs, T=400, K=16, **cfg):
    decode = ScriptedDecode(tok, scripts, K)
    rollout, stats = mt.run_episodes(
        decode,
        envs,
        [EXAMPLE],
        tok,
        mt.EpisodeConfig(max_new_tokens=T, **cfg),
        buckets=(64,),
        pad_id=tok.pad_id,
    )
    return jax.device_get(rollout), stats, decode


def _sampled_and_injected(rollout, n):
    L = int(rollout.lengths_N[n])
    tokens = rollout.tokens_NT[n, :L]
    injected = rollout.injected_NT[n, :L]
    return tokens, injected, rollout.logp_NT[n, :L]


def test_two_tool_calls_keep_sampled_ids_and_inject_observations(tok):
    turns = [
        "Let me add." + call("add", a=3, b=4),
        "Check again." + call("add", a=4, b=3),
        "So \\boxed{7}",
    ]
    script = "".join(turns) + tok.decode([tok.eos_ids[0]])
    rollout, stats, decode = _run(tok, [script], [AddEnv()], K=16)
    tokens, injected, logp = _sampled_and_injected(rollout, 0)
    eos = tok.eos_ids[0]
    # The sampled positions hold the script's ids in order, with their own log-probs.
    want = tok.encode("".join(turns)) + [eos]
    np.testing.assert_array_equal(tokens[~injected], want)
    np.testing.assert_allclose(logp[~injected], -(np.arange(len(want)) + 1) / 1000, rtol=1e-6)
    # The observation positions hold the encoded tool responses, log-prob 0.
    obs = tok.encode(FMT.wrap("7"))
    assert injected.sum() == 2 * len(obs)
    assert np.all(logp[injected] == 0)
    first = len(tok.encode(turns[0]))
    np.testing.assert_array_equal(tokens[first : first + len(obs)], obs)
    assert injected[first : first + len(obs)].all() and not injected[first - 1]
    # The trajectory reads as the Qwen conversation.
    text = tok.decode(tokens[:-1])
    assert text == (turns[0] + FMT.wrap("7") + turns[1] + FMT.wrap("7") + turns[2]), text
    assert "<|im_end|>\n<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n" in text
    # The loss covers exactly the sampled tokens.
    rl = RLConfig(group_size=2, sampler=SamplerConfig(max_new_tokens=400))
    loss = np.asarray(_loss_mask(jax.tree.map(jnp.asarray, rollout), rl))[0]
    L = int(rollout.lengths_N[0])
    np.testing.assert_array_equal(loss[:L], ~injected)
    assert not loss[L:].any()
    assert int(rollout.finish_N[0]) == FINISH_EOS
    assert stats.turns_N.tolist() == [3] and stats.tool_calls_N.tolist() == [2]
    assert stats.tool_errors_N.tolist() == [0] and stats.truncated_N.tolist() == [0]
    assert stats.observation_tokens_N.tolist() == [2 * len(obs)]
    parts = {k: v.tolist() for k, v in stats.parts.items()}
    assert parts == {"correct": [1.0], "tool_calls": [2.0], "tool_errors": [0.0]}
    assert stats.rounds == decode.calls >= 3


def test_malformed_tool_calls_become_error_observations(tok):
    turns = [
        "<tool_call>\n{not json}\n</tool_call>",
        call("mul", a=1, b=2),
        call("add", a=3),
        "\\boxed{7}",
    ]
    script = "".join(turns) + tok.decode([tok.eos_ids[0]])
    rollout, stats, _ = _run(tok, [script], [AddEnv()], T=800, K=64, max_turns=4)
    tokens, injected, _ = _sampled_and_injected(rollout, 0)
    text = tok.decode(tokens)
    assert "<tool_response>\nError: the tool call is not valid JSON" in text
    assert "<tool_response>\nError: unknown tool 'mul'; tools: ['add']" in text
    assert "<tool_response>\nError: bad arguments for 'add'" in text
    assert stats.tool_calls_N.tolist() == [3] and stats.tool_errors_N.tolist() == [3]
    assert stats.parts["correct"].tolist() == [1.0]
    assert stats.parts["tool_errors"].tolist() == [3.0]
    assert int(rollout.finish_N[0]) == FINISH_EOS


class FaultyAddEnv(AddEnv):
    """`add` raises `error` on its first call, as a tool with a bug would."""

    def __init__(self, error: Exception):
        super().__init__()
        self.error = error
        self.tools = {"add": self.faulty_add}

    def faulty_add(self, a: int, b: int) -> str:
        if self.tool_calls == 1:
            raise self.error
        return self.add(a, b)


class BrokenEnv(AddEnv):
    """An environment whose own step raises on a tool call (outside any tool)."""

    def step(self, action_text: str) -> StepResult:
        if "<tool_call>" in action_text:
            raise RuntimeError("the environment's bug")
        return super().step(action_text)


@pytest.mark.parametrize("error", [RuntimeError("boom"), RecursionError("too deep")])
def test_a_tool_that_raises_mid_episode_is_a_failed_call_and_the_episode_completes(tok, error):
    turns = [call("add", a=3, b=4), call("add", a=3, b=4), "So \\boxed{7}"]
    script = "".join(turns) + tok.decode([tok.eos_ids[0]])
    envs = [FaultyAddEnv(error), AddEnv()]
    rollout, stats, _ = _run(tok, [script, script], envs, T=800, K=64)
    tokens, _, _ = _sampled_and_injected(rollout, 0)
    name = type(error).__name__
    assert f"<tool_response>\nError: the tool 'add' failed: {name}: {error}" in tok.decode(tokens)
    assert stats.tool_calls_N.tolist() == [2, 2] and stats.tool_errors_N.tolist() == [1, 0]
    assert stats.parts["correct"].tolist() == [1.0, 1.0]
    assert stats.metrics()["episode/tool_errors"] == 0.5
    assert np.asarray(rollout.finish_N).tolist() == [FINISH_EOS, FINISH_EOS]


def test_an_environment_step_that_raises_ends_its_episode_only(tok):
    script = call("add", a=3, b=4) + "So \\boxed{7}" + tok.decode([tok.eos_ids[0]])
    rollout, stats, _ = _run(tok, [script, script], [BrokenEnv(), AddEnv()], T=800, K=64)
    assert stats.turns_N.tolist() == [1, 2]
    assert stats.tool_calls_N.tolist() == [1, 1] and stats.tool_errors_N.tolist() == [1, 0]
    assert stats.parts["correct"].tolist() == [0.0, 1.0]
    assert int(rollout.finish_N[1]) == FINISH_EOS


def test_the_turn_budget_cuts_before_the_tool_runs(tok):
    script = call("add", a=1, b=1) * 5
    env = AddEnv()
    rollout, stats, _ = _run(tok, [script], [env], T=800, K=64, max_turns=2)
    # Turn 1's tool ran; turn 2 asked for a third turn: cut, its tool not run.
    assert stats.turns_N.tolist() == [2]
    assert env.tool_calls == 1 and stats.tool_calls_N.tolist() == [1]
    assert stats.truncated_N.tolist() == [mt.TRUNC_TURNS]
    assert int(rollout.finish_N[0]) == FINISH_LENGTH
    assert stats.parts["correct"].tolist() == [0.0]
    L = len(tok.encode(call("add", a=1, b=1)))
    assert int(rollout.lengths_N[0]) == 2 * L + len(tok.encode(FMT.wrap("2")))


def test_the_token_budget_cuts_inside_a_turn_and_drops_an_observation_that_does_not_fit(tok):
    one = call("add", a=1, b=1)
    obs = len(tok.encode(FMT.wrap("2")))
    # T ends inside the second turn.
    T = len(tok.encode(one)) + obs + 10
    rollout, stats, _ = _run(tok, [one * 3], [AddEnv()], T=T, K=8)
    assert int(rollout.lengths_N[0]) == T
    assert stats.truncated_N.tolist() == [mt.TRUNC_TOKENS]
    assert int(rollout.finish_N[0]) == FINISH_LENGTH
    assert int(rollout.injected_NT[0].sum()) == obs
    # The observation would leave no room for a sampled token: dropped, the row cut.
    T = len(tok.encode(one)) + obs
    rollout, stats, _ = _run(tok, [one * 3], [AddEnv()], T=T, K=8)
    assert int(rollout.lengths_N[0]) == len(tok.encode(one))
    assert not rollout.injected_NT.any()
    assert stats.truncated_N.tolist() == [mt.TRUNC_TOKENS]


def test_tools_run_concurrently_and_the_metrics_add_up(tok):
    N, delay = 4, 0.3
    scripts = [call("add", a=3, b=4) + "\\boxed{7}" + tok.decode([tok.eos_ids[0]])] * N
    envs = [AddEnv(delay) for _ in range(N)]
    decode = ScriptedDecode(tok, scripts, K=128)
    rollout, stats = mt.run_episodes(
        decode,
        envs,
        [EXAMPLE, EXAMPLE],
        tok,
        mt.EpisodeConfig(max_new_tokens=400, tool_workers=N),
        (64,),
        tok.pad_id,
    )
    assert stats.tool_calls_N.tolist() == [1] * N
    assert np.all(stats.tool_seconds_N >= delay)
    # Four 0.3 s tools in parallel: the rounds waited for about one of them, not four.
    assert stats.tool_wait_seconds < 2 * delay
    assert stats.decode_seconds > 0 and stats.rounds == 2
    m = stats.metrics()
    assert m["episode/turns"] == 2 and m["episode/tool_calls"] == 1
    assert m["episode/tool_errors"] == 0 and m["episode/truncated_tokens"] == 0
    assert m["episode/tool_seconds"] == pytest.approx(stats.tool_seconds_N.sum())
    assert np.asarray(rollout.finish_N).tolist() == [FINISH_EOS] * N


def test_overlapped_tools_give_the_same_episodes(tok):
    scripts = [call("add", a=3, b=4) + "\\boxed{7}" + tok.decode([tok.eos_ids[0]])] * 2
    out = []
    for overlap in (False, True):
        envs = [AddEnv(0.05 * (n + 1)) for n in range(2)]
        rollout, stats = mt.run_episodes(
            ScriptedDecode(tok, scripts, K=128),
            envs,
            [EXAMPLE],
            tok,
            mt.EpisodeConfig(max_new_tokens=400, overlap_tools=overlap),
            (64,),
            tok.pad_id,
        )
        out.append((jax.device_get(rollout), stats))
    (a, sa), (b, sb) = out
    np.testing.assert_array_equal(a.tokens_NT, b.tokens_NT)
    np.testing.assert_array_equal(a.injected_NT, b.injected_NT)
    assert sa.parts["correct"].tolist() == sb.parts["correct"].tolist() == [1.0, 1.0]


def test_the_time_budget_cuts_running_rows(tok):
    script = call("add", a=1, b=1) * 10
    rollout, stats, _ = _run(tok, [script], [AddEnv(0.2)], T=2000, K=64, time_budget_s=0.3)
    assert stats.truncated_N.tolist() == [mt.TRUNC_TIME]
    assert 1 <= stats.tool_calls_N[0] <= 3
    assert int(rollout.finish_N[0]) == FINISH_LENGTH


class EchoEnv:
    """Every turn calls a tool whose observation is `OBS` (ids given by `IdTok`)."""

    def reset(self, example):
        return "prompt"

    def step(self, action_text):
        return StepResult("obs", False, {"correct": 0.0}, tool_calls=1)

    def truncate(self):
        return {"correct": 0.0}


class IdTok:
    """Text is ids spelled out; the prompt and observations are fixed id lists."""

    fixed = {"prompt": [5, 9, 100, 3, 17, 42], FMT.wrap("obs"): [7, 8, 120, 11]}

    def encode(self, text):
        return list(self.fixed[text])

    def decode(self, ids):
        return " ".join(str(int(i)) for i in ids)


def test_sampled_logp_equals_the_teacher_forced_forward_over_the_trajectory(tmp_path):
    make_tiny_hf("qwen2", tmp_path)
    params, cfg = hf.load_hf(tmp_path)
    # A common token ends tool calls, so every row makes several turns within 48 tokens.
    scfg = SamplerConfig(
        max_new_tokens=6, eos_ids=(3,), stop_sequences=tuple((t,) for t in range(60, 76))
    )
    decode = mt.sampler_decode(params, cfg, scfg, (64,), 0, jax.random.key(0))
    N = 4
    rollout, stats = mt.run_episodes(
        decode,
        [EchoEnv() for _ in range(N)],
        [EXAMPLE, EXAMPLE],
        IdTok(),
        mt.EpisodeConfig(max_new_tokens=48, max_turns=8),
        (8,),
        0,
    )
    r = jax.device_get(rollout)
    injected = np.asarray(r.injected_NT)
    assert stats.tool_calls_N.sum() >= N and injected.any()
    want = teacher_forced_logp(params, cfg, rollout)
    sampled = np.asarray(r.mask_NT) & ~injected
    assert sampled.sum() > 40
    np.testing.assert_allclose(r.logp_NT[sampled], want[sampled], atol=1e-4)
    # Each observation is the fixed ids, right after a tool-call stop token.
    for n in range(N):
        t, inj = r.tokens_NT[n], injected[n]
        starts = np.flatnonzero(inj & ~np.roll(inj, 1))
        for s in starts:
            assert 60 <= t[s - 1] < 76
            np.testing.assert_array_equal(t[s : s + 4], [7, 8, 120, 11])
    assert set(np.asarray(r.finish_N).tolist()) <= {FINISH_EOS, FINISH_LENGTH, FINISH_STOP}
