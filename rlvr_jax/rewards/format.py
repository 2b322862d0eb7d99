"""Format rewards on response text: the DeepSeek-R1 template, the thinking mode asked for, and
language consistency.

Host code (pure Python, standard library only).

* `r1_format_reward`: 1.0 when the response is `<think> ... </think> <answer> ... </answer>`: each
  tag exactly once, in that order, only whitespace before `<think>`, between `</think>` and
  `<answer>`, and after `</answer>` (end-of-sequence strings such as `<|im_end|>` may follow), and a
  non-empty answer; else 0.0. When the prompt already ends with `<think>` (R1-Zero template), pass
  `think_in_prompt=True`: the response then starts inside the thinking block and must not contain
  `<think>` again.
* `split_thinking` and `has_thought`: a response's leading thinking block split from its answer,
  and whether a response has a non-empty thinking block anywhere (the fusion rows' parser and
  the evaluation's thought rate).
* `mode_reward`: 1.0 when the response follows the mode its prompt asked for (`data.modes`):
  asked to think, it opens with a closed, non-empty thinking block; asked not to, it has no
  non-empty thinking block (the empty `<think>\n\n</think>` Qwen3 writes is allowed).
* `language_consistency`: the share of the response's letters written in the prompt's script, as
  in DeepSeek-R1's language-consistency reward. Scripts come from `unicodedata` character
  names (LATIN, CYRILLIC, GREEK, ARABIC, HEBREW, DEVANAGARI, HANGUL, THAI, ...); Han, Hiragana and
  Katakana count as one script, "CJK". LaTeX commands (`\\frac`) and inline math (`$...$`,
  `\\(...\\)`) are not language, so their letters are not counted. A response without letters
  (a bare number) scores 1.0.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Sequence

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
EOS_STRINGS = ("<|im_end|>", "<|endoftext|>", "</s>", "<|eot_id|>", "<｜end▁of▁sentence｜>")
_TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)

_CJK_PREFIXES = ("CJK", "HIRAGANA", "KATAKANA", "BOPOMOFO", "IDEOGRAPHIC")
# Longer delimiters first: at a tie "$$" wins over "$".
_MATH_DELIMS = (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"))
_COMMAND_RE = re.compile(r"\\[A-Za-z]+")


def _rstrip_end(text: str, end: int) -> int:
    """The end of `text[:end].rstrip()`, without copying `text`."""
    while end and text[end - 1].isspace():
        end -= 1
    return end


def strip_eos(text: str, eos_strings: Sequence[str] = EOS_STRINGS) -> str:
    """`text` without trailing whitespace and end-of-sequence strings.

    Linear in `len(text)`: the end moves back over `text` and the result is sliced once (a
    slice per end string would copy the text once per string: quadratic for an answer that
    is a long run of `<|im_end|>`).
    """
    end = len(text.rstrip())
    changed = True
    while changed:
        changed = False
        for eos in eos_strings:
            if eos and text.endswith(eos, 0, end):
                end = _rstrip_end(text, end - len(eos))
                changed = True
    return text[:end]


def split_thinking(response: str) -> tuple[str, str] | None:
    """A thinking response's (thought, answer): the text inside its leading "<think>" block
    and the text after the block's close, without the newlines Qwen3 puts around them. None for
    a response that does not open with a block, never closes it, or leaves it empty."""
    text = response.lstrip()
    if not text.startswith(THINK_OPEN):
        return None
    inside, close, after = text[len(THINK_OPEN) :].partition(THINK_CLOSE)
    if not close or not inside.strip():
        return None
    return inside.strip("\n"), after.lstrip("\n")


def has_thought(text: str) -> bool:
    """Whether a response opens a thinking block with something in it before its close (or
    before the end, for a block the response never closed)."""
    start = text.find(THINK_OPEN)
    if start < 0:
        return False
    inside = text[start + len(THINK_OPEN) :]
    return bool(inside.partition(THINK_CLOSE)[0].strip())


def mode_reward(text: str, think: bool) -> float:
    """1.0 when `text` follows the mode its prompt asked for (see the module docstring)."""
    return float(split_thinking(text) is not None if think else not has_thought(text))


def r1_format_reward(
    text: str, *, think_in_prompt: bool = False, eos_strings: Sequence[str] = EOS_STRINGS
) -> float:
    """1.0 when `text` follows the R1 template exactly (see the module docstring), else 0.0.

    Args:
      text: the response.
      think_in_prompt: the prompt ended with `<think>`, so the response must not open it again.
      eos_strings: end-of-sequence strings allowed (any number, any order) after `</answer>`.
    """
    body = strip_eos(text, eos_strings)
    counts = {tag: body.count(tag) for tag in _TAGS}
    expected_open = 0 if think_in_prompt else 1
    if counts[THINK_OPEN] != expected_open or any(counts[t] != 1 for t in _TAGS[1:]):
        return 0.0
    if not think_in_prompt and not body.lstrip().startswith(THINK_OPEN):
        return 0.0
    think_end = body.find(THINK_CLOSE)
    answer_start = body.find(ANSWER_OPEN)
    if not think_end < answer_start:
        return 0.0
    if body[think_end + len(THINK_CLOSE) : answer_start].strip():
        return 0.0
    if not body.endswith(ANSWER_CLOSE):
        return 0.0
    answer = body[answer_start + len(ANSWER_OPEN) : -len(ANSWER_CLOSE)]
    return 1.0 if answer.strip() else 0.0


def script_of(char: str) -> str | None:
    """The script of a letter ("LATIN", "CYRILLIC", "CJK", ...); None for a non-letter."""
    if not unicodedata.category(char).startswith("L"):
        return None
    name = unicodedata.name(char, "")
    if not name:
        return "UNKNOWN"
    if name.startswith(_CJK_PREFIXES):
        return "CJK"
    return name.split(" ", 1)[0]


def _drop_math(text: str) -> str:
    """`text` without its math spans; linear time (each delimiter's next position is cached)."""
    inf = len(text) + 1
    next_at = [-1] * len(_MATH_DELIMS)
    out, i = [], 0
    while True:
        for d, (open_, _) in enumerate(_MATH_DELIMS):
            if next_at[d] < i:
                found = text.find(open_, i)
                next_at[d] = found if found >= 0 else inf
        start = min(next_at)
        d = next_at.index(start)
        if start >= inf:
            break
        open_, close = _MATH_DELIMS[d]
        end = text.find(close, start + len(open_))
        if end < 0:  # never closed: this delimiter opens nothing from here on
            next_at[d] = inf
            continue
        out.append(text[i:start])
        i = end + len(close)
    out.append(text[i:])
    return " ".join(out)


def _letters_by_script(text: str) -> Counter:
    chars = Counter(_COMMAND_RE.sub(" ", _drop_math(text)))  # counting in C, then per char
    scripts: Counter = Counter()
    for char, count in chars.items():
        script = script_of(char)
        if script is not None:
            scripts[script] += count
    return scripts


def dominant_script(text: str) -> str | None:
    """The script most of the letters of `text` are written in, or None when it has none."""
    counts = _letters_by_script(text)
    return counts.most_common(1)[0][0] if counts else None


def language_consistency(prompt: str, response: str, script: str | None = None) -> float:
    """The share of the response's letters that are in the prompt's script, in [0, 1].

    Args:
      prompt: the prompt text; its dominant script is the target.
      response: the generated text (for R1, its chain of thought).
      script: the target script, overriding the prompt's ("LATIN", "CJK", ...).

    Returns:
      The share; 1.0 when the response has no letters or the target script is unknown (a prompt
      without letters).
    """
    target = script if script is not None else dominant_script(prompt)
    counts = _letters_by_script(response)
    total = sum(counts.values())
    if target is None or total == 0:
        return 1.0
    return counts[target] / total
