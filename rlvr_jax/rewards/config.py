"""The reward section of the settings: which verifier, which shaping parts, with what weights."""

from __future__ import annotations

import dataclasses
from typing import Literal


@dataclasses.dataclass(frozen=True)
class RewardSettings:
    """Attributes:
    verifier: "arithmetic" (in JAX over tokens: the whole step is one program), "math"
      (answer extraction and equivalence on text, in a process pool with deadlines),
      "countdown" (an arithmetic expression over the given numbers, parsed without eval, in
      the pool), "code_tests" (a program run against the problem's hidden unit tests in the
      code sandbox; `data.name="humaneval"`) or "math_tool" (math with a sandboxed `python`
      tool over several turns: `envs.tool_math`, docs/agents.md; the final answer checked as
      "math" does), or "reasoning_gym" (a reasoning-gym task's own scorer, in the pool or, for
      scorers that evaluate text, with that evaluation in the sandbox; `data.name=
      "reasoning_gym:<task>"`, docs/reasoning_gym.md).
    format: "number" (arithmetic: a number, then an end token), "r1" (the R1 think/answer
      template), or "none".
    format_weight: weight of the format part; correctness always has weight 1.
    length_weight: weight of the Kimi k1.5 group-relative length reward (0 disables).
    overlong_cache: DAPO soft overlong penalty ramp width in tokens (0 disables).
    workers: host verifier processes (for "code_tests": sandboxed checks run at once).
    deadline_s: per-item verifier deadline; a check past it scores 0 and is counted (for
      "code_tests": the wall time of each test's calls to the program).
    max_turns: model turns per episode of a multi-turn verifier ("math_tool").
    turn_tokens: tokens each row decodes per round of a multi-turn rollout before its tool
      calls are looked at (a round ends earlier when every row has stopped); 0: all of
      `rl.sampler.max_new_tokens`.
    tool_workers: threads that run the tools of a multi-turn rollout.
    """

    verifier: Literal[
        "arithmetic", "math", "countdown", "code_tests", "math_tool", "reasoning_gym"
    ] = "arithmetic"
    format: Literal["number", "r1", "none"] = "number"
    format_weight: float = 0.0
    length_weight: float = 0.0
    overlong_cache: int = 0
    workers: int = 2
    deadline_s: float = 5.0
    max_turns: int = 4
    turn_tokens: int = 0
    tool_workers: int = 8

    def __post_init__(self):
        if self.verifier != "arithmetic" and self.format == "number":
            object.__setattr__(self, "format", "none")
        if self.verifier == "arithmetic" and self.format == "r1":
            raise ValueError("reward.format='r1' needs a text verifier ('math' or 'countdown')")
        if self.overlong_cache < 0:
            raise ValueError(f"overlong_cache={self.overlong_cache} must be >= 0 (0 disables)")
        if self.max_turns < 1 or self.turn_tokens < 0 or self.tool_workers < 1:
            raise ValueError(
                f"reward.max_turns={self.max_turns} and tool_workers={self.tool_workers} must be "
                f">= 1, turn_tokens={self.turn_tokens} >= 0"
            )
        if self.workers < 1 or self.deadline_s <= 0:
            raise ValueError(
                f"reward.workers={self.workers} must be >= 1 and deadline_s={self.deadline_s} > 0"
            )
