"""Tokenizers: GGUF-built ones against transformers' GGUF loading, Hugging Face directory round
trips, and a sentencepiece model trained here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gguf as gguf_lib
import numpy as np
import pytest
import sentencepiece
import tokenizers
from transformers import AutoTokenizer

from rlvr_jax.data import tokenizer as tokenizer_lib
from rlvr_jax.data.tokenizer import Tokenizer, _bytes_to_unicode
from rlvr_jax.model.gguf import embedded_model_path

STRINGS = [
    "Hello world",
    "12345 + 678 = 13023",
    "x = 3.14159;\n\tif (y) { return 0; }",
    "def f(x):\n    return x**2  # square\n",
    "  leading and trailing  ",
    "\n\n\nnewlines\r\n",
    "It's   they'll  we'd",
    "héllo wörld — ünïcödé ✓ 日本語 🤖",
    "a\u00a0b\u2009c",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text after<file_sep>",
    "",
    " ",
]
# Where SmolLM2's own tokenizer.json (digits split off before the GPT-2 regex, as llama.cpp's
# "smollm" pre-tokenizer does) and transformers' GGUF loader (GPT-2 regex alone) disagree:
# whitespace runs before a digit, and non-ASCII numerals.
DIGIT_SPLIT_STRINGS = ["a  1", "1 2  3   4", "½ ² ٣", "x\n  42"]
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "Answer tersely."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ],
]


@pytest.fixture(scope="module")
def smollm_path() -> Path:
    return embedded_model_path()


@pytest.fixture(scope="module")
def ours(smollm_path) -> Tokenizer:
    return Tokenizer.from_gguf(smollm_path)


@pytest.fixture(scope="module")
def ref(smollm_path):
    """transformers' own tokenizer for the GGUF file: the reference, used in tests only."""
    return AutoTokenizer.from_pretrained(str(smollm_path.parent), gguf_file=smollm_path.name)


@pytest.mark.parametrize("text", STRINGS)
def test_gguf_encode_matches_transformers_and_decodes_back(ours, ref, text):
    ids = ours.encode(text)
    assert ids == ref.encode(text, add_special_tokens=False)
    assert ours.decode(ids) == text
    assert ours.decode(ids) == ref.decode(ids, clean_up_tokenization_spaces=False)


