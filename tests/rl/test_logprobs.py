"""Chunked token log-probs equal the unchunked log-softmax, in value and gradient, and never hold
the whole N x T x V logits."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax.model import transformer as tf
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.rl import logprobs

N, T, V = 2, 7, 37


def _cfg(tie: bool) -> ModelConfig:
    return ModelConfig(
        model_type="qwen2", vocab_size=V, embed_dim=16, num_layers=1, num_heads=2,
        num_kv_heads=1, head_dim=8, mlp_dim=32, qkv_bias=True, tie_embeddings=tie,
    )  # fmt: skip


def _random_params(rng, cfg):
    # numpy rather than `init_params`: compiling its random draws costs seconds on this CPU.
    # Scale 0.5 makes the output distributions peaked but not one-hot.
    draw = lambda s: jnp.asarray(rng.normal(scale=0.5, size=s.shape), jnp.float32)  # noqa: E731
    return jax.tree.map(draw, tf.param_shapes(cfg))


def _setup(tie: bool, seed: int = 0, T: int = T):
    cfg = _cfg(tie)
    rng = np.random.default_rng(seed)
    params = _random_params(rng, cfg)
    tokens = jnp.asarray(rng.integers(0, V, (N, T)))
    targets = jnp.asarray(rng.integers(0, V, (N, T)))
    positions = jnp.broadcast_to(jnp.arange(T), (N, T))
    h, _ = _hidden_states(params, tokens, positions, cfg)
    return cfg, params, h, targets


# Jitted once per static configuration: eager dispatch would compile every primitive separately.
_hidden_states = jax.jit(tf.hidden_states, static_argnums=3)
_token_logprobs = jax.jit(logprobs.token_logprobs, static_argnums=(3, 4))


@functools.partial(jax.jit, static_argnums=3)
def _reference(params, h, targets, cfg, temperature):
    logp_NTV = jax.nn.log_softmax(tf.logits_from_hidden(params, h, cfg) / temperature, axis=-1)
    logp_NT = jnp.take_along_axis(logp_NTV, targets[..., None], -1)[..., 0]
    return logp_NT, -jnp.sum(jnp.exp(logp_NTV) * logp_NTV, axis=-1)


@pytest.mark.parametrize(
    "tie, chunk, temperature", [(True, 3, 1.0), (False, 3, 0.7), (True, 7, 1.3), (False, 64, 1.0)]
)
def test_chunked_equals_unchunked(tie, chunk, temperature):
    cfg, params, h, targets = _setup(tie)
    logp, ent = _token_logprobs(params, h, targets, cfg, chunk, temperature)
    ref_logp, ref_ent = _reference(params, h, targets, cfg, temperature)
    assert logp.shape == (N, T) and ent.shape == (N, T)
    assert logp.dtype == jnp.float32 and ent.dtype == jnp.float32
    np.testing.assert_allclose(logp, ref_logp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent, ref_ent, rtol=1e-5, atol=1e-5)
    # Non-trivial distributions: neither uniform nor one-hot.
    assert float(jnp.min(ent)) > 0.1 and float(jnp.max(ent)) < np.log(V) - 0.1


def test_gradient_matches_unchunked():
    cfg, params, h, targets = _setup(tie=True, seed=1)
    w_logp = jnp.asarray(np.random.default_rng(2).normal(size=(N, T)), jnp.float32)

    def objective(fn):
        def f(params, h):
            logp, ent = fn(params, h)
            return jnp.sum(w_logp * logp) + 0.3 * jnp.sum(ent)

        return jax.jit(jax.grad(f, argnums=(0, 1)))

    chunked = objective(lambda p, h: logprobs.token_logprobs(p, h, targets, cfg, 3, 0.8))
    full = objective(lambda p, h: _reference(p, h, targets, cfg, 0.8))
    got, want = chunked(params, h), full(params, h)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)
    assert float(jnp.max(jnp.abs(got[0].embed))) > 1e-3


def _all_avals(jaxpr):
    for eqn in jaxpr.eqns:
        for v in eqn.outvars:
            yield v.aval
        for p in eqn.params.values():
            for sub in p if isinstance(p, tuple | list) else (p,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _all_avals(inner)


def test_full_logits_are_never_materialised_forward_or_backward():
    # T = 12 in chunks of 3: no intermediate, in the forward or the backward pass, may hold as
    # many vocabulary-sized values as N x T x V (stacked per-chunk logits would).
    Tl = 12
    cfg, params, h, targets = _setup(tie=True, T=Tl)

    def f(params, h):
        logp, ent = logprobs.token_logprobs(params, h, targets, cfg, 3)
        return jnp.sum(logp) + jnp.sum(ent)

    jaxpr = jax.make_jaxpr(jax.grad(f, argnums=(0, 1)))(params, h).jaxpr
    # The embedding (V, D) and its gradient are the only V-sized arrays besides logits.
    embed_shape = params.embed.shape
    is_logits = lambda a: V in getattr(a, "shape", ()) and a.shape != embed_shape  # noqa: E731
    with_vocab = [a for a in _all_avals(jaxpr) if is_logits(a)]
    assert with_vocab, "the walk found no logits at all"
    biggest = max(int(np.prod(a.shape)) for a in with_vocab)
    assert biggest == N * 3 * V, biggest  # one chunk's logits
    # The unchunked reference does hold them: the check can fail.
    ref = jax.make_jaxpr(jax.grad(lambda p, h: jnp.sum(_reference(p, h, targets, cfg, 1.0)[0])))
    ref_avals = [a for a in _all_avals(ref(params, h).jaxpr) if is_logits(a)]
    assert max(int(np.prod(a.shape)) for a in ref_avals) >= N * Tl * V


def test_next_token_logprobs_on_left_padded_prompt_plus_completion():
    cfg = _cfg(tie=False)
    rng = np.random.default_rng(3)
    params = _random_params(rng, cfg)
    P, C = 5, 4  # prompt slots (left-padded), completion tokens
    mask = np.ones((N, P + C), bool)
    mask[1, :2] = False
    tokens = jnp.asarray(np.where(mask, rng.integers(0, V, (N, P + C)), 0))
    mask = jnp.asarray(mask)
    positions = tf.positions_from_mask(mask)
    next_token = jax.jit(logprobs.next_token_logprobs, static_argnums=(3, 5, 6))
    logp, ent = next_token(params, tokens, positions, cfg, mask, P, 3, 0.9)
    logits, _ = jax.jit(tf.forward, static_argnums=3)(params, tokens, positions, cfg, None, mask)
    ref_NTV = jax.nn.log_softmax(logits[:, P - 1 : -1] / 0.9, axis=-1)
    ref = jnp.take_along_axis(ref_NTV, tokens[:, P:, None], -1)[..., 0]
    assert logp.shape == (N, C) and ent.shape == (N, C)
    np.testing.assert_allclose(logp, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent, -jnp.sum(jnp.exp(ref_NTV) * ref_NTV, -1), rtol=1e-5, atol=1e-5)


def _groups(rng, B=3, G=4, P=6, C=5):
    """B left-padded prompts (lengths P, 3, 1) repeated G times, and completions that stop early
    in two rows; the flat rows [prompt, completion] and their mask and positions."""
    prompt = rng.integers(0, V, (B, P))
    prompt_mask = np.arange(P)[None] >= (P - np.array([P, 3, 1]))[:, None]
    completion_mask = np.ones((B * G, C), bool)
    completion_mask[1, 3:] = completion_mask[5, 1:] = False
    mask = np.concatenate([np.repeat(prompt_mask, G, 0), completion_mask], 1)
    seq = np.concatenate([np.repeat(prompt, G, 0), rng.integers(0, V, (B * G, C))], 1)
    seq = jnp.asarray(np.where(mask, seq, 0))
    mask = jnp.asarray(mask)
    return seq, mask, tf.positions_from_mask(mask), completion_mask


@pytest.mark.parametrize("remat", [False, True])
def test_grouped_prompts_equal_the_flat_rows_in_value_and_gradient(remat):
    """Each group's prompt run once gives the flat forward's log-probs, entropies and gradients."""
    import dataclasses

    cfg = dataclasses.replace(_cfg(tie=True), num_layers=2, remat=remat)
    rng = np.random.default_rng(5)
    params = _random_params(rng, cfg)
    seq, mask, positions, completion_mask = _groups(rng)
    P, G = 6, 4
    flat = lambda p: logprobs.next_token_logprobs(p, seq, positions, cfg, mask, P, 3, 0.9)  # noqa: E731
    grouped = lambda p: logprobs.grouped_next_token_logprobs(  # noqa: E731
        p, seq, positions, cfg, mask, G, P, 3, 0.9
    )
    (lf, ef), (lg, eg) = jax.jit(flat)(params), jax.jit(grouped)(params)
    np.testing.assert_allclose(lg * completion_mask, lf * completion_mask, atol=2e-5)
    np.testing.assert_allclose(eg * completion_mask, ef * completion_mask, atol=2e-5)
    # A loss that weights every token differently, so each row's gradient path counts.
    w = jnp.asarray(rng.normal(size=lf.shape)) * completion_mask
    loss = lambda f: lambda p: jnp.sum(f(p)[0] * w) + 0.1 * jnp.sum(f(p)[1] * w)  # noqa: E731
    gf, gg = jax.jit(jax.grad(loss(flat)))(params), jax.jit(jax.grad(loss(grouped)))(params)
    for a, b in zip(jax.tree.leaves(gf), jax.tree.leaves(gg), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


def test_grouped_prompts_read_each_groups_own_prompt():
    """Swapping two prompts changes exactly their groups' log-probs: no row reads another's."""
    cfg = _cfg(tie=False)
    rng = np.random.default_rng(6)
    params = _random_params(rng, cfg)
    seq, mask, positions, _ = _groups(rng)
    run = jax.jit(logprobs.grouped_next_token_logprobs, static_argnums=(3, 5, 6))
    base, _ = run(params, seq, positions, cfg, mask, 4, 6)
    other = seq.at[4:8, :6].set(seq[0, :6])  # group 1 now holds group 0's prompt (and mask)
    other_mask = mask.at[4:8, :6].set(mask[0, :6])
    moved, _ = run(params, other, tf.positions_from_mask(other_mask), cfg, other_mask, 4, 6)
    assert not np.allclose(moved[4:8], base[4:8])
    np.testing.assert_allclose(moved[:4], base[:4], atol=1e-6)
    np.testing.assert_allclose(moved[8:], base[8:], atol=1e-6)
    with pytest.raises(ValueError, match="groups of 5"):
        logprobs.grouped_next_token_logprobs(params, seq, positions, cfg, mask, 5, 6)


def test_bad_arguments_raise():
    cfg, params, h, targets = _setup(tie=True)
    with pytest.raises(ValueError, match="chunk_size"):
        logprobs.token_logprobs(params, h, targets, cfg, 0)
    tokens = jnp.zeros((N, 4), jnp.int32)
    with pytest.raises(ValueError, match="first_target"):
        logprobs.next_token_logprobs(params, tokens, tokens, cfg, first_target=4)
