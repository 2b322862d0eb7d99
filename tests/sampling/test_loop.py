"""The sampling program against `transformers`, teacher forcing, compilation, caches, batch
composition and sharding."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rlvr_jax.sampling.config import SamplerConfig, sampling_params
from rlvr_jax.sampling.host import bucket_and_pad
from rlvr_jax.sampling.loop import generate, init_decode_cache, sample
from rlvr_jax.types import FINISH_EOS, FINISH_LENGTH
from tests.sampling.fixtures import (
    PROMPTS,
    chain_table,
    hf_greedy,
    left_pad,
    reference_truncation,
    scripted_model,
    teacher_forced_logits,
    teacher_forced_logp,
)

# ---------------------------------------------------------------------------------------------
# Parity and teacher forcing


@pytest.mark.parametrize(
    "kind, layer_loop",
    [
        ("qwen2", "unroll"),
        ("qwen2", "scan"),
        ("qwen3", "auto"),
        ("llama", "auto"),
        ("qwen3_moe", "unroll"),
        ("qwen3_moe", "scan"),
    ],
)
def test_greedy_equals_transformers_generate(tiny, kind, layer_loop):
    model, params, cfg = tiny(kind)
    prompt, lengths = bucket_and_pad(PROMPTS, (8, 16), pad_id=0)
    T = 14
    want = hf_greedy(model, prompt, lengths, T)
    # A small chunk makes the scan loop cross several attention windows.
    scfg = SamplerConfig(
        max_new_tokens=T, method="greedy", attention_chunk=4, layer_loop=layer_loop
    )
    r = sample(params, prompt, lengths, jax.random.key(0), cfg, scfg)
    np.testing.assert_array_equal(np.asarray(r.tokens_NT), want)
    assert np.asarray(r.mask_NT).all() and (np.asarray(r.finish_N) == FINISH_LENGTH).all()
    if layer_loop != "unroll":
        return  # the stop path does not depend on the model; one compile is enough
    # Stop at an id that some rows produce mid-way; transformers pads those rows after it.
    eos = int(want[0, 5])
    want = hf_greedy(model, prompt, lengths, T, eos_ids=(eos,))
    scfg = dataclasses.replace(scfg, eos_ids=(eos,))
    r = sample(params, prompt, lengths, jax.random.key(0), cfg, scfg)
    np.testing.assert_array_equal(np.asarray(r.tokens_NT), want)
    assert np.asarray(r.finish_N)[0] == FINISH_EOS


@pytest.mark.parametrize("kind", ["qwen2", "qwen3_moe"])
def test_sampled_logp_equals_teacher_forced_forward(tiny, kind):
    _, params, cfg = tiny(kind)
    prompt, lengths = bucket_and_pad(PROMPTS, (16,), pad_id=0, group_size=2)
    scfg = SamplerConfig(max_new_tokens=12, eos_ids=(3, 17), attention_chunk=4)
    sp = sampling_params(len(prompt), temperature=0.7)
    r = sample(params, prompt, lengths, jax.random.key(1), cfg, scfg, sp)
    want = teacher_forced_logp(params, cfg, r, temperature=0.7)
    mask = np.asarray(r.mask_NT)
    assert mask.sum() > 40
    np.testing.assert_allclose(
        np.where(mask, np.asarray(r.logp_NT), 0), np.where(mask, want, 0), atol=1e-4
    )
    # The two samples of each prompt differ: the rows draw from their own streams.
    tokens = np.asarray(r.tokens_NT)
    assert all((tokens[2 * b] != tokens[2 * b + 1]).any() for b in range(len(PROMPTS)))


def test_truncated_logp_equals_teacher_forced_reference(tiny):
    _, params, cfg = tiny("qwen3")
    prompt, lengths = bucket_and_pad(PROMPTS, (16,), pad_id=0, group_size=2)
    N = len(prompt)
    scfg = SamplerConfig(max_new_tokens=8, top_k=20)
    temps = np.linspace(0.6, 1.3, N)
    top_p = np.array([1.0, 0.9, 0.8, 0.5, 1.0, 0.95, 0.7, 0.3], np.float32)
    min_p = np.array([0.0, 0.0, 0.05, 0.1, 0.2, 0.0, 0.01, 0.0], np.float32)
    sp = sampling_params(N, temperature=temps, top_p=top_p, min_p=min_p)
    r = sample(params, prompt, lengths, jax.random.key(2), cfg, scfg, sp)
    logits = teacher_forced_logits(params, cfg, r)
    tokens, logp = np.asarray(r.tokens_NT), np.asarray(r.logp_NT)
    for n in range(N):
        for t in range(8):
            dist = reference_truncation(logits[n, t], temps[n], 20, top_p[n], min_p[n])
            assert dist[tokens[n, t]] > 0, (n, t)
            np.testing.assert_allclose(logp[n, t], np.log(dist[tokens[n, t]]), atol=1e-4)


def test_sample_checks_host_inputs():
    params, cfg = scripted_model(chain_table({}, 32))
    scfg = SamplerConfig(4, method="greedy")
    prompt, lengths = left_pad([[1, 2], [3]])
    with pytest.raises(ValueError, match=r"prompt_lengths_N\[1\]=0 is outside \[1, 2\]"):
        sample(params, prompt, np.array([2, 0]), jax.random.key(0), cfg, scfg)
    with pytest.raises(ValueError, match=r"prompt_NP\[0, 1\]=32 is not a token id"):
        sample(params, np.array([[1, 32], [0, 3]]), lengths, jax.random.key(0), cfg, scfg)


# ---------------------------------------------------------------------------------------------
# Compilation, caches, batch composition, sharding


def test_no_recompilation_from_the_second_call(tiny):
    _, params, cfg = tiny("qwen2")
    prompt, lengths = bucket_and_pad(PROMPTS, (16,), pad_id=0)
    N = len(prompt)
    scfg = SamplerConfig(max_new_tokens=6, top_k=10)
    cache = init_decode_cache(cfg, scfg, N, prompt.shape[1])
    r, cache = generate(
        params,
        prompt,
        lengths,
        jax.random.key(0),
        sampling_params(N),
        cache,
        model_cfg=cfg,
        cfg=scfg,
    )
    jax.block_until_ready(r)
    compiles = []
    listener = lambda name, *_, **__: compiles.append(name) if "backend_compile" in name else None
    jax.monitoring.register_event_duration_secs_listener(listener)
    size = generate._cache_size()
    try:
        for i in range(2):
            sp = sampling_params(N, temperature=0.5 + i, top_p=0.9 - 0.2 * i, min_p=0.05)
            r, cache = generate(
                params, prompt, lengths, jax.random.key(i + 1), sp, cache, model_cfg=cfg, cfg=scfg
            )
            jax.block_until_ready(r)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == []
    assert generate._cache_size() == size


def test_a_reused_cache_gives_the_same_rollout(tiny):
    _, params, cfg = tiny("qwen2")
    prompt, lengths = bucket_and_pad(PROMPTS, (16,), pad_id=0)
    N = len(prompt)
    scfg = SamplerConfig(max_new_tokens=6, top_k=10)
    sp = sampling_params(N)
    run = lambda prompt, lengths, cache: generate(
        params, prompt, lengths, jax.random.key(0), sp, cache, model_cfg=cfg, cfg=scfg
    )
    fresh, cache = run(prompt, lengths, init_decode_cache(cfg, scfg, N, 16))
    # Fill the cache with a different batch first: stale slots must not leak into the next one.
    other, _ = bucket_and_pad([[1] * 16] * N, (16,), pad_id=0)
    _, cache = run(other, np.full(N, 16, np.int32), cache)
    again, _ = run(prompt, lengths, cache)
    np.testing.assert_array_equal(np.asarray(again.tokens_NT), np.asarray(fresh.tokens_NT))
    with pytest.raises(ValueError, match="see init_decode_cache"):
        run(prompt, lengths, init_decode_cache(cfg, scfg, N, 8))


def test_prompt_group_prefills_once_and_samples_the_same(tiny):
    """prompt_group=G (one prefill per group) gives what prefilling every row gives."""
    _, params, cfg = tiny("qwen2")
    prompt, lengths = bucket_and_pad(PROMPTS, (16,), pad_id=0, group_size=3)
    out = []
    for group in (1, 3):
        scfg = SamplerConfig(max_new_tokens=9, prompt_group=group)
        sp = sampling_params(len(prompt), temperature=0.9)
        out.append(sample(params, prompt, lengths, jax.random.key(4), cfg, scfg, sp))
    np.testing.assert_array_equal(np.asarray(out[0].tokens_NT), np.asarray(out[1].tokens_NT))
    np.testing.assert_allclose(np.asarray(out[0].logp_NT), np.asarray(out[1].logp_NT), atol=1e-5)
    assert (np.asarray(out[1].tokens_NT)[0] != np.asarray(out[1].tokens_NT)[1]).any()
    with pytest.raises(ValueError, match="groups of prompt_group=5"):
        sample(params, prompt, lengths, jax.random.key(4), cfg, SamplerConfig(4, prompt_group=5))
    with pytest.raises(ValueError, match="prompt_group=0"):
        SamplerConfig(4, prompt_group=0)
    mixed = prompt.copy()
    mixed[4, -1] += 1  # row 4 of group 1 (rows 3-5) now holds another prompt
    with pytest.raises(ValueError, match="row 4's prompt differs from row 3's"):
        sample(params, mixed, lengths, jax.random.key(4), cfg, SamplerConfig(4, prompt_group=3))


def test_rows_are_independent_of_the_batch_and_of_attention_chunking(tiny):
    """Rows 0-1 alone, in either layer loop reading the cache in chunks of 3, equal rows 0-1 of
    a batch of 8 in the unrolled loop reading the whole cache: per-row streams, and two layer
    loops and two attention spans with the same numbers."""
    _, params, cfg = tiny("llama")
    small, small_len = bucket_and_pad(PROMPTS[:2], (16,), pad_id=0)
    big, big_len = bucket_and_pad(PROMPTS[:2] + PROMPTS[::-1] + PROMPTS[2:], (16,), 0)
    a = sample(
        params,
        small,
        small_len,
        jax.random.key(7),
        cfg,
        SamplerConfig(max_new_tokens=11, attention_chunk=3, layer_loop="scan"),
        sampling_params(2, temperature=0.8),
    )
    b = sample(
        params,
        big,
        big_len,
        jax.random.key(7),
        cfg,
        SamplerConfig(max_new_tokens=11, attention_chunk=0, layer_loop="unroll"),
        sampling_params(8, temperature=0.8),
    )
    c = sample(
        params,
        small,
        small_len,
        jax.random.key(7),
        cfg,
        SamplerConfig(max_new_tokens=11, attention_chunk=3, layer_loop="unroll"),
        sampling_params(2, temperature=0.8),
    )
    for x in (a, c):
        np.testing.assert_array_equal(np.asarray(x.tokens_NT), np.asarray(b.tokens_NT)[:2])
        np.testing.assert_allclose(np.asarray(x.logp_NT), np.asarray(b.logp_NT)[:2], atol=1e-5)
    assert (np.asarray(b.tokens_NT)[0] != np.asarray(b.tokens_NT)[5]).any()


def test_rows_sharded_over_the_training_mesh_equal_one_device(tiny):
    _, params, cfg = tiny("qwen2")
    assert jax.device_count() == 8
    auto = (jax.sharding.AxisType.Auto,) * 3
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=auto)
    prompt, lengths = bucket_and_pad(PROMPTS, (16,), pad_id=0, group_size=2)
    N = len(prompt)
    scfg = SamplerConfig(max_new_tokens=6, top_k=10)
    sp = sampling_params(N, temperature=0.9)
    run = lambda params, prompt, lengths, sp: generate(
        params, prompt, lengths, jax.random.key(8), sp, None, model_cfg=cfg, cfg=scfg
    )[0]
    want = run(params, prompt, lengths, sp)
    put = lambda x: jax.device_put(x, NamedSharding(mesh, P(("data", "fsdp"))))
    replicated = jax.device_put(params, NamedSharding(mesh, P()))
    got = run(replicated, put(prompt), put(lengths), jax.tree.map(put, sp))
    assert got.tokens_NT.sharding.spec[0] == ("data", "fsdp")
    np.testing.assert_array_equal(np.asarray(got.tokens_NT), np.asarray(want.tokens_NT))
    np.testing.assert_allclose(np.asarray(got.logp_NT), np.asarray(want.logp_NT), atol=1e-5)
