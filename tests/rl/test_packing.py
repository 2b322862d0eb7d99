"""The packed update: its plan places every real token once, and the update it runs equals the
padded update on the same rollout, for every objective."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlvr_jax.model import attention as attention_lib
from rlvr_jax.model import config as config_lib
from rlvr_jax.model import lora as lora_lib
from rlvr_jax.model import transformer as tf
from rlvr_jax.rl import advantages as adv_lib
from rlvr_jax.rl import losses
from rlvr_jax.rl import packing as packing_lib
from rlvr_jax.rl import state as state_lib
from rlvr_jax.rl import train_step as ts
from rlvr_jax.rl import update as update_lib
from rlvr_jax.rl import value as value_lib
from rlvr_jax.sampling.config import SamplerConfig
from rlvr_jax.types import FINISH_EOS, FINISH_LENGTH, Rollout

B, G, P, T = 4, 4, 6, 12
N = B * G
CFG = config_lib.PRESETS["tiny"].replace(vocab_size=32)
MOE = config_lib.PRESETS["tiny-moe"].replace(vocab_size=32)


def _rollout(seed: int = 0) -> Rollout:
    """B left-padded prompts x G right-padded completions of long-tailed lengths."""
    rng = np.random.default_rng(seed)
    prompt_lengths = np.repeat(rng.integers(2, P + 1, B), G)
    lengths = np.minimum(rng.geometric(0.25, N), T)
    lengths[3] = T  # one truncated row
    lengths[5] = 1
    prompt = np.where(
        np.arange(P)[None, :] >= P - prompt_lengths[:, None], rng.integers(1, 32, (N, P)), 0
    )
    prompt = np.repeat(prompt[::G], G, axis=0)
    mask = np.arange(T)[None, :] < lengths[:, None]
    tokens = np.where(mask, rng.integers(1, 32, (N, T)), 0)
    logp = np.where(mask, -rng.uniform(0.5, 3.0, (N, T)), 0.0).astype(np.float32)
    injected = np.zeros((N, T), bool)
    injected[7, :2] = mask[7, :2]  # forced tokens: context, not loss
    return Rollout(
        prompt_NP=jnp.asarray(prompt, jnp.int32),
        prompt_lengths_N=jnp.asarray(prompt_lengths, jnp.int32),
        tokens_NT=jnp.asarray(tokens, jnp.int32),
        logp_NT=jnp.asarray(logp),
        mask_NT=jnp.asarray(mask),
        injected_NT=jnp.asarray(injected),
        lengths_N=jnp.asarray(lengths, jnp.int32),
        finish_N=jnp.asarray(np.where(lengths == T, FINISH_LENGTH, FINISH_EOS), jnp.int32),
    )


def _plan(rollout: Rollout, **kwargs) -> packing_lib.Packing:
    p = packing_lib.plan(
        np.asarray(rollout.prompt_lengths_N), np.asarray(rollout.mask_NT), P, **kwargs
    )
    return jax.tree.map(jnp.asarray, p)


@pytest.mark.parametrize("length", [20, 0])
def test_the_plan_places_every_real_token_once_with_its_position(length):
    rollout = _rollout()
    seq_tokens = np.concatenate([rollout.prompt_NP, rollout.tokens_NT], axis=1)
    plan = packing_lib.plan(
        np.asarray(rollout.prompt_lengths_N),
        np.asarray(rollout.mask_NT),
        P,
        length=length,
        num_microbatches=2,
        block=4,
    )
    M, R, L = plan.src_MRL.shape
    real = plan.segment_MRL > 0
    placed = np.sort(plan.src_MRL[real])
    prompt_real = np.arange(P)[None, :] >= P - np.asarray(rollout.prompt_lengths_N)[:, None]
    want = np.flatnonzero(np.concatenate([prompt_real, np.asarray(rollout.mask_NT)], axis=1))
    np.testing.assert_array_equal(placed, want)
    used = real.any(axis=2).sum()
    assert M * R * L < N * (P + T) and real.sum() >= 0.75 * used * L  # full packed rows
    if not length:  # one row per microbatch, of the shortest bucket that holds them
        assert R == 1 and L in packing_lib.length_buckets(N // 2 * (P + T), 4)
        assert M * (L - 4) < real.sum() <= M * L
    # Each completion token's predictor is the token before it, in the same microbatch.
    lengths = np.asarray(rollout.lengths_N)
    for n in range(N):
        m = plan.micro_N[n]
        flat_src = plan.src_MRL[m].reshape(-1)
        for t in range(lengths[n]):
            here = plan.at_MK[m, plan.pred_NT[n, t]]
            assert flat_src[here + 1] == n * (P + T) + P + t
            assert seq_tokens.reshape(-1)[flat_src[here + 1]] == rollout.tokens_NT[n, t]
    # The unembedding's R rows hold the completion tokens, not the prompts: shorter than L.
    completion = np.asarray(rollout.mask_NT).sum()
    assert plan.at_MK.shape == (M, plan.at_MK.shape[1]) and plan.at_MK.shape[1] % R == 0
    assert completion <= M * plan.at_MK.shape[1] < M * R * L
    # Tokens per microbatch are balanced to within the longest row.
    per_micro = real.reshape(M, -1).sum(axis=1)
    assert per_micro.max() - per_micro.min() <= P + T


def test_a_groups_prompt_is_packed_once_per_packed_row_its_completions_share():
    rollout = _rollout()
    prompt_lengths, mask = np.asarray(rollout.prompt_lengths_N), np.asarray(rollout.mask_NT)
    lengths = mask.sum(axis=1)
    for length in (P + T, 2 * (P + T), 0):
        plan = packing_lib.plan(prompt_lengths, mask, P, length=length, group_size=G, block=4)
        L = plan.src_MRL.shape[2]
        src, seg = plan.src_MRL.reshape(-1, L), plan.segment_MRL.reshape(-1, L)
        real = seg > 0
        is_prompt = (src % (P + T)) < P
        # Every completion token once; each group's prompt once per packed row that holds
        # completions of the group, so fewer prompt tokens than one per row.
        completion = np.sort(src[real & ~is_prompt])
        want = np.flatnonzero(np.concatenate([np.zeros((N, P), bool), mask], axis=1))
        np.testing.assert_array_equal(completion, want)
        group_of = src // (P + T) // G
        for r in range(src.shape[0]):
            groups = set(group_of[r][real[r] & ~is_prompt[r]].tolist())
            prompts = [int(prompt_lengths[g * G]) for g in groups]
            assert (real[r] & is_prompt[r]).sum() == sum(prompts)
        assert (real & is_prompt).sum() < prompt_lengths[lengths > 0].sum()
        # The prompt is branch 0 of its sequence; each completion its own branch, which sees
        # the prompt and itself only.
        branch = seg % attention_lib.BRANCHES
        assert (branch[real & is_prompt] == 0).all()
        for r in range(src.shape[0]):
            for one in set(seg[r][real[r] & (branch[r] > 0)].tolist()):
                assert len(set((src[r][seg[r] == one] // (P + T)).tolist())) == 1
        q, k = seg[:, :, None], seg[:, None, :]
        sees = np.asarray(attention_lib.segment_visible(q, k)) & real[:, None, :]
        same_row_or_prompt = (src[:, :, None] // (P + T) == src[:, None, :] // (P + T)) | (
            is_prompt[:, None, :] & (group_of[:, :, None] == group_of[:, None, :])
        )
        assert not (sees & real[:, :, None] & ~same_row_or_prompt).any()


def test_row_counts_and_lengths_are_bucketed_and_bad_rows_named():
    assert packing_lib.row_buckets(24, 8) == [8, 16, 24]
    assert packing_lib.row_buckets(40, 2) == [*range(2, 34, 2), 36, 40]
    assert packing_lib.row_buckets(100, 1)[-8:] == [56, 60, 64, 72, 80, 88, 96, 100]
    # Whole attention blocks, sixteen lengths per doubling from 16 blocks on.
    lengths = packing_lib.length_buckets(5000, 128)
    assert lengths[:17] == [128 * k for k in range(1, 18)]
    assert lengths[-6:] == [3968, 4096, 4352, 4608, 4864, 5000]
    rollout = _rollout()
    prompts, mask = np.asarray(rollout.prompt_lengths_N), np.asarray(rollout.mask_NT)
    plan = packing_lib.plan(prompts, mask, P, length=P + T)
    assert plan.src_MRL.shape[1] in packing_lib.row_buckets(N, 1)
    plan = packing_lib.plan(prompts, mask, P, block=4)
    assert plan.src_MRL.shape[1:] in [(1, n) for n in packing_lib.length_buckets(N * (P + T), 4)]
    with pytest.raises(ValueError, match="real tokens, more than rl.pack_length=8"):
        packing_lib.plan(prompts, mask, P, length=8)
    with pytest.raises(ValueError, match="real tokens, more than a packed row's 10"):
        packing_lib.plan(prompts, mask, P, microbatch_tokens=10)
    holed = np.asarray(rollout.mask_NT).copy()
    holed[2, 0] = False
    with pytest.raises(ValueError, match="row 2's completion tokens are not a prefix"):
        packing_lib.plan(np.asarray(rollout.prompt_lengths_N), holed, P)


def _perturbed(tree, seed, scale=0.05):
    """`tree` plus small random values (a zero-initialised head or adapter learns nothing
    visible in one step)."""
    leaves, treedef = jax.tree.flatten(tree)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return treedef.unflatten(
        [
            x + scale * jax.random.normal(k, x.shape, x.dtype)
            for x, k in zip(leaves, keys, strict=True)
        ]
    )


def _state(rl, params=None, sgd=None, cfg=CFG):
    # A copy each time: the update donates its state.
    params = tf.init_params(jax.random.key(0), cfg) if params is None else params
    params = jax.tree.map(jnp.copy, params)
    sgd = optax.sgd(0.3) if sgd is None else sgd
    state = state_lib.init_train_state(
        params, sgd, jax.random.key(1), use_reference=rl.loss.kl_beta > 0
    )
    if rl.loss.kl_beta > 0:  # a reference that differs from the policy
        ref = jax.tree.map(lambda x: x * 1.01 if x.dtype == jnp.float32 else x, params)
        state = dataclasses.replace(state, ref_params=ref)
    if rl.critic.enabled:
        critic = value_lib.init_critic(rl.critic, params)
        critic = dataclasses.replace(critic, head=_perturbed(critic.head, 2))
        state = dataclasses.replace(state, critic=state_lib.init_critic_state(critic, rl.critic))
    return state


def _compare(rl, packing_kwargs=None, params=None, rtol=1e-5, atol=1e-5, cfg=CFG):
    """The packed and padded updates on one rollout: new parameters and every metric."""
    rollout = _rollout(1)
    rewards = np.asarray(np.arange(N) % 3 == 0, np.float32)
    parts = {"correct": rewards}
    sgd = optax.sgd(0.3)
    sched = optax.constant_schedule(0.3)
    update = ts.build_update(cfg, rl, sgd, sched)
    kwargs = dict(num_microbatches=rl.microbatch_count(), group_size=G) | (packing_kwargs or {})
    plans = (_plan(rollout, **kwargs), None)
    if rl.num_minibatches > 1:  # the frozen log-probs' layout, then each minibatch's
        orders = update_lib.minibatch_orders(_state(rl, params, sgd, cfg).rng, N, rl)
        lengths = np.asarray(rollout.prompt_lengths_N), np.asarray(rollout.mask_NT), P
        kwargs.pop("group_size")
        minibatches = packing_lib.plan_minibatches(
            *lengths, np.asarray(orders), rl.num_minibatches, **kwargs
        )
        plans = (plans[0], jax.tree.map(jnp.asarray, minibatches))
    padded = update(_state(rl, params, sgd, cfg), rollout, rewards, parts)
    packed = update(_state(rl, params, sgd, cfg), rollout, rewards, parts, *plans)
    (new_a, out_a), (new_b, out_b) = jax.device_get((padded, packed))
    assert out_a.metrics.keys() == out_b.metrics.keys()
    for k in out_a.metrics:
        np.testing.assert_allclose(
            out_b.metrics[k], out_a.metrics[k], rtol=rtol, atol=atol, err_msg=k
        )
    for x, y in zip(jax.tree.leaves(new_b.params), jax.tree.leaves(new_a.params), strict=True):
        np.testing.assert_allclose(x, y, rtol=0, atol=atol)
    assert float(out_a.metrics["grad_norm"]) > 0
    return out_a.metrics


SAMPLER = SamplerConfig(max_new_tokens=T, eos_ids=(1,), pad_id=0)


@pytest.mark.parametrize("aggregation", losses.AGGREGATIONS)
def test_packed_update_equals_padded_for_every_aggregation(aggregation):
    rl = ts.RLConfig(
        group_size=G,
        sampler=SAMPLER,
        loss=losses.LossConfig(aggregation=aggregation, entropy_coef=0.01),
        num_microbatches=2,
    )
    _compare(rl)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3", "low_var_kl", "k3_plus"])
def test_packed_update_equals_padded_with_kl_and_off_policy_passes(estimator):
    rl = ts.RLConfig(
        group_size=G,
        sampler=SAMPLER,
        mu=2,
        loss=losses.LossConfig(kl_beta=0.05, kl_estimator=estimator, tis_cap=2.0),
    )
    metrics = _compare(rl, packing_kwargs=dict(length=24))
    assert abs(float(metrics["loss/kl"])) > 0


@pytest.mark.parametrize(
    "aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "dr_grpo_constant"]
)
def test_packed_minibatches_equal_padded_ones(aggregation):
    # Two passes of two shuffled minibatches of two microbatches: each minibatch is packed
    # alone in the order the update draws, and its normaliser is its own.
    rl = ts.RLConfig(
        group_size=G,
        sampler=SAMPLER,
        mu=2,
        num_minibatches=2,
        num_microbatches=2,
        loss=losses.LossConfig(aggregation=aggregation, kl_beta=0.05, tis_cap=2.0),
    )
    _compare(rl)


def test_packed_minibatches_equal_padded_ones_for_ppo_with_a_critic():
    rl = ts.RLConfig(
        group_size=G,
        sampler=SAMPLER,
        mu=2,
        num_minibatches=2,
        advantage=adv_lib.AdvantageConfig("gae"),
        critic=value_lib.CriticConfig(kind="model"),
        loss=losses.LossConfig(policy_loss="ppo_clip"),
    )
    _compare(rl, packing_kwargs=dict(length=24))


def test_each_minibatch_packs_its_own_rows_in_one_shape():
    rollout = _rollout(3)
    lengths = np.asarray(rollout.prompt_lengths_N), np.asarray(rollout.mask_NT)
    orders = np.stack([np.random.default_rng(k).permutation(N) for k in range(3)])
    plans = packing_lib.plan_minibatches(*lengths, P, orders, 4, num_microbatches=2, block=4)
    n = N // 4
    assert plans.src_MRL.shape[:2] == (3, 4) and plans.micro_N.shape == (3, 4, n)
    for p in range(3):
        for j in range(4):
            one = jax.tree.map(lambda x, p=p, j=j: x[p, j], plans)
            rows = orders[p, j * n : (j + 1) * n]
            sub = dataclasses.replace(
                rollout,
                prompt_lengths_N=rollout.prompt_lengths_N[rows],
                mask_NT=rollout.mask_NT[rows],
                lengths_N=rollout.lengths_N[rows],
            )
            _places_every_token(one, sub)
    with pytest.raises(ValueError, match="does not fit in"):
        packing_lib.pad_to(jax.tree.map(lambda x: x[0, 0], plans), (1, 1, 4, 4))


@pytest.mark.parametrize("kind", ["head", "model"])
def test_packed_update_equals_padded_for_ppo_with_a_critic(kind):
    rl = ts.RLConfig(
        group_size=G,
        sampler=SAMPLER,
        num_microbatches=2,
        advantage=adv_lib.AdvantageConfig("gae"),
        critic=value_lib.CriticConfig(kind=kind),
        loss=losses.LossConfig(policy_loss="ppo_clip"),
    )
    _compare(rl)


def test_packed_update_equals_padded_with_lora():
    params = tf.init_params(jax.random.key(0), CFG)
    lora = lora_lib.init_lora(jax.random.key(3), CFG, lora_lib.LoraConfig(rank=4, alpha=8.0))
    params = dataclasses.replace(params, lora=_perturbed(lora, 4))
    rl = ts.RLConfig(group_size=G, sampler=SAMPLER, num_microbatches=2)
    _compare(rl, params=params)


def test_packed_update_equals_padded_with_a_prompt_per_row():
    # The layout splash attention can mask (plain segments) against the flat padded forward.
    rl = ts.RLConfig(
        group_size=G,
        sampler=SAMPLER,
        shared_prompt_forward=False,
        loss=losses.LossConfig(kl_beta=0.05),
        critic=value_lib.CriticConfig(kind="head"),
        advantage=adv_lib.AdvantageConfig(estimator="gae"),
        num_microbatches=2,
    )
    _compare(rl, packing_kwargs=dict(group_size=1))


@pytest.mark.parametrize("shared_prompt", [True, False])
def test_packed_update_equals_padded_for_an_moe_policy_with_its_router_loss(shared_prompt):
    # The routing statistics and the router loss read the same tokens' routing whichever
    # forward computes it: flat or shared-prompt padded rows, or packed rows. One microbatch:
    # the load-balancing loss is not a sum over tokens, so the microbatches' terms depend on
    # which rows share one (and the packed microbatches hold other rows than the padded).
    rl = ts.RLConfig(
        group_size=G,
        sampler=SAMPLER,
        shared_prompt_forward=shared_prompt,
        loss=losses.LossConfig(router_aux_coef=0.5),
    )
    group = G if shared_prompt else 1
    metrics = _compare(rl, packing_kwargs=dict(group_size=group), cfg=MOE)
    assert 0 < metrics["moe/load_min"] <= 1 / 8 <= metrics["moe/load_max"] < 1
    assert metrics["moe/aux_loss"] >= 2.0 and 0 < metrics["moe/router_entropy"] <= np.log(8)


def test_packed_microbatches_follow_the_token_budget():
    rollout = _rollout(1)
    lengths = (np.asarray(rollout.prompt_lengths_N), np.asarray(rollout.mask_NT), P)
    # The default budget is the padded microbatch's: N / 2 rows of P + T tokens.
    default = packing_lib.plan(*lengths, num_microbatches=2, group_size=G)
    M, R, L = default.src_MRL.shape
    assert R == 1 and L <= N // 2 * (P + T)
    # Attention that skips no blocks (dense, splash) takes rows of twice the padded length.
    fixed = packing_lib.plan(*lengths, num_microbatches=2, group_size=G, skips_blocks=False)
    assert fixed.src_MRL.shape[2] == 2 * (P + T)
    # A budget of two padded rows: more microbatches, each a packed row of at most that.
    small = packing_lib.plan(*lengths, group_size=G, microbatch_tokens=2 * (P + T))
    assert small.src_MRL.shape[1:] == (1, 2 * (P + T)) and small.src_MRL.shape[0] > M
    with pytest.raises(ValueError, match="a microbatch of 10 tokens holds no 1 packed rows"):
        packing_lib.plan(*lengths, group_size=G, length=P + T, microbatch_tokens=10)
    rl = ts.RLConfig(group_size=G, sampler=SAMPLER, loss=losses.LossConfig(entropy_coef=0.01))
    _compare(rl, packing_kwargs=dict(microbatch_tokens=2 * (P + T)))


def _places_every_token(plan: packing_lib.Packing, rollout: Rollout) -> None:
    """Every completion token once, each predicted by the token before it: its prompt's last
    or its own previous one."""
    rows = len(rollout.mask_NT)
    src = plan.src_MRL[plan.segment_MRL > 0]
    completion = np.sort(src[src % (P + T) >= P])
    want = np.flatnonzero(np.concatenate([np.zeros((rows, P), bool), rollout.mask_NT], axis=1))
    np.testing.assert_array_equal(completion, want)
    for n in range(rows):
        m, k = plan.micro_N[n], plan.pred_NT[n, : int(rollout.lengths_N[n])]
        np.testing.assert_array_equal(plan.tgt_MK[m, k], n * (P + T) + P + np.arange(k.size))
        at = plan.src_MRL[m].reshape(-1)[plan.at_MK[m, k]]  # the token before: prompt or own
        assert at[0] % (P + T) == P - 1 and all(at[1:] == plan.tgt_MK[m, k][:-1])


@pytest.mark.parametrize("length", [P + T, 0])
def test_steps_take_an_earlier_steps_shape_where_it_costs_little_more(length):
    kwargs = dict(length=length, group_size=G, block=4)
    fresh_shapes, reused_shapes = set(), set()
    for i in range(40):
        rollout = _rollout(200 + i)
        lengths = np.asarray(rollout.prompt_lengths_N), np.asarray(rollout.mask_NT)
        fresh = packing_lib.plan(*lengths, P, **kwargs)
        plan = packing_lib.plan(*lengths, P, **kwargs, reuse=reused_shapes)
        _places_every_token(plan, rollout)
        size = lambda x: x.src_MRL.size  # noqa: E731
        assert size(fresh) <= size(plan) <= (1 + packing_lib.REUSE_SLACK) * size(fresh)
        assert plan.shape in reused_shapes or plan.shape == fresh.shape
        fresh_shapes.add(fresh.shape)
        reused_shapes.add(plan.shape)
    assert len(reused_shapes) < len(fresh_shapes)


@pytest.mark.parametrize("length", [P + T, 0])
def test_the_packed_update_compiles_once_per_bucketed_shape(length):
    rl = ts.RLConfig(group_size=G, sampler=SAMPLER)
    sgd = optax.sgd(0.3)
    update = ts.build_update(CFG, rl, sgd, optax.constant_schedule(0.3))
    state = _state(rl, sgd=sgd)
    rewards = np.asarray(np.arange(N) % 3 == 0, np.float32)
    shapes = set()
    for i in range(20):
        rollout = _rollout(100 + i)
        plan = _plan(rollout, length=length, group_size=G, block=8)
        shapes.add(plan.shape)
        state, _ = update(state, rollout, rewards, {"correct": rewards}, plan)
    # Rows (a fixed length) or lengths (one row) and the unembedding's length, all bucketed.
    lengths = packing_lib.length_buckets(N * (P + T), 8)
    rows = packing_lib.row_buckets(N, 1)
    assert all(M == 1 and k in lengths and k <= L for M, _, L, k in shapes)
    if length:
        assert all(r in rows and length == L for _, r, L, _ in shapes)
    else:
        assert all(r == 1 and L in lengths for _, r, L, _ in shapes)
    # One program per shape reached: no step recompiles a shape an earlier one compiled.
    assert update._cache_size() == len(shapes) > 1
