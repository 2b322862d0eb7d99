"""Tool-integrated math: the model may run Python in the sandbox before its final answer.

`MathToolEnv` is one episode: the prompt is the question through the chat template with a system
message that describes the `python` tool in the Qwen tool-call format; each tool call runs its
`code` argument with `rewards.sandbox.run` under tight limits (in the task's
`reward.sandbox_backend`) and answers with the program's
stdout (and the tail of stderr when it failed), cut to `max_output_chars`; the final turn (no
tool call) is scored by the math verifier on its last `\\boxed{}` (or the verifier's other
extraction rules). Parts: "correct", "tool_calls", "tool_errors" (a malformed call, an unknown
tool, a program that exits non-zero or is killed).

The verifier is `verify(answer_text, gold) -> float`, by default `rewards.math.score` in this
process: sympy parses model text there, so the training task (`MathToolTask`, the RL stage's
`reward.verifier="math_tool"`) scores final answers in its verifier pool instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np

from rlvr_jax.data.example import Example
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs.environment import (
    TOOL_CALL_CLOSE,
    Demonstrator,
    ToolCallError,
    ToolEnvironment,
    tool_call_text,
)
from rlvr_jax.envs.task import MultiTurnTask
from rlvr_jax.rewards import math as math_reward
from rlvr_jax.rewards import sandbox
from rlvr_jax.rewards.config import RewardSettings
from rlvr_jax.rewards.pool import VerifierPool
from rlvr_jax.types import Rollout

# Qwen2.5's tool description, in the system message (what its chat template writes for `tools`).
SYSTEM = (
    "Please reason step by step, and put your final answer within \\boxed{}. "
    "You may run Python code to help.\n\n# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "python", "description": "Runs a Python '
    'program and returns its standard output.", "parameters": {"type": "object", '
    '"properties": {"code": {"type": "string"}}, "required": ["code"]}}}\n</tools>\n\n'
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
# The final turn of a demonstration (`MathToolTask.demonstration`).
ANSWER_TURN = "The answer is \\boxed{{{answer}}}."
LIMITS = sandbox.SandboxLimits(
    cpu_seconds=2, wall_seconds=5.0, memory_bytes=512 << 20, max_output_bytes=64 << 10
)


def run_python(
    code: str,
    limits: sandbox.SandboxLimits = LIMITS,
    max_output_chars: int = 1024,
    backend: str = "bwrap",
) -> tuple[str, bool]:
    """Runs `code` in the sandbox `backend`: (its stdout, cut to `max_output_chars`, failed)."""
    if not isinstance(code, str):
        raise ToolCallError('"code" must be a string')
    r = sandbox.run(code, limits=limits, backend=backend)
    out = r.stdout.decode("utf-8", "replace")
    failed = r.returncode != 0 or r.killed_reason is not None
    if failed:
        err = r.stderr.decode("utf-8", "replace").strip().splitlines()
        why = r.killed_reason or f"exit status {r.returncode}"
        out += f"\n[failed: {why}]" + (f" {err[-1]}" if err else "")
    if len(out) > max_output_chars:
        out = out[:max_output_chars] + f"\n[output cut at {max_output_chars} characters]"
    return out.strip("\n"), failed


class MathToolEnv(ToolEnvironment):
    """One tool-integrated math episode (see the module docstring); the `python` tool runs in
    the sandbox `backend`."""

    def __init__(
        self,
        tok: Tokenizer,
        verify: Callable[[str, str], float] = math_reward.score,
        limits: sandbox.SandboxLimits = LIMITS,
        max_output_chars: int = 1024,
        system: str = SYSTEM,
        backend: str = "bwrap",
    ):
        super().__init__()
        self.tok = tok
        self.verify = verify
        self.system = system
        self.tools = {
            "python": lambda code: run_python(code, limits, max_output_chars, backend),
        }

    def prompt(self, example: Example) -> str:
        messages = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": example.prompt_text},
        ]
        return self.tok.apply_chat_template(messages, add_generation_prompt=True)

    def answer_parts(self, text: str) -> dict[str, float]:
        assert self.example is not None, "reset() starts the episode"
        return {"correct": float(self.verify(text, self.example.answer))}


class MathToolTask(MultiTurnTask):
    """`reward.verifier="math_tool"`: episodes of `MathToolEnv`, the final answer (the model's
    tokens after the last observation) checked for equivalence in the verifier pool.

    Parts: "correct"; with the tool counts of each episode as `rl.multiturn` reports them in
    the step's metrics ("episode/..."), not as rewards. The `python` tool runs in
    `reward.sandbox_backend`.
    """

    name = "math_tool"

    def __init__(self, tok: Tokenizer, reward: RewardSettings):
        self.tok = tok
        self.sandbox_backend = reward.sandbox_backend
        self.system = reward.tool_system or SYSTEM
        self.max_turns = reward.max_turns
        self.turn_tokens = reward.turn_tokens
        self.tool_workers = reward.tool_workers
        self.overlap_tools = reward.overlap_tools
        self.stop_sequences = (tuple(tok.encode(TOOL_CALL_CLOSE)),)
        self.pool = VerifierPool(
            math_reward.score,
            num_workers=reward.workers,
            deadline_s=reward.deadline_s,
            warmup=math_reward.WARMUP,
        )

    def environment(self) -> MathToolEnv:
        # The final answer is scored in `score`, in the pool, not in the tool threads.
        return MathToolEnv(
            self.tok,
            verify=lambda text, gold: 0.0,
            system=self.system,
            backend=self.sandbox_backend,
        )

    def demonstration(self, example: Example) -> Demonstrator | None:
        """The gold episode of a problem with a known expression (`meta["expression"]`, as the
        generated arithmetic has): a `python` call that prints it, then the printed value boxed
        (`ANSWER_TURN`). The final turn is text of this script, not model output, so this
        episode's environment checks it in this process."""
        expression = (example.meta or {}).get("expression")
        if not isinstance(expression, str) or not expression:
            return None

        def policy(observation: str | None) -> str:
            if observation is None:
                return tool_call_text("python", {"code": f"print({expression})"})
            return ANSWER_TURN.format(answer=observation.strip())

        return MathToolEnv(self.tok, system=self.system, backend=self.sandbox_backend), policy

    def final_answers(self, rollout: Rollout) -> list[str]:
        """Each row's last model turn: its tokens after the last observation."""
        tokens_NT, injected_NT, lengths_N = jax.device_get(
            (rollout.tokens_NT, rollout.injected_NT, rollout.lengths_N)
        )
        out = []
        for n in range(tokens_NT.shape[0]):
            L = int(lengths_N[n])
            observed = np.flatnonzero(injected_NT[n, :L])
            start = int(observed[-1]) + 1 if observed.size else 0
            out.append(self.tok.decode(tokens_NT[n, start:L], skip_special_tokens=True))
        return out

    def score(self, rollout: Rollout, examples_N: Sequence[Example]) -> dict[str, np.ndarray]:
        texts = self.final_answers(rollout)
        items = [(t, ex.answer) for t, ex in zip(texts, examples_N, strict=True)]
        return {"correct": np.asarray(self.pool.map(items), np.float32)}

    def stats(self) -> dict[str, float]:
        return self.pool.stats.as_dict()

    def close(self) -> None:
        self.pool.close()
