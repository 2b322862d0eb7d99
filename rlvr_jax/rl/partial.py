"""Kimi k1.5 partial rollouts (Kimi Team 2025, section 2.6.2): long answers decoded a budget at a
time, across steps.

A step whose rollout decodes until its longest answer ends spends most of its decode slots
waiting on a few long rows. With partial rollouts (`rl.partial_budget` > 0) a step runs rounds
instead. Each round holds B groups: those still running, oldest first, then fresh prompts; every
row decodes at most `budget` more tokens after its prompt and what it has generated so far
(re-prefilled; no cache is kept between rounds). A row ends on an end id, a stop sequence or
`max_new_tokens` in all; a group is complete when its G rows have ended. Once B groups are
complete the step trains on the B oldest of them and keeps the others, complete or running, for
the next step.

Every token records the policy version that sampled it (the optimizer updates applied before
its round), so a row can hold tokens of several versions. The update corrects the loss of
tokens an older policy sampled with its truncated importance weight against the log-probs the
sampler reported (`rl.loss.tis_cap`, required here), and the step logs the version lag of the
tokens it trains on. An MoE policy's tokens keep the experts their round's sampler routed them
to (`Rollout.experts_NTLk`), so the update's `moe/routing_disagreement` compares each token's
routing under the policy that sampled it with the current policy's: policy change over the
version lag as well as numerics. The experts live in host memory only: a checkpoint keeps the
pending groups without them, and a step that trains on a group restored so logs no
disagreement (its tokens before the restart have no recorded experts).

Host code over numpy: `PendingGroup` is one prompt's G rows so far; `contexts` gives a round's
prompts, `absorb` splices a round's tokens in, `training_rollout` is the `Rollout` the update
takes, and `to_arrays` / `from_arrays` keep the pending groups in the checkpoint.

Limits: a stop sequence whose tokens straddle two rounds is not matched (each round's matcher
starts empty), and the think budget is refused (a resumed row's thinking count would restart).
A row that has ended still takes its slot in the rounds of its group until the group completes;
its new tokens are dropped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from rlvr_jax.sampling.host import bucket_and_pad
from rlvr_jax.types import FINISH_EOS, FINISH_LENGTH, FINISH_STOP, Rollout

_PREFIX = "pending/"


@dataclasses.dataclass
class PendingGroup:
    """One prompt's G rows, generated so far. T = `max_new_tokens`.

    Attributes:
      example: the prompt's index in the stage's prompt list.
      prompt: its template token ids.
      tokens_GT: int32 generated tokens, `pad_id` after each row's length.
      logp_GT: f32 what the sampler reported for each token (0 where none was sampled).
      injected_GT: bool tokens forced rather than sampled.
      version_GT: int32 the policy version (optimizer updates) that sampled each token; -1 past
        the row's length.
      lengths_G: int32 tokens so far.
      finish_G: int32 FINISH_* of the rows that ended.
      done_G: bool the row has ended.
      segments_G: int32 rounds that added tokens to the row.
      experts_GTLk: int32 an MoE sampler's experts of the position each token was sampled from
        (L layers, top k; 0 where no token was sampled), from the group's first round on; None
        for a dense model and for a group restored from a checkpoint (`to_arrays`).
    """

    example: int
    prompt: list[int]
    tokens_GT: np.ndarray
    logp_GT: np.ndarray
    injected_GT: np.ndarray
    version_GT: np.ndarray
    lengths_G: np.ndarray
    finish_G: np.ndarray
    done_G: np.ndarray
    segments_G: np.ndarray
    experts_GTLk: np.ndarray | None = None

    @property
    def complete(self) -> bool:
        """Every row has ended: the group can be verified and trained on."""
        return bool(self.done_G.all())


def new_group(example: int, prompt: Sequence[int], G: int, T: int, pad_id: int) -> PendingGroup:
    """A fresh prompt's group: G rows with nothing generated."""
    return PendingGroup(
        example=int(example),
        prompt=[int(t) for t in prompt],
        tokens_GT=np.full((G, T), pad_id, np.int32),
        logp_GT=np.zeros((G, T), np.float32),
        injected_GT=np.zeros((G, T), bool),
        version_GT=np.full((G, T), -1, np.int32),
        lengths_G=np.zeros(G, np.int32),
        finish_G=np.full(G, FINISH_LENGTH, np.int32),
        done_G=np.zeros(G, bool),
        segments_G=np.zeros(G, np.int32),
    )


