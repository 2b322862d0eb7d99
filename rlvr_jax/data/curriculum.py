"""Which prompts to train on next: curriculum and epoch samplers, and DAPO dynamic sampling.

Host code. A sampler is a small static object over a fixed list of examples; what changes from
step to step is a `SamplerState` (numpy arrays and integers, the numpy Generator state included),
so that `state_dict` / `load_state_dict` checkpoint it and a resumed run draws exactly the batches
the uninterrupted run would have drawn.

    sampler = CurriculumSampler(examples, CurriculumConfig())
    state = sampler.init(seed)
    state, idx_B = sampler.next(state, B)           # indices into `examples`
    ...                                             # rollout, verify
    state = sampler.update(state, ids_B, correct_BG)

- `CurriculumSampler`: Kimi k1.5's prioritized sampling, prompt i drawn with weight
  max(1 - s_i, floor) where s_i is its success rate so far (a configurable prior before its first
  attempt); optionally easy to hard, by `Example.difficulty`, advancing a level once the current
  level's success rate passes a threshold (and going back one when it falls below another).
- `EpochSampler`: every example once per epoch, in order or in a seeded shuffle per epoch.
- `filter_groups` / `fill_batch`: DAPO's dynamic sampling, dropping groups whose rewards are all
  equal (zero advantage, no gradient) and drawing more until the batch is full, with a bound.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np

from rlvr_jax.data.datasets import Example

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class SamplerState:
    """Everything a sampler changes; P is the number of examples.

    Attributes:
      attempts_P: samples verified per prompt.
      successes_P: their summed success (1 per correct sample; fractional credit allowed).
      rate_P: the exponential moving average of each prompt's per-step success rate (curriculum
        with `ema > 0`); 0 before the first attempt.
      level: index of the hardest difficulty level in play (ordered curriculum), else 0; with
        per-source levels, the lowest of `source_levels`.
      epoch: epochs completed (epoch sampler).
      position: the next position in this epoch's order (epoch sampler).
      steps: calls of `next` so far.
      seed: the seed given to `init`.
      rng_state: JSON of the numpy bit generator's state (curriculum draws).
      source_levels: with per-source levels (`CurriculumConfig.per_source`), the index of each
        source's hardest level in play, in the order of `CurriculumSampler.sources`; else ().
    """

    attempts_P: np.ndarray
    successes_P: np.ndarray
    rate_P: np.ndarray
    level: int
    epoch: int
    position: int
    steps: int
    seed: int
    rng_state: str
    source_levels: tuple[int, ...] = ()


class PromptSampler(Protocol):
    """The interface the train loop uses; both samplers implement it."""

    ids: tuple[str, ...]

    def init(self, seed: int) -> SamplerState: ...

    def next(self, state: SamplerState, batch_size: int) -> tuple[SamplerState, np.ndarray]: ...

    def update(self, state: SamplerState, ids: Sequence[str], success_BG: Any) -> SamplerState: ...

    def state_dict(self, state: SamplerState) -> dict[str, np.ndarray]: ...

    def load_state_dict(self, d: dict[str, Any]) -> SamplerState: ...


# ---------------------------------------------------------------------------------------------
# Shared: per-prompt success statistics and serialisation


class _Prompts:
    """The ids of a sampler's examples, their positions, and a fingerprint for checkpoints."""

    def __init__(self, examples: Sequence[Example]):
        if not examples:
            raise ValueError("a sampler needs at least one example")
        self.ids = tuple(ex.id for ex in examples)
        self.index = {}
        for i, id_ in enumerate(self.ids):
            if id_ in self.index:
                raise ValueError(
                    f"example id {id_!r} appears twice (positions {self.index[id_]}, {i})"
                )
            self.index[id_] = i
        self.fingerprint = hashlib.sha256("\n".join(self.ids).encode()).digest()

    def positions(self, ids: Sequence[str]) -> np.ndarray:
        try:
            return np.asarray([self.index[i] for i in ids], np.int64)
        except KeyError as e:
            raise ValueError(f"example id {e.args[0]!r} is not one this sampler draws from") from e

    def new_state(self, seed: int, rng: np.random.Generator | None = None) -> SamplerState:
        P = len(self.ids)
        rng_state = json.dumps(rng.bit_generator.state) if rng is not None else ""
        return SamplerState(
            attempts_P=np.zeros((P,), np.int64),
            successes_P=np.zeros((P,), np.float64),
            rate_P=np.zeros((P,), np.float64),
            level=0,
            epoch=0,
            position=0,
            steps=0,
            seed=int(seed),
            rng_state=rng_state,
        )

    def record(
        self, state: SamplerState, ids: Sequence[str], success_BG: Any, ema: float
    ) -> SamplerState:
        """Adds one step's groups to the counts (and the moving average when `ema > 0`)."""
        s = np.asarray(success_BG, np.float64)
        if s.ndim != 2 or s.shape[0] != len(ids):
            raise ValueError(
                f"success_BG has shape {s.shape}; expected ({len(ids)}, G) for {len(ids)} ids"
            )
        if not np.all((s >= 0) & (s <= 1)):
            raise ValueError(f"success_BG holds values outside [0, 1]: {s[(s < 0) | (s > 1)][:5]}")
        idx = self.positions(ids)
        attempts, successes = state.attempts_P.copy(), state.successes_P.copy()
        rate = state.rate_P.copy()
        # Sequential so that a prompt drawn twice in one batch counts (and averages) twice.
        for i, row in zip(idx, s, strict=True):
            step_rate = float(row.mean()) if row.size else 0.0
            rate[i] = step_rate if attempts[i] == 0 else (1 - ema) * rate[i] + ema * step_rate
            attempts[i] += row.size
            successes[i] += float(row.sum())
        return dataclasses.replace(state, attempts_P=attempts, successes_P=successes, rate_P=rate)

    def state_dict(self, state: SamplerState) -> dict[str, np.ndarray]:
        counters = [state.level, state.epoch, state.position, state.steps, state.seed]
        return {
            "attempts_P": state.attempts_P.copy(),
            "successes_P": state.successes_P.copy(),
            "rate_P": state.rate_P.copy(),
            "counters": np.asarray(counters, np.int64),
            "rng_state": np.frombuffer(state.rng_state.encode(), np.uint8).copy(),
            "fingerprint": np.frombuffer(self.fingerprint, np.uint8).copy(),
            "source_levels": np.asarray(state.source_levels, np.int64),
        }

    def load_state_dict(self, d: dict[str, Any]) -> SamplerState:
        missing = {"attempts_P", "successes_P", "rate_P", "counters", "rng_state", "fingerprint"}
        missing -= set(d)
        if missing:
            raise ValueError(f"sampler state is missing {sorted(missing)}")
        if bytes(np.asarray(d["fingerprint"], np.uint8)) != self.fingerprint:
            raise ValueError(
                "sampler state was saved for a different list of examples (ids differ); "
                f"this sampler has {len(self.ids)} examples, the state "
                f"{np.asarray(d['attempts_P']).shape[0]}"
            )
        level, epoch, position, steps, seed = (int(x) for x in np.asarray(d["counters"]))
        return SamplerState(
            attempts_P=np.asarray(d["attempts_P"], np.int64).copy(),
            successes_P=np.asarray(d["successes_P"], np.float64).copy(),
            rate_P=np.asarray(d["rate_P"], np.float64).copy(),
            level=level,
            epoch=epoch,
            position=position,
            steps=steps,
            seed=seed,
            rng_state=bytes(np.asarray(d["rng_state"], np.uint8)).decode(),
            source_levels=tuple(int(x) for x in np.asarray(d.get("source_levels", ()))),
        )


