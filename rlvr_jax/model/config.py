"""Model configuration: one frozen dataclass for every supported decoder family.

The same `ModelConfig` describes Qwen2/2.5 (qkv bias), Qwen3 (q/k RMSNorm) and Llama 3 / SmolLM2.
It is hashable so that it can be a static argument of `jax.jit`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama")
ATTENTION_IMPLEMENTATIONS = ("auto", "xla_blockwise", "dense", "cudnn", "pallas")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style RoPE frequency scaling (`rope_type == "llama3"`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture and numerics of one decoder.

    Attributes:
      model_type: "qwen2", "qwen3" or "llama" (the Hugging Face `model_type`).
      vocab_size: V.
      embed_dim: D, the residual width (`hidden_size`).
      num_layers: L.
      num_heads: H query heads.
      num_kv_heads: K key/value heads (grouped-query attention when K < H).
      head_dim: Dh.
      mlp_dim: F, the SwiGLU inner width (`intermediate_size`).
      rope_theta: RoPE base frequency.
      rope_scaling: optional Llama-3 frequency scaling.
      norm_eps: RMSNorm epsilon.
      qkv_bias: whether q/k/v projections carry a bias (Qwen2).
      qk_norm: whether q and k are RMS-normalised per head before RoPE (Qwen3).
      tie_embeddings: whether the output projection is the transposed input embedding.
      dtype: compute dtype of activations ("float32" or "bfloat16").
      param_dtype: storage dtype of the parameters.
      remat: wrap the layer body in `jax.checkpoint` (training memory).
      max_position_embeddings: the longest context the checkpoint was trained for.
      attention: the attention of training forwards (`model/attention.py`): "auto" (the fused
        kernel of the backend where it applies, cuDNN on NVIDIA GPUs and splash on TPUs, else
        "xla_blockwise"), "xla_blockwise" (pure JAX, flash-style, no (T, S) score matrix),
        "dense" (the reference: the whole masked score matrix), "cudnn" or "pallas" (that
        kernel or an error). Completions over a shared prompt always run blockwise unless
        "dense"; prefill with a KV cache and decoding always run dense.
      attention_block: query and key block size of "xla_blockwise" (and of the splash kernel).
    """

    model_type: str
    vocab_size: int
    embed_dim: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_dim: int
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    norm_eps: float = 1e-6
    qkv_bias: bool = False
    qk_norm: bool = False
    tie_embeddings: bool = False
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat: bool = False
    max_position_embeddings: int = 32768
    attention: str = "auto"
    attention_block: int = 512

    def __post_init__(self):
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type={self.model_type!r} is not supported; "
                f"expected one of {SUPPORTED_MODEL_TYPES}"
            )
        for name in ("vocab_size", "embed_dim", "num_layers", "num_heads", "num_kv_heads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be positive")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in ("float32", "bfloat16", "float16"):
                raise ValueError(
                    f"{name}={getattr(self, name)!r}: use float32, bfloat16 or float16"
                )
        if self.attention not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(
                f"attention={self.attention!r} is not an attention implementation; "
                f"expected one of {ATTENTION_IMPLEMENTATIONS}"
            )
        if self.attention_block <= 0:
            raise ValueError(f"attention_block={self.attention_block} must be positive")

    def replace(self, **kwargs: Any) -> ModelConfig:
        return dataclasses.replace(self, **kwargs)


