"""The record every data source produces: one problem with a verifiable answer.

Host code, standard library only. It sits apart from `datasets` so that the loaders and the task
generators (`countdown_tasks`) can both import it without importing each other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class Example:
    """One problem with a verifiable answer.

    Attributes:
      id: unique and stable across runs ("gsm8k/test/17"); the curriculum tracks prompts by it.
      prompt_text: the question, without any prompt template.
      answer: the gold answer as a string ("18", "\\frac{1}{2}"; for countdown an expression over
        the given numbers, "(3 + 5) * 2", see `rewards.countdown`).
      source: where it came from ("gsm8k", "math500", "countdown", ...).
      difficulty: an optional level (MATH level, arithmetic level, number count), higher is harder.
      meta: JSON-serialisable extras (countdown numbers and target, the gold solution text, ...).
      hidden: JSON-serialisable data for the verifier only (a code problem's hidden tests and
        entry point). Templates render `prompt_text` alone, so the model never sees it.
    """

    id: str
    prompt_text: str
    answer: str
    source: str
    difficulty: float | None = None
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict, hash=False)
    hidden: Mapping[str, Any] = dataclasses.field(default_factory=dict, hash=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON object (the format `datasets.write_examples` writes)."""
        return {
            "id": self.id,
            "prompt_text": self.prompt_text,
            "answer": self.answer,
            "source": self.source,
            "difficulty": self.difficulty,
            "meta": dict(self.meta),
            "hidden": dict(self.hidden),
        }
