"""Datasets: the real local copies, malformed rows, hub fallbacks, filters, splits, generated
tasks (countdown solvable by construction)."""

from __future__ import annotations

import ast
import json
import operator
import sys
import types
from collections import Counter
from fractions import Fraction
from pathlib import Path

import pytest

from rlvr_jax.data import countdown_tasks
from rlvr_jax.data import datasets as ds
from tests.shared_data import DATA, needs_shared_data

# Row counts from ../shared/data/README.md.
COUNTS = [
    ("gsm8k", "test", 1319),
    ("gsm8k", "train", 7473),
    ("math500", "test", 500),
    ("aime", "test", 30),
    ("amc", "test", 83),
]


@needs_shared_data
@pytest.mark.parametrize(("name", "split", "rows"), COUNTS)
def test_local_copies_load_completely(name, split, rows):
    examples, report = ds.load_jsonl(name, DATA, split)
    assert len(examples) == report.loaded == report.rows == rows
    assert report.skipped == {} and report.excluded == {}
    assert len({ex.id for ex in examples}) == rows
    assert all(ex.source == name and ex.prompt_text and ex.answer for ex in examples)
    # A file path works as well as a directory + split.
    again, _ = ds.load_jsonl(name, DATA / name / f"{split}.jsonl", split)
    assert again == examples


@needs_shared_data
def test_gsm8k_gold_is_the_final_number_without_commas():
    examples, _ = ds.load_jsonl("gsm8k", DATA, "test")
    assert examples[0].id == "gsm8k/test/0"
    assert examples[0].answer == "18"
    assert examples[0].prompt_text.startswith("Janet")
    raw = [json.loads(line) for line in (DATA / "gsm8k" / "test.jsonl").open()]
    with_commas = [i for i, r in enumerate(raw) if "," in r["answer"].rsplit("####", 1)[1]]
    assert with_commas, "the test needs golds written with thousands separators"
    for i in with_commas:
        assert "," not in examples[i].answer
        assert examples[i].answer == raw[i]["answer"].rsplit("####", 1)[1].strip().replace(",", "")
    for ex in examples:
        float(ex.answer)  # every GSM8K gold is a plain number
    # The written solution, without its calculator annotations, is the example's thought.
    thought = examples[0].meta["thought"]
    assert thought.startswith("Janet sells 16 - 3 - 4 = 9 duck eggs a day.")
    assert "<<" not in thought and "####" not in thought
    assert all("<<" not in ex.meta["thought"] and ex.meta["thought"] for ex in examples)


def test_gsm8k_thought_by_hand():
    solution = "She has 48/2 = <<48/2=24>>24 left.\nThen 24+1=<<24+1=25>>25.\n#### 25"
    assert ds.gsm8k_thought(solution) == "She has 48/2 = 24 left.\nThen 24+1=25."
    assert ds.gsm8k_thought("no marker") == ""
    assert ds.gsm8k_thought(25) == ""


@needs_shared_data
def test_amc_float_answers_become_integers_and_difficulties_are_kept():
    examples, _ = ds.load_jsonl("amc", DATA)
    raw = [json.loads(line) for line in (DATA / "amc" / "test.jsonl").open()]
    assert examples[0].answer == "142"
    for ex, r in zip(examples, raw, strict=True):
        assert isinstance(r["answer"], float)
        assert ex.answer == (
            str(int(r["answer"])) if r["answer"].is_integer() else repr(r["answer"])
        )
        assert ex.difficulty == r["difficulty"]
    math, _ = ds.load_jsonl("math500", DATA)
    assert Counter(ex.difficulty for ex in math) == {5.0: 134, 4.0: 128, 3.0: 105, 2.0: 90, 1.0: 43}


@needs_shared_data
def test_multiple_choice_items_of_math500_are_excluded():
    examples, report = ds.load_jsonl("math500", DATA, exclude_multiple_choice=True)
    assert report.excluded == {"multiple_choice": 3}
    assert len(examples) == 497
    ids = {ex.id for ex in examples}
    # The three choice-letter items, by their 0-based line index.
    assert not ids & {"math500/test/227", "math500/test/255", "math500/test/296"}
    assert "excluded 3 [multiple_choice: 3]" in report.summary()


