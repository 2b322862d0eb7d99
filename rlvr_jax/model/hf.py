"""Hugging Face checkpoints in and out: config.json plus single or sharded safetensors.

Host code (numpy, files). Tensors are read through memory maps, checked against the config, and
converted to the stacked `Params` layout; export writes the inverse, which `transformers` loads.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import struct
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from rlvr_jax.config_types import NotFoundError, UserError
from rlvr_jax.model.config import ModelConfig, from_hf_config, to_hf_config
from rlvr_jax.model.lora import merge_lora
from rlvr_jax.model.moe import MoeWeights
from rlvr_jax.model.transformer import Layers, Params

# safetensors dtype names <-> numpy dtypes.
_ST_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}
_NP_TO_ST = {np.dtype(v): k for k, v in _ST_DTYPES.items()}
# Tensors some checkpoints carry that the model recomputes.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class CheckpointError(UserError, ValueError):
    """A checkpoint that does not match its config or is malformed."""


# ---------------------------------------------------------------------------------------------
# safetensors files


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Memory-maps every tensor of one .safetensors file (no copy until used)."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise CheckpointError(f"{path}: header length {n} exceeds the file size {size}")
        try:
            header = json.loads(f.read(n))
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{path}: unreadable safetensors header ({e})") from e
    data_start = 8 + n
    out = {}
    mm = np.memmap(path, dtype=np.uint8, mode="r") if size > data_start else None
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _ST_DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise CheckpointError(
                f"{path}: tensor {name!r} has unsupported dtype {info.get('dtype')}"
            )
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if end - begin != expected or data_start + end > size:
            raise CheckpointError(
                f"{path}: tensor {name!r} of shape {shape} needs {expected} bytes at "
                f"[{begin}, {end}) but the file holds {size - data_start} data bytes"
            )
        raw = mm[data_start + begin : data_start + end] if mm is not None else np.zeros(0, np.uint8)
        out[name] = raw.view(dtype).reshape(shape)
    return out


def write_safetensors(path: str | os.PathLike, tensors: Mapping[str, np.ndarray]) -> None:
    """Writes tensors to one .safetensors file."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    arrays = {}
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        if arr.dtype not in _NP_TO_ST:
            raise ValueError(f"tensor {name!r}: dtype {arr.dtype} cannot be written")
        header[name] = {
            "dtype": _NP_TO_ST[arr.dtype],
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + arr.nbytes],
        }
        offset += arr.nbytes
        arrays[name] = arr
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for arr in arrays.values():
            f.write(arr.tobytes())


# ---------------------------------------------------------------------------------------------
# Name and layout mapping, shared with the GGUF loader.


def _layer_entries(cfg: ModelConfig) -> list[tuple[str, str, Callable, Callable, tuple]]:
    """(field, HF name suffix, HF->ours, ours->HF, our per-layer shape) for every layer tensor."""
    D, H, K, Dh, F = cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_dim
    ident = lambda w: w  # noqa: E731
    tr = lambda w: w.T  # noqa: E731

    def proj(n):  # torch Linear (n*Dh, D) <-> ours (D, n, Dh)
        return (lambda w: w.T.reshape(D, n, Dh), lambda w: w.reshape(D, n * Dh).T)

    def bias(n):
        return (lambda w: w.reshape(n, Dh), lambda w: w.reshape(n * Dh))

    out_proj = (lambda w: w.T.reshape(H, Dh, D), lambda w: w.reshape(H * Dh, D).T)
    e = [
        ("attn_norm", "input_layernorm.weight", ident, ident, (D,)),
        ("q", "self_attn.q_proj.weight", *proj(H), (D, H, Dh)),
        ("k", "self_attn.k_proj.weight", *proj(K), (D, K, Dh)),
        ("v", "self_attn.v_proj.weight", *proj(K), (D, K, Dh)),
        ("o", "self_attn.o_proj.weight", *out_proj, (H, Dh, D)),
        ("mlp_norm", "post_attention_layernorm.weight", ident, ident, (D,)),
    ]
    if not cfg.is_moe:
        e += [
            ("gate", "mlp.gate_proj.weight", tr, tr, (D, F)),
            ("up", "mlp.up_proj.weight", tr, tr, (D, F)),
            ("down", "mlp.down_proj.weight", tr, tr, (F, D)),
        ]
    if cfg.qkv_bias:
        e += [
            ("q_bias", "self_attn.q_proj.bias", *bias(H), (H, Dh)),
            ("k_bias", "self_attn.k_proj.bias", *bias(K), (K, Dh)),
            ("v_bias", "self_attn.v_proj.bias", *bias(K), (K, Dh)),
        ]
    if cfg.qk_norm:
        e += [
            ("q_norm", "self_attn.q_norm.weight", ident, ident, (Dh,)),
            ("k_norm", "self_attn.k_norm.weight", ident, ident, (Dh,)),
        ]
    return e


