"""Multi-turn rollouts with tool calls: one episode per row, one row per trajectory.

The rounds of Kimi's partial rollouts (`rl.partial`), with turns: every round re-prefills each
row's context (prompt and tokens so far) and decodes at most K more tokens (the decode function's
`max_new_tokens`); `partial.absorb` splices them in. A row whose turn ended on a stop sequence
(the end of a tool call, `</tool_call>`) goes to its environment (`envs.environment`), which runs
the tool on the host; its observation, wrapped as the chat template's tool-response turn
(`ToolResponseFormat`), is appended to the row as injected tokens (context, not trained on:
log-prob 0, `injected_NT` set, so `rl.rows` leaves them out of the loss and out of the MoE
routing metrics; an MoE sampler's experts, `Rollout.experts_NTLk`, are kept for the sampled
tokens only), and the row decodes on in the next round. A turn that used the K tokens without
a stop runs on in the next round too. A row ends when:

* it samples an end id (the model closed its turn: the environment scores the final answer);
* its environment says the episode is done;
* its tokens reach `max_new_tokens` (T, sampled and observation tokens together; an observation
  that does not fit is dropped) -- truncated, "tokens";
* a tool call would start turn `max_turns + 1` -- truncated, "turns" (the tool does not run);
* the wall time passes `time_budget_s` -- truncated, "time" (checked between rounds);
* its environment's step raises (a tool's own exceptions are failed calls the environment
  answers, `envs.environment`): the episode ends with the parts of a cut one and one failed
  tool call, and the rollout goes on.

The tokens a row holds where it sampled are the ids the sampler returned, spliced as they came:
model text is decoded (for the environment) but never encoded again; only observations are
encoded. Tools run in a thread pool, so one row's slow tool does not hold up the others'. With
`overlap_tools` the next round starts without waiting for them: rows whose tool is still running
sit the round out (their slots decode and are discarded, as the shapes are fixed) and rejoin once
it returns, so tool time overlaps decode time at the granularity of rounds; which round a row
rejoins in then depends on timing, so its samples do too. Without it every round waits for its
tools (reproducible).

Limits: a stop sequence of several tokens that straddles two rounds is not matched (as in
`rl.partial`); a row that ended, or waits for its tool, still fills its slot in each round.

Host code around a jitted decode function; `sampler_decode` makes one from `sample`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from rlvr_jax.data.example import Example
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs.environment import Environment, StepResult, ToolResponseFormat
from rlvr_jax.envs.task import MultiTurnTask
from rlvr_jax.model import sharding, transformer
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.rl import partial as partial_lib
from rlvr_jax.rl import sharding_plan
from rlvr_jax.rl import train_step as ts
from rlvr_jax.rl.config import RLConfig
from rlvr_jax.sampling.config import SamplerConfig, SamplingParams
from rlvr_jax.sampling.host import bucket_and_pad
from rlvr_jax.sampling.loop import sample
from rlvr_jax.types import FINISH_EOS, FINISH_LENGTH, FINISH_STOP, Rollout

# decode(contexts) -> a Rollout of len(contexts) rows, at most K new tokens each.
DecodeFn = Callable[[list[list[int]]], Rollout]

TRUNCATIONS = ("none", "tokens", "turns", "time")
NOT_TRUNCATED, TRUNC_TOKENS, TRUNC_TURNS, TRUNC_TIME = range(4)


@dataclasses.dataclass(frozen=True)
class EpisodeConfig:
    """Budgets of a multi-turn rollout.

    Attributes:
      max_new_tokens: T, tokens per row after its prompt, sampled and observations together.
      max_turns: model turns per episode (tool-call turns and the final answer).
      time_budget_s: wall time of the whole rollout; rows still running after it are cut.
        inf: none.
      tool_workers: threads that run tools (environment steps) concurrently.
      overlap_tools: start the next round without waiting for running tools (module docstring).
      response_format: how observations are wrapped.
    """

    max_new_tokens: int
    max_turns: int = 4
    time_budget_s: float = math.inf
    tool_workers: int = 8
    overlap_tools: bool = False
    response_format: ToolResponseFormat = ToolResponseFormat()

    def __post_init__(self):
        if self.max_new_tokens < 1 or self.max_turns < 1 or self.tool_workers < 1:
            raise ValueError(
                f"max_new_tokens={self.max_new_tokens}, max_turns={self.max_turns} and "
                f"tool_workers={self.tool_workers} must be at least 1"
            )
        if not self.time_budget_s > 0:
            raise ValueError(f"time_budget_s={self.time_budget_s} must be positive")


@dataclasses.dataclass
class EpisodeStats:
    """Per-row episode counts (N rows) and the rollout's timings.

    Attributes:
      turns_N: model turns (tool calls and the final answer; a cut turn counts).
      tool_calls_N, tool_errors_N: as the environments reported them.
      tool_seconds_N: wall time of the row's environment steps (tools, scoring).
      truncated_N: a `TRUNCATIONS` index: why a budget ended the row (0: it was not cut).
      observation_tokens_N: tokens appended as observations.
      parts: the episodes' reward parts, (N,) f32 each.
      decode_seconds: wall time in the decode function.
      tool_wait_seconds: wall time the rounds waited for tools (tool time not overlapped).
      rounds: decode calls.
    """

    turns_N: np.ndarray
    tool_calls_N: np.ndarray
    tool_errors_N: np.ndarray
    tool_seconds_N: np.ndarray
    truncated_N: np.ndarray
    observation_tokens_N: np.ndarray
    parts: dict[str, np.ndarray]
    decode_seconds: float = 0.0
    tool_wait_seconds: float = 0.0
    rounds: int = 0

    def metrics(self) -> dict[str, float]:
        """Means per episode and the rollout's timings, for the metrics ledger."""
        out = {
            "episode/turns": float(self.turns_N.mean()),
            "episode/tool_calls": float(self.tool_calls_N.mean()),
            "episode/tool_errors": float(self.tool_errors_N.mean()),
            "episode/observation_tokens": float(self.observation_tokens_N.mean()),
            "episode/tool_seconds": float(self.tool_seconds_N.sum()),
            "episode/tool_wait_seconds": self.tool_wait_seconds,
            "episode/decode_seconds": self.decode_seconds,
            "episode/rounds": float(self.rounds),
        }
        for code, name in enumerate(TRUNCATIONS[1:], start=1):
            out[f"episode/truncated_{name}"] = float(np.mean(self.truncated_N == code))
        return out


