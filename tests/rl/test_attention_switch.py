"""The RL update is the same computation whichever attention implementation the model runs."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.model import config as config_lib
from rlvr_jax.model import transformer as tf
from rlvr_jax.rewards import arithmetic as ar
from rlvr_jax.rl import losses
from rlvr_jax.rl import state as state_lib
from rlvr_jax.rl import train_step as ts
from rlvr_jax.sampling.config import SamplerConfig
from rlvr_jax.sampling.host import bucket_and_pad

B, G = 4, 4
# Blocks of 8 divide neither the 11-token rows (8 prompt + 3 completion) nor the completions.
CFG = config_lib.PRESETS["tiny"].replace(vocab_size=32, attention_block=8)


@pytest.fixture(scope="module")
def rollout():
    """Sampled once: prefill and decode do not depend on `attention`."""
    tok = Tokenizer.from_characters("0123456789+-*=")
    problems = ar.generate_problems(B, seed=0, num_operands=2, max_digits=1, operators="+")
    prompt_NP, lengths_N = bucket_and_pad(
        [tok.encode(p.expression + "=") for p in problems], [8], tok.pad_id, G
    )
    answers = ar.encode_answers([p.answer for p in problems for _ in range(G)], 3)
    batch = ts.Batch(jnp.asarray(prompt_NP), jnp.asarray(lengths_N), answers)
    sampler = SamplerConfig(max_new_tokens=3, eos_ids=tok.eos_ids, pad_id=tok.pad_id)
    rl = ts.RLConfig(group_size=G, sampler=sampler)
    params = tf.init_params(jax.random.key(0), CFG)
    return sampler, ts.build_rollout(CFG.replace(attention="dense"), rl)(
        params, batch, jax.random.key(1)
    )


def _update(attention: str, shared_prompt_forward: bool, sampler, rollout):
    """One SGD update (two passes, KL to a reference) on hand-set rewards."""
    cfg = CFG.replace(attention=attention)
    rl = ts.RLConfig(
        group_size=G,
        sampler=sampler,
        mu=2,
        loss=losses.LossConfig(kl_beta=0.05),
        shared_prompt_forward=shared_prompt_forward,
    )
    sgd = optax.sgd(0.1)
    ocfg = state_lib.OptimConfig(learning_rate=0.1, total_steps=10, schedule="constant")
    params = tf.init_params(jax.random.key(0), cfg)
    state = state_lib.init_train_state(params, sgd, jax.random.key(2), use_reference=True)
    state = dataclasses.replace(state, opt_state=sgd.init(state.params))
    rewards = 0.5 * (np.arange(B * G) % 3 - 1).astype(np.float32)  # every group mixed
    parts = {"correct": (rewards > 0).astype(np.float32)}
    update = ts.build_update(cfg, rl, sgd, state_lib.learning_rate_schedule(ocfg))
    return jax.device_get(update(state, rollout, rewards, parts))


def test_update_metrics_and_params_equal_between_dense_and_blockwise(rollout):
    # The default, shared-prompt update; the flat and grouped forwards are each held equal between
    # the two attentions, values and parameter gradients, in tests/model/test_attention.py.
    shared_prompt_forward = True
    sampler, rows = rollout
    new_dense, out_dense = _update("dense", shared_prompt_forward, sampler, rows)
    new_block, out_block = _update("xla_blockwise", shared_prompt_forward, sampler, rows)
    m_dense, m_block = out_dense.metrics, out_block.metrics
    assert m_dense.keys() == m_block.keys()
    assert float(m_dense["grad_norm"]) > 0 and float(m_dense["kl/mean"]) > 0
    for key in m_dense:
        np.testing.assert_allclose(m_block[key], m_dense[key], rtol=1e-5, atol=1e-6, err_msg=key)
    dense_leaves = jax.tree.leaves(new_dense.params)
    for x, y in zip(jax.tree.leaves(new_block.params), dense_leaves, strict=True):
        np.testing.assert_allclose(x, y, atol=1e-6)
