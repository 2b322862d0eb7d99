"""Tool-integrated math: the model may run Python in the sandbox before its final answer.

`MathToolEnv` is one episode: the prompt is the question through the chat template with a system
message that describes the `python` tool in the Qwen tool-call format; each tool call runs its
`code` argument with `rewards.sandbox.run` under tight limits and answers with the program's
stdout (and the tail of stderr when it failed), cut to `max_output_chars`; the final turn (no
tool call) is scored by the math verifier on its last `\\boxed{}` (or the verifier's other
extraction rules). Parts: "correct", "tool_calls", "tool_errors" (a malformed call, an unknown
tool, a program that exits non-zero or is killed).

The verifier is `verify(answer_text, gold) -> float`, by default `rewards.math.score` in this
process: sympy parses model text there, so a trainer passes a call into its verifier pool.
"""

from __future__ import annotations

from collections.abc import Callable

from rlvr_jax.data.example import Example
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs.environment import ToolCallError, ToolEnvironment
from rlvr_jax.rewards import math as math_reward
from rlvr_jax.rewards import sandbox

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
LIMITS = sandbox.SandboxLimits(
    cpu_seconds=2, wall_seconds=5.0, memory_bytes=512 << 20, max_output_bytes=64 << 10
)


def run_python(
    code: str, limits: sandbox.SandboxLimits = LIMITS, max_output_chars: int = 1024
) -> tuple[str, bool]:
    """Runs `code` in the sandbox: (its stdout, cut to `max_output_chars`, failed)."""
    if not isinstance(code, str):
        raise ToolCallError('"code" must be a string')
    r = sandbox.run(code, limits=limits)
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
    """One tool-integrated math episode (see the module docstring)."""

    def __init__(
        self,
        tok: Tokenizer,
        verify: Callable[[str, str], float] = math_reward.score,
        limits: sandbox.SandboxLimits = LIMITS,
        max_output_chars: int = 1024,
    ):
        super().__init__()
        self.tok = tok
        self.verify = verify
        self.tools = {
            "python": lambda code: run_python(code, limits, max_output_chars),
        }

    def prompt(self, example: Example) -> str:
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": example.prompt_text},
        ]
        return self.tok.apply_chat_template(messages, add_generation_prompt=True)

    def answer_parts(self, text: str) -> dict[str, float]:
        assert self.example is not None, "reset() starts the episode"
        return {"correct": float(self.verify(text, self.example.answer))}
