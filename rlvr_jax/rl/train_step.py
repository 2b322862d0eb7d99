"""One RL step: rollout -> rewards -> advantages -> old/reference log-probs -> updates.

Two ways to run it, on the same mesh and the same parameter buffers:
- `build_train_step(..., reward_fn)`: the reward is a JAX function of the sampled tokens (an
  in-graph verifier), so rollout, reward, advantages and every minibatch update are one jitted
  program.
- `build_rollout` + host verifier + `build_update`: when the verifier needs Python on text, the
  rollout is one jitted program, the rewards are computed on the host, and the update another.

Rows are ordered `b * G + g` (sample g of prompt b) throughout.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from rlvr_jax import sampling
from rlvr_jax.model import sharding
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.transformer import positions_from_mask
from rlvr_jax.rl import advantages as adv_lib
from rlvr_jax.rl import losses, sharding_plan
from rlvr_jax.rl.logprobs import grouped_next_token_logprobs, next_token_logprobs
from rlvr_jax.rl.state import TrainState

Array = jax.Array
# reward_fn(rollout, targets) -> (rewards_N f32, {part name: part_N f32}); jittable.
RewardFn = Callable[[sampling.Rollout, Any], tuple[Array, dict[str, Array]]]


@dataclasses.dataclass(frozen=True)
class RLConfig:
    """The RL algorithm's static settings.

    Attributes:
      group_size: G samples per prompt.
      mu: passes over each rollout batch (GRPO's mu; 1 is on-policy).
      num_minibatches: optimizer updates per pass; the N rows are shuffled and split evenly.
      num_microbatches: gradient-accumulation chunks per minibatch (memory only: the result is
        the same as one chunk, in every aggregation mode).
      temperature, top_p, min_p: sampling values; log-probs for the loss use the same
        temperature so that ratios compare like with like.
      logprob_chunk: time steps per chunk of the log-prob computation (vocab-sized logits of only
        this many steps exist at once).
      mask_truncated: leave rows that hit `max_new_tokens` out of the loss (DAPO's overlong
        filtering); they still count in the group baselines.
      group_grad_norms: also log each prompt's share of the gradient: the global norm of the
        gradient of its G rows' terms of the full-batch loss (the batch's normaliser) at the
        pre-update parameters, as "groups/grad_norm" (B,), with its success rate
        "groups/success_rate" (B,). One extra backward pass per group (a diagnostic; the std
        scaling's re-weighting of prompts shows in it).
      shared_prompt_forward: run each group's prompt once instead of G times, in the rollout's
        prefill (`SamplerConfig.prompt_group`) and in the update's forwards
        (`transformer.grouped_hidden_states`); the same numbers. In the update it applies where a
        forward sees whole groups in order: always for the old and reference log-probs; for the
        policy loss when there is one minibatch (minibatches shuffle rows, not groups) and each
        microbatch holds whole groups.
      advantage: the advantage estimator.
      loss: the policy objective.
      sampler: static sampler settings (max_new_tokens, eos ids, stops, top_k, think budget).
    """

    group_size: int
    sampler: sampling.SamplerConfig
    advantage: adv_lib.AdvantageConfig = adv_lib.AdvantageConfig()
    loss: losses.LossConfig = losses.LossConfig()
    mu: int = 1
    num_minibatches: int = 1
    num_microbatches: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    min_p: float = 0.0
    logprob_chunk: int = 256
    mask_truncated: bool = False
    group_grad_norms: bool = False
    shared_prompt_forward: bool = True

    def __post_init__(self):
        for name in ("group_size", "mu", "num_minibatches", "num_microbatches", "logprob_chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"rl.{name}={getattr(self, name)} must be at least 1")
        if self.group_size < 2 and self.advantage.estimator in ("grpo", "dr_grpo", "rloo"):
            raise ValueError(
                f"rl.group_size={self.group_size} with advantage estimator "
                f"{self.advantage.estimator!r}: a group baseline needs at least 2 samples"
            )
        if not self.temperature > 0:
            raise ValueError(f"rl.temperature={self.temperature} must be positive")
        if self.advantage.estimator == "expert_iteration" and self.loss.policy_loss != "reinforce":
            raise ValueError(
                f"rl.loss.policy_loss={self.loss.policy_loss!r} with rl.advantage.estimator="
                "'expert_iteration': expert iteration is SFT on verified samples, set "
                "rl.loss.policy_loss='reinforce'"
            )

    @property
    def on_policy(self) -> bool:
        """One update per rollout: old log-probs equal the current ones (no extra forward)."""
        return self.mu * self.num_minibatches == 1

    def check_rows(self, num_rows: int) -> None:
        """Raises ValueError unless N rows split into the configured minibatches/microbatches."""
        chunks = self.num_minibatches * self.num_microbatches
        if num_rows % self.group_size or num_rows % chunks:
            raise ValueError(
                f"{num_rows} rows do not split into groups of {self.group_size} and "
                f"{self.num_minibatches} minibatches x {self.num_microbatches} microbatches"
            )


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Batch:
    """One step's prompts, already repeated G times and left-padded, and verifier targets."""

    prompt_NP: Array  # (N, P) int32
    prompt_lengths_N: Array  # (N,) int32
    targets: Any = None  # per-row pytree for an in-graph verifier; None for host verifiers


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _Rows:
    """Per-row training data, sliced into minibatches and microbatches."""

    seq_NS: Array  # prompt + completion tokens, S = P + T
    seq_mask_NS: Array
    positions_NS: Array
    loss_mask_NT: Array
    adv_N: Array
    old_logp_NT: Array | None
    ref_logp_NT: Array | None
    sampler_logp_NT: Array


def _sampling_params(rl: RLConfig, num_rows: int) -> sampling.SamplingParams:
    full = lambda x: jnp.full((num_rows,), x, jnp.float32)  # noqa: E731
    return sampling.SamplingParams(full(rl.temperature), full(rl.top_p), full(rl.min_p))


def _sequences(rollout: sampling.Rollout) -> tuple[Array, Array, Array]:
    """Prompt + completion tokens, their mask and positions."""
    N, P = rollout.prompt_NP.shape
    prompt_mask = jnp.arange(P)[None, :] >= (P - rollout.prompt_lengths_N)[:, None]
    seq_mask = jnp.concatenate([prompt_mask, rollout.mask_NT], axis=1)
    seq = jnp.concatenate([rollout.prompt_NP, rollout.tokens_NT], axis=1)
    return seq, seq_mask, positions_from_mask(seq_mask)


def _logprobs(params, rows: _Rows, P: int, model_cfg: ModelConfig, rl: RLConfig, grouped: bool):
    """Log-probs and entropies of the completions; `grouped`: the rows are whole groups in
    order, so each group's prompt can run once."""
    if grouped and rl.shared_prompt_forward:
        return grouped_next_token_logprobs(
            params,
            rows.seq_NS,
            rows.positions_NS,
            model_cfg,
            rows.seq_mask_NS,
            group_size=rl.group_size,
            prompt_len=P,
            chunk_size=rl.logprob_chunk,
            temperature=rl.temperature,
        )
    return next_token_logprobs(
        params,
        rows.seq_NS,
        rows.positions_NS,
        model_cfg,
        rows.seq_mask_NS,
        first_target=P,
        chunk_size=rl.logprob_chunk,
        temperature=rl.temperature,
    )


def _split(tree: Any, num: int) -> Any:
    """Leading axis N -> (num, N // num)."""
    return jax.tree.map(lambda x: x.reshape(num, x.shape[0] // num, *x.shape[1:]), tree)


def _combine_metrics(stacked: dict[str, Array]) -> dict[str, Array]:
    """Reduces per-microbatch metrics: min/max keep their extreme, the rest a token-weighted mean
    (the loss terms, already normalised globally, are summed per minibatch then averaged)."""
    tokens = stacked["loss/tokens"]
    weight = tokens / jnp.maximum(jnp.sum(tokens), 1.0)
    out = {}
    for k, v in stacked.items():
        if k.endswith("/min"):
            out[k] = jnp.min(v)
        elif k.endswith("/max"):
            out[k] = jnp.max(v)
        elif k == "loss/tokens":
            out[k] = jnp.sum(v) / v.shape[0] * v.shape[1] if v.ndim == 2 else jnp.sum(v)
        elif k.startswith("loss/"):
            out[k] = jnp.sum(v) / v.shape[0]  # summed over microbatches, averaged over updates
        else:
            out[k] = jnp.sum(weight * v)
    return out


def rollout_metrics(
    rollout: sampling.Rollout, rewards_N: Array, parts: dict[str, Array]
) -> dict[str, Array]:
    """Rewards per component, accuracy, response lengths and truncation of one rollout."""
    lengths = rollout.lengths_N.astype(jnp.float32)
    m = {
        "reward/mean": jnp.mean(rewards_N),
        "reward/std": jnp.std(rewards_N),
        "length/mean": jnp.mean(lengths),
        "length/p50": jnp.percentile(lengths, 50),
        "length/p95": jnp.percentile(lengths, 95),
        "length/max": jnp.max(lengths),
        "length/truncated": jnp.mean((rollout.finish_N == sampling.FINISH_LENGTH).astype(float)),
        "rollout/tokens": jnp.sum(lengths),
    }
    for name, v in parts.items():
        m[f"reward/{name}"] = jnp.mean(v)
    if "correct" in parts:
        m["accuracy"] = jnp.mean(parts["correct"])
        correct = parts["correct"] > 0
        n_correct = jnp.maximum(jnp.sum(correct), 1)
        n_wrong = jnp.maximum(jnp.sum(~correct), 1)
        m["length/correct"] = jnp.sum(jnp.where(correct, lengths, 0)) / n_correct
        m["length/incorrect"] = jnp.sum(jnp.where(correct, 0, lengths)) / n_wrong
    return m


def _update(
    state: TrainState,
    rollout: sampling.Rollout,
    rewards_N: Array,
    parts: dict[str, Array],
    *,
    model_cfg: ModelConfig,
    rl: RLConfig,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
) -> tuple[TrainState, dict[str, Array]]:
    """Advantages, old/reference log-probs and `mu x num_minibatches` optimizer updates."""
    N, P = rollout.prompt_NP.shape
    T = rollout.tokens_NT.shape[1]
    rl.check_rows(N)
    G = rl.group_size
    rng, perm_rng = jax.random.split(state.rng)
    seq, seq_mask, positions = _sequences(rollout)
    loss_mask = rollout.mask_NT & ~rollout.injected_NT
    if rl.mask_truncated:
        loss_mask = loss_mask & (rollout.finish_N != sampling.FINISH_LENGTH)[:, None]
    rows = _Rows(seq, seq_mask, positions, loss_mask, jnp.zeros((N,)), None, None, rollout.logp_NT)

    ref_logp = None
    if state.ref_params is not None:
        ref_logp, _ = _logprobs(state.ref_params, rows, P, model_cfg, rl, grouped=True)
        ref_logp = jax.lax.stop_gradient(ref_logp)
    if rl.loss.kl_beta > 0 and rl.loss.kl_in == "reward":
        rewards_N = losses.kl_penalized_rewards(
            rewards_N, rollout.logp_NT, ref_logp, loss_mask, rl.loss.kl_beta, rl.loss.kl_estimator
        )
    correct = parts["correct"].reshape(-1, G) > 0 if "correct" in parts else None
    adv_BG, adv_stats = adv_lib.compute_advantages(rewards_N.reshape(-1, G), rl.advantage, correct)
    if rl.advantage.estimator == "expert_iteration":
        # Rejected samples leave the loss, and its token count, entirely.
        loss_mask = loss_mask & (adv_BG.reshape(-1) > 0)[:, None]
        rows = dataclasses.replace(rows, loss_mask_NT=loss_mask)
    old_logp = None
    if not rl.on_policy:
        old_logp = _logprobs(state.params, rows, P, model_cfg, rl, grouped=True)[0]
        old_logp = jax.lax.stop_gradient(old_logp)
    rows = dataclasses.replace(
        rows, adv_N=adv_BG.reshape(-1), old_logp_NT=old_logp, ref_logp_NT=ref_logp
    )
    use_ref_in_loss = rl.loss.kl_in_loss
    # Microbatches hold whole groups in order when rows are not shuffled and split on groups.
    micro_rows = N // (rl.num_minibatches * rl.num_microbatches)
    micro_grouped = rl.num_minibatches == 1 and micro_rows % G == 0

    def micro_loss(params, mb: _Rows, normalizer, grouped=micro_grouped):
        logp, entropy = _logprobs(params, mb, P, model_cfg, rl, grouped)
        old = jax.lax.stop_gradient(logp) if mb.old_logp_NT is None else mb.old_logp_NT
        return losses.policy_loss(
            logp,
            old,
            mb.adv_N,
            mb.loss_mask_NT,
            rl.loss,
            normalizer=normalizer,
            ref_logp_NT=mb.ref_logp_NT if (use_ref_in_loss or mb.ref_logp_NT is not None) else None,
            sampler_logp_NT=mb.sampler_logp_NT,
            entropy_NT=entropy,
            max_new_tokens=T,
        )

    grad_fn = jax.grad(micro_loss, has_aux=True)

    def minibatch(carry, mb: _Rows):
        params, opt_state, step = carry
        normalizer = losses.loss_normalizer(mb.loss_mask_NT, rl.loss.aggregation, T)
        micro = _split(mb, rl.num_microbatches)

        def accumulate(grads, one):
            g, metrics = grad_fn(params, one, normalizer)
            return jax.tree.map(jnp.add, grads, g), metrics

        zeros = jax.tree.map(jnp.zeros_like, params)
        grads, metrics = jax.lax.scan(accumulate, zeros, micro)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        metrics = dict(metrics)
        metrics["grad_norm"] = optax.global_norm(grads)
        metrics["update_norm"] = optax.global_norm(updates)
        return (new_params, opt_state, step + 1), metrics

    def one_pass(carry, key):
        shuffled = jax.tree.map(lambda x: x[jax.random.permutation(key, N)], rows)
        if rl.num_minibatches == 1:
            shuffled = rows  # nothing to shuffle across
        return jax.lax.scan(minibatch, carry, _split(shuffled, rl.num_minibatches))

    lr = schedule(state.step)
    carry = (state.params, state.opt_state, state.step)
    (params, opt_state, step), metrics = jax.lax.scan(
        one_pass, carry, jax.random.split(perm_rng, rl.mu)
    )
    # metrics leaves: (mu, num_minibatches[, num_microbatches]).
    norms = {k: metrics.pop(k) for k in ("grad_norm", "update_norm")}
    flat = {
        k: v.reshape(rl.mu * rl.num_minibatches, rl.num_microbatches) for k, v in metrics.items()
    }
    out = _combine_metrics(flat)
    out.update({k: jnp.mean(v) for k, v in norms.items()})
    out.update(adv_stats)
    out.update(rollout_metrics(rollout, rewards_N, parts))
    out["learning_rate"] = lr
    # Per-row success, for the curriculum and the group histogram; the loop pops "rows/" keys.
    out["rows/correct"] = parts["correct"] if "correct" in parts else (rewards_N > 0).astype(float)
    out["loss/tokens"] = jnp.sum(loss_mask.astype(jnp.float32))
    if rl.group_grad_norms:
        # Rows b*G..(b+1)*G are prompt b's; with the whole batch's normaliser, the gradients of
        # the groups sum to the full-batch gradient. lax.map keeps one gradient live at a time.
        z = losses.loss_normalizer(rows.loss_mask_NT, rl.loss.aggregation, T)
        by_group = jax.tree.map(lambda x: x.reshape(N // G, G, *x.shape[1:]), rows)
        group_grad = jax.grad(functools.partial(micro_loss, grouped=True), has_aux=True)
        out["groups/grad_norm"] = jax.lax.map(
            lambda one: optax.global_norm(group_grad(state.params, one, z)[0]), by_group
        )
        out["groups/success_rate"] = jnp.mean(out["rows/correct"].reshape(-1, G), axis=1)
    new_state = TrainState(
        step=step, params=params, opt_state=opt_state, ref_params=state.ref_params, rng=rng
    )
    return new_state, out


def _rollout(
    params,
    batch: Batch,
    rng: Array,
    *,
    model_cfg: ModelConfig,
    rl: RLConfig,
    mesh: jax.sharding.Mesh | None = None,
):
    N, P = batch.prompt_NP.shape
    sp = _sampling_params(rl, N)
    sampler = rl.sampler
    if rl.shared_prompt_forward and sampler.prompt_group == 1:
        sampler = dataclasses.replace(sampler, prompt_group=rl.group_size)  # one prefill a group
    cache = None
    if mesh is not None:  # the cache's own layout (see model/sharding.py), not left to propagation
        cache = sampling.init_decode_cache(model_cfg, sampler, N, P)
        cache = sharding.shard_decode_cache(cache, model_cfg, mesh)
    rollout, _ = sampling.generate(
        params,
        batch.prompt_NP,
        batch.prompt_lengths_N,
        rng,
        sp,
        cache,
        model_cfg=model_cfg,
        cfg=sampler,
    )
    return rollout


def split_rollout_key(state: TrainState) -> tuple[TrainState, Array]:
    """Takes the rollout's PRNG key from the state (the fused step does the same)."""
    rng, sample_rng = jax.random.split(state.rng)
    return dataclasses.replace(state, rng=rng), sample_rng


def _fused_step(
    state: TrainState,
    batch: Batch,
    *,
    model_cfg: ModelConfig,
    rl: RLConfig,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
    reward_fn: RewardFn,
    mesh: jax.sharding.Mesh | None = None,
) -> tuple[TrainState, dict[str, Array]]:
    state, sample_rng = split_rollout_key(state)
    rollout = _rollout(state.params, batch, sample_rng, model_cfg=model_cfg, rl=rl, mesh=mesh)
    rewards_N, parts = reward_fn(rollout, batch.targets)
    return _update(
        state,
        rollout,
        rewards_N,
        parts,
        model_cfg=model_cfg,
        rl=rl,
        optimizer=optimizer,
        schedule=schedule,
    )


def build_train_step(
    model_cfg: ModelConfig,
    rl: RLConfig,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
    reward_fn: RewardFn,
    shardings: sharding_plan.StepShardings | None = None,
) -> Callable[[TrainState, Batch], tuple[TrainState, dict[str, Array]]]:
    """The whole step as one jitted program (the state is donated): `(state, batch) ->
    (state, metrics)`. `reward_fn(rollout, batch.targets)` must be jittable.

    With `shardings` (`sharding_plan.plan_step`) the state keeps its planned layout from step to
    step, the batch's rows are split over the mesh, the decode cache gets its own layout and
    the metrics come back replicated; the state and batch must already be placed on the plan
    (`sharding.place`).
    """
    mesh = None if shardings is None else shardings.mesh

    def step(state: TrainState, batch: Batch):
        with sharding.activation_mesh(mesh):
            return _fused_step(
                state,
                batch,
                model_cfg=model_cfg,
                rl=rl,
                optimizer=optimizer,
                schedule=schedule,
                reward_fn=reward_fn,
                mesh=mesh,
            )

    if shardings is None:
        return jax.jit(step, donate_argnums=0)
    return jax.jit(
        step,
        in_shardings=(shardings.state, shardings.rows),
        out_shardings=(shardings.state, shardings.replicated),
        donate_argnums=0,
    )


def build_rollout(
    model_cfg: ModelConfig, rl: RLConfig, shardings: sharding_plan.StepShardings | None = None
) -> Callable[[Any, Batch, Array], sampling.Rollout]:
    """Jitted `(params, batch, rng) -> Rollout` for the host-verifier path.

    With `shardings`, the sampler runs with the batch's rows split over the mesh and returns the
    rollout replicated, so that every process can read all of it for the host verifier (the
    tokens are small next to the weights) and pass it back to `build_update`'s program.
    """
    mesh = None if shardings is None else shardings.mesh

    def rollout(params, batch: Batch, rng: Array):
        with sharding.activation_mesh(mesh):
            return _rollout(params, batch, rng, model_cfg=model_cfg, rl=rl, mesh=mesh)

    if shardings is None:
        return jax.jit(rollout)
    rep = shardings.replicated
    return jax.jit(
        rollout, in_shardings=(shardings.state.params, shardings.rows, rep), out_shardings=rep
    )


def build_update(
    model_cfg: ModelConfig,
    rl: RLConfig,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
    shardings: sharding_plan.StepShardings | None = None,
) -> Callable[..., tuple[TrainState, dict[str, Array]]]:
    """Jitted `(state, rollout, rewards_N, parts) -> (state, metrics)`; the state is donated.

    With `shardings`, the rollout (as `build_rollout` returns it), the host rewards and parts come
    in replicated (host numpy arrays are accepted on every process) and are split by rows inside
    the program; the state keeps its planned layout.
    """

    def update(state: TrainState, rollout: sampling.Rollout, rewards_N: Array, parts: dict):
        if shardings is None:
            return _update_on(state, rollout, rewards_N, parts)
        rollout, rewards_N, parts = jax.lax.with_sharding_constraint(
            (rollout, rewards_N, parts), shardings.rows
        )
        with sharding.activation_mesh(shardings.mesh):
            return _update_on(state, rollout, rewards_N, parts)

    def _update_on(state, rollout, rewards_N, parts):
        return _update(
            state,
            rollout,
            rewards_N,
            parts,
            model_cfg=model_cfg,
            rl=rl,
            optimizer=optimizer,
            schedule=schedule,
        )

    if shardings is None:
        return jax.jit(update, donate_argnums=0)
    rep = shardings.replicated
    return jax.jit(
        update,
        in_shardings=(shardings.state, rep, rep, rep),
        out_shardings=(shardings.state, rep),
        donate_argnums=0,
    )
