"""The mixture-of-experts MLP of Qwen3-MoE and Qwen2-MoE: router, dispatch, combine.

Router (as `transformers`' `Qwen3MoeTopKRouter`): logits h @ W_router in the compute dtype, a
softmax over the E experts in f32, the top k, renormalised to sum to 1 when `norm_topk_prob`,
cast back to the compute dtype. Each expert is a SwiGLU MLP of width `moe_mlp_dim`; a token's
output is the routing-weighted sum of its k experts' outputs. Qwen2-MoE adds a shared expert, a
SwiGLU MLP of width `shared_expert_dim` that every token passes through, scaled by
sigmoid(h @ w_shared_router).

Expert weights are stacked (L, E, ...) so that a mesh axis can split them on E (the logical axis
"expert", `model/sharding.py`).

Dispatch (`cfg.moe_dispatch`). All three are dropless: every token reaches its k experts,
whatever the rest of the batch routes, so a token's output depends on that token only and the
rollout (a few tokens per row per decode step) and the update (whole sequences) compute the same
function. A capacity-based dispatch drops the tokens past an expert's capacity, and which ones
depends on the batch: the sampled and the trained policy would differ. Each sorts the N x k
(token, expert) assignments by expert, runs the experts, puts the results back in token order
and sums them with the routing weights:

* "ragged": one grouped matmul per weight over the sorted runs (`jax.lax.ragged_dot`, which has
  a VJP). jax lowers it to a grouped-matmul instruction on TPU and GPU; on CPU to a dense
  masked product over every group (the compiler counts twice the FLOPs of "dense").
* "blocked": each expert's run padded to blocks of one expert's tokens, one batched matmul over
  the blocks with each block's expert weights gathered (`blocked_experts`): at most twice the
  routed FLOPs, with plain XLA ops.
* "dense": every expert on every token, combined with the routing weights (zero for the experts
  not chosen): the reference, E / k times the expert FLOPs.
* "auto": "blocked" on CPU, "ragged" on TPU and GPU.

`benchmarks/moe.py` measures them, and a capacity-based dispatch, on a 2-core CPU; the figures
and the choice are in docs/model.md.

Shapes: N tokens (rows x time, flattened), D embed, E experts, k experts per token, F expert
width, A = N x k assignments, L layers.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from rlvr_jax.model.config import ModelConfig

Array = jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MoeWeights:
    """One MoE block's weights per layer, stacked on a leading L axis like `transformer.Layers`.

    The shared expert's fields are None without one (Qwen3-MoE).
    """

    router: Array  # (L, D, E)
    gate: Array  # (L, E, D, F)
    up: Array  # (L, E, D, F)
    down: Array  # (L, E, F, D)
    shared_gate: Array | None = None  # (L, D, Fs), Qwen2-MoE
    shared_up: Array | None = None  # (L, D, Fs)
    shared_down: Array | None = None  # (L, Fs, D)
    shared_router: Array | None = None  # (L, D), the shared expert's sigmoid gate


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Routing:
    """The router's decision for N tokens."""

    experts_Nk: Array  # int32, the chosen experts, most probable first
    weights_Nk: Array  # their combine weights, in the compute dtype
    probs_NE: Array  # f32, the softmax over all experts


def init_moe(rng: Array, cfg: ModelConfig, std: float, dtype) -> MoeWeights:
    """Random MoE weights (normal(0, std)) for every layer of `cfg`."""
    L, D, E, F, Fs = (
        cfg.num_layers,
        cfg.embed_dim,
        cfg.num_experts,
        cfg.moe_mlp_dim,
        cfg.shared_expert_dim,
    )
    keys = iter(jax.random.split(rng, 8))
    normal = lambda shape: (std * jax.random.normal(next(keys), shape, jnp.float32)).astype(dtype)  # noqa: E731
    shared = Fs > 0
    return MoeWeights(
        router=normal((L, D, E)),
        gate=normal((L, E, D, F)),
        up=normal((L, E, D, F)),
        down=normal((L, E, F, D)),
        shared_gate=normal((L, D, Fs)) if shared else None,
        shared_up=normal((L, D, Fs)) if shared else None,
        shared_down=normal((L, Fs, D)) if shared else None,
        shared_router=normal((L, D)) if shared else None,
    )


