"""GGUF loading: exact round trips of small files written here, and the embedded SmolLM2 checkpoint
against `transformers`' own GGUF loader; then the sampler on it (greedy parity with
`transformers`' generate on chat prompts, sampled log-probs against teacher forcing). The real
weights are loaded once here, by us and by `transformers`, for all of these tests."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import gguf as gguf_lib
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.model import gguf, kv_cache, transformer
from rlvr_jax.model.config import PRESETS, ModelConfig, RopeScaling
from rlvr_jax.model.hf import CheckpointError, params_to_hf_tensors
from rlvr_jax.sampling.config import SamplerConfig, sampling_params
from rlvr_jax.sampling.host import bucket_and_pad, completions
from rlvr_jax.sampling.loop import sample
from tests.sampling.fixtures import hf_greedy, teacher_forced_logp

# head_dim * num_heads != embed_dim, so the file must state the head width (key_length).
TINY = ModelConfig(
    model_type="llama",
    vocab_size=96,
    embed_dim=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    mlp_dim=80,
    rope_theta=10000.0,
    norm_eps=1e-5,
    tie_embeddings=False,
    max_position_embeddings=256,
)


def _random_params(cfg: ModelConfig, seed: int = 0) -> transformer.Params:
    """`init_params` with random norm weights too, so that swapped norms are caught."""
    params = transformer.init_params(jax.random.key(seed), cfg)
    k1, k2, k3 = jax.random.split(jax.random.key(seed + 1), 3)
    layers = dataclasses.replace(
        params.layers,
        attn_norm=1 + 0.1 * jax.random.normal(k1, params.layers.attn_norm.shape),
        mlp_norm=1 + 0.1 * jax.random.normal(k2, params.layers.mlp_norm.shape),
    )
    final_norm = 1 + 0.1 * jax.random.normal(k3, params.final_norm.shape)
    return dataclasses.replace(params, layers=layers, final_norm=final_norm)


def write_gguf(
    path: Path,
    params: transformer.Params,
    cfg: ModelConfig,
    arch: str = "llama",
    drop: tuple[str, ...] = (),
    extra: dict[str, np.ndarray] | None = None,
) -> Path:
    """Writes `params` as llama.cpp's convert script would (Q/K rows permuted), in F32."""
    w = gguf_lib.GGUFWriter(path, arch)
    w.add_vocab_size(cfg.vocab_size)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.embed_dim)
    w.add_block_count(cfg.num_layers)
    w.add_feed_forward_length(cfg.mlp_dim)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(cfg.num_kv_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    tensors = {}
    for name, t in params_to_hf_tensors(params, cfg).items():
        t = np.asarray(t, np.float32)
        if name.endswith("q_proj.weight"):
            t = gguf.permute_qk(t, cfg.num_heads)
        elif name.endswith("k_proj.weight"):
            t = gguf.permute_qk(t, cfg.num_kv_heads)
        tensors[gguf.hf_to_gguf_name(name)] = t
    tensors.update(extra or {})
    for name, t in tensors.items():
        if name not in drop:
            w.add_tensor(name, np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_permute_qk_inverts_and_moves_rope_pairs():
    w = np.arange(2 * 8 * 3, dtype=np.float32).reshape(16, 3)  # 2 heads of width 8
    p = gguf.permute_qk(w, 2)
    np.testing.assert_array_equal(gguf.unpermute_qk(p, 2), w)
    # Rotate-half rows (0..3 | 4..7) of a head become interleaved pairs (0, 4, 1, 5, ...).
    np.testing.assert_array_equal(p[:8, 0], w[[0, 4, 1, 5, 2, 6, 3, 7], 0])


@pytest.mark.parametrize("tied", [False, True])
def test_tiny_gguf_round_trip_is_exact(tmp_path, tied):
    cfg = TINY.replace(tie_embeddings=tied)
    params = _random_params(cfg)
    loaded, loaded_cfg = gguf.load_gguf(write_gguf(tmp_path / "tiny.gguf", params, cfg))
    assert loaded_cfg == cfg
    assert (loaded.lm_head is None) == tied
    for want, got in zip(jax.tree.leaves(params), jax.tree.leaves(loaded), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_overrides_and_param_dtype(tmp_path):
    path = write_gguf(tmp_path / "tiny.gguf", _random_params(TINY), TINY)
    params, cfg = gguf.load_gguf(path, dtype="bfloat16", param_dtype="bfloat16", remat=True)
    assert (cfg.dtype, cfg.param_dtype, cfg.remat) == ("bfloat16", "bfloat16", True)
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}


def test_llama3_rope_scaling_from_rope_freqs(tmp_path):
    scaling = RopeScaling(
        factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
    )
    cfg = TINY.replace(rope_scaling=scaling)
    # llama.cpp writes the per-frequency divisors of the inverse frequencies.
    factors = transformer.inv_frequencies(TINY) / transformer.inv_frequencies(cfg)
    assert len(set(np.round(factors, 4))) > 3  # the smoothed band is exercised
    path = write_gguf(
        tmp_path / "l3.gguf", _random_params(TINY), TINY, extra={"rope_freqs.weight": factors}
    )
    _, loaded_cfg = gguf.load_gguf(path)
    got = loaded_cfg.rope_scaling
    assert got is not None
    assert got.factor == 8.0 and got.original_max_position_embeddings == 8192
    assert got.low_freq_factor == pytest.approx(1.0, rel=1e-4)
    assert got.high_freq_factor == pytest.approx(4.0, rel=1e-4)
    np.testing.assert_allclose(
        transformer.inv_frequencies(loaded_cfg), transformer.inv_frequencies(cfg), rtol=1e-6
    )


def test_unknown_rope_freqs_are_refused(tmp_path):
    factors = np.linspace(1.0, 3.0, TINY.head_dim // 2, dtype=np.float32) ** 2
    path = write_gguf(
        tmp_path / "bad.gguf", _random_params(TINY), TINY, extra={"rope_freqs.weight": factors}
    )
    with pytest.raises(CheckpointError, match="rope_freqs.weight"):
        gguf.load_gguf(path)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(arch="qwen2"), "general.architecture='qwen2'"),
        (dict(drop=("blk.1.attn_k.weight",)), "lacks tensor 'blk.1.attn_k.weight'"),
        (dict(drop=("token_embd.weight",)), "lacks tensor 'token_embd.weight'"),
        (dict(extra={"blk.0.attn_q.bias": np.zeros(128, np.float32)}), "'blk.0.attn_q.bias'"),
        (
            dict(extra={"blk.0.ffn_up.weight": np.zeros((81, 64), np.float32)}),
            r"'blk.0.ffn_up.weight' has shape \(81, 64\)",
        ),
    ],
)
def test_bad_files_fail_naming_the_problem(tmp_path, kwargs, message):
    path = write_gguf(tmp_path / "bad.gguf", _random_params(TINY), TINY, **kwargs)
    with pytest.raises(CheckpointError, match=message):
        gguf.load_gguf(path)


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "junk.gguf"
    path.write_bytes(b"not a gguf file at all" * 4)
    with pytest.raises(CheckpointError, match="junk.gguf"):
        gguf.load_gguf(path)
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        gguf.load_gguf(tmp_path / "missing.gguf")


