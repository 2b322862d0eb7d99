"""Model configuration: one frozen dataclass for every supported decoder family.

The same `ModelConfig` describes Qwen2/2.5 (qkv bias), Qwen3 (q/k RMSNorm), Llama 3 / SmolLM2,
and the mixture-of-experts Qwen3-MoE and Qwen2-MoE (every layer's MLP a routed set of experts,
`model/moe.py`). It is hashable so that it can be a static argument of `jax.jit`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama", "qwen2_moe", "qwen3_moe")
MOE_MODEL_TYPES = ("qwen2_moe", "qwen3_moe")
ATTENTION_IMPLEMENTATIONS = ("auto", "xla_blockwise", "dense", "cudnn", "pallas")
MOE_DISPATCHES = ("auto", "ragged", "blocked", "dense")


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
      model_type: "qwen2", "qwen3", "llama", "qwen3_moe" or "qwen2_moe" (the Hugging Face
        `model_type`).
      vocab_size: V.
      embed_dim: D, the residual width (`hidden_size`).
      num_layers: L.
      num_heads: H query heads.
      num_kv_heads: K key/value heads (grouped-query attention when K < H).
      head_dim: Dh.
      mlp_dim: F, the SwiGLU inner width (`intermediate_size`); unused by MoE models, whose
        every layer is a sparse MoE block.
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
      attention: the attention of training forwards (`model/attention.py`, the fused kernels
        in `model/fused_attention.py`): "auto" (the fused kernel of the backend where it
        applies, cuDNN on NVIDIA GPUs and splash on TPUs, else "xla_blockwise"),
        "xla_blockwise" (pure JAX, flash-style, no (T, S) score matrix), "dense" (the
        reference: the whole masked score matrix), "cudnn" or "pallas" (that kernel or an
        error). Completions over a shared prompt always run blockwise unless "dense"; prefill
        with a KV cache and decoding always run dense.
      attention_block: query and key block size of "xla_blockwise" (and of the splash kernel).
      num_experts: E, the routed experts of each layer's MLP (`num_experts`); 0 for a dense MLP.
      num_experts_per_tok: k, the experts each token is routed to (top-k of the router).
      moe_mlp_dim: the SwiGLU inner width of one expert (`moe_intermediate_size`).
      norm_topk_prob: renormalise the k chosen router probabilities to sum to 1 (Qwen3-MoE's
        checkpoints set it; Qwen2-MoE's do not).
      shared_expert_dim: inner width of Qwen2-MoE's shared expert, a SwiGLU MLP every token
        passes through, scaled by a sigmoid gate (`shared_expert_intermediate_size`); 0: none.
      moe_dispatch: how tokens reach their experts (`model/moe.py`; none drops a token):
        "ragged" (tokens sorted by expert, one grouped matmul per weight), "blocked" (sorted
        tokens in blocks of one expert's, a batched matmul), "dense" (every expert on every
        token: the reference) or "auto" ("blocked" on CPU, "ragged" on TPU and GPU).
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
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_mlp_dim: int = 0
    norm_topk_prob: bool = False
    shared_expert_dim: int = 0
    moe_dispatch: str = "auto"

    @property
    def is_moe(self) -> bool:
        """Whether every layer's MLP is a routed mixture of experts."""
        return self.num_experts > 0

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
        self._check_moe()

    def _check_moe(self) -> None:
        moe_type = self.model_type in MOE_MODEL_TYPES
        if moe_type != self.is_moe:
            raise ValueError(
                f"model_type={self.model_type!r} with num_experts={self.num_experts}: "
                f"{MOE_MODEL_TYPES} need num_experts > 0, the dense types num_experts=0"
            )
        if not self.is_moe:
            return
        if not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError(
                f"num_experts_per_tok={self.num_experts_per_tok} must be in "
                f"[1, num_experts={self.num_experts}]"
            )
        if self.moe_mlp_dim <= 0:
            raise ValueError(f"moe_mlp_dim={self.moe_mlp_dim} must be positive for an MoE model")
        shared = self.model_type == "qwen2_moe"
        if shared != (self.shared_expert_dim > 0):
            raise ValueError(
                f"model_type={self.model_type!r} with shared_expert_dim={self.shared_expert_dim}: "
                "qwen2_moe has a shared expert (shared_expert_dim > 0), qwen3_moe none (0)"
            )
        if self.moe_dispatch not in MOE_DISPATCHES:
            raise ValueError(
                f"moe_dispatch={self.moe_dispatch!r} is not a dispatch; expected one of "
                f"{MOE_DISPATCHES}"
            )

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
    if model_type in ("qwen3", "qwen3_moe") and hf.get("attention_bias"):
        raise ValueError(f"config.json: {model_type} with attention_bias=true is not supported")
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
        qkv_bias=model_type == "qwen2" or (model_type == "qwen2_moe" and hf.get("qkv_bias", True)),
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
    )
    if model_type in MOE_MODEL_TYPES:
        kwargs.update(_moe_fields(hf, model_type, need))
    kwargs.update(overrides)
    return ModelConfig(**kwargs)


