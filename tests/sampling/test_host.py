"""Host helpers: bucketing, completions, and batched generation over many prompts."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from rlvr_jax.sampling.config import SamplerConfig, sampling_params
from rlvr_jax.sampling.continuous import auto_slots
from rlvr_jax.sampling.host import bucket_and_pad, completions, generate_in_batches
from rlvr_jax.sampling.loop import generate, sample
from tests.sampling.fixtures import chain_table, left_pad, scripted_model


def test_bucket_and_pad():
    prompt, lengths = bucket_and_pad([[1, 2, 3], [4]], (2, 4, 8), pad_id=9, group_size=2)
    np.testing.assert_array_equal(prompt, [[9, 1, 2, 3], [9, 1, 2, 3], [9, 9, 9, 4], [9, 9, 9, 4]])
    assert lengths.tolist() == [3, 3, 1, 1] and prompt.dtype == np.int32
    with pytest.raises(ValueError, match="prompt 1 has 9 tokens, longer than the largest bucket 8"):
        bucket_and_pad([[1], list(range(9))], (4, 8), pad_id=0)
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        bucket_and_pad([[]], (4,), pad_id=0)
    with pytest.raises(ValueError, match="group_size=0"):
        bucket_and_pad([[1]], (4,), pad_id=0, group_size=0)


def test_completions_stop_at_each_rows_end():
    params, cfg = scripted_model(chain_table({30: 31, 10: 11, 11: 12}, 32, default=10))
    prompt, lengths = left_pad([[30], [10], [4]])
    scfg = SamplerConfig(4, method="greedy", eos_ids=(31,))
    r = sample(params, prompt, lengths, jax.random.key(0), cfg, scfg)
    assert completions(r) == [[31], [11, 12, 10, 11], [10, 11, 12, 10]]


# Five prompts in batches of two: the last batch holds prompt 4 and one padding repeat of it.
BATCH_PROMPTS = [[3, 1, 4], [1, 5], [9, 2, 6, 5], [3], [5, 8, 9, 7]]


def _random_model():
    """The scripted model on a random table: sampling then spreads over many tokens."""
    table = np.random.default_rng(1).normal(0, 2, (32, 32)).astype(np.float32)
    return scripted_model(table)


@pytest.mark.parametrize("num_slots", [None, 4])  # None: auto, the static sampler at 5 tokens
def test_generate_in_batches_equals_direct_generate_calls(num_slots):
    params, cfg = _random_model()
    B, G, seed = 2, 3, 11
    scfg = SamplerConfig(max_new_tokens=5, eos_ids=(7,))
    sp = sampling_params(B * G, temperature=0.8, top_p=0.9)
    seen = []

    def score(rollout, prompt_ids):
        seen.append(list(prompt_ids))
        return {"tokens": rollout.tokens_NT, "logp": rollout.logp_NT, "n": rollout.lengths_N}

    got = generate_in_batches(
        params,
        BATCH_PROMPTS,
        score,
        model_cfg=cfg,
        cfg=scfg,
        batch_prompts=B,
        buckets=(4, 8),
        pad_id=0,
        group_size=G,
        sp=sp,
        seed=seed,
        num_slots=num_slots,
    )
    assert seen == [[0, 1], [2, 3], [4, 4]]
    # Every prompt's G rows, in prompt order; the padding prompt's rows are gone.
    assert got["tokens"].shape == (len(BATCH_PROMPTS) * G, 5)
    assert isinstance(got["tokens"], np.ndarray)
    want = []
    for i, ids in enumerate(seen):
        prompt, lengths = bucket_and_pad([BATCH_PROMPTS[j] for j in ids], (4, 8), 0, group_size=G)
        r, _ = generate(
            params,
            prompt,
            lengths,
            jax.random.fold_in(jax.random.key(seed), i),
            sp,
            None,
            model_cfg=cfg,
            cfg=SamplerConfig(max_new_tokens=5, eos_ids=(7,), prompt_group=G),
        )
        want.append(r)
    cat = lambda f: np.concatenate([np.asarray(f(r)) for r in want])[: len(BATCH_PROMPTS) * G]
    np.testing.assert_array_equal(got["tokens"], cat(lambda r: r.tokens_NT))
    np.testing.assert_allclose(got["logp"], cat(lambda r: r.logp_NT), atol=1e-5)
    np.testing.assert_array_equal(got["n"], cat(lambda r: r.lengths_N))
    # The draws differ between the samples of a prompt and between batches.
    assert len({tuple(row) for row in got["tokens"].tolist()}) > len(BATCH_PROMPTS)


def test_generate_in_batches_keeps_prompt_order_and_drops_padding_rows():
    params, cfg = _random_model()
    scfg = SamplerConfig(max_new_tokens=2, method="greedy")

    def score(rollout, prompt_ids):
        # A per-row host value: the prompt each row was generated for.
        return np.repeat(np.asarray(prompt_ids), rollout.tokens_NT.shape[0] // len(prompt_ids))

    for B, G in [(2, 2), (8, 1)]:
        got = generate_in_batches(
            params,
            BATCH_PROMPTS,
            score,
            model_cfg=cfg,
            cfg=scfg,
            batch_prompts=B,
            buckets=(8,),
            pad_id=0,
            group_size=G,
        )
        np.testing.assert_array_equal(got, np.repeat(np.arange(len(BATCH_PROMPTS)), G))


def test_generate_in_batches_refuses_bad_arguments():
    params, cfg = _random_model()
    kw = dict(model_cfg=cfg, cfg=SamplerConfig(2), buckets=(8,), pad_id=0)
    score = lambda rollout, prompt_ids: rollout.lengths_N
    with pytest.raises(ValueError, match="no prompts"):
        generate_in_batches(params, [], score, batch_prompts=2, **kw)
    with pytest.raises(ValueError, match="batch_prompts=0"):
        generate_in_batches(params, [[1]], score, batch_prompts=0, **kw)
    with pytest.raises(ValueError, match="longer than the largest bucket"):
        generate_in_batches(params, [[1] * 9], score, batch_prompts=2, **kw)


def test_continuous_batching_is_automatic_for_long_answers_only():
    assert auto_slots(64, 512) == 64
    assert auto_slots(64, 4096) == 16
    assert auto_slots(4, 4096) == 4  # too few rows to share slots
