"""The train step: it learns, compiles once, and its paths and accumulation agree."""

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
from rlvr_jax.rl import advantages, losses
from rlvr_jax.rl import rows as rows_lib
from rlvr_jax.rl import state as state_lib
from rlvr_jax.rl import train_step as ts
from rlvr_jax.sampling.config import SamplerConfig
from rlvr_jax.sampling.host import bucket_and_pad

B, G = 8, 4


def _arrays(tree):
    """Leaves as numpy arrays (PRNG keys as their raw data)."""
    raw = lambda x: jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x
    return [np.asarray(raw(x)) for x in jax.tree.leaves(tree)]


@pytest.fixture(scope="module")
def task():
    tok = Tokenizer.from_characters("0123456789+-*=")
    cfg = config_lib.PRESETS["tiny"].replace(vocab_size=32)
    table = ar.DigitTable.from_tokenizer(tok, cfg.vocab_size)
    problems = ar.generate_problems(2048, seed=0, num_operands=2, max_digits=1, operators="+")

    def batch(i: int, b: int = B, g: int = G) -> ts.Batch:
        ps = problems[i * b : (i + 1) * b]
        prompt_NP, lengths_N = bucket_and_pad(
            [tok.encode(p.expression + "=") for p in ps], [8], tok.pad_id, g
        )
        answers = ar.encode_answers([p.answer for p in ps for _ in range(g)], 3)
        return ts.Batch(jnp.asarray(prompt_NP), jnp.asarray(lengths_N), answers)

    sampler = SamplerConfig(max_new_tokens=3, eos_ids=tok.eos_ids, pad_id=tok.pad_id)
    return cfg, table, batch, sampler


def _build(task, lr=3e-3, format_weight=0.5, **rl_kwargs):
    cfg, table, _, sampler = task
    rl = ts.RLConfig(group_size=G, sampler=sampler, **rl_kwargs)
    ocfg = state_lib.OptimConfig(learning_rate=lr, total_steps=100, schedule="constant")
    opt = state_lib.make_optimizer(ocfg)
    sched = state_lib.learning_rate_schedule(ocfg)
    reward_fn = ar.make_reward_fn(table, format_weight)
    params = tf.init_params(jax.random.key(0), cfg)
    use_ref = rl.loss.kl_beta > 0
    state = state_lib.init_train_state(params, opt, jax.random.key(1), use_reference=use_ref)
    return rl, opt, sched, reward_fn, state


def test_mean_reward_rises_on_arithmetic_from_scratch(task):
    cfg, _, batch, _ = task
    rl, opt, sched, reward_fn, state = _build(task)
    step = ts.build_train_step(cfg, rl, opt, sched, reward_fn)
    rewards = []
    for i in range(40):
        state, out = step(state, batch(i, b=16, g=G))
        rewards.append(float(out.metrics["reward/mean"]))
    first, last = np.mean(rewards[:8]), np.mean(rewards[-8:])
    # Per-step reward std over 64 rows is below 0.1; the rise must be several times that.
    assert last > first + 0.25, rewards
    assert int(state.step) == 40


def test_no_recompilation_after_the_first_step(task):
    cfg, _, batch, _ = task
    rl, opt, sched, reward_fn, state = _build(task)
    step = ts.build_train_step(cfg, rl, opt, sched, reward_fn)
    state, _ = step(state, batch(0))
    compiled = step._cache_size()
    with jax.log_compiles():
        for i in (1, 2):
            state, out = step(state, batch(i))
    jax.block_until_ready(out)
    assert step._cache_size() == compiled == 1


