"""Prompt templates: a question becomes prompt text, then token ids for the sampler.

Host code. The named templates (`TEMPLATES`):
- "r1_zero": DeepSeek-R1-Zero's plain-text conversation (no chat template), ending in
  "Assistant: <think>" so that the model continues inside its reasoning block (as TinyZero and
  understand-r1-zero do for base models).
- "qwen_math_boxed": Qwen2.5-Math's chain-of-thought prompt, the system message "Please reason
  step by step, and put your final answer within \\boxed{}." through the chat template.
- "chat": the question as one user turn through the tokenizer's chat template.
- "qwen3_thinking" / "qwen3_non_thinking": the chat template with `enable_thinking=True/False`.
  For a template that does not read `enable_thinking`, non-thinking mode appends the empty
  "<think>\\n\\n</think>\\n\\n" block that Qwen3's own template writes in that mode.
- "plain": the question as is, no template (models trained from scratch; for a code problem,
  HumanEval's completion format: the model continues the function).
- "code": a code problem (a Python signature and docstring) as one user turn through the chat
  template, asking for the whole function in one ```python block (`envs.code` reads it).

`text_template("{question}=")` makes a plain-text template of any format.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from rlvr_jax.data.datasets import Example
from rlvr_jax.data.tokenizer import Tokenizer

QUESTION = "{question}"

R1_ZERO = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. The reasoning process and answer are enclosed within "
    "<think> </think> and <answer> </answer> tags, respectively, i.e., <think> reasoning process "
    "here </think> <answer> answer here </answer>.\nUser: {question}\nAssistant: <think>"
)
BOXED_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
CODE = (
    "Complete the following Python function. Reply with the whole function, its imports "
    "included, in one ```python code block.\n\n```python\n{question}```"
)
# What Qwen3's chat template appends to the generation prompt when enable_thinking=False.
EMPTY_THINK = "<think>\n\n</think>\n\n"


@dataclasses.dataclass(frozen=True)
class PromptTemplate:
    """How a question becomes prompt text.

    Attributes:
      name: for messages and configs.
      chat: render through the tokenizer's chat template (else `text` is the whole prompt).
      text: the prompt (chat=False) or the user message (chat=True); "{question}" marks where the
        question goes (substituted literally: other braces, as in "\\boxed{}", stay as they are).
      system: a system message for chat templates, or None for the template's default.
      thinking: passed as `enable_thinking` to the chat template; None passes nothing.
    """

    name: str
    chat: bool
    text: str = QUESTION
    system: str | None = None
    thinking: bool | None = None

    def __post_init__(self):
        if QUESTION not in self.text:
            raise ValueError(f"template {self.name!r}: text {self.text!r} has no {QUESTION}")
        if self.thinking is not None and not self.chat:
            raise ValueError(f"template {self.name!r}: thinking modes need chat=True")


TEMPLATES: dict[str, PromptTemplate] = {
    "r1_zero": PromptTemplate("r1_zero", chat=False, text=R1_ZERO),
    "qwen_math_boxed": PromptTemplate("qwen_math_boxed", chat=True, system=BOXED_SYSTEM),
    "chat": PromptTemplate("chat", chat=True),
    "qwen3_thinking": PromptTemplate("qwen3_thinking", chat=True, thinking=True),
    "qwen3_non_thinking": PromptTemplate("qwen3_non_thinking", chat=True, thinking=False),
    "plain": PromptTemplate("plain", chat=False),
    "code": PromptTemplate("code", chat=True, text=CODE),
}


def text_template(text: str, name: str = "text") -> PromptTemplate:
    """A plain-text template, e.g. `text_template("{question}=")` for arithmetic."""
    return PromptTemplate(name, chat=False, text=text)


def get_template(name: str) -> PromptTemplate:
    """The named template, a plain-text one for "text:<format>" (e.g. "text:{question}="), or a
    user message through the chat template for "chat:<format>".

    Raises:
      ValueError: for an unknown name, listing the known ones.
    """
    if name.startswith("text:"):
        return text_template(name.removeprefix("text:"))
    if name.startswith("chat:"):
        return PromptTemplate("chat_text", chat=True, text=name.removeprefix("chat:"))
    if name not in TEMPLATES:
        raise ValueError(
            f"prompt template {name!r} is not known; known: {sorted(TEMPLATES)}, 'text:<format>' "
            "or 'chat:<format>'"
        )
    return TEMPLATES[name]


def reads_enable_thinking(tokenizer: Tokenizer) -> bool:
    """Whether the tokenizer's chat template reads the `enable_thinking` variable."""
    return "enable_thinking" in (tokenizer.chat_template or "")


