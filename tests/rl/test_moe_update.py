"""The update of a mixture-of-experts policy: its routing statistics, the router's
load-balancing loss as an option, and dense policies left as they were."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import tiny_moe
from rlvr_jax.config_types import ConfigError
from rlvr_jax.model import moe as moe_lib
from rlvr_jax.model import transformer as tf
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.rl import losses
from rlvr_jax.rl import multiturn as mt
from rlvr_jax.rl import partial as partial_lib
from rlvr_jax.rl import rows as rows_lib
from rlvr_jax.rl import train_step as ts
from rlvr_jax.sampling import loop
from rlvr_jax.sampling.config import SamplerConfig
from rlvr_jax.sampling.host import bucket_and_pad
from tests.rl.test_multiturn import EXAMPLE, EchoEnv, IdTok
from tests.rl.test_packing import CFG, MOE, SAMPLER, G, N, P, T, _rollout, _state


def _update(cfg, rl, rewards):
    sgd = optax.sgd(0.3)
    update = ts.build_update(cfg, rl, sgd, optax.constant_schedule(0.3))
    rollout = _rollout(1)
    _, out = update(_state(rl, sgd=sgd, cfg=cfg), rollout, rewards, {"correct": rewards})
    return rollout, jax.device_get(out.metrics)


def _expected_aux(params, rollout):
    """The load-balancing loss of the positions that predict the trained tokens, from
    `transformer.routing` of the rows' full pass."""
    seq = rows_lib.sequences(rollout)
    mask_N = (rollout.mask_NT & ~rollout.injected_NT).reshape(-1)

    def aux(p):
        routed, _ = tf.routing(p, seq.tokens_NS, seq.positions_NS, MOE, None, seq.mask_NS)
        at = lambda a: a[:, :, P - 1 : -1].reshape(a.shape[0], N * (a.shape[2] - P), -1)  # noqa: E731
        return moe_lib.load_balancing_loss(at(routed.probs_NE), at(routed.experts_Nk), mask_N)

    return aux


def test_the_router_loss_is_the_update_s_whole_gradient_when_advantages_are_zero():
    # Equal rewards: every advantage is 0 and so is the policy loss's gradient; what is left
    # is router_aux_coef x the gradient of the load-balancing loss.
    coef = 0.5
    rl = ts.RLConfig(group_size=G, sampler=SAMPLER, loss=losses.LossConfig(router_aux_coef=coef))
    rollout, metrics = _update(MOE, rl, np.ones(N, np.float32))
    params = tf.init_params(jax.random.key(0), MOE)
    aux = _expected_aux(params, rollout)
    np.testing.assert_allclose(metrics["moe/aux_loss"], aux(params), rtol=1e-5)
    expected_norm = coef * optax.global_norm(jax.grad(aux)(params))
    assert float(expected_norm) > 0
    np.testing.assert_allclose(metrics["grad_norm"], expected_norm, rtol=1e-4)
    # Off (the default), the update has no gradient at all from these rows.
    rl0 = ts.RLConfig(group_size=G, sampler=SAMPLER)
    _, metrics0 = _update(MOE, rl0, np.ones(N, np.float32))
    assert float(metrics0["grad_norm"]) == 0
    np.testing.assert_allclose(metrics0["moe/aux_loss"], metrics["moe/aux_loss"], rtol=1e-6)


def test_moe_metrics_are_the_trained_tokens_routing_statistics():
    rl = ts.RLConfig(group_size=G, sampler=SAMPLER, num_microbatches=1)
    rollout, metrics = _update(MOE, rl, np.asarray(np.arange(N) % 3 == 0, np.float32))
    params = tf.init_params(jax.random.key(0), MOE)
    seq = rows_lib.sequences(rollout)
    routed, _ = tf.routing(params, seq.tokens_NS, seq.positions_NS, MOE, None, seq.mask_NS)
    at = lambda a: a[:, :, P - 1 : -1].reshape(a.shape[0], -1, a.shape[-1])  # noqa: E731
    mask_N = (rollout.mask_NT & ~rollout.injected_NT).reshape(-1)
    low, high = moe_lib.expert_load(at(routed.experts_Nk), mask_N, MOE.num_experts)
    np.testing.assert_allclose(metrics["moe/load_min"], low, rtol=1e-6)
    np.testing.assert_allclose(metrics["moe/load_max"], high, rtol=1e-6)
    entropy = moe_lib.router_entropy(at(routed.probs_NE), mask_N)
    np.testing.assert_allclose(metrics["moe/router_entropy"], entropy, rtol=1e-5)


