"""Math answers: find the final answer a response commits to.

Host code, linear in the length of the text whatever it holds (hostile responses included).

The committed region:

1. a response with a `</think>`: the text after the last `</think>`. An answer stated only
   inside the thinking is not committed (the response withdrew it, or never gave it) and gets no
   credit. A response without `</think>` is committed whole.
2. Inside the region, when it holds complete `<answer>...</answer>` blocks, only those blocks
   count (the format's answer); text outside them does not.

Final-answer markers, in the region (in each block, when it has blocks):

* every `\\boxed{...}` / `\\fbox{...}` (balanced braces; `\\boxed 5` too) that is not inside
  another box; a box holding nothing but a box is that box; an empty box is an empty answer;
* every GSM8K line `#### answer`, unless it reads as a markdown heading (a word of two letters or
  more first, or a colon last: `#### Step 1:`);
* where the region has neither: every sentence that states the answer, "The (final) answer is X",
  "Answer: X", whose X is math (it starts with a digit, a sign, a bracket, `$` or `\\`, or is one
  letter such as a choice or a variable, and holds no word but unit words), in a sentence with no
  hedge word ("not", "or", "either", "maybe", "if", "whether", "approximately", ...) and no
  question mark. `The final answer is 42.` and `Therefore the answer is $x=3$.` are markers;
  `the answer is not 5` and `the answer is 5 or 6` are not.
* a block with none of these markers: its whole text.

The rule for several final answers: when the committed region holds several final-answer markers
and their answers are not all equivalent to each other (`rewards.math.is_equivalent`), the
response has no final answer and gets no credit, wherever the right answer stands among them
(first, middle or last): `Maybe \\boxed{3}, or \\boxed{4}, or \\boxed{5}`, `<answer>\\boxed{41}
\\boxed{42}</answer>` and two different `####` lines score 0, as verl's and math-verify's users
expect of a hedged response. When they all agree (the same answer boxed twice, `\\boxed{1/2}` and
`\\boxed{0.5}`, a box and a `####` line that say the same), the response's answer is the last of
them. More than `MAX_ANSWERS` different answers are no answer either.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from rlvr_jax.rewards.math_numbers import UNIT_WORDS, word_set

MAX_ANSWERS = 8  # more different answers than this are never checked for agreement
_MAX_SENTENCE_ANSWER = 100  # characters of an answer stated in a sentence
_SENTENCE_SCAN = 300  # characters read after "the answer is"
_PREFIX_SCAN = 200  # characters read before it, for hedges

_THINK_CLOSE = "</think>"
_ANSWER_OPEN, _ANSWER_CLOSE = "<answer>", "</answer>"
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOXED_BARE_RE = re.compile(r"\\boxed\s+([^\s${}]+)")
_HASH_RE = re.compile(r"(?<!#)####(?!#)[ \t]*([^\n]*)")
_HEADING_RE = re.compile(r"[*_\s]*[A-Za-z]{2,}|.*:[*_\s]*$")
_SENTENCE_RE = re.compile(
    r"\b(?:final\s+)?answer(?:\s+to\s+(?:the|this)\s+(?:problem|question))?"
    r"\s*(?:is\s*:?|:|=)[ \t*]*",
    re.IGNORECASE,
)
_SENTENCE_END_RE = re.compile(r"(?<!\\)[.!?;](?=\s|$)|\n")  # `\!` `\;` are LaTeX spaces
_BOUNDARY_RE = re.compile(r"(?<!\\)[.!?;](?=\s)|\n")
_CLAUSE_RE = re.compile(r",?\s+(?:which|since|because|as|so|where)\b", re.IGNORECASE)
_MATH_SPAN_RE = re.compile(r"\$\$.*?\$\$|\$[^$]*\$|\\\(.*?\\\)|\\\[.*?\\\]", re.DOTALL)
_COMMAND_RE = re.compile(r"\\[A-Za-z]+")
_WORD_RE = re.compile(r"[A-Za-z']+")
_LONG_WORD_RE = re.compile(r"[A-Za-z]{2,}")


_HEDGES = word_set(
    """
    not isn't isnt cannot can't or either neither nor maybe perhaps possibly probably likely
    might may could if whether suppose supposing assume assuming guess approximately roughly
    nearly almost wrong incorrect unless check verify except
    """
)


# ----------------------------------------------------------------------------------------------
# Boxes


def _match_braces(text: str) -> dict[int, int]:
    """Positions of `{` mapped to their matching `}`, in one pass; escaped `\\{` `\\}` are text."""
    stack: list[int] = []
    match: dict[int, int] = {}
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n and text[i + 1] in "{}":
            i += 2
            continue
        if c == "{":
            stack.append(i)
        elif c == "}" and stack:
            match[stack.pop()] = i
        i += 1
    return match


def last_boxed(text: str) -> str | None:
    """The content of the last complete `\\boxed{...}` or `\\fbox{...}` (or `\\boxed x`).

    Linear in the length of `text`, whatever its nesting, so it is safe on hostile input.
    """
    starts = [m.end() - 1 for m in _BOXED_RE.finditer(text)]
    bare = list(_BOXED_BARE_RE.finditer(text))
    braced = None
    if starts:
        match = _match_braces(text)
        for open_pos in reversed(starts):
            close = match.get(open_pos)
            if close is not None:
                braced = (open_pos, text[open_pos + 1 : close])
                break
    if bare and (braced is None or bare[-1].start() > braced[0]):
        return bare[-1].group(1)
    return None if braced is None else braced[1]


def _innermost(text: str, boxes: dict[int, int], match: dict[int, int], open_: int, close: int):
    """The braces of the box a box holds when it holds nothing else, else its own."""
    while True:
        start = open_ + 1
        while start < close and text[start].isspace():
            start += 1
        inner = boxes.get(start)
        inner_close = match.get(inner) if inner is not None else None
        if inner_close is None:
            return open_, close
        after = text[inner_close + 1 : close]
        if after and not after.isspace():
            return open_, close
        open_, close = inner, inner_close


def _boxed_answers(text: str) -> list[tuple[int, str]]:
    """(position, content) of every box not inside another box."""
    boxes = {m.start(): m.end() - 1 for m in _BOXED_RE.finditer(text)}
    found: list[tuple[int, str]] = []
    spans: list[tuple[int, int]] = []
    if boxes:
        match = _match_braces(text)
        covered = -1
        for start, open_ in boxes.items():
            close = match.get(open_)
            if start < covered or close is None:
                continue
            covered = close
            spans.append((start, close))
            inner_open, inner_close = _innermost(text, boxes, match, open_, close)
            found.append((start, text[inner_open + 1 : inner_close].strip()))
    k = 0
    for m in _BOXED_BARE_RE.finditer(text):
        while k < len(spans) and spans[k][1] < m.start():
            k += 1
        if k < len(spans) and spans[k][0] <= m.start():
            continue  # inside a braced box
        found.append((m.start(), m.group(1).strip()))
    return found


# ----------------------------------------------------------------------------------------------
# GSM8K markers and answer sentences


def _hash_answers(text: str) -> list[tuple[int, str]]:
    found = []
    for m in _HASH_RE.finditer(text):
        line = m.group(1).strip()
        if line and not _HEADING_RE.match(line):
            found.append((m.start(), line))
    return found


def _is_math(answer: str) -> bool:
    """Whether a sentence's answer is math: see the module docstring."""
    first = answer[0]
    if first.isalpha():
        if len(answer) > 1 and answer[1].isalpha():
            return False  # a word: "the number of ...", "correct"
    elif not (first.isdigit() or first in "+-\u2212$\\([{.|"):
        return False
    rest = _COMMAND_RE.sub(" ", _MATH_SPAN_RE.sub(" ", answer))
    return all(w.lower() in UNIT_WORDS for w in _LONG_WORD_RE.findall(rest))


