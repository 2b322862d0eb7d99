"""Demonstrations for supervised fine-tuning: (prompt, response) pairs, read and tokenized.

Demonstrations come from a JSONL file (fields "prompt"/"response", "question"/"solution" and the
other pairs of `FIELD_PAIRS`, or the ones the config names), or from the training examples of a
data set with their gold answer as the response. Malformed rows are counted and skipped, and a
summary line says how many of each and where.

The prompt goes through the same template that the RL stage uses, and the prompt and the response
are tokenized apart and concatenated, followed by the tokenizer's first end id: exactly the token
sequence the sampler would produce when it answers that prompt.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from rlvr_jax.config_types import NotFoundError
from rlvr_jax.data import datasets, jsonl, templates
from rlvr_jax.data.datasets import LoadReport, MalformedRowError
from rlvr_jax.data.example import Example
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs import demonstrations as envs_demonstrations

# (prompt field, response field) pairs tried in order on each row.
FIELD_PAIRS = (
    ("prompt", "response"),
    ("prompt", "completion"),
    ("question", "solution"),
    ("question", "response"),
    ("problem", "solution"),
)


@dataclasses.dataclass(frozen=True)
class Demonstration:
    """One (prompt, response) pair.

    Attributes:
      id: unique ("<file stem>/<0-based line>" unless the row has a string "id").
      prompt: the question, before the prompt template.
      response: the text the model learns to produce after the templated prompt.
      answer: the gold answer when the row has one ("" otherwise); not used by the loss.
      source: the row's "source" field, or "sft".
      thinking: the chat template's `enable_thinking` for this row (the row's boolean
        "enable_thinking" field), overriding the prompt template's; None keeps the template's.
    """

    id: str
    prompt: str
    response: str
    answer: str = ""
    source: str = "sft"
    thinking: bool | None = None


def _demonstration(
    row: Any, stem: str, index: int, fields: tuple[str, str] | None
) -> Demonstration:
    """One JSONL row as a demonstration; raises `MalformedRowError`."""
    if not isinstance(row, dict):
        raise MalformedRowError("not_an_object", f"the row is a {type(row).__name__}")
    pairs = [fields] if fields else FIELD_PAIRS
    pair = next((p for p in pairs if p[0] in row and p[1] in row), None)
    if pair is None:
        wanted = " or ".join(f"{p!r}/{r!r}" for p, r in pairs)
        raise MalformedRowError("missing_field", f"the row has none of the field pairs {wanted}")
    prompt, response = row[pair[0]], row[pair[1]]
    if not isinstance(prompt, str) or not prompt.strip():
        raise MalformedRowError("empty_prompt", f"{pair[0]}={prompt!r} is not a non-empty string")
    if not isinstance(response, str) or not response.strip():
        raise MalformedRowError(
            "empty_response", f"{pair[1]}={response!r} is not a non-empty string"
        )
    answer = row.get("answer", "")
    row_id = row.get("id")
    thinking = row.get("enable_thinking")
    if thinking is not None and not isinstance(thinking, bool):
        raise MalformedRowError("bad_field", f"enable_thinking={thinking!r} is not a boolean")
    return Demonstration(
        id=row_id if isinstance(row_id, str) and row_id else f"{stem}/{index}",
        prompt=prompt.strip(),
        response=response,
        answer=str(answer).strip() if isinstance(answer, str | int | float) else "",
        source=row["source"] if isinstance(row.get("source"), str) else "sft",
        thinking=thinking,
    )


def load_demonstrations(
    path: str | Path, prompt_field: str = "", response_field: str = ""
) -> tuple[list[Demonstration], LoadReport]:
    """Reads demonstrations from JSONL, counting and skipping malformed rows.

    Args:
      path: the JSONL file.
      prompt_field, response_field: the fields to read; empty tries `FIELD_PAIRS`.

    Returns:
      (demonstrations in file order, report); `report.summary()` is the line for the log.

    Raises:
      NotFoundError: for a missing file.
      ValueError: for an empty file or one without a well-formed row.
    """
    path = Path(path)
    if not path.is_file():
        raise NotFoundError(f"demonstrations file {str(path)!r} does not exist")
    fields = (prompt_field, response_field) if prompt_field else None
    return datasets._collect(  # noqa: SLF001 (the loaders' shared row counting)
        jsonl.read_rows(path),  # noqa: SLF001
        lambda line, row: _demonstration(row, path.stem, line - 1, fields),
        str(path),
        exclude_multiple_choice=False,
        exclude_true_false=False,
    )


THOUGHT = "{thought}"


def demonstrations_from_examples(
    examples: Iterable[Example],
    response_format: str = "{answer}",
    thought_of: Callable[[Example], str] | None = None,
) -> list[Demonstration]:
    """Demonstrations whose response is `response_format` with the gold answer in it (generated
    tasks, where the answer is the whole response) and, where it holds "{thought}", the example's
    written reasoning (`thought_of`, e.g. `sft.traces.thought_for`: arithmetic worked one place
    value at a time), a step-by-step cold start.

    Raises:
      ValueError: "{thought}" without `thought_of`, or an example without a thought.
    """
    out = []
    for ex in examples:
        response = response_format.replace("{answer}", ex.answer)
        if THOUGHT in response_format:
            thought = thought_of(ex) if thought_of is not None else ""
            if not thought:
                raise ValueError(
                    f"sft.response_format={response_format!r} asks for a thought, but example "
                    f"{ex.id!r} ({ex.source}) has none: only generated arithmetic and examples "
                    'with a meta["thought"] have one; drop "{thought}" from the format'
                )
            response = response.replace(THOUGHT, thought)
        out.append(
            Demonstration(
                id=ex.id,
                prompt=ex.prompt_text,
                response=response,
                answer=ex.answer,
                source=ex.source,
            )
        )
    return out


@dataclasses.dataclass(frozen=True)
class EncodedDemonstrations:
    """Token ids of the demonstrations that fit.

    Attributes:
      ids: prompt + response + end id, per kept demonstration.
      prompt_lengths: how many of those ids are the prompt's.
      demos: the kept demonstrations, aligned with `ids`.
      num_too_long: demonstrations longer than `max_len`, skipped.
      too_long_ids: the first few skipped ids.
      max_len: the limit (the largest sequence bucket).
      trained: per sequence, which ids are targets of the loss; None: every id after the
        prompt. Multi-turn episodes (`from_episodes`) leave their observations out.
    """

    ids: list[list[int]]
    prompt_lengths: list[int]
    demos: list[Demonstration]
    num_too_long: int
    too_long_ids: tuple[str, ...]
    max_len: int
    trained: list[list[bool]] | None = None

    def summary(self) -> str:
        """One line for the log."""
        if self.trained is not None:
            n = sum(sum(t) for t in self.trained)
        else:
            n = sum(len(i) - p for i, p in zip(self.ids, self.prompt_lengths, strict=True))
        line = f"{len(self.ids)} demonstrations fit in {self.max_len} tokens ({n} response tokens)"
        if self.num_too_long:
            line += (
                f"; skipped {self.num_too_long} longer ones, e.g. {', '.join(self.too_long_ids)}"
            )
        return line


def from_episodes(
    demos: envs_demonstrations.Demonstrations, examples: Sequence[Example], max_len: int
) -> EncodedDemonstrations:
    """Scripted tool episodes (`envs.demonstrations`) as demonstrations: their ids as played,
    the loss on the model's turns only (observations are context, as in the RL loss)."""
    by_id = {ex.id: ex for ex in examples}
    kept = [
        Demonstration(
            id=e.example_id,
            prompt=by_id[e.example_id].prompt_text,
            response="",
            answer=by_id[e.example_id].answer,
            source=by_id[e.example_id].source,
        )
        for e in demos.episodes
    ]
    return EncodedDemonstrations(
        ids=[e.ids for e in demos.episodes],
        prompt_lengths=[e.prompt_length for e in demos.episodes],
        demos=kept,
        num_too_long=demos.too_long,
        too_long_ids=(),
        max_len=max_len,
        trained=[e.trained for e in demos.episodes],
    )