def state_to_json(state_dict: dict[str, np.ndarray]) -> str:
    """A `state_dict` as JSON text (exact: integers and float64 round-trip)."""
    return json.dumps(
        {k: {"dtype": str(v.dtype), "data": v.tolist()} for k, v in state_dict.items()}
    )


def state_from_json(text: str) -> dict[str, np.ndarray]:
    """The `state_dict` that `state_to_json` wrote."""
    return {k: np.asarray(v["data"], v["dtype"]) for k, v in json.loads(text).items()}


def summary_stats(state: SamplerState) -> dict[str, float]:
    """Host metrics of a sampler state: coverage, mean success, solved/unsolved fractions."""
    seen = state.attempts_P > 0
    rate = np.where(seen, state.successes_P / np.maximum(state.attempts_P, 1), 0.0)
    n_seen = int(seen.sum())
    return {
        "curriculum/seen_fraction": n_seen / seen.size,
        "curriculum/mean_success": float(rate[seen].mean()) if n_seen else 0.0,
        "curriculum/solved_fraction": float(np.mean(seen & (rate >= 1.0))),
        "curriculum/unsolved_fraction": float(np.mean(seen & (rate <= 0.0))),
        "curriculum/level": float(state.level),
        "curriculum/epoch": float(state.epoch),
    }