def moe_logical_axes(cfg: ModelConfig) -> MoeWeights:
    """Logical axis names of `init_moe`'s tree: experts on "expert", their inner width on "mlp"
    (tensor parallelism inside each expert), D on "embed" (FSDP). The router stays whole on E:
    it is small and every token needs all of its logits."""
    shared = cfg.shared_expert_dim > 0
    opt = lambda names: names if shared else None  # noqa: E731
    return MoeWeights(
        router=("layers", "embed", None),
        gate=("layers", "expert", "embed", "mlp"),
        up=("layers", "expert", "embed", "mlp"),
        down=("layers", "expert", "mlp", "embed"),
        shared_gate=opt(("layers", "embed", "mlp")),
        shared_up=opt(("layers", "embed", "mlp")),
        shared_down=opt(("layers", "mlp", "embed")),
        shared_router=opt(("layers", "embed")),
    )


def route(h_ND: Array, router_DE: Array, cfg: ModelConfig) -> Routing:
    """Top-k routing of N tokens: softmax in f32 over the logits, top k, renormalised when
    `cfg.norm_topk_prob`, weights cast to the tokens' dtype (as `transformers` does)."""
    dt = h_ND.dtype
    logits_NE = jnp.einsum("nd,de->ne", h_ND, router_DE.astype(dt))
    probs_NE = jax.nn.softmax(logits_NE.astype(jnp.float32), axis=-1)
    top_Nk, experts_Nk = jax.lax.top_k(probs_NE, cfg.num_experts_per_tok)
    if cfg.norm_topk_prob:
        top_Nk = top_Nk / jnp.sum(top_Nk, axis=-1, keepdims=True)
    return Routing(experts_Nk.astype(jnp.int32), top_Nk.astype(dt), probs_NE)


def _swiglu(gate: Array, up: Array) -> Array:
    return jax.nn.silu(gate) * up