def test_a_dense_policy_logs_no_moe_metrics_and_refuses_the_router_loss():
    rl = ts.RLConfig(group_size=G, sampler=SAMPLER)
    _, metrics = _update(CFG, rl, np.asarray(np.arange(N) % 3 == 0, np.float32))
    assert not [k for k in metrics if k.startswith("moe/")]
    bad = ts.RLConfig(group_size=G, sampler=SAMPLER, loss=losses.LossConfig(router_aux_coef=0.1))
    sgd = optax.sgd(0.1)
    with pytest.raises(ConfigError, match="rl.loss.router_aux_coef=0.1 with model_type='qwen2'"):
        ts.build_update(CFG, bad, sgd, optax.constant_schedule(0.1))
    with pytest.raises(ValueError, match="router_aux_coef=-0.1 must be a finite number >= 0"):
        losses.LossConfig(router_aux_coef=-0.1)


def test_the_router_loss_setting_reads_from_a_config():
    c = tiny_moe.get_config()
    c.rl.loss.router_aux_coef = 0.01
    s = settings_lib.settings_from_config(c)
    assert s.rl.loss.router_aux_coef == 0.01
    c.rl.loss.router_aux_coef = -1.0
    with pytest.raises(ConfigError, match="router_aux_coef=-1.0"):
        settings_lib.settings_from_config(c)


def _sampled(params, prompt_group=1):
    """A rollout of the MoE policy from the static decode loop, on `_rollout`'s prompts."""
    prompts = _rollout(1)
    sampler = SamplerConfig(max_new_tokens=T, eos_ids=(1,), pad_id=0, prompt_group=prompt_group)
    return loop.sample(
        params,
        np.asarray(prompts.prompt_NP),
        np.asarray(prompts.prompt_lengths_N),
        jax.random.key(5),
        MOE,
        sampler,
    )


@pytest.mark.parametrize("prompt_group", [1, G])
def test_the_decode_loop_records_the_experts_the_full_forward_routes_to(prompt_group):
    params = tf.init_params(jax.random.key(0), MOE)
    rollout = _sampled(params, prompt_group)
    assert rollout.experts_NTLk.shape == (N, T, MOE.num_layers, MOE.num_experts_per_tok)
    seq = rows_lib.sequences(rollout)
    routed, _ = tf.routing(params, seq.tokens_NS, seq.positions_NS, MOE, None, seq.mask_NS)
    full_NTLk = np.moveaxis(np.asarray(routed.experts_Nk[:, :, P - 1 : -1]), 0, 2)
    mask = np.asarray(rollout.mask_NT)
    assert mask.sum() > N
    np.testing.assert_array_equal(np.asarray(rollout.experts_NTLk)[mask], full_NTLk[mask])


def test_a_dense_rollout_records_no_experts():
    prompts = _rollout(1)
    rollout = loop.sample(
        tf.init_params(jax.random.key(0), CFG),
        np.asarray(prompts.prompt_NP),
        np.asarray(prompts.prompt_lengths_N),
        jax.random.key(5),
        CFG,
        SAMPLER,
    )
    assert rollout.experts_NTLk is None