def _sentence_answer(text: str, m: re.Match, prev_end: int, next_start: int) -> str | None:
    """The answer of the sentence that `m` ("the answer is") begins to state, or None."""
    window = text[max(prev_end, m.start() - _PREFIX_SCAN) : m.start()]
    cuts = [b.end() for b in _BOUNDARY_RE.finditer(window)]
    prefix = window[cuts[-1] :] if cuts else window
    tail = text[m.end() : min(next_start, m.end() + _SENTENCE_SCAN)]
    end = _SENTENCE_END_RE.search(tail)
    if end is not None and end.group() == "?":
        return None
    sentence_tail = tail[: end.start()] if end else tail
    words = _WORD_RE.findall(prefix) + _WORD_RE.findall(sentence_tail)
    if any(w.lower() in _HEDGES for w in words) or "?" in sentence_tail:
        return None
    clause = _CLAUSE_RE.search(sentence_tail)
    answer = sentence_tail[: clause.start()] if clause else sentence_tail
    answer = answer.strip().strip("*_").strip().rstrip(".,;:").strip()
    if not answer or len(answer) > _MAX_SENTENCE_ANSWER or not _is_math(answer):
        return None
    return answer


def _sentence_answers(text: str) -> list[tuple[int, str]]:
    matches = list(_SENTENCE_RE.finditer(text))
    found = []
    for i, m in enumerate(matches):
        prev_end = matches[i - 1].end() if i else 0
        next_start = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        answer = _sentence_answer(text, m, prev_end, next_start)
        if answer is not None:
            found.append((m.start(), answer))
    return found


# ----------------------------------------------------------------------------------------------
# The committed answer


def committed_region(text: str) -> str:
    """The text after the last `</think>`, or all of `text` when it has none."""
    close = text.rfind(_THINK_CLOSE)
    return text if close < 0 else text[close + len(_THINK_CLOSE) :]


def _answer_blocks(region: str) -> list[str]:
    """The complete `<answer>...</answer>` blocks; bounded `rfind`s keep it linear."""
    blocks, pos = [], 0
    while (end := region.find(_ANSWER_CLOSE, pos)) >= 0:
        start = region.rfind(_ANSWER_OPEN, pos, end)
        if start >= 0:
            blocks.append(region[start + len(_ANSWER_OPEN) : end])
        pos = end + len(_ANSWER_CLOSE)
    return blocks


def _markers(region: str) -> list[str]:
    found = _boxed_answers(region) + _hash_answers(region)
    if not found:
        found = _sentence_answers(region)
    return [answer for _, answer in sorted(found, key=lambda x: x[0])]


def final_answers(text: str) -> list[str]:
    """The different answers of the final-answer markers of `text`'s committed region (module
    docstring), in the order of their last statement; empty when it states none."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    region = committed_region(text)
    blocks = _answer_blocks(region)
    if blocks:
        answers = []
        for block in blocks:
            answers += _markers(block) or [block.strip()]
    else:
        answers = _markers(region)
    return list(dict.fromkeys(reversed(answers)))[::-1]


def committed_answer(text: str, same: Callable[[str, str], bool]) -> str | None:
    """The final answer `text` commits to, or None (no answer, an empty one, or several that
    `same` does not find all equal: the rule of the module docstring)."""
    answers = final_answers(text)
    if not answers or len(answers) > MAX_ANSWERS or not all(answers):
        return None
    last = answers[-1]
    return last if all(same(a, last) for a in answers[:-1]) else None
