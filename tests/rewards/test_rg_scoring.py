"""reasoning-gym scorers: gold answers score 1 and wrong ones 0 through the verifier pool; a
scorer listed as safe never reaches eval or exec; the eval of the others runs in the sandbox,
where a hostile answer cannot write outside it."""

import builtins
import os
import sys
import tempfile
import time

import pytest

pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (extra .[tasks])")

from rlvr_jax.data import reasoning_gym_tasks as rgt  # noqa: E402
from rlvr_jax.rewards import rg_scoring, sandbox  # noqa: E402
from rlvr_jax.rewards.pool import VerifierPool  # noqa: E402

TASKS = sorted(rg_scoring.SCORERS)
POOL_TASKS = [t for t in TASKS if rg_scoring.SCORERS[t] == rg_scoring.POOL]
SANDBOX_TASKS = [t for t in TASKS if rg_scoring.SCORERS[t] == rg_scoring.SANDBOX]
WRONG = "<answer>certainly not this</answer>"


@pytest.fixture(scope="module")
def examples():
    """Two examples of every listed task, at levels 1 and 2."""
    out = {}
    for task in TASKS:
        levels = (1, 2) if rgt.max_level(task) > 1 else (1,)
        out[task] = rgt.reasoning_gym_examples(f"reasoning_gym:{task}", 2, seed=7, levels=levels)
    return out


def _item(response, ex):
    h = ex.hidden
    return (response, h["rg_task"], h["rg_entry"], h["rg_config"])


def test_the_reviewed_list_covers_twenty_tasks_and_both_placements():
    assert len(TASKS) >= 20
    assert {"spiral_matrix", "string_insertion"} <= set(SANDBOX_TASKS)
    for refused in ("puzzle24", "countdown", "polynomial_multiplication", "simple_integration"):
        assert refused not in rg_scoring.SCORERS


def test_gold_scores_one_and_wrong_scores_zero_through_the_pool(examples):
    items, labels = [], []
    for task, exs in examples.items():
        for ex in exs:
            items += [_item(f"<answer>{ex.answer}</answer>", ex), _item(WRONG, ex)]
            labels += [(task, ex.id, "gold"), (task, ex.id, "wrong")]
    with VerifierPool(
        rg_scoring.score, num_workers=2, deadline_s=30.0, warmup=rg_scoring.WARMUP
    ) as pool:
        values, statuses = pool.map_with_status(items)
    for label, value, status in zip(labels, values, statuses, strict=True):
        assert status == "ok", label
        if label[2] == "gold":
            assert value == 1.0, label
        else:
            assert value < 1.0, (label, value)  # a few tasks give 0.01 for any answer
    assert len({label[0] for label in labels}) >= 20


class _Recorder:
    """Stands in for the guard's refusal and records that a scorer reached it."""

    def __init__(self):
        self.calls = []

    def __call__(self, *args, **kwargs):
        self.calls.append(args[:1])
        raise rg_scoring.EvalRefusedError("recorded")


@pytest.mark.parametrize("task", POOL_TASKS)
def test_a_pool_scorer_never_reaches_eval_or_exec(task, examples, monkeypatch):
    recorder = _Recorder()
    monkeypatch.setattr(rg_scoring, "_refuse", recorder)
    sandboxed = []
    monkeypatch.setattr(rg_scoring, "sandboxed_eval", lambda *a, **k: sandboxed.append(a))
    hostile = "__import__('os').system('true')"
    for ex in examples[task]:
        for response in (f"<answer>{ex.answer}</answer>", WRONG, hostile, "[1, 2]", ""):
            rg_scoring.score(*_item(response, ex))
    assert recorder.calls == [] and sandboxed == [], f"{task} reached eval/exec"
    assert builtins.eval is not recorder and builtins.exec is not recorder  # restored


@pytest.mark.parametrize("task", SANDBOX_TASKS)
def test_a_sandbox_scorer_evaluates_only_in_the_sandbox(task, examples, monkeypatch):
    recorder = _Recorder()
    monkeypatch.setattr(rg_scoring, "_refuse", recorder)
    sandboxed = []
    real = rg_scoring.sandboxed_eval

    def spy(*args, **kwargs):
        sandboxed.append((args[0], kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(rg_scoring, "sandboxed_eval", spy)
    ex = examples[task][0]
    # A Python literal for the answer: every one of these scorers hands it (or its gold) to eval.
    rg_scoring.score(*_item("<answer>['A', 'B']</answer>", ex), "rlimits")
    assert sandboxed, f"{task}: the scorer's eval did not go through the sandbox"
    assert all(kwargs == {"backend": "rlimits"} for _, kwargs in sandboxed)  # the task's backend
    assert recorder.calls == []
    module = sys.modules[type(rg_scoring._dataset(task, ex.hidden["rg_config"])).__module__]
    assert "eval" not in vars(module)  # the binding is undone after the call


def test_the_guard_refuses_eval_in_a_scorer_that_was_not_reviewed(monkeypatch):
    ds = rg_scoring._dataset("basic_arithmetic", "{}")
    monkeypatch.setattr(type(ds), "score_answer", lambda self, a, e: eval(a))
    with pytest.raises(rg_scoring.EvalRefusedError):
        rg_scoring.score_answer("1 + 1", "basic_arithmetic", {"answer": "2", "metadata": {}})


@pytest.mark.parametrize("task", ["n_queens", "spiral_matrix"])
def test_a_hostile_answer_cannot_write_outside_the_sandbox(task, examples, monkeypatch):
    reason = sandbox.bwrap_unavailable_reason()
    if reason is not None:
        pytest.skip(f"bubblewrap, the scorers' default sandbox, cannot start here: {reason}")
    with tempfile.TemporaryDirectory() as visible:
        os.chmod(visible, 0o777)  # writable by anyone: only the sandbox can stop the write
        target = os.path.join(visible, "escaped")
        hostile = f"(open({target!r}, 'w').write('x'), __import__('os').system('touch {target}'))"
        ex = examples[task][0]
        evaluated = []
        real = rg_scoring.sandboxed_eval
        monkeypatch.setattr(
            rg_scoring, "sandboxed_eval", lambda *a, **k: evaluated.append(a) or real(*a, **k)
        )
        value = rg_scoring.score(*_item(f"<answer>{hostile}</answer>", ex))
        assert evaluated == [(hostile,)]  # the scorer did evaluate it, in the sandbox
        assert value == 0.0
        assert not os.path.exists(target)


def test_a_hanging_answer_is_stopped_by_the_sandbox_limits(examples):
    ex = examples["string_insertion"][0]
    start = time.monotonic()
    value = rg_scoring.score(*_item("<answer>[c for c in iter(int, 1)]</answer>", ex))
    assert value == 0.0
    assert time.monotonic() - start < rg_scoring._EVAL_LIMITS.wall_seconds + 3.0


def test_the_answer_is_extracted_as_for_math():
    assert rg_scoring.extract_answer("so <answer> 12 </answer>") == "12"
    assert rg_scoring.extract_answer("<think>\\boxed{1}</think> \\boxed{7}") == "7"
    assert rg_scoring.extract_answer("  cba \n") == "cba"
