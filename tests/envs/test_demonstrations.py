"""Scripted gold episodes for a supervised cold start: laid out exactly as the rollout runner
lays out the same turns, the observations left out of the loss, wrong and unscripted episodes
counted and dropped; the math tool's script through the real sandbox."""

from __future__ import annotations

import string

import numpy as np
import pytest

from rlvr_jax.data import datasets
from rlvr_jax.data.example import Example
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs import demonstrations, tool_math
from rlvr_jax.envs.environment import tool_call_text
from rlvr_jax.envs.task import MultiTurnTask
from rlvr_jax.rewards.config import RewardSettings
from rlvr_jax.sft import data as sft_data
from rlvr_jax.sft import step as sft_step
from tests.envs.fixtures import QWEN_STYLE
from tests.rl.test_multiturn import EXAMPLE, FMT, AddEnv, _run


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_characters(string.printable)


def _add_policy(answer: str | None = None):
    def policy(observation):
        if observation is None:
            return tool_call_text("add", {"a": 3, "b": 4})
        return f"So \\boxed{{{answer or observation}}}"

    return policy


def test_a_played_episode_is_the_rollout_runners_layout(tok):
    episode = demonstrations.play_episode((AddEnv(), _add_policy()), EXAMPLE, tok, FMT, 3)
    turns = [tool_call_text("add", {"a": 3, "b": 4}), "So \\boxed{7}"]
    script = "".join(turns) + tok.decode([tok.eos_ids[0]])
    rollout, stats, _ = _run(tok, [script], [AddEnv()], K=16)
    L = int(rollout.lengths_N[0])
    prompt = tok.encode(AddEnv().prompt(EXAMPLE))
    assert episode.prompt_length == len(prompt)
    assert episode.ids == prompt + rollout.tokens_NT[0, :L].tolist()
    # Trained: the model's tokens; the prompt and the observation are context.
    assert episode.trained == [False] * len(prompt) + (~rollout.injected_NT[0, :L]).tolist()
    assert sum(episode.trained) == len(tok.encode("".join(turns))) + 1  # the end id
    assert episode.parts == {"correct": 1.0, "tool_calls": 1.0, "tool_errors": 0.0}
    assert stats.parts["correct"].tolist() == [1.0]


def test_an_episode_that_does_not_end_is_an_error(tok):
    def policy(observation):
        return tool_call_text("add", {"a": 1, "b": 1})

    with pytest.raises(ValueError, match="did not end in 2 turns"):
        demonstrations.play_episode((AddEnv(), policy), EXAMPLE, tok, FMT, 2)


class _ScriptedTask(MultiTurnTask):
    """Scripts example "t/0" correctly, "t/1" with a wrong answer, and nothing for "t/2"."""

    name = "scripted"
    max_turns = 3
    response_format = FMT

    def __init__(self, tok):
        self.tok = tok

    def environment(self):
        return AddEnv()

    def demonstration(self, example):
        if example.id == "t/2":
            return None
        return AddEnv(), _add_policy("8" if example.id == "t/1" else None)

    def score(self, rollout, examples_N):
        raise AssertionError("a demonstration is scored by its environment, not by the task")


def test_wrong_unscripted_and_long_episodes_are_counted_and_dropped(tok):
    task = _ScriptedTask(tok)
    examples = [Example(f"t/{i}", "What is 3+4?", "7", "test") for i in range(3)]
    played = demonstrations.scripted_demonstrations(task, examples, max_len=1000, workers=2)
    assert [e.example_id for e in played.episodes] == ["t/0"]
    assert (played.no_script, played.not_correct, played.too_long) == (1, 1, 0)
    assert "1 scripted tool episodes" in played.summary()
    short = demonstrations.scripted_demonstrations(task, examples, max_len=20, workers=2)
    assert (len(short.episodes), short.too_long) == (0, 1)

    # As SFT rows: the loss covers the model's turns only.
    enc = sft_data.from_episodes(played, examples, max_len=1000)
    assert enc.ids == [played.episodes[0].ids] and enc.demos[0].id == "t/0"
    batch = sft_step.make_batch(enc.ids, enc.prompt_lengths, (1024,), 0, enc.trained)
    trained = np.asarray(played.episodes[0].trained)
    np.testing.assert_array_equal(batch.loss_mask_NT[0, : len(trained) - 1], trained[1:])
    assert not batch.loss_mask_NT[0, len(trained) - 1 :].any()
    assert enc.summary().startswith(f"1 demonstrations fit in 1000 tokens ({trained.sum()} ")


def test_make_batch_checks_the_trained_flags():
    with pytest.raises(ValueError, match="2 trained flags for 3 ids"):
        sft_step.make_batch([[5, 6, 1]], [1], (8,), 0, [[False, True]])
    batch = sft_step.make_batch([[5, 6, 7, 1]], [1], (8,), 0, [[False, True, False, True]])
    np.testing.assert_array_equal(batch.loss_mask_NT[0].astype(int), [1, 0, 1, 0, 0, 0, 0])


def test_the_math_tool_script_runs_in_the_sandbox():
    tok = Tokenizer.from_characters(string.printable, chat_template=QWEN_STYLE)
    examples = datasets.arithmetic_examples(4, seed=0, level=6)
    examples.append(Example("gsm/0", "Tom has 3 apples...", "3", "gsm8k"))
    reward = RewardSettings(
        verifier="math_tool", format="none", workers=1, max_turns=3, tool_system="Tools."
    )
    with tool_math.MathToolTask(tok, reward) as task:
        assert task.demonstration(examples[-1]) is None  # no expression to run
        played = demonstrations.scripted_demonstrations(task, examples, max_len=10_000)
    assert (len(played.episodes), played.no_script, played.not_correct) == (4, 1, 0)
    for ex, e in zip(examples, played.episodes, strict=False):
        text = tok.decode(e.ids)
        assert text.startswith("<|im_start|>system\nTools.<|im_end|>\n")
        call = tool_call_text("python", {"code": f"print({ex.meta['expression']})"})
        assert call + FMT.wrap(ex.answer) in text
        end = tok.decode([tok.eos_ids[0]])
        assert text.endswith(tool_math.ANSWER_TURN.format(answer=ex.answer) + end)
        assert e.parts == {"correct": 1.0, "tool_calls": 1.0, "tool_errors": 0.0}
