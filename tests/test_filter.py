"""The offline difficulty filter: the pure selection and histogram, the host verifier, and the
command end to end on a tiny from-scratch model with a character tokenizer."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from rlvr_jax import filter as filter_cli
from rlvr_jax.data import datasets as ds
from rlvr_jax.data import templates as tp
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.envs.task import Task
from rlvr_jax.model import config as config_lib
from rlvr_jax.model import transformer as tf
from rlvr_jax.program.studies import difficulty

ALPHABET = "0123456789+-*="
# One sampler program serves every test here: same model shape, bucket, rows and length.
N, BATCH_PROMPTS, BUCKET, NEW_TOKENS = 16, 4, 12, 1


def _examples(k: int) -> list[ds.Example]:
    return [ds.Example(f"e/{i}", f"q{i}", str(i), "test") for i in range(k)]


def test_filter_by_success_drops_always_and_optionally_never_solved():
    examples = _examples(6)
    counts = [0, 4, 2, 4, 1, 3]
    kept, stats = difficulty.filter_by_success(examples, counts, 4)
    assert [ex.id for ex in kept] == ["e/0", "e/2", "e/4", "e/5"]
    assert stats == {"total": 6, "kept": 4, "dropped_all_solved": 2, "dropped_never_solved": 0}
    kept, stats = difficulty.filter_by_success(examples, counts, 4, drop_never_solved=True)
    assert [ex.id for ex in kept] == ["e/2", "e/4", "e/5"]
    assert stats["dropped_never_solved"] == 1
    kept, stats = difficulty.filter_by_success(examples, counts, 4, drop_all_solved=False)
    assert kept == examples and stats["kept"] == 6
    with pytest.raises(ValueError, match=r"success_counts\[1\]=5 is outside \[0, 4\]"):
        difficulty.filter_by_success(examples[:2], [0, 5], 4)
    with pytest.raises(ValueError, match=r"expected \(6,\)"):
        difficulty.filter_by_success(examples, [0, 1], 4)


def test_histogram():
    hist = difficulty.success_histogram([0, 4, 2, 4, 1, 0, 0], 4)
    assert hist.tolist() == [3, 1, 1, 0, 2]
    text = difficulty.format_histogram(hist, width=6)
    assert text.splitlines() == [
        "successes/4  prompts",
        "0/4  3  ######",
        "1/4  1  ##",
        "2/4  1  ##",
        "3/4  0",
        "4/4  2  ####",
    ]


@pytest.mark.parametrize(
    ("completion", "gold", "solved"),
    [
        ("The answer is 18.", "18", True),
        ("so 1,234 in all", "1234", True),
        ("x = -5", "-5", True),
        ("x = 5", "-5", False),
        ("18.0", "18", True),
        ("0.50", "0.5", True),
        ("12 then 13", "12", False),
        ("7+8=15", "15", True),
        ("no number", "1", False),
        ("", "0", False),
        ("1/2", "\\frac{1}{2}", False),  # not a numeric gold: never solved here
    ],
)
def test_last_number_verifier(completion, gold, solved):
    example = ds.Example("e", "q", gold, "test")
    assert difficulty.last_number_verifier(completion, example) is solved


@pytest.fixture(scope="module")
def tiny():
    tok = Tokenizer.from_characters(ALPHABET)
    cfg = config_lib.PRESETS["tiny"].replace(vocab_size=tok.vocab_size)
    return tf.init_params(jax.random.key(0), cfg), cfg, tok


def test_count_successes_groups_samples_by_prompt(tiny):
    params, cfg, tok = tiny
    examples = ds.arithmetic_examples(5, seed=0)  # 2 sampler calls, the last one padded
    calls = []

    def verify(text: str, example: ds.Example) -> bool:
        calls.append((text, example.id))
        assert set(text) <= set(ALPHABET)  # decoded, eos dropped
        return example.id in ("arithmetic/0/1", "arithmetic/0/4")

    sampled, counts = difficulty.count_successes(
        params,
        cfg,
        tok,
        examples,
        tp.text_template("{question}="),
        N,
        verify,
        buckets=[BUCKET],
        max_new_tokens=NEW_TOKENS,
        batch_prompts=BATCH_PROMPTS,
    )
    assert sampled == examples
    assert counts.tolist() == [0, N, 0, 0, N]
    assert sorted(i for _, i in calls) == sorted([ex.id for ex in examples] * N)


def test_command_end_to_end(tiny, tmp_path, capsys):
    # Single-digit answers and one generated token: a random policy hits the gold digit in about
    # one sample in 16, so some prompts are never solved and others sometimes.
    problems = [ex for ex in ds.arithmetic_examples(40, seed=0) if len(ex.answer) == 1][:8]
    data = tmp_path / "problems.jsonl"
    ds.write_examples(data, problems)
    output = tmp_path / "kept.jsonl"
    result = filter_cli.run(
        [
            "filter",
            "--model=random:tiny",
            f"--tokenizer=chars:{ALPHABET}",
            "--dataset=examples",
            f"--data_path={data}",
            "--template=text:{question}=",
            f"--num_samples={N}",
            f"--batch_prompts={BATCH_PROMPTS}",
            f"--buckets={BUCKET}",
            f"--max_new_tokens={NEW_TOKENS}",
            "--drop_never_solved",
            f"--output={output}",
        ]
    )
    assert result.examples == problems
    assert result.histogram.tolist() == np.bincount(result.success_counts, minlength=N + 1).tolist()
    kept, stats = difficulty.filter_by_success(
        result.examples, result.success_counts, N, drop_all_solved=True, drop_never_solved=True
    )
    assert stats == result.stats
    assert stats["kept"] > 0 and stats["dropped_never_solved"] > 0
    written, _ = ds.load_jsonl("examples", output)
    assert [ex.id for ex in written] == [ex.id for ex in kept] == [ex.id for ex in result.kept]
    counts = dict(zip((ex.id for ex in problems), result.success_counts.tolist(), strict=True))
    for ex in written:
        assert ex.meta["filter"] == {
            "successes": counts[ex.id],
            "samples": N,
            "model": "random:tiny",
        }
        assert 0 < counts[ex.id] < N
        assert ex.meta["value"] == int(ex.answer)  # the input record's meta is kept
    out = capsys.readouterr().out
    assert difficulty.format_histogram(result.histogram) in out
    assert f"kept {stats['kept']} of 8 prompts" in out
    with pytest.raises(filter_cli.app.UsageError, match="--output is required"):
        filter_cli.run(["filter", "--dataset=arithmetic", "--num_prompts=2"])


class _Scored(Task):
    """A training-verifier stand-in: "correct" is 1 for the listed example ids."""

    name = "scored"

    def __init__(self, solved_ids):
        self.solved_ids, self.calls = solved_ids, []

    def score(self, rollout, examples_N):
        self.calls.append([ex.id for ex in examples_N])
        return {"correct": np.asarray([ex.id in self.solved_ids for ex in examples_N], np.float32)}


def test_count_successes_scores_with_a_training_task(tiny):
    params, cfg, tok = tiny
    examples = ds.arithmetic_examples(5, seed=0)
    task = _Scored({"arithmetic/0/2"})
    _, counts = difficulty.count_successes(
        params,
        cfg,
        tok,
        examples,
        tp.text_template("{question}="),
        N,
        task,
        buckets=[BUCKET],
        max_new_tokens=NEW_TOKENS,
        batch_prompts=BATCH_PROMPTS,
    )
    assert counts.tolist() == [0, 0, N, 0, 0]
    # One call per sampler batch, every row of it (the padded batch repeats its last prompt).
    assert [len(c) for c in task.calls] == [BATCH_PROMPTS * N] * 2
    assert task.calls[1][N:] == ["arithmetic/0/4"] * (BATCH_PROMPTS - 1) * N


def test_command_takes_reasoning_gym_names_and_refuses_a_mismatched_verifier():
    pytest.importorskip("reasoning_gym")
    with pytest.raises(filter_cli.flags.IllegalFlagValueError, match="reasoning_gym:<task>"):
        filter_cli.run(["filter", "--dataset=no_such_set", "--output=/tmp/x.jsonl"])
    args = [
        "filter",
        "--model=random:tiny",
        f"--tokenizer=chars:{ALPHABET}",
        "--num_prompts=2",
        "--output=/tmp/unused.jsonl",
    ]
    with pytest.raises(filter_cli.app.UsageError, match="needs reasoning-gym examples"):
        filter_cli.run([*args, "--dataset=arithmetic", "--verifier=reasoning_gym"])