def render(question: str, template: PromptTemplate, tokenizer: Tokenizer | None = None) -> str:
    """The prompt text of one question.

    Args:
      question: the question (`Example.prompt_text`).
      template: how to present it.
      tokenizer: needed for chat templates.

    Raises:
      ValueError: for a chat template without a tokenizer, or a tokenizer without a chat template.
    """
    content = template.text.replace(QUESTION, question)
    if not template.chat:
        return content
    if tokenizer is None:
        raise ValueError(f"template {template.name!r} renders through a chat template; pass one")
    messages: list[Mapping[str, str]] = []
    if template.system is not None:
        messages.append({"role": "system", "content": template.system})
    messages.append({"role": "user", "content": content})
    kwargs = {} if template.thinking is None else {"enable_thinking": template.thinking}
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, **kwargs)
    if template.thinking is False and not reads_enable_thinking(tokenizer):
        text += EMPTY_THINK
    return text


@dataclasses.dataclass(frozen=True)
class EncodedPrompts:
    """Token ids of the prompts that fit, the examples they came from, and what was dropped.

    Attributes:
      ids: token ids per kept prompt.
      examples: the kept examples, aligned with `ids`.
      num_too_long: prompts longer than `max_len`, skipped.
      too_long_ids: the first few skipped example ids.
      max_len: the limit applied (the largest bucket).
      longest: the longest prompt seen, kept or not.
    """

    ids: list[list[int]]
    examples: list[Example]
    num_too_long: int
    too_long_ids: tuple[str, ...]
    max_len: int
    longest: int

    def summary(self) -> str:
        """One line for the log."""
        line = f"{len(self.ids)} prompts fit in {self.max_len} tokens (longest {self.longest})"
        if self.num_too_long:
            line += (
                f"; skipped {self.num_too_long} longer ones, e.g. {', '.join(self.too_long_ids)}"
            )
        return line


def encode_prompts(
    examples: Sequence[Example],
    template: PromptTemplate,
    tokenizer: Tokenizer,
    buckets: Sequence[int],
    add_bos: bool = False,
) -> EncodedPrompts:
    """Renders and tokenizes prompts; those longer than the largest bucket are counted and skipped.

    Args:
      examples: the problems; one whose `meta` has "enable_thinking" renders with that value
        (`data.modes`; a chat template).
      template: the prompt template.
      tokenizer: the policy's tokenizer.
      buckets: the sampler's prompt buckets (only the largest matters here).
      add_bos: prepend the tokenizer's bos id when it has one and the text does not start with
        it (chat templates usually write their own).

    Raises:
      ValueError: for empty buckets, or when no prompt fits (naming the longest).
    """
    if not buckets or min(buckets) < 1:
        raise ValueError(f"buckets={tuple(buckets)} must be a non-empty set of positive lengths")
    max_len = max(int(b) for b in buckets)
    ids, kept, too_long, longest = [], [], [], 0
    for ex in examples:
        mode = ex.meta.get("enable_thinking")  # a prompt's own mode (`data.modes`)
        own = template if mode is None else dataclasses.replace(template, thinking=bool(mode))
        tokens = tokenizer.encode(render(ex.prompt_text, own, tokenizer))
        if add_bos and tokenizer.bos_id is not None and tokens[:1] != [tokenizer.bos_id]:
            tokens = [tokenizer.bos_id, *tokens]
        longest = max(longest, len(tokens))
        if len(tokens) > max_len:
            too_long.append(ex.id)
            continue
        ids.append(tokens)
        kept.append(ex)
    if examples and not ids:
        raise ValueError(
            f"none of {len(examples)} prompts fits in the largest bucket {max_len} with template "
            f"{template.name!r}; the longest has {longest} tokens"
        )
    return EncodedPrompts(ids, kept, len(too_long), tuple(too_long[:5]), max_len, longest)
