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
LLAMA3_ROPE = dict(
    rope_type="llama3",
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=64,
)


def make_tiny_hf(kind: str, directory: Path, seed: int = 0) -> torch.nn.Module:
    """Builds, perturbs and saves a tiny random model of `kind` (qwen2, qwen3, llama)."""
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
    else:
        raise ValueError(kind)
    torch.manual_seed(seed)
    model = cls(config).eval()
    with torch.no_grad():
        # Random init leaves norms at 1 and biases at 0; perturb them so a mix-up would show.
        for name, p in model.named_parameters():
            if "bias" in name or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(directory)
    return model
