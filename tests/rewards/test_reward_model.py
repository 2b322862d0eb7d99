"""The reward model: the Bradley-Terry loss by hand, scores at the last real token, and the
preference pairs' loader (training on a synthetic preference: envs/test_learned_rewards.py)."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax.data import templates
from rlvr_jax.data.preferences import (
    PreferencePair,
    encode_pairs,
    load_preferences,
    make_pair_batch,
)
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.model.config import PRESETS
from rlvr_jax.model.heads import ScalarHead
from rlvr_jax.model.transformer import init_params
from rlvr_jax.rewards import reward_model as rm
from rlvr_jax.types import Rollout

CFG = PRESETS["tiny"].replace(vocab_size=16, num_layers=1)
_scores = jax.jit(rm.sequence_scores, static_argnums=4)
_rollout_scores = jax.jit(rm.rollout_scores, static_argnums=2)


def test_pairwise_loss_by_hand():
    chosen = jnp.array([2.0, 0.0, -1.0, 30.0])
    rejected = jnp.array([0.0, 0.0, 1.0, -30.0])
    loss, m = rm.pairwise_loss(chosen, rejected)
    # -log sigmoid(d) = log(1 + e^-d) for d = 2, 0, -2, 60.
    want = [
        math.log1p(math.exp(-2)),
        math.log(2),
        math.log1p(math.exp(2)),
        math.log1p(math.exp(-60)),
    ]
    np.testing.assert_allclose(loss, np.mean(want), rtol=1e-6)
    assert float(m["rm/accuracy"]) == 0.5  # d > 0 for 2 of 4 (a tie is not a win)
    np.testing.assert_allclose(m["rm/margin"], (2 + 0 - 2 + 60) / 4)
    # The gradient is sigmoid(-d) towards a larger margin: 1 - sigmoid(2) for the first pair.
    g = jax.grad(lambda c: rm.pairwise_loss(c, rejected)[0])(chosen)
    np.testing.assert_allclose(g[0], -(1 - 1 / (1 + math.exp(-2))) / 4, rtol=1e-6)
    # A margin of -1000 stays finite (softplus, not log(sigmoid)).
    assert np.isfinite(float(rm.pairwise_loss(jnp.array([-500.0]), jnp.array([500.0]))[0]))


def test_scores_read_the_last_real_token_whatever_the_padding():
    params = rm.init_reward_model(init_params(jax.random.key(0), CFG))
    head = ScalarHead(jax.random.normal(jax.random.key(1), (CFG.embed_dim,)), jnp.array(0.5))
    params = rm.RewardModelParams(params.backbone, head)
    seq = [3, 4, 5, 6, 1]
    right = np.array([seq + [0, 0]], np.int32)
    left = np.array([[0, 0] + seq], np.int32)
    s_right = _scores(params, jnp.asarray(right), jnp.asarray(right > 0), jnp.array([4]), CFG)
    s_left = _scores(params, jnp.asarray(left), jnp.asarray(left > 0), jnp.array([6]), CFG)
    np.testing.assert_allclose(s_right, s_left, rtol=1e-5, atol=1e-5)
    # A rollout row (left-padded prompt, then the response) scores as the same sequence.
    rollout = Rollout(
        prompt_NP=jnp.array([[0, 3, 4]]),
        prompt_lengths_N=jnp.array([2]),
        tokens_NT=jnp.array([[5, 6, 1, 0]]),
        logp_NT=jnp.zeros((1, 4)),
        mask_NT=jnp.array([[True, True, True, False]]),
        injected_NT=jnp.zeros((1, 4), bool),
        lengths_N=jnp.array([3]),
        finish_N=jnp.array([1]),
    )
    np.testing.assert_allclose(_rollout_scores(params, rollout, CFG), s_right, rtol=1e-5, atol=1e-5)


def _write(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")


def test_the_loader_counts_and_names_bad_rows(tmp_path):
    path = tmp_path / "prefs.jsonl"
    good = {"prompt": "2+2", "chosen": "4", "rejected": "5"}
    _write(
        path,
        [
            good,
            "{not json",
            {"prompt": "1+1", "chosen": "2"},
            {"prompt": "1+1", "chosen": "", "rejected": "3"},
            {"prompt": "1+1", "chosen": "2", "rejected": "2"},
            [1, 2],
            {**good, "id": "x"},
        ],
    )
    pairs, report = load_preferences(path)
    assert [p.id for p in pairs] == ["prefs/0", "x"]
    assert report.skipped == {
        "bad_json": 1,
        "missing_field": 1,
        "empty_chosen": 1,
        "same_responses": 1,
        "not_an_object": 1,
    }
    summary = report.summary()
    assert "missing_field: 1 (lines 3)" in summary and "same_responses: 1 (lines 5)" in summary
    with pytest.raises(FileNotFoundError):
        load_preferences(tmp_path / "missing.jsonl")


def test_pairs_encode_as_the_sampler_writes_them():
    tok = Tokenizer.from_characters("0123456789+=")
    items = [PreferencePair("a", "2+2", "4", "22"), PreferencePair("b", "9+9", "18", "1" * 40)]
    enc = encode_pairs(items, templates.get_template("text:{question}="), tok, 12)
    assert enc.num_too_long == 1 and enc.too_long_ids == ("b",)
    end = tok.eos_ids[0]
    assert enc.chosen == [tok.encode("2+2=") + tok.encode("4") + [end]]
    assert enc.rejected == [tok.encode("2+2=") + tok.encode("22") + [end]]
    b = make_pair_batch(enc.chosen, enc.rejected, (4, 8), tok.pad_id)
    assert b["tokens_MS"].shape == (2, 8)
    np.testing.assert_array_equal(b["last_M"], [5, 6])
    np.testing.assert_array_equal(b["mask_MS"].sum(1), [6, 7])