def test_embedded_model_path_finds_the_wheel_file():
    path = gguf.embedded_model_path()
    assert path.suffix == ".gguf" and path.is_file()
    assert "SmolLM2" in path.name


# ---------------------------------------------------------------------------------------------
# The embedded SmolLM2-135M-Instruct (Q4_1), against transformers' GGUF loading of the same file.

PROMPT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smollm():
    path = gguf.embedded_model_path()
    params, cfg = gguf.load_gguf(path)
    return path, params, cfg


@pytest.fixture(scope="module")
def tokenizer(smollm) -> Tokenizer:
    return Tokenizer.from_gguf(smollm[0])


@pytest.fixture(scope="module")
def prompt_ids(tokenizer) -> list[int]:
    return tokenizer.encode(tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True))


@pytest.fixture(scope="module")
def hf_model(smollm):
    import torch
    from transformers import AutoModelForCausalLM

    path = smollm[0]
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    return model.eval()


def hf_logits(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


@functools.partial(jax.jit, static_argnames=("cfg", "steps"))
def greedy(params, prompt_1T, cfg, steps):
    """Greedy decoding: prefill the prompt into the cache, then one token per step."""
    T = prompt_1T.shape[1]
    cache = kv_cache.init_cache(cfg, 1, T + steps)
    logits, cache = transformer.forward(params, prompt_1T, jnp.arange(T)[None], cfg, cache)
    first = jnp.argmax(logits[:, -1], axis=-1)

    def step(carry, _):
        tok_1, cache, pos = carry
        logits, cache = transformer.forward(params, tok_1[:, None], pos[None, None], cfg, cache)
        return (jnp.argmax(logits[:, -1], axis=-1), cache, pos + 1), tok_1

    _, toks_S1 = jax.lax.scan(step, (first, cache, jnp.int32(T)), None, length=steps)
    return toks_S1[:, 0]


@pytest.mark.slow
def test_smollm2_config_and_weights_match_transformers(smollm, hf_model):
    _, params, cfg = smollm
    assert cfg == PRESETS["smollm2-135m"]
    state = {k: v.numpy() for k, v in hf_model.state_dict().items()}
    ours = params_to_hf_tensors(params, cfg)
    assert set(ours) <= set(state)
    for name, w in ours.items():
        # Both dequantize the same Q4_1/Q8_0 blocks; the Q/K un-permutation must match theirs.
        np.testing.assert_array_equal(w, state[name], err_msg=name)


@pytest.mark.slow
def test_smollm2_logits_match_transformers(smollm, hf_model, prompt_ids):
    _, params, cfg = smollm
    want = hf_logits(hf_model, prompt_ids)
    T = len(prompt_ids)
    got, _ = jax.jit(transformer.forward, static_argnums=3)(
        params, jnp.asarray([prompt_ids]), jnp.arange(T)[None], cfg
    )
    got = np.asarray(got[0])
    # Measured 1.3e-4 (logits up to ~38): f32 summation order, and RMSNorm eps 1e-5 here vs the
    # file's f32 value 9.99999975e-6 there.
    assert np.abs(got - want).max() <= 5e-4
    np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.slow
def test_smollm2_greedy_answers_paris(smollm, hf_model, tokenizer, prompt_ids):
    _, params, cfg = smollm
    out = np.asarray(greedy(params, jnp.asarray([prompt_ids]), cfg, 12)).tolist()
    end = next((i for i, t in enumerate(out) if t in tokenizer.eos_ids), len(out) - 1)
    answer = tokenizer.decode(out[:end])
    assert "Paris" in answer, answer
    # transformers' greedy choice after each prefix, teacher-forced in one pass, is our next token.
    T = len(prompt_ids)
    want = hf_logits(hf_model, prompt_ids + out[:end])[T - 1 :].argmax(-1)
    assert out[: end + 1] == want.tolist()


# ---------------------------------------------------------------------------------------------
# The sampler on the embedded model

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "What is 12 plus 7?",
]