def round_groups(pending: Sequence[PendingGroup], B: int) -> list[PendingGroup]:
    """The running groups (not complete) that the next round continues, oldest first, at most B;
    fresh prompts fill the rest of its B groups."""
    return [g for g in pending if not g.complete][:B]


def contexts(groups: Sequence[PendingGroup]) -> list[list[int]]:
    """Each row's prompt for a round: the template ids followed by its tokens so far, rows in
    `b * G + g` order."""
    out = []
    for g in groups:
        for i in range(g.lengths_G.shape[0]):
            out.append(g.prompt + g.tokens_GT[i, : g.lengths_G[i]].tolist())
    return out


def absorb(groups: Sequence[PendingGroup], segment: Rollout, version: int) -> int:
    """Appends a round's tokens to its rows (in place) and ends the rows that ended.

    Args:
      groups: the round's B groups, in its row order.
      segment: the round's rollout (host or device arrays), N = B * G rows, whose rows were
        `contexts(groups)`; its `max_new_tokens` is the budget.
      version: the policy version that sampled it.

    Returns:
      The tokens added (rows that had already ended add none).

    A row ends with the round's end id or stop sequence, or when it holds `max_new_tokens`
    (T) tokens; a row that used the whole budget without either runs on in the next round.

    An MoE round's experts (`Rollout.experts_NTLk`) are spliced in beside the tokens; a group
    that has tokens but no experts (restored from a checkpoint) stays without.
    """
    experts = None if segment.experts_NTLk is None else np.asarray(segment.experts_NTLk)
    tokens, logp, injected, lengths, finish = (
        np.asarray(x)
        for x in (
            segment.tokens_NT,
            segment.logp_NT,
            segment.injected_NT,
            segment.lengths_N,
            segment.finish_N,
        )
    )
    added, n = 0, 0
    for g in groups:
        G, T = g.tokens_GT.shape
        if experts is not None and g.experts_GTLk is None and not g.lengths_G.any():
            g.experts_GTLk = np.zeros((G, T, *experts.shape[2:]), np.int32)
        keep_experts = experts is not None and g.experts_GTLk is not None
        for i in range(G):
            row, n = n, n + 1
            if g.done_G[i]:
                continue
            start = int(g.lengths_G[i])
            k = min(int(lengths[row]), T - start)
            end = start + k
            g.tokens_GT[i, start:end] = tokens[row, :k]
            g.logp_GT[i, start:end] = logp[row, :k]
            g.injected_GT[i, start:end] = injected[row, :k]
            g.version_GT[i, start:end] = version
            if keep_experts:
                g.experts_GTLk[i, start:end] = experts[row, :k]
            g.lengths_G[i] = end
            g.segments_G[i] += k > 0
            ended = int(finish[row]) in (FINISH_EOS, FINISH_STOP) and k == int(lengths[row])
            if ended:
                g.finish_G[i] = finish[row]
            g.done_G[i] = ended or end == T
            added += k
    if n != np.asarray(lengths).shape[0]:
        raise ValueError(f"the round's rollout has {lengths.shape[0]} rows; its groups hold {n}")
    return added


def training_rollout(
    groups: Sequence[PendingGroup], buckets: Sequence[int], pad_id: int
) -> Rollout:
    """The `Rollout` the update trains on: complete groups, prompts left-padded to a bucket of
    `buckets` (as a plain step pads them), the rows' tokens with their sampler log-probs, and
    their sampler's experts when every group holds them (else None)."""
    if not all(g.complete for g in groups):
        raise ValueError("training_rollout takes complete groups only")
    G = groups[0].lengths_G.shape[0]
    prompt_NP, prompt_lengths_N = bucket_and_pad([g.prompt for g in groups], buckets, pad_id, G)
    stack = lambda name: np.concatenate([getattr(g, name) for g in groups])  # noqa: E731
    lengths_N = stack("lengths_G")
    T = groups[0].tokens_GT.shape[1]
    experts = None
    if all(g.experts_GTLk is not None for g in groups):
        experts = jnp.asarray(stack("experts_GTLk"))
    return Rollout(
        prompt_NP=jnp.asarray(prompt_NP),
        prompt_lengths_N=jnp.asarray(prompt_lengths_N),
        tokens_NT=jnp.asarray(stack("tokens_GT")),
        logp_NT=jnp.asarray(stack("logp_GT")),
        mask_NT=jnp.asarray(np.arange(T)[None, :] < lengths_N[:, None]),
        injected_NT=jnp.asarray(stack("injected_GT")),
        lengths_N=jnp.asarray(lengths_N),
        finish_N=jnp.asarray(stack("finish_G")),
        experts_NTLk=experts,
    )