@pytest.mark.parametrize("shared_prompt", [True, False])
def test_routing_disagreement_is_zero_between_the_rollout_and_the_update(shared_prompt):
    params = tf.init_params(jax.random.key(0), MOE)
    rollout = _sampled(params)
    rewards = np.asarray(np.arange(N) % 3 == 0, np.float32)
    rl = ts.RLConfig(group_size=G, sampler=SAMPLER, shared_prompt_forward=shared_prompt)
    sgd = optax.sgd(0.3)
    update = ts.build_update(MOE, rl, sgd, optax.constant_schedule(0.3))
    _, out = update(_state(rl, sgd=sgd, cfg=MOE), rollout, rewards, {"correct": rewards})
    assert float(out.metrics["moe/routing_disagreement"]) == 0.0
    # Sampled by another policy, the same tokens are routed elsewhere: the metric can tell.
    other = _sampled(tf.init_params(jax.random.key(9), MOE))
    _, out = update(_state(rl, sgd=sgd, cfg=MOE), other, rewards, {"correct": rewards})
    assert float(out.metrics["moe/routing_disagreement"]) > 0.5


# ---------------------------------------------------------------------------------------------
# The other rollout paths record the experts too: continuous batching, partial rollouts, turns


def _routing_disagreement(rollout, group_size, sampler, params=None):
    """The update's "moe/routing_disagreement" of `rollout`, from the policy `params` (the
    tiny MoE's key-0 weights by default)."""
    rewards = np.asarray(np.arange(rollout.tokens_NT.shape[0]) % 3 == 0, np.float32)
    rl = ts.RLConfig(group_size=group_size, sampler=sampler)
    sgd = optax.sgd(0.3)
    update = ts.build_update(MOE, rl, sgd, optax.constant_schedule(0.3))
    state = _state(rl, params, sgd=sgd, cfg=MOE)
    _, out = update(state, rollout, rewards, {"correct": rewards})
    return float(out.metrics["moe/routing_disagreement"])


def _full_forward_experts(params, rollout, P_rollout):
    """(N, T, L, k): the experts a full forward of the rows routes the position that predicts
    each completion token to."""
    seq = rows_lib.sequences(rollout)
    routed, _ = tf.routing(params, seq.tokens_NS, seq.positions_NS, MOE, None, seq.mask_NS)
    return np.moveaxis(np.asarray(routed.experts_Nk[:, :, P_rollout - 1 : -1]), 0, 2)


def _rollout_fn(slots):
    """The RL step's rollout (`train_step.build_rollout`) with `slots` decode slots."""
    rl = ts.RLConfig(group_size=G, sampler=SAMPLER, decode_slots=slots)
    return ts.build_rollout(MOE, rl)


