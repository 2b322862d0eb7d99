"""What a loader read, skipped and excluded: `LoadReport`, and `collect`, the row counting that
every JSONL and hub loader shares.

Host code. A loader hands `collect` its numbered rows (or the `MalformedRowError` of a row that
could not be read, `jsonl.read_rows`) and a parser; each malformed row is counted by reason with
its first line numbers and skipped, a filtered row is counted as excluded, and a source with no
usable row raises, naming itself and the reasons.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from absl import logging

from rlvr_jax.data.example import Example
from rlvr_jax.data.jsonl import MalformedRowError
from rlvr_jax.data.sources import is_multiple_choice, is_true_false

# How many line numbers a `LoadReport` keeps per reason.
_FIRST_LINES = 5
# How many characters of a row's problem a log line quotes (a message may repr a field's value).
_MESSAGE_CHARS = 200


@dataclasses.dataclass(frozen=True)
class LoadReport:
    """What a loader read, skipped and excluded.

    Attributes:
      origin: the file or hub dataset read.
      rows: rows seen (blank lines are not rows).
      loaded: examples returned.
      skipped: malformed rows per reason: how the line reads ("line_too_long", "nul_byte",
        "bad_utf8", "too_deep", "bad_json", "lone_surrogate", "duplicate_key"; "truncated" or
        "bad_gzip" for the end of a damaged .gz file, counted as one row) or what the row holds
        ("not_an_object", "missing_field", "empty_answer", "duplicate_id", ...).
      first_lines: per skip reason, the first few 1-based line numbers (row numbers for hubs).
      excluded: well-formed rows dropped by a filter, per reason ("multiple_choice", ...).
    """

    origin: str
    rows: int
    loaded: int
    skipped: Mapping[str, int]
    first_lines: Mapping[str, tuple[int, ...]]
    excluded: Mapping[str, int]

    @property
    def num_skipped(self) -> int:
        return sum(self.skipped.values())

    def summary(self) -> str:
        """One line: rows, loaded, and each skip and exclusion reason with its first lines."""
        parts = [f"{self.origin}: {self.rows} rows, {self.loaded} loaded"]
        if self.skipped:
            reasons = ", ".join(
                f"{r}: {n} (lines {', '.join(map(str, self.first_lines[r]))}"
                f"{', ...' if n > len(self.first_lines[r]) else ''})"
                for r, n in sorted(self.skipped.items())
            )
            parts.append(f"skipped {self.num_skipped} malformed [{reasons}]")
        if self.excluded:
            reasons = ", ".join(f"{r}: {n}" for r, n in sorted(self.excluded.items()))
            parts.append(f"excluded {sum(self.excluded.values())} [{reasons}]")
        return "; ".join(parts)


def collect(
    rows: Iterable[tuple[int, Any]],
    parse: Callable[[int, Any], Example],
    origin: str,
    exclude_multiple_choice: bool,
    exclude_true_false: bool,
) -> tuple[list[Example], LoadReport]:
    """Parses numbered rows, counting malformed and excluded ones; raises if none parse."""
    examples: list[Example] = []
    skipped: dict[str, int] = {}
    first: dict[str, list[int]] = {}
    excluded: dict[str, int] = {}
    messages: list[str] = []
    seen_ids: set[str] = set()
    n_rows = 0
    for line, row in rows:
        n_rows += 1
        try:
            if isinstance(row, MalformedRowError):
                raise row
            ex = parse(line, row)
            if ex.id in seen_ids:
                raise MalformedRowError("duplicate_id", f"id {ex.id!r} appeared before")
        except MalformedRowError as e:
            skipped[e.reason] = skipped.get(e.reason, 0) + 1
            first.setdefault(e.reason, [])
            if len(first[e.reason]) < _FIRST_LINES:
                first[e.reason].append(line)
            if len(messages) < _FIRST_LINES:
                text = str(e)
                if len(text) > _MESSAGE_CHARS:
                    text = text[:_MESSAGE_CHARS] + "..."
                messages.append(f"line {line}: {text}")
            continue
        seen_ids.add(ex.id)
        if exclude_multiple_choice and is_multiple_choice(ex.prompt_text, ex.answer):
            excluded["multiple_choice"] = excluded.get("multiple_choice", 0) + 1
            continue
        if exclude_true_false and is_true_false(ex.answer):
            excluded["true_false"] = excluded.get("true_false", 0) + 1
            continue
        examples.append(ex)
    report = LoadReport(
        origin=origin,
        rows=n_rows,
        loaded=len(examples),
        skipped=skipped,
        first_lines={k: tuple(v) for k, v in first.items()},
        excluded=excluded,
    )
    if n_rows == 0:
        raise ValueError(f"{origin} holds no rows")
    if n_rows == report.num_skipped:
        raise ValueError(
            f"{origin}: every one of its {n_rows} rows is malformed ({report.summary()}); "
            f"first problems: {'; '.join(messages)}"
        )
    if skipped:
        logging.warning("%s; first problems: %s", report.summary(), "; ".join(messages))
    return examples, report
