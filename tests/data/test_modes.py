"""Prompts asked in thinking or non-thinking mode (`data.modes`): the draw, the two switches,
the chat template's per-prompt `enable_thinking`, and the settings that load them."""

import string

import pytest

from rlvr_jax.config_types import ConfigError
from rlvr_jax.data import datasets, modes
from rlvr_jax.data import templates as tp
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.parts import build
from tests.data.test_templates import QWEN3_STYLE


def test_the_mode_is_drawn_from_the_id_in_the_asked_share():
    examples = datasets.arithmetic_examples(2000, seed=0, level=2)
    asked = modes.ask_in_modes(examples, "flag", think_share=0.25, seed=1)
    share = sum(ex.meta["think"] for ex in asked) / len(asked)
    assert 0.22 < share < 0.28
    for ex, orig in zip(asked, examples, strict=True):
        flag = modes.THINK_FLAG if ex.meta["think"] else modes.NO_THINK_FLAG
        assert ex.prompt_text == f"{orig.prompt_text} {flag}" and ex.answer == orig.answer
        assert "enable_thinking" not in ex.meta
    # The draw is per id: a subset or another order gets the same modes.
    again = modes.ask_in_modes(examples[::-7], "flag", think_share=0.25, seed=1)
    assert [ex.meta["think"] for ex in again] == [ex.meta["think"] for ex in asked[::-7]]
    assert {ex.meta["think"] for ex in modes.ask_in_modes(examples, "flag", 0.0)} == {False}
    assert {ex.meta["think"] for ex in modes.ask_in_modes(examples, "flag", 1.0)} == {True}
    with pytest.raises(ValueError, match="switch='flags'"):
        modes.ask_in_modes(examples, "flags")
    with pytest.raises(ValueError, match="think_share=1.5"):
        modes.ask_in_modes(examples, "flag", 1.5)


def test_enable_thinking_renders_each_prompt_in_its_own_mode():
    tok = Tokenizer.from_characters(string.printable, chat_template=QWEN3_STYLE)
    examples = datasets.arithmetic_examples(40, seed=0, level=1)
    asked = modes.ask_in_modes(examples, "enable_thinking", think_share=0.5)
    assert {ex.meta["think"] for ex in asked} == {True, False}
    enc = tp.encode_prompts(asked, tp.get_template("chat"), tok, (256,))
    for ex, ids in zip(enc.examples, enc.ids, strict=True):
        assert ex.prompt_text == ex.prompt_text.rstrip("/think ")  # no flag in the question
        assert ex.meta["enable_thinking"] == ex.meta["think"]
        text = tok.decode(ids)
        assert text.endswith("<think>\n\n</think>\n\n") == (not ex.meta["think"]), text
    with pytest.raises(ValueError, match="thinking modes need chat=True"):
        tp.encode_prompts(asked, tp.get_template("plain"), tok, (256,))


def test_settings_ask_the_training_and_eval_prompts_in_modes():
    config = settings_lib.default_config()
    config.data.num_train, config.data.num_eval = 64, 16
    config.data.modes = "flag"
    config.reward.verifier = "math"
    settings = settings_lib.settings_from_config(config, check_devices=False)
    train, evals, _ = build.load_examples(settings.data)
    for ex in [*train, *evals]:
        assert ex.prompt_text.endswith((" /think", " /no_think")) and "think" in ex.meta
    config.data.modes = "always"
    with pytest.raises(ConfigError, match="data.modes='always'"):
        settings_lib.settings_from_config(config, check_devices=False)
    config.data.modes = ""
    config.reward.format = "mode"
    with pytest.raises(ConfigError, match="reward.format='mode' with data.modes=''"):
        settings_lib.settings_from_config(config, check_devices=False)
    config.data.modes = "flag"
    config.reward.verifier = "arithmetic"
    with pytest.raises(ConfigError, match="reward.format='mode' needs a text verifier"):
        settings_lib.settings_from_config(config, check_devices=False)
