"""Multi-turn environments: an episode's state on the host, tool calls parsed from model text.

An `Environment` is one episode. `reset(example)` returns the prompt text (the first
observation, rendered with the chat template); `step(action_text)` takes the text of one model
turn and returns a `StepResult`: the observation text to show the model next (a tool's output),
whether the episode is done, and its reward parts. The rollout runner (`rlvr_jax.rl.multiturn`)
creates one environment per row, so the per-episode state (tool calls so far, the final answer)
lives in the object, on the host.

Tool calls use the Qwen2.5 / Qwen3 format: the model writes

    <tool_call>
    {"name": "python", "arguments": {"code": "print(2**10)"}}
    </tool_call>

and the sampler stops the row at the end of `</tool_call>` (a stop sequence). `parse_tool_call`
reads the last such block of a turn; anything wrong with it (no block, JSON that does not parse,
no "name", arguments that are not an object, an unknown tool) raises `ToolCallError`, which
`ToolEnvironment.step` turns into an error observation that the model sees and the episode
counts as a tool error. So does any other exception a tool raises (a RecursionError, a bug): the
observation says the tool failed and names the exception's type. Neither crashes the rollout.

Host code; no JAX.
"""

from __future__ import annotations

import abc
import dataclasses
import inspect
import json
from collections.abc import Callable, Mapping
from typing import Any

from rlvr_jax.data.example import Example

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
# An unexpected exception's message is cut to this in the observation.
_MAX_ERROR_CHARS = 200


class ToolCallError(ValueError):
    """A tool call the environment cannot run; the message is shown to the model."""


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One parsed tool call."""

    name: str
    arguments: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What one model turn led to.

    Attributes:
      observation: the text to append as the next observation (a tool's output, an error); the
        runner wraps it in the chat template's tool-response turn. Ignored when `done`.
      done: the episode has ended (a final answer, or the environment gave up).
      parts: the episode's reward parts so far ({"correct": 1.0, ...}); the runner keeps those
        of the last step.
      tool_calls: tool calls this step made (0 or 1).
      tool_errors: of those, the ones that failed (malformed, unknown tool, the tool failed).
    """

    observation: str
    done: bool
    parts: Mapping[str, float] = dataclasses.field(default_factory=dict)
    tool_calls: int = 0
    tool_errors: int = 0


@dataclasses.dataclass(frozen=True)
class ToolResponseFormat:
    """How an observation becomes context: `prefix + observation + suffix`, encoded.

    The default is Qwen2.5's and Qwen3's chat template for a tool message after an assistant
    turn that ended with `</tool_call>`: the assistant turn is closed, the tool's output goes in
    a user turn inside `<tool_response>` tags, and a new assistant turn opens:

        <|im_end|>\\n<|im_start|>user\\n<tool_response>\\n{observation}\\n</tool_response>
        <|im_end|>\\n<|im_start|>assistant\\n

    (one string; the line break inside it is for this page only).
    """

    prefix: str = "<|im_end|>\n<|im_start|>user\n<tool_response>\n"
    suffix: str = "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"

    def wrap(self, observation: str) -> str:
        """The text appended after a tool call."""
        return self.prefix + observation + self.suffix


class Environment(abc.ABC):
    """One episode of a multi-turn task; subclasses hold its state."""

    @abc.abstractmethod
    def reset(self, example: Example) -> str:
        """Starts the episode; returns the prompt text (already through the chat template)."""

    @abc.abstractmethod
    def step(self, action_text: str) -> StepResult:
        """Takes one model turn (its decoded text, special tokens included) and answers it."""

    def truncate(self) -> dict[str, float]:
        """The episode's reward parts when a budget (tokens, turns, time) cut it short."""
        return {"correct": 0.0}


def tool_call_text(name: str, arguments: Mapping[str, Any]) -> str:
    """A tool call as the model writes it (what `parse_tool_call` reads back)."""
    payload = json.dumps({"name": name, "arguments": dict(arguments)})
    return f"{TOOL_CALL_OPEN}\n{payload}\n{TOOL_CALL_CLOSE}"