def _moe_entries(cfg: ModelConfig) -> list[tuple[str, str, Callable, Callable, tuple, bool]]:
    """(`MoeWeights` field, HF name suffix, HF->ours, ours->HF, our per-layer (and per-expert)
    shape, one tensor per expert) for every tensor of an MoE block. Per-expert names hold "{e}";
    `transformers` 5 fuses them in memory but writes them one per expert, as the hub's files do."""
    if not cfg.is_moe:
        return []
    D, E, F, Fs = cfg.embed_dim, cfg.num_experts, cfg.moe_mlp_dim, cfg.shared_expert_dim
    tr = lambda w: w.T  # noqa: E731
    e = [
        ("router", "mlp.gate.weight", tr, tr, (D, E), False),
        ("gate", "mlp.experts.{e}.gate_proj.weight", tr, tr, (D, F), True),
        ("up", "mlp.experts.{e}.up_proj.weight", tr, tr, (D, F), True),
        ("down", "mlp.experts.{e}.down_proj.weight", tr, tr, (F, D), True),
    ]
    if Fs:
        gate_in, gate_out = (lambda w: w.reshape(D), lambda w: w.reshape(1, D))
        e += [
            ("shared_gate", "mlp.shared_expert.gate_proj.weight", tr, tr, (D, Fs), False),
            ("shared_up", "mlp.shared_expert.up_proj.weight", tr, tr, (D, Fs), False),
            ("shared_down", "mlp.shared_expert.down_proj.weight", tr, tr, (Fs, D), False),
            ("shared_router", "mlp.shared_expert_gate.weight", gate_in, gate_out, (D,), False),
        ]
    return e


def _moe_names(cfg: ModelConfig, layer: int, suffix: str, per_expert: bool) -> list[str]:
    """The HF names of one MoE entry in one layer: one per expert, or the one."""
    experts = range(cfg.num_experts) if per_expert else [None]
    return [f"model.layers.{layer}.{suffix.format(e=e)}" for e in experts]


