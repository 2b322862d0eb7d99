"""What the benchmarks share: a random model whose answer lengths are forced, SmolLM2 on GSM8K
questions, and the FLOPs of an update counted from its layout.

Not a benchmark itself; `rollout.py` and `step_efficiency.py` import it (they run as scripts, so
this directory is on their path).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np

from rlvr_jax.model import transformer
from rlvr_jax.model.attention import BRANCHES
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.sampling.host import bucket_and_pad


def forced_length_model(
    cfg: ModelConfig, T: int, seed: int = 0
) -> tuple[transformer.Params, ModelConfig, int]:
    """`cfg`'s random layers with an embedding and LM head that force chain c_T ... c_1 -> end.

    The embeddings are scaled up so the residual stream points along the current token's
    embedding, and the (untied) LM head maps chain token c_k to c_{k-1} and c_1 to an end id
    with ~100 nats of margin: a row whose prompt ends with c_L then samples c_{L-1} ... c_1,
    end, exactly L tokens whatever the temperature. The layers still run at full cost.

    Returns:
      (params, cfg, end id); chain token c_k is id k for k in [1, T].
    """
    cfg = dataclasses.replace(cfg, tie_embeddings=False)
    V, D = cfg.vocab_size, cfg.embed_dim
    end = T + 1
    if end >= V:
        raise ValueError(f"T={T} needs a vocabulary over {T + 1}, not {V}")
    params = transformer.init_params(jax.random.key(seed), cfg)
    rng = np.random.default_rng(seed)
    unit_VD = rng.normal(size=(V, D))
    unit_VD /= np.linalg.norm(unit_VD, axis=1, keepdims=True)
    # Layer outputs are O(0.1) at init; an embedding of norm 10 dominates the final norm's input.
    embed = 10.0 * unit_VD
    head_DV = np.zeros((D, V))
    successor = {k: k - 1 for k in range(2, T + 1)} | {1: end}
    for a, b in successor.items():
        # rms_norm(h) ~ sqrt(D) * unit[a], so the logit of b after a is 300 and any other
        # successor's is 300 * cos(a, a') (< 0.7 for random directions in 64 dimensions).
        head_DV[:, b] = 300.0 * unit_VD[a] / np.sqrt(D)
    params = dataclasses.replace(
        params, embed=jax.numpy.asarray(embed, np.float32), lm_head=jax.numpy.asarray(head_DV)
    )
    return params, cfg, end


def forcing_prompts(
    want_N: np.ndarray, T: int, P: int, vocab: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Random prompts (left-padded to P) whose last token forces each row's answer length.

    Returns:
      (prompt_NP, prompt_lengths_N).
    """
    prompts = []
    for want in want_N:
        body = rng.integers(T + 2, vocab, size=rng.integers(1, P)).tolist()
        prompts.append([*body, int(want)])
    return bucket_and_pad(prompts, (P,), pad_id=0)


def lognormal_lengths(n: int, T: int, imbalance: float, rng: np.random.Generator) -> np.ndarray:
    """n lengths in [1, T] whose max is T and whose mean is about T / imbalance."""
    if imbalance <= 1:
        return np.full(n, T)
    sigma = 0.3
    for _ in range(60):  # widen the spread until max / mean reaches the imbalance
        x = rng.lognormal(0.0, sigma, n)
        lengths = np.maximum(1, np.round(x / x.max() * T)).astype(int)
        if T / lengths.mean() >= imbalance:
            return lengths
        sigma *= 1.1
    return lengths


def update_flops(cfg, positions: float, predicting: float, pairs: float) -> float:
    """Forward and backward (3 x forward) FLOPs of the policy's pass over `positions` token
    positions, the unembedding at `predicting` of them, and attention over `pairs` (query,
    key) pairs."""
    D, H, K, Dh, F = cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_dim
    per_position = 2 * D * (H + 2 * K) * Dh + 2 * H * Dh * D + 6 * D * F
    per_pair = 4 * H * Dh  # q.k and p.v
    layers = cfg.num_layers * (per_position * positions + per_pair * pairs)
    return 3 * (layers + 2 * D * cfg.vocab_size * predicting)


