"""JSONL rows, read line by line as bytes so that one bad row never spoils the file.

`read_rows` yields (line number, parsed row) or (line number, `MalformedRowError`) per row with a
reason (bad UTF-8, NUL bytes, a line over the size limit, JSON nested too deep, invalid JSON, a
lone surrogate, a key twice in one object); the loaders count each reason with its line numbers
and skip the row. A .gz file that ends before its end-of-stream marker (a truncated download or
copy) yields its rows up to the damage and then one "truncated" error naming the file and the last
line read ("bad_gzip" for compressed data that is damaged, or not gzip at all).

Numbers are read exactly where a float cannot hold them: a JSON number whose decimal value the
nearest float does not spell (`123456789012345678.0`, `0.1000000000000000000001`) parses as a
`LiteralFloat`, a float that keeps its text, so that a gold answer is the number written.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

# Longer lines are skipped unread: no real problem or demonstration comes near a megabyte, and a
# file without newlines (a binary, a zero-filled tail after a crash) must not be held in memory.
MAX_LINE_BYTES = 1 << 20
# Rows need a few levels; the json module recurses once per level, so a deeper line is refused
# before it is parsed (and everything that later walks a row stays far from the recursion limit).
MAX_DEPTH = 100


class MalformedRowError(ValueError):
    """A malformed row: `reason` is the `LoadReport` key, the message says what was wrong."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def skip_rest_of_line(f: BinaryIO) -> int:
    """Reads up to the next newline in pieces, keeping none; returns the bytes before it."""
    n = 0
    while True:
        chunk = f.readline(1 << 16)
        if not chunk or chunk.endswith(b"\n"):
            return n + len(chunk.rstrip(b"\r\n"))
        n += len(chunk)


def nesting_depth(line: bytes) -> int:
    """The deepest nesting of arrays and objects in one JSON line (brackets in strings are text).

    Vectorised, so a megabyte line costs milliseconds: a quote delimits a string unless an odd run
    of backslashes precedes it, and UTF-8 never puts an ASCII byte inside a multi-byte character.
    """
    c = np.frombuffer(line, np.uint8)
    idx = np.arange(c.size)
    last_other = np.maximum.accumulate(np.where(c == ord("\\"), -1, idx))
    backslashes_before = np.zeros_like(idx)
    backslashes_before[1:] = idx[:-1] - last_other[:-1]
    delimiter = (c == ord('"')) & (backslashes_before % 2 == 0)
    outside = np.cumsum(delimiter) % 2 == 0
    opens = ((c == ord("[")) | (c == ord("{"))) & outside
    closes = ((c == ord("]")) | (c == ord("}"))) & outside
    return int(np.cumsum(opens.astype(np.int64) - closes).max(initial=0))


class LiteralFloat(float):
    """A float parsed from a JSON number it cannot hold exactly; `literal` is the number's text."""

    __slots__ = ("literal",)

    def __new__(cls, literal: str) -> LiteralFloat:
        value = super().__new__(cls, literal)
        value.literal = literal
        return value


def _parse_float(literal: str) -> float:
    value = float(literal)
    if repr(value) == literal or Decimal(repr(value)) == Decimal(literal):
        return value
    return LiteralFloat(literal)


_MAX_KEY_CHARS = 60  # of a duplicate key quoted in a message


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    row = dict(pairs)
    if len(row) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                break
            seen.add(key)
        shown = repr(key if len(key) <= _MAX_KEY_CHARS else key[:_MAX_KEY_CHARS] + "...")
        raise MalformedRowError("duplicate_key", f"the key {shown} appears twice in one object")
    return row


# A \uD800-\uDFFF escape: json.loads turns an unpaired one into a str that has no UTF-8 form, which
# a tokenizer rejects long after loading.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


def parse_line(raw: bytes, number: int) -> Any:
    """One non-blank line as a JSON value, or the `MalformedRowError` that says why it is not."""
    if b"\0" in raw:
        return MalformedRowError(
            "nul_byte",
            f"a NUL byte at byte {raw.index(0) + 1} (a binary, UTF-16 or damaged file?)",
        )
    if number == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a byte order mark some editors write
        raw = raw[3:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return MalformedRowError("bad_utf8", f"invalid UTF-8 at byte {e.start + 1} ({e.reason})")
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH:
        depth = nesting_depth(raw)
        if depth > MAX_DEPTH:
            return MalformedRowError(
                "too_deep", f"arrays and objects nest {depth} deep, over the limit of {MAX_DEPTH}"
            )
    try:
        row = json.loads(text, parse_float=_parse_float, object_pairs_hook=_object)
    except json.JSONDecodeError as e:
        return MalformedRowError("bad_json", f"invalid JSON ({e.msg} at column {e.colno})")
    except MalformedRowError as e:  # from a hook
        return e
    except RecursionError:  # after the depth check, only when called near the recursion limit
        return MalformedRowError("too_deep", "arrays and objects nest too deep to parse")
    except ValueError as e:  # an integer longer than Python converts (sys.get_int_max_str_digits)
        return MalformedRowError("bad_json", f"invalid JSON ({e})")
    if _SURROGATE_ESCAPE.search(text):
        try:
            json.dumps(row, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            return MalformedRowError(
                "lone_surrogate", "a \\u escape leaves an unpaired surrogate, which is not text"
            )
    return row


def read_rows(path: Path, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, Any]]:
    """(1-based line number, parsed object or a `MalformedRowError`) for each non-blank line.

    The file is read as bytes and each line decoded alone, so a damaged line costs only itself;
    lines split at "\\n" only. A line over `max_line_bytes` is skipped without being held. A path
    ending in ".gz" is read through gzip; where its data is truncated or damaged, the rows before
    are yielded and then one error for the line that could not be read ("truncated",
    "bad_gzip").
    """
    with gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb") as f:
        number = 0
        try:
            while raw := f.readline(max_line_bytes + 1):
                number += 1
                if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                    size = len(raw) + skip_rest_of_line(f)
                    yield (
                        number,
                        MalformedRowError(
                            "line_too_long",
                            f"the line holds {size} bytes, over the limit of {max_line_bytes}",
                        ),
                    )
                    continue
                if raw.strip():  # JSON whitespace is ASCII; a blank line is not a row
                    yield number, parse_line(raw, number)
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
            yield number + 1, _damaged(path, number, e)


def _damaged(path: Path, number: int, error: Exception) -> MalformedRowError:
    if isinstance(error, EOFError):
        return MalformedRowError(
            "truncated",
            f"{str(path)!r} ends before its end-of-stream marker (truncated?): the rows after "
            f"line {number} are lost",
        )
    return MalformedRowError("bad_gzip", f"{str(path)!r} is damaged after line {number} ({error})")
