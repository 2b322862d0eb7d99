"""Damaged JSONL rows are counted by reason with their line numbers and skipped, never a crash:
bytes that are not UTF-8, NUL bytes, over-long lines, JSON nested 100k deep, huge integers, lone
surrogate escapes; for the problem loaders and the demonstrations loader alike."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr_jax.data import datasets as ds
from rlvr_jax.data import jsonl
from rlvr_jax.sft.data import load_demonstrations

REPO = Path(__file__).resolve().parents[2]
DEEP = b"[" * 100_000 + b"]" * 100_000
# Braces in strings are text: LaTeX-heavy rows hold hundreds and are not deep.
LATEX = "\\frac{1}{2}" * 200


def _write_bytes(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _row(problem: str, answer: str = "1", **extra) -> bytes:
    return json.dumps({"problem": problem, "answer": answer, **extra}).encode()


def _nested(depth: int) -> bytes:
    """A row whose extra field makes the whole line nest exactly `depth` deep."""
    inner = "[" * (depth - 1) + "]" * (depth - 1)
    return b'{"problem": "nested", "answer": "2", "extra": ' + inner.encode() + b"}"


def test_every_kind_of_bad_line_is_counted_with_its_line(tmp_path):
    lines = [
        _row("good 1"),  # 1
        b'{"problem": "caf\xe9", "answer": "1"}',  # 2: Latin-1, not UTF-8
        _row("pi is \u03c0", "3"),  # 3: real UTF-8 after the bad line
        b'{"problem": "q\x00", "answer": "1"}',  # 4
        DEEP,  # 5
        b'{"problem": "broken", ',  # 6
        b"",  # 7: blank, not a row
        b"[1, 2]",  # 8
        b'{"answer": "1"}',  # 9
        _row("empty answer", "  "),  # 10
        b'{"problem": "\\ud800 alone", "answer": "1"}',  # 11
        _row("x" * 1_500_000),  # 12: over the megabyte limit
        b'{"problem": "q", "answer": 1' + b"0" * 5000 + b"}",  # 13: more digits than int() takes
        _row(LATEX, "\\frac{1}{2}"),  # 14
        _row('"[[[[' * 300 + "\\", "4"),  # 15: quotes, brackets, backslashes in a string
        b'{"problem": "\\ud83d\\ude00 pair", "answer": "5"}',  # 16: a paired escape is text
        _nested(jsonl.MAX_DEPTH),  # 17: at the limit
        _nested(jsonl.MAX_DEPTH + 1),  # 18: over it
        b"null",  # 19
        b'\xff\xfe{"problem": "q", "answer": "1"}',  # 20
        _row("good last", "6"),  # 21
    ]
    path = _write_bytes(tmp_path / "mixed.jsonl", lines)
    examples, report = ds.load_jsonl("math500", path)
    assert [(ex.id, ex.answer) for ex in examples] == [
        ("math500/test/0", "1"),
        ("math500/test/2", "3"),
        ("math500/test/13", "\\frac{1}{2}"),
        ("math500/test/14", "4"),
        ("math500/test/15", "5"),
        ("math500/test/16", "2"),
        ("math500/test/20", "6"),
    ]
    assert examples[1].prompt_text == "pi is \u03c0"
    assert examples[4].prompt_text == "\U0001f600 pair"
    assert report.rows == 20 and report.loaded == 7
    assert report.first_lines == {
        "bad_utf8": (2, 20),
        "nul_byte": (4,),
        "too_deep": (5, 18),
        "bad_json": (6, 13),
        "not_an_object": (8, 19),
        "missing_field": (9,),
        "empty_answer": (10,),
        "lone_surrogate": (11,),
        "line_too_long": (12,),
    }
    assert report.skipped == {r: len(v) for r, v in report.first_lines.items()}
    summary = report.summary()
    assert "skipped 13 malformed" in summary
    for part in ("bad_utf8: 2 (lines 2, 20)", "too_deep: 2 (lines 5, 18)", "line_too_long: 1"):
        assert part in summary


def test_invalid_utf8_in_the_middle_costs_one_line(tmp_path):
    lines = [_row(f"q{i} \u00e9\u03c0\u4e2d", str(i)) for i in range(6)]
    lines[3] = "q3 \u00e9".encode("latin-1")
    path = _write_bytes(tmp_path / "latin.jsonl", lines)
    examples, report = ds.load_jsonl("aime", path)
    assert [ex.answer for ex in examples] == ["0", "1", "2", "4", "5"]
    assert examples[-1].prompt_text == "q5 \u00e9\u03c0\u4e2d"
    assert report.skipped == {"bad_utf8": 1} and report.first_lines == {"bad_utf8": (4,)}


def test_deep_line_is_refused_before_parsing(tmp_path):
    # With the recursion limit raised, json.loads would recurse 100k times in C and could
    # overflow the stack; the bracket scan must refuse the line first. A child process keeps a
    # crash from taking the test run with it.
    path = _write_bytes(tmp_path / "deep.jsonl", [_row("ok"), DEEP, b"{" * 50_000])
    code = (
        "import sys; sys.setrecursionlimit(10**7)\n"
        "from rlvr_jax.data import datasets as ds\n"
        f"ex, r = ds.load_jsonl('amc', {str(path)!r})\n"
        "print(len(ex), dict(r.skipped), dict(r.first_lines))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[0] == "1 {'too_deep': 2} {'too_deep': (2, 3)}"


def test_recursion_error_is_a_skip_when_the_scan_lets_a_line_through(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonl, "MAX_DEPTH", 10**9)
    path = _write_bytes(tmp_path / "deep.jsonl", [DEEP, _row("ok")])
    examples, report = ds.load_jsonl("amc", path)
    assert len(examples) == 1 and report.first_lines == {"too_deep": (1,)}


def _depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _random_value(rng: random.Random, depth: int):
    kind = rng.randrange(4 if depth < 8 else 2)
    if kind == 0:
        return "".join(rng.choice('ab"\\[]{}\u00e9\n') for _ in range(rng.randrange(6)))
    if kind == 1:
        return rng.choice([1, -2.5, None, True])
    if kind == 2:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {
        _random_value(rng, 8) if rng.random() < 0.5 else "k": _random_value(rng, depth + 1)
        for _ in range(rng.randrange(4))
    }


@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_nesting_depth_matches_the_parsed_value(ensure_ascii):
    rng = random.Random(0)
    for _ in range(300):
        value = _random_value(rng, 0)
        text = json.dumps(value, ensure_ascii=ensure_ascii).encode()
        assert jsonl.nesting_depth(text) == _depth(value), text


@pytest.mark.parametrize(
    ("line", "depth"),
    [
        (b"", 0),
        (b'"[["', 0),
        (b'["\\\\"]', 1),  # an escaped backslash, then the closing quote
        (b'["\\"[["]', 1),  # an escaped quote stays inside the string
        (b'[["\\\\\\"[{"]]', 2),
        (b"[[[]][]]", 3),
    ],
)
def test_nesting_depth_table(line, depth):
    assert jsonl.nesting_depth(line) == depth


def test_long_lines_are_skipped_unheld_and_later_lines_keep_their_numbers(tmp_path):
    path = _write_bytes(
        tmp_path / "long.jsonl",
        [_row("a" * 200), _row("ok"), b"x" * 70_000, _row("b" * 60), _row("end")],
    )
    rows = list(jsonl.read_rows(path, max_line_bytes=100))
    assert [n for n, _ in rows] == [1, 2, 3, 4, 5]
    assert [r.reason for _, r in rows if isinstance(r, ds.MalformedRowError)] == [
        "line_too_long",
        "line_too_long",
    ]
    assert "70000 bytes" in str(rows[2][1]) and rows[4][1]["problem"] == "end"
    # A line of exactly the limit is read; one byte more is not.
    exact = _row("q" * (100 - len(_row(""))))
    path = _write_bytes(tmp_path / "edge.jsonl", [exact, exact + b" "])
    rows = list(jsonl.read_rows(path, max_line_bytes=100))
    assert isinstance(rows[0][1], dict) and rows[1][1].reason == "line_too_long"


def test_a_file_of_nothing_usable_names_itself_and_the_reasons(tmp_path):
    # A binary file without newlines is one over-long line, never held whole.
    blob = tmp_path / "weights.bin"
    blob.write_bytes(bytes(b for b in range(256) if b != ord("\n")) * 12_000)
    with pytest.raises(ValueError, match=r"weights\.bin.*every one of its 1 rows") as e:
        ds.load_jsonl("gsm8k", blob)
    assert "line_too_long: 1 (lines 1)" in str(e.value)
    path = _write_bytes(tmp_path / "bad.jsonl", [b"\xc3(", b"\x00\x00", DEEP])
    with pytest.raises(ValueError, match=r"bad\.jsonl") as e:
        ds.load_jsonl("gsm8k", path)
    for part in ("bad_utf8: 1 (lines 1)", "nul_byte: 1 (lines 2)", "too_deep: 1 (lines 3)"):
        assert part in str(e.value)
    # A message that quotes a huge field is clipped.
    path = _write_bytes(tmp_path / "huge.jsonl", [_row(["x" * 100_000])])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty_question") as e:
        ds.load_jsonl("amc", path)
    assert len(str(e.value)) < 1000


def test_byte_order_mark_and_crlf_are_read(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + _row("first", "1") + b"\r\n" + _row("second", "2") + b"\r\n")
    examples, report = ds.load_jsonl("amc", path)
    assert [ex.answer for ex in examples] == ["1", "2"] and report.skipped == {}


def test_demonstrations_loader_skips_the_same_lines(tmp_path):
    def demo(prompt: str, response: str = "r") -> bytes:
        return json.dumps({"prompt": prompt, "response": response}).encode()

    lines = [
        demo("p1"),  # 1
        b'{"prompt": "\xe9", "response": "r"}',  # 2
        demo("p3 \u00e9"),  # 3
        b'{"prompt": "p\x00", "response": "r"}',  # 4
        DEEP,  # 5
        demo("p6", "r" * 1_500_000),  # 6
        b'{"prompt": "\\udc00", "response": "r"}',  # 7
        b"{not json",  # 8
        demo("p9", " "),  # 9
        demo("p10"),  # 10
    ]
    path = _write_bytes(tmp_path / "demos.jsonl", lines)
    demos, report = load_demonstrations(path)
    assert [(d.id, d.prompt) for d in demos] == [
        ("demos/0", "p1"),
        ("demos/2", "p3 \u00e9"),
        ("demos/9", "p10"),
    ]
    assert report.rows == 10 and report.loaded == 3
    assert report.first_lines == {
        "bad_utf8": (2,),
        "nul_byte": (4,),
        "too_deep": (5,),
        "line_too_long": (6,),
        "lone_surrogate": (7,),
        "bad_json": (8,),
        "empty_response": (9,),
    }
    assert report.num_skipped == 7 and "bad_utf8: 1 (lines 2)" in report.summary()
    bad = _write_bytes(tmp_path / "all_bad.jsonl", [b"\xff", DEEP])
    with pytest.raises(ValueError, match=r"all_bad\.jsonl.*every one of its 2 rows") as e:
        load_demonstrations(bad)
    assert "bad_utf8" in str(e.value) and "too_deep" in str(e.value)


def test_a_truncated_gzip_keeps_its_rows_and_names_the_damage(tmp_path, caplog):
    import gzip

    whole = gzip.compress(b"\n".join(_row(f"q{i}", str(i)) for i in range(200)) + b"\n")
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(whole[: len(whole) * 2 // 3])  # a download that stopped
    examples, report = ds.load_jsonl("math500", path)
    assert report.skipped == {"truncated": 1}
    assert 0 < len(examples) < 200
    assert [ex.answer for ex in examples] == [str(i) for i in range(len(examples))]
    assert "truncated" in caplog.text and "cut.jsonl.gz" in caplog.text
    rows = list(jsonl.read_rows(path))
    assert isinstance(rows[-1][1], jsonl.MalformedRowError) and rows[-1][1].reason == "truncated"


def test_a_key_twice_in_one_row_is_counted_and_skipped(tmp_path, caplog):
    path = _write_bytes(
        tmp_path / "dup.jsonl",
        [_row("fine", "1"), b'{"problem": "q", "answer": "1", "answer": "2"}', _row("also", "3")],
    )
    examples, report = ds.load_jsonl("math500", path)
    assert [ex.answer for ex in examples] == ["1", "3"] and report.skipped == {"duplicate_key": 1}
    assert "duplicate_key: 1 (lines 2)" in caplog.text and "'answer'" in caplog.text


def test_a_number_a_float_cannot_hold_is_the_gold_as_written(tmp_path):
    path = _write_bytes(
        tmp_path / "big.jsonl",
        [
            b'{"problem": "a", "answer": 123456789012345678.0}',
            b'{"problem": "b", "answer": 0.1000000000000000000001}',
            b'{"problem": "c", "answer": 27.0}',
            b'{"problem": "d", "answer": 0.5}',
        ],
    )
    answers = [ex.answer for ex in ds.load_jsonl("amc", path)[0]]
    assert answers == ["123456789012345678", "0.1000000000000000000001", "27", "0.5"]
