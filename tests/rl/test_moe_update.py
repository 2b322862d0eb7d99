"""The update of a mixture-of-experts policy: its routing statistics, the router's
load-balancing loss as an option, and dense policies left as they were."""

import jax
import numpy as np
import optax
import pytest

from configs import tiny_moe
from rlvr_jax.config_types import ConfigError
from rlvr_jax.model import moe as moe_lib
from rlvr_jax.model import transformer as tf
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.rl import losses
from rlvr_jax.rl import rows as rows_lib
from rlvr_jax.rl import train_step as ts
from rlvr_jax.sampling import loop
from rlvr_jax.sampling.config import SamplerConfig
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