def hf_tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name a Hugging Face checkpoint of `cfg` holds, with its shape."""
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, cfg.embed_dim)}
    shapes["model.norm.weight"] = (cfg.embed_dim,)
    if not cfg.tie_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, cfg.embed_dim)
    for i in range(cfg.num_layers):
        for _, suffix, _, to_hf, shape in _layer_entries(cfg):
            shapes[f"model.layers.{i}.{suffix}"] = to_hf(np.empty(shape, np.int8)).shape
        for _, suffix, _, to_hf, shape, per_expert in _moe_entries(cfg):
            for name in _moe_names(cfg, i, suffix, per_expert):
                shapes[name] = to_hf(np.empty(shape, np.int8)).shape
    return shapes


def params_from_hf_tensors(
    get: Callable[[str], np.ndarray],
    names: Iterable[str],
    cfg: ModelConfig,
    source: str = "checkpoint",
) -> Params:
    """Builds `Params` from Hugging Face named tensors, checking every name and shape.

    Args:
      get: returns the tensor (torch layout, numpy) of a name.
      names: every tensor name the checkpoint holds.
      cfg: the target architecture.
      source: how to name the checkpoint in error messages.

    Raises:
      CheckpointError: naming the missing, misshapen or unexpected tensor.
    """
    available = set(names)
    expected = hf_tensor_shapes(cfg)
    missing = sorted(n for n in expected if n not in available)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(
            f"{source} lacks tensor {missing[0]!r}{more} that {cfg.model_type} needs"
        )
    unexpected = sorted(
        n
        for n in available - set(expected)
        if not n.endswith(_IGNORED_SUFFIXES) and not (cfg.tie_embeddings and n == "lm_head.weight")
    )
    if unexpected:
        raise CheckpointError(
            f"{source} holds tensor {unexpected[0]!r} that a {cfg.model_type} model with this "
            f"config does not use ({len(unexpected)} unexpected); config and weights disagree"
        )
    pdt = jnp.dtype(cfg.param_dtype)

    def fetch(name: str) -> np.ndarray:
        w = get(name)
        if tuple(w.shape) != expected[name]:
            raise CheckpointError(
                f"{source}: tensor {name!r} has shape {tuple(w.shape)}, expected {expected[name]}"
            )
        return np.asarray(w).astype(np.float32) if w.dtype != pdt else np.asarray(w)

    fields = {}
    for field, suffix, to_ours, _, _ in _layer_entries(cfg):
        stacked = np.stack(
            [to_ours(fetch(f"model.layers.{i}.{suffix}")) for i in range(cfg.num_layers)]
        )
        fields[field] = jnp.asarray(stacked, pdt)
    if cfg.is_moe:
        moe = {}
        for field, suffix, to_ours, _, _, per_expert in _moe_entries(cfg):
            per_layer = []
            for i in range(cfg.num_layers):
                parts = [to_ours(fetch(n)) for n in _moe_names(cfg, i, suffix, per_expert)]
                per_layer.append(np.stack(parts) if per_expert else parts[0])
            moe[field] = jnp.asarray(np.stack(per_layer), pdt)
        fields["moe"] = MoeWeights(**moe)
    return Params(
        embed=jnp.asarray(fetch("model.embed_tokens.weight"), pdt),
        layers=Layers(**fields),
        final_norm=jnp.asarray(fetch("model.norm.weight"), pdt),
        lm_head=None if cfg.tie_embeddings else jnp.asarray(fetch("lm_head.weight").T, pdt),
    )


def params_to_hf_tensors(params: Params, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """The inverse of `params_from_hf_tensors`: Hugging Face names and torch layouts."""
    host = jax.device_get(params)
    out = {"model.embed_tokens.weight": np.asarray(host.embed)}
    for i in range(cfg.num_layers):
        for field, suffix, _, to_hf, _ in _layer_entries(cfg):
            out[f"model.layers.{i}.{suffix}"] = np.ascontiguousarray(
                to_hf(np.asarray(getattr(host.layers, field)[i]))
            )
        for field, suffix, _, to_hf, _, per_expert in _moe_entries(cfg):
            w = np.asarray(getattr(host.layers.moe, field)[i])
            names = _moe_names(cfg, i, suffix, per_expert)
            parts = list(w) if per_expert else [w]
            for name, part in zip(names, parts, strict=True):
                out[name] = np.ascontiguousarray(to_hf(part))
    out["model.norm.weight"] = np.asarray(host.final_norm)
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = np.ascontiguousarray(np.asarray(host.lm_head).T)
    return out


# ---------------------------------------------------------------------------------------------
# Directories and hub ids


def resolve_checkpoint(path_or_id: str, allow_download: bool = True) -> Path:
    """A local checkpoint directory for a path, or for a hub id when the network allows.

    Raises:
      NotFoundError: saying where to put the files when neither works.
    """
    p = Path(path_or_id).expanduser()
    if p.is_dir():
        return p
    if p.exists() or path_or_id.startswith((".", "/", "~")) or path_or_id.count("/") != 1:
        raise NotFoundError(f"checkpoint directory {str(p)!r} does not exist")
    if not allow_download:
        raise NotFoundError(
            f"{path_or_id!r} is not a local directory and downloads are disabled; put its "
            "config.json, *.safetensors and tokenizer files in a directory and pass that path"
        )
    try:
        from huggingface_hub import snapshot_download

        local = snapshot_download(
            path_or_id,
            allow_patterns=["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"],
        )
    except Exception as e:  # Offline machines raise several different error types here.
        raise NotFoundError(_hub_failure(path_or_id, e)) from e
    return Path(local)


def _hub_failure(hub_id: str, cause: Exception) -> str:
    """Why `hub_id` could not be fetched, and the ways around it, in one paragraph."""
    reason = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        network = "HF_HUB_OFFLINE is set and the hub's cache does not hold it: unset it"
    else:
        network = (
            "connect to the network (or, with its files in the hub's cache, set HF_HUB_OFFLINE=1)"
        )
    return (
        f"could not fetch {hub_id!r} from the Hugging Face hub ({type(cause).__name__}: {reason}); "
        f"{network}, or pass a local directory in its place (model.source=DIR) holding its "
        "config.json, *.safetensors and tokenizer files, e.g. from `huggingface-cli download "
        f"{hub_id} --local-dir DIR` on a machine with network"
    )


def load_config(directory: str | os.PathLike, **overrides: Any) -> ModelConfig:
    """The `ModelConfig` of a checkpoint directory's config.json."""
    path = Path(directory) / "config.json"
    if not path.exists():
        raise NotFoundError(f"{path} does not exist: not a Hugging Face checkpoint directory")
    with open(path) as f:
        try:
            hf = json.load(f)
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{path}: invalid JSON ({e})") from e
    return from_hf_config(hf, **overrides)


