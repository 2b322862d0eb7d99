"""Evaluation of a multi-turn task: its episodes run (tools answer), then `Task.score`, through
the same `generate_and_score` as every task, on a tiny random model."""

from __future__ import annotations

import string

import jax
import numpy as np
import pytest

from configs import tiny
from rlvr_jax.data.example import Example
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs.environment import StepResult, ToolResponseFormat
from rlvr_jax.envs.tool_math import MathToolEnv, MathToolTask
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.evals import evaluation
from rlvr_jax.program.parts import build
from tests.envs.fixtures import QWEN_STYLE

ALPHABET = string.printable
STOPS = "!abcdefgh"  # common enough that a random model's rows stop on them


class CountingEnv(MathToolEnv):
    """Answers every turn that ends on a stop token, and counts its steps."""

    steps = 0

    def step(self, action_text: str) -> StepResult:
        CountingEnv.steps += 1
        if action_text[-1:] in STOPS:
            return StepResult("ok", False, {"correct": 0.0}, tool_calls=1)
        return super().step(action_text)


class Task(MathToolTask):
    """Scores a row 1 when its episode got an observation (an injected token), so the verdict
    shows that the evaluator scored the episodes' rollout."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.created = 0

    def environment(self):
        self.created += 1
        return CountingEnv(self.tok, verify=lambda t, g: 0.0, system="Tools.")

    def score(self, rollout, examples_N):
        injected_N = np.asarray(jax.device_get(rollout.injected_NT)).any(axis=1)
        return {"correct": injected_N.astype(np.float32)}


@pytest.mark.slow
def test_the_evaluator_runs_episodes_for_a_multi_turn_task():
    c = tiny.get_config()
    c.model.tokenizer = "chars:" + ALPHABET
    c.data.buckets = (128,)
    c.reward.verifier = "math_tool"
    c.reward.format_weight = 0.0
    c.reward.max_turns = 3
    c.reward.turn_tokens = 4
    c.reward.workers = 1
    c.rl.sampler.max_new_tokens = 12
    s = settings_lib.settings_from_config(c)
    _, params, model_cfg, s = build.policy_and_settings(s)
    tok = Tokenizer.from_characters(ALPHABET, chat_template=QWEN_STYLE)
    examples = [Example(f"q/{i}", f"{i}+1?", str(i + 1), "test") for i in range(3)]
    ids = [tok.encode(ex.prompt_text) for ex in examples]
    with Task(tok, s.reward) as task:
        task.stop_sequences = tuple((i,) for i in tok.encode(STOPS))
        task.response_format = ToolResponseFormat("[", "]")
        sampler_cfg = build.sampler_config(s, tok)
        episodes = []
        correct_BG, lengths_BG, truncated_BG = evaluation.generate_and_score(
            params,
            model_cfg,
            task,
            ids,
            examples,
            sampler_cfg,
            2,
            s.data.buckets,
            tok.pad_id,
            2,
            episodes=episodes,
        )
        # Two batches of 2 prompts x 2 episodes (the last batch padded by repetition).
        assert task.created == 8
    assert correct_BG.shape == lengths_BG.shape == truncated_BG.shape == (3, 2)
    assert CountingEnv.steps > 0
    assert correct_BG.any(), "no episode got an observation: the tools did not run"
    assert (lengths_BG <= 12).all()
    # The episodes' counts, padding rows left out: an episode called a tool exactly when it got
    # an observation (what this task scores).
    assert [len(e["tool_calls"]) for e in episodes] == [4, 2]
    metrics = evaluation.episode_metrics(episodes)
    assert metrics["tool_call_rate"] == pytest.approx(float(np.mean(correct_BG)))
    assert metrics["tool_calls"] >= metrics["tool_call_rate"]
    assert metrics["turns"] >= 1.0