MULTIPLE_CHOICE = [
    ("\\text{(C)}", "Which shape? (A) Line (B) Circle (C) Plane", True),
    ("(B)", "$\\textbf{(A)}\\ 3 \\qquad \\textbf{(B)}\\ 4$", True),
    ("B", "Pick one.\nA. red\nB. blue\nC. green", True),
    ("A, C", "Which hold? (A) x>0 (B) x<0 (C) x=1", True),
    ("$\\textbf{(D)}$", "(A) 1 (B) 2 (C) 3 (D) 4 (E) 5", True),
    ("C", "Point C lies on the circle through A and B. Name the point.", False),
    ("D", "(A) 1 (B) 2 (C) 3", False),  # D is not offered
    ("5", "(A) 1 (B) 5", False),
    ("(A)", "Compute f(A) for the set A.", False),  # one parenthesised letter is no choice list
    ("\\text{east}", "(A) north (B) east", False),
]


@pytest.mark.parametrize(("answer", "question", "expected"), MULTIPLE_CHOICE)
def test_is_multiple_choice(answer, question, expected):
    assert ds.is_multiple_choice(question, answer) is expected


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("True", True),
        ("false", True),
        ("\\text{Yes}", True),
        ("no.", True),
        ("$\\text{NO}$", True),
        ("\\text{even}", False),
        ("Nope", False),
        ("yes 3", False),
        ("0", False),
    ],
)
def test_is_true_false(answer, expected):
    assert ds.is_true_false(answer) is expected


