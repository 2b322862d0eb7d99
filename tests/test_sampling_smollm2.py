"""The sampler on the embedded SmolLM2-135M-Instruct: greedy parity with `transformers` on chat
prompts, and sampled log-probs against teacher forcing. Real weights, so marked slow."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

from rlvr_jax import sampling
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.model import gguf
from rlvr_jax.sampling import SamplerConfig
from tests.sampling.fixtures import hf_greedy, teacher_forced_logp

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "What is 12 plus 7?",
]


@pytest.fixture(scope="module")
def smollm():
    path = gguf.embedded_model_path()
    params, cfg = gguf.load_gguf(path)
    tok = Tokenizer.from_gguf(path)
    prompts = [
        tok.encode(
            tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
        )
        for q in QUESTIONS
    ]
    return path, params, cfg, tok, prompts


@pytest.mark.slow
def test_smollm2_greedy_equals_transformers_generate(smollm):
    from transformers import AutoModelForCausalLM

    path, params, cfg, tok, prompts = smollm
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    prompt, lengths = sampling.bucket_and_pad(prompts, (32, 64), pad_id=tok.pad_id)
    T = 20
    want = hf_greedy(model, prompt, lengths, T, eos_ids=tok.eos_ids)
    scfg = SamplerConfig(
        max_new_tokens=T, method="greedy", eos_ids=tok.eos_ids, pad_id=0, layer_loop="scan"
    )
    r = sampling.sample(params, prompt, lengths, jax.random.key(0), cfg, scfg)
    np.testing.assert_array_equal(np.asarray(r.tokens_NT), want)
    answer = tok.decode(sampling.completions(r)[0])
    assert "Paris" in answer, answer


@pytest.mark.slow
def test_smollm2_sampled_logp_equals_teacher_forced_forward(smollm):
    _, params, cfg, tok, prompts = smollm
    prompt, lengths = sampling.bucket_and_pad(prompts, (32, 64), pad_id=tok.pad_id, group_size=2)
    # Both tests run the scan layer loop: on real weights it compiles in a fraction of the
    # unrolled loop's time, and tests/model/test_decode.py holds the two loops equal.
    scfg = SamplerConfig(
        max_new_tokens=16, eos_ids=tok.eos_ids, pad_id=tok.pad_id, layer_loop="scan"
    )
    sp = sampling.sampling_params(len(prompt), temperature=0.8)
    r = sampling.sample(params, prompt, lengths, jax.random.key(1), cfg, scfg, sp)
    mask = np.asarray(r.mask_NT)
    assert mask.sum() >= 40
    want = teacher_forced_logp(params, cfg, r, temperature=0.8)
    np.testing.assert_allclose(
        np.where(mask, np.asarray(r.logp_NT), 0), np.where(mask, want, 0), atol=1e-4
    )