def test_fused_step_equals_rollout_host_reward_update(task):
    cfg, _, batch, _ = task
    rl, opt, sched, reward_fn, state = _build(task)
    fused = ts.build_train_step(cfg, rl, opt, sched, reward_fn)
    rollout_fn = ts.build_rollout(cfg, rl)
    update_fn = ts.build_update(cfg, rl, opt, sched)
    copy = jax.tree.map(jnp.copy, state)
    b = batch(3)
    new_fused, out_fused = fused(state, b)
    split_state, key = ts.split_rollout_key(copy)
    rollout = rollout_fn(split_state.params, b, key)
    rewards, parts = jax.device_get(reward_fn(rollout, b.targets))  # "host" rewards
    new_split, out_split = update_fn(split_state, rollout, rewards, parts)
    for x, y in zip(_arrays(new_fused), _arrays(new_split), strict=True):
        np.testing.assert_allclose(x, y, atol=1e-6)
    for x, y in zip(_arrays(out_fused), _arrays(out_split), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    assert float(out_fused.metrics["reward/mean"]) == float(out_split.metrics["reward/mean"])


def test_step_output_has_scalar_metrics_and_the_rows_results(task):
    """Per-row results travel in `out.rows`, not in the metrics: the verifier's successes
    (reward > 0 without a "correct" part), the advantages and lengths, in row order."""
    cfg, _, batch, _ = task
    rl, opt, sched, _, state = _build(task, advantage=advantages.AdvantageConfig("rloo"))
    rollout_fn = ts.build_rollout(cfg, rl)
    update_fn = ts.build_update(cfg, rl, opt, sched)
    state, key = ts.split_rollout_key(state)
    b = batch(7)
    rollout = rollout_fn(state.params, b, key)
    # "Host" results, chosen so that success and reward > 0 disagree on some rows.
    rewards = 0.5 * (np.arange(B * G) % 3 - 1).astype(np.float32)
    parts = {"correct": (np.arange(B * G) % 2).astype(np.float32), "format": rewards}
    adv_BG, _ = advantages.compute_advantages(jnp.asarray(rewards).reshape(B, G), rl.advantage)
    for with_correct in (True, False):
        given = parts if with_correct else {"format": parts["format"]}
        fresh = jax.tree.map(jnp.copy, state)  # the update donates the state
        _, out = jax.device_get(update_fn(fresh, rollout, rewards, given))
        assert isinstance(out, ts.StepOutput)
        assert not any(k.startswith("rows/") for k in out.metrics)
        assert all(np.ndim(v) == 0 for v in out.metrics.values())
        want_correct = parts["correct"] if with_correct else (rewards > 0).astype(np.float32)
        np.testing.assert_array_equal(out.rows.correct_N, want_correct)
        np.testing.assert_array_equal(out.rows.lengths_N, np.asarray(rollout.lengths_N))
        np.testing.assert_allclose(out.rows.adv_N, np.asarray(adv_BG).reshape(-1), atol=1e-6)
        assert float(out.metrics["reward/mean"]) == pytest.approx(float(np.mean(rewards)))
        # The sampler's log-probs and the trainer's recomputation, same parameters, f32.
        assert float(out.metrics["mismatch/max"]) < 1e-4, out.metrics["mismatch/max"]
        assert 0 <= float(out.metrics["mismatch/kl"]) < 1e-8
    assert 0 < want_correct.sum() < B * G and np.any(parts["correct"] != want_correct)


# All four modes are checked exactly at the loss level (tests/rl/test_losses.py); here two of
# them go through the whole step. SGD keeps the update linear in the gradient, so parameters can
# be compared tightly (Adam's first step is lr * sign(g), which amplifies float noise).
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_microbatches_give_the_full_batch_update(task, aggregation):
    cfg, _, batch, _ = task
    results = []
    for micro in (1, 4):
        loss = losses.LossConfig(aggregation=aggregation)
        rl, _, sched, reward_fn, state = _build(task, num_microbatches=micro, loss=loss)
        sgd = optax.sgd(0.1)
        state = dataclasses.replace(state, opt_state=sgd.init(state.params))
        step = ts.build_train_step(cfg, rl, sgd, sched, reward_fn)
        new, out = step(state, batch(5, b=32))
        results.append((new.params, float(out.metrics["grad_norm"])))
    (p1, g1), (p4, g4) = results
    assert g1 > 0
    np.testing.assert_allclose(g4, g1, rtol=1e-5)
    for x, y in zip(jax.tree.leaves(p1), jax.tree.leaves(p4), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6)


def test_shared_prompt_forward_gives_the_same_update(task):
    """Each group's prompt run once (the default) or G times: the same step, to float noise.

    On whole groups in microbatches, the old and reference log-probs too (mu=2, a KL term), and
    on shuffled minibatch rows, where only the per-group gradient norms need the groups."""
    cfg, _, batch, _ = task
    kwargs = dict(
        num_microbatches=2,
        num_minibatches=2,
        mu=2,
        loss=losses.LossConfig(kl_beta=0.05),
        group_grad_norms=True,
    )
    results = []
    for shared in (True, False):
        rl, _, sched, reward_fn, state = _build(task, shared_prompt_forward=shared, **kwargs)
        sgd = optax.sgd(0.1)
        state = dataclasses.replace(state, opt_state=sgd.init(state.params))
        step = ts.build_train_step(cfg, rl, sgd, sched, reward_fn)
        results.append(step(state, batch(6)))
    (new_a, out_a), (new_b, out_b) = results
    m_a, m_b = out_a.metrics, out_b.metrics
    assert float(m_a["grad_norm"]) > 0
    np.testing.assert_allclose(float(m_a["grad_norm"]), float(m_b["grad_norm"]), rtol=1e-4)
    for x, y in zip(jax.tree.leaves(new_a.params), jax.tree.leaves(new_b.params), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6)
    assert m_a.keys() == m_b.keys()
    for k in m_a:  # the KL to the reference, the per-group gradient norms, ...
        np.testing.assert_allclose(np.asarray(m_a[k]), np.asarray(m_b[k]), rtol=1e-4, atol=1e-6)


def test_off_policy_minibatches_kl_and_metrics(task):
    cfg, _, batch, _ = task
    loss = losses.LossConfig(clip_low=0.1, clip_high=0.1, kl_beta=0.05, kl_estimator="k3")
    rl, opt, sched, reward_fn, state = _build(
        task,
        lr=3e-2,
        mu=2,
        num_minibatches=2,
        loss=loss,
        advantage=advantages.AdvantageConfig("rloo"),
    )
    assert state.ref_params is not None
    step = ts.build_train_step(cfg, rl, opt, sched, reward_fn)
    for i in range(3):
        state, out = step(state, batch(i))
    m = jax.device_get(out.metrics)
    assert int(state.step) == 3 * 4  # mu x num_minibatches updates per step
    for key in (
        "reward/mean", "reward/std", "reward/correct", "reward/format", "accuracy",
        "adv/frac_all_correct", "adv/frac_all_wrong", "length/mean", "length/p50", "length/p95",
        "length/max", "length/truncated", "kl/mean", "clip/frac_low", "clip/frac_high",
        "ratio/min", "ratio/mean", "ratio/max", "entropy/mean", "grad_norm", "update_norm",
        "learning_rate", "loss/tokens",
    ):  # fmt: skip
        assert np.isfinite(m[key]), key
    # After the first minibatch the policy has moved: ratios leave 1 and KL is positive.
    assert m["ratio/max"] > 1.0 or m["ratio/min"] < 1.0
    assert m["kl/mean"] > 0
    assert 0 < m["loss/tokens"] <= B * G * 3


def test_bad_settings_are_named(task):
    _, _, _, sampler = task
    with pytest.raises(ValueError, match="group_size=1"):
        ts.RLConfig(group_size=1, sampler=sampler)
    rl = ts.RLConfig(group_size=4, sampler=sampler, num_minibatches=3)
    with pytest.raises(ValueError, match="3 minibatches"):
        rl.check_rows(32)
    with pytest.raises(ValueError, match="learning_rate=0"):
        state_lib.OptimConfig(learning_rate=0)


def test_learning_rate_schedule_warmup_then_cosine():
    sched = state_lib.learning_rate_schedule(
        state_lib.OptimConfig(learning_rate=1.0, warmup_steps=10, total_steps=110)
    )
    assert float(sched(0)) == 0.0
    assert float(sched(5)) == pytest.approx(0.5)
    assert float(sched(10)) == pytest.approx(1.0)
    assert float(sched(60)) == pytest.approx(0.5, abs=1e-6)  # half way down the cosine
    assert float(sched(110)) == pytest.approx(0.0, abs=1e-6)


def test_train_state_is_a_pytree(task):
    *_, state = _build(task)
    leaves = jax.tree.leaves(state)
    assert len(leaves) > 10
    assert dataclasses.is_dataclass(state)


def test_expert_iteration_is_sft_on_the_verified_samples(task):
    """One expert-iteration update equals an optimizer step on the token-mean NLL of the
    verified completions alone (the rejected ones leave the loss and its token count)."""
    from rlvr_jax.rl.logprobs import next_token_logprobs

    cfg, _, batch, _ = task
    loss = losses.LossConfig(policy_loss="reinforce", aggregation="token_mean")
    adv = advantages.AdvantageConfig("expert_iteration")
    rl, _, sched, _, state = _build(task, loss=loss, advantage=adv)
    sgd = optax.sgd(0.5)
    state = dataclasses.replace(state, opt_state=sgd.init(state.params))
    params0 = jax.tree.map(jnp.copy, state.params)
    state, key = ts.split_rollout_key(state)
    rollout = ts.build_rollout(cfg, rl)(state.params, batch(0), key)
    keep_N = np.arange(B * G) % 3 == 0  # "verified" rows, set by hand
    parts = {"correct": jnp.asarray(keep_N, jnp.float32)}
    new, out = ts.build_update(cfg, rl, sgd, sched)(state, rollout, parts["correct"], parts)

    seq = rows_lib.sequences(rollout)
    kept_NT = rollout.mask_NT & keep_N[:, None]

    def nll(p):
        logp, _ = next_token_logprobs(
            p, seq.tokens_NS, seq.positions_NS, cfg, seq.mask_NS, first_target=seq.prompt_len
        )
        return -jnp.sum(jnp.where(kept_NT, logp, 0.0)) / jnp.sum(kept_NT)

    grads = jax.grad(nll)(params0)
    expected = optax.apply_updates(params0, sgd.update(grads, sgd.init(params0))[0])
    assert float(out.metrics["loss/tokens"]) == float(jnp.sum(kept_NT)) > 0
    for x, y in zip(jax.tree.leaves(new.params), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6)
    with pytest.raises(ValueError, match="policy_loss='ppo_clip'"):
        ts.RLConfig(group_size=G, sampler=task[3], advantage=adv)


def test_continuous_batching_gives_the_same_step_and_busier_slots(task):
    """`rl.decode_slots` < N: slots take queued rows as theirs end; each row keeps its random
    stream, so the rollout, rewards and update are the static sampler's."""
    cfg, _, batch, _ = task
    results = {}
    for slots in (B * G, 5):  # the static sampler; 5 slots do not divide the 32 rows
        rl, opt, sched, reward_fn, state = _build(task, decode_slots=slots)
        step = ts.build_train_step(cfg, rl, opt, sched, reward_fn)
        results[slots] = step(state, batch(3))
    (new_a, out_a), (new_b, out_b) = results[B * G], results[5]
    np.testing.assert_array_equal(out_a.rows.lengths_N, out_b.rows.lengths_N)
    np.testing.assert_array_equal(out_a.rows.adv_N, out_b.rows.adv_N)
    for x, y in zip(jax.tree.leaves(new_a.params), jax.tree.leaves(new_b.params), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6)
    m_a, m_b = jax.device_get((out_a.metrics, out_b.metrics))
    lengths = np.asarray(out_a.rows.lengths_N)
    assert float(m_a["rollout/decode_steps"]) == lengths.max() - 1
    np.testing.assert_allclose(m_a["rollout/slot_utilisation"], lengths.mean() / lengths.max())
    assert m_b["rollout/decode_steps"] > m_a["rollout/decode_steps"]
    steps_b = float(m_b["rollout/decode_steps"])
    np.testing.assert_allclose(
        m_b["rollout/slot_utilisation"], lengths.sum() / (5 * (steps_b + 1)), rtol=1e-6
    )
    for k in m_a.keys() - {"rollout/decode_steps", "rollout/slot_utilisation"}:
        np.testing.assert_allclose(np.asarray(m_a[k]), np.asarray(m_b[k]), rtol=1e-5, atol=1e-6)


def test_a_bf16_policy_logs_its_norms_in_f32(task):
    """bf16 parameters give bf16 gradients; their norms are summed in f32 (a bf16 sum of
    squares keeps 8 bits and the metrics writer refuses bf16 scalars)."""
    cfg, table, batch, sampler = task
    cfg = cfg.replace(dtype="bfloat16", param_dtype="bfloat16")
    rl, opt, sched, reward_fn, _ = _build(task)
    params = tf.init_params(jax.random.key(0), cfg)
    state = state_lib.init_train_state(params, opt, jax.random.key(1), use_reference=False)
    _, out = ts.build_train_step(cfg, rl, opt, sched, reward_fn)(state, batch(0))
    for name in ("grad_norm", "update_norm"):
        assert out.metrics[name].dtype == jnp.float32, name
        assert np.isfinite(float(out.metrics[name]))