def _tensor_index(directory: Path) -> dict[str, Path]:
    """Which file holds each tensor: the index file of a sharded checkpoint, else the one file."""
    index = directory / "model.safetensors.index.json"
    if index.exists():
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        files = {name: directory / fname for name, fname in weight_map.items()}
        for fp in set(files.values()):
            if not fp.exists():
                raise CheckpointError(f"{index} names shard {fp.name!r}, which is missing")
        return files
    singles = sorted(directory.glob("*.safetensors"))
    if not singles:
        raise NotFoundError(f"{directory} holds no *.safetensors file")
    files = {}
    for fp in singles:
        for name in read_safetensors(fp):
            files[name] = fp
    return files


def load_hf(
    path_or_id: str | os.PathLike, allow_download: bool = True, **overrides: Any
) -> tuple[Params, ModelConfig]:
    """Loads a Hugging Face qwen2 / qwen3 / llama / qwen3_moe / qwen2_moe checkpoint.

    Args:
      path_or_id: a local directory or a hub id.
      allow_download: try the hub for ids that are not local directories.
      **overrides: `ModelConfig` fields to set (dtype, param_dtype, remat).

    Returns:
      (params, cfg).
    """
    directory = resolve_checkpoint(str(path_or_id), allow_download)
    cfg = load_config(directory, **overrides)
    files = _tensor_index(directory)
    opened: dict[Path, dict[str, np.ndarray]] = {}

    def get(name: str) -> np.ndarray:
        fp = files[name]
        if fp not in opened:
            opened[fp] = read_safetensors(fp)
        if name not in opened[fp]:
            raise CheckpointError(f"{fp} should hold tensor {name!r} but does not")
        return opened[fp][name]

    params = params_from_hf_tensors(get, files.keys(), cfg, source=str(directory))
    return params, cfg


