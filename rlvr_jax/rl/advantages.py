"""Advantages: outcome advantages from group rewards (GRPO and its corrected variants), and
PPO's generalised advantage estimation from per-token rewards and a value model (`gae`).

Every estimator maps `rewards_BG` (B prompts x G samples each, one scalar reward per completion) to
`adv_BG`, one advantage per completion that the loss broadcasts over its tokens. The per-group
baselines are functions of one group (`_*_G`), `vmap`ped over prompts; batch-level statistics
(REINFORCE's baseline, batch std, REINFORCE++ whitening) are reductions over the whole array.

A group whose rewards are all equal (all correct, all wrong, or any constant) carries no
group-relative signal: every group-baseline estimator returns exactly zero advantage for it (but
`whiten="verl"`, which reproduces verl's numbers, zeroes nothing), and the fraction of such groups
is reported, since it is the fraction of the batch that is wasted (DAPO's dynamic sampling exists
to refill it).

Everything is computed in f32 and is jittable; the config is static (hashable).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal, get_args

import jax
import jax.numpy as jnp

Array = jax.Array

Estimator = Literal[
    "grpo",
    "dr_grpo",
    "rloo",
    "reinforce",
    "reinforce_pp_baseline",
    "expert_iteration",
    "pass_at_k",
    "gae",
]
StdScaling = Literal["group", "batch", "none"]
StdKind = Literal["population", "sample"]
WhitenOver = Literal["completions", "tokens"]
Whiten = Literal["std_eps", "verl"]

ESTIMATORS: tuple[str, ...] = get_args(Estimator)
STD_SCALINGS: tuple[str, ...] = ("group", "batch", "none")
STD_KINDS: tuple[str, ...] = ("population", "sample")
WHITEN_OVER: tuple[str, ...] = ("completions", "tokens")
WHITENS: tuple[str, ...] = get_args(Whiten)
# verl's `masked_whiten` adds this to the variance, not to the std.
VERL_WHITEN_EPS = 1e-8

# What `std_scaling=None` resolves to, and which explicit values each estimator admits.
_DEFAULT_STD: dict[str, str] = {
    "grpo": "group",
    "dr_grpo": "none",
    "rloo": "none",
    "reinforce": "none",
    "reinforce_pp_baseline": "batch",
    "expert_iteration": "none",
    "pass_at_k": "none",
    "gae": "batch",
}
_ALLOWED_STD: dict[str, tuple[str, ...]] = {
    "grpo": STD_SCALINGS,
    "dr_grpo": ("none",),
    "rloo": STD_SCALINGS,
    "reinforce": STD_SCALINGS,
    "reinforce_pp_baseline": ("batch",),
    "expert_iteration": ("none",),
    "pass_at_k": ("none",),
    "gae": ("batch", "none"),
}


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
    """How rewards become advantages.

    Attributes:
      estimator: the baseline.
        - "grpo": group mean, divided by the group std (DeepSeekMath, Shao et al. 2024):
          `(r_i - mean(r)) / (std(r) + eps)`.
        - "dr_grpo": group mean and no std (Dr. GRPO, Liu et al. 2025, "Understanding R1-Zero-Like
          Training"): `r_i - mean(r)`. The std division re-weights prompts by
          `1 / sqrt(p (1 - p))` for success rate p, favouring too-easy and too-hard prompts.
        - "rloo": leave-one-out mean, `r_i - mean_{j != i} r_j` (RLOO, Ahmadian et al. 2024,
          "Back to Basics"). The baseline does not depend on sample i, so the policy gradient is
          unbiased; it equals `G / (G - 1)` times the Dr. GRPO advantage. Needs G >= 2.
        - "reinforce": one baseline for the whole batch, the mean reward over all B x G samples
          (REINFORCE with a batch-mean baseline). Groups play no role, so a group of equal
          rewards is *not* zeroed here: it is compared with the batch, by definition.
        - "reinforce_pp_baseline": group mean subtracted, then the centred values whitened over
          the whole batch, `(a - mean_batch(a)) / (std_batch(a) + eps)` (REINFORCE++-baseline,
          Hu et al. 2025), a zero-variance group staying at zero. Its `std_scaling` is "batch",
          meaning this whitening, over completions or over tokens (`whiten_over`).
          `whiten="verl"` gives verl's advantages instead (see `whiten`).
        - "expert_iteration": 1 for a verified-correct completion, 0 otherwise: supervised
          fine-tuning on the model's own verified answers (expert iteration / rejection-sampling
          fine-tuning, Anthony et al. 2017; RAFT, Dong et al. 2023), the baseline RL is compared
          with at the same sampling budget. With `policy_loss="reinforce"` on-policy the
          gradient is the NLL gradient of the kept completions; the train step also leaves the
          rejected ones out of the loss's token count, so "token_mean" is SFT's token mean.
          All-correct groups are trained on, unlike the group baselines.
        - "pass_at_k": the group is rewarded for solving the prompt at least once in k tries
          (Pass@k Training, Chen et al. 2025), with the paper's analytical advantages over all
          k-subsets of the G samples. From correctness (`correct_BG`), with c correct and
          n = G - c wrong: the group's pass@k `R = 1 - C(n, k) / C(G, k)`, its std
          `s = sqrt(R (1 - R))`, a correct sample's advantage `(1 - R) / s` and a wrong one's
          `(1 - R - C(n - 1, k - 1) / C(G - 1, k - 1)) / s`: the mean over the k-subsets that
          hold the sample of their pass@k, less R, over s. A group where every k-subset holds a
          correct sample (n < k), or none does, gets zero. k = 1 is GRPO on correctness.
        - "gae": PPO's generalised advantage estimation (Schulman et al. 2016) from per-token
          rewards and a value model's per-token values (`gae`): one advantage per token, no
          groups. Needs `rl.critic`; the rewards are the completion's reward on its last
          token, less the KL penalty per token with `loss.kl_in="reward"` (`token_rewards`).
      std_scaling: the divisor after the baseline. None (default) takes the estimator's own:
        "group" for grpo, "batch" for reinforce_pp_baseline, "none" for the rest (pass_at_k
        divides by its own std).
        - "group": the std of the group's rewards (GRPO).
        - "batch": the std of all B x G rewards (group mean, batch std: Lite PPO, Liu et al.
          2025, "Tricks or Traps"). With `std_kind="sample"` and the default eps this is TRL's
          `scale_rewards="batch"`: `(r - mean_group) / (std_sample(all r) + 1e-4)`. For
          reinforce_pp_baseline, the std of the group-centred values, as its whitening
          prescribes. For gae (its default), the advantages are whitened over the batch's
          tokens, `(A - mean) / (std + eps)`, or as verl's GAE with `whiten="verl"`; "none"
          leaves them raw.
        - "none": no division (dr_grpo, rloo, reinforce).
        dr_grpo admits only "none" and reinforce_pp_baseline only "batch"; anything else would
        be a different estimator and raises.
      std_kind: "population" (divide the squared deviations by n, as `np.std` and DeepSeekMath's
        implementations) or "sample" (by n - 1, as `torch.std`, which TRL and verl use). With
        "sample", grpo is TRL's `scale_rewards="group"` at the default eps (1e-4) and verl's
        GRPO (`compute_grpo_outcome_advantage`) at eps=1e-6, but where a group's rewards are
        all equal: zero here, `(r - mean) / eps` there, which is rounding noise over eps.
      eps: added to the std before dividing; must be >= 0. A zero-variance group is zeroed
        before any division, so eps=0 is safe. Not used by `whiten="verl"`.
      pass_k: k of "pass_at_k", in [1, G].
      gamma, lam: GAE's discount and its lambda, each in [0, 1]. gamma = lam = 1 with zero
        values gives the Monte-Carlo return-to-go as the advantage.
      whiten_over: what the reinforce_pp_baseline whitening averages over. "completions": one
        value each. "tokens": each completion's value counted once per generated token (the
        weighting of verl's `masked_whiten` over the response mask), so long completions weigh
        more in the mean and the std (and the centred values no longer have mean zero).
      whiten: the whitening formula of reinforce_pp_baseline and of gae's "batch".
        - "std_eps": `(x - mean) / (std + eps)`, the std of `std_kind`; under
          reinforce_pp_baseline a zero-variance group (a group of one included) stays exactly
          zero.
        - "verl": verl's `masked_whiten` (verl/utils/torch_functional.py),
          `(x - mean) * rsqrt(var + 1e-8)` over the tokens, var the sample variance (n - 1);
          `std_kind` and `eps` do not apply. With reinforce_pp_baseline (and
          `whiten_over="tokens"`, which it needs) the advantages are verl's
          `compute_reinforce_plus_plus_baseline_outcome_advantage`'s: the group mean (0 for a
          group of one, whose reward passes through) is subtracted and nothing is zeroed, so a
          zero-variance group gets `-mean * rsqrt(var + 1e-8)`, the token-weighted mean being
          nonzero. With gae they are verl's `compute_gae_advantage_return`'s. verl refuses a
          batch of one token; here it gets zero.
    """

    estimator: Estimator = "grpo"
    std_scaling: StdScaling | None = None
    std_kind: StdKind = "population"
    eps: float = 1e-4
    pass_k: int = 1
    whiten_over: WhitenOver = "completions"
    whiten: Whiten = "std_eps"
    gamma: float = 1.0
    lam: float = 0.95

    def __post_init__(self):
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator={self.estimator!r}; expected one of {ESTIMATORS}")
        if self.std_scaling is not None and self.std_scaling not in STD_SCALINGS:
            raise ValueError(
                f"std_scaling={self.std_scaling!r}; expected None or one of {STD_SCALINGS}"
            )
        if self.std_kind not in STD_KINDS:
            raise ValueError(f"std_kind={self.std_kind!r}; expected one of {STD_KINDS}")
        if not isinstance(self.eps, int | float) or not math.isfinite(self.eps) or self.eps < 0:
            raise ValueError(f"eps={self.eps!r} must be a finite number >= 0")
        if isinstance(self.pass_k, bool) or not isinstance(self.pass_k, int) or self.pass_k < 1:
            raise ValueError(f"pass_k={self.pass_k!r} must be an integer >= 1")
        for name in ("gamma", "lam"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 1:
                raise ValueError(f"{name}={v!r} must be a number in [0, 1]")
        if self.whiten_over not in WHITEN_OVER:
            raise ValueError(f"whiten_over={self.whiten_over!r}; expected one of {WHITEN_OVER}")
        if self.whiten_over == "tokens" and self.estimator != "reinforce_pp_baseline":
            raise ValueError(
                f"whiten_over='tokens' applies to estimator='reinforce_pp_baseline', not "
                f"{self.estimator!r}"
            )
        if self.std_scaling is None:
            # Frozen dataclass: resolve the default once so the field is never None afterwards.
            object.__setattr__(self, "std_scaling", _DEFAULT_STD[self.estimator])
        allowed = _ALLOWED_STD[self.estimator]
        if self.std_scaling not in allowed:
            raise ValueError(
                f"std_scaling={self.std_scaling!r} contradicts estimator={self.estimator!r}, "
                f"which admits only {allowed} (use estimator='grpo' for group-mean baselines "
                "with another std scaling)"
            )
        self._check_whiten()

    def _check_whiten(self):
        if self.whiten not in WHITENS:
            raise ValueError(f"whiten={self.whiten!r}; expected one of {WHITENS}")
        if self.whiten != "verl":
            return
        if self.estimator == "gae":
            if self.std_scaling != "batch":
                raise ValueError(
                    f"whiten='verl' whitens gae's advantages; std_scaling={self.std_scaling!r} "
                    "leaves them raw"
                )
        elif self.estimator != "reinforce_pp_baseline":
            raise ValueError(
                f"whiten='verl' applies to estimator='reinforce_pp_baseline' or 'gae', not "
                f"{self.estimator!r}"
            )
        elif self.whiten_over != "tokens":
            raise ValueError(
                "whiten='verl' with reinforce_pp_baseline is verl's whitening over the response "
                f"tokens: set whiten_over='tokens' (not {self.whiten_over!r})"
            )


def _std(x: Array, kind: str, axis=None) -> Array:
    ddof = 1 if kind == "sample" else 0
    return jnp.std(x, axis=axis, ddof=ddof)


def _scale(x: Array, std: Array, eps: float) -> Array:
    # A zero std only occurs where every centred value is already zero; dividing by 1 there keeps
    # eps=0 from producing 0/0.
    return x / jnp.where(std > 0, std + eps, 1.0)


def _mean_baseline_G(r_G: Array) -> Array:
    return r_G - jnp.mean(r_G)


def _leave_one_out_G(r_G: Array) -> Array:
    G = r_G.shape[0]
    others_mean_G = (jnp.sum(r_G) - r_G) / (G - 1)
    return r_G - others_mean_G


def pass_at_k_advantages(correct_BG: Array, k: int) -> Array:
    """(B, G) f32 pass@k advantages of binary outcomes (see `AdvantageConfig.estimator`).

    Raises:
      ValueError: unless 1 <= k <= G.
    """
    G = correct_BG.shape[1]
    if not 1 <= k <= G:
        raise ValueError(f"pass_k={k} must be in [1, G={G}] (the samples of a group)")
    # Tables over the number of wrong samples n = 0..G (static G and k): the chance that a
    # k-subset holds no correct sample, and that the k - 1 others beside a wrong one do not.
    none_n = [math.comb(n, k) / math.comb(G, k) for n in range(G + 1)]
    none_beside_n = [0.0] + [
        math.comb(n - 1, k - 1) / math.comb(G - 1, k - 1) for n in range(1, G + 1)
    ]
    n_B = G - jnp.sum(correct_BG.astype(jnp.int32), axis=1)
    r_B = 1.0 - jnp.asarray(none_n, jnp.float32)[n_B]
    std_B = jnp.sqrt(r_B * (1.0 - r_B))
    wrong_B = 1.0 - jnp.asarray(none_beside_n, jnp.float32)[n_B]
    value_BG = jnp.where(correct_BG, 1.0, wrong_B[:, None]) - r_B[:, None]
    return jnp.where(std_B[:, None] > 0, value_BG / jnp.where(std_B > 0, std_B, 1.0)[:, None], 0.0)


def zero_variance_groups(rewards_BG: Array) -> Array:
    """(B,) bool: the groups whose G rewards are all exactly equal."""
    return jnp.max(rewards_BG, axis=1) == jnp.min(rewards_BG, axis=1)


def _whiten(x: Array, w: Array, cfg: AdvantageConfig) -> Array:
    """`x` whitened over the batch by `cfg.whiten`'s formula, each value counted `w` times
    (1 per completion, its token count, or the token mask)."""
    w = w.astype(jnp.float32)
    n = jnp.sum(w)
    mean = jnp.sum(w * x) / jnp.maximum(n, 1.0)
    var = jnp.sum(w * jnp.square(x - mean)) / jnp.maximum(n, 1.0)
    bessel = n / jnp.maximum(n - 1.0, 1.0)
    if cfg.whiten == "verl":
        return (x - mean) * jax.lax.rsqrt(var * bessel + VERL_WHITEN_EPS)
    if cfg.std_kind == "sample":
        var = var * bessel
    return _scale(x - mean, jnp.sqrt(var), cfg.eps)


def compute_advantages(
    rewards_BG: Array,
    cfg: AdvantageConfig,
    correct_BG: Array | None = None,
    lengths_BG: Array | None = None,
) -> tuple[Array, dict[str, Array]]:
    """Advantages (B, G) in f32 and scalar statistics.

    Args:
      rewards_BG: one scalar reward per completion; row b holds the G samples of prompt b.
      cfg: the estimator (static).
      correct_BG: which completions count as correct for the all-correct / all-wrong fractions;
        defaults to `rewards_BG > 0`. It does not affect the advantages (but for pass_at_k,
        which is computed from it).
      lengths_BG: the policy's generated tokens of each completion (a tool's injected output
        excluded); needed by `whiten_over="tokens"`.

    Returns:
      adv_BG: the advantages; exactly zero for zero-variance groups under every group-baseline
        estimator (all but "reinforce"), unless `whiten="verl"`.
      stats: f32 scalars: "adv/frac_zero_variance", "adv/frac_all_correct",
        "adv/frac_all_wrong" (fractions of the B groups), "adv/mean", "adv/std", "adv/abs_max",
        "reward/mean", "reward/std" (population std over all B x G).

    Raises:
      ValueError: rloo with G < 2, a sample std over fewer than 2 values, or
        `whiten_over="tokens"` without `lengths_BG`.
    """
    if rewards_BG.ndim != 2:
        raise ValueError(f"rewards_BG must be (B, G); got shape {rewards_BG.shape}")
    B, G = rewards_BG.shape
    est, scaling = cfg.estimator, cfg.std_scaling
    if est == "gae":
        raise ValueError("estimator='gae' needs per-token values: use gae_advantages")
    if est == "rloo" and G < 2:
        raise ValueError(f"estimator='rloo' needs G >= 2 samples per prompt; got G={G}")
    verl = cfg.whiten == "verl"
    if cfg.whiten_over == "tokens" and lengths_BG is None:
        raise ValueError("whiten_over='tokens' needs lengths_BG")
    if cfg.std_kind == "sample" and scaling != "none" and not verl:
        n = G if scaling == "group" else B * G
        if n < 2:
            raise ValueError(
                f"std_kind='sample' with std_scaling={scaling!r} needs at least 2 values per "
                f"std; got {n} (rewards shape {rewards_BG.shape})"
            )
    r_BG = rewards_BG.astype(jnp.float32)
    zero_var_B = zero_variance_groups(r_BG)

    if correct_BG is None:
        correct_BG = r_BG > 0
    correct_BG = correct_BG.astype(bool)

    if est == "expert_iteration":
        adv_BG = correct_BG.astype(jnp.float32)
    elif est == "pass_at_k":
        adv_BG = pass_at_k_advantages(correct_BG, cfg.pass_k)
    elif est == "reinforce":
        adv_BG = r_BG - jnp.mean(r_BG)
    elif est == "rloo":
        adv_BG = jax.vmap(_leave_one_out_G)(r_BG)
    elif verl:
        # verl's baseline: the group mean, or 0 for a group of one; nothing is zeroed.
        adv_BG = (r_BG - jnp.mean(r_BG, axis=1, keepdims=True)) if G > 1 else r_BG
    else:
        adv_BG = jax.vmap(_mean_baseline_G)(r_BG)
    if est not in ("reinforce", "expert_iteration", "pass_at_k") and not verl:
        # The mean of G equal floats is not always that float; force the exact zero.
        adv_BG = jnp.where(zero_var_B[:, None], 0.0, adv_BG)

    if est == "reinforce_pp_baseline":
        tokens = cfg.whiten_over == "tokens"
        adv_BG = _whiten(adv_BG, lengths_BG if tokens else jnp.ones_like(adv_BG), cfg)
        if not verl:
            adv_BG = jnp.where(zero_var_B[:, None], 0.0, adv_BG)
    elif scaling == "group":
        std_B = jax.vmap(lambda r_G: _std(r_G, cfg.std_kind))(r_BG)
        adv_BG = _scale(adv_BG, std_B[:, None], cfg.eps)
    elif scaling == "batch":
        adv_BG = _scale(adv_BG, _std(r_BG, cfg.std_kind), cfg.eps)
    if est == "reinforce":
        adv_BG = jnp.where(jnp.max(r_BG) == jnp.min(r_BG), 0.0, adv_BG)
    stats = {
        **group_stats(r_BG, correct_BG),
        "adv/mean": jnp.mean(adv_BG),
        "adv/std": jnp.std(adv_BG),
        "adv/abs_max": jnp.max(jnp.abs(adv_BG)),
    }
    return adv_BG, stats


def group_stats(rewards_BG: Array, correct_BG: Array) -> dict[str, Array]:
    """The groups' make-up, whatever the estimator: "adv/frac_zero_variance",
    "adv/frac_all_correct", "adv/frac_all_wrong" (fractions of the B groups), "reward/mean" and
    "reward/std" (population std over all B x G)."""
    r_BG = rewards_BG.astype(jnp.float32)
    correct_BG = correct_BG.astype(bool)
    return {
        "adv/frac_zero_variance": jnp.mean(zero_variance_groups(r_BG).astype(jnp.float32)),
        "adv/frac_all_correct": jnp.mean(jnp.all(correct_BG, axis=1).astype(jnp.float32)),
        "adv/frac_all_wrong": jnp.mean(jnp.all(~correct_BG, axis=1).astype(jnp.float32)),
        "reward/mean": jnp.mean(r_BG),
        "reward/std": jnp.std(r_BG),
    }


# ---------------------------------------------------------------------------------------------
# Generalised advantage estimation (PPO with a value model)


def last_token(mask_NT: Array) -> Array:
    """(N, T) bool: each row's last position on the mask (none for an empty row)."""
    m_NT = mask_NT.astype(jnp.int32)
    from_right_NT = jnp.cumsum(m_NT[:, ::-1], axis=1)[:, ::-1]  # mask positions at or after t
    return mask_NT.astype(bool) & (from_right_NT == 1)


