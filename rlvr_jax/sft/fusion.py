"""Qwen3's thinking-mode fusion: one SFT set that teaches a model both to think and not to.

Qwen3's fourth training stage fine-tunes on a mix of thinking answers (a reasoning block, then
the answer) and non-thinking answers (an empty reasoning block, then the answer), so that one
model serves both modes. The mode of each prompt is chosen by the user, in either of two ways,
and `fusion_demonstrations` builds rows for either:

* `switch="flag"`: a "/think" or "/no_think" flag at the end of the user message; the chat
  template renders the generation prompt the same way for both, and the model writes the
  reasoning block itself, "<think>\\n{thought}\\n</think>\\n\\n{answer}" or the empty one
  "<think>\\n\\n</think>\\n\\n{answer}". Every token of it is trained on. Use it with a prompt
  template that does not set `enable_thinking=False` ("chat" or "qwen3_thinking").
* `switch="enable_thinking"`: the chat template's `enable_thinking` variable, per row
  (`Demonstration.thinking`). With thinking on the response is as above; with thinking off the
  template itself writes the empty block into the prompt, and the response is the answer alone.

These are the texts Qwen3's own chat template produces for a conversation that ends with such an
assistant turn (tests/sft/test_fusion.py compares them with `transformers`' rendering of it).
`write_demonstrations` writes the rows as the SFT stage's JSONL (`sft.path`).

Host code, no JAX.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from rlvr_jax.data.modes import NO_THINK_FLAG, SWITCHES, THINK_FLAG
from rlvr_jax.data.templates import EMPTY_THINK
from rlvr_jax.sft.data import Demonstration

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclasses.dataclass(frozen=True)
class Trace:
    """A question with its answer and, when there is one, the reasoning that led to it.

    Attributes:
      id: unique.
      question: the user's question, without a mode flag.
      answer: the final answer text (what follows the reasoning block).
      thought: the reasoning, without the <think> tags; "" for a question that has only a direct
        answer (it can only be a non-thinking row).
      source: the data source, for per-source statistics.
    """

    id: str
    question: str
    answer: str
    thought: str = ""
    source: str = "fusion"


def thinking_response(thought: str, answer: str) -> str:
    """The assistant text of thinking mode, as Qwen3's template writes a final turn."""
    return f"{THINK_OPEN}\n{thought.strip(chr(10))}\n{THINK_CLOSE}\n\n{answer.lstrip(chr(10))}"


def non_thinking_response(answer: str) -> str:
    """The assistant text of non-thinking mode: the empty block, then the answer."""
    return EMPTY_THINK + answer.lstrip("\n")


def choose_modes(traces: Sequence[Trace], think_fraction: float, seed: int) -> np.ndarray:
    """Whether each trace becomes a thinking row: with probability `think_fraction` for the
    traces that have a thought, never for those without one (seeded, so reruns agree)."""
    if not 0.0 <= think_fraction <= 1.0:
        raise ValueError(f"think_fraction={think_fraction} must be in [0, 1]")
    draws = np.random.default_rng(seed).random(len(traces))
    has_thought = np.asarray([bool(t.thought.strip()) for t in traces], bool)
    return (draws < think_fraction) & has_thought


def fusion_demonstrations(
    traces: Sequence[Trace],
    switch: str = "flag",
    think_fraction: float = 0.5,
    seed: int = 0,
) -> list[Demonstration]:
    """SFT rows mixing thinking and non-thinking answers (see the module docstring).

    Args:
      traces: the questions, answers and thoughts.
      switch: "flag" (/think and /no_think in the user message) or "enable_thinking".
      think_fraction: the share of traces with a thought that become thinking rows.
      seed: the mode draw's seed.

    Returns:
      One demonstration per trace, in order.
    """
    if switch not in SWITCHES:
        raise ValueError(f"switch={switch!r}; expected one of {SWITCHES}")
    out = []
    for trace, think in zip(traces, choose_modes(traces, think_fraction, seed), strict=True):
        think = bool(think)
        if think:
            response = thinking_response(trace.thought, trace.answer)
        elif switch == "flag":
            response = non_thinking_response(trace.answer)
        else:  # the template writes the empty block into the prompt
            response = trace.answer.lstrip("\n")
        prompt, thinking = trace.question, None
        if switch == "flag":
            prompt = f"{trace.question} {THINK_FLAG if think else NO_THINK_FLAG}"
        else:
            thinking = think
        out.append(
            Demonstration(
                id=trace.id,
                prompt=prompt,
                response=response,
                answer=trace.answer.strip(),
                source=trace.source,
                thinking=thinking,
            )
        )
    return out


def write_demonstrations(demos: Iterable[Demonstration], path: str | Path) -> Path:
    """Writes demonstrations as the SFT stage's JSONL: {"id", "prompt", "response", "answer",
    "source"} and "enable_thinking" where a row sets it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for d in demos:
        row = {"id": d.id, "prompt": d.prompt, "response": d.response, "answer": d.answer}
        row["source"] = d.source
        if d.thinking is not None:
            row["enable_thinking"] = d.thinking
        lines.append(json.dumps(row, ensure_ascii=False))
    path.write_text("\n".join(lines) + "\n")
    return path
