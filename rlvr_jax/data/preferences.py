"""Preference pairs for reward-model training: read from JSONL, tokenized, batched.

Pairs come from a JSONL file or, for a task with gold answers, from its examples
(`pairs_from_examples`: the right answer preferred to another example's). A row is
`{"prompt": ..., "chosen": ..., "rejected": ...}` (an "id" string is kept when present).
Malformed rows are counted per reason and skipped, and the log line names their line numbers
(`LoadReport.summary`), as for the other loaders: a line that is not JSON, a row without one of
the three fields, an empty field, chosen equal to rejected (no preference), a repeated id.

Each side is encoded as the sampler would produce it: the templated prompt, then the response,
then the tokenizer's first end id, so that the reward model scores training pairs and rollouts
(`rewards.reward_model.rollout_sequences`) on the same token sequences.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlvr_jax.config_types import NotFoundError
from rlvr_jax.data import datasets, jsonl, templates
from rlvr_jax.data.datasets import LoadReport, MalformedRowError
from rlvr_jax.data.example import Example
from rlvr_jax.data.tokenizer import Tokenizer

FIELDS = ("prompt", "chosen", "rejected")


@dataclasses.dataclass(frozen=True)
class PreferencePair:
    """One comparison: `chosen` is preferred to `rejected` as an answer to `prompt`.

    Attributes:
      id: unique ("<file stem>/<0-based line>" unless the row has a string "id").
      prompt: the question, before the prompt template.
      chosen, rejected: the two responses.
    """

    id: str
    prompt: str
    chosen: str
    rejected: str


def _pair(row: Any, stem: str, index: int) -> PreferencePair:
    """One JSONL row as a pair; raises `MalformedRowError`."""
    if not isinstance(row, dict):
        raise MalformedRowError("not_an_object", f"the row is a {type(row).__name__}")
    missing = [f for f in FIELDS if f not in row]
    if missing:
        raise MalformedRowError("missing_field", f"the row has no {', '.join(map(repr, missing))}")
    for f in FIELDS:
        if not isinstance(row[f], str) or not row[f].strip():
            raise MalformedRowError(f"empty_{f}", f"{f}={row[f]!r} is not a non-empty string")
    if row["chosen"] == row["rejected"]:
        raise MalformedRowError("same_responses", "chosen and rejected are the same text")
    row_id = row.get("id")
    return PreferencePair(
        id=row_id if isinstance(row_id, str) and row_id else f"{stem}/{index}",
        prompt=row["prompt"].strip(),
        chosen=row["chosen"],
        rejected=row["rejected"],
    )


def load_preferences(path: str | Path) -> tuple[list[PreferencePair], LoadReport]:
    """Reads preference pairs from JSONL, counting and skipping malformed rows.

    Returns:
      (pairs in file order, report); `report.summary()` is the line for the log, naming the
      first lines of each skip reason.

    Raises:
      NotFoundError: for a missing file.
      ValueError: for an empty file or one without a well-formed row.
    """
    path = Path(path)
    if not path.is_file():
        raise NotFoundError(f"preference file {str(path)!r} does not exist")
    return datasets._collect(  # noqa: SLF001 (the loaders' shared row counting)
        jsonl.read_rows(path),
        lambda line, row: _pair(row, path.stem, line - 1),
        str(path),
        exclude_multiple_choice=False,
        exclude_true_false=False,
    )


def pairs_from_examples(examples: Sequence[Example], seed: int = 0) -> list[PreferencePair]:
    """Pairs that prefer the right answer: chosen is an example's gold answer, rejected the gold
    answer of another example (a seeded draw) that differs from it. A reward model trained on
    them is a learned verifier of the task; examples whose answer no other example differs from
    are left out."""
    rng = np.random.default_rng(seed)
    answers = [ex.answer for ex in examples]
    out = []
    for ex in examples:
        for j in rng.integers(0, len(examples), 8):
            if answers[j] != ex.answer:
                out.append(PreferencePair(ex.id, ex.prompt_text, ex.answer, answers[j]))
                break
    return out


@dataclasses.dataclass(frozen=True)
class EncodedPairs:
    """Token ids of the pairs whose both sides fit.

    Attributes:
      chosen, rejected: prompt + response + end id, per kept pair.
      pairs: the kept pairs, aligned with the ids.
      num_too_long: pairs with a side longer than `max_len`, skipped.
      too_long_ids: the first few skipped ids.
      max_len: the limit (the largest sequence bucket).
    """

    chosen: list[list[int]]
    rejected: list[list[int]]
    pairs: list[PreferencePair]
    num_too_long: int
    too_long_ids: tuple[str, ...]
    max_len: int

    def summary(self) -> str:
        """One line for the log."""
        line = f"{len(self.pairs)} preference pairs fit in {self.max_len} tokens"
        if self.num_too_long:
            line += (
                f"; skipped {self.num_too_long} longer ones, e.g. {', '.join(self.too_long_ids)}"
            )
        return line


def encode_pairs(
    pairs: Sequence[PreferencePair],
    template: templates.PromptTemplate,
    tokenizer: Tokenizer,
    max_len: int,
) -> EncodedPairs:
    """Templated prompt ids, then each response's ids and the tokenizer's first end id.

    Raises:
      ValueError: when no pair fits in `max_len`.
    """
    end_id = tokenizer.eos_ids[0]
    chosen, rejected, kept, too_long = [], [], [], []
    for p in pairs:
        prompt = tokenizer.encode(templates.render(p.prompt, template, tokenizer))
        c = [*prompt, *tokenizer.encode(p.chosen), end_id]
        r = [*prompt, *tokenizer.encode(p.rejected), end_id]
        if max(len(c), len(r)) > max_len:
            too_long.append(p.id)
            continue
        chosen.append(c)
        rejected.append(r)
        kept.append(p)
    if pairs and not kept:
        raise ValueError(
            f"none of {len(pairs)} preference pairs fits in {max_len} tokens with template "
            f"{template.name!r} (raise rm.buckets)"
        )
    return EncodedPairs(chosen, rejected, kept, len(too_long), tuple(too_long[:5]), max_len)


def make_pair_batch(
    chosen: Sequence[Sequence[int]],
    rejected: Sequence[Sequence[int]],
    buckets: Sequence[int],
    pad_id: int,
) -> dict[str, np.ndarray]:
    """N pairs as 2N right-padded rows (chosen first), at the smallest bucket that holds them.

    Returns:
      {"tokens_MS" int32, "mask_MS" bool, "last_M" int32} numpy arrays, the fields of
      `rewards.reward_model.PairBatch`.

    Raises:
      ValueError: for no pairs, unequal sides, or a sequence longer than the largest bucket.
    """
    if not chosen or len(chosen) != len(rejected):
        raise ValueError(f"{len(chosen)} chosen and {len(rejected)} rejected sequences")
    rows = [*chosen, *rejected]
    sizes = sorted(int(b) for b in buckets)
    longest = max(len(r) for r in rows)
    if longest > sizes[-1]:
        raise ValueError(f"a sequence has {longest} tokens, more than the largest bucket {sizes}")
    S = next(b for b in sizes if b >= longest)
    tokens = np.full((len(rows), S), pad_id, np.int32)
    mask = np.zeros((len(rows), S), bool)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = r
        mask[i, : len(r)] = True
    last = np.asarray([len(r) - 1 for r in rows], np.int32)
    return {"tokens_MS": tokens, "mask_MS": mask, "last_M": last}