def parse_tool_call(text: str) -> ToolCall:
    """The last `<tool_call>{json}</tool_call>` block of a turn's text.

    Raises:
      ToolCallError: with a message for the model: no block, JSON that does not parse, a
        payload that is not {"name": str, "arguments": object}.
    """
    end = text.rfind(TOOL_CALL_CLOSE)
    start = text.rfind(TOOL_CALL_OPEN, 0, end if end >= 0 else len(text))
    if start < 0 or end < 0:
        raise ToolCallError(f"no complete {TOOL_CALL_OPEN}...{TOOL_CALL_CLOSE} block")
    body = text[start + len(TOOL_CALL_OPEN) : end].strip()
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as e:
        raise ToolCallError(
            f"the tool call is not valid JSON: {e.msg} at character {e.pos}"
        ) from None
    except RecursionError:
        raise ToolCallError("the tool call is nested too deeply") from None
    if not isinstance(payload, dict):
        raise ToolCallError('the tool call must be a JSON object {"name": ..., "arguments": {...}}')
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        raise ToolCallError('the tool call has no "name" string')
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except (json.JSONDecodeError, RecursionError):
            raise ToolCallError('"arguments" is a string that is not a JSON object') from None
    if not isinstance(arguments, dict):
        raise ToolCallError('"arguments" must be a JSON object')
    return ToolCall(name, arguments)


# A scripted policy: the last observation (None at the start) -> the next model turn's text.
ScriptedPolicy = Callable[[str | None], str]
# An episode to play with a scripted policy (a demonstration: `envs.demonstrations`).
Demonstrator = tuple["Environment", ScriptedPolicy]

# A tool: its arguments (keywords) -> the observation text, or (text, failed) for a tool that
# reports its own failures. It raises ToolCallError for arguments it cannot take; anything else
# it raises is a failed call too (`ToolEnvironment.step`).
Tool = Callable[..., str | tuple[str, bool]]


class ToolEnvironment(Environment):
    """An episode in which each turn either calls a tool or gives the final answer.

    A turn that contains `<tool_call>` calls a tool (parsed by `parse_tool_call`, run from
    `tools` with its arguments as keywords); its output, or the error, is the next observation.
    A turn without one is the final answer: `answer_parts(text)` scores it and the episode
    ends. Parts: those of `answer_parts`, plus "tool_calls" and "tool_errors" (counts). A call
    that fails (malformed, an unknown tool, bad arguments, a tool that reports a failure or
    raises anything) is a tool error; its observation says why.

    Subclasses set `tools` and implement `prompt` and `answer_parts`.
    """

    tools: Mapping[str, Tool] = {}

    def __init__(self):
        self.example: Example | None = None
        self.tool_calls = 0
        self.tool_errors = 0

    @abc.abstractmethod
    def prompt(self, example: Example) -> str:
        """The episode's prompt text."""

    @abc.abstractmethod
    def answer_parts(self, text: str) -> dict[str, float]:
        """Reward parts of the final answer turn ("correct" at least)."""

    def reset(self, example: Example) -> str:
        self.example, self.tool_calls, self.tool_errors = example, 0, 0
        return self.prompt(example)

    def _counts(self) -> dict[str, float]:
        return {"tool_calls": float(self.tool_calls), "tool_errors": float(self.tool_errors)}

    def step(self, action_text: str) -> StepResult:
        if TOOL_CALL_OPEN not in action_text:
            return StepResult("", True, {**self.answer_parts(action_text), **self._counts()})
        self.tool_calls += 1
        try:
            observation, failed = self._call(action_text)
        except ToolCallError as e:
            observation, failed = f"Error: {e}", True
        self.tool_errors += int(failed)
        parts = {"correct": 0.0, **self._counts()}
        return StepResult(observation, False, parts, tool_calls=1, tool_errors=int(failed))

    def _call(self, action_text: str) -> tuple[str, bool]:
        """Runs the turn's tool call: (observation, failed).

        Raises:
          ToolCallError: for a call that could not run or a tool that raised, with the
            message for the model.
        """
        call = parse_tool_call(action_text)
        tool = self.tools.get(call.name)
        if tool is None:
            raise ToolCallError(f"unknown tool {call.name!r}; tools: {sorted(self.tools)}")
        try:
            inspect.signature(tool).bind(**call.arguments)
        except TypeError as e:  # wrong or missing keyword arguments
            raise ToolCallError(f"bad arguments for {call.name!r}: {e}") from None
        try:
            observation = tool(**call.arguments)
        except ToolCallError:
            raise
        except Exception as e:  # the tool's own failure: the episode goes on without it
            detail = str(e)[:_MAX_ERROR_CHARS]
            raise ToolCallError(
                f"the tool {call.name!r} failed: {type(e).__name__}"
                + (f": {detail}" if detail else "")
            ) from None
        failed = False
        if isinstance(observation, tuple):  # (text, failed) from a tool that reports it
            observation, failed = observation
        return str(observation), bool(failed)

    def truncate(self) -> dict[str, float]:
        return {"correct": 0.0, **self._counts()}
