"""Tiny random `transformers` models, saved with `save_pretrained`: the parity reference."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

COMMON = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
)
MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
LLAMA3_ROPE = dict(
    rope_type="llama3",
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=64,
)


def make_tiny_hf(kind: str, directory: Path, seed: int = 0) -> torch.nn.Module:
    """Builds, perturbs and saves a tiny random model of `kind` (qwen2, qwen3, llama, qwen3_moe,
    qwen2_moe)."""
    if kind == "qwen2":
        config = transformers.Qwen2Config(**COMMON, tie_word_embeddings=False)
        cls = transformers.Qwen2ForCausalLM
    elif kind == "qwen3":
        config = transformers.Qwen3Config(**COMMON, head_dim=32, tie_word_embeddings=True)
        cls = transformers.Qwen3ForCausalLM
    elif kind == "llama":
        config = transformers.LlamaConfig(
            **COMMON, tie_word_embeddings=True, rope_scaling=dict(LLAMA3_ROPE)
        )
        cls = transformers.LlamaForCausalLM
    elif kind == "qwen3_moe":
        config = transformers.Qwen3MoeConfig(
            **COMMON, **MOE, head_dim=32, norm_topk_prob=True, tie_word_embeddings=False
        )
        cls = transformers.Qwen3MoeForCausalLM
    elif kind == "qwen2_moe":
        config = transformers.Qwen2MoeConfig(
            **COMMON, **MOE, shared_expert_intermediate_size=48, tie_word_embeddings=True
        )
        cls = transformers.Qwen2MoeForCausalLM
    else:
        raise ValueError(kind)
    torch.manual_seed(seed)
    model = cls(config).eval()
    with torch.no_grad():
        # Random init leaves norms at 1 and biases at 0; perturb them so a mix-up would show.
        for name, p in model.named_parameters():
            if "bias" in name or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
            if name.endswith("mlp.gate.weight"):
                # A router at the init scale gives nearly uniform probabilities, whose top k
                # would flip on rounding; spread them so the choices are well separated.
                p.normal_(0.0, 1.0)
    model.save_pretrained(directory)
    return model
