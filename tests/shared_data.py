"""The local copies of GSM8K, MATH-500, AIME and AMC that tests read, and the skip when absent.

The copies live beside the checkout (`../shared/data`, see its README.md) on the project's own
machines only; a clone anywhere else has no such directory, and the tests that read it skip with a
reason that says where the data was looked for.
"""

from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

needs_shared_data = pytest.mark.skipif(
    not DATA.is_dir(),
    reason=f"{DATA} is absent (the JSONL copies of GSM8K, MATH-500, AIME and AMC it would hold "
    "exist beside the project's own checkouts only)",
)
