"""Learned reward parts: a reward model trained on a synthetic preference (shorter answers)
learns it, and as the "preference" part of a task it rewards the preferred response more; a
generative judge's verdict becomes the "judge" part through the sampler."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax.data.example import Example
from rlvr_jax.data.preferences import make_pair_batch
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs.learned_rewards import JudgeTask, RewardModelTask, with_learned_rewards
from rlvr_jax.envs.task import Task, host_rewards
from rlvr_jax.model.config import PRESETS
from rlvr_jax.model.transformer import init_params
from rlvr_jax.rewards import judge as judge_lib
from rlvr_jax.rewards import reward_model as rm
from rlvr_jax.rewards.config import RewardSettings
from rlvr_jax.rl import state as state_lib
from rlvr_jax.types import FINISH_EOS, Rollout

CFG = PRESETS["tiny"].replace(vocab_size=16, num_layers=1)
EOS, PAD = 1, 0


class ZeroTask(Task):
    """A verifier that gives every row 0, so that only the learned part moves the reward."""

    name = "zero"

    def part_names(self):
        return ("correct",)

    def score(self, rollout, examples_N):
        return {"correct": np.zeros(rollout.tokens_NT.shape[0], np.float32)}


def _short_vs_long(rng, n):
    """Pairs over a random 3-token prompt: the chosen answer has 1-3 tokens, the rejected 5-8."""
    chosen, rejected = [], []
    for _ in range(n):
        prompt = rng.integers(2, 12, 3).tolist()
        chosen.append(prompt + rng.integers(2, 12, rng.integers(1, 4)).tolist() + [EOS])
        rejected.append(prompt + rng.integers(2, 12, rng.integers(5, 9)).tolist() + [EOS])
    return chosen, rejected


def _batch(chosen, rejected):
    arrays = make_pair_batch(chosen, rejected, (16,), PAD)
    return rm.PairBatch(**{k: jnp.asarray(v) for k, v in arrays.items()})


@pytest.fixture(scope="module")
def trained():
    """A one-layer reward model after 15 updates of 32 pairs, and its held-out evaluation."""
    rng = np.random.default_rng(0)
    optim = state_lib.OptimConfig(learning_rate=3e-3, schedule="constant")
    opt = state_lib.make_optimizer(optim)
    params = rm.init_reward_model(init_params(jax.random.key(0), CFG))
    state = state_lib.init_train_state(params, opt, jax.random.key(1), use_reference=False)
    step = rm.build_rm_step(CFG, opt, state_lib.learning_rate_schedule(optim))
    evaluate = rm.build_rm_eval(CFG)
    held = _batch(*_short_vs_long(rng, 128))
    before = evaluate(state.params, held)
    for _ in range(15):
        state, _ = step(state, _batch(*_short_vs_long(rng, 32)))
    return state, before, evaluate(state.params, held)


def test_a_reward_model_learns_to_prefer_shorter_answers(trained):
    state, (loss0, before), (loss, after) = trained
    np.testing.assert_allclose(loss0, math.log(2), rtol=1e-6)  # a zero head ties every pair
    assert float(before["rm/accuracy"]) == 0.0
    assert float(after["rm/accuracy"]) > 0.9, after  # held-out pairs, chance is 0.5
    assert float(loss) < 0.3
    assert int(state.step) == 15


def _rollout(prompt, responses, T=10):
    N = len(responses)
    tokens = np.full((N, T), PAD, np.int32)
    mask = np.zeros((N, T), bool)
    for i, r in enumerate(responses):
        tokens[i, : len(r)] = r
        mask[i, : len(r)] = True
    return Rollout(
        prompt_NP=jnp.asarray([prompt] * N, jnp.int32),
        prompt_lengths_N=jnp.full((N,), len(prompt), jnp.int32),
        tokens_NT=jnp.asarray(tokens),
        logp_NT=jnp.zeros((N, T)),
        mask_NT=jnp.asarray(mask),
        injected_NT=jnp.zeros((N, T), bool),
        lengths_N=jnp.asarray([len(r) for r in responses], jnp.int32),
        finish_N=jnp.full((N,), FINISH_EOS, jnp.int32),
    )


def test_the_preference_part_rewards_the_preferred_response_more(trained):
    state = trained[0]
    # One prompt, G = 4 responses: two short (preferred), two long.
    rollout = _rollout([4, 7, 9], [[5, EOS], [6, 3, EOS], [5, 8, 2, 9, 3, 7, EOS], [3] * 7 + [EOS]])
    examples = [Example("q", "479", "", "test")] * 4
    reward = RewardSettings(rm_weight=2.0)
    task = RewardModelTask(ZeroTask(), state.params, CFG, norm="none")
    assert task.jax_parts is None and task.name == "zero"  # the host path, one interface
    rewards, parts = host_rewards(task, rollout, examples, reward, G=4)
    assert tuple(parts) == task.part_names() == ("correct", "preference")
    pref = parts["preference"]
    assert min(pref[:2]) > max(pref[2:]), pref
    np.testing.assert_allclose(rewards, 2.0 * pref, rtol=1e-6)
    # Whitened over the rows: the same order, mean 0, std 1.
    task = RewardModelTask(ZeroTask(), state.params, CFG, norm="batch")
    _, parts = host_rewards(task, rollout, examples, reward, G=4)
    np.testing.assert_array_equal(np.argsort(parts["preference"]), np.argsort(pref))
    np.testing.assert_allclose(
        [parts["preference"].mean(), parts["preference"].std()], [0, 1], atol=1e-4
    )


def test_a_judge_verdict_is_a_reward_part_through_the_sampler():
    tok = Tokenizer.from_characters("0123456789+QRA=")
    cfg = PRESETS["tiny"].replace(vocab_size=32, num_layers=1)
    params = init_params(jax.random.key(3), cfg)
    reward = RewardSettings(
        judge_model="policy",
        judge_template="Q{question}R{response}A",
        judge_verdict="score",
        judge_max_score=9,
        judge_tokens=3,
        judge_weight=0.5,
    )
    task = with_learned_rewards(ZeroTask(), reward, judge=(params, cfg, tok), batch_prompts=2)
    assert isinstance(task, JudgeTask)
    responses = [tok.encode("12") + [tok.eos_ids[0]], tok.encode("345") + [tok.eos_ids[0]]]
    rollout = _rollout(tok.encode("1+1="), responses)
    examples = [Example("q", "1+1", "2", "test")] * 2
    rewards, parts = host_rewards(task, rollout, examples, reward, G=2)
    # The same prompts, judged again: greedy, so the same answers, parsed the same way.
    answers = task.verdict_texts(["Q1+1R12A", "Q1+1R345A"])
    want = [judge_lib.parse_verdict(a, "score", 9) or 0.0 for a in answers]
    np.testing.assert_allclose(parts["judge"], want, rtol=1e-6)
    np.testing.assert_allclose(rewards, 0.5 * np.asarray(want), rtol=1e-6)
    stats = task.stats()
    assert stats["judge/checks"] == 2
    assert stats["judge/no_verdict"] == sum(
        judge_lib.parse_verdict(a, "score", 9) is None for a in answers
    )