def test_continuous_batching_in_the_step_records_the_static_loop_s_experts():
    params = tf.init_params(jax.random.key(0), MOE)
    prompts = _rollout(1)
    batch = ts.Batch(prompts.prompt_NP, prompts.prompt_lengths_N)
    static = _rollout_fn(N)(params, batch, jax.random.key(5))
    continuous = _rollout_fn(N // 4)(params, batch, jax.random.key(5))
    assert int(continuous.decode_steps_N[0]) > int(static.decode_steps_N[0])  # slots refilled
    np.testing.assert_array_equal(continuous.tokens_NT, static.tokens_NT)
    mask = np.asarray(static.mask_NT)
    np.testing.assert_array_equal(
        np.asarray(continuous.experts_NTLk)[mask], np.asarray(static.experts_NTLk)[mask]
    )
    assert _routing_disagreement(continuous, G, SAMPLER) == 0.0


@pytest.mark.parametrize("slots", [N, N // 4])
def test_partial_rollouts_keep_each_round_s_experts(slots):
    """Rows decoded 3 tokens a round (so over several rounds), re-prefilled each round, with
    one policy: every token keeps the experts its round routed it to, which the full forward
    of the finished rows matches, so the update's disagreement is 0."""
    params = tf.init_params(jax.random.key(0), MOE)
    prompts = jax.device_get(_rollout(1))
    budget = 3
    segment_sampler = dataclasses.replace(SAMPLER, max_new_tokens=budget)
    # As `partial_stage.build_partial_batch` builds it: a round's rows have their own contexts.
    rl = ts.RLConfig(
        group_size=G, sampler=segment_sampler, decode_slots=slots, shared_prompt_forward=False
    )
    segment_fn = ts.build_rollout(MOE, rl)
    groups = [
        partial_lib.new_group(
            b, prompts.prompt_NP[b * G, P - prompts.prompt_lengths_N[b * G] :], G, T, 0
        )
        for b in range(N // G)
    ]
    first = None
    for r in range(T):
        if all(g.complete for g in groups):
            break
        ctx = partial_lib.contexts(groups)
        prompt_NP, lengths_N = bucket_and_pad(ctx, (P + T,), 0)
        batch = ts.Batch(jnp.asarray(prompt_NP), jnp.asarray(lengths_N))
        seg = jax.device_get(segment_fn(params, batch, jax.random.key(r)))
        partial_lib.absorb(groups, seg, version=r)
        if first is None:
            first = seg
    rollout = partial_lib.training_rollout(groups, (P,), 0)
    experts, mask = np.asarray(rollout.experts_NTLk), np.asarray(rollout.mask_NT)
    assert np.asarray(rollout.lengths_N).max() > 2 * budget  # rows over three rounds
    # The first round's tokens keep that round's experts.
    first_mask = np.asarray(first.mask_NT)
    np.testing.assert_array_equal(
        experts[:, :budget][first_mask], np.asarray(first.experts_NTLk)[first_mask]
    )
    np.testing.assert_array_equal(experts[mask], _full_forward_experts(params, rollout, P)[mask])
    assert _routing_disagreement(rollout, G, SAMPLER) == 0.0
    # From another policy than the one that sampled, the metric moves.
    other = tf.init_params(jax.random.key(9), MOE)
    assert _routing_disagreement(rollout, G, SAMPLER, other) > 0.5


def test_multi_turn_episodes_record_the_sampled_tokens_experts_only():
    """Episodes with tool observations on the tiny MoE: the sampled tokens' experts are the full
    forward's; the observations' (injected, not trained) are not, and the update's metric,
    over the trained tokens only, is 0."""
    cfg = MOE.replace(vocab_size=128)
    params = tf.init_params(jax.random.key(0), cfg)
    scfg = SamplerConfig(
        max_new_tokens=6, eos_ids=(3,), stop_sequences=tuple((t,) for t in range(60, 76))
    )
    decode = mt.sampler_decode(params, cfg, scfg, (64,), 0, jax.random.key(0))
    episode_T = 48
    rollout, stats = mt.run_episodes(
        decode,
        [EchoEnv() for _ in range(4)],
        [EXAMPLE, EXAMPLE],
        IdTok(),
        mt.EpisodeConfig(max_new_tokens=episode_T, max_turns=8),
        (8,),
        0,
    )
    r = jax.device_get(rollout)
    injected, mask = np.asarray(r.injected_NT), np.asarray(r.mask_NT)
    sampled = mask & ~injected
    assert stats.tool_calls_N.sum() >= 4 and injected.any() and sampled.sum() > 40
    seq = rows_lib.sequences(rollout)
    routed, _ = tf.routing(params, seq.tokens_NS, seq.positions_NS, cfg, None, seq.mask_NS)
    full = np.moveaxis(np.asarray(routed.experts_Nk[:, :, 8 - 1 : -1]), 0, 2)
    experts = np.asarray(r.experts_NTLk)
    np.testing.assert_array_equal(experts[sampled], full[sampled])
    assert not experts[injected].any()
    # Counting the observations would not give 0: the metric counts the trained tokens only.
    flat = lambda a: np.moveaxis(a, 2, 0).reshape(cfg.num_layers, -1, a.shape[-1])  # noqa: E731
    assert float(moe_lib.routing_disagreement(flat(full), flat(experts), mask.reshape(-1))) > 0
    sampler = dataclasses.replace(scfg, max_new_tokens=episode_T)
    rewards = np.ones(4, np.float32)
    rl = ts.RLConfig(group_size=2, sampler=sampler)
    sgd = optax.sgd(0.3)
    update = ts.build_update(cfg, rl, sgd, optax.constant_schedule(0.3))
    _, out = update(_state(rl, params, sgd=sgd, cfg=cfg), rollout, rewards, {"correct": rewards})
    assert float(out.metrics["moe/routing_disagreement"]) == 0.0
