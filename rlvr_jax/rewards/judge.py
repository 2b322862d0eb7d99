"""A generative judge's grading prompt and verdict, on text (host code).

The judge is a language model asked to grade a response: `grading_prompt` fills a template with
the question and the response, the judge answers through the same sampler as the policy
(`envs.learned_rewards.JudgeTask`), and `parse_verdict` reads its answer:

- "yes_no": the first standalone YES or NO (any case; "Yes." and "**NO**" count) -> 1.0 or 0.0;
- "score": the first number after "score" (e.g. "Score: 7", "score = 7/10") or else the first
  number of the answer, divided by `max_score` and clipped to [0, 1].

An answer with no verdict parses to None; the task scores it 0 and counts it, so a judge that
rambles shows in the metrics instead of silently rewarding.
"""

from __future__ import annotations

import re
from typing import Literal

Verdict = Literal["yes_no", "score"]
VERDICTS: tuple[str, ...] = ("yes_no", "score")

DEFAULT_TEMPLATE = (
    "Question: {question}\nResponse: {response}\n"
    "Is the response a correct and complete answer to the question? Answer YES or NO.\nAnswer:"
)

_YES_NO = re.compile(r"(?<![A-Za-z])(yes|no)(?![A-Za-z])", re.IGNORECASE)
_NUMBER = r"[-+]?\d+(?:\.\d+)?"
_SCORE = re.compile(rf"score\W{{0,4}}?\s*(?:is\s*|of\s*)?({_NUMBER})", re.IGNORECASE)
_ANY_NUMBER = re.compile(_NUMBER)


def grading_prompt(template: str, question: str, response: str) -> str:
    """`template` with "{question}" and "{response}" replaced (other braces are left alone, so a
    template may hold JSON or code)."""
    # The response last: a response that contains "{question}" must stay as written.
    return template.replace("{question}", question).replace("{response}", response)


def check_template(template: str) -> None:
    """Raises ValueError unless the template has both placeholders."""
    missing = [p for p in ("{question}", "{response}") if p not in template]
    if missing:
        raise ValueError(f"judge template {template!r} lacks {' and '.join(missing)}")


def parse_verdict(text: str, verdict: Verdict, max_score: float = 10.0) -> float | None:
    """The judge's verdict in [0, 1], or None when the answer holds none.

    Args:
      text: the judge's answer.
      verdict: "yes_no" or "score" (see the module docstring).
      max_score: the top of the score scale ("score" only).
    """
    if verdict == "yes_no":
        m = _YES_NO.search(text)
        return None if m is None else float(m.group(1).lower() == "yes")
    if verdict == "score":
        m = _SCORE.search(text) or _ANY_NUMBER.search(text)
        if m is None:
            return None
        value = float(m.group(1) if m.re is _SCORE else m.group(0))
        return min(max(value / max_score, 0.0), 1.0)
    raise ValueError(f"verdict={verdict!r}; expected one of {VERDICTS}")