@dataclasses.dataclass
class _Row:
    """One episode's host state besides its tokens (which live in its `PendingGroup`)."""

    env: Environment
    group: partial_lib.PendingGroup
    i: int
    turn_start: int = 0
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_seconds: float = 0.0
    observation_tokens: int = 0
    truncated: int = NOT_TRUNCATED
    parts: dict[str, float] = dataclasses.field(default_factory=dict)
    future: concurrent.futures.Future | None = None

    @property
    def done(self) -> bool:
        return bool(self.group.done_G[self.i])

    def end(self, finish: int, truncated: int = NOT_TRUNCATED) -> None:
        self.group.done_G[self.i] = True
        self.group.finish_G[self.i] = finish
        self.truncated = truncated
        if truncated:
            self.parts = dict(self.env.truncate())


def _timed_step(env: Environment, text: str) -> tuple[StepResult, float]:
    start = time.perf_counter()
    try:
        result = env.step(text)
    except Exception as e:  # a failed step is a failed tool call, never a crashed rollout
        result = _failed_step(env, e)
    return result, time.perf_counter() - start


def _failed_step(env: Environment, error: Exception) -> StepResult:
    """An environment whose step raised: the episode ends there, scored as a cut one, and the
    step counts as a failed tool call (its state after the exception is unknown)."""
    logging.log_every_n_seconds(
        logging.WARNING, "an environment step failed: %s: %s", 60, type(error).__name__, error
    )
    try:
        parts = dict(env.truncate())
    except Exception:
        parts = {"correct": 0.0}
    observation = f"Error: the environment failed: {type(error).__name__}"
    return StepResult(observation, True, parts, tool_calls=1, tool_errors=1)


