"""Continuous batching against the static sampler: the same rollout token for token, for every
slot count; the slot-step stats by hand; compilation; errors; sharding."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rlvr_jax.model import config as config_lib
from rlvr_jax.model import sharding
from rlvr_jax.model import transformer as tf
from rlvr_jax.sampling.config import SamplerConfig, SamplingParams, sampling_params
from rlvr_jax.sampling.continuous import (
    generate_continuous,
    sample_continuous,
    static_stats,
    summarize,
)
from rlvr_jax.sampling.host import bucket_and_pad
from rlvr_jax.sampling.loop import init_decode_cache, sample
from rlvr_jax.types import FINISH_EOS, FINISH_LENGTH, FINISH_STOP, Rollout
from tests.sampling.fixtures import PROMPTS, chain_table, left_pad, scripted_model
from tests.sampling.test_stops import THINK_CHAIN

FIELDS = ("tokens_NT", "mask_NT", "injected_NT", "lengths_N", "finish_N")


def assert_same_rollout(got: Rollout, want: Rollout) -> None:
    got, want = jax.device_get((got, want))
    for name in FIELDS:
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    np.testing.assert_allclose(got.logp_NT, want.logp_NT, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# The same rollout as the static sampler


# Picked on the tiny qwen2 model with key 3 so that the 8 rows end in all three ways and at
# lengths 1 to 10 (checked below): end ids 118 and 100, stop (0,) and the pair (51, 51), and
# max_new_tokens.
SAMPLED = SamplerConfig(
    max_new_tokens=10, eos_ids=(118, 100), stop_sequences=((0,), (51, 51)), attention_chunk=4
)


def sampled_rows(N: int) -> SamplingParams:
    """Per-row values, so that a slot reading another row's values would show."""
    top_p = [1.0, 0.9, 0.8, 1.0, 0.95, 1.0, 0.7, 1.0]
    min_p = [0.0, 0.0, 0.05, 0.0, 0.01, 0.0, 0.0, 0.02]
    return sampling_params(N, np.linspace(0.7, 1.3, N), top_p[:N], min_p[:N])


@pytest.fixture(scope="module")
def sampled(tiny):
    """(params, cfg, sampler config, prompts, lengths, the static sampler's rollout): 4 prompts
    x 2 samples, one prefill per group."""
    _, params, cfg = tiny("qwen2")
    prompt, lengths = bucket_and_pad(PROMPTS, (16,), pad_id=0, group_size=2)
    scfg = dataclasses.replace(SAMPLED, prompt_group=2)
    want = sample(params, prompt, lengths, jax.random.key(3), cfg, scfg, sampled_rows(8))
    finish, lengths_out = np.asarray(want.finish_N), np.asarray(want.lengths_N)
    assert set(finish) == {FINISH_EOS, FINISH_STOP, FINISH_LENGTH}, finish
    assert lengths_out.min() == 1 and lengths_out.max() == 10, lengths_out
    return params, cfg, scfg, prompt, lengths, want


@pytest.mark.parametrize("num_slots", [4, 2])  # N/2, N/4; the greedy test has N and 3 of 10
def test_sampled_rollout_equals_static(sampled, num_slots):
    params, cfg, scfg, prompt, lengths, want = sampled
    got, stats = sample_continuous(
        params, prompt, lengths, jax.random.key(3), cfg, scfg, num_slots, sampled_rows(8)
    )
    assert_same_rollout(got, want)
    assert got.experts_NTLk is None and want.experts_NTLk is None  # a dense model
    np.testing.assert_array_equal(np.asarray(got.prompt_NP), prompt)
    assert int(stats.live_slot_steps) == int(np.asarray(want.lengths_N).sum())


