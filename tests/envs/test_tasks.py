"""The task interface: every verifier answers through `Task.score`, the in-graph one also in JAX,
and `reward.verifier` selects each of them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax.data.example import Example
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs.single_turn import ArithmeticTask, CountdownTask, MathTask, build_task
from rlvr_jax.envs.task import host_part_shapes, host_rewards, jax_reward_fn, shape_rewards
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.rewards.config import RewardSettings
from rlvr_jax.types import FINISH_EOS, FINISH_LENGTH, Rollout

ALPHABET = "0123456789+-*/=() <>answerbxd{}\\"


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_characters(ALPHABET)


def _rollout(tok, texts, ended=True, T=40):
    """A rollout whose responses are `texts`, each followed by the end token when `ended`."""
    rows = [tok.encode(t) + ([tok.eos_ids[0]] if ended else []) for t in texts]
    tokens = np.full((len(rows), T), tok.pad_id, np.int32)
    mask = np.zeros((len(rows), T), bool)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = r
        mask[i, : len(r)] = True
    N = len(rows)
    return Rollout(
        prompt_NP=jnp.ones((N, 2), jnp.int32),
        prompt_lengths_N=jnp.full((N,), 2, jnp.int32),
        tokens_NT=jnp.asarray(tokens),
        logp_NT=jnp.zeros((N, T)),
        mask_NT=jnp.asarray(mask),
        injected_NT=jnp.zeros((N, T), bool),
        lengths_N=jnp.asarray([len(r) for r in rows], jnp.int32),
        finish_N=jnp.full((N,), FINISH_EOS if ended else FINISH_LENGTH, jnp.int32),
    )


def _examples(answers):
    return [Example(f"e{i}", "q", a, "test") for i, a in enumerate(answers)]


def test_arithmetic_task_scores_the_same_on_the_host_and_in_jax(tok):
    examples = _examples(["15", "-3", "7", "12"])
    task = build_task(RewardSettings(), tok, tok.vocab_size, examples, "plain")
    assert isinstance(task, ArithmeticTask) and task.jax_parts is not None
    rollout = _rollout(tok, ["7+8=15", "x -3", "6", "1 12"])
    host = task.score(rollout, examples)
    np.testing.assert_array_equal(host["correct"], [1, 1, 0, 1])
    assert tuple(host) == task.part_names()
    in_jax = jax.jit(task.jax_parts)(rollout, task.targets(examples))
    for k, v in host.items():
        np.testing.assert_array_equal(np.asarray(in_jax[k]), v)


def test_arithmetic_task_names_a_non_integer_answer(tok):
    with pytest.raises(ValueError, match=r"example 'e1' has '1/2'"):
        build_task(RewardSettings(), tok, tok.vocab_size, _examples(["3", "1/2"]), "plain")


def test_the_fused_reward_equals_the_host_reward(tok):
    reward = RewardSettings(format_weight=0.5, length_weight=0.1, overlong_cache=4)
    examples = _examples(["15", "15", "4", "4"])
    task = build_task(reward, tok, tok.vocab_size, examples, "plain")
    rollout = _rollout(tok, ["15", "2 15", "4", "x"])
    fused, fused_parts = jax.jit(jax_reward_fn(task, reward, 2))(rollout, task.targets(examples))
    host, host_parts = host_rewards(task, rollout, examples, reward, 2)
    np.testing.assert_allclose(np.asarray(fused), host, rtol=1e-6)
    assert set(host_parts) == {"correct", "format", "length", "overlong"} == set(fused_parts)
    # What the host path compiles its update for ahead of the first step.
    N, T = rollout.tokens_NT.shape
    rewards, parts = host_part_shapes(task, reward, 2, N, T)
    assert (rewards.shape, rewards.dtype) == (host.shape, host.dtype)
    assert {k: (v.shape, v.dtype) for k, v in parts.items()} == {
        k: (v.shape, v.dtype) for k, v in host_parts.items()
    }


def test_shaping_weights_only_the_configured_parts():
    parts = {"correct": jnp.asarray([1.0, 0.0]), "format": jnp.asarray([1.0, 1.0])}
    lengths = jnp.asarray([3, 5])
    rewards, _ = shape_rewards(parts, lengths, RewardSettings(format_weight=0.5), 2, 8)
    np.testing.assert_allclose(np.asarray(rewards), [1.5, 0.5])
    rewards, _ = shape_rewards(parts, lengths, RewardSettings(format="none"), 2, 8)
    np.testing.assert_allclose(np.asarray(rewards), [1.0, 0.0])


def test_a_host_task_has_no_jax_reward(tok):
    task = MathTask.__new__(MathTask)
    assert task.jax_parts is None
    with pytest.raises(ValueError, match="verifies on the host"):
        jax_reward_fn(task, RewardSettings(verifier="math"), 2)


def test_countdown_is_selected_by_the_settings_and_wants_an_expression(tok):
    config = settings_lib.default_config()
    config.data.name = "countdown"
    config.reward.verifier = "countdown"
    settings = settings_lib.settings_from_config(config, check_devices=False)
    assert settings.reward.verifier == "countdown" and settings.reward.format == "none"
    gold = "(3 + 5) * 2"
    reward = RewardSettings(verifier="countdown", workers=1)
    with build_task(reward, tok, tok.vocab_size, [], "plain") as task:
        assert isinstance(task, CountdownTask) and task.jax_parts is None
        rollout = _rollout(
            tok,
            [
                "<answer>(3 + 5) * 2</answer>",  # the gold expression
                "<answer>2 * (5 + 3)</answer>",  # another expression with the same numbers
                "<answer>16</answer>",  # the bare target
                "<answer>(3 + 3) * 2</answer>",  # a number reused, one left out
                "<answer>(3 + 5) + 2</answer>",  # the wrong value
            ],
        )
        parts = task.score(rollout, _examples([gold] * 5))
        np.testing.assert_array_equal(parts["correct"], [1, 1, 0, 0, 0])
        assert task.stats()["verifier/checks"] == 5
        assert tuple(parts) == task.part_names() == ("correct",)


def test_the_mode_format_scores_each_response_against_its_prompts_mode():
    tok = Tokenizer.from_characters(ALPHABET + "thik")
    reward = RewardSettings(verifier="math", format="mode", workers=1)
    examples = [
        Example(f"m{i}", "q", "5", "test", meta={"think": think})
        for i, think in enumerate([True, True, False, False])
    ]
    texts = ["<think>x</think>5", "5", "5", "<think>x</think>5"]
    with build_task(reward, tok, tok.vocab_size, examples, "plain") as task:
        parts = task.score(_rollout(tok, texts), examples)
    np.testing.assert_array_equal(parts["format"], [1, 0, 1, 0])
    assert tuple(parts) == task.part_names() == ("correct", "format")