def packed_pairs(segment_RL: np.ndarray, block: int) -> int:
    """The (query, key) pairs blockwise attention computes on packed rows: whole blocks of
    `block` x `block`; per query block, the key blocks of its sequences' prefixes and of its own
    branches up to the causal diagonal, each bound taken over the rows at the block's first
    query (`attention._block_ranges`)."""
    R, L = segment_RL.shape
    b = min(block, L)
    n = -(-L // b)
    seg = np.pad(segment_RL, ((0, 0), (0, n * b - L)))
    index = np.arange(n * b)

    def run_starts(x):
        begins = np.concatenate([np.ones((R, 1), bool), x[:, 1:] != x[:, :-1]], axis=1)
        return np.maximum.accumulate(np.where(begins, index, 0), axis=1)[:, ::b]

    start = run_starts(seg // BRANCHES).min(axis=0) // b
    last_prefix = np.maximum.accumulate(np.where(seg % BRANCHES == 0, index, -1), axis=1)
    prefix_end = np.minimum(last_prefix[:, ::b].max(axis=0) // b + 1, np.arange(1, n + 1))
    branch = np.maximum(run_starts(seg).min(axis=0) // b, np.maximum(prefix_end, start))
    prefix = np.maximum(prefix_end - start, 0)
    return int(R * (prefix + np.maximum(np.arange(1, n + 1) - branch, 0)).sum() * b * b)


def layout_flops(
    cfg, p_B: np.ndarray, c_N: np.ndarray, P: int, T: int, packing, block: int = 512
) -> dict:
    """`update_flops` of the padded update (shared prompt; exact causal pairs), of `packing`
    (pairs as blockwise attention with `block` computes them, `packed_pairs`), and of the real
    need (each group's prompt once, exact causal pairs); with `packing`, also "waste": the
    packed update's FLOPs beyond the real need by cause (prompts packed again in a second
    packed row, padding positions, attention pairs of whole blocks, unembedded positions that
    predict no completion token)."""
    G = len(c_N) // len(p_B)
    p_N = np.repeat(p_B, G)
    tri = lambda n: n * (n + 1) / 2  # noqa: E731
    real_pairs = tri(p_B).sum() + (c_N * p_N + tri(c_N)).sum()
    out = {
        "padded": update_flops(
            cfg,
            len(p_B) * P + len(c_N) * T,
            len(c_N) * T,
            len(p_B) * tri(P) + len(c_N) * (T * P + tri(T)),
        ),
        "real": update_flops(cfg, p_B.sum() + c_N.sum(), c_N.sum(), real_pairs),
    }
    if packing is not None:
        M, R, L = packing.src_MRL.shape
        pairs = sum(packed_pairs(np.asarray(seg), block) for seg in packing.segment_MRL)
        out["packed"] = update_flops(cfg, M * R * L, packing.at_MK.size, pairs)
        placed = int((np.asarray(packing.segment_MRL) > 0).sum())
        # What the packed update computes beyond the real need, by cause (they sum to it).
        out["waste"] = {
            "prompts again": update_flops(cfg, placed - p_B.sum() - c_N.sum(), 0, 0),
            "padding": update_flops(cfg, M * R * L - placed, 0, 0),
            "attention blocks": update_flops(cfg, 0, 0, pairs - real_pairs),
            "unembedding": update_flops(cfg, 0, packing.at_MK.size - c_N.sum(), 0),
        }
    return out


GSM8K = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k" / "test.jsonl"


def gsm8k_prompts(N: int, G: int) -> tuple:
    """SmolLM2-135M-Instruct (the embedded weights) and N // G GSM8K test questions asked step
    by step in its chat template, each G times (an RL step's rows); needs ../shared/data.

    Returns:
      (params, cfg, tokenizer, prompt_NP, prompt_lengths_N), the prompts left-padded to a
      multiple of 32.
    """
    from rlvr_jax.data.tokenizer import Tokenizer
    from rlvr_jax.model import gguf

    if not GSM8K.is_file():
        raise SystemExit(f"the GSM8K workload needs {GSM8K}")
    path = gguf.embedded_model_path()
    params, cfg = gguf.load_gguf(path)
    tok = Tokenizer.from_gguf(path)
    with open(GSM8K) as f:
        questions = [
            json.loads(line)["question"] for _, line in zip(range(N // G), f, strict=False)
        ]
    ids = [
        tok.encode(
            tok.apply_chat_template(
                [{"role": "user", "content": f"{q}\nSolve it step by step, then give the answer."}],
                add_generation_prompt=True,
            )
        )
        for q in questions
        for _ in range(G)
    ]
    P = -(-max(map(len, ids)) // 32) * 32
    prompt, lengths = bucket_and_pad(ids, (P,), pad_id=tok.pad_id)
    return params, cfg, tok, prompt, lengths