@pytest.mark.parametrize("layer_loop,num_slots", [("unroll", 3), ("scan", 2)])
def test_moe_rollout_and_its_experts_equal_static(layer_loop, num_slots):
    """The tiny MoE (f32, random weights): the same tokens and, on every generated token, the
    same experts in every layer as the static loop records (end ids 92 and 0 and the stop 24
    picked with key 3 so that rows end at lengths 1 to 10, all three ways)."""
    cfg = config_lib.PRESETS["tiny-moe"].replace(vocab_size=128)
    params = tf.init_params(jax.random.key(0), cfg)
    prompt, lengths = bucket_and_pad(PROMPTS, (16,), pad_id=0, group_size=2)
    scfg = SamplerConfig(
        max_new_tokens=10,
        eos_ids=(92, 0),
        stop_sequences=((24,),),
        prompt_group=2,
        layer_loop=layer_loop,
    )
    want = sample(params, prompt, lengths, jax.random.key(3), cfg, scfg)
    got, _ = sample_continuous(params, prompt, lengths, jax.random.key(3), cfg, scfg, num_slots)
    assert_same_rollout(got, want)
    assert set(np.asarray(want.finish_N)) == {FINISH_EOS, FINISH_STOP, FINISH_LENGTH}
    assert np.asarray(want.lengths_N).tolist() == [10, 8, 1, 1, 2, 5, 2, 3]
    mask = np.asarray(want.mask_NT)
    experts = np.asarray(got.experts_NTLk)
    assert experts.shape == (8, 10, cfg.num_layers, cfg.num_experts_per_tok)
    np.testing.assert_array_equal(experts[mask], np.asarray(want.experts_NTLk)[mask])
    # Every row's first token (stored prompt experts) and later ones (decode steps) differ.
    assert len({tuple(e.ravel()) for e in experts[mask]}) > mask.sum() // 2


# THINK_CHAIN (test_stops) plus an end id after 30 and the stop sequence (20, 21) after 19.
CHAIN = {**THINK_CHAIN, 30: 31, 19: 20, 20: 21}
GREEDY = SamplerConfig(
    max_new_tokens=12,
    method="greedy",
    eos_ids=(8, 31),
    stop_sequences=((20, 21),),
    think_open=(5,),
    think_close=(6,),
    think_budget=3,
    think_stop=(7, 8, 6),
    layer_loop="scan",
)


@pytest.mark.parametrize("num_slots", [10, 3])
def test_greedy_think_budget_and_stops_equal_static(num_slots):
    """The scripted model, greedy, the scan layer loop: injected think stops, end ids on the
    first step, a stop sequence, one that spans the prompt (no stop), and truncation."""
    params, cfg = scripted_model(chain_table(CHAIN, 32))
    prompts = [[1, 4], [1, 5], [5, 21], [1, 25], [5, 6, 9], [1, 27], [7, 30], [19], [4, 20], [10]]
    prompt, lengths = left_pad(prompts)
    want = sample(params, prompt, lengths, jax.random.key(0), cfg, GREEDY)
    got, _ = sample_continuous(params, prompt, lengths, jax.random.key(0), cfg, GREEDY, num_slots)
    assert_same_rollout(got, want)
    assert np.asarray(want.injected_NT).sum() == 6  # rows 0 and 1 (see test_stops)
    assert np.asarray(want.lengths_N).tolist() == [12, 12, 12, 12, 12, 1, 1, 2, 12, 12]
    assert np.asarray(want.finish_N)[5:8].tolist() == [FINISH_EOS, FINISH_EOS, FINISH_STOP]


# ---------------------------------------------------------------------------------------------
# Stats


def test_stats_with_forced_lengths_equal_the_hand_count():
    """Lengths forced by the model: token 10 + k -> 10 + k - 1, 11 -> 8 (an end id), so a prompt
    ending in 10 + L answers L tokens; 25 <-> 26 runs to max_new_tokens (12). GREEDY's settings
    and shapes, so the greedy test's program for 3 slots runs again."""
    table = chain_table({10 + k: 9 + k for k in range(2, 9)} | {11: 8, 25: 26, 26: 25}, 32)
    params, cfg = scripted_model(table)
    answer = [4, 1, 2, 8, 3, 12, 1, 2, 2, 1]
    prompt, lengths = left_pad([[1, 2, 25 if n == 12 else 10 + n] for n in answer])
    r, stats = sample_continuous(params, prompt, lengths, jax.random.key(0), cfg, GREEDY, 3)
    assert np.asarray(r.lengths_N).tolist() == answer
    # Emission steps e (e0 from the prompts' logits, then one per decode step); a free slot
    # takes the next row, lower slots first:
    #   slot 0: row 0 e0-e3, row 5 e4-e15
    #   slot 1: row 1 e0, row 3 e1-e8, row 9 e9, idle e10-e15
    #   slot 2: row 2 e0-e1, row 4 e2-e4, row 6 e5, row 7 e6-e7, row 8 e8-e9, idle e10-e15
    # 16 emission steps (15 decode steps) x 3 slots = 48 slot-steps, 36 of them live.
    assert (int(stats.decode_steps), int(stats.live_slot_steps)) == (15, 36)
    assert int(stats.total_slot_steps) == 48
    summary = summarize(stats, r.lengths_N)
    assert summary["slot_utilisation"] == pytest.approx(36 / 48)
    assert summary["decode_steps"] == 15
    assert summary["length_max"] == 12 and summary["length_p50"] == 2
    assert summary["batch_imbalance"] == pytest.approx(12 / 3.6)
    # The static sampler: 10 slots until the longest row ends (11 decode steps), 36 of 120.
    static = summarize(static_stats(np.asarray(answer)), np.asarray(answer))
    assert static["slot_utilisation"] == pytest.approx(36 / 120)
    assert static["decode_steps"] == 11