@pytest.fixture(scope="module")
def chat_prompts(tokenizer) -> list[list[int]]:
    return [
        tokenizer.encode(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True
            )
        )
        for q in QUESTIONS
    ]


@pytest.mark.slow
def test_smollm2_sampler_greedy_equals_transformers_generate(
    smollm, hf_model, tokenizer, chat_prompts
):
    _, params, cfg = smollm
    tok = tokenizer
    prompt, lengths = bucket_and_pad(chat_prompts, (32, 64), pad_id=tok.pad_id)
    T = 20
    want = hf_greedy(hf_model, prompt, lengths, T, eos_ids=tok.eos_ids)
    scfg = SamplerConfig(
        max_new_tokens=T, method="greedy", eos_ids=tok.eos_ids, pad_id=0, layer_loop="scan"
    )
    r = sample(params, prompt, lengths, jax.random.key(0), cfg, scfg)
    np.testing.assert_array_equal(np.asarray(r.tokens_NT), want)
    answer = tok.decode(completions(r)[0])
    assert "Paris" in answer, answer


@pytest.mark.slow
def test_smollm2_sampled_logp_equals_teacher_forced_forward(smollm, tokenizer, chat_prompts):
    _, params, cfg = smollm
    tok = tokenizer
    prompt, lengths = bucket_and_pad(chat_prompts, (32, 64), pad_id=tok.pad_id, group_size=2)
    # Both sampler tests run the scan layer loop: on real weights it compiles in a fraction of
    # the unrolled loop's time, and tests/model/test_decode.py holds the two loops equal.
    scfg = SamplerConfig(
        max_new_tokens=16, eos_ids=tok.eos_ids, pad_id=tok.pad_id, layer_loop="scan"
    )
    sp = sampling_params(len(prompt), temperature=0.8)
    r = sample(params, prompt, lengths, jax.random.key(1), cfg, scfg, sp)
    mask = np.asarray(r.mask_NT)
    assert mask.sum() >= 40
    want = teacher_forced_logp(params, cfg, r, temperature=0.8)
    np.testing.assert_allclose(
        np.where(mask, np.asarray(r.logp_NT), 0), np.where(mask, want, 0), atol=1e-4
    )
