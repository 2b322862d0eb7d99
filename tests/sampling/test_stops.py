"""End ids, stop sequences, padding and the think budget, on the scripted model (exact by
construction)."""

from __future__ import annotations

import jax
import numpy as np

from rlvr_jax.sampling.config import SamplerConfig
from rlvr_jax.sampling.loop import sample
from rlvr_jax.types import FINISH_EOS, FINISH_LENGTH, FINISH_STOP
from tests.sampling.fixtures import chain_table, left_pad, scripted_model, teacher_forced_logp

STOP_CHAIN = {
    30: 31,
    10: 11,
    11: 12,
    12: 13,
    13: 14,
    14: 15,
    15: 31,
    2: 3,
    3: 4,
    4: 5,
    5: 2,
    19: 20,
    20: 21,
    21: 22,
    22: 23,
    23: 24,
    24: 22,
}


def test_stops_at_the_edges():
    params, cfg = scripted_model(chain_table(STOP_CHAIN, 32))
    prompts = [[7, 30], [10], [1, 2], [19], [4, 20]]
    prompt, lengths = left_pad(prompts)
    T = 6
    scfg = SamplerConfig(
        max_new_tokens=T, eos_ids=(31, 29), stop_sequences=((20, 21),), method="greedy"
    )
    r = sample(params, prompt, lengths, jax.random.key(0), cfg, scfg)
    want = [
        [31, 0, 0, 0, 0, 0],  # eos on the first step
        [11, 12, 13, 14, 15, 31],  # eos on the last step
        [3, 4, 5, 2, 3, 4],  # never stops
        [20, 21, 0, 0, 0, 0],  # stop sequence
        [21, 22, 23, 24, 22, 23],  # (20, 21) spans the prompt: no stop
    ]
    np.testing.assert_array_equal(np.asarray(r.tokens_NT), want)
    assert np.asarray(r.lengths_N).tolist() == [1, 6, 6, 2, 6]
    assert np.asarray(r.finish_N).tolist() == [
        FINISH_EOS,
        FINISH_EOS,
        FINISH_LENGTH,
        FINISH_STOP,
        FINISH_LENGTH,
    ]
    mask = np.asarray(r.mask_NT)
    np.testing.assert_array_equal(mask, np.arange(T)[None] < np.asarray(r.lengths_N)[:, None])
    logp = np.asarray(r.logp_NT)
    assert (logp[~mask] == 0).all() and (logp[mask] < 0).all()
    np.testing.assert_allclose(
        logp, np.where(mask, teacher_forced_logp(params, cfg, r), 0), atol=1e-5
    )
    assert not np.asarray(r.injected_NT).any()


def test_early_exit_when_every_row_stops():
    params, cfg = scripted_model(chain_table(STOP_CHAIN, 32))
    prompt, lengths = left_pad([[30], [19]])
    scfg = SamplerConfig(
        max_new_tokens=50, eos_ids=(31,), stop_sequences=((20, 21),), method="greedy"
    )
    r = sample(params, prompt, lengths, jax.random.key(0), cfg, scfg)
    assert np.asarray(r.lengths_N).tolist() == [1, 2]
    assert (np.asarray(r.tokens_NT)[:, 2:] == 0).all()


THINK_CHAIN = {
    4: 5,
    5: 9,
    9: 10,
    10: 11,
    11: 12,
    12: 13,
    13: 13,
    6: 14,
    14: 15,
    15: 16,
    16: 14,
    21: 22,
    22: 6,
    25: 26,
    26: 25,
    27: 8,
}


def test_think_budget_injects_the_early_stop_text():
    params, cfg = scripted_model(chain_table(THINK_CHAIN, 32))
    prompts = [
        [1, 4],  # generates the opener, then 3 tokens, then the injection
        [1, 5],  # the prompt opens the block: the budget counts from the first token
        [5, 21],  # opened in the prompt, closed by the model within budget
        [1, 25],  # never thinks
        [5, 6, 9],  # the prompt opened and closed a block
        [1, 27],  # samples 8, an eos id, which stops it; the injected 8 above does not
    ]
    prompt, lengths = left_pad(prompts)
    scfg = SamplerConfig(
        max_new_tokens=12,
        method="greedy",
        eos_ids=(8,),
        think_open=(5,),
        think_close=(6,),
        think_budget=3,
        think_stop=(7, 8, 6),
    )
    r = sample(params, prompt, lengths, jax.random.key(0), cfg, scfg)
    want = [
        [5, 9, 10, 11, 7, 8, 6, 14, 15, 16, 14, 15],
        [9, 10, 11, 7, 8, 6, 14, 15, 16, 14, 15, 16],
        [22, 6, 14, 15, 16, 14, 15, 16, 14, 15, 16, 14],
        [26, 25, 26, 25, 26, 25, 26, 25, 26, 25, 26, 25],
        [10, 11, 12, 13, 13, 13, 13, 13, 13, 13, 13, 13],
        [8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    ]
    np.testing.assert_array_equal(np.asarray(r.tokens_NT), want)
    injected = np.zeros((6, 12), bool)
    injected[0, 4:7] = injected[1, 3:6] = True
    np.testing.assert_array_equal(np.asarray(r.injected_NT), injected)
    logp = np.asarray(r.logp_NT)
    assert (logp[injected] == 0).all() and (logp[np.asarray(r.mask_NT) & ~injected] < 0).all()
    assert np.asarray(r.lengths_N).tolist() == [12, 12, 12, 12, 12, 1]
    assert np.asarray(r.finish_N).tolist()[5] == FINISH_EOS
    # The injected text is context: what follows it is the model's answer to it.
    np.testing.assert_allclose(
        np.where(injected, 0, logp),
        np.where(injected | ~np.asarray(r.mask_NT), 0, teacher_forced_logp(params, cfg, r)),
        atol=1e-5,
    )
