"""configs/rg_curriculum.py: both variants share prompts and budget, and the data carries the
levels the curriculum moves between."""

import collections
import dataclasses

import pytest

pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (extra .[tasks])")

from configs import rg_curriculum  # noqa: E402
from rlvr_jax.program import settings as settings_lib  # noqa: E402
from rlvr_jax.program.parts import build  # noqa: E402
from rlvr_jax.program.studies import ablation


def test_the_variants_differ_only_in_the_sampler_and_share_levelled_data():
    section, base = ablation.split_config(rg_curriculum.get_config())
    assert section.variants == rg_curriculum.VARIANTS and section.seeds == (0, 1, 2)
    built = {
        v: settings_lib.settings_from_config(ablation.variant_config(base, v, 1, section))
        for v in section.variants
    }
    static, curriculum = built["grpo"], built["difficulty_curriculum"]
    assert (static.data.sampler, curriculum.data.sampler) == ("epoch", "curriculum")
    assert curriculum.curriculum.ordered and not static.curriculum.ordered
    assert dataclasses.replace(curriculum.data, sampler="epoch") == static.data
    assert (static.train, static.rl) == (curriculum.train, curriculum.rl)
    train, evals, _ = build.load_examples(static.data)
    assert (len(train), len(evals)) == (1536, 96)
    levels = collections.Counter((e.source, e.difficulty) for e in train + evals)
    assert len(levels) == len(rg_curriculum.TASKS) * 3


@pytest.mark.parametrize("arg", ["tiny", "qwen"])
def test_the_other_settings_build(arg):
    section, base = ablation.split_config(rg_curriculum.get_config(arg))
    for v in section.variants:
        config = ablation.variant_config(base, v, 0, section)
        settings_lib.settings_from_config(config, check_devices=False)
    if arg == "tiny":
        assert section.warm_start_steps > 0
        settings = settings_lib.settings_from_config(base, check_devices=False)
        train, evals, _ = build.load_examples(settings.data)
        used = {c for e in train + evals for c in e.prompt_text + e.answer + "\n"}
        assert used <= set(rg_curriculum.TINY_ALPHABET)  # the character tokenizer covers them