# ---------------------------------------------------------------------------------------------
# Curriculum sampler


@dataclasses.dataclass(frozen=True)
class CurriculumConfig:
    """Settings of `CurriculumSampler`.

    Attributes:
      prior_success: the success rate assumed for a prompt never attempted.
      floor: the smallest weight (a solved prompt keeps probability floor / total weight).
      ema: 0 uses the cumulative rate successes / attempts; a value in (0, 1] uses a moving
        average of per-step rates, rate <- (1 - ema) * rate + ema * step_rate, which forgets
        early failures as the policy improves.
      ordered: easy to hard by `Example.difficulty` (each distinct value is a level).
      per_source: an ordered curriculum keeps one level per `Example.source` (each task of a mix
        opens and closes its own levels, on the success rate of its own prompts); False: one
        level shared by all.
      advance_threshold: an ordered curriculum opens the next level once the mean success rate of
        the attempted prompts of the current level reaches this.
      advance_min_attempted: ... and at least this fraction of the current level's prompts has
        been attempted.
      retreat_threshold: an ordered curriculum closes its hardest level again (back to the one
        below) when that level's mean success rate, over the same attempted prompts, is below
        this; 0 never goes back. With `ema > 0` the rates follow the policy, so the level moves
        up and down with it; keep it well below `advance_threshold`.
      replace: draw a batch with replacement (a prompt may appear twice in one batch).
    """

    prior_success: float = 0.5
    floor: float = 0.05
    ema: float = 0.0
    ordered: bool = False
    per_source: bool = False
    advance_threshold: float = 0.7
    advance_min_attempted: float = 0.5
    retreat_threshold: float = 0.0
    replace: bool = False

    def __post_init__(self):
        names = ("prior_success", "advance_threshold", "advance_min_attempted", "ema")
        for name in (*names, "retreat_threshold"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"curriculum.{name}={getattr(self, name)} must be in [0, 1]")
        if not 0.0 < self.floor <= 1.0:
            raise ValueError(f"curriculum.floor={self.floor} must be in (0, 1]")
        if self.per_source and not self.ordered:
            raise ValueError("curriculum.per_source=True needs curriculum.ordered=True")
        if self.retreat_threshold and self.retreat_threshold >= self.advance_threshold:
            raise ValueError(
                f"curriculum.retreat_threshold={self.retreat_threshold} must be below "
                f"advance_threshold={self.advance_threshold}"
            )