def test_gguf_digits_split_like_smollm2_tokenizer_json(ours, ref):
    # transformers' GGUF loader has the right vocabulary, merges and special tokens; with the
    # pre-tokenizer of SmolLM2's tokenizer.json it is the tokenizer the model was trained with.
    reference = tokenizers.Tokenizer.from_str(ref.backend_tokenizer.to_str())
    reference.pre_tokenizer = tokenizers.pre_tokenizers.Sequence(
        [
            tokenizers.pre_tokenizers.Digits(individual_digits=True),
            tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    for text in STRINGS + DIGIT_SPLIT_STRINGS:
        ids = ours.encode(text)
        assert ids == reference.encode(text, add_special_tokens=False).ids, text
        assert ours.decode(ids) == text
    # Two spaces before a digit stay one token, as in SmolLM2's training data.
    assert ref.convert_ids_to_tokens(ours.encode("a  1")) == ["a", "ĠĠ", "1"]


def test_gguf_special_ids(ours, ref):
    assert ours.vocab_size == len(ref) == 49152
    assert ours.bos_id == ref.bos_token_id == ref.convert_tokens_to_ids("<|im_start|>")
    im_end, endoftext = ref.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert ours.eos_ids == (ref.eos_token_id, endoftext) == (im_end, endoftext)
    assert ours.pad_id == ref.pad_token_id == im_end
    assert ours.encode("<|im_end|>") == [im_end]
    text = "<|im_start|>user\nhi<|im_end|>"
    assert ours.decode(ours.encode(text), skip_special_tokens=True) == "user\nhi"
    assert ours.encode("hi", add_special_tokens=True) == ours.encode("hi")  # add_bos_token false


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_gguf_chat_template_matches_transformers(ours, ref, messages, add_generation_prompt):
    want = ref.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    got = ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    assert got == want
    assert got.startswith("<|im_start|>system\n")
    assert got.endswith("<|im_start|>assistant\n") == add_generation_prompt


def test_hf_dir_round_trip(ours, tmp_path):
    ours.save_pretrained(tmp_path)
    loaded = Tokenizer.from_hf_dir(tmp_path)
    plain = AutoTokenizer.from_pretrained(str(tmp_path))  # what other tools will see
    for text in STRINGS + DIGIT_SPLIT_STRINGS:
        ids = ours.encode(text)
        assert loaded.encode(text) == ids, text
        assert plain.encode(text, add_special_tokens=False) == ids, text
        assert loaded.decode(ids) == text
    for attr in ("vocab_size", "bos_id", "eos_ids", "pad_id", "chat_template"):
        assert getattr(loaded, attr) == getattr(ours, attr), attr
    for messages in CONVERSATIONS:
        assert loaded.apply_chat_template(messages) == ours.apply_chat_template(messages)


def test_from_hf_dir_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        Tokenizer.from_hf_dir(tmp_path / "nowhere")


# ---------------------------------------------------------------------------------------------
# A tiny byte-level GGUF vocabulary, for the pre-tokenizer variants and the refusals.

TINY_MERGES = ["Ġ Ġ", "Ġ t", "h e", "Ġt he", "1 2", "12 3", "i n", "in g"]
TINY_TEXTS = ["the thing  123 4567", "  x\n\n 12\tthe", "It's ONE-TWO 1234567", "é <think>ok"]


def _write_tiny_tokenizer(path: Path, pre: str = "gpt2", model: str = "gpt2") -> Path:
    spelling = _bytes_to_unicode()
    tokens = ["<|endoftext|>", "<|im_end|>", "<think>"] + [spelling[b] for b in range(256)]
    tokens += ["".join(m.split(" ")) for m in TINY_MERGES]
    types = [3, 3, 4] + [1] * (len(tokens) - 3)
    w = gguf_lib.GGUFWriter(path, "llama")
    w.add_tokenizer_model(model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(TINY_MERGES)
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_chat_template("{% for m in messages %}{{ m['content'] }}<|im_end|>{% endfor %}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("pre", ["gpt2", "llama-bpe"])
def test_tiny_gguf_pre_tokenizers_match_transformers(tmp_path, pre):
    path = _write_tiny_tokenizer(tmp_path / "tok.gguf", pre=pre)
    ours = Tokenizer.from_gguf(path)
    ref = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    for text in TINY_TEXTS:
        assert ours.encode(text) == ref.encode(text, add_special_tokens=False), text
        assert ours.decode(ours.encode(text)) == text
    assert ours.encode("<think>") == [2]  # user-defined tokens stay whole
    assert (ours.bos_id, ours.eos_ids, ours.pad_id) == (0, (1, 0), 1)


def test_tiny_gguf_digit_split_differs_from_gpt2(tmp_path):
    gpt2 = Tokenizer.from_gguf(_write_tiny_tokenizer(tmp_path / "a.gguf", pre="gpt2"))
    smollm = Tokenizer.from_gguf(_write_tiny_tokenizer(tmp_path / "b.gguf", pre="smollm"))
    spell = _bytes_to_unicode()
    tokens = ["<|endoftext|>", "<|im_end|>", "<think>"] + [spell[b] for b in range(256)]
    tokens += ["".join(m.split(" ")) for m in TINY_MERGES]
    assert [tokens[i] for i in gpt2.encode(" 123")] == ["Ġ", "123"]
    assert [tokens[i] for i in smollm.encode(" 123")] == ["Ġ", "1", "2", "3"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(model="llama"), "tokenizer.ggml.model='llama'"),
        (dict(pre="qwen2"), "tokenizer.ggml.pre='qwen2'"),
    ],
)
def test_gguf_tokenizer_refusals(tmp_path, kwargs, message):
    path = _write_tiny_tokenizer(tmp_path / "tok.gguf", **kwargs)
    with pytest.raises(ValueError, match=message):
        Tokenizer.from_gguf(path)


# ---------------------------------------------------------------------------------------------
# sentencepiece

SP_LINES = [
    "The quick brown fox jumps over the lazy dog.",
    "Pack my box with five dozen liquor jugs!",
    "How vexingly quick daft zebras jump; 12345 67890.",
    "Sphinx of black quartz, judge my vow?",
]
SP_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def sp_model(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("sp")
    (d / "corpus.txt").write_text("\n".join(SP_LINES * 3))
    sentencepiece.SentencePieceTrainer.train(
        input=str(d / "corpus.txt"),
        model_prefix=str(d / "sp"),
        vocab_size=80,
        model_type="bpe",
        character_coverage=1.0,
        user_defined_symbols=["<|im_start|>", "<|im_end|>"],
        minloglevel=2,
    )
    return d / "sp.model"


def test_sentencepiece_encode_decode(sp_model):
    tok = Tokenizer.from_sentencepiece(sp_model)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(sp_model))
    # The default normalizer folds whitespace, so text with "\n" would not decode back.
    for text in SP_LINES + ["the lazy fox, 90210", "<|im_start|>user quick<|im_end|>"]:
        ids = tok.encode(text)
        assert ids == sp.encode(text)
        assert tok.decode(ids) == text
    im_end = sp.piece_to_id("<|im_end|>")
    assert (tok.vocab_size, tok.bos_id, tok.eos_ids) == (80, sp.bos_id(), (sp.eos_id(), im_end))
    assert tok.pad_id == sp.eos_id()  # the model has no pad piece
    assert tok.encode("fox", add_special_tokens=True) == [sp.bos_id(), *sp.encode("fox")]
    ids = [sp.bos_id(), *sp.encode("the fox"), sp.eos_id()]
    assert tok.decode(ids) == "<s>the fox</s>"
    assert tok.decode(ids, skip_special_tokens=True) == "the fox"


def test_sentencepiece_chat_template_and_save(sp_model, tmp_path):
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer.from_sentencepiece(sp_model).apply_chat_template(CONVERSATIONS[0])
    tok = Tokenizer.from_sentencepiece(sp_model, chat_template=SP_TEMPLATE)
    text = tok.apply_chat_template([{"role": "user", "content": "quick?"}])
    assert text == "<s><|im_start|>user\nquick?<|im_end|>\n<|im_start|>assistant\n"
    tok.save_pretrained(tmp_path)
    assert (tmp_path / "chat_template.jinja").read_text() == SP_TEMPLATE
    again = Tokenizer.from_sentencepiece(tmp_path / "tokenizer.model", SP_TEMPLATE)
    assert again.encode(SP_LINES[2]) == tok.encode(SP_LINES[2])
    assert again.apply_chat_template(CONVERSATIONS[1]) == tok.apply_chat_template(CONVERSATIONS[1])


def test_sentencepiece_template_helpers(sp_model):
    template = "{{ messages | tojson }}{% if x %}{{ raise_exception('bad x') }}{% endif %}"
    tok = Tokenizer.from_sentencepiece(sp_model, chat_template=template)
    msgs = [{"role": "user", "content": "é"}]
    assert json.loads(tok.apply_chat_template(msgs)) == msgs
    with pytest.raises(Exception, match="bad x"):
        tok.apply_chat_template(msgs, x=True)
    assert np.array_equal(tok.encode(""), [])


def test_character_tokenizer_reloads_as_itself_next_to_a_model_config(tmp_path):
    chars = Tokenizer.from_characters("0123456789+=")
    chars.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}')
    back = Tokenizer.from_hf_dir(tmp_path)
    assert back.vocab_size == chars.vocab_size == 14
    assert back.eos_ids == chars.eos_ids and back.pad_id == chars.pad_id
    assert back.encode("12+3=") == chars.encode("12+3=")


def test_a_character_tokenizer_splits_line_breaks_too():
    chars = Tokenizer.from_characters("ab \n\t")
    text = "a\n\n\tb \n"
    ids = chars.encode(text)
    assert len(ids) == len(text) and chars.decode(ids) == text


@pytest.mark.parametrize(
    ("template", "match"),
    [
        # A loop the jinja sandbox allows (ranges up to 100k) nested without end in practice.
        (
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "did not finish rendering within 0.5 s",
        ),
        ("{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}", "recursed past Python's limit"),
    ],
    ids=["endless_loop", "endless_recursion"],
)
def test_a_chat_template_that_never_ends_is_stopped_naming_its_source(
    sp_model, monkeypatch, template, match
):
    monkeypatch.setattr(tokenizer_lib, "CHAT_TEMPLATE_SECONDS", 0.5)
    tok = Tokenizer.from_sentencepiece(sp_model, chat_template=template)
    with pytest.raises(tokenizer_lib.ChatTemplateError, match=match) as e:
        tok.apply_chat_template(CONVERSATIONS[0])
    assert "the chat template of sentencepiece(vocab_size=80)" in str(e.value)
    # The bound leaves no trace function behind, and a good template renders afterwards.
    assert sys.gettrace() is None or "coverage" in type(sys.gettrace()).__module__
    good = Tokenizer.from_sentencepiece(sp_model, chat_template=SP_TEMPLATE)
    assert good.apply_chat_template(CONVERSATIONS[0]).startswith("<s><|im_start|>")