def _apply(
    row: _Row,
    result: StepResult,
    seconds: float,
    tok: Tokenizer,
    cfg: EpisodeConfig,
    version: int,
    timed_out: bool,
) -> None:
    """Takes a finished environment step into the row: ends it, or appends the observation."""
    g, i = row.group, row.i
    row.tool_calls += result.tool_calls
    row.tool_errors += result.tool_errors
    row.tool_seconds += seconds
    row.parts = dict(result.parts)
    if result.done or int(g.finish_G[i]) == FINISH_EOS:
        # An end id closes the model's turn: the episode ends whatever the environment says.
        return
    if timed_out:
        return row.end(FINISH_LENGTH, TRUNC_TIME)
    obs = tok.encode(cfg.response_format.wrap(result.observation))
    start = int(g.lengths_G[i])
    if start + len(obs) >= g.tokens_GT.shape[1]:  # no room for it and one sampled token
        return row.end(FINISH_LENGTH, TRUNC_TOKENS)
    end = start + len(obs)
    g.tokens_GT[i, start:end] = obs
    g.logp_GT[i, start:end] = 0.0
    g.injected_GT[i, start:end] = True
    g.version_GT[i, start:end] = version
    if g.experts_GTLk is not None:  # not sampled: no experts (and not trained)
        g.experts_GTLk[i, start:end] = 0
    g.lengths_G[i] = end
    g.finish_G[i] = FINISH_LENGTH
    g.done_G[i] = False
    row.turn_start = end
    row.observation_tokens += len(obs)


def _turn_ended(row: _Row, tok: Tokenizer, cfg: EpisodeConfig, pool) -> None:
    """A row that `absorb` just ended: truncates it, or hands its turn to the environment."""
    g, i = row.group, row.i
    finish = int(g.finish_G[i])
    row.turns += 1
    if finish == FINISH_LENGTH:  # T reached inside the turn
        return row.end(FINISH_LENGTH, TRUNC_TOKENS)
    if finish == FINISH_STOP and row.turns >= cfg.max_turns:
        return row.end(FINISH_LENGTH, TRUNC_TURNS)
    text = tok.decode(g.tokens_GT[i, row.turn_start : g.lengths_G[i]])
    row.future = pool.submit(_timed_step, row.env, text)


