"""`rl.num_microbatches="auto"`: compiled memory decides the fewest microbatches that fit."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from rlvr_jax.model import config as config_lib
from rlvr_jax.model import sharding
from rlvr_jax.model import transformer as tf
from rlvr_jax.rl import memory, sharding_plan
from rlvr_jax.rl import state as state_lib
from rlvr_jax.rl import train_step as ts
from rlvr_jax.sampling.config import SamplerConfig
from rlvr_jax.types import Rollout

N, P, T = 16, 8, 256


def _memory(total: int) -> memory.ProgramMemory:
    return memory.ProgramMemory(arguments=total // 4, outputs=0, aliased=0, temps=total)


def _rl(**kw) -> ts.RLConfig:
    sampler = SamplerConfig(max_new_tokens=T, eos_ids=(1,))
    return ts.RLConfig(group_size=4, sampler=sampler, **kw)


def test_the_fewest_that_fit_is_chosen_and_larger_counts_are_never_compiled():
    seen = []

    def measure(rl):
        seen.append(rl.num_microbatches)
        return _memory(1000 // rl.num_microbatches)

    choice = memory.fewest_microbatches(_rl(num_microbatches="auto"), N, measure, budget=700)
    # 1000 * 5 / 4 = 1250 at 1; 625 at 2 fits 700.
    assert choice.count == 2 and seen == [1, 2]
    assert "-> 2" in choice.summary() and "1: " in choice.summary()


def test_candidates_split_each_minibatch_evenly():
    rl = _rl(num_microbatches="auto", num_minibatches=2)
    assert memory.microbatch_candidates(rl, 24) == [1, 2, 3, 4, 6, 12]


def test_nothing_fits_names_the_least_it_needs():
    measure = lambda rl: _memory(4096 + 10 * rl.num_microbatches)  # noqa: E731
    with pytest.raises(ValueError, match=r"the least, 1 microbatches, needs 5.0 KiB"):
        memory.fewest_microbatches(_rl(num_microbatches="auto"), N, measure, budget=1000)


def test_a_number_is_kept_and_auto_must_be_resolved_before_the_step():
    choice = memory.fewest_microbatches(_rl(num_microbatches=4), N, lambda rl: _memory(1), 10)
    assert choice.count == 4
    with pytest.raises(ValueError, match="must be resolved"):
        _rl(num_microbatches="auto").microbatch_count()
    with pytest.raises(ValueError, match="num_microbatches='many'"):
        _rl(num_microbatches="many")


def test_a_cpu_needs_a_budget_and_a_set_budget_is_used():
    with pytest.raises(ValueError, match="set rl.memory_budget_gib"):
        memory.memory_budget(_rl(num_microbatches="auto"))
    assert memory.memory_budget(_rl(memory_budget_gib=0.5)) == 1 << 29


def test_auto_on_eight_fake_devices_picks_the_count_whose_compiled_update_fits():
    """The real update, compiled on abstract shapes over an fsdp mesh of the 8 CPU devices:
    more microbatches hold fewer activations at once, and a budget between the figures of one
    and two microbatches makes "auto" choose two."""
    cfg = config_lib.PRESETS["tiny"].replace(vocab_size=512, remat=True)
    ocfg = state_lib.OptimConfig()
    opt = state_lib.make_optimizer(ocfg)
    sched = state_lib.learning_rate_schedule(ocfg)
    state = jax.eval_shape(
        lambda: state_lib.init_train_state(
            tf.init_params(jax.random.key(0), cfg), opt, jax.random.key(1), False
        )
    )
    mesh = sharding.make_mesh(sharding.MeshConfig(1, 8, 1))
    plan = sharding_plan.plan_step(state, cfg, mesh, N)
    rep = plan.replicated
    sds = lambda shape, dt, s=rep: jax.ShapeDtypeStruct(shape, dt, sharding=s)  # noqa: E731
    rollout = Rollout(
        prompt_NP=sds((N, P), jnp.int32),
        prompt_lengths_N=sds((N,), jnp.int32),
        tokens_NT=sds((N, T), jnp.int32),
        logp_NT=sds((N, T), jnp.float32),
        mask_NT=sds((N, T), bool),
        injected_NT=sds((N, T), bool),
        lengths_N=sds((N,), jnp.int32),
        finish_N=sds((N,), jnp.int32),
    )
    abstract_state = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, plan.state
    )

    def measure(rl):
        update = ts.build_update(cfg, rl, opt, sched, plan)
        rewards = sds((N,), jnp.float32)
        lowered = update.lower(abstract_state, rollout, rewards, {"correct": rewards})
        return memory.program_memory(lowered.compile())

    compiled = {c: measure(_rl(num_microbatches=c, logprob_chunk=T)) for c in (1, 2)}
    figures = {c: m.total for c, m in compiled.items()}
    assert figures[2] < figures[1], figures
    budget = (figures[1] + figures[2]) // 2
    calls = []

    def known(rl):  # the figures compiled above (each compile takes seconds)
        calls.append(rl.num_microbatches)
        return compiled[rl.num_microbatches]

    auto = _rl(num_microbatches="auto", logprob_chunk=T)
    choice = memory.fewest_microbatches(auto, N, known, budget)
    assert choice.count == 2 and calls == [1, 2]
    assert choice.tried[-1][1].total == figures[2]
    resolved = dataclasses.replace(auto, num_microbatches=choice.count)
    assert resolved.microbatch_count() == 2
