"""Prompt templates rendered with SmolLM2's real chat template and a hand-written Qwen3-style one
(thinking modes), and tokenized prompts that fit the sampler's buckets."""

from __future__ import annotations

import string

import pytest

from rlvr_jax.data import datasets as ds
from rlvr_jax.data import templates as tp
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.model.gguf import embedded_model_path
from rlvr_jax.sampling.host import bucket_and_pad
from tests.shared_data import DATA, needs_shared_data

QUESTION = "What is 7 times 8?"

# Qwen3's handling of the thinking switch, in a small template of the same shape.
QWEN3_STYLE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}{%- if message['role'] != 'system' %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)


@pytest.fixture(scope="module")
def smol() -> Tokenizer:
    return Tokenizer.from_gguf(embedded_model_path())


@pytest.fixture(scope="module")
def qwen3_style() -> Tokenizer:
    return Tokenizer.from_characters(string.printable, chat_template=QWEN3_STYLE)


def test_r1_zero_is_plain_text_ending_inside_the_think_block():
    text = tp.render(QUESTION, tp.get_template("r1_zero"))  # no tokenizer needed
    assert text.startswith("A conversation between User and Assistant. The user asks a question")
    assert "<think> reasoning process here </think> <answer> answer here </answer>" in text
    assert text.endswith(f"\nUser: {QUESTION}\nAssistant: <think>")
    assert "<|im_start|>" not in text


def test_qwen_math_boxed_is_a_system_message_through_the_chat_template(smol):
    text = tp.render(QUESTION, tp.get_template("qwen_math_boxed"), smol)
    assert text == (
        "<|im_start|>system\nPlease reason step by step, and put your final answer within "
        "\\boxed{}.<|im_end|>\n"
        f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    )


def test_chat_uses_the_tokenizers_template(smol):
    text = tp.render(QUESTION, tp.get_template("chat"), smol)
    assert text == smol.apply_chat_template([{"role": "user", "content": QUESTION}])
    assert "You are a helpful AI assistant named SmolLM" in text  # SmolLM2's default system
    with pytest.raises(ValueError, match="renders through a chat template"):
        tp.render(QUESTION, tp.get_template("chat"))


def test_thinking_modes_with_a_template_that_reads_enable_thinking(qwen3_style):
    assert tp.reads_enable_thinking(qwen3_style)
    header = f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    thinking = tp.render(QUESTION, tp.get_template("qwen3_thinking"), qwen3_style)
    non_thinking = tp.render(QUESTION, tp.get_template("qwen3_non_thinking"), qwen3_style)
    assert thinking == header
    # The template writes the empty block itself; it is not appended a second time.
    assert non_thinking == header + "<think>\n\n</think>\n\n"
    assert tp.render(QUESTION, tp.get_template("chat"), qwen3_style) == header


def test_non_thinking_appends_the_empty_block_when_the_template_cannot(smol):
    assert not tp.reads_enable_thinking(smol)
    chat = tp.render(QUESTION, tp.get_template("chat"), smol)
    assert tp.render(QUESTION, tp.get_template("qwen3_thinking"), smol) == chat
    non_thinking = tp.render(QUESTION, tp.get_template("qwen3_non_thinking"), smol)
    assert non_thinking == chat + "<think>\n\n</think>\n\n"


def test_text_templates_substitute_literally():
    t = tp.get_template("text:Q: {question}\nPut it in \\boxed{}. A:")
    assert tp.render("f(x) = {x}", t) == "Q: f(x) = {x}\nPut it in \\boxed{}. A:"
    assert tp.render("3+4", tp.text_template("{question}=")) == "3+4="
    assert tp.render("3+4", tp.get_template("plain")) == "3+4"
    with pytest.raises(ValueError, match=r"has no \{question\}"):
        tp.text_template("no slot")
    with pytest.raises(ValueError, match="'alpaca' is not known"):
        tp.get_template("alpaca")
    with pytest.raises(ValueError, match="thinking modes need chat=True"):
        tp.PromptTemplate("bad", chat=False, thinking=True)


@needs_shared_data
def test_encode_prompts_skips_and_counts_the_long_ones(smol):
    examples, _ = ds.load_jsonl("gsm8k", DATA, "test")
    examples = examples[:24]
    template = tp.get_template("qwen_math_boxed")
    lengths = [len(smol.encode(tp.render(ex.prompt_text, template, smol))) for ex in examples]
    limit = sorted(lengths)[len(lengths) // 2]  # about half are longer
    encoded = tp.encode_prompts(examples, template, smol, buckets=[limit // 2, limit])
    too_long = [ex.id for ex, n in zip(examples, lengths, strict=True) if n > limit]
    assert encoded.num_too_long == len(too_long) > 0
    assert encoded.too_long_ids == tuple(too_long[:5])
    assert encoded.longest == max(lengths) and encoded.max_len == limit
    assert [ex.id for ex in encoded.examples] == [
        ex.id for ex, n in zip(examples, lengths, strict=True) if n <= limit
    ]
    for ids, ex in zip(encoded.ids, encoded.examples, strict=True):
        assert ids == smol.encode(tp.render(ex.prompt_text, template, smol))
        assert ids[0] == smol.bos_id  # "<|im_start|>" opens the chat
    assert f"skipped {len(too_long)} longer ones" in encoded.summary()
    # Every kept prompt fits the sampler's buckets.
    prompt_NP, lengths_N = bucket_and_pad(encoded.ids, [limit // 2, limit], smol.pad_id, 2)
    assert prompt_NP.shape == (2 * len(encoded.ids), limit)
    with pytest.raises(ValueError, match="none of 24 prompts fits in the largest bucket 8"):
        tp.encode_prompts(examples, template, smol, buckets=[8])


def test_add_bos(smol):
    (ex,) = ds.arithmetic_examples(1, seed=0)
    r1 = tp.get_template("r1_zero")
    plain = tp.encode_prompts([ex], r1, smol, [512]).ids[0]
    with_bos = tp.encode_prompts([ex], r1, smol, [512], add_bos=True).ids[0]
    assert with_bos == [smol.bos_id, *plain] and plain[0] != smol.bos_id
    chat = tp.get_template("chat")
    assert tp.encode_prompts([ex], chat, smol, [512], add_bos=True).ids == (
        tp.encode_prompts([ex], chat, smol, [512]).ids
    )  # the chat template already starts with it
    chars = Tokenizer.from_characters("0123456789+-*=")
    ids = tp.encode_prompts([ex], tp.text_template("{question}="), chars, [8], add_bos=True).ids
    assert chars.decode(ids[0]) == ex.prompt_text + "="  # no bos in a character vocabulary
