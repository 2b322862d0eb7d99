"""The in-graph arithmetic verifier reads the last number of a response, and nothing else."""

import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.rewards import arithmetic as ar

TOK = Tokenizer.from_characters("0123456789+-*= .x")
TABLE = ar.DigitTable.from_tokenizer(TOK, 32)

# (response text, ended with eos, expected answer, correct, format)
CASES = [
    ("12", True, 12, 1, 1),
    ("12", False, 12, 1, 0),  # right but ran out of tokens: no format credit
    ("x 12", True, 12, 1, 1),
    ("3+9=12", True, 12, 1, 1),  # the last number counts
    ("12 13", True, 12, 0, 1),
    ("112", True, 12, 0, 1),  # no suffix match
    ("012", True, 12, 0, 1),  # leading zero is a different spelling
    ("1 2", True, 12, 0, 1),
    ("-7", True, -7, 1, 1),
    ("7", True, -7, 0, 1),
    ("-7", True, 7, 0, 1),
    ("5-7", True, -2, 0, 1),  # "-7" after a digit is still read as the number -7
    ("x", True, 0, 0, 0),
    ("", True, 0, 0, 0),
    ("0", True, 0, 1, 1),
    ("12.", True, 12, 1, 1),
    ("1234567", True, 1234567, 1, 1),
]


def _rows(texts, width):
    ids = [TOK.encode(t) for t in texts]
    T = max(1, max(len(i) for i in ids))
    tokens = np.zeros((len(ids), T), np.int32)
    mask = np.zeros((len(ids), T), bool)
    for n, row in enumerate(ids):
        tokens[n, : len(row)] = row
        mask[n, : len(row)] = True
    return jnp.asarray(tokens), jnp.asarray(mask)


def test_table_of_responses():
    texts = [c[0] for c in CASES]
    tokens, mask = _rows(texts, 8)
    answers = ar.encode_answers([c[2] for c in CASES], 8)
    ended = jnp.asarray([c[1] for c in CASES])
    reward, parts = ar.arithmetic_reward(tokens, mask, ended, answers, TABLE)
    correct, fmt = np.asarray(parts["correct"]).tolist(), np.asarray(parts["format"]).tolist()
    got = list(zip(correct, fmt, strict=True))
    want = [(float(c[3]), float(c[4])) for c in CASES]
    assert got == want, [(c[0], g, w) for c, g, w in zip(CASES, got, want, strict=True) if g != w]
    np.testing.assert_array_equal(np.asarray(reward), np.asarray(parts["correct"]))


def test_padding_after_the_response_is_ignored():
    tokens, mask = _rows(["12"], 4)
    tokens = jnp.concatenate([tokens, jnp.full((1, 3), TOK.encode("9")[0])], axis=1)
    mask = jnp.concatenate([mask, jnp.zeros((1, 3), bool)], axis=1)
    _, parts = ar.arithmetic_reward(
        tokens, mask, jnp.asarray([True]), ar.encode_answers([12], 4), TABLE
    )
    assert float(parts["correct"][0]) == 1.0


def test_generated_problems_are_seeded_and_correct():
    a = ar.generate_problems(50, seed=1, num_operands=3, max_digits=2, operators="+-*")
    b = ar.generate_problems(50, seed=1, num_operands=3, max_digits=2, operators="+-*")
    assert a == b
    for p in a:
        assert p.answer >= 0
        # Check the value with Python's own parser on these trusted, generated strings.
        assert p.answer == int(np.round(float(_reference_value(p.expression))))


def _reference_value(expression: str) -> int:
    import ast
    import operator

    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}

    def ev(node):
        if isinstance(node, ast.BinOp):
            return ops[type(node.op)](ev(node.left), ev(node.right))
        return node.value

    return ev(ast.parse(expression, mode="eval").body)


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="num_operands=1"):
        ar.generate_problems(1, seed=0, num_operands=1)
    with pytest.raises(ValueError, match="operators='/'"):
        ar.generate_problems(1, seed=0, operators="/")
    with pytest.raises(ValueError, match="width=2"):
        ar.encode_answers([123], 2)
    merged = Tokenizer.from_characters("x")
    with pytest.raises(ValueError):
        ar.DigitTable.from_tokenizer(merged, 8)