class CurriculumSampler:
    """Prioritized sampling by 1 - success rate (Kimi k1.5), optionally easy to hard."""

    def __init__(self, examples: Sequence[Example], config: CurriculumConfig | None = None):
        """Builds the sampler.

        Args:
          examples: the prompts to draw from (ids unique; difficulties set if `ordered`).
          config: the settings; None for the defaults.

        Raises:
          ValueError: for duplicate ids, or an ordered curriculum with an example that has no
            difficulty (named).
        """
        config = config or CurriculumConfig()
        self._prompts = _Prompts(examples)
        self.ids = self._prompts.ids
        self.config = config
        # Per-source levels: `sources` (sorted), each example's source index and level index
        # within its source's own difficulties; shared levels: one source "" over all examples.
        self.sources: tuple[str, ...] = ("",)
        self.source_P = np.zeros((len(examples),), np.int64)
        self.levels: tuple[float, ...] = ()
        self.level_P = np.zeros((len(examples),), np.int64)
        self.source_levels: dict[str, tuple[float, ...]] = {}
        if config.ordered:
            missing = next((ex.id for ex in examples if ex.difficulty is None), None)
            if missing is not None:
                raise ValueError(f"ordered curriculum: example {missing!r} has no difficulty")
            self.levels = tuple(sorted({float(ex.difficulty) for ex in examples}))
            if config.per_source:
                self.sources = tuple(sorted({ex.source for ex in examples}))
            of_source = {name: k for k, name in enumerate(self.sources)}
            key = (lambda ex: ex.source) if config.per_source else (lambda ex: "")
            self.source_P = np.asarray([of_source[key(ex)] for ex in examples], np.int64)
            for name in self.sources:
                diffs = {float(ex.difficulty) for ex in examples if key(ex) == name}
                self.source_levels[name] = tuple(sorted(diffs))
            self.level_P = np.asarray(
                [self.source_levels[key(ex)].index(float(ex.difficulty)) for ex in examples],
                np.int64,
            )
        self._top_S = np.asarray([len(self.source_levels.get(n, (0,))) - 1 for n in self.sources])

    def init(self, seed: int) -> SamplerState:
        """The state before any draw."""
        state = self._prompts.new_state(seed, np.random.default_rng(seed))
        if self.config.per_source:
            state = dataclasses.replace(state, source_levels=(0,) * len(self.sources))
        return state

    def level_metrics(self, state: SamplerState) -> dict[str, float]:
        """With per-source levels, "curriculum/<source>/level": the difficulty (the
        `Example.difficulty` value, not its index) of each source's hardest level in play."""
        if not self.config.per_source:
            return {}
        return {
            f"curriculum/{name}/level": self.source_levels[name][k]
            for name, k in zip(self.sources, self._levels_S(state), strict=True)
        }

    def _levels_S(self, state: SamplerState) -> np.ndarray:
        if not self.config.per_source:
            return np.asarray([state.level], np.int64)
        if len(state.source_levels) != len(self.sources):
            raise ValueError(
                f"sampler state has {len(state.source_levels)} source levels; this curriculum has "
                f"{len(self.sources)} sources {self.sources}"
            )
        return np.asarray(state.source_levels, np.int64)

    def _with_levels(self, state: SamplerState, levels_S: np.ndarray) -> SamplerState:
        if not self.config.per_source:
            return dataclasses.replace(state, level=int(levels_S[0]))
        levels = tuple(int(x) for x in levels_S)
        return dataclasses.replace(state, level=min(levels), source_levels=levels)

    def success_rates(self, state: SamplerState) -> np.ndarray:
        """rate_P: the success rate each weight uses (the prior where never attempted)."""
        seen = state.attempts_P > 0
        if self.config.ema > 0:
            rate = state.rate_P
        else:
            rate = state.successes_P / np.maximum(state.attempts_P, 1)
        return np.where(seen, rate, self.config.prior_success)

    def _in_play(self, state: SamplerState, batch_size: int) -> np.ndarray:
        """Which prompts may be drawn: those at or below their source's level, the lowest
        level that can rise raised (for this draw only) until enough prompts are eligible."""
        levels = self._levels_S(state).copy()
        while True:
            in_play = self.level_P <= levels[self.source_P]
            can_rise = levels < self._top_S
            if self.config.replace or in_play.sum() >= batch_size or not can_rise.any():
                return in_play
            levels[np.flatnonzero(can_rise)[np.argmin(levels[can_rise])]] += 1

    def weights(self, state: SamplerState, batch_size: int = 1) -> np.ndarray:
        """w_P = max(1 - rate, floor) for prompts in play, 0 for levels not yet open."""
        w = np.maximum(1.0 - self.success_rates(state), self.config.floor)
        return np.where(self._in_play(state, batch_size), w, 0.0)

    def next(self, state: SamplerState, batch_size: int) -> tuple[SamplerState, np.ndarray]:
        """Draws `batch_size` prompt indices with probability proportional to `weights`.

        Raises:
          ValueError: when drawing without replacement from fewer prompts than `batch_size`.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be at least 1")
        w = self.weights(state, batch_size)
        eligible = int(np.count_nonzero(w))
        if not self.config.replace and eligible < batch_size:
            raise ValueError(
                f"cannot draw {batch_size} distinct prompts from {eligible}; use a smaller batch "
                "or CurriculumConfig(replace=True)"
            )
        rng = np.random.default_rng()
        rng.bit_generator.state = json.loads(state.rng_state)
        idx = rng.choice(w.size, size=batch_size, replace=self.config.replace, p=w / w.sum())
        new = dataclasses.replace(
            state, steps=state.steps + 1, rng_state=json.dumps(rng.bit_generator.state)
        )
        return new, np.asarray(idx, np.int64)

    def update(self, state: SamplerState, ids: Sequence[str], success_BG: Any) -> SamplerState:
        """Records one step's groups and, for an ordered curriculum, maybe opens the next level
        (or, with `retreat_threshold`, closes the current one).

        Args:
          state: the current state.
          ids: the example id of each group (B).
          success_BG: per sample success in [0, 1] (the verifier's `correct`), shape (B, G).
        """
        state = self._prompts.record(state, ids, success_BG, self.config.ema)
        if not self.config.ordered or len(self.levels) < 2:
            return state
        levels = self._levels_S(state).copy()
        rates = self.success_rates(state)
        for k, level in enumerate(levels.tolist()):
            current = (self.source_P == k) & (self.level_P == level)
            attempted = current & (state.attempts_P > 0)
            needed = math.ceil(self.config.advance_min_attempted * int(current.sum()))
            if attempted.sum() < max(needed, 1):
                continue
            level_rate = float(rates[attempted].mean())
            if level_rate >= self.config.advance_threshold and level < self._top_S[k]:
                levels[k] += 1
            elif level_rate < self.config.retreat_threshold and level > 0:
                levels[k] -= 1
        return self._with_levels(state, levels)

    def state_dict(self, state: SamplerState) -> dict[str, np.ndarray]:
        """The state as numpy arrays (for a checkpoint; `state_to_json` for text)."""
        return self._prompts.state_dict(state)

    def load_state_dict(self, d: dict[str, Any]) -> SamplerState:
        """The state `state_dict` saved.

        Raises:
          ValueError: when it was saved for a different list of examples.
        """
        return self._prompts.load_state_dict(d)


# ---------------------------------------------------------------------------------------------
# Epoch sampler


class EpochSampler:
    """Every example once per epoch, in file order or in a fresh seeded shuffle each epoch.

    A batch that crosses the end of an epoch takes the rest of it and the start of the next. The
    order of epoch e is a function of (seed, e), so the state is just (epoch, position). It keeps
    the same success statistics as the curriculum, for metrics.
    """

    def __init__(self, examples: Sequence[Example], shuffle: bool = True):
        self._prompts = _Prompts(examples)
        self.ids = self._prompts.ids
        self.shuffle = shuffle

    def init(self, seed: int) -> SamplerState:
        """The state before any draw."""
        return self._prompts.new_state(seed)

    def order(self, seed: int, epoch: int) -> np.ndarray:
        """The example order of one epoch."""
        P = len(self.ids)
        if not self.shuffle:
            return np.arange(P, dtype=np.int64)
        return np.random.default_rng([seed, epoch]).permutation(P).astype(np.int64)

    def next(self, state: SamplerState, batch_size: int) -> tuple[SamplerState, np.ndarray]:
        """The next `batch_size` indices in epoch order."""
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be at least 1")
        P = len(self.ids)
        out, epoch, position = [], state.epoch, state.position
        while len(out) < batch_size:
            take = min(batch_size - len(out), P - position)
            out.extend(self.order(state.seed, epoch)[position : position + take].tolist())
            position += take
            if position == P:
                epoch, position = epoch + 1, 0
        new = dataclasses.replace(state, epoch=epoch, position=position, steps=state.steps + 1)
        return new, np.asarray(out, np.int64)

    def update(self, state: SamplerState, ids: Sequence[str], success_BG: Any) -> SamplerState:
        """Records one step's groups (for metrics; the order does not depend on them)."""
        return self._prompts.record(state, ids, success_BG, ema=0.0)

    def state_dict(self, state: SamplerState) -> dict[str, np.ndarray]:
        """See `CurriculumSampler.state_dict`."""
        return self._prompts.state_dict(state)

    def load_state_dict(self, d: dict[str, Any]) -> SamplerState:
        """See `CurriculumSampler.load_state_dict`."""
        return self._prompts.load_state_dict(d)


# ---------------------------------------------------------------------------------------------
# Dynamic sampling (DAPO)


def filter_groups(rewards_BG: Any, atol: float = 0.0) -> tuple[np.ndarray, dict[str, int]]:
    """Which groups carry a learning signal: those whose rewards are not all equal.

    A group with zero reward variance gets zero advantage under any group baseline, so it adds
    nothing to the gradient but dilutes a token-mean loss.

    Args:
      rewards_BG: rewards of B groups of G samples.
      atol: groups whose max - min is at most this count as constant.

    Returns:
      (keep_B bool, {"groups", "kept", "dropped"}).
    """
    r = np.asarray(rewards_BG, np.float64)
    if r.ndim != 2:
        raise ValueError(f"rewards_BG has shape {r.shape}; expected (B, G)")
    if r.shape[1]:
        keep = (r.max(axis=1) - r.min(axis=1)) > atol
    else:
        keep = np.zeros((r.shape[0],), bool)
    n_kept = int(keep.sum())
    return keep, {"groups": r.shape[0], "kept": n_kept, "dropped": r.shape[0] - n_kept}


@dataclasses.dataclass(frozen=True)
class FillStats:
    """What `fill_batch` did.

    Attributes:
      rounds: calls of `produce`.
      generated: groups produced in all.
      kept: groups with reward variance among them (extras beyond the batch included).
      dropped: zero-variance groups among them.
      padded: zero-variance groups put back to fill the batch after the last round.
      full: whether the returned batch has `batch_size` groups.
    """

    rounds: int
    generated: int
    kept: int
    dropped: int
    padded: int
    full: bool

    def as_metrics(self) -> dict[str, float]:
        return {f"dynamic_sampling/{k}": float(v) for k, v in dataclasses.asdict(self).items()}


def fill_batch(
    produce: Callable[[int], tuple[Sequence[T], Any]],
    batch_size: int,
    max_rounds: int,
    pad_with_dropped: bool = True,
    atol: float = 0.0,
) -> tuple[list[T], np.ndarray, FillStats]:
    """DAPO's dynamic sampling: keeps groups with reward variance, drawing more until full.

    Args:
      produce: `produce(num_groups_wanted) -> (groups, rewards_BG)`: samples and verifies more
        groups (it may return more or fewer than asked); `groups` is any per-group payload.
      batch_size: groups wanted.
      max_rounds: the most calls of `produce` (the first included).
      pad_with_dropped: when the rounds run out, fill the batch with dropped groups (first
        produced first), so the batch keeps its static shape; their advantage is zero.
      atol: see `filter_groups`.

    Returns:
      (groups, rewards_BG of those groups, stats); at most `batch_size` groups, kept ones first
      in the order produced.
    """
    if batch_size < 1 or max_rounds < 1:
        raise ValueError(f"batch_size={batch_size} and max_rounds={max_rounds} must be >= 1")
    kept: list[tuple[T, np.ndarray]] = []
    dropped: list[tuple[T, np.ndarray]] = []
    rounds = generated = 0
    G = None
    while len(kept) < batch_size and rounds < max_rounds:
        groups, rewards = produce(batch_size - len(kept))
        rounds += 1
        r = np.asarray(rewards, np.float64)
        if r.ndim != 2 or r.shape[0] != len(groups):
            raise ValueError(
                f"round {rounds}: produce returned {len(groups)} groups and rewards of shape "
                f"{r.shape}; expected ({len(groups)}, G)"
            )
        if G is not None and r.shape[1] != G and r.shape[0]:
            raise ValueError(f"round {rounds}: group size {r.shape[1]} differs from {G}")
        G = r.shape[1] if r.shape[0] else G
        keep, _ = filter_groups(r, atol)
        generated += len(groups)
        for g, row, k in zip(groups, r, keep, strict=True):
            (kept if k else dropped).append((g, row))
    n_kept, n_dropped = len(kept), len(dropped)
    out = kept[:batch_size]
    padded = 0
    if pad_with_dropped and len(out) < batch_size:
        padded = min(batch_size - len(out), len(dropped))
        out += dropped[:padded]
    rewards_BG = np.stack([row for _, row in out]) if out else np.zeros((0, G or 0))
    stats = FillStats(rounds, generated, n_kept, n_dropped, padded, len(out) == batch_size)
    return [g for g, _ in out], rewards_BG, stats
