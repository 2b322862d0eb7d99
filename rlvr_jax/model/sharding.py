"""The device mesh and every sharding of the RL step, from one table of logical axis names.

The mesh has three axes, ("data", "fsdp", "tensor"), sized by `MeshConfig`, and up to two
more between "fsdp" and "tensor": "seq" when `MeshConfig.seq` > 1 (context parallelism: one
long row's tokens split over devices in the update's forward and backward, see below), then
"expert" when `MeshConfig.expert` > 1 (expert parallelism of a mixture-of-experts model).
Parameters declare logical axis names (`transformer.logical_axes`); `RULES` maps each name to
mesh axes (an axis the mesh lacks is left out):

==========  ==================  =============================================================
logical     mesh axes           why
==========  ==================  =============================================================
batch       ("data", "fsdp",    rows (prompts x samples): data and FSDP parallelism both split
            "seq", "expert")    the batch; FSDP additionally splits the weights' embed axis;
                                the expert axis is data parallelism for all but the experts;
                                the seq axis splits the rollout's rows, and a full forward's
                                tokens in place of rows (`constrain_tokens`)
expert      "expert"            an MoE layer's experts (`model/moe.py`): each device of the
                                expert axis holds E / expert of them, FSDP-split on D and
                                tensor-split on their inner width like the dense MLP
embed       ("fsdp", "seq")     ZeRO-3 style: every layer's weight matrix is split on its D
                                axis and all-gathered per layer inside the scan (the seq
                                devices would otherwise hold replicas)
q_heads,    "tensor"            Megatron-style tensor parallelism: attention heads and the
kv_heads,                       MLP's inner axis are split, so the big matmuls need one
mlp                             reduction each
vocab       ("tensor", "fsdp",  the embedding and the LM head are split on V over these axes
            "seq")              and never gathered (their D axis stays whole); see below
layers,     (none)              the layer scan and the per-head width stay whole
head_dim
==========  ==================  =============================================================

Vocabulary-parallel embedding and LM head. A (V, D) matrix split on D, like the layers' weights,
would be all-gathered whole for the unembedding and its gradient built whole on every device
before the reduce-scatter: for Qwen2.5-7B (V = 152064, D = 3584) that is a 1 GiB bf16 gather and
two f32 (V, D) gradients (embedding and LM head), 2 GiB each, on every device. Split on V, each
device computes the logits of its V / (tensor x fsdp) slice for all rows of the chunk
(`constrain_vocab`; the hidden states, N x C x D, are what is gathered), reduces the softmax's
sums across devices, and both gradients stay in their slices. The embedding lookup reads each
token from the slice that holds it and sums the (N, T, D) partial results over those axes (a
batch-sized all-reduce in place of a table-sized gather). Measured with the programs of
`benchmarks/memory.py` (a 2-layer Qwen2.5-7B update with remat, 8 rows x 256 tokens, fsdp = 8,
XLA:CPU): 6.1 GiB of temporaries per device with D split, 2.5 GiB with V split.

A dimension that the product of its mesh axes does not divide keeps the longest prefix of those
axes that does divide it (for "batch": "data" alone), and is replicated when none does: e.g.
Qwen2.5-0.5B's 14 query heads stay whole on a tensor axis of 4. Axes of size 1 are left out of
the specs, so a one-device mesh gives fully replicated specs.

What gets an explicit sharding, set once as the `in_shardings`/`out_shardings` of the jitted
programs (`train_step.build_*`):

* parameters, the reference parameters, and the optimizer state (every subtree of the optimizer
  state shaped like the parameters, such as Adam's moments or f32 master weights, takes the
  parameters' sharding; counters are replicated);
* the rows of a batch, a rollout, rewards and reward parts: the leading N axis over "batch";
* the decode KV cache (L, N, K, S, Dh): kv heads over "tensor" when the tensor axis divides
  them, otherwise the tensor axis joins the row axes, so that no device holds a copy of another
  device's cache; S and Dh stay whole;
* step metrics: replicated (scalars, and per-row success for the curriculum, read on the host);
* activations: the model constrains its residual stream to rows over "batch" at every layer
  boundary and the log-prob chunks' logits to V over "vocab" (`constrain_rows`,
  `constrain_vocab`, active while `build_*` traces under `activation_mesh`); the compiler
  propagates everything else. On a mesh with a seq axis a full forward (not decode or
  prefill) constrains its residual stream to T over "seq" and its rows over the other batch
  axes (`constrain_tokens`, where seq divides T), and its attention gathers the keys over
  "seq" (`attention.split_over_seq`); docs/scaling.md says why and what is not done.

Rollout layout. The sampler runs on the training layout: the same parameter buffers, FSDP-split,
with no resharding between rollout and update. The price is that each decode step all-gathers
the FSDP-split weights of each layer (as the forward pass of training does); the alternative, a
weight copy gathered over "fsdp" once per rollout, would hold a second, 1/tensor-sized copy of
the weights on every device for the whole rollout. Where "fsdp" is 1 the two coincide. The
cache has its own layout (above), set inside the rollout program. On the host-verifier path the
rollout program returns its rollout replicated (every process can read every row for the
verifier; tokens are small next to the weights) and the update splits it by rows again.

Multiple processes: `place` builds global arrays from host values that every process holds
identically (the initial parameters, a batch built from the same data order), so the same code
runs on one CPU, on 8 fake CPU devices and on a multi-host pod.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from rlvr_jax.model.config import ModelConfig

MESH_AXES = ("data", "fsdp", "tensor")
EXPERT_AXIS = "expert"
SEQ_AXIS = "seq"
RULES: Mapping[str, tuple[str, ...]] = {
    "batch": ("data", "fsdp", SEQ_AXIS, EXPERT_AXIS),
    "expert": (EXPERT_AXIS,),
    "embed": ("fsdp", SEQ_AXIS),
    "q_heads": ("tensor",),
    "kv_heads": ("tensor",),
    "mlp": ("tensor",),
    "vocab": ("tensor", "fsdp", SEQ_AXIS),
    "layers": (),
    "head_dim": (),
}


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Sizes of the mesh axes; their product is the number of devices.

    Attributes:
      data: pure data parallelism (rows split, weights replicated).
      fsdp: rows split and weights split on their embed axis.
      tensor: attention heads, MLP and vocabulary split.
      expert: an MoE model's experts split (expert parallelism), rows split as by "data"; at
        1 (the default) the mesh has no expert axis.
      seq: context parallelism: a full forward's token axis T split (one long row over several
        devices, `constrain_tokens`), the weights split with "fsdp", and the rollout's rows
        split as by "data"; at 1 (the default) the mesh has no seq axis. "auto": the RL stage
        takes the split from fsdp's devices, the smallest power of two whose step compiles
        within the memory budget (`program.stages.memory_fit.resolve_seq`); a mesh is built
        only once it is a number.
      One of data, fsdp, tensor may be -1: it takes the devices the others leave.
    """

    data: int = 1
    fsdp: int = -1
    tensor: int = 1
    expert: int = 1
    seq: int | Literal["auto"] = 1

    def __post_init__(self):
        for name in MESH_AXES:
            value = getattr(self, name)
            if value != -1 and value < 1:
                raise ValueError(f"mesh.{name}={value} must be positive or -1 (the remainder)")
        for name in (EXPERT_AXIS, SEQ_AXIS):
            value = getattr(self, name)
            if name == SEQ_AXIS and value == "auto":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                more = ' or "auto"' if name == SEQ_AXIS else ""
                raise ValueError(f"mesh.{name}={value!r} must be an integer >= 1{more}")
        if sum(getattr(self, n) == -1 for n in MESH_AXES) > 1:
            raise ValueError(
                f"mesh: at most one axis may be -1; got data={self.data}, fsdp={self.fsdp}, "
                f"tensor={self.tensor}"
            )

    @property
    def axes(self) -> tuple[str, ...]:
        """The mesh's axis names, in order: "seq" and then "expert" between "fsdp" and "tensor"
        when used.

        Raises:
          ValueError: while `seq` is "auto" (no mesh has been chosen yet).
        """
        if self.seq == "auto":
            raise ValueError(
                'mesh.seq="auto" is chosen from compiled memory by the RL stage before it builds '
                "the mesh (program.stages.memory_fit.resolve_seq); give a number to build one here"
            )
        used = tuple(a for a in (SEQ_AXIS, EXPERT_AXIS) if getattr(self, a) > 1)
        return ("data", "fsdp", *used, "tensor")

    def _described(self) -> str:
        used = (a for a in (SEQ_AXIS, EXPERT_AXIS) if getattr(self, a) > 1)
        more = "".join(f", {a}={getattr(self, a)}" for a in used)
        return f"data={self.data}, fsdp={self.fsdp}, tensor={self.tensor}{more}"

    def shape(self, num_devices: int) -> tuple[int, ...]:
        """The sizes of `axes` for `num_devices` devices, -1 resolved.

        Raises:
          ValueError: when the sizes do not multiply to `num_devices`.
        """
        sizes = [getattr(self, n) for n in self.axes]
        known = math.prod(s for s in sizes if s != -1)
        if -1 in sizes:
            if num_devices % known:
                raise ValueError(
                    f"mesh {self._described()}: {num_devices} devices are not a multiple of {known}"
                )
            sizes = [num_devices // known if s == -1 else s for s in sizes]
        if math.prod(sizes) != num_devices:
            raise ValueError(
                f"mesh {self._described()} needs {math.prod(sizes)} devices; there are "
                f"{num_devices}"
            )
        return tuple(sizes)

    def sizes(self, num_devices: int) -> dict[str, int]:
        """`shape` by axis name, "expert" and "seq" included (1 when the mesh has none)."""
        sizes = dict(zip(self.axes, self.shape(num_devices), strict=True))
        return {EXPERT_AXIS: 1, SEQ_AXIS: 1, **sizes}


def make_mesh(cfg: MeshConfig = MeshConfig(), devices: Sequence[Any] | None = None) -> Mesh:
    """The ("data", "fsdp", "tensor") mesh over `devices` (default: all, of every process), with
    "seq" and "expert" before "tensor" when `cfg.seq` or `cfg.expert` > 1.

    The axes are `AxisType.Auto`: the compiler propagates shardings between the ones set here.
    (With `Explicit` axes, the default of `jax.make_mesh`, the embedding gather fails on a
    vocabulary-split table.)
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = cfg.shape(len(devices))
    auto = (jax.sharding.AxisType.Auto,) * len(cfg.axes)
    return jax.make_mesh(shape, cfg.axes, axis_types=auto, devices=devices)


# ---------------------------------------------------------------------------------------------
# Logical names -> specs


def logical_spec(
    names: Sequence[str | None],
    shape: Sequence[int],
    mesh: Mesh,
    rules: Mapping[str, tuple[str, ...]] = RULES,
) -> P:
    """The PartitionSpec of an array whose dimensions have logical `names` (None: replicated).

    Each dimension keeps the longest prefix of its rule's mesh axes (size-1 axes, axes the mesh
    lacks and axes that an earlier dimension took left out) whose product divides it.

    Raises:
      ValueError: a name missing from `rules`, or `names` and `shape` of different lengths.
    """
    if len(names) != len(shape):
        raise ValueError(f"logical names {tuple(names)} do not match shape {tuple(shape)}")
    used: set[str] = set()
    out = []
    for name, dim in zip(names, shape, strict=True):
        if name is None:
            out.append(None)
            continue
        if name not in rules:
            raise ValueError(f"logical axis {name!r} has no rule; known: {sorted(rules)}")
        axes = [a for a in rules[name] if mesh.shape.get(a, 1) > 1 and a not in used]
        while axes and dim % math.prod(mesh.shape[a] for a in axes):
            axes.pop()
        used.update(axes)
        out.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    while out and out[-1] is None:
        out.pop()
    return P(*out)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def rows_sharding(mesh: Mesh, num_rows: int) -> NamedSharding:
    """Leading axis N over the "batch" axes, the rest whole. As a pytree prefix it shards every
    leaf of a `Batch`, a `Rollout`, rewards and reward parts (they all start with N)."""
    return NamedSharding(mesh, logical_spec(("batch",), (num_rows,), mesh))


def decode_cache_shardings(cache: Any, model_cfg: ModelConfig, mesh: Mesh) -> Any:
    """Shardings of a sampler cache (`kv_cache.KVCache`, stacked (L, N, K, S, Dh) or per-layer
    (N, K, S, Dh) leaves): kv heads over "tensor" when it divides them, else the tensor axis
    joins the rows."""
    heads_split = model_cfg.num_kv_heads % mesh.shape["tensor"] == 0
    rules = dict(RULES)
    if not heads_split:
        rules["batch"] = (*RULES["batch"], "tensor")

    def one(x):
        names = ("batch", "kv_heads", None, None)
        if x.ndim == 5:
            names = ("layers", *names)
        return NamedSharding(mesh, logical_spec(names, x.shape, mesh, rules))

    return jax.tree.map(one, cache)


def shard_decode_cache(cache: Any, model_cfg: ModelConfig, mesh: Mesh) -> Any:
    """Constrains a cache built inside a jitted program to `decode_cache_shardings`."""
    return jax.lax.with_sharding_constraint(cache, decode_cache_shardings(cache, model_cfg, mesh))


@contextlib.contextmanager
def activation_mesh(mesh: Mesh | None) -> Iterator[None]:
    """While a jitted function is traced under it, `constrain_rows` splits activations over
    `mesh`'s batch axes (no effect with None)."""
    if mesh is None:
        yield
        return
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        yield


