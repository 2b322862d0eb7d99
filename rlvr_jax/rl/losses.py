"""Policy losses over N = B*G completions of T tokens: clipped PPO, REINFORCE, GSPO, CISPO, SAPO,
Kimi k1.5's;
KL; entropy; importance corrections for the sampler's log-probs (TIS, IcePop).

Shapes: `logp_NT` the current policy's log-probs of the sampled tokens, `old_logp_NT` those of the
policy that the advantages refer to (the trainer's recomputation at sampling time), `ref_logp_NT`
the frozen reference, `sampler_logp_NT` what the sampler reported, `adv_N` one advantage per
completion (or `(N, T)`, one per token, for GAE), `mask_NT` which tokens are completion tokens
(not prompt, not padding).

Gradient accumulation is exact by construction. The loss is `sum_nt w_nt * l_nt / Z`, where the
token weights `w_NT` depend on one row only (`token_weights`) and the normaliser `Z` is a property
of the *whole* batch (`loss_normalizer`). A caller that splits the batch into micro-batches
computes `Z` once on the full mask and passes it to every micro-batch; the micro-batch losses, and
so their gradients, then sum to the full-batch ones in every aggregation mode. (Averaging
per-micro-batch means instead silently re-weights tokens whenever micro-batches hold different
numbers of tokens.)

Everything is computed in f32 and is jittable; the config is static (hashable).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import jax
import jax.numpy as jnp

Array = jax.Array

PolicyLoss = Literal["ppo_clip", "reinforce", "gspo", "cispo", "sapo", "kimi"]
Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "dr_grpo_constant"]
KLEstimator = Literal["k1", "k2", "k3", "k3_plus", "low_var_kl"]
TISLevel = Literal["token", "sequence"]
KLIn = Literal["loss", "reward"]

POLICY_LOSSES: tuple[str, ...] = ("ppo_clip", "reinforce", "gspo", "cispo", "sapo", "kimi")
AGGREGATIONS: tuple[str, ...] = (
    "token_mean",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "dr_grpo_constant",
)
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3", "k3_plus", "low_var_kl")
TIS_LEVELS: tuple[str, ...] = ("token", "sequence")
KL_INS: tuple[str, ...] = ("loss", "reward")

# k3 exponentiates the log ratio; a token the reference finds 1e-30 times less likely must not
# turn into inf (and NaN gradients): here the log ratio is clamped to [-10, 10] and the value is
# not. verl's low_var_kl (the "low_var_kl" estimator, and the value of "k3_plus") clamps the log
# ratio to [-20, 20] and then the value itself to [-10, 10], which also zeroes the gradient of
# tokens whose k3 exceeds 10 (k3_plus takes its gradient from k2 instead).
KL_LOG_RATIO_CLAMP = 10.0
VERL_LOG_RATIO_CLAMP = 20.0
VERL_VALUE_CLAMP = 10.0
LOG_WEIGHT_CLAMP = 20.0  # importance weights of the sampler's tokens stay within e^{+-20}


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """The policy objective.

    Attributes:
      policy_loss: the per-token surrogate, with ratio `r = pi / pi_old`.
        - "ppo_clip": `-min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)` (PPO, Schulman et al.
          2017; as used by GRPO, DeepSeekMath).
        - "reinforce": `-r A`, unclipped. On-policy (one update per rollout, `pi_old == pi`) its
          gradient is exactly REINFORCE's `-A grad log pi`; off-policy it is importance-weighted.
        - "gspo": the clipped surrogate on the sequence ratio
          `s = exp(mean_t(log pi - log pi_old))` (GSPO, Zheng et al. 2025), written in its
          token form (GSPO-token with one advantage per sequence): each token carries ratio value
          s and gradient `s grad log pi_t`, so with "seq_mean_token_mean" the loss and gradient
          are the paper's sequence-level ones. GSPO uses far smaller clip ranges (3e-4, 4e-4).
        - "cispo": `-sg(clip(r, 1 - clip_low, 1 + clip_high)) A log pi` (CISPO, MiniMax-M1,
          2025): the importance weight is clipped and stopped, never the gradient, so every
          token keeps its `grad log pi` (PPO's clip drops the gradient of clipped tokens).
          MiniMax-M1 clips only above (a large clip_low, e.g. 0.999 here for "no lower bound").
        - "sapo": `-f(r) A` with the soft gate `f(r) = 4 / tau * sigmoid(tau (r - 1))` (SAPO,
          Gao et al. 2025), tau = `sapo_tau_pos` where A > 0 and `sapo_tau_neg` otherwise: the
          gradient weight `4 s (1 - s)`, s = sigmoid(tau (r - 1)), is 1 on-policy and decays
          smoothly as r leaves 1 instead of dropping to 0 at a clip boundary.
        - "kimi": Kimi k1.5's reference-regularised objective (Kimi Team 2025, sec. 2.3.2). The
          KL-regularised optimum against the sampling policy pi_old satisfies
          `r - tau log Z = tau log(pi* / pi_old)`; its squared-loss surrogate, with tau log Z
          estimated by the group's mean reward, has the gradient
          `-(r - mean(r)) grad log pi(y) + tau / 2 grad (log pi(y) - log pi_old(y))^2` per
          completion y, with `log pi(y)` the sum over its tokens. Here each token carries
          `-A log pi_t + tau / 2 * s * (log pi_t - log pi_old_t)`, s the completion's summed log
          ratio, so a completion's tokens sum to the paper's term: use it with
          `advantage.estimator="dr_grpo"` (A = r - mean(r)) and
          `aggregation="seq_mean_token_sum"` for the paper's objective. On-policy (one update a
          rollout) s = 0 and it is REINFORCE with the group-mean baseline; the squared term
          acts from the second update on a rollout (`rl.mu`, `rl.num_minibatches`).
      clip_low: eps_low: the ratio is clipped below at 1 - clip_low (for A < 0; for "cispo" the
        importance weight, whatever the sign of A).
      clip_high: eps_high: the ratio is clipped above at 1 + clip_high (for A > 0). A larger
        value than clip_low is DAPO's clip-higher (Yu et al. 2025; 0.2 and 0.28 there).
      dual_clip: None, or c > 1: for A < 0 the per-token loss is additionally capped at `-c A`,
        so a token whose ratio has exploded cannot dominate the update (dual-clip PPO, Ye et al.
        2020). ppo_clip and gspo only.
      kimi_tau: tau of "kimi", the weight of its squared log-ratio term (its KL regulariser
        towards the sampling policy).
      sapo_tau_pos, sapo_tau_neg: SAPO's gate temperatures for positive and negative advantages
        (1.0 and 1.05 in the paper: negative advantages decay faster).
      aggregation: how token losses become one number (see `token_weights`, `loss_normalizer`).
        - "token_mean": sum over all tokens / number of tokens in the batch (DAPO's token-level
          loss: long completions are not down-weighted per token).
        - "seq_mean_token_mean": mean over each completion's tokens, then over completions
          (the original GRPO; biased towards short correct and long wrong answers per Dr. GRPO).
        - "seq_mean_token_sum": sum over each completion's tokens, mean over completions.
        - "dr_grpo_constant": sum over all tokens / (rows x max_new_tokens): a constant
          normaliser, independent of lengths (Dr. GRPO, Liu et al. 2025).
      kl_estimator: estimator of KL(pi || pi_ref) from samples of pi, per Schulman (2020),
        "Approximating KL divergence", with `d = log pi - log pi_ref`:
        "k1" = d (unbiased, high variance, may be negative), "k2" = d^2 / 2 (biased, low
        variance), "k3" = exp(-d) + d - 1 (unbiased, non-negative; the GRPO choice), with -d
        clamped to [-10, 10]. "low_var_kl": verl's k3 (`kl_penalty_forward`, verl's default
        `kl_loss_type`), -d clamped to [-20, 20] and then the value to [-10, 10]. "k3_plus":
        verl's "k3+" (`kl_penalty`'s straight-through): the value of low_var_kl with the
        gradient of k2, `d grad d` unclamped (the gradient of the reverse KL in expectation,
        which k3's own gradient is not).
      kl_beta: weight of the KL term; 0 disables it and the reference model is not needed.
      kl_in: "loss" adds `kl_beta * kl` per token to the loss (GRPO); "reward" subtracts the
        summed KL from each completion's reward before the advantages (PPO-RLHF, REINFORCE++;
        see `kl_penalized_rewards`), and the loss then carries no KL term.
      entropy_coef: weight of an entropy bonus (the loss subtracts `entropy_coef * H`); 0 by
        default. Entropy is logged whenever it is passed in, whatever the coefficient.
      tis_cap: None, or C > 0: multiply each token's policy-gradient loss by the truncated
        importance weight `min(pi_old / pi_sampler, C)` (stop-gradient), correcting for the
        sampler's numerics differing from the trainer's (truncated importance sampling, Yao et
        al. 2025, "Your efficient RL framework secretly brings you off-policy RL training").
      tis_level: "token" (each token's own ratio) or "sequence" (one weight per completion,
        `min(prod_t pi_old / pi_sampler, C)`, on all its tokens: the whole sequence's likelihood
        ratio, higher variance than the per-token weights).
      icepop_low, icepop_high: IcePop (Ring-1T, inclusionAI 2025): weight each token's
        policy-gradient loss by k = pi_old / pi_sampler where `icepop_low <= k <= icepop_high`
        and drop the token from it otherwise (its gradient is zero; it still counts in the
        normaliser). 0 for `icepop_high` is off; the paper uses 0.5 and 5. Not with `tis_cap`.
      router_aux_coef: a mixture-of-experts policy's weight of the router's load-balancing loss
        (`moe.load_balancing_loss`, Switch Transformer's, as `transformers` computes it) over
        the update's forward of the trained tokens, added to the policy loss; 0 (the default)
        adds nothing. A dense model refuses a nonzero value (`update.check_router_aux`).
    """

    policy_loss: PolicyLoss = "ppo_clip"
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    aggregation: Aggregation = "token_mean"
    kl_estimator: KLEstimator = "k3"
    kl_beta: float = 0.0
    kl_in: KLIn = "loss"
    entropy_coef: float = 0.0
    tis_cap: float | None = None
    tis_level: TISLevel = "token"
    icepop_low: float = 0.0
    icepop_high: float = 0.0
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05
    kimi_tau: float = 0.1
    router_aux_coef: float = 0.0

    def __post_init__(self):
        def number(name: str, lo: float, lo_open: bool = False, hi: float = math.inf):
            v = getattr(self, name)
            ok = isinstance(v, int | float) and math.isfinite(v) and lo <= v < hi
            if not ok or (lo_open and v == lo):
                bound = f"> {lo}" if lo_open else f">= {lo}"
                top = "" if hi == math.inf else f" and < {hi}"
                raise ValueError(f"{name}={v!r} must be a finite number {bound}{top}")

        for name, choices in (
            ("policy_loss", POLICY_LOSSES),
            ("aggregation", AGGREGATIONS),
            ("kl_estimator", KL_ESTIMATORS),
            ("kl_in", KL_INS),
            ("tis_level", TIS_LEVELS),
        ):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name}={getattr(self, name)!r}; expected one of {choices}")
        number("clip_low", 0.0, hi=1.0)
        number("clip_high", 0.0)
        number("kl_beta", 0.0)
        number("entropy_coef", -math.inf)
        if self.dual_clip is not None:
            number("dual_clip", 1.0, lo_open=True)
            if self.policy_loss not in ("ppo_clip", "gspo"):
                raise ValueError(
                    f"dual_clip={self.dual_clip} applies to the clipped losses (ppo_clip, gspo), "
                    f"not policy_loss={self.policy_loss!r}"
                )
        if self.tis_cap is not None:
            number("tis_cap", 0.0, lo_open=True)
        number("sapo_tau_pos", 0.0, lo_open=True)
        number("sapo_tau_neg", 0.0, lo_open=True)
        number("kimi_tau", 0.0)
        number("router_aux_coef", 0.0)
        number("icepop_low", 0.0, hi=1.0)
        number("icepop_high", 0.0)
        if self.icepop:
            if not self.icepop_high > 1:
                raise ValueError(f"icepop_high={self.icepop_high} must be > 1 (0 turns it off)")
            if self.tis_cap is not None:
                raise ValueError(
                    f"icepop_high={self.icepop_high} with tis_cap={self.tis_cap}: IcePop's weight "
                    "already bounds the ratio; choose one correction"
                )

    @property
    def icepop(self) -> bool:
        """Whether IcePop masks tokens by their sampler/trainer ratio."""
        return self.icepop_high > 0

    @property
    def kl_in_loss(self) -> bool:
        """Whether the loss carries a KL term (and so needs `ref_logp_NT`)."""
        return self.kl_beta > 0 and self.kl_in == "loss"

    @property
    def kl_in_reward(self) -> bool:
        """Whether the rewards carry the KL penalty (`kl_penalized_rewards`) instead."""
        return self.kl_beta > 0 and self.kl_in == "reward"


def _masked_mean(x_NT: Array, mask_NT: Array) -> Array:
    return jnp.sum(jnp.where(mask_NT, x_NT, 0.0)) / jnp.maximum(jnp.sum(mask_NT), 1)


def kl_penalty(logp_NT: Array, ref_logp_NT: Array, estimator: str) -> Array:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled from pi, in f32.

    Args:
      logp_NT: log pi of the sampled tokens.
      ref_logp_NT: log pi_ref of the same tokens.
      estimator: one of `KL_ESTIMATORS` (see `LossConfig.kl_estimator`).
    """
    d_NT = logp_NT.astype(jnp.float32) - ref_logp_NT.astype(jnp.float32)
    if estimator == "k1":
        return d_NT
    if estimator == "k2":
        return 0.5 * jnp.square(d_NT)
    if estimator == "k3":
        neg_d_NT = jnp.clip(-d_NT, -KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
        return jnp.exp(neg_d_NT) - neg_d_NT - 1.0
    if estimator in ("low_var_kl", "k3_plus"):
        neg_d_NT = jnp.clip(-d_NT, -VERL_LOG_RATIO_CLAMP, VERL_LOG_RATIO_CLAMP)
        k3_NT = jnp.exp(neg_d_NT) - neg_d_NT - 1.0
        low_var_NT = jnp.clip(k3_NT, -VERL_VALUE_CLAMP, VERL_VALUE_CLAMP)
        if estimator == "low_var_kl":
            return low_var_NT
        # `k2 - sg(k2)` is exactly 0, so the value is exactly low_var_kl's even where k2 is huge
        # (k2 + sg(value - k2) would round to the spacing of k2).
        k2_NT = 0.5 * jnp.square(d_NT)
        return k2_NT - jax.lax.stop_gradient(k2_NT) + jax.lax.stop_gradient(low_var_NT)
    raise ValueError(f"kl_estimator={estimator!r}; expected one of {KL_ESTIMATORS}")


def kl_penalized_rewards(
    rewards_N: Array,
    logp_NT: Array,
    ref_logp_NT: Array,
    mask_NT: Array,
    kl_beta: float,
    estimator: str = "k1",
) -> Array:
    """Rewards minus `kl_beta` times each completion's summed KL, for `kl_in == "reward"`.

    The penalty is a constant of the update (stop-gradient), computed from the sampling policy's
    log-probs, before advantages; k1 summed over a sampled completion is an unbiased estimate
    of the sequence-level KL, as in PPO-RLHF (Ouyang et al. 2022) and REINFORCE++.

    Args:
      rewards_N: one reward per completion.
      logp_NT: log-probs of the policy that sampled the completions.
      ref_logp_NT: reference log-probs of the same tokens.
      mask_NT: completion tokens.
      kl_beta: the weight.
      estimator: "k1", "k2" or "k3".

    Returns:
      (N,) f32 penalised rewards.
    """
    kl_NT = jax.lax.stop_gradient(kl_penalty(logp_NT, ref_logp_NT, estimator))
    kl_N = jnp.sum(jnp.where(mask_NT, kl_NT, 0.0), axis=1)
    return rewards_N.astype(jnp.float32) - kl_beta * kl_N


def token_weights(mask_NT: Array, aggregation: str) -> Array:
    """Per-token weights (N, T) in f32; each row's weights depend on that row's mask only.

    "seq_mean_token_mean" gives 1/len_n on the tokens of row n, every other mode the mask itself.
    An empty row gets zero weight.
    """
    m_NT = mask_NT.astype(jnp.float32)
    if aggregation == "seq_mean_token_mean":
        return m_NT / jnp.maximum(jnp.sum(m_NT, axis=1, keepdims=True), 1.0)
    if aggregation in AGGREGATIONS:
        return m_NT
    raise ValueError(f"aggregation={aggregation!r}; expected one of {AGGREGATIONS}")


def loss_normalizer(mask_NT: Array, aggregation: str, max_new_tokens: int | None = None) -> Array:
    """The global normaliser Z (f32 scalar) of the whole batch; compute it once per batch.

    - "token_mean": the number of completion tokens in the batch.
    - "seq_mean_token_mean", "seq_mean_token_sum": the number of rows with at least one token.
    - "dr_grpo_constant": N x max_new_tokens (a constant for a fixed batch shape).
    Z is at least 1, so an empty batch yields a zero loss rather than NaN.

    Args:
      mask_NT: the completion mask of the *full* batch (not of one micro-batch).
      aggregation: one of `AGGREGATIONS`.
      max_new_tokens: the generation budget for "dr_grpo_constant"; defaults to T.
    """
    m_NT = mask_NT.astype(jnp.float32)
    N, T = mask_NT.shape
    if aggregation == "token_mean":
        z = jnp.sum(m_NT)
    elif aggregation in ("seq_mean_token_mean", "seq_mean_token_sum"):
        z = jnp.sum(jnp.any(mask_NT, axis=1).astype(jnp.float32))
    elif aggregation == "dr_grpo_constant":
        z = jnp.asarray(N * (T if max_new_tokens is None else max_new_tokens), jnp.float32)
    else:
        raise ValueError(f"aggregation={aggregation!r}; expected one of {AGGREGATIONS}")
    return jnp.maximum(z, 1.0)


def _log_ratio(logp_NT: Array, old_logp_NT: Array, mask_NT: Array, policy_loss: str) -> Array:
    """log(pi / pi_old) per token, zero off the mask (so exp never sees padding garbage)."""
    lr_NT = jnp.where(mask_NT, logp_NT - old_logp_NT, 0.0)
    if policy_loss != "gspo":
        return lr_NT
    # GSPO-token: value = the sequence's mean log ratio, gradient = that of log pi_t.
    seq_lr_N = jnp.sum(lr_NT, axis=1) / jnp.maximum(jnp.sum(mask_NT, axis=1), 1)
    seq_lr_N = jax.lax.stop_gradient(seq_lr_N)
    token_lr_NT = logp_NT - jax.lax.stop_gradient(logp_NT) + seq_lr_N[:, None]
    return jnp.where(mask_NT, token_lr_NT, 0.0)


def _surrogate(
    ratio_NT: Array, lr_NT: Array, logp_NT: Array, A_N1: Array, cfg: LossConfig
) -> tuple[Array, dict[str, Array]]:
    """The per-token policy-gradient surrogate of `cfg.policy_loss` and where each clip is active
    ("clip_low", "clip_high", "dual": bool (N, T))."""
    no_clip_NT = jnp.zeros(ratio_NT.shape, bool)
    clips = {"clip_low": no_clip_NT, "clip_high": no_clip_NT, "dual": no_clip_NT}
    if cfg.policy_loss == "reinforce":
        return -A_N1 * ratio_NT, clips
    if cfg.policy_loss == "kimi":
        seq_lr_N1 = jnp.sum(lr_NT, axis=1, keepdims=True)
        return -A_N1 * logp_NT + 0.5 * cfg.kimi_tau * seq_lr_N1 * lr_NT, clips
    lo, hi = 1.0 - cfg.clip_low, 1.0 + cfg.clip_high
    if cfg.policy_loss == "cispo":
        weight_NT = jax.lax.stop_gradient(jnp.clip(ratio_NT, lo, hi))
        clips["clip_low"] = ratio_NT < lo
        clips["clip_high"] = ratio_NT > hi
        return -A_N1 * weight_NT * logp_NT, clips
    if cfg.policy_loss == "sapo":
        tau_N1 = jnp.where(A_N1 > 0, cfg.sapo_tau_pos, cfg.sapo_tau_neg)
        gate_NT = 4.0 / tau_N1 * jax.nn.sigmoid(tau_N1 * (ratio_NT - 1.0))
        return -A_N1 * gate_NT, clips
    unclipped_NT = -A_N1 * ratio_NT
    clipped_NT = -A_N1 * jnp.clip(ratio_NT, lo, hi)
    pg_NT = jnp.maximum(unclipped_NT, clipped_NT)
    clips["clip_low"] = (A_N1 < 0) & (ratio_NT < lo)
    clips["clip_high"] = (A_N1 > 0) & (ratio_NT > hi)
    if cfg.dual_clip is not None:
        c = cfg.dual_clip
        pg_NT = jnp.where(A_N1 < 0, jnp.minimum(pg_NT, -A_N1 * c), pg_NT)
        clips["dual"] = (A_N1 < 0) & (ratio_NT > c)
    return pg_NT, clips


def per_token_loss(
    logp_NT: Array,
    old_logp_NT: Array,
    adv_N: Array,
    mask_NT: Array,
    cfg: LossConfig,
    ref_logp_NT: Array | None = None,
    sampler_logp_NT: Array | None = None,
    entropy_NT: Array | None = None,
) -> tuple[Array, dict[str, Array]]:
    """Unaggregated per-token losses (N, T) in f32, and per-token parts for metrics.

    See `policy_loss` for the arguments. The parts are: "pg" (policy-gradient term, after the
    TIS weight), "kl" (the KL estimate, if a reference is given), "entropy" (if given), "ratio",
    "clip_low", "clip_high", "dual" (bool, where each clip is active), "tis_weight" (if a
    sampler is given). Values off the mask are meaningless.

    Raises:
      ValueError: if the config needs `ref_logp_NT` or `entropy_NT` and it is missing.
    """
    f32 = jnp.float32
    mask_NT = mask_NT.astype(bool)

    # Every input is zeroed off the mask first: padding may hold inf/NaN log-probs, and a
    # `where` applied only at the end would still let 0 * inf = NaN into the gradient.
    def clean(x_NT: Array) -> Array:
        return jnp.where(mask_NT, x_NT.astype(f32), 0.0)

    logp_NT, old_logp_NT = clean(logp_NT), jax.lax.stop_gradient(clean(old_logp_NT))
    # One advantage per row, broadcast over its tokens, or one per token (GAE): (N, 1) or (N, T).
    A_N1 = jax.lax.stop_gradient(adv_N.astype(f32))
    A_N1 = A_N1[:, None] if A_N1.ndim == 1 else A_N1
    parts: dict[str, Array] = {}

    log_ratio_NT = _log_ratio(logp_NT, old_logp_NT, mask_NT, cfg.policy_loss)
    ratio_NT = jnp.exp(log_ratio_NT)
    parts["ratio"] = jax.lax.stop_gradient(ratio_NT)
    pg_NT, clips = _surrogate(ratio_NT, log_ratio_NT, logp_NT, A_N1, cfg)
    parts.update(clips)

    if (cfg.tis_cap is not None or cfg.icepop) and sampler_logp_NT is None:
        raise ValueError("tis_cap and icepop need sampler_logp_NT")
    if sampler_logp_NT is not None:
        # log(pi_old / pi_sampler): the trainer's recomputation against what the sampler reported.
        # Log weights are clamped to +-20 so that no weight (or metric) overflows.
        lr_NT = jax.lax.stop_gradient(old_logp_NT - clean(sampler_logp_NT))
        parts["mismatch"] = lr_NT
        log_k_NT = lr_NT
        if cfg.tis_level == "sequence":
            log_k_NT = jnp.broadcast_to(jnp.sum(lr_NT, axis=1, keepdims=True), lr_NT.shape)
        k_NT = jnp.exp(jnp.clip(log_k_NT, -LOG_WEIGHT_CLAMP, LOG_WEIGHT_CLAMP))
        if cfg.tis_cap is not None:
            k_NT = jnp.minimum(k_NT, cfg.tis_cap)
            pg_NT = pg_NT * k_NT
        elif cfg.icepop:
            kept_NT = (k_NT >= cfg.icepop_low) & (k_NT <= cfg.icepop_high)
            parts["icepop_masked"] = ~kept_NT
            pg_NT = jnp.where(kept_NT, pg_NT * k_NT, 0.0)
        parts["tis_weight"] = k_NT
    parts["pg"] = pg_NT
    loss_NT = pg_NT

    if cfg.kl_in_loss and ref_logp_NT is None:
        raise ValueError(f"kl_beta={cfg.kl_beta} with kl_in='loss' needs ref_logp_NT")
    if ref_logp_NT is not None:
        ref_NT = jax.lax.stop_gradient(clean(ref_logp_NT))
        kl_NT = kl_penalty(logp_NT, ref_NT, cfg.kl_estimator)
        parts["kl"] = kl_NT
        if cfg.kl_in_loss:
            loss_NT = loss_NT + cfg.kl_beta * kl_NT

    if cfg.entropy_coef != 0 and entropy_NT is None:
        raise ValueError(f"entropy_coef={cfg.entropy_coef} needs entropy_NT")
    if entropy_NT is not None:
        entropy_NT = clean(entropy_NT)
        parts["entropy"] = entropy_NT
        if cfg.entropy_coef != 0:
            loss_NT = loss_NT - cfg.entropy_coef * entropy_NT
    return loss_NT, parts


def policy_loss(
    logp_NT: Array,
    old_logp_NT: Array,
    adv_N: Array,
    mask_NT: Array,
    cfg: LossConfig,
    normalizer: Array | None = None,
    ref_logp_NT: Array | None = None,
    sampler_logp_NT: Array | None = None,
    entropy_NT: Array | None = None,
    max_new_tokens: int | None = None,
) -> tuple[Array, dict[str, Array]]:
    """The aggregated loss `sum_nt w_nt l_nt / normalizer` (f32 scalar) and metrics.

    For gradient accumulation pass the full batch's `loss_normalizer(...)` as `normalizer` to
    every micro-batch and *sum* the returned losses and gradients: they then equal the full
    batch's exactly.

    Args:
      logp_NT: current policy log-probs of the sampled tokens (differentiated).
      old_logp_NT: log-probs under the policy the rollout and advantages belong to (constant).
        For a single on-policy update pass `jax.lax.stop_gradient(logp_NT)`: every ratio is 1.
      adv_N: one advantage per row (constant), broadcast over its tokens; or (N, T), one per
        token (GAE).
      mask_NT: tokens that enter the loss.
      cfg: the objective (static).
      normalizer: the global Z from `loss_normalizer` on the full batch; None computes it from
        this call's `mask_NT` (right only when this call *is* the full batch).
      ref_logp_NT: reference log-probs; needed when `cfg.kl_beta > 0` and `cfg.kl_in == "loss"`,
        otherwise only logged.
      sampler_logp_NT: the sampler's log-probs; needed with `cfg.tis_cap`, otherwise only
        logged (the sampler/trainer mismatch).
      entropy_NT: per-token entropy of the current policy (from `logprobs.token_logprobs`);
        needed when `cfg.entropy_coef != 0`, otherwise only logged.
      max_new_tokens: for `normalizer=None` with "dr_grpo_constant"; defaults to T.

    Returns:
      loss: f32 scalar.
      metrics: f32 scalars over this call's tokens (weight them by "loss/tokens" to combine
        micro-batches): "loss/pg", "loss/kl", "loss/entropy" (the three terms of `loss`,
        aggregated like it, so micro-batch values sum), "loss/tokens", "ratio/min",
        "ratio/mean", "ratio/max", "clip/frac_low", "clip/frac_high", "clip/frac_dual"; with a
        reference "kl/mean"; with entropy "entropy/mean"; with a sampler "tis/weight_mean" and
        "tis/frac_capped" (fraction of tokens whose weight hit the cap, with `tis_cap`),
        "icepop/frac_masked" (with IcePop), and the sampler/trainer agreement: "mismatch/mean"
        and "mismatch/max" of |log pi_old - log pi_sampler| and "mismatch/kl", the k3 estimate
        of KL(sampler || trainer) on the sampled tokens.
    """
    mask_NT = mask_NT.astype(bool)
    if normalizer is None:
        normalizer = loss_normalizer(mask_NT, cfg.aggregation, max_new_tokens)
    loss_NT, parts = per_token_loss(
        logp_NT, old_logp_NT, adv_N, mask_NT, cfg, ref_logp_NT, sampler_logp_NT, entropy_NT
    )
    w_NT = token_weights(mask_NT, cfg.aggregation) / normalizer
    # `where`, not multiply: a NaN/inf loss on a padding token must not leak through 0 * inf.
    aggregate = lambda x_NT: jnp.sum(jnp.where(mask_NT, w_NT * x_NT, 0.0))  # noqa: E731
    loss = aggregate(loss_NT)

    tokens = jnp.sum(mask_NT.astype(jnp.float32))
    any_tokens = tokens > 0
    ratio_NT = parts["ratio"]
    frac = lambda b_NT: _masked_mean(b_NT.astype(jnp.float32), mask_NT)  # noqa: E731
    metrics = {
        "loss/pg": aggregate(parts["pg"]),
        "loss/kl": aggregate(cfg.kl_beta * parts["kl"]) if cfg.kl_in_loss else jnp.zeros(()),
        "loss/entropy": (
            aggregate(-cfg.entropy_coef * parts["entropy"])
            if cfg.entropy_coef != 0
            else jnp.zeros(())
        ),
        "loss/tokens": tokens,
        "ratio/min": jnp.where(any_tokens, jnp.min(jnp.where(mask_NT, ratio_NT, jnp.inf)), 1.0),
        "ratio/mean": jnp.where(any_tokens, _masked_mean(ratio_NT, mask_NT), 1.0),
        "ratio/max": jnp.where(any_tokens, jnp.max(jnp.where(mask_NT, ratio_NT, -jnp.inf)), 1.0),
        "clip/frac_low": frac(parts["clip_low"]),
        "clip/frac_high": frac(parts["clip_high"]),
        "clip/frac_dual": frac(parts["dual"]),
    }
    if "kl" in parts:
        metrics["kl/mean"] = _masked_mean(jax.lax.stop_gradient(parts["kl"]), mask_NT)
    if "entropy" in parts:
        metrics["entropy/mean"] = _masked_mean(jax.lax.stop_gradient(parts["entropy"]), mask_NT)
    if "tis_weight" in parts:
        metrics["tis/weight_mean"] = _masked_mean(parts["tis_weight"], mask_NT)
        if cfg.tis_cap is not None:
            metrics["tis/frac_capped"] = frac(parts["tis_weight"] >= cfg.tis_cap)
    if "icepop_masked" in parts:
        metrics["icepop/frac_masked"] = frac(parts["icepop_masked"])
    if "mismatch" in parts:  # how far the sampler's log-probs are from the trainer's
        lr_NT = parts["mismatch"]
        metrics["mismatch/mean"] = _masked_mean(jnp.abs(lr_NT), mask_NT)
        metrics["mismatch/max"] = jnp.max(jnp.where(mask_NT, jnp.abs(lr_NT), 0.0))
        # KL(sampler || trainer) from the sampler's tokens, k3: exp(-d) + d - 1, d = s - t.
        lr_NT = jnp.clip(lr_NT, -LOG_WEIGHT_CLAMP, LOG_WEIGHT_CLAMP)
        metrics["mismatch/kl"] = _masked_mean(jnp.exp(lr_NT) - lr_NT - 1.0, mask_NT)
    metrics = {k: jax.lax.stop_gradient(v) for k, v in metrics.items()}
    return loss, metrics