def check_output_dir(directory: str | os.PathLike, overwrite: bool = False) -> Path:
    """`directory` as the target of `save_hf`: absent or empty, or any directory to replace.

    Raises:
      FileExistsError: naming `directory` when it is a file, or (without `overwrite`) a
        directory that holds anything: a leftover checkpoint there would be mixed with the new
        one (an old shard index wins over a new single file when the directory is loaded).
    """
    directory = Path(os.path.abspath(directory))
    if directory.exists() and not directory.is_dir():
        raise FileExistsError(f"{directory} exists and is not a directory")
    if not overwrite and directory.is_dir():
        names = sorted(p.name for p in directory.iterdir())
        if names:
            shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            raise FileExistsError(
                f"{directory} is not empty (it holds {shown}); refusing to mix a new checkpoint "
                "into it"
            )
    return directory


def save_hf(
    params: Params,
    cfg: ModelConfig,
    directory: str | os.PathLike,
    tokenizer: Any = None,
    dtype: str | None = None,
    max_shard_bytes: int = 5 * 2**30,
    overwrite: bool = False,
) -> Path:
    """Writes `params` as a Hugging Face checkpoint directory that `transformers` loads.

    The files are written into a new sibling directory that is then renamed to `directory`, so
    the directory is never half written: an interrupted export leaves it as it was (and a hidden
    `.<name>.tmp-*` sibling). With `overwrite`, an existing directory is moved aside and deleted
    only once the new one is in its place, so no file of it (an old shard, an old index) remains.

    Args:
      params: the weights; LoRA adapters and int8 projections are merged into plain weights
        first (`lora.merge_lora`).
      cfg: their architecture.
      directory: where the checkpoint goes; its parent is created if needed.
      tokenizer: optional; anything with `save_pretrained(directory)` (our `Tokenizer` has it).
      dtype: storage dtype ("float32", "bfloat16"); default `cfg.param_dtype`.
      max_shard_bytes: larger checkpoints are split into shards with an index file.
      overwrite: replace a directory that is not empty.

    Returns:
      `directory`, as an absolute path.

    Raises:
      FileExistsError: `directory` is a file, or not empty and `overwrite` is false.
    """
    directory = check_output_dir(directory, overwrite)
    params = merge_lora(params)
    if directory.is_symlink():
        directory = directory.resolve()  # replace what the link points to, not the link
    directory.parent.mkdir(parents=True, exist_ok=True)
    # Created with os.mkdir (not tempfile), so that it gets the umask's permissions.
    tmp = directory.parent / f".{directory.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        _write_hf(params, cfg, tmp, tokenizer, dtype, max_shard_bytes)
        _move_into_place(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def _move_into_place(new: Path, directory: Path) -> None:
    """Renames the complete directory `new` to `directory`, replacing what is there."""
    if not directory.exists() or not any(directory.iterdir()):
        os.replace(new, directory)  # over an empty directory too (POSIX rename)
        return
    old = directory.parent / f".{directory.name}.old-{os.getpid()}-{secrets.token_hex(4)}"
    os.rename(directory, old)
    try:
        os.rename(new, directory)
    except BaseException:
        os.rename(old, directory)
        raise
    shutil.rmtree(old)


def _write_hf(
    params: Params,
    cfg: ModelConfig,
    directory: Path,
    tokenizer: Any,
    dtype: str | None,
    max_shard_bytes: int,
) -> None:
    dt = np.dtype(ml_dtypes.bfloat16) if (dtype or cfg.param_dtype) == "bfloat16" else None
    dt = dt or np.dtype(dtype or cfg.param_dtype)
    tensors = {k: v.astype(dt) for k, v in params_to_hf_tensors(params, cfg).items()}
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, arr in tensors.items():
        if shards[-1] and size + arr.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = arr
        size += arr.nbytes
    if len(shards) == 1:
        write_safetensors(directory / "model.safetensors", shards[0])
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            write_safetensors(directory / fname, shard)
            weight_map.update({name: fname for name in shard})
        total = sum(a.nbytes for a in tensors.values())
        with open(directory / "model.safetensors.index.json", "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    hf = to_hf_config(cfg)
    hf["torch_dtype"] = dtype or cfg.param_dtype
    with open(directory / "config.json", "w") as f:
        json.dump(hf, f, indent=2)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(directory))