def from_hf_config(hf: dict[str, Any], **overrides: Any) -> ModelConfig:
    """Maps a Hugging Face `config.json` dict to a `ModelConfig`.

    Args:
      hf: the parsed config.json.
      **overrides: fields to set on top (dtype, param_dtype, remat).

    Raises:
      ValueError: for a `model_type` other than qwen2, qwen3, llama, or a missing field.
    """
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"config.json has model_type={model_type!r}; supported: {SUPPORTED_MODEL_TYPES}"
        )

    def need(key: str) -> Any:
        if key not in hf:
            raise ValueError(f"config.json (model_type={model_type!r}) lacks the field {key!r}")
        return hf[key]

    num_heads = need("num_attention_heads")
    embed_dim = need("hidden_size")
    head_dim = hf.get("head_dim") or embed_dim // num_heads
    # transformers >= 5 writes `rope_parameters` (theta included); older files write
    # `rope_theta` and `rope_scaling`.
    rope = dict(hf.get("rope_parameters") or {})
    rope_theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    scaling = None
    rs = hf.get("rope_scaling") or rope
    if rs:
        kind = rs.get("rope_type", rs.get("type"))
        if kind == "llama3":
            scaling = RopeScaling(
                factor=float(rs["factor"]),
                low_freq_factor=float(rs["low_freq_factor"]),
                high_freq_factor=float(rs["high_freq_factor"]),
                original_max_position_embeddings=int(rs["original_max_position_embeddings"]),
            )
        elif kind not in (None, "default"):
            raise ValueError(f"config.json rope_scaling type {kind!r} is not supported")
    if model_type == "llama" and (hf.get("attention_bias") or hf.get("mlp_bias")):
        raise ValueError("config.json: llama with attention_bias/mlp_bias is not supported")
    if hf.get("use_sliding_window"):
        raise ValueError("config.json: use_sliding_window=true is not supported")
    if model_type == "qwen3" and hf.get("attention_bias"):
        raise ValueError("config.json: qwen3 with attention_bias=true is not supported")
    kwargs = dict(
        model_type=model_type,
        vocab_size=need("vocab_size"),
        embed_dim=embed_dim,
        num_layers=need("num_hidden_layers"),
        num_heads=num_heads,
        num_kv_heads=hf.get("num_key_value_heads") or num_heads,
        head_dim=head_dim,
        mlp_dim=need("intermediate_size"),
        rope_theta=float(rope_theta),
        rope_scaling=scaling,
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        qkv_bias=model_type == "qwen2",
        qk_norm=model_type == "qwen3",
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
    )
    kwargs.update(overrides)
    return ModelConfig(**kwargs)


def to_hf_config(cfg: ModelConfig) -> dict[str, Any]:
    """The Hugging Face `config.json` dict that `transformers` loads as the same model."""
    arch = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}
    hf: dict[str, Any] = {
        "architectures": [arch[cfg.model_type]],
        "model_type": cfg.model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.embed_dim,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.mlp_dim,
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "max_position_embeddings": cfg.max_position_embeddings,
        "hidden_act": "silu",
        "torch_dtype": cfg.param_dtype,
    }
    if cfg.rope_scaling is not None:
        hf["rope_scaling"] = {"rope_type": "llama3", **dataclasses.asdict(cfg.rope_scaling)}
    if cfg.model_type == "llama":
        hf["attention_bias"] = False
        hf["mlp_bias"] = False
    if cfg.model_type == "qwen3":
        hf["attention_bias"] = False
    return hf


# Published architectures, for shape checks, memory planning and configs.
PRESETS: dict[str, ModelConfig] = {
    "qwen2.5-0.5b": ModelConfig(
        model_type="qwen2",
        vocab_size=151936,
        embed_dim=896,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        head_dim=64,
        mlp_dim=4864,
        rope_theta=1e6,
        norm_eps=1e-6,
        qkv_bias=True,
        tie_embeddings=True,
    ),
    "qwen2.5-7b": ModelConfig(
        model_type="qwen2",
        vocab_size=152064,
        embed_dim=3584,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
        head_dim=128,
        mlp_dim=18944,
        rope_theta=1e6,
        norm_eps=1e-6,
        qkv_bias=True,
        tie_embeddings=False,
    ),
    "qwen3-0.6b": ModelConfig(
        model_type="qwen3",
        vocab_size=151936,
        embed_dim=1024,
        num_layers=28,
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=3072,
        rope_theta=1e6,
        norm_eps=1e-6,
        qk_norm=True,
        tie_embeddings=True,
        max_position_embeddings=40960,
    ),
    "qwen3-8b": ModelConfig(
        model_type="qwen3",
        vocab_size=151936,
        embed_dim=4096,
        num_layers=36,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=12288,
        rope_theta=1e6,
        norm_eps=1e-6,
        qk_norm=True,
        tie_embeddings=False,
        max_position_embeddings=40960,
    ),
    "smollm2-135m": ModelConfig(
        model_type="llama",
        vocab_size=49152,
        embed_dim=576,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        mlp_dim=1536,
        rope_theta=100000.0,
        norm_eps=1e-5,
        tie_embeddings=True,
        max_position_embeddings=8192,
    ),
    "tiny": ModelConfig(
        model_type="qwen2",
        vocab_size=512,
        embed_dim=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        mlp_dim=128,
        rope_theta=10000.0,
        norm_eps=1e-6,
        qkv_bias=True,
        tie_embeddings=True,
        max_position_embeddings=2048,
    ),
}