def encode_demonstrations(
    demos: Sequence[Demonstration],
    template: templates.PromptTemplate,
    tokenizer: Tokenizer,
    max_len: int,
) -> EncodedDemonstrations:
    """Templated prompt ids, then response ids and the tokenizer's first end id.

    Prompt and response are tokenized apart, as the sampler sees them: the prompt ids are the
    RL stage's (`templates.encode_prompts`), the response ids what it would generate. A
    demonstration with `thinking` set renders its prompt with that `enable_thinking` (a chat
    template is then required).

    Raises:
      ValueError: when no demonstration fits in `max_len`.
    """
    end_id = tokenizer.eos_ids[0]
    ids, prompt_lengths, kept, too_long = [], [], [], []
    for d in demos:
        row_template = template
        if d.thinking is not None and d.thinking != template.thinking:
            row_template = dataclasses.replace(template, thinking=d.thinking)
        prompt = tokenizer.encode(templates.render(d.prompt, row_template, tokenizer))
        seq = [*prompt, *tokenizer.encode(d.response), end_id]
        if len(seq) > max_len:
            too_long.append(d.id)
            continue
        ids.append(seq)
        prompt_lengths.append(len(prompt))
        kept.append(d)
    if demos and not ids:
        raise ValueError(
            f"none of {len(demos)} demonstrations fits in {max_len} tokens with template "
            f"{template.name!r} (raise sft.buckets)"
        )
    return EncodedDemonstrations(
        ids, prompt_lengths, kept, len(too_long), tuple(too_long[:5]), max_len
    )