# ---------------------------------------------------------------------------------------------
# Compilation, errors, sharding


def test_no_recompilation_for_new_key_and_sampling_values(sampled):
    params, cfg, scfg, prompt, lengths, _ = sampled
    N = len(prompt)
    # No cache passed (None), as `sample_continuous` calls it: test_sampled_rollout_equals_static
    # compiled this program already.
    run = lambda key, sp: generate_continuous(
        params, prompt, lengths, key, sp, None, model_cfg=cfg, cfg=scfg, num_slots=4
    )
    jax.block_until_ready(run(jax.random.key(0), sampled_rows(N)))
    compiles = []
    listener = lambda name, *_, **__: compiles.append(name) if "backend_compile" in name else None
    jax.monitoring.register_event_duration_secs_listener(listener)
    size = generate_continuous._cache_size()
    try:
        for i in range(2):
            sp = sampling_params(N, temperature=0.5 + i, top_p=0.9 - 0.2 * i)
            jax.block_until_ready(run(jax.random.key(i + 1), sp))
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == []
    assert generate_continuous._cache_size() == size


def test_bad_slot_counts_and_caches_raise(sampled):
    params, cfg, scfg, prompt, lengths, _ = sampled
    for bad in (0, 9):
        with pytest.raises(ValueError, match=rf"num_slots={bad} must be in \[1, 8\]"):
            sample_continuous(params, prompt, lengths, jax.random.key(0), cfg, scfg, bad)
        with pytest.raises(ValueError, match=rf"num_slots={bad} must be in \[1, 8\]"):
            generate_continuous(
                *(params, prompt, lengths, jax.random.key(0), sampled_rows(8), None),
                model_cfg=cfg,
                cfg=scfg,
                num_slots=bad,
            )
    rows_cache = init_decode_cache(cfg, scfg, 8, prompt.shape[1])  # N rows, not 4 slots
    with pytest.raises(ValueError, match=r"4 rows of bucket 16 .*see init_decode_cache"):
        generate_continuous(
            *(params, prompt, lengths, jax.random.key(0), sampled_rows(8), rows_cache),
            model_cfg=cfg,
            cfg=scfg,
            num_slots=4,
        )
    with pytest.raises(ValueError, match=r"prompt_lengths_N\[1\]=0 is outside \[1, 16\]"):
        bad_lengths = np.where(np.arange(8) == 1, 0, lengths).astype(np.int32)
        sample_continuous(
            params, prompt, bad_lengths, jax.random.key(0), cfg, scfg, 4, sampled_rows(8)
        )


def test_rows_and_slots_sharded_over_the_training_mesh_equal_one_device(sampled):
    """Rows split over ("data", "fsdp"), the slot cache laid out as the train step lays out the
    static one (`shard_decode_cache`), the scan layer loop: the static rollout again."""
    params, cfg, scfg, prompt, lengths, want = sampled
    auto = (jax.sharding.AxisType.Auto,) * 3
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=auto)
    scfg = dataclasses.replace(scfg, layer_loop="scan")
    cache = init_decode_cache(cfg, scfg, 4, prompt.shape[1])
    cache = jax.device_put(cache, sharding.decode_cache_shardings(cache, cfg, mesh))
    put = lambda x: jax.device_put(x, NamedSharding(mesh, P(("data", "fsdp"))))
    got, stats, _ = generate_continuous(
        jax.device_put(params, NamedSharding(mesh, P())),
        put(prompt),
        put(lengths),
        jax.random.key(3),
        jax.tree.map(put, sampled_rows(8)),
        cache,
        model_cfg=cfg,
        cfg=scfg,
        num_slots=4,
    )
    assert_same_rollout(got, want)
    assert int(stats.live_slot_steps) == int(np.asarray(want.lengths_N).sum())