def token_rewards(
    rewards_N: Array, mask_NT: Array, kl_NT: Array | None = None, kl_beta: float = 0.0
) -> Array:
    """(N, T) f32 per-token rewards: each completion's reward on its last token, less
    `kl_beta` times the per-token KL estimate on every token (PPO-RLHF's reward, Ouyang et al.
    2022); zero off the mask. With gamma = 1 a row's rewards sum to `kl_penalized_rewards`'s."""
    r_NT = jnp.where(last_token(mask_NT), rewards_N.astype(jnp.float32)[:, None], 0.0)
    if kl_NT is not None and kl_beta:
        r_NT = r_NT - kl_beta * jax.lax.stop_gradient(kl_NT.astype(jnp.float32))
    return jnp.where(mask_NT, r_NT, 0.0)


def gae(
    rewards_NT: Array, values_NT: Array, mask_NT: Array, gamma: float, lam: float
) -> tuple[Array, Array]:
    """Generalised advantage estimation over the positions on the mask.

    `delta_t = r_t + gamma V(s_{t+1}) - V(s_t)`, `A_t = delta_t + gamma lam A_{t+1}`, with
    `V = 0` and `A = 0` after a row's last position; the return target is `A_t + V(s_t)`.
    Positions off the mask (padding after the end, observation tokens of a multi-turn row) are
    skipped: the chain links each position to the next one on the mask, as verl's masked GAE.

    Args:
      rewards_NT: per-token rewards (`token_rewards`).
      values_NT: the value model's V(s_t), the value of the prefix before token t.
      mask_NT: the tokens that are the policy's actions.
      gamma, lam: the discount and GAE's lambda (static).

    Returns:
      adv_NT, returns_NT: f32, zero off the mask; constants (stop-gradient).
    """
    f32 = jnp.float32
    r_TN, v_TN = (jax.lax.stop_gradient(x.astype(f32)).T for x in (rewards_NT, values_NT))
    m_TN = mask_NT.astype(bool).T

    def back(carry, xs):
        next_value_N, next_adv_N = carry
        r_N, v_N, m_N = xs
        adv_N = r_N + gamma * next_value_N - v_N + gamma * lam * next_adv_N
        carry = (jnp.where(m_N, v_N, next_value_N), jnp.where(m_N, adv_N, next_adv_N))
        return carry, jnp.where(m_N, adv_N, 0.0)

    zeros_N = jnp.zeros(r_TN.shape[1], f32)
    _, adv_TN = jax.lax.scan(back, (zeros_N, zeros_N), (r_TN, v_TN, m_TN), reverse=True)
    adv_NT = adv_TN.T
    return adv_NT, jnp.where(mask_NT, adv_NT + v_TN.T, 0.0)