def run_episodes(
    decode: DecodeFn,
    envs_N: Sequence[Environment],
    examples_B: Sequence[Example],
    tok: Tokenizer,
    cfg: EpisodeConfig,
    buckets: Sequence[int],
    pad_id: int,
    version: int = 0,
) -> tuple[Rollout, EpisodeStats]:
    """Runs N = B x G episodes to their ends (module docstring) and returns them as one rollout.

    Args:
      decode: the round's decode function; every stop sequence it matches ends a tool call.
      envs_N: one fresh environment per row, row `b * G + g` for example b.
      examples_B: the B examples; each environment's `reset` gives its prompt, which must be the
        same for the G rows of a group.
      tok: encodes prompts and observations, decodes turns for the environments.
      cfg: the budgets.
      buckets: prompt buckets of the returned rollout.
      pad_id: written after each row's end.
      version: the policy version recorded for the tokens (`rl.partial`).

    Returns:
      (rollout, stats): T = `cfg.max_new_tokens` columns; `logp_NT` the sampler's log-probs of
      the sampled tokens, 0 on observations; `injected_NT` marks observations.
    """
    groups = _reset_groups(envs_N, examples_B, tok, cfg.max_new_tokens, buckets, pad_id)
    N, G = len(envs_N), len(envs_N) // len(examples_B)
    rows = [_Row(env, groups[n // G], n % G) for n, env in enumerate(envs_N)]
    stats = EpisodeStats(*(np.zeros(N) for _ in range(6)), parts={})
    deadline = time.perf_counter() + cfg.time_budget_s
    timed_out = False

    def collect(wait: bool) -> None:
        waiting = [r for r in rows if r.future is not None]
        if not waiting:
            return
        start = time.perf_counter()
        if wait:
            concurrent.futures.wait([r.future for r in waiting])
        for r in waiting:
            if r.future.done():
                result, seconds = r.future.result()
                r.future = None
                _apply(r, result, seconds, tok, cfg, version, timed_out)
        stats.tool_wait_seconds += time.perf_counter() - start

    with concurrent.futures.ThreadPoolExecutor(cfg.tool_workers) as pool:
        while True:
            collect(wait=False)
            timed_out = time.perf_counter() > deadline
            active = [r for r in rows if not r.done and r.future is None]
            if timed_out:
                for r in active:
                    r.end(FINISH_LENGTH, TRUNC_TIME)
                collect(wait=True)
                break
            if not active:
                if all(r.future is None for r in rows):
                    break
                start = time.perf_counter()
                concurrent.futures.wait(
                    [r.future for r in rows if r.future is not None],
                    return_when=concurrent.futures.FIRST_COMPLETED,
                )
                stats.tool_wait_seconds += time.perf_counter() - start
                continue
            start = time.perf_counter()
            # Rows waiting for a tool are done in their group until it returns: absorb skips them.
            segment = jax.device_get(decode(partial_lib.contexts(groups)))
            stats.decode_seconds += time.perf_counter() - start
            stats.rounds += 1
            if not partial_lib.absorb(groups, segment, version):
                raise RuntimeError("the decode function emitted no token for any running row")
            for r in active:
                if r.done:
                    _turn_ended(r, tok, cfg, pool)
            collect(wait=not cfg.overlap_tools)

    _row_stats(stats, rows)
    return partial_lib.training_rollout(groups, buckets, pad_id), stats


def _reset_groups(
    envs_N: Sequence[Environment],
    examples_B: Sequence[Example],
    tok: Tokenizer,
    T: int,
    buckets: Sequence[int],
    pad_id: int,
) -> list[partial_lib.PendingGroup]:
    """Resets every environment on its example and returns the B groups, each with its G rows'
    shared prompt; the G environments of an example must give the same prompt, and it must fit
    the largest bucket."""
    B, N = len(examples_B), len(envs_N)
    if B == 0 or N % B:
        raise ValueError(f"{N} environments do not make groups of the {B} examples")
    G = N // B
    prompts = [env.reset(examples_B[n // G]) for n, env in enumerate(envs_N)]
    groups = []
    for b in range(B):
        if len(set(prompts[b * G : (b + 1) * G])) != 1:
            raise ValueError(f"the {G} environments of example {b} gave different prompts")
        ids = tok.encode(prompts[b * G])
        if len(ids) > max(buckets):
            raise ValueError(
                f"the environment's prompt for example {examples_B[b].id!r} has {len(ids)} "
                f"tokens, more than the largest prompt bucket {max(buckets)}"
            )
        groups.append(partial_lib.new_group(b, ids, G, T, pad_id))
    return groups


def _row_stats(stats: EpisodeStats, rows: Sequence[_Row]) -> None:
    """Writes each ended row's counts and reward parts into `stats`."""
    for n, r in enumerate(rows):
        for name, value in (
            ("turns_N", r.turns),
            ("tool_calls_N", r.tool_calls),
            ("tool_errors_N", r.tool_errors),
            ("tool_seconds_N", r.tool_seconds),
            ("truncated_N", r.truncated),
            ("observation_tokens_N", r.observation_tokens),
        ):
            getattr(stats, name)[n] = value
    names = sorted({k for r in rows for k in r.parts})
    stats.parts = {k: np.asarray([r.parts.get(k, 0.0) for r in rows], np.float32) for k in names}
    for name in ("turns_N", "tool_calls_N", "tool_errors_N", "truncated_N", "observation_tokens_N"):
        setattr(stats, name, getattr(stats, name).astype(np.int32))


def sampler_decode(
    params: transformer.Params,
    model_cfg: ModelConfig,
    cfg: SamplerConfig,
    buckets: Sequence[int],
    pad_id: int,
    rng: jax.Array,
    sp: SamplingParams | None = None,
) -> DecodeFn:
    """A decode function over `sample`, round r drawn with fold_in(rng, r).

    Contexts are left-padded to the smallest of `buckets` that holds them, or past the largest
    to a power of two (at most one program per bucket). `cfg.max_new_tokens` is K, the tokens
    per round; its `stop_sequences` end tool calls.
    """
    if cfg.prompt_group != 1:
        raise ValueError("a round's contexts differ within a group; use prompt_group=1")
    rounds = itertools.count()

    def decode(contexts: list[list[int]]) -> Rollout:
        longest = max(len(c) for c in contexts)
        sizes = tuple(buckets)
        if longest > max(sizes):
            sizes += (1 << (longest - 1).bit_length(),)
        prompt_NP, lengths_N = bucket_and_pad(contexts, sizes, pad_id)
        key = jax.random.fold_in(rng, next(rounds))
        return sample(params, prompt_NP, lengths_N, key, model_cfg, cfg, sp)

    return decode


# (params, B examples, rng) -> (rollout of B x G episodes, "episode/..." metrics)
EpisodesFn = Callable[[transformer.Params, Sequence[Example], jax.Array], tuple[Rollout, dict]]


def build_episodes(
    model_cfg: ModelConfig,
    rl: RLConfig,
    plan: sharding_plan.StepShardings,
    task: MultiTurnTask,
    buckets: Sequence[int],
    pad_id: int,
) -> EpisodesFn:
    """The RL step's multi-turn rollout: G episodes of each example, rounds decoded by the
    host-verifier path's jitted rollout (`train_step.build_rollout`, jitted here once) with
    `task.turn_tokens` tokens a round and the task's tool-call stops added to the sampler's.

    The rollout has the plain step's shapes (T = `rl.sampler.max_new_tokens`, prompts in
    `buckets`), so the update compiles once for either.
    """
    G, T = rl.group_size, rl.sampler.max_new_tokens
    K = min(task.turn_tokens or T, T)
    sampler = dataclasses.replace(
        rl.sampler,
        max_new_tokens=K,
        prompt_group=1,
        stop_sequences=(*rl.sampler.stop_sequences, *task.stop_sequences),
    )
    segment_rl = dataclasses.replace(rl, sampler=sampler, shared_prompt_forward=False)
    segment_fn = ts.build_rollout(model_cfg, segment_rl, plan)
    # Contexts grow by up to T tokens past the prompt.
    context_buckets = (*buckets, max(buckets) + T)
    cfg = EpisodeConfig(
        max_new_tokens=T,
        max_turns=task.max_turns,
        tool_workers=task.tool_workers,
        overlap_tools=task.overlap_tools,
        response_format=task.response_format,
    )

    def episodes(params, examples_B, rng):
        rounds = itertools.count()

        def decode(contexts):
            prompt_NP, lengths_N = bucket_and_pad(contexts, context_buckets, pad_id)
            batch = ts.Batch(jnp.asarray(prompt_NP), jnp.asarray(lengths_N))
            key = jax.random.fold_in(rng, next(rounds))
            return segment_fn(params, sharding.place(batch, plan.rows), key)

        envs = [task.environment() for _ in range(len(examples_B) * G)]
        rollout, stats = run_episodes(decode, envs, examples_B, task.tok, cfg, buckets, pad_id)
        return rollout, stats.metrics()

    return episodes
