"""reasoning-gym tasks as Examples: names, seeds, levels, mixes and config overrides."""

import collections
import json

import pytest

pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (extra .[tasks])")

from rlvr_jax.data import datasets  # noqa: E402
from rlvr_jax.data import reasoning_gym_tasks as rgt  # noqa: E402


def test_the_same_seed_gives_the_same_examples_and_another_seed_others():
    a = rgt.reasoning_gym_examples("reasoning_gym:leg_counting", 6, seed=3)
    b = rgt.reasoning_gym_examples("reasoning_gym:leg_counting", 6, seed=3)
    c = rgt.reasoning_gym_examples("reasoning_gym:leg_counting", 6, seed=4)
    assert a == b and [e.hidden for e in a] == [e.hidden for e in b]
    assert [e.prompt_text for e in a] != [e.prompt_text for e in c]
    ex = a[0]
    assert ex.source == "rg:leg_counting" and ex.difficulty == 1.0
    assert ex.id.startswith("rg/leg_counting/1/3/")
    entry = json.loads(ex.hidden["rg_entry"])
    assert str(entry["answer"]) == ex.answer and ex.hidden["rg_task"] == "leg_counting"


def test_a_mix_splits_by_weight_and_each_task_by_level():
    name = "reasoning_gym:leg_counting,basic_arithmetic"
    examples = rgt.reasoning_gym_examples(name, 12, seed=0, levels=(1, 2), weights=(2.0, 1.0))
    counts = collections.Counter((e.source, e.difficulty) for e in examples)
    assert counts == {
        ("rg:leg_counting", 1.0): 4,
        ("rg:leg_counting", 2.0): 4,
        ("rg:basic_arithmetic", 1.0): 2,
        ("rg:basic_arithmetic", 2.0): 2,
    }
    assert len({e.id for e in examples}) == 12
    # A task's problems do not depend on the other tasks of the mix.
    alone = rgt.reasoning_gym_examples("reasoning_gym:basic_arithmetic", 4, seed=0, levels=(1, 2))
    mixed = {e.id: e.prompt_text for e in examples if e.source == "rg:basic_arithmetic"}
    assert {e.id: e.prompt_text for e in alone} == mixed


def test_a_higher_level_sets_harder_settings():
    easy = rgt.task_configuration("leg_counting", 1, {}, seed=0, size=4)
    hard = rgt.task_configuration("leg_counting", 4, {}, seed=0, size=4)
    assert hard.max_animals > easy.max_animals
    assert rgt.max_level("leg_counting") >= 4
    with pytest.raises(ValueError, match="has no difficulty levels"):
        rgt.task_configuration("acre", 2, {}, seed=0, size=1)


def test_task_config_overrides_a_field_and_names_a_bad_one():
    text = json.dumps({"leg_counting": {"max_animals": 1, "min_animals": 1}})
    examples = rgt.reasoning_gym_examples("reasoning_gym:leg_counting", 3, 0, 3, task_config=text)
    assert all(json.loads(e.hidden["rg_config"])["max_animals"] == 1 for e in examples)
    with pytest.raises(ValueError, match=r"\['no_such_field'\] are not fields"):
        rgt.reasoning_gym_examples(
            "reasoning_gym:leg_counting", 1, 0, task_config='{"leg_counting": {"no_such_field": 1}}'
        )
    with pytest.raises(ValueError, match="not in data.name"):
        rgt.reasoning_gym_examples("reasoning_gym:gcd", 1, 0, task_config='{"lcm": {}}')


@pytest.mark.parametrize(
    "name, match",
    [
        ("reasoning_gym:", "names no task"),
        ("reasoning_gym:gcd,gcd", "twice"),
        ("reasoning_gym:puzzle24", "not in the reviewed list"),
        ("reasoning_gym:no_such_task", "not in the reviewed list"),
    ],
)
def test_bad_names_are_refused(name, match):
    with pytest.raises(ValueError, match=match):
        rgt.reasoning_gym_examples(name, 2, 0)


def test_datasets_load_and_specs_take_the_reasoning_gym_names():
    examples, report = datasets.load(
        "reasoning_gym:gcd,lcm", num=4, seed=1, level=[1, 2], weights=(1.0, 1.0)
    )
    assert report is None and len(examples) == 4
    assert {e.source for e in examples} == {"rg:gcd", "rg:lcm"}
    assert datasets.parse_spec("reasoning_gym:gcd,lcm") == ("reasoning_gym:gcd,lcm", "")
    assert datasets.parse_spec("examples:/tmp/x.jsonl") == ("examples", "/tmp/x.jsonl")