def test_true_false_rows_are_excluded(tmp_path):
    rows = [
        {"problem": "Is 7 prime?", "answer": "Yes"},
        {"problem": "Is 2 > 3?", "answer": "\\text{False}"},
        {"problem": "1+1?", "answer": "2"},
        {"problem": "Pick: (A) 1 (B) 2", "answer": "B"},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    kept, report = ds.load_jsonl("math500", path, exclude_true_false=True)
    assert [ex.answer for ex in kept] == ["2", "B"]
    assert report.excluded == {"true_false": 2}
    kept, report = ds.load_jsonl(
        "math500", path, exclude_true_false=True, exclude_multiple_choice=True
    )
    assert [ex.answer for ex in kept] == ["2"]
    assert report.excluded == {"true_false": 2, "multiple_choice": 1}


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_malformed_rows_are_counted_and_skipped(tmp_path):
    good = json.dumps({"question": "2+2?", "answer": "2+2=4\n#### 4"})
    path = _write(
        tmp_path / "gsm8k.jsonl",
        [
            good,  # line 1
            '{"question": "broken", "answer": ',  # 2: bad JSON
            json.dumps({"question": "no answer field"}),  # 3
            json.dumps({"question": "empty gold", "answer": "work\n####   "}),  # 4
            json.dumps({"question": "no marker", "answer": "just 5"}),  # 5
            "",  # 6: blank, not a row
            json.dumps(["a", "list"]),  # 7
            json.dumps({"question": "", "answer": "#### 1"}),  # 8
            json.dumps({"question": "big", "answer": "so\n#### 1,234,567"}),  # 9
            json.dumps({"question": "null", "answer": None}),  # 10
        ],
    )
    examples, report = ds.load_jsonl("gsm8k", path, "train")
    assert [(ex.id, ex.answer) for ex in examples] == [
        ("gsm8k/train/0", "4"),
        ("gsm8k/train/8", "1234567"),  # ids keep the line index
    ]
    assert report.rows == 9 and report.loaded == 2
    assert report.skipped == {
        "bad_json": 1,
        "missing_field": 2,
        "empty_answer": 1,
        "no_final_answer": 1,
        "not_an_object": 1,
        "empty_question": 1,
    }
    assert report.first_lines == {
        "bad_json": (2,),
        "missing_field": (3, 10),
        "empty_answer": (4,),
        "no_final_answer": (5,),
        "not_an_object": (7,),
        "empty_question": (8,),
    }
    summary = report.summary()
    assert "skipped 7 malformed" in summary and "missing_field: 2 (lines 3, 10)" in summary


def test_first_lines_are_capped_and_duplicate_ids_skipped(tmp_path):
    lines = ["not json"] * 8 + [json.dumps({"problem": "q", "answer": 27.0})]
    path = _write(tmp_path / "amc.jsonl", lines)
    examples, report = ds.load_jsonl("amc", path)
    assert [ex.answer for ex in examples] == ["27"]
    assert report.skipped == {"bad_json": 8}
    assert report.first_lines["bad_json"] == (1, 2, 3, 4, 5)
    assert "lines 1, 2, 3, 4, 5, ...)" in report.summary()
    record = ds.Example("x/1", "q", "1", "x").to_json()
    path = _write(tmp_path / "records.jsonl", [json.dumps(record)] * 2)
    examples, report = ds.load_jsonl("examples", path)
    assert len(examples) == 1 and report.skipped == {"duplicate_id": 1}


@pytest.mark.parametrize(
    ("answer", "expected"),
    [(27.0, "27"), (0.5, "0.5"), (-3.0, "-3"), (12, "12"), (" 7 ", "7"), ("\\frac12", "\\frac12")],
)
def test_scalar_answers(tmp_path, answer, expected):
    path = _write(tmp_path / "a.jsonl", [json.dumps({"problem": "q", "answer": answer})])
    (ex,), _ = ds.load_jsonl("aime", path)
    assert ex.answer == expected


def test_a_file_with_no_good_row_raises_naming_the_problems(tmp_path):
    path = _write(tmp_path / "bad.jsonl", ["{oops", json.dumps({"problem": "q", "answer": NAN})])
    with pytest.raises(ValueError, match=r"every one of its 2 rows is malformed") as e:
        ds.load_jsonl("aime", path)
    assert "line 1: invalid JSON" in str(e.value) and "bad_answer" in str(e.value)
    empty = _write(tmp_path / "empty.jsonl", [""])
    with pytest.raises(ValueError, match="holds no rows"):
        ds.load_jsonl("aime", empty)


NAN = float("nan")


def test_missing_paths_and_names_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ds.load_jsonl("gsm8k", tmp_path / "nope.jsonl")
    with pytest.raises(FileNotFoundError, match="'validation' split of 'gsm8k'"):
        ds.load_jsonl("gsm8k", tmp_path, "validation")
    with pytest.raises(ValueError, match="'mmlu' is not known"):
        ds.load_jsonl("mmlu", _write(tmp_path / "t.jsonl", ['{"question": "q", "answer": "1"}']))


def test_examples_round_trip_through_jsonl(tmp_path):
    examples = ds.arithmetic_examples(5, seed=3, level=[1, 2]) + [
        ds.Example("m/1", "What is $x$?", "\\frac{1}{2}", "math500", None, {"note": "é"})
    ]
    path = tmp_path / "out" / "examples.jsonl"
    assert ds.write_examples(path, examples) == 6
    back, report = ds.load_jsonl("examples", path)
    assert back == examples and report.loaded == 6


def test_hub_absence_says_to_pass_a_local_path(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails
    with pytest.raises(ds.DataSourceError, match="pass a local JSONL path") as e:
        ds.load_hf("gsm8k")
    assert "`datasets` is not installed" in str(e.value)
    with pytest.raises(ds.DataSourceError, match="pass a local JSONL path"):
        ds.load("math500")  # no path: the hub is tried
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(ds.DataSourceError, match="pass a local JSONL path"):
        ds.load("gsm8k", hub="tfds")
    with pytest.raises(ds.DataSourceError, match="TFDS has no builder for 'aime'"):
        ds.load_tfds("aime")


def test_hub_download_failure_says_to_pass_a_local_path(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("could not reach huggingface.co")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    with pytest.raises(ds.DataSourceError, match="ConnectionError") as e:
        ds.load_hf("aime")
    assert "'HuggingFaceH4/aime_2024' split 'train'" in str(e.value)
    assert "../shared/data/aime/test.jsonl" in str(e.value)


def test_hub_rows_go_through_the_same_parsing(monkeypatch):
    calls = []

    def load_dataset(path, config, split):
        calls.append((path, config, split))
        return [
            {"problem": "p0", "answer": "3", "level": "Level 4"},
            {"problem": "p1"},  # malformed
            {"problem": "p2", "answer": "\\text{(A)}", "level": 2},
        ]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    examples, report = ds.load_hf("math500")
    assert calls == [("HuggingFaceH4/MATH-500", None, "test")]
    assert [(ex.id, ex.difficulty) for ex in examples] == [
        ("math500/test/0", 4.0),
        ("math500/test/2", 2.0),
    ]
    assert (
        report.skipped == {"missing_field": 1}
        and report.origin == "hf:HuggingFaceH4/MATH-500[test]"
    )

    fake_tfds = types.SimpleNamespace(
        load=lambda name, split, data_dir: (name, split),
        as_numpy=lambda d: [{"question": b"q?", "answer": b"x\n#### 1,000"}],
    )
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake_tfds)
    examples, _ = ds.load("gsm8k", hub="tfds", split="train")
    assert examples == [ds.Example("gsm8k/train/0", "q?", "1000", "gsm8k", meta={"thought": "x"})]


@needs_shared_data
def test_shuffle_and_holdout_are_seeded():
    examples, _ = ds.load_jsonl("aime", DATA)
    a, b, c = ds.shuffled(examples, 0), ds.shuffled(examples, 0), ds.shuffled(examples, 1)
    assert a == b and a != c and a != examples
    assert sorted(a, key=examples.index) == examples
    train, held = ds.split_holdout(examples, 0.2, seed=5)
    assert len(held) == 6 and len(train) == 24
    assert {ex.id for ex in train}.isdisjoint(ex.id for ex in held)
    assert sorted(train + held, key=examples.index) == examples
    assert train == sorted(train, key=examples.index)  # input order kept
    assert ds.split_holdout(examples, 6, seed=5) == (train, held)
    assert ds.split_holdout(examples, 6, seed=6) != (train, held)
    with pytest.raises(ValueError, match="outside"):
        ds.split_holdout(examples, 31, seed=0)
    with pytest.raises(ValueError, match=r"in \(0, 1\)"):
        ds.split_holdout(examples, 1.0, seed=0)


def test_arithmetic_examples():
    examples = ds.arithmetic_examples(40, seed=1, level=[1, 5])
    assert examples == ds.arithmetic_examples(40, seed=1, level=[1, 5])
    assert [ex.difficulty for ex in examples[:4]] == [1.0, 5.0, 1.0, 5.0]
    for ex in examples:
        assert ex.answer == str(_evaluate(ex.prompt_text)) == str(ex.meta["value"])
        terms = ex.prompt_text.replace("-", "+").replace("*", "+").split("+")
        assert len(terms) == (2 if ex.difficulty == 1.0 else 4)
    assert ds.load("arithmetic", num=3, seed=1, level=[1, 5])[0] == examples[:3]
    with pytest.raises(ValueError, match="arithmetic level 9"):
        ds.arithmetic_examples(2, seed=0, level=9)


_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def _evaluate(expression: str) -> Fraction:
    """Exact value of a trusted, generated + - * / expression (no eval)."""

    def walk(node):
        if isinstance(node, ast.BinOp):
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant):
            return Fraction(node.value)
        raise AssertionError(f"unexpected node {ast.dump(node)}")

    return walk(ast.parse(expression, mode="eval").body)


def _leaves(expression: str) -> list[int]:
    return sorted(
        n.value for n in ast.walk(ast.parse(expression, mode="eval")) if isinstance(n, ast.Constant)
    )


def test_countdown_problems_are_solvable_by_construction():
    examples = countdown_tasks.countdown_examples(300, seed=0, max_target=500)
    assert examples == countdown_tasks.countdown_examples(300, seed=0, max_target=500)
    assert Counter(ex.difficulty for ex in examples).keys() == {3.0, 4.0}
    used_ops = set()
    for ex in examples:
        numbers, target, solution = ex.meta["numbers"], ex.meta["target"], ex.meta["solution"]
        assert ex.answer == solution and 1 <= target <= 500
        assert len(numbers) == ex.difficulty and all(1 <= x <= 100 for x in numbers)
        assert _evaluate(solution) == target
        assert _leaves(solution) == sorted(numbers)  # each number used exactly once
        assert f"[{', '.join(map(str, numbers))}]" in ex.prompt_text
        assert f"equals {target}." in ex.prompt_text
        used_ops |= set(solution) & set("+-*/")
    assert used_ops == set("+-*/")


def test_countdown_settings_are_checked():
    three = countdown_tasks.countdown_examples(20, seed=2, num_numbers=(3,), operators="+-")
    assert all(len(ex.meta["numbers"]) == 3 for ex in three)
    assert all(set(ex.meta["solution"]) & set("*/") == set() for ex in three)
    assert "operations (+, -)" in three[0].prompt_text
    with pytest.raises(ValueError, match=r"target in \[100000, 200000\]"):
        countdown_tasks.countdown_examples(
            2, seed=0, num_numbers=(3,), max_number=9, min_target=100_000, max_target=200_000
        )
    with pytest.raises(ValueError, match=r"operators='\+%'"):
        countdown_tasks.countdown_examples(2, seed=0, operators="+%")
    with pytest.raises(ValueError, match=r"num_numbers=\(1,\)"):
        countdown_tasks.countdown_examples(2, seed=0, num_numbers=(1,))
    assert ds.load("countdown", num=4, seed=2, level=3)[0] == countdown_tasks.countdown_examples(
        4, seed=2, num_numbers=(3,)
    )
