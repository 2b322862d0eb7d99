"""Tokenizers: one small interface over Hugging Face tokenizers and sentencepiece models.

Host code. Three sources:
- `Tokenizer.from_hf_dir(path)`: a checkpoint directory (tokenizer.json, tokenizer_config.json).
- `Tokenizer.from_gguf(path)`: the vocabulary, merges, special tokens and chat template stored in a
  GGUF file's metadata, rebuilt as a `tokenizers.Tokenizer` (byte-level BPE).
- `Tokenizer.from_sentencepiece(model_file)`: a raw sentencepiece model.

`transformers` is imported only by the first two constructors (it takes seconds to import).

A chat template is code from the model's directory. It renders in a jinja sandbox (transformers'
own for Hugging Face backends), and `apply_chat_template` bounds it: past `CHAT_TEMPLATE_SECONDS`
(an endless loop, a macro that recurses without end), or on Python's recursion limit, rendering
stops with a `ChatTemplateError` naming the tokenizer the template came from.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sentencepiece

from rlvr_jax.config_types import NotFoundError
from rlvr_jax.model import gguf, hf, loading

if TYPE_CHECKING:
    import tokenizers
    from transformers import PreTrainedTokenizerBase

# `import transformers` (in the constructors below) announces on stderr that PyTorch is absent.
# Here transformers only wraps `tokenizers` and renders chat templates, neither of which needs
# PyTorch, so that notice would send users after a dependency they do not need. The filter drops
# that one record; every other transformers warning still shows.
logging.getLogger("transformers").addFilter(
    lambda record: "PyTorch was not found" not in str(record.msg)
)

# Tokens that end an assistant turn in common chat formats; generation stops on any of them that
# the vocabulary holds as a special (added) token, besides the tokenizer's own eos.
CHAT_END_TOKENS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<end_of_turn>",
    "<|end|>",
)

# llama.cpp token types (`tokenizer.ggml.token_type`).
_CONTROL, _USER_DEFINED = 3, 4

# Llama 3's split regex, as in its tokenizer.json (llama.cpp calls this pre-tokenizer "llama-bpe").
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GGUF_PRE_TOKENIZERS = ("default", "gpt2", "smollm", "llama-bpe")

Message = Mapping[str, Any]

# A real chat template renders in milliseconds; rendering stops after this many seconds.
CHAT_TEMPLATE_SECONDS = 10.0
# The file name jinja gives the code it compiles a template to.
_TEMPLATE_CODE = "<template>"


class ChatTemplateError(ValueError):
    """A chat template that does not render within its bounds; the message names its source."""


class _OverrunError(BaseException):
    """Raised inside a template's code once its time is up (not an `Exception`: nothing on
    the way may swallow it and render on unbounded)."""


def _bounded(render: Callable[[], str], source: str, limit_s: float) -> str:
    """`render()`, stopped once the template's own code has run `limit_s` seconds.

    The clock is checked on every line of the code jinja compiled the template to (a trace
    function on this thread, chained to any other, e.g. a coverage tool's), so a loop or a
    recursion inside the template cannot outrun it; library code it calls is not traced.
    """
    deadline = time.monotonic() + limit_s
    previous = sys.gettrace()

    def line(frame: Any, event: str, arg: Any) -> Any:
        if time.monotonic() > deadline:
            raise _OverrunError
        return line

    def call(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename == _TEMPLATE_CODE:
            return line(frame, event, arg)
        return previous(frame, event, arg) if previous is not None else None

    sys.settrace(call)
    try:
        return render()
    except _OverrunError:
        raise ChatTemplateError(
            f"the chat template of {source} did not finish rendering within {limit_s:g} s (an "
            "endless loop or a macro that recurses without end?); fix or replace it "
            "(chat_template.jinja or tokenizer_config.json in the model directory) or pass "
            "chat_template="
        ) from None
    except RecursionError:
        raise ChatTemplateError(
            f"the chat template of {source} recursed past Python's limit (a macro that calls "
            "itself without end?); fix or replace it or pass chat_template="
        ) from None
    except (OverflowError, MemoryError) as e:
        raise ChatTemplateError(
            f"the chat template of {source} asked for too much: {type(e).__name__}: {e}"
        ) from None
    finally:
        sys.settrace(previous)


def _pre_tokenizer(pre: str, source: str) -> tokenizers.pre_tokenizers.PreTokenizer:
    """The pre-tokenizer for llama.cpp's `tokenizer.ggml.pre` name."""
    from tokenizers import Regex, pre_tokenizers

    if pre in ("default", "gpt2"):
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        # SmolLM's tokenizer.json splits every digit off first, then applies the GPT-2 regex;
        # llama.cpp does the same (a `\p{N}` split before the GPT-2 regex). transformers' own GGUF
        # loader skips the digit split, which differs on text like "a  1" (two spaces before a
        # digit): with the split the spaces merge into one token.
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if pre == "llama-bpe":
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    raise ValueError(
        f"{source}: tokenizer.ggml.pre={pre!r} is not supported; supported: {GGUF_PRE_TOKENIZERS}"
    )


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table of byte-level BPE (a space byte is "Ġ")."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _gguf_byte_level_bpe(metadata: Mapping[str, Any], source: str) -> tokenizers.Tokenizer:
    """A byte-level BPE `tokenizers.Tokenizer` from llama.cpp's `tokenizer.ggml.*` metadata."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    tokens = list(metadata["tokenizer.ggml.tokens"])
    if "tokenizer.ggml.merges" not in metadata:
        raise ValueError(f"{source}: a 'gpt2' tokenizer needs tokenizer.ggml.merges; it is absent")
    merges = []
    for m in metadata["tokenizer.ggml.merges"]:
        pair = tuple(m.split(" "))
        if len(pair) != 2:
            raise ValueError(f"{source}: tokenizer.ggml.merges entry {m!r} is not two tokens")
        merges.append(pair)
    types = list(metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    if len(types) != len(tokens):
        raise ValueError(
            f"{source}: {len(types)} token types for {len(tokens)} tokens in tokenizer.ggml.*"
        )
    # Every ordinary token is spelled in the byte alphabet (a space is "Ġ"). A token outside it is
    # re-spelled, and a control token outside it is a llama.cpp mislabel that is not added, as
    # transformers does: adding it would grow the vocabulary past the model's embedding.
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())

    def byte_spelled(t: str) -> str:
        return t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8"))

    vocab = {byte_spelled(t): i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = _pre_tokenizer(metadata.get("tokenizer.ggml.pre", "default"), source)
    tok.decoder = decoders.ByteLevel()
    control = [
        t for t, k in zip(tokens, types, strict=True) if k == _CONTROL and set(t) <= alphabet
    ]
    user = [t for t, k in zip(tokens, types, strict=True) if k == _USER_DEFINED and t in vocab]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])
    return tok


def _render_chat_template(template: str, messages: Sequence[Message], **kwargs: Any) -> str:
    """Renders a Hugging Face chat template with the jinja settings `transformers` uses."""
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=list(messages), **kwargs)


class Tokenizer:
    """Text to token ids and back, special ids and the chat template, over one backend.

    The backend is a Hugging Face tokenizer (`from_hf_dir`, `from_gguf`) or a sentencepiece
    processor (`from_sentencepiece`).

    Attributes:
      vocab_size: the number of token ids the tokenizer produces (added tokens included); a model's
        embedding may have more rows.
      bos_id: the beginning-of-sequence id, or None.
      eos_ids: ids that end generation: the eos token first, then any `CHAT_END_TOKENS` present.
      pad_id: the padding id; the eos id when the tokenizer has none.
      chat_template: the jinja chat template, or None.
    """

    def __init__(
        self,
        backend: PreTrainedTokenizerBase | sentencepiece.SentencePieceProcessor,
        chat_template: str | None = None,
    ):
        """Wraps a backend; use the `from_*` constructors.

        Args:
          backend: a `transformers` tokenizer or a loaded `SentencePieceProcessor`.
          chat_template: a jinja chat template; for a Hugging Face tokenizer it replaces the
            template the tokenizer carries.
        """
        self._backend = backend
        if isinstance(backend, sentencepiece.SentencePieceProcessor):
            self._sp = backend
            self.chat_template = chat_template
            self.vocab_size = backend.vocab_size()
            # Chat markers in a sentencepiece model are control or user-defined pieces; either
            # way they are whole pieces, found by an exact lookup.
            lookup = {t: backend.piece_to_id(t) for t in CHAT_END_TOKENS}
            special = {t: i for t, i in lookup.items() if backend.id_to_piece(i) == t}
            self.bos_id = backend.bos_id() if backend.bos_id() >= 0 else None
            eos = backend.eos_id() if backend.eos_id() >= 0 else None
            pad = backend.pad_id() if backend.pad_id() >= 0 else None
        else:
            self._sp = None
            if chat_template is not None:
                backend.chat_template = chat_template
            self.chat_template = backend.chat_template
            self.vocab_size = len(backend)
            special = dict(backend.get_added_vocab())
            self.bos_id = backend.bos_token_id
            eos, pad = backend.eos_token_id, backend.pad_token_id
        ends = sorted(special[t] for t in CHAT_END_TOKENS if t in special)
        self.eos_ids = tuple(dict.fromkeys(([eos] if eos is not None else []) + ends))
        if not self.eos_ids:
            raise ValueError(
                f"tokenizer {self._name()} has no eos token; generation could not stop"
            )
        self.pad_id = pad if pad is not None else self.eos_ids[0]

    # -----------------------------------------------------------------------------------------
    # Constructors

    @classmethod
    def from_hf_dir(cls, path: str | os.PathLike) -> Tokenizer:
        """Loads the tokenizer of a local Hugging Face checkpoint directory, chat template included.

        Raises:
          NotFoundError: when `path` is not a directory.
        """
        if not Path(path).is_dir():
            raise NotFoundError(f"tokenizer directory {str(path)!r} does not exist")
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

        # A generic tokenizer.json (ours from `from_characters`, saved next to a model's
        # config.json) must load as itself: AutoTokenizer would pick the model type's class
        # (Qwen2Tokenizer), which adds tokens of its own.
        config = Path(path) / "tokenizer_config.json"
        if config.is_file() and json.loads(config.read_text()).get("tokenizer_class") in (
            "TokenizersBackend",
            "PreTrainedTokenizerFast",
        ):
            return cls(PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True))
        return cls(AutoTokenizer.from_pretrained(str(path), local_files_only=True))

    @classmethod
    def from_gguf(cls, path: str | os.PathLike) -> Tokenizer:
        """Builds the tokenizer a GGUF file describes (`tokenizer.ggml.model == "gpt2"`).

        Raises:
          ValueError: for another tokenizer model or an unsupported pre-tokenizer, named.
        """
        from transformers import PreTrainedTokenizerFast

        source = str(path)
        md = gguf.read_metadata(path)
        kind = md.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(
                f"{source}: tokenizer.ggml.model={kind!r} is not supported; only 'gpt2' "
                "(byte-level BPE) tokenizers load from GGUF"
            )
        if "tokenizer.ggml.tokens" not in md:
            raise ValueError(f"{source} holds no tokenizer (tokenizer.ggml.tokens is absent)")
        tokens = md["tokenizer.ggml.tokens"]

        def token(key: str) -> str | None:
            i = md.get(f"tokenizer.ggml.{key}")
            if i is None:
                return None
            if not 0 <= i < len(tokens):
                raise ValueError(f"{source}: tokenizer.ggml.{key}={i} is outside the vocabulary")
            return tokens[i]

        hf = PreTrainedTokenizerFast(
            tokenizer_object=_gguf_byte_level_bpe(md, source),
            bos_token=token("bos_token_id"),
            eos_token=token("eos_token_id"),
            unk_token=token("unknown_token_id"),
            pad_token=token("padding_token_id"),
            add_bos_token=bool(md.get("tokenizer.ggml.add_bos_token", False)),
            add_eos_token=bool(md.get("tokenizer.ggml.add_eos_token", False)),
            chat_template=md.get("tokenizer.chat_template"),
            clean_up_tokenization_spaces=False,
        )
        return cls(hf)

    @classmethod
    def from_sentencepiece(
        cls, model_file: str | os.PathLike, chat_template: str | None = None
    ) -> Tokenizer:
        """Loads a sentencepiece `.model` file, with an optional jinja chat template."""
        if not Path(model_file).is_file():
            raise NotFoundError(f"sentencepiece model {str(model_file)!r} does not exist")
        return cls(sentencepiece.SentencePieceProcessor(model_file=str(model_file)), chat_template)

    @classmethod
    def from_characters(
        cls, alphabet: str, eos: str = "<eos>", pad: str = "<pad>", chat_template: str | None = None
    ) -> Tokenizer:
        """A character-level tokenizer for models trained from scratch (tests, toy tasks).

        Ids: `pad` is 0, `eos` is 1, then one id per character of `alphabet` in order. Text with a
        character outside the alphabet fails to encode with an error naming the character.
        """
        import tokenizers
        from transformers import PreTrainedTokenizerFast

        chars = list(dict.fromkeys(alphabet))
        if len(chars) != len(alphabet):
            raise ValueError(f"alphabet={alphabet!r} repeats a character")
        if not chars:
            raise ValueError("alphabet is empty")
        vocab = {pad: 0, eos: 1, **{c: i + 2 for i, c in enumerate(chars)}}
        model = tokenizers.models.WordLevel(vocab, unk_token=None)
        tok = tokenizers.Tokenizer(model)
        # One piece per character, line breaks included ("." would leave "\n\n" as one piece).
        tok.pre_tokenizer = tokenizers.pre_tokenizers.Split(
            tokenizers.Regex(r"[\s\S]"), behavior="isolated"
        )
        tok.decoder = tokenizers.decoders.Fuse()
        tok.add_special_tokens([pad, eos])
        hf = PreTrainedTokenizerFast(
            tokenizer_object=tok,
            eos_token=eos,
            pad_token=pad,
            chat_template=chat_template,
            clean_up_tokenization_spaces=False,
        )
        out = cls(hf)
        out._alphabet = frozenset(chars)
        return out

    # -----------------------------------------------------------------------------------------
    # Text and ids

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`.

        On Hugging Face backends special-token text such as "<|im_start|>" becomes its one id.

        Args:
          text: the text.
          add_special_tokens: add what the tokenizer is configured to add around the text (the bos
            id for a sentencepiece model that has one).
        """
        alphabet = getattr(self, "_alphabet", None)
        if alphabet is not None:
            bad = next((c for c in text if c not in alphabet), None)
            if bad is not None:
                raise ValueError(f"character {bad!r} is not in this tokenizer's alphabet")
        if self._sp is not None:
            ids = self._sp.encode(text)
            return [self.bos_id, *ids] if add_special_tokens and self.bos_id is not None else ids
        return list(self._backend.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of `ids`, without clean-up of spaces, so that text -> ids -> text is exact."""
        ids = [int(i) for i in ids]
        if self._sp is None:
            return self._backend.decode(
                ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
            )
        sp = self._sp
        if skip_special_tokens:
            return sp.decode([i for i in ids if not sp.is_control(i)])
        # sentencepiece drops control pieces when decoding; spell them out between the runs.
        out, run = [], []
        for i in ids:
            if sp.is_control(i):
                out += [sp.decode(run), sp.id_to_piece(i)]
                run = []
            else:
                run.append(i)
        return "".join(out) + sp.decode(run)

    def apply_chat_template(
        self, messages: Sequence[Message], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """Renders `messages` ([{"role": ..., "content": ...}]) as prompt text.

        Args:
          messages: the conversation.
          add_generation_prompt: end with the header that opens an assistant turn.
          **kwargs: extra template variables (e.g. `tools`, `enable_thinking`).

        Raises:
          ValueError: when the tokenizer has no chat template.
          ChatTemplateError: the template runs past `CHAT_TEMPLATE_SECONDS` or recurses without
            end (see the module docstring).
        """
        if not self.chat_template:
            raise ValueError(
                f"tokenizer {self._name()} has no chat template; load one that ships it "
                "(tokenizer_config.json or chat_template.jinja) or pass `chat_template=`"
            )
        if self._sp is None:
            render = lambda: self._backend.apply_chat_template(  # noqa: E731
                list(messages),
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **kwargs,
            )
        else:
            sp = self._sp
            render = lambda: _render_chat_template(  # noqa: E731
                self.chat_template,
                messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=sp.id_to_piece(self.bos_id) if self.bos_id is not None else "",
                eos_token=sp.id_to_piece(self.eos_ids[0]),
                **kwargs,
            )
        return _bounded(render, self._name(), CHAT_TEMPLATE_SECONDS)

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Writes the tokenizer to `directory` (created if needed).

        A Hugging Face backend writes tokenizer.json and tokenizer_config.json, which
        `from_hf_dir` and `transformers.AutoTokenizer` load; a sentencepiece backend writes
        tokenizer.model and, if it has one, chat_template.jinja.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if self._sp is None:
            self._backend.save_pretrained(str(directory))
            return directory
        (directory / "tokenizer.model").write_bytes(self._sp.serialized_model_proto())
        if self.chat_template:
            (directory / "chat_template.jinja").write_text(self.chat_template)
        return directory

    def _name(self) -> str:
        if self._sp is not None:
            return f"sentencepiece(vocab_size={self.vocab_size})"
        return f"{type(self._backend).__name__}({self._backend.name_or_path!r})"

    def __repr__(self) -> str:
        return (
            f"Tokenizer({self._name()}, vocab_size={self.vocab_size}, bos_id={self.bos_id}, "
            f"eos_ids={self.eos_ids}, pad_id={self.pad_id})"
        )


def load_tokenizer(source: str) -> Tokenizer | None:
    """The tokenizer that goes with the weights of a model source (`model.loading`'s sources;
    None for random weights)."""
    if source == loading.EMBEDDED:
        return Tokenizer.from_gguf(gguf.embedded_model_path())
    if source.startswith("random:"):
        return None
    if source.endswith(".gguf"):
        return Tokenizer.from_gguf(source)
    return Tokenizer.from_hf_dir(hf.resolve_checkpoint(source))
