"""The reward section of the settings: which verifier, which shaping parts, with what weights."""

from __future__ import annotations

import dataclasses
from typing import Literal

from rlvr_jax.rewards import judge


@dataclasses.dataclass(frozen=True)
class RewardSettings:
    """Attributes:
    verifier: "arithmetic" (in JAX over tokens: the whole step is one program), "math"
      (answer extraction and equivalence on text, in a process pool with deadlines),
      "countdown" (an arithmetic expression over the given numbers, parsed without eval, in
      the pool), "code_tests" (a program run against the problem's hidden unit tests in the
      code sandbox; `data.name="humaneval"`) or "math_tool" (math with a sandboxed `python`
      tool over several turns: `envs.tool_math`, docs/agents.md; the final answer checked as
      "math" does), "swe" (fix the seeded bug of a generated repository with file and command
      tools, scored by hidden tests: `envs.swe`, `data.name="swe_repos"`, docs/agents.md) or
      "reasoning_gym" (a reasoning-gym task's own scorer, in the pool or, for scorers that
      evaluate text, with that evaluation in the sandbox; `data.name="reasoning_gym:<task>"`,
      docs/reasoning_gym.md).
    format: "number" (arithmetic: a number, then an end token), "r1" (the R1 think/answer
      template), "mode" (the thinking mode each prompt asked for, `data.modes`:
      `format.mode_reward`) or "none".
    format_weight: weight of the format part; correctness always has weight 1.
    length_weight: weight of the Kimi k1.5 group-relative length reward (0 disables).
    overlong_cache: DAPO soft overlong penalty ramp width in tokens (0 disables).
    workers: host verifier processes (for "code_tests": sandboxed checks run at once).
    deadline_s: per-item verifier deadline; a check past it scores 0 and is counted (for
      "code_tests": the wall time of each test's calls to the program).
    sandbox_backend: where model-written code runs (the programs of "code_tests", the tools of
      "math_tool" and "swe", the `eval` of reasoning-gym's sandboxed scorers): "bwrap"
      (bubblewrap, `apt-get install bubblewrap`; a run whose task executes model output
      refuses to start without it) or "rlimits" (resource limits only: the code can read and
      write its user's files on the host; for trusted code and tests only). docs/sandbox.md.
    max_turns: model turns per episode of a multi-turn verifier ("math_tool", "swe").
    turn_tokens: tokens each row decodes per round of a multi-turn rollout before its tool
      calls are looked at (a round ends earlier when every row has stopped); 0: all of
      `rl.sampler.max_new_tokens`.
    tool_workers: threads that run the tools of a multi-turn rollout.
    overlap_tools: in the RL rollout, start the next decode round without waiting for running
      tools (their rows sit it out and rejoin when the tool returns; `rl.multiturn`): tool time
      overlaps decode, and which round a row rejoins in, so its samples, depend on timing.
    tool_system: the system message of "math_tool" episodes, which describes the `python`
      tool; empty: Qwen2.5's tool description (`envs.tool_math.SYSTEM`, about 200 tokens).
    rm_path: the workdir of a reward-model run (`train.stage="rm"`, docs/reward_models.md):
      its newest checkpoint scores every response, as the part "preference" (empty: no
      reward model). It must share this run's tokenizer.
    rm_weight: the weight of the "preference" part.
    rm_norm: how the reward model's scores become the part: "none" (as they are), "batch"
      (whitened over the step's rows; Bradley-Terry scores have no fixed offset) or "sigmoid"
      (squashed into (0, 1)).
    judge_model: a generative judge that grades each response, as the part "judge": "" (none),
      "policy" (a frozen copy of the policy's initial weights) or a `model.source` (a
      directory, .gguf file, hub id or "random:PRESET", read with this run's tokenizer).
    judge_template: the grading prompt; "{question}" and "{response}" are replaced.
    judge_verdict: "yes_no" (YES is 1, NO is 0) or "score" (a number out of
      `judge_max_score`); an answer with no verdict scores 0 and is counted.
    judge_max_score: the top of the judge's score scale.
    judge_weight: the weight of the "judge" part.
    judge_tokens: new tokens the judge may write (greedy).
    """

    verifier: Literal[
        "arithmetic", "math", "countdown", "code_tests", "math_tool", "swe", "reasoning_gym"
    ] = "arithmetic"
    format: Literal["number", "r1", "mode", "none"] = "number"
    format_weight: float = 0.0
    length_weight: float = 0.0
    overlong_cache: int = 0
    workers: int = 2
    deadline_s: float = 5.0
    sandbox_backend: Literal["bwrap", "rlimits"] = "bwrap"
    max_turns: int = 4
    turn_tokens: int = 0
    tool_workers: int = 8
    overlap_tools: bool = False
    tool_system: str = ""
    rm_path: str = ""
    rm_weight: float = 1.0
    rm_norm: Literal["none", "batch", "sigmoid"] = "none"
    judge_model: str = ""
    judge_template: str = judge.DEFAULT_TEMPLATE
    judge_verdict: Literal["yes_no", "score"] = "yes_no"
    judge_max_score: float = 10.0
    judge_weight: float = 1.0
    judge_tokens: int = 8

    @property
    def multi_turn(self) -> bool:
        """The verifier's episodes run over several turns with tools (`envs.task.MultiTurnTask`)."""
        return self.verifier in ("math_tool", "swe")

    def __post_init__(self):
        if self.verifier != "arithmetic" and self.format == "number":
            object.__setattr__(self, "format", "none")
        if self.verifier == "arithmetic" and self.format in ("r1", "mode"):
            raise ValueError(
                f"reward.format={self.format!r} needs a text verifier ('math' or 'countdown')"
            )
        if self.format == "mode" and self.verifier not in ("math", "countdown", "reasoning_gym"):
            raise ValueError(
                f"reward.format='mode' with verifier={self.verifier!r}: the mode part is scored "
                "with the single-turn text verifiers ('math', 'countdown', 'reasoning_gym')"
            )
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
        if self.sandbox_backend not in ("bwrap", "rlimits"):
            raise ValueError(
                f"reward.sandbox_backend={self.sandbox_backend!r}; expected 'bwrap' (bubblewrap) "
                "or 'rlimits' (no filesystem isolation: trusted code and tests only)"
            )
        if self.rm_norm not in ("none", "batch", "sigmoid"):
            raise ValueError(f"reward.rm_norm={self.rm_norm!r}; expected none, batch or sigmoid")
        if self.judge_verdict not in judge.VERDICTS:
            raise ValueError(
                f"reward.judge_verdict={self.judge_verdict!r}; expected one of {judge.VERDICTS}"
            )
        if self.judge_model:
            judge.check_template(self.judge_template)
        if self.judge_tokens < 1 or not self.judge_max_score > 0:
            raise ValueError(
                f"reward.judge_tokens={self.judge_tokens} must be >= 1 and judge_max_score="
                f"{self.judge_max_score} > 0"
            )

    def learned_weights(self) -> dict[str, float]:
        """The weights of the parts that learned rewards add ("preference", "judge")."""
        return {"preference": self.rm_weight, "judge": self.judge_weight}