def masked_whiten(x_NT: Array, mask_NT: Array, cfg: AdvantageConfig) -> Array:
    """`x` whitened over the positions on the mask by `cfg.whiten`'s formula; zero off it."""
    return jnp.where(mask_NT, _whiten(x_NT, mask_NT, cfg), 0.0)


def gae_advantages(
    rewards_NT: Array, values_NT: Array, mask_NT: Array, cfg: AdvantageConfig
) -> tuple[Array, Array, dict[str, Array]]:
    """GAE advantages (whitened over the batch's tokens by `cfg.whiten` unless
    `std_scaling="none"`), the return targets (from the raw advantages) and "adv/mean",
    "adv/std", "adv/abs_max" over the tokens on the mask."""
    adv_NT, returns_NT = gae(rewards_NT, values_NT, mask_NT, cfg.gamma, cfg.lam)
    if cfg.std_scaling == "batch":
        adv_NT = masked_whiten(adv_NT, mask_NT, cfg)
    m_NT = mask_NT.astype(jnp.float32)
    n = jnp.maximum(jnp.sum(m_NT), 1.0)
    mean = jnp.sum(m_NT * adv_NT) / n
    stats = {
        "adv/mean": mean,
        "adv/std": jnp.sqrt(jnp.sum(m_NT * jnp.square(adv_NT - mean)) / n),
        "adv/abs_max": jnp.max(jnp.where(mask_NT, jnp.abs(adv_NT), 0.0)),
    }
    return adv_NT, returns_NT, stats
