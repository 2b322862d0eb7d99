"""What a checkpoint holds against what the caller's train state expects.

Host code for `program.runtime.checkpoint`: the restore target of a saved tree (shapes, dtypes and
shardings taken from the caller's state; the adapters only for a LoRA run saved without its
base), the leaf names orbax writes, the comparison of both before any array is read, and the
errors a restore raises.
"""

from __future__ import annotations

import logging
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.config_types import UserError
from rlvr_jax.model import lora as lora_lib
from rlvr_jax.rl.state import TrainState


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or restored; the message names the path and step."""


class MissingCheckpointError(CheckpointError, UserError):
    """No checkpoint in the directory, or none of the step asked for (the message lists those
    there are): the user named the wrong run or step."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint whose files cannot be read: a missing item, unreadable metadata or arrays.

    Unlike a checkpoint that reads but does not match the target, an older step may be intact.
    """


def is_key(x: Any) -> bool:
    """Whether `x` is a typed PRNG key (array)."""
    return jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def is_concrete(tree: Any) -> bool:
    """Whether `tree` has leaves and all of them are arrays (not abstract shapes)."""
    leaves = jax.tree.leaves(tree)
    return bool(leaves) and all(isinstance(x, jax.Array) for x in leaves)


def abstract_leaf(x: Any) -> jax.ShapeDtypeStruct:
    """The restore target of one leaf: its shape, dtype and sharding (a default device when an
    abstract leaf carries none)."""
    sharding = getattr(x, "sharding", None)
    if sharding is None:
        sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


def leaf_name(path: tuple[Any, ...]) -> str:
    """A key path as orbax names the leaf on disk: "opt_state.1.0.mu.embed"."""
    parts = []
    for key in path:
        for attr in ("key", "idx", "name"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return ".".join(parts)


def reason(e: BaseException, limit: int = 500) -> str:
    """The first line of the innermost cause of `e`, for one-line messages: the array store
    wraps its errors in messages that carry a whole multi-line store spec."""
    while e.__cause__ is not None:
        e = e.__cause__
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if len(text) > limit:
        text = text[:limit] + " ..."
    return f"{type(e).__name__}: {text}"


def abstract_target(
    where: str, meta: dict[str, Any], target: TrainState, ref_source: str | None
) -> tuple[dict[str, Any], bool]:
    """The restore target of the saved tree, and whether the PRNG key is a typed one.

    Args:
      where: "checkpoint <dir> (step <n>)", for the messages.
      meta: the checkpoint's own record (`checkpoint.Checkpointer.read_meta`).
      target: the caller's state (concrete or abstract).
      ref_source: the caller's source of the reference parameters.

    Raises:
      CheckpointError: the checkpoint holds parts the target has not (or the reverse).
    """
    if meta["ref_saved"] and target.ref_params is None:
        raise CheckpointError(
            f"{where} holds reference parameters but the target state has none (was the KL "
            "term turned off?)"
        )
    if meta["ref_source"] != ref_source and not meta["ref_saved"]:
        logging.warning(
            "%s recorded ref_source=%r, this run has ref_source=%r",
            where,
            meta["ref_source"],
            ref_source,
        )
    has_critic = bool(meta.get("has_critic", False))
    if has_critic != (target.critic is not None):
        raise CheckpointError(
            f"{where} {'holds' if has_critic else 'has no'} value model (rl.critic) but this "
            f"run {'has none' if has_critic else 'has one'}; rl.critic.kind must match the run's"
        )
    abstract = {
        "step": abstract_leaf(target.step),
        "params": _abstract_params(where, meta, target),
        "opt_state": jax.tree.map(abstract_leaf, target.opt_state),
    }
    target_is_key = is_key(target.rng)
    if target_is_key != (meta["rng_impl"] is not None):
        raise CheckpointError(
            f"{where} stored a {'typed' if meta['rng_impl'] else 'raw'} PRNG key; the target's "
            f"key is {target.rng.dtype}"
        )
    rng_sharding = getattr(target.rng, "sharding", None)
    rng_data = jax.eval_shape(jax.random.key_data, target.rng) if target_is_key else target.rng
    abstract["rng"] = abstract_leaf(
        jax.ShapeDtypeStruct(rng_data.shape, rng_data.dtype, sharding=rng_sharding)
    )
    if meta["ref_saved"]:
        abstract["ref_params"] = jax.tree.map(abstract_leaf, target.ref_params)
    if has_critic:
        abstract["critic"] = jax.tree.map(abstract_leaf, target.critic)
    return abstract, target_is_key


def _abstract_params(where: str, meta: dict[str, Any], target: TrainState) -> Any:
    """The restore target of the saved parameters: all of them, or a LoRA run's adapters (its
    base then comes from `target`, which must hold it, loaded from the source)."""
    has_lora = bool(meta.get("has_lora", False))
    if has_lora != (lora_lib.adapters_of(target.params) is not None):
        raise CheckpointError(
            f"{where} {'holds' if has_lora else 'has no'} LoRA adapters but this run's policy "
            f"{'has none' if has_lora else 'has them'}; model.lora.rank must match the run's"
        )
    if not meta.get("adapters_only"):
        return jax.tree.map(abstract_leaf, target.params)
    if not is_concrete(lora_lib.without_adapters(target.params)):
        raise CheckpointError(
            f"{where} holds LoRA adapters only; the target needs the base weights, loaded from "
            f"{meta['ref_source']!r}"
        )
    return {"lora": jax.tree.map(abstract_leaf, target.params.lora)}


def check_layout(where: str, saved_tree: Any, abstract: dict[str, Any]) -> None:
    """Compares the saved arrays' names, shapes and dtypes (orbax's item metadata of the state)
    with the target's before reading any data, so a mismatch is reported by leaf instead of deep
    inside the array store.

    Raises:
      CorruptCheckpointError: the metadata is missing or unreadable.
      CheckpointError: the layouts differ; the message names up to five leaves.
    """
    try:
        saved_tree = getattr(saved_tree, "tree", saved_tree)
        if not saved_tree:
            raise ValueError("no array metadata")
        saved = {
            leaf.name: (tuple(leaf.shape), np.dtype(leaf.dtype))
            for leaf in jax.tree.leaves(saved_tree)
        }
    except Exception as e:
        raise CorruptCheckpointError(
            f"cannot read the array metadata of {where}: {reason(e)}"
        ) from e
    wanted = {
        leaf_name(p): (tuple(x.shape), np.dtype(x.dtype))
        for p, x in jax.tree_util.tree_flatten_with_path(abstract)[0]
    }
    problems = [f"{name} missing" for name in sorted(wanted.keys() - saved.keys())]
    problems += [f"{name} unexpected" for name in sorted(saved.keys() - wanted.keys())]
    problems += [
        f"{name}: saved {saved[name][0]} {saved[name][1]}, target {want[0]} {want[1]}"
        for name, want in sorted(wanted.items())
        if name in saved and saved[name] != want
    ]
    if problems:
        shown = "; ".join(problems[:5])
        if len(problems) > 5:
            shown += f"; ... {len(problems) - 5} more"
        raise CheckpointError(f"{where} does not match the target state: {shown}")
