"""Verified useful trajectories: what an RLVR step produced that the update could learn from.

Raw throughput (tokens per second) counts rows that teach nothing: a group of G samples whose
verifier rewards are all equal has zero advantage under every group baseline, so under GRPO it
costs its rollout, its verification and its update and gives no gradient. What counts is the
useful trajectories per unit of cost. Each RL step logs, under the prefix "useful/":

- `TRAJECTORIES` ("useful/trajectories"): the rows the update trained on whose group's verifier
  rewards are not all equal (std > 0), G per such group (`rl.outputs.useful_rows`, computed in
  the train program). Under dynamic sampling only the groups trained on count (the kept ones
  and any topped-up ones, which add nothing); a row counts in the step that trains on it.
- `VERIFIED` ("useful/verified"): the rows whose reward the step computed. Under dynamic
  sampling every round's rows, kept or dropped; with partial rollouts the rows of the groups
  the step verified and trained on (a row counts once, in the step that takes its finished
  group, not in the steps that generate its segments); for multi-turn tasks one row per
  episode.
- `TOKENS` ("useful/tokens"): the tokens the policy sampled this step: every dynamic-sampling
  round's; with partial rollouts every round's new tokens of the rows still running (rows that
  finish in a later step included); a multi-turn row's own tokens without its tool
  observations (`rl.outputs.sampled_tokens`).
- `FRACTION` ("useful/fraction"): useful / verified, the share of the verifier's work that
  reached the gradient.
- `PER_HOUR` ("useful/per_hour"): useful trajectories per hour of the step's wall time
  ("time/step", which a first step's compilation inflates).
- `PER_1K_TOKENS` ("useful/per_1k_tokens"): useful trajectories per 1,000 sampled tokens.

A rate whose denominator is 0 is NaN (written as null), as the ledger's other throughputs.
`run_per_hour` is a whole run's rate, from its ledger, for the study tables. Host code.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlvr_jax.program.runtime import metrics
from rlvr_jax.rl.outputs import USEFUL_TRAJECTORIES

TRAJECTORIES = USEFUL_TRAJECTORIES
VERIFIED = "useful/verified"
TOKENS = "useful/tokens"
FRACTION = "useful/fraction"
PER_HOUR = "useful/per_hour"
PER_1K_TOKENS = "useful/per_1k_tokens"


def _ratio(numerator: float, denominator: float, scale: float = 1.0) -> float:
    """scale * numerator / denominator; NaN when the denominator is not positive."""
    if not denominator > 0:
        return math.nan
    return scale * float(numerator) / float(denominator)


def step_counts(verified: float, tokens: float) -> dict[str, float]:
    """A step's `VERIFIED` and `TOKENS`, as its batch function reports them."""
    return {VERIFIED: float(verified), TOKENS: float(tokens)}


def rates(trajectories: float, verified: float, tokens: float, seconds: float) -> dict[str, float]:
    """A step's useful-trajectory rates.

    Args:
      trajectories: the step's useful trajectories (`TRAJECTORIES`).
      verified: the rows it verified (`VERIFIED`).
      tokens: the tokens it sampled (`TOKENS`).
      seconds: its wall time ("time/step").

    Returns:
      {`FRACTION`, `PER_HOUR`, `PER_1K_TOKENS`}, NaN where the denominator is 0.
    """
    return {
        FRACTION: _ratio(trajectories, verified),
        PER_HOUR: _ratio(trajectories, seconds, 3600.0),
        PER_1K_TOKENS: _ratio(trajectories, tokens, 1000.0),
    }


def step_rates(step_metrics: Mapping[str, Any]) -> dict[str, float]:
    """`rates` of a step's metrics (which hold `TRAJECTORIES`, `VERIFIED`, `TOKENS` and
    "time/step"); {} when one of them is missing."""
    keys = (TRAJECTORIES, VERIFIED, TOKENS, metrics.STEP_TIME)
    if any(k not in step_metrics for k in keys):
        return {}
    return rates(*(float(step_metrics[k]) for k in keys))


def run_per_hour(records: Sequence[Mapping[str, Any]]) -> float:
    """A run's useful trajectories per hour of step time: the sum of `TRAJECTORIES` over the
    sum of "time/step", over the step rows that hold both, step 1 (which carries the
    compilation) left out when there are others. NaN when no step row holds them (a run from
    before the metric, an SFT stage).

    Args:
      records: the run's `metrics.read_metrics` records (only the step rows are used).
    """
    rows = [
        r
        for r in metrics.step_rows(records)
        if r.get(TRAJECTORIES) is not None and r.get(metrics.STEP_TIME) is not None
    ]
    if len(rows) > 1:
        rows = [r for r in rows if r["step"] > 1] or rows
    useful = np.sum([r[TRAJECTORIES] for r in rows])
    seconds = np.sum([r[metrics.STEP_TIME] for r in rows])
    return _ratio(useful, seconds, 3600.0)