def ragged_experts(h_ND: Array, routing: Routing, w: MoeWeights) -> Array:
    """The experts' weighted sum (N, D) by grouped matmuls over the assignments sorted by expert.

    `w` holds one layer's weights (no L axis).
    """
    N, D = h_ND.shape
    E = w.gate.shape[0]
    dt = h_ND.dtype
    k = routing.experts_Nk.shape[1]
    expert_A = routing.experts_Nk.reshape(N * k)
    # Stable, so that each expert's tokens keep their order (deterministic sums).
    order_A = jnp.argsort(expert_A, stable=True)
    x_AD = h_ND[order_A // k]
    sizes_E = jnp.bincount(expert_A, length=E).astype(jnp.int32)
    gate_AF = jax.lax.ragged_dot(x_AD, w.gate.astype(dt), sizes_E)
    up_AF = jax.lax.ragged_dot(x_AD, w.up.astype(dt), sizes_E)
    y_AD = jax.lax.ragged_dot(_swiglu(gate_AF, up_AF), w.down.astype(dt), sizes_E)
    # Back to (token, choice) order: the inverse permutation, a gather (its gradient a scatter).
    inverse_A = jnp.zeros_like(order_A).at[order_A].set(jnp.arange(N * k, dtype=order_A.dtype))
    y_NkD = y_AD[inverse_A].reshape(N, k, D)
    return jnp.einsum("nkd,nk->nd", y_NkD, routing.weights_Nk)


def blocked_experts(h_ND: Array, routing: Routing, w: MoeWeights) -> Array:
    """The experts' weighted sum (N, D) by batched matmuls over blocks of one expert's tokens.

    The assignments, sorted by expert, are laid out with each expert's run padded to a multiple
    of the block size b = ceil(N x k / E) (the mean run, static), so every block holds one
    expert's tokens (or padding). At most N x k + E x b = 2 N x k rows and 2 E blocks: the
    matmuls do at most twice the routed FLOPs, and each block multiplies by its expert's
    weights, gathered (at most two copies of the expert weights). `w` holds one layer's
    weights (no L axis).
    """
    N, D = h_ND.shape
    E = w.gate.shape[0]
    dt = h_ND.dtype
    k = routing.experts_Nk.shape[1]
    A = N * k
    b = -(-A // E)
    num_blocks = -(-A // b) + E
    expert_A = routing.experts_Nk.reshape(A)
    order_A = jnp.argsort(expert_A, stable=True)
    sorted_A = expert_A[order_A]
    sizes_E = jnp.bincount(expert_A, length=E)
    padded_E = -(-sizes_E // b) * b
    padded_end_E = jnp.cumsum(padded_E)
    start_E, padded_start_E = jnp.cumsum(sizes_E) - sizes_E, padded_end_E - padded_E
    row_A = padded_start_E[sorted_A] + jnp.arange(A) - start_E[sorted_A]
    x_MD = jnp.zeros((num_blocks * b, D), dt).at[row_A].set(h_ND[order_A // k])
    x_BbD = x_MD.reshape(num_blocks, b, D)
    # The expert of each block; blocks past the last expert's hold zeros (any expert will do).
    block_B = jnp.minimum(
        jnp.searchsorted(padded_end_E, jnp.arange(num_blocks) * b, "right"), E - 1
    )
    gate_BbF = jnp.einsum("bsd,bdf->bsf", x_BbD, w.gate.astype(dt)[block_B])
    up_BbF = jnp.einsum("bsd,bdf->bsf", x_BbD, w.up.astype(dt)[block_B])
    y_BbD = jnp.einsum("bsf,bfd->bsd", _swiglu(gate_BbF, up_BbF), w.down.astype(dt)[block_B])
    y_AD = y_BbD.reshape(num_blocks * b, D)[row_A]
    inverse_A = jnp.zeros_like(order_A).at[order_A].set(jnp.arange(A, dtype=order_A.dtype))
    y_NkD = y_AD[inverse_A].reshape(N, k, D)
    return jnp.einsum("nkd,nk->nd", y_NkD, routing.weights_Nk)


def dense_experts(h_ND: Array, routing: Routing, w: MoeWeights) -> Array:
    """The experts' weighted sum (N, D) with every expert run on every token (the reference)."""
    N = h_ND.shape[0]
    E = w.gate.shape[0]
    dt = h_ND.dtype
    combine_NE = (
        jnp.zeros((N, E), dt).at[jnp.arange(N)[:, None], routing.experts_Nk].add(routing.weights_Nk)
    )
    gate_NEF = jnp.einsum("nd,edf->nef", h_ND, w.gate.astype(dt))
    up_NEF = jnp.einsum("nd,edf->nef", h_ND, w.up.astype(dt))
    y_NED = jnp.einsum("nef,efd->ned", _swiglu(gate_NEF, up_NEF), w.down.astype(dt))
    return jnp.einsum("ned,ne->nd", y_NED, combine_NE)


DISPATCH = {"ragged": ragged_experts, "blocked": blocked_experts, "dense": dense_experts}


def resolve_dispatch(name: str) -> str:
    """`cfg.moe_dispatch` with "auto" resolved for the default backend (module docstring)."""
    if name == "auto":
        return "blocked" if jax.default_backend() == "cpu" else "ragged"
    return name


def moe_mlp(h_BTD: Array, w: MoeWeights, cfg: ModelConfig) -> tuple[Array, Routing]:
    """One layer's MoE block on normalised hidden states: (B, T, D) output and the routing of
    its B x T tokens (row-major). `w` holds this layer's weights (no L axis)."""
    B, T, D = h_BTD.shape
    dt = h_BTD.dtype
    h_ND = h_BTD.reshape(B * T, D)
    routing = route(h_ND, w.router, cfg)
    out_ND = DISPATCH[resolve_dispatch(cfg.moe_dispatch)](h_ND, routing, w)
    if w.shared_gate is not None:
        gate = jnp.einsum("nd,df->nf", h_ND, w.shared_gate.astype(dt))
        up = jnp.einsum("nd,df->nf", h_ND, w.shared_up.astype(dt))
        shared_ND = jnp.einsum("nf,fd->nd", _swiglu(gate, up), w.shared_down.astype(dt))
        scale_N = jax.nn.sigmoid(jnp.einsum("nd,d->n", h_ND, w.shared_router.astype(dt)))
        out_ND = out_ND + scale_N[:, None] * shared_ND
    return out_ND.reshape(B, T, D), routing


# ---------------------------------------------------------------------------------------------
# Statistics of a routing, over the real tokens of a batch; `routing`'s fields stacked
# (L, N, ...) over layers (`transformer.routing`, flattened over rows and time).


def _expert_counts(experts_LNk: Array, mask_N: Array, num_experts: int) -> Array:
    """(L, E) f32: how many real tokens' top k include each expert, per layer."""
    hits = jax.nn.one_hot(experts_LNk, num_experts, dtype=jnp.float32)  # (L, N, k, E)
    return jnp.einsum("lnke,n->le", hits, mask_N.astype(jnp.float32))


def load_balancing_loss(probs_LNE: Array, experts_LNk: Array, mask_N: Array) -> Array:
    """The Switch-Transformer auxiliary loss as `transformers`' `load_balancing_loss_func`
    computes it (with its attention mask): E x sum_e f_e x P_e, where f_e is the number of top-k
    assignments to expert e and P_e the summed router probability of e, both over every layer
    and divided by L x (real tokens). Its minimum, k, is a uniform load."""
    E = probs_LNE.shape[-1]
    w_N = mask_N.astype(jnp.float32)
    rows = probs_LNE.shape[0] * jnp.maximum(jnp.sum(w_N), 1.0)
    f_E = jnp.sum(_expert_counts(experts_LNk, mask_N, E), axis=0) / rows
    p_E = jnp.einsum("lne,n->e", probs_LNE.astype(jnp.float32), w_N) / rows
    return E * jnp.sum(f_E * p_E)


def expert_load(experts_LNk: Array, mask_N: Array, num_experts: int) -> tuple[Array, Array]:
    """The smallest and largest share of a layer's top-k assignments that one expert takes,
    over experts and layers (each 1 / E when balanced; 0 for an expert no token chose)."""
    counts_LE = _expert_counts(experts_LNk, mask_N, num_experts)
    share_LE = counts_LE / jnp.maximum(jnp.sum(counts_LE, axis=-1, keepdims=True), 1.0)
    return jnp.min(share_LE), jnp.max(share_LE)


def router_entropy(probs_LNE: Array, mask_N: Array) -> Array:
    """Mean entropy (nats) of the router's distribution over experts, over real tokens and
    layers (log E when uniform)."""
    p = probs_LNE.astype(jnp.float32)
    h_LN = -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0), axis=-1)
    w_N = mask_N.astype(jnp.float32)
    return jnp.sum(h_LN * w_N) / (h_LN.shape[0] * jnp.maximum(jnp.sum(w_N), 1.0))


def routing_disagreement(experts_LNk: Array, other_LNk: Array, mask_N: Array) -> Array:
    """The fraction of real tokens whose set of top-k experts differs, in at least one layer,
    between two routings of the same tokens (e.g. the rollout's and the update's)."""
    a = jnp.sort(experts_LNk, axis=-1)
    b = jnp.sort(other_LNk, axis=-1)
    differs_N = jnp.any(a != b, axis=(0, 2))
    w_N = mask_N.astype(jnp.float32)
    return jnp.sum(differs_N * w_N) / jnp.maximum(jnp.sum(w_N), 1.0)
