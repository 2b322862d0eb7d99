"""Thinking-mode fusion rows against Qwen3's own chat template, and their loss masks."""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np
import pytest
import tokenizers
import transformers

from rlvr_jax.data import templates
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.sft import fusion
from rlvr_jax.sft.data import encode_demonstrations, load_demonstrations
from rlvr_jax.sft.step import make_batch

# Qwen3's chat template; its first line names where it was copied from.
QWEN3_TEMPLATE = (Path(__file__).parents[1] / "data" / "qwen3_chat_template.jinja").read_text()
END = "<|im_end|>"

TRACES = [
    fusion.Trace("a", "What is 2+3?", "The answer is 5.", thought="2 plus 3.\nThat is 5."),
    fusion.Trace("b", "Name a prime.", "7", thought="\nSeven has no divisors but 1 and 7.\n"),
    fusion.Trace("c", "Say hi.", "Hi!"),  # no thought: only a non-thinking row
    fusion.Trace("d", "What is 6*7?", "\n42", thought="Six sevens."),
]


@pytest.fixture(scope="module")
def hf_tokenizer():
    # The chat template is all that is used: a one-word vocabulary will do.
    model = tokenizers.models.WordLevel({"<unk>": 0}, unk_token="<unk>")
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizers.Tokenizer(model))


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_characters(string.printable, eos=END, chat_template=QWEN3_TEMPLATE)


def _hf_render(hf_tokenizer, messages, **kwargs):
    return hf_tokenizer.apply_chat_template(
        messages, tokenize=False, chat_template=QWEN3_TEMPLATE, **kwargs
    )


@pytest.mark.parametrize("switch", fusion.SWITCHES)
def test_rows_are_what_qwen3s_template_renders(switch, tok, hf_tokenizer):
    demos = fusion.fusion_demonstrations(TRACES, switch=switch, think_fraction=1.0)
    modes = []
    for trace, d in zip(TRACES, demos, strict=True):
        think = bool(trace.thought)
        modes.append(think)
        kwargs = {} if d.thinking is None else {"enable_thinking": d.thinking}
        if switch == "flag":
            flag = fusion.THINK_FLAG if think else fusion.NO_THINK_FLAG
            assert d.prompt == f"{trace.question} {flag}" and d.thinking is None
        else:
            assert d.prompt == trace.question and d.thinking is think
        user = [{"role": "user", "content": d.prompt}]
        # The prompt as the sampler sees it is the template's generation prompt ...
        row_template = templates.PromptTemplate("row", chat=True, thinking=d.thinking)
        prompt = templates.render(d.prompt, row_template, tok)
        assert prompt == _hf_render(hf_tokenizer, user, add_generation_prompt=True, **kwargs)
        # ... and prompt + response + end token is the whole conversation, as Qwen3's template
        # writes it with that answer as the final assistant turn (its trailing newline is not
        # generated).
        turn = {"role": "assistant", "content": trace.answer}
        if think:
            turn["reasoning_content"] = trace.thought
        conversation = _hf_render(hf_tokenizer, [*user, turn], **kwargs)
        assert prompt + d.response + END + "\n" == conversation
        empty = fusion.non_thinking_response("")
        if think:
            assert d.response.startswith("<think>\n") and not d.response.startswith(empty)
        elif switch == "flag":
            assert d.response.startswith(empty)
        else:
            assert prompt.endswith(empty) and "<think>" not in d.response
    assert modes == [True, True, False, True]


def test_think_fraction_mixes_modes_reproducibly():
    traces = [fusion.Trace(str(i), f"q{i}", "a", thought="t") for i in range(400)]
    demos = fusion.fusion_demonstrations(traces, think_fraction=0.25, seed=3)
    flags = [d.prompt.endswith(fusion.THINK_FLAG) for d in demos]
    assert 0.18 < np.mean(flags) < 0.32
    assert flags == [
        d.prompt.endswith(fusion.THINK_FLAG)
        for d in fusion.fusion_demonstrations(traces, think_fraction=0.25, seed=3)
    ]
    with pytest.raises(ValueError, match="switch='auto'"):
        fusion.fusion_demonstrations(traces, switch="auto")
    with pytest.raises(ValueError, match="think_fraction=1.5"):
        fusion.fusion_demonstrations(traces, think_fraction=1.5)


@pytest.mark.parametrize("switch", fusion.SWITCHES)
def test_loss_mask_covers_exactly_the_assistant_answer(switch, tok, tmp_path):
    demos = fusion.fusion_demonstrations(TRACES, switch=switch, think_fraction=1.0)
    # Through the SFT stage's own path: the JSONL file, then the encoding and the batch.
    path = fusion.write_demonstrations(demos, tmp_path / "fusion.jsonl")
    loaded, report = load_demonstrations(path)
    assert loaded == demos and report.num_skipped == 0
    template = templates.get_template("chat")  # passes no enable_thinking of its own
    assert template.thinking is None
    enc = encode_demonstrations(loaded, template, tok, 512)
    batch = make_batch(enc.ids, enc.prompt_lengths, (512,), tok.pad_id)
    for i, d in enumerate(loaded):
        ids = enc.ids[i]
        # loss_mask[t] trains the prediction of token t + 1.
        trained = [ids[t + 1] for t in np.flatnonzero(batch.loss_mask_NT[i])]
        assert tok.decode(trained) == d.response + END
        untrained = ids[: enc.prompt_lengths[i]]
        row_template = templates.PromptTemplate("row", chat=True, thinking=d.thinking)
        assert tok.decode(untrained) == templates.render(d.prompt, row_template, tok)
        if switch == "enable_thinking" and not d.thinking:
            # The empty block is the template's, in the prompt: not trained on.
            assert tok.decode(untrained).endswith(fusion.non_thinking_response(""))
            assert "<think>" not in tok.decode(trained)
        else:
            assert tok.decode(trained).startswith("<think>\n")


def test_a_non_boolean_enable_thinking_is_a_skipped_row(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(
        '{"prompt": "q", "response": "a", "enable_thinking": false}\n'
        '{"prompt": "q", "response": "a", "enable_thinking": "yes"}\n'
    )
    loaded, report = load_demonstrations(path)
    assert [d.thinking for d in loaded] == [False]
    assert report.num_skipped == 1