def constrain_rows(x: jax.Array) -> jax.Array:
    """`x` with its leading (row) axis split over the "batch" axes of the mesh set by
    `activation_mesh`, the rest whole; unchanged when no mesh is set.

    The model calls it on the residual stream at every layer boundary. Without it the compiler
    is free to follow the FSDP-split weights instead, splitting activations on D and keeping
    every row on every device: measured on a 2-layer Qwen2.5-0.5B-width update of 64 rows on
    8 devices, 2.7 GB of temporaries per device against 0.55 GB with it.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if not has_row_axes(mesh):
        return x
    spec = logical_spec(("batch",), (x.shape[0],), mesh)
    return x if spec == P() else jax.lax.with_sharding_constraint(x, spec)


def seq_shards(num_tokens: int) -> int:
    """How many devices `constrain_tokens` splits a full forward's T = `num_tokens` tokens over:
    the "seq" axis of the mesh set by `activation_mesh` when it divides T, else 1 (no mesh, no
    seq axis, or a T it does not divide: then the rows take the axis, as in the rollout)."""
    mesh = jax.sharding.get_abstract_mesh()
    if not has_row_axes(mesh):
        return 1
    seq = mesh.shape.get(SEQ_AXIS, 1)
    return seq if seq > 1 and num_tokens % seq == 0 else 1


def token_rows(num_rows: int) -> str | tuple[str, ...] | None:
    """The PartitionSpec entry of the rows of a token-split activation (`constrain_tokens`):
    the "batch" axes but "seq" (None: whole)."""
    mesh = jax.sharding.get_abstract_mesh()
    rules = {**RULES, "batch": tuple(a for a in RULES["batch"] if a != SEQ_AXIS)}
    spec = logical_spec(("batch",), (num_rows,), mesh, rules)
    return spec[0] if len(spec) else None


def constrain_tokens(x: jax.Array) -> jax.Array:
    """`x` (rows, T, ...) of a full forward with T split over "seq" and the rows over the other
    "batch" axes, where `seq_shards(T)` > 1; `constrain_rows(x)` otherwise.

    The model calls it in place of `constrain_rows` at the layer boundaries of a full pass
    (training's forward, not decode, whose T is 1): one long row is then split over the seq
    devices, its activations and remat checkpoints included (context parallelism; the
    attention gathers the keys, `attention.split_over_seq`).
    """
    if seq_shards(x.shape[1]) == 1:
        return constrain_rows(x)
    rows = token_rows(x.shape[0])
    return jax.lax.with_sharding_constraint(x, P(rows, SEQ_AXIS, *_spare_embed(rows, x)))


def _spare_embed(rows: str | tuple[str, ...] | None, x: jax.Array) -> tuple:
    """The last axis's entry of a token-split activation: the row axes its rows leave unused
    (too few rows, e.g. one long row), where they divide it, else nothing."""
    if x.ndim < 3:
        return ()
    mesh = jax.sharding.get_abstract_mesh()
    used = set() if rows is None else {rows} if isinstance(rows, str) else set(rows)
    rules = {"embed": tuple(a for a in RULES["batch"] if a not in used and a != SEQ_AXIS)}
    spec = logical_spec((*(None,) * (x.ndim - 1), "embed"), x.shape, mesh, rules)
    return (spec[-1],) if len(spec) == x.ndim else ()


def has_row_axes(mesh: Any) -> bool:
    """Whether `mesh` (concrete or abstract) is one of ours: it has the "data" and "fsdp" axes
    that split rows (the expert axis is optional)."""
    return not mesh.empty and {"data", "fsdp"} <= set(mesh.axis_names)


def rows_split_alike(a: int, b: int) -> bool:
    """Whether `constrain_rows` splits a leading axis of `a` rows and one of `b` rows over the
    same mesh axes (True when no mesh is set)."""
    mesh = jax.sharding.get_abstract_mesh()
    if not has_row_axes(mesh):
        return True
    return logical_spec(("batch",), (a,), mesh) == logical_spec(("batch",), (b,), mesh)


def constrain_vocab(x: jax.Array) -> jax.Array:
    """`x` (rows, ..., V) with its last axis split over the "vocab" axes and its rows over
    "data" only, as the vocabulary-split LM head computes it; unchanged when no mesh is set.

    The log-prob chunks call it on their logits: without it the compiler keeps the rows split
    and gathers the whole LM head instead (see the module docstring).
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(MESH_AXES) <= set(mesh.axis_names):
        return x
    rules = {**RULES, "batch": ("data", EXPERT_AXIS)}
    names = ("batch", *(None,) * (x.ndim - 2), "vocab")
    spec = logical_spec(names, x.shape, mesh, rules)
    return x if spec == P() else jax.lax.with_sharding_constraint(x, spec)


# ---------------------------------------------------------------------------------------------
# Placing host values on the mesh


def _is_key(x: Any) -> bool:
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def _place_one(x: Any, sharding: NamedSharding) -> jax.Array:
    if _is_key(x):
        data = _place_one(jax.random.key_data(x), sharding)
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
    if sharding.is_fully_addressable:
        return jax.device_put(x, sharding)
    # Several processes: each holds the whole value and supplies the shards of its devices.
    host = np.asarray(jax.device_get(x)) if isinstance(x, jax.Array) else np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def place(tree: Any, shardings: Any) -> Any:
    """`tree` as global arrays with `shardings` (a pytree prefix of `tree`).

    Every process must pass the same values (the same seed, the same data order): each one keeps
    the shards of its own devices.
    """
    if isinstance(shardings, jax.sharding.Sharding):
        return jax.tree.map(lambda x: _place_one(x, shardings), tree)
    return jax.tree.map(
        lambda s, x: jax.tree.map(lambda y: _place_one(y, s), x),
        shardings,
        tree,
        is_leaf=lambda s: isinstance(s, jax.sharding.Sharding),
    )