def lag_metrics(groups: Sequence[PendingGroup], version: int) -> dict[str, float]:
    """The version lag of the tokens trained on: the updates between the policy that sampled
    each token and `version`, the policy the update starts from. "partial/version_lag_mean"
    and "_max" over tokens, "partial/multi_round_rows": the fraction of rows decoded over more
    than one round."""
    versions = np.concatenate([g.version_GT[g.version_GT >= 0] for g in groups])
    lag = version - versions if versions.size else np.zeros(1)
    segments = np.concatenate([g.segments_G for g in groups])
    return {
        "partial/version_lag_mean": float(lag.mean()),
        "partial/version_lag_max": float(lag.max()),
        "partial/multi_round_rows": float(np.mean(segments > 1)),
    }


_FIELDS = ("tokens_GT", "logp_GT", "injected_GT", "version_GT")


def to_arrays(pending: Sequence[PendingGroup]) -> dict[str, np.ndarray]:
    """The pending groups as named arrays (for a checkpoint's JSON), columns trimmed to the
    longest row; `from_arrays` reads them back. Not their experts: L x k integers per token
    would make the JSON hundreds of times larger for a real MoE."""
    if not pending:
        return {}
    width = max(int(g.lengths_G.max()) for g in pending)
    prompts = [g.prompt for g in pending]
    longest = max(len(p) for p in prompts)
    out = {
        "example_B": np.asarray([g.example for g in pending], np.int64),
        "prompt_lengths_B": np.asarray([len(p) for p in prompts], np.int64),
        "prompts_BP": np.asarray([p + [0] * (longest - len(p)) for p in prompts], np.int64),
        "T": np.asarray(pending[0].tokens_GT.shape[1], np.int64),
    }
    for name in _FIELDS:
        out[name] = np.stack([getattr(g, name)[:, :width] for g in pending])
    for name in ("lengths_G", "finish_G", "done_G", "segments_G"):
        out[name] = np.stack([getattr(g, name) for g in pending])
    return {_PREFIX + k: v for k, v in out.items()}


def split_arrays(d: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A state dict's own entries and the pending groups' (`to_arrays`) apart."""
    own = {k: v for k, v in d.items() if not k.startswith(_PREFIX)}
    mine = {k[len(_PREFIX) :]: v for k, v in d.items() if k.startswith(_PREFIX)}
    return own, mine


def from_arrays(d: dict[str, np.ndarray], T: int, pad_id: int) -> list[PendingGroup]:
    """The pending groups `to_arrays` wrote (its entries with the prefix removed, as
    `split_arrays` returns them), for a run whose `max_new_tokens` is T.

    Raises:
      ValueError: when they were generated for another T.
    """
    if not d:
        return []
    if int(d["T"]) != T:
        raise ValueError(
            f"the checkpoint's pending rows were generated with max_new_tokens={int(d['T'])}; "
            f"this run has {T}"
        )
    out = []
    for b, example in enumerate(d["example_B"]):
        prompt = d["prompts_BP"][b, : d["prompt_lengths_B"][b]].tolist()
        G, width = d["tokens_GT"][b].shape
        g = new_group(int(example), prompt, G, T, pad_id)
        for name in _FIELDS:
            getattr(g, name)[:, :width] = d[name][b]
        for name in ("lengths_G", "finish_G", "done_G", "segments_G"):
            getattr(g, name)[:] = d[name][b]
        out.append(g)
    return out