def _moe_fields(hf: dict[str, Any], model_type: str, need) -> dict[str, Any]:
    """The MoE fields of a qwen3_moe / qwen2_moe config.json (`transformers` 5 writes the expert
    count as `num_local_experts`, earlier versions as `num_experts`)."""
    step = hf.get("decoder_sparse_step", 1)
    dense_layers = hf.get("mlp_only_layers") or []
    if step != 1 or dense_layers:
        raise ValueError(
            f"config.json ({model_type}): decoder_sparse_step={step}, mlp_only_layers="
            f"{dense_layers}: dense MLP layers among the MoE ones are not supported; every "
            "layer must be sparse (decoder_sparse_step=1, mlp_only_layers=[])"
        )
    num_experts = hf.get("num_experts", hf.get("num_local_experts"))
    if num_experts is None:
        raise ValueError(f"config.json (model_type={model_type!r}) lacks the field 'num_experts'")
    return dict(
        num_experts=int(num_experts),
        num_experts_per_tok=int(need("num_experts_per_tok")),
        moe_mlp_dim=int(need("moe_intermediate_size")),
        norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
        shared_expert_dim=(
            int(need("shared_expert_intermediate_size")) if model_type == "qwen2_moe" else 0
        ),
    )


def to_hf_config(cfg: ModelConfig) -> dict[str, Any]:
    """The Hugging Face `config.json` dict that `transformers` loads as the same model."""
    arch = {
        "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM",
        "llama": "LlamaForCausalLM",
        "qwen2_moe": "Qwen2MoeForCausalLM",
        "qwen3_moe": "Qwen3MoeForCausalLM",
    }
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
    if cfg.model_type in ("qwen3", "qwen3_moe"):
        hf["attention_bias"] = False
    if cfg.is_moe:
        hf.update(
            num_experts=cfg.num_experts,
            num_experts_per_tok=cfg.num_experts_per_tok,
            moe_intermediate_size=cfg.moe_mlp_dim,
            norm_topk_prob=cfg.norm_topk_prob,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    if cfg.model_type == "qwen2_moe":
        hf["qkv_bias"] = cfg.qkv_bias
        hf["shared_expert_intermediate_size"] = cfg.shared_expert_dim
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
    "qwen3-32b": ModelConfig(
        model_type="qwen3",
        vocab_size=151936,
        embed_dim=5120,
        num_layers=64,
        num_heads=64,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=25600,
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
    "qwen3-30b-a3b": ModelConfig(
        model_type="qwen3_moe",
        vocab_size=151936,
        embed_dim=2048,
        num_layers=48,
        num_heads=32,
        num_kv_heads=4,
        head_dim=128,
        mlp_dim=6144,
        rope_theta=1e6,
        norm_eps=1e-6,
        qk_norm=True,
        tie_embeddings=False,
        max_position_embeddings=40960,
        num_experts=128,
        num_experts_per_tok=8,
        moe_mlp_dim=768,
        norm_topk_prob=True,
    ),
    "tiny-moe": ModelConfig(
        model_type="qwen3_moe",
        vocab_size=512,
        embed_dim=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        mlp_dim=128,
        rope_theta=10000.0,
        norm_eps=1e-6,
        qk_norm=True,
        tie_embeddings=True,
        max_position_embeddings=2048,
        num_experts=8,
        num_experts_per_tok=2,
        moe_mlp_dim=32,
        norm_topk_prob=True,
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
