"""The KV-cache sampler against `transformers`, teacher forcing, exact distributions and edge cases.

Two kinds of model: tiny random `transformers` models (parity), and a "scripted" one-layer model
whose attention and MLP are zeroed, so that its next-token logits are a table lookup on the current
token: greedy chains and stop/think edge cases are then exact by construction.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special
import scipy.stats
import torch
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rlvr_jax import sampling
from rlvr_jax.model import hf, transformer
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.sampling import FINISH_EOS, FINISH_LENGTH, FINISH_STOP, SamplerConfig
from tests.model.hf_fixtures import make_tiny_hf

# ---------------------------------------------------------------------------------------------
# Models


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """kind -> (torch model, params, cfg); weights scaled up so greedy paths do not collapse."""
    cache = {}

    def get(kind: str):
        if kind not in cache:
            d = tmp_path_factory.mktemp(kind)
            model = make_tiny_hf(kind, d)
            with torch.no_grad():
                for p in model.parameters():
                    if p.ndim == 2:
                        p.mul_(10.0)
            model.save_pretrained(d)
            params, cfg = hf.load_hf(d)
            cache[kind] = (model, params, cfg)
        return cache[kind]

    return get


def scripted_model(table_VV: np.ndarray) -> tuple[transformer.Params, ModelConfig]:
    """A model whose logits after token a are `table_VV[a]` (up to RMSNorm's eps)."""
    V = table_VV.shape[0]
    cfg = ModelConfig(
        model_type="llama",
        vocab_size=V,
        embed_dim=V,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=8,
        mlp_dim=8,
        norm_eps=1e-9,
        tie_embeddings=False,
    )
    rng = np.random.default_rng(0)
    normal = lambda *shape: jnp.asarray(rng.normal(0, 0.1, shape), jnp.float32)
    zeros = lambda *shape: jnp.zeros(shape, jnp.float32)
    ones = lambda *shape: jnp.ones(shape, jnp.float32)
    layers = transformer.Layers(
        attn_norm=ones(1, V),
        q=normal(1, V, 2, 8),
        k=normal(1, V, 1, 8),
        v=normal(1, V, 1, 8),
        o=zeros(1, 2, 8, V),
        mlp_norm=ones(1, V),
        gate=normal(1, V, 8),
        up=normal(1, V, 8),
        down=zeros(1, 8, V),
    )
    # rms_norm(e_a) = sqrt(V) e_a, so lm_head = table / sqrt(V) gives logits = table[a].
    params = transformer.Params(
        embed=jnp.eye(V, dtype=jnp.float32),
        layers=layers,
        final_norm=ones(V),
        lm_head=jnp.asarray(table_VV / np.sqrt(V), jnp.float32),
    )
    return params, cfg


def chain_table(next_of: dict[int, int], V: int, default: int = 1) -> np.ndarray:
    """Logits that make greedy decoding follow `next_of` (10 nats of margin)."""
    table = np.zeros((V, V), np.float32)
    for a in range(V):
        table[a, next_of.get(a, default)] = 10.0
    return table


def left_pad(prompts, pad_id=0):
    return sampling.bucket_and_pad(prompts, (max(len(p) for p in prompts),), pad_id)


@jax.jit(static_argnames="cfg")
def _teacher_forced(params, prompt_NP, prompt_lengths_N, tokens_NT, mask_NT, cfg):
    Pl = prompt_NP.shape[1]
    pmask = jnp.arange(Pl)[None] >= (Pl - prompt_lengths_N)[:, None]
    tokens = jnp.concatenate([prompt_NP, tokens_NT], axis=1)
    mask = jnp.concatenate([pmask, mask_NT], axis=1)
    positions = transformer.positions_from_mask(mask)
    logits, _ = transformer.forward(params, tokens, positions, cfg, mask_BT=mask)
    return logits[:, Pl - 1 : -1]


def teacher_forced_logits(params, cfg, rollout) -> np.ndarray:
    """forward() over prompt + generated tokens: the logits each generated token was drawn from."""
    r = rollout
    return np.asarray(
        _teacher_forced(params, r.prompt_NP, r.prompt_lengths_N, r.tokens_NT, r.mask_NT, cfg=cfg)
    )


def teacher_forced_logp(params, cfg, rollout, temperature=1.0) -> np.ndarray:
    """log_softmax(forward / temperature) of the rollout's own tokens, (N, T), on the host."""
    x = teacher_forced_logits(params, cfg, rollout).astype(np.float64) / temperature
    logp = x - scipy.special.logsumexp(x, axis=-1, keepdims=True)
    return np.take_along_axis(logp, np.asarray(rollout.tokens_NT)[..., None], axis=-1)[..., 0]


def hf_greedy(model, prompt_NP, lengths_N, T, eos_ids=()):
    Pl = prompt_NP.shape[1]
    mask = torch.tensor(np.arange(Pl)[None] >= (Pl - lengths_N)[:, None]).long()
    with torch.no_grad():
        out = model.generate(
            torch.tensor(prompt_NP).long(),
            attention_mask=mask,
            max_new_tokens=T,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=list(eos_ids) or None,
        )
    out = out[:, Pl:].numpy()
    return np.pad(out, ((0, 0), (0, T - out.shape[1])))


PROMPTS = [[5, 9, 100, 3, 17], [42], [7, 7, 8, 120, 1, 2, 3, 4, 5, 6, 11], [64, 3]]


# ---------------------------------------------------------------------------------------------
# Parity and teacher forcing


@pytest.mark.parametrize(
    "kind, layer_loop",
    [("qwen2", "unroll"), ("qwen2", "scan"), ("qwen3", "auto"), ("llama", "auto")],
)
def test_greedy_equals_transformers_generate(tiny, kind, layer_loop):
    model, params, cfg = tiny(kind)
    prompt, lengths = sampling.bucket_and_pad(PROMPTS, (8, 16), pad_id=0)
    T = 14
    want = hf_greedy(model, prompt, lengths, T)
    # A small chunk makes the scan loop cross several attention windows.
    scfg = SamplerConfig(
        max_new_tokens=T, method="greedy", attention_chunk=4, layer_loop=layer_loop
    )
    r = sampling.sample(params, prompt, lengths, jax.random.key(0), cfg, scfg)
    np.testing.assert_array_equal(np.asarray(r.tokens_NT), want)
    assert np.asarray(r.mask_NT).all() and (np.asarray(r.finish_N) == FINISH_LENGTH).all()
    if layer_loop != "unroll":
        return  # the stop path does not depend on the model; one compile is enough
    # Stop at an id that some rows produce mid-way; transformers pads those rows after it.
    eos = int(want[0, 5])
    want = hf_greedy(model, prompt, lengths, T, eos_ids=(eos,))
    scfg = dataclasses.replace(scfg, eos_ids=(eos,))
    r = sampling.sample(params, prompt, lengths, jax.random.key(0), cfg, scfg)
    np.testing.assert_array_equal(np.asarray(r.tokens_NT), want)
    assert np.asarray(r.finish_N)[0] == FINISH_EOS


def test_sampled_logp_equals_teacher_forced_forward(tiny):
    _, params, cfg = tiny("qwen2")
    prompt, lengths = sampling.bucket_and_pad(PROMPTS, (16,), pad_id=0, group_size=2)
    scfg = SamplerConfig(max_new_tokens=12, eos_ids=(3, 17), attention_chunk=4)
    sp = sampling.sampling_params(len(prompt), temperature=0.7)
    r = sampling.sample(params, prompt, lengths, jax.random.key(1), cfg, scfg, sp)
    want = teacher_forced_logp(params, cfg, r, temperature=0.7)
    mask = np.asarray(r.mask_NT)
    assert mask.sum() > 40
    np.testing.assert_allclose(
        np.where(mask, np.asarray(r.logp_NT), 0), np.where(mask, want, 0), atol=1e-4
    )
    # The two samples of each prompt differ: the rows draw from their own streams.
    tokens = np.asarray(r.tokens_NT)
    assert all((tokens[2 * b] != tokens[2 * b + 1]).any() for b in range(len(PROMPTS)))


def reference_truncation(logits_V, temperature, top_k, top_p, min_p) -> np.ndarray:
    """The sampling distribution, written independently: sort, cut, renormalise."""
    x = np.asarray(logits_V, np.float64) / temperature
    keep = np.ones_like(x, bool)
    if top_k:
        keep &= x >= np.sort(x)[::-1][top_k - 1]
    p = np.where(keep, np.exp(x - x[keep].max()), 0.0)
    p /= p.sum()
    # top-p: keep i iff the mass of strictly more likely tokens is below top_p.
    above = np.array([p[(p > p[i]) & keep].sum() for i in range(len(p))])
    keep &= above < top_p
    p = np.where(keep, p, 0.0)
    keep &= p >= min_p * p.max()
    p = np.where(keep, p, 0.0)
    return p / p.sum()


def test_truncated_logp_equals_teacher_forced_reference(tiny):
    _, params, cfg = tiny("qwen3")
    prompt, lengths = sampling.bucket_and_pad(PROMPTS, (16,), pad_id=0, group_size=2)
    N = len(prompt)
    scfg = SamplerConfig(max_new_tokens=8, top_k=20)
    temps = np.linspace(0.6, 1.3, N)
    top_p = np.array([1.0, 0.9, 0.8, 0.5, 1.0, 0.95, 0.7, 0.3], np.float32)
    min_p = np.array([0.0, 0.0, 0.05, 0.1, 0.2, 0.0, 0.01, 0.0], np.float32)
    sp = sampling.sampling_params(N, temperature=temps, top_p=top_p, min_p=min_p)
    r = sampling.sample(params, prompt, lengths, jax.random.key(2), cfg, scfg, sp)
    logits = teacher_forced_logits(params, cfg, r)
    tokens, logp = np.asarray(r.tokens_NT), np.asarray(r.logp_NT)
    for n in range(N):
        for t in range(8):
            dist = reference_truncation(logits[n, t], temps[n], 20, top_p[n], min_p[n])
            assert dist[tokens[n, t]] > 0, (n, t)
            np.testing.assert_allclose(logp[n, t], np.log(dist[tokens[n, t]]), atol=1e-4)


# ---------------------------------------------------------------------------------------------
# Distributions: empirical frequencies against the truncated, renormalised distribution

LOGITS_10 = np.array([2.0, 1.5, 1.5, 1.0, 0.3, 0.0, -0.5, -1.0, -2.0, -4.0], np.float32)


@pytest.mark.parametrize(
    "temperature, top_k, top_p, min_p",
    [
        (0.7, 0, 1.0, 0.0),  # temperature only
        (1.0, 3, 1.0, 0.0),  # top-k: 2.0 and the tied pair of 1.5
        (1.0, 0, 0.6, 0.0),  # top-p over the full vocabulary (bisection)
        (1.3, 0, 1.0, 0.2),  # min-p
        (0.9, 6, 0.8, 0.1),  # all three, top-p on the sorted top-k values
    ],
)
def test_empirical_frequencies_match_truncated_distribution(temperature, top_k, top_p, min_p):
    N = 40_000
    want = reference_truncation(LOGITS_10, temperature, top_k, top_p, min_p)
    truncating = top_k or top_p < 1 or min_p > 0
    assert 2 <= (want > 0).sum() < (10 if truncating else 11)
    scfg = SamplerConfig(max_new_tokens=1, top_k=top_k)
    sp = sampling.sampling_params(N, temperature, top_p, min_p)
    u_N = sampling.row_uniforms(jax.random.key(3), N, 1)[:, 0]
    choose = jax.jit(sampling.choose_tokens, static_argnames="cfg")
    tok, logp = choose(jnp.broadcast_to(jnp.asarray(LOGITS_10), (N, 10)), sp, u_N, cfg=scfg)
    tok, logp = np.asarray(tok), np.asarray(logp)
    counts = np.bincount(tok, minlength=10)
    assert (counts[want == 0] == 0).all(), counts
    kept = want > 0
    assert scipy.stats.chisquare(counts[kept], N * want[kept]).pvalue > 1e-3, (counts, N * want)
    np.testing.assert_allclose(logp, np.log(want[tok]), atol=1e-5)


def test_draw_over_a_large_vocabulary_is_exact():
    """V = 300 spans three blocks of the two-level draw, the last one padded."""
    N, V = 60_000, 300
    logits = np.random.default_rng(0).normal(0, 2, V).astype(np.float32)
    want = reference_truncation(logits, 1.0, 0, 1.0, 0.0)
    scfg = SamplerConfig(max_new_tokens=1)
    u_N = sampling.row_uniforms(jax.random.key(4), N, 1)[:, 0]
    tok, logp = jax.jit(sampling.choose_tokens, static_argnames="cfg")(
        jnp.broadcast_to(jnp.asarray(logits), (N, V)), sampling.sampling_params(N), u_N, cfg=scfg
    )
    counts = np.bincount(np.asarray(tok), minlength=V)
    big = N * want >= 20  # chi-square needs populated bins; pool the rest
    observed = np.append(counts[big], counts[~big].sum())
    expected = np.append(N * want[big], N * want[~big].sum())
    assert scipy.stats.chisquare(observed, expected).pvalue > 1e-3
    np.testing.assert_allclose(np.asarray(logp), np.log(want[np.asarray(tok)]), atol=1e-5)


def test_extreme_uniforms_pick_the_first_and_last_kept_tokens():
    """u at the ends of (0, 1] must still land on tokens with mass, never on removed ones."""
    logits = jnp.asarray([[-jnp.inf, 1.0, 2.0, -jnp.inf, 0.5, -jnp.inf]] * 3)
    u_N = jnp.asarray([1e-30, 1.0, 0.5])
    tok, _ = sampling.choose_tokens(
        logits, sampling.sampling_params(3), u_N, SamplerConfig(max_new_tokens=1)
    )
    assert np.asarray(tok).tolist()[:2] == [1, 4]
    assert int(tok[2]) in (1, 2, 4)


def test_top_p_bisection_equals_the_sorted_rule_with_ties():
    rng = np.random.default_rng(5)
    # Few distinct values, so ties straddle the top-p boundary often.
    x = rng.integers(-4, 4, (64, 50)).astype(np.float32) / 2
    top_p = rng.uniform(0.05, 1.0, 64).astype(np.float32)
    top_p[:4] = 1.0
    bisect = np.isfinite(np.asarray(sampling._top_p_unsorted(jnp.asarray(x), jnp.asarray(top_p))))
    order = np.argsort(-x, axis=1, kind="stable")
    xs = np.take_along_axis(x, order, axis=1)
    kept_sorted = np.isfinite(
        np.asarray(sampling._top_p_sorted(jnp.asarray(xs), jnp.asarray(top_p)))
    )
    sorted_rule = np.zeros_like(kept_sorted)
    np.put_along_axis(sorted_rule, order, kept_sorted, axis=1)
    reference = np.stack([reference_truncation(x[n], 1.0, 0, top_p[n], 0.0) > 0 for n in range(64)])
    np.testing.assert_array_equal(bisect, reference)
    np.testing.assert_array_equal(sorted_rule, reference)


def test_greedy_returns_argmax_and_its_model_logp():
    logits = jnp.asarray([[0.0, 3.0, 3.0, 1.0], [5.0, -1.0, 0.0, 0.0]])
    tok, logp = sampling.choose_tokens(
        logits, sampling.sampling_params(2), jnp.ones(2), SamplerConfig(1, method="greedy")
    )
    assert np.asarray(tok).tolist() == [1, 0]  # first of tied maxima, as torch.argmax
    np.testing.assert_allclose(logp, jax.nn.log_softmax(logits)[jnp.arange(2), tok], atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Stops, padding and the think budget (scripted model: exact by construction)

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
    r = sampling.sample(params, prompt, lengths, jax.random.key(0), cfg, scfg)
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
    r = sampling.sample(params, prompt, lengths, jax.random.key(0), cfg, scfg)
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
    r = sampling.sample(params, prompt, lengths, jax.random.key(0), cfg, scfg)
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


def test_config_errors_name_the_bad_value():
    with pytest.raises(ValueError, match="think_stop=.*must end with think_close"):
        SamplerConfig(8, think_open=(1,), think_close=(2,), think_budget=4, think_stop=(3, 4))
    with pytest.raises(ValueError, match="think_budget=4 needs"):
        SamplerConfig(8, think_budget=4)
    with pytest.raises(ValueError, match="method='beam'"):
        SamplerConfig(8, method="beam")
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        SamplerConfig(0)
    with pytest.raises(ValueError, match="layer_loop='python'"):
        SamplerConfig(8, layer_loop="python")
    with pytest.raises(ValueError, match="empty sequence"):
        SamplerConfig(8, stop_sequences=((1, 2), ()))
    with pytest.raises(ValueError, match="top_p=0.0 \\(row 1\\)"):
        sampling.sampling_params(3, top_p=[1.0, 0.0, 0.5])
    with pytest.raises(ValueError, match="top_p=1.5"):
        sampling.sampling_params(3, top_p=1.5)
    with pytest.raises(ValueError, match="min_p=1.0"):
        sampling.sampling_params(3, min_p=1.0)
    with pytest.raises(ValueError, match="temperature=nan"):
        sampling.sampling_params(3, temperature=float("nan"))
    with pytest.raises(ValueError, match="temperature=0.0"):
        sampling.sampling_params(3, temperature=0.0)
    with pytest.raises(ValueError, match=r"expected a scalar or \(3,\)"):
        sampling.sampling_params(3, temperature=[1.0, 1.0])
    # Configs are hashable static arguments, lists included.
    assert hash(SamplerConfig(4, eos_ids=[1, 2], stop_sequences=[[3, 4]])) == hash(
        SamplerConfig(4, eos_ids=(1, 2), stop_sequences=((3, 4),))
    )


def test_bucket_and_pad():
    prompt, lengths = sampling.bucket_and_pad([[1, 2, 3], [4]], (2, 4, 8), pad_id=9, group_size=2)
    np.testing.assert_array_equal(prompt, [[9, 1, 2, 3], [9, 1, 2, 3], [9, 9, 9, 4], [9, 9, 9, 4]])
    assert lengths.tolist() == [3, 3, 1, 1] and prompt.dtype == np.int32
    with pytest.raises(ValueError, match="prompt 1 has 9 tokens, longer than the largest bucket 8"):
        sampling.bucket_and_pad([[1], list(range(9))], (4, 8), pad_id=0)
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        sampling.bucket_and_pad([[]], (4,), pad_id=0)
    with pytest.raises(ValueError, match="group_size=0"):
        sampling.bucket_and_pad([[1]], (4,), pad_id=0, group_size=0)


def test_sample_checks_host_inputs():
    params, cfg = scripted_model(chain_table({}, 32))
    scfg = SamplerConfig(4, method="greedy")
    prompt, lengths = left_pad([[1, 2], [3]])
    with pytest.raises(ValueError, match=r"prompt_lengths_N\[1\]=0 is outside \[1, 2\]"):
        sampling.sample(params, prompt, np.array([2, 0]), jax.random.key(0), cfg, scfg)
    with pytest.raises(ValueError, match=r"prompt_NP\[0, 1\]=32 is not a token id"):
        sampling.sample(params, np.array([[1, 32], [0, 3]]), lengths, jax.random.key(0), cfg, scfg)


# ---------------------------------------------------------------------------------------------
# Compilation, caches, batch composition, sharding


def test_no_recompilation_from_the_second_call(tiny):
    _, params, cfg = tiny("qwen2")
    prompt, lengths = sampling.bucket_and_pad(PROMPTS, (16,), pad_id=0)
    N = len(prompt)
    scfg = SamplerConfig(max_new_tokens=6, top_k=10)
    cache = sampling.init_decode_cache(cfg, scfg, N, prompt.shape[1])
    r, cache = sampling.generate(
        params,
        prompt,
        lengths,
        jax.random.key(0),
        sampling.sampling_params(N),
        cache,
        model_cfg=cfg,
        cfg=scfg,
    )
    jax.block_until_ready(r)
    compiles = []
    listener = lambda name, *_, **__: compiles.append(name) if "backend_compile" in name else None
    jax.monitoring.register_event_duration_secs_listener(listener)
    size = sampling.generate._cache_size()
    try:
        for i in range(2):
            sp = sampling.sampling_params(N, temperature=0.5 + i, top_p=0.9 - 0.2 * i, min_p=0.05)
            r, cache = sampling.generate(
                params, prompt, lengths, jax.random.key(i + 1), sp, cache, model_cfg=cfg, cfg=scfg
            )
            jax.block_until_ready(r)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == []
    assert sampling.generate._cache_size() == size


def test_a_reused_cache_gives_the_same_rollout(tiny):
    _, params, cfg = tiny("qwen2")
    prompt, lengths = sampling.bucket_and_pad(PROMPTS, (16,), pad_id=0)
    N = len(prompt)
    scfg = SamplerConfig(max_new_tokens=6, top_k=10)
    sp = sampling.sampling_params(N)
    run = lambda prompt, lengths, cache: sampling.generate(
        params, prompt, lengths, jax.random.key(0), sp, cache, model_cfg=cfg, cfg=scfg
    )
    fresh, cache = run(prompt, lengths, sampling.init_decode_cache(cfg, scfg, N, 16))
    # Fill the cache with a different batch first: stale slots must not leak into the next one.
    other, _ = sampling.bucket_and_pad([[1] * 16] * N, (16,), pad_id=0)
    _, cache = run(other, np.full(N, 16, np.int32), cache)
    again, _ = run(prompt, lengths, cache)
    np.testing.assert_array_equal(np.asarray(again.tokens_NT), np.asarray(fresh.tokens_NT))
    with pytest.raises(ValueError, match="see init_decode_cache"):
        run(prompt, lengths, sampling.init_decode_cache(cfg, scfg, N, 8))


def test_prompt_group_prefills_once_and_samples_the_same(tiny):
    """prompt_group=G (one prefill per group) gives what prefilling every row gives."""
    _, params, cfg = tiny("qwen2")
    prompt, lengths = sampling.bucket_and_pad(PROMPTS, (16,), pad_id=0, group_size=3)
    out = []
    for group in (1, 3):
        scfg = SamplerConfig(max_new_tokens=9, prompt_group=group)
        sp = sampling.sampling_params(len(prompt), temperature=0.9)
        out.append(sampling.sample(params, prompt, lengths, jax.random.key(4), cfg, scfg, sp))
    np.testing.assert_array_equal(np.asarray(out[0].tokens_NT), np.asarray(out[1].tokens_NT))
    np.testing.assert_allclose(np.asarray(out[0].logp_NT), np.asarray(out[1].logp_NT), atol=1e-5)
    assert (np.asarray(out[1].tokens_NT)[0] != np.asarray(out[1].tokens_NT)[1]).any()
    with pytest.raises(ValueError, match="groups of prompt_group=5"):
        sampling.sample(
            params, prompt, lengths, jax.random.key(4), cfg, SamplerConfig(4, prompt_group=5)
        )
    with pytest.raises(ValueError, match="prompt_group=0"):
        SamplerConfig(4, prompt_group=0)
    mixed = prompt.copy()
    mixed[4, -1] += 1  # row 4 of group 1 (rows 3-5) now holds another prompt
    with pytest.raises(ValueError, match="row 4's prompt differs from row 3's"):
        sampling.sample(
            params, mixed, lengths, jax.random.key(4), cfg, SamplerConfig(4, prompt_group=3)
        )


def test_rows_are_independent_of_the_batch_and_of_attention_chunking(tiny):
    """Rows 0-1 alone, in either layer loop reading the cache in chunks of 3, equal rows 0-1 of
    a batch of 8 in the unrolled loop reading the whole cache: per-row streams, and two layer
    loops and two attention spans with the same numbers."""
    _, params, cfg = tiny("llama")
    small, small_len = sampling.bucket_and_pad(PROMPTS[:2], (16,), pad_id=0)
    big, big_len = sampling.bucket_and_pad(PROMPTS[:2] + PROMPTS[::-1] + PROMPTS[2:], (16,), 0)
    a = sampling.sample(
        params,
        small,
        small_len,
        jax.random.key(7),
        cfg,
        SamplerConfig(max_new_tokens=11, attention_chunk=3, layer_loop="scan"),
        sampling.sampling_params(2, temperature=0.8),
    )
    b = sampling.sample(
        params,
        big,
        big_len,
        jax.random.key(7),
        cfg,
        SamplerConfig(max_new_tokens=11, attention_chunk=0, layer_loop="unroll"),
        sampling.sampling_params(8, temperature=0.8),
    )
    c = sampling.sample(
        params,
        small,
        small_len,
        jax.random.key(7),
        cfg,
        SamplerConfig(max_new_tokens=11, attention_chunk=3, layer_loop="unroll"),
        sampling.sampling_params(2, temperature=0.8),
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
    prompt, lengths = sampling.bucket_and_pad(PROMPTS, (16,), pad_id=0, group_size=2)
    N = len(prompt)
    scfg = SamplerConfig(max_new_tokens=6, top_k=10)
    sp = sampling.sampling_params(N, temperature=0.9)
    run = lambda params, prompt, lengths, sp: sampling.generate(
        params, prompt, lengths, jax.random.key(8), sp, None, model_cfg=cfg, cfg=scfg
    )[0]
    want = run(params, prompt, lengths, sp)
    put = lambda x: jax.device_put(x, NamedSharding(mesh, P(("data", "fsdp"))))
    replicated = jax.device_put(params, NamedSharding(mesh, P()))
    got = run(replicated, put(prompt), put(lengths), jax.tree.map(put, sp))
    assert got.tokens_NT.sharding.spec[0] == ("data", "fsdp")
    np.testing.assert_array_equal(np.asarray(got.tokens_NT), np.asarray(want.tokens_NT))
    np.testing.assert_allclose(np.asarray(got.logp_NT), np.asarray(want.logp_NT), atol=1e-5)
