"""Reasoning traces from data sets: the (question, thought, answer) records that fusion SFT needs.

A long-CoT cold start or a thinking-mode fusion stage (`sft.fusion`) needs, for each training
question, a thought and the answer that follows it. Where a data set can say how its answer is
reached, `traces_from_examples` writes that down:

* generated arithmetic (`Example.meta["expression"]`): the expression evaluated one small step
  at a time, products first, then left to right, each multi-digit term added or subtracted one
  place value at a time ("47+38" -> "47+30=77\\n77+8=85"): the column arithmetic a model can
  copy digit by digit, where the direct answer needs the carry in one token;
* any example whose `meta` holds a "thought" string (a JSONL data set with written reasoning).

Other examples get no thought: they can only become non-thinking rows.

Qwen3 draws its fusion stage's thinking rows from the model itself instead: several answers per
question sampled in thinking mode, the verified ones kept (`program.studies.rejection`).
`traces_from_samples` builds the traces from such answers: a question's thought and answer are
those of its first kept answer with a non-empty, closed thinking block.

Host code, standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from rlvr_jax.data.example import Example
from rlvr_jax.rewards.format import split_thinking
from rlvr_jax.sft.fusion import Trace

_TOKEN_RE = re.compile(r"\d+|[+\-*]")


def _place_values(n: int) -> list[int]:
    """The non-zero place values of n >= 0, largest first (305 -> [300, 5]; 0 -> [0])."""
    digits = str(n)
    parts = [int(d) * 10 ** (len(digits) - 1 - i) for i, d in enumerate(digits) if d != "0"]
    return parts or [0]


def arithmetic_steps(expression: str) -> list[str]:
    """The steps of `expression` ("a op b op c ...", non-negative integers, + - *) as
    "x op y = z" lines: each product first, then the sum left to right, a multi-digit term one
    place value at a time. The last step's value is the expression's (Python's precedence).

    Raises:
      ValueError: the text is not such an expression.
    """
    tokens = _TOKEN_RE.findall(expression)
    if "".join(tokens) != expression.replace(" ", "") or len(tokens) % 2 == 0:
        raise ValueError(f"expression={expression!r} is not 'a op b ...' over + - *")
    terms = [int(t) for t in tokens[0::2]]
    ops = tokens[1::2]
    if any(not t.isdigit() for t in tokens[0::2]) or any(o not in "+-*" for o in ops):
        raise ValueError(f"expression={expression!r} is not 'a op b ...' over + - *")
    steps = []
    # Products first, each as one step, so that what is left is a sum.
    summands, signs = [terms[0]], ["+"]
    for op, term in zip(ops, terms[1:], strict=True):
        if op == "*":
            product = summands[-1] * term
            steps.append(f"{summands[-1]}*{term}={product}")
            summands[-1] = product
        else:
            summands.append(term)
            signs.append(op)
    total = summands[0]
    for sign, term in zip(signs[1:], summands[1:], strict=True):
        for part in _place_values(term):
            new = total + part if sign == "+" else total - part
            steps.append(f"{total}{sign}{part}={new}")
            total = new
    if not steps:  # a single number
        steps.append(str(total))
    return steps


def thought_for(example: Example) -> str:
    """The example's thought: its `meta["thought"]`, the steps of an arithmetic expression, or
    "" (no thought)."""
    thought = example.meta.get("thought")
    if isinstance(thought, str) and thought.strip():
        return thought.strip()
    expression = example.meta.get("expression")
    if example.source == "arithmetic" and isinstance(expression, str):
        return "\n".join(arithmetic_steps(expression))
    return ""


def traces_from_examples(
    examples: Iterable[Example], answer_format: str = "{answer}"
) -> list[Trace]:
    """One trace per example: its question, its thought (`thought_for`) and its answer written
    with `answer_format` ("{answer}" is replaced; e.g. "#### {answer}" for the math verifier)."""
    return [
        Trace(
            id=ex.id,
            question=ex.prompt_text,
            answer=answer_format.replace("{answer}", ex.answer),
            thought=thought_for(ex),
            source=ex.source,
        )
        for ex in examples
    ]


def traces_from_samples(
    examples: Iterable[Example],
    samples: Mapping[str, Sequence[str]],
    answer_format: str = "{answer}",
) -> list[Trace]:
    """One trace per example from sampled answers (`samples`: example id -> verified responses,
    in order): the thought and answer of the first response with a non-empty, closed thinking
    block (`rewards.format.split_thinking`). An example with no such response gets no thought,
    and its answer written with `answer_format`, as in `traces_from_examples`."""
    out = []
    for ex in examples:
        split = next(
            (p for p in map(split_thinking, samples.get(ex.id, ())) if p is not None), None
        )
        thought, answer = split or ("", answer_format.replace("{answer}", ex.answer))
        out.append(Trace(ex.id, ex.prompt_text, answer, thought, ex.source))
    return out
