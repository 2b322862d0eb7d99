"""Offline difficulty filter: drop the prompts the initial policy always (or never) solves.

A prompt the policy solves in all N samples gives a zero-variance group at the start of training
(no gradient), and one it never solves is often out of reach; filtering both before training
spends the rollout budget where the group advantage is informative.

Command:
  python -m rlvr_jax.data.filter --model=embedded --dataset=gsm8k \\
      --data_path=../shared/data/gsm8k/train.jsonl --template=chat --num_samples=8 \\
      --output=/tmp/gsm8k_filtered.jsonl

It samples N completions per prompt with the KV-cache sampler, verifies each, writes the kept
examples as JSONL `Example` records (load them with `datasets.load_jsonl("examples", path)`; each
record's meta["filter"] holds its success count), and prints a histogram of the per-prompt success
counts.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable, Sequence
from fractions import Fraction

import jax
import numpy as np
from absl import app, flags, logging

from rlvr_jax import sampling
from rlvr_jax.data import datasets, templates
from rlvr_jax.data.datasets import Example
from rlvr_jax.data.tokenizer import Tokenizer
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.transformer import Params

# verify(completion text, example) -> solved.
Verifier = Callable[[str, Example], bool]

# A private flag set, so that importing this module next to another entry point (rlvr_jax.main)
# defines no duplicate flags in absl's global FLAGS.
FLAGS = flags.FlagValues()
flags.DEFINE_string("model", "embedded", "Weight source (see model/loading.py).", flag_values=FLAGS)
flags.DEFINE_string(
    "tokenizer",
    "",
    "Empty: the model's own; 'chars:<alphabet>': a character tokenizer; or a .gguf file / "
    "Hugging Face directory.",
    flag_values=FLAGS,
)
flags.DEFINE_enum(
    "dataset", "gsm8k", list(datasets.DATASET_NAMES), "Dataset name.", flag_values=FLAGS
)
flags.DEFINE_string("data_path", "", "Local JSONL file or directory.", flag_values=FLAGS)
flags.DEFINE_string(
    "split", "", "Split (default: test locally, the source's on a hub).", flag_values=FLAGS
)
flags.DEFINE_enum("hub", "hf", ["hf", "tfds"], "Hub when --data_path is empty.", flag_values=FLAGS)
flags.DEFINE_integer("num_prompts", 0, "Use the first N prompts (0: all).", flag_values=FLAGS)
flags.DEFINE_list(
    "level", [], "Generated tasks: arithmetic levels / countdown number counts.", flag_values=FLAGS
)
flags.DEFINE_bool(
    "exclude_multiple_choice", False, "Drop multiple-choice items.", flag_values=FLAGS
)
flags.DEFINE_bool(
    "exclude_true_false", False, "Drop True/False and Yes/No items.", flag_values=FLAGS
)
flags.DEFINE_string(
    "template", "chat", "Prompt template name or 'text:<format>'.", flag_values=FLAGS
)
flags.DEFINE_enum("verifier", "last_number", ["last_number"], "Verifier.", flag_values=FLAGS)
flags.DEFINE_integer("num_samples", 8, "N samples per prompt.", flag_values=FLAGS)
flags.DEFINE_integer("batch_prompts", 8, "Prompts per sampler call.", flag_values=FLAGS)
flags.DEFINE_list("buckets", ["64", "128", "256"], "Prompt length buckets.", flag_values=FLAGS)
flags.DEFINE_integer("max_new_tokens", 256, "Generated tokens per sample.", flag_values=FLAGS)
flags.DEFINE_float("temperature", 1.0, "Sampling temperature.", flag_values=FLAGS)
flags.DEFINE_float("top_p", 1.0, "Top-p.", flag_values=FLAGS)
flags.DEFINE_string("dtype", "float32", "Compute dtype.", flag_values=FLAGS)
flags.DEFINE_integer("seed", 0, "Seed of sampling and generated tasks.", flag_values=FLAGS)
flags.DEFINE_bool(
    "drop_all_solved", True, "Drop prompts solved in all N samples.", flag_values=FLAGS
)
flags.DEFINE_bool("drop_never_solved", False, "Drop prompts never solved.", flag_values=FLAGS)
flags.DEFINE_string("output", "", "Where to write the kept examples (JSONL).", flag_values=FLAGS)


# ---------------------------------------------------------------------------------------------
# The pure part


def success_histogram(success_counts: Sequence[int] | np.ndarray, n: int) -> np.ndarray:
    """hist[k] = how many prompts were solved in exactly k of n samples, k = 0..n.

    Raises:
      ValueError: for a count outside [0, n] (naming its position).
    """
    counts = np.asarray(success_counts, np.int64)
    bad = np.flatnonzero((counts < 0) | (counts > n))
    if bad.size:
        raise ValueError(f"success_counts[{bad[0]}]={counts[bad[0]]} is outside [0, {n}]")
    return np.bincount(counts, minlength=n + 1)


def format_histogram(hist: np.ndarray, width: int = 40) -> str:
    """A text histogram, one line per success count k: "k/n  count  bar"."""
    n = len(hist) - 1
    top = max(int(hist.max()), 1)
    digits = len(str(int(hist.max())))
    lines = [f"successes/{n}  prompts"]
    for k, c in enumerate(hist):
        bar = "#" * round(width * int(c) / top)
        lines.append(f"{k:>{len(str(n))}}/{n}  {int(c):>{digits}}  {bar}".rstrip())
    return "\n".join(lines)


def filter_by_success(
    examples: Sequence[Example],
    success_counts: Sequence[int] | np.ndarray,
    n: int,
    drop_all_solved: bool = True,
    drop_never_solved: bool = False,
) -> tuple[list[Example], dict[str, int]]:
    """Keeps the examples whose success count is informative.

    Args:
      examples: the prompts.
      success_counts: successes of each prompt in `n` samples.
      n: samples per prompt.
      drop_all_solved: drop prompts solved in all n samples.
      drop_never_solved: drop prompts solved in none.

    Returns:
      (kept examples in input order, {"total", "kept", "dropped_all_solved",
      "dropped_never_solved"}).
    """
    if n < 1:
        raise ValueError(f"n={n} must be at least 1")
    counts = np.asarray(success_counts, np.int64)
    if counts.shape != (len(examples),):
        raise ValueError(
            f"success_counts has shape {counts.shape}; expected ({len(examples)},) for the examples"
        )
    success_histogram(counts, n)  # validates the range
    all_solved = drop_all_solved & (counts == n)
    never = drop_never_solved & (counts == 0)
    keep = ~(all_solved | never)
    kept = [ex for ex, k in zip(examples, keep, strict=True) if k]
    stats = {
        "total": len(examples),
        "kept": len(kept),
        "dropped_all_solved": int(all_solved.sum()),
        "dropped_never_solved": int(never.sum()),
    }
    return kept, stats


# ---------------------------------------------------------------------------------------------
# Verifier and sampling

_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")


def last_number(text: str) -> str | None:
    """The last number in `text` ("1,234.5" -> "1234.5"), or None."""
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


def _as_fraction(text: str) -> Fraction | None:
    try:
        return Fraction(text.strip().replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def last_number_verifier(completion: str, example: Example) -> bool:
    """Whether the last number of the completion equals the (numeric) gold answer, exactly."""
    got, gold = last_number(completion), _as_fraction(example.answer)
    if got is None or gold is None:
        return False
    return _as_fraction(got) == gold


VERIFIERS: dict[str, Verifier] = {"last_number": last_number_verifier}


def count_successes(
    params: Params,
    model_cfg: ModelConfig,
    tokenizer: Tokenizer,
    examples: Sequence[Example],
    template: templates.PromptTemplate,
    n: int,
    verify: Verifier,
    *,
    buckets: Sequence[int],
    max_new_tokens: int,
    batch_prompts: int = 8,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
) -> tuple[list[Example], np.ndarray]:
    """Samples `n` completions per prompt and counts the verified ones.

    Prompts longer than the largest bucket are skipped (and logged). Every sampler call has
    `batch_prompts * n` rows (the last chunk is padded by repeating a prompt, whose extra results
    are discarded), so at most one program per bucket is compiled.

    Args:
      params: policy weights.
      model_cfg: its `ModelConfig`.
      tokenizer: its tokenizer.
      examples: the prompts.
      template: the prompt template.
      n: samples per prompt.
      verify: `verify(completion_text, example) -> bool`.
      buckets: prompt length buckets.
      max_new_tokens: generated tokens per sample.
      batch_prompts: prompts per sampler call.
      temperature: sampling temperature.
      top_p: nucleus mass.
      seed: sampling seed.

    Returns:
      (the examples that fit, success counts aligned with them).
    """
    if n < 1 or batch_prompts < 1:
        raise ValueError(f"n={n} and batch_prompts={batch_prompts} must be >= 1")
    encoded = templates.encode_prompts(examples, template, tokenizer, buckets)
    if encoded.num_too_long:
        logging.warning("difficulty filter: %s", encoded.summary())
    cfg = sampling.SamplerConfig(
        max_new_tokens=max_new_tokens, eos_ids=tokenizer.eos_ids, pad_id=tokenizer.pad_id
    )
    sp = sampling.sampling_params(batch_prompts * n, temperature, top_p)
    key = jax.random.key(seed)
    counts = np.zeros((len(encoded.ids),), np.int64)
    for start in range(0, len(encoded.ids), batch_prompts):
        chunk = encoded.ids[start : start + batch_prompts]
        real = len(chunk)
        chunk = chunk + [chunk[-1]] * (batch_prompts - real)
        prompt_NP, lengths_N = sampling.bucket_and_pad(chunk, buckets, tokenizer.pad_id, n)
        rollout = sampling.sample(
            params,
            prompt_NP,
            lengths_N,
            jax.random.fold_in(key, start),
            model_cfg,
            cfg,
            sp,
        )
        for row, tokens in enumerate(sampling.completions(rollout)[: real * n]):
            b = row // n
            text = tokenizer.decode(tokens, skip_special_tokens=True)
            counts[start + b] += bool(verify(text, encoded.examples[start + b]))
    return encoded.examples, counts


# ---------------------------------------------------------------------------------------------
# The command


@dataclasses.dataclass(frozen=True)
class FilterResult:
    """What one run of the command did.

    Attributes:
      examples: the prompts sampled (those that fit the buckets).
      success_counts: successes per prompt.
      histogram: `success_histogram` of the counts.
      kept: the examples written.
      stats: `filter_by_success` counts.
    """

    examples: list[Example]
    success_counts: np.ndarray
    histogram: np.ndarray
    kept: list[Example]
    stats: dict[str, int]


def _tokenizer(spec: str, model: str) -> Tokenizer:
    from rlvr_jax.model import loading

    if spec.startswith("chars:"):
        return Tokenizer.from_characters(spec.removeprefix("chars:"))
    if spec.endswith(".gguf"):
        return Tokenizer.from_gguf(spec)
    if spec:
        return Tokenizer.from_hf_dir(spec)
    tok = loading.load_tokenizer(model)
    if tok is None:
        raise app.UsageError(f"--model={model!r} has no tokenizer of its own; pass --tokenizer")
    return tok


def _execute() -> FilterResult:
    """Runs the command from the parsed `FLAGS`."""
    from rlvr_jax.model import loading

    f = FLAGS
    if not f.output:
        raise app.UsageError("--output is required (the JSONL file of kept examples)")
    buckets = [int(b) for b in f.buckets]
    level = [int(x) for x in f.level] or None
    examples, report = datasets.load(
        f.dataset,
        f.data_path or None,
        f.split or None,
        hub=f.hub,
        num=f.num_prompts or None,
        seed=f.seed,
        level=level,
        exclude_multiple_choice=f.exclude_multiple_choice,
        exclude_true_false=f.exclude_true_false,
    )
    if report is not None:
        print(report.summary())
    tokenizer = _tokenizer(f.tokenizer, f.model)
    overrides = {"dtype": f.dtype}
    if f.model.startswith("random:"):
        # Random weights have no vocabulary of their own: size the embedding to the tokenizer.
        overrides["vocab_size"] = tokenizer.vocab_size
    params, model_cfg = loading.load_model(f.model, seed=f.seed, **overrides)
    sampled, counts = count_successes(
        params,
        model_cfg,
        tokenizer,
        examples,
        templates.get_template(f.template),
        f.num_samples,
        VERIFIERS[f.verifier],
        buckets=buckets,
        max_new_tokens=f.max_new_tokens,
        batch_prompts=f.batch_prompts,
        temperature=f.temperature,
        top_p=f.top_p,
        seed=f.seed,
    )
    hist = success_histogram(counts, f.num_samples)
    kept, stats = filter_by_success(
        sampled, counts, f.num_samples, f.drop_all_solved, f.drop_never_solved
    )
    successes = dict(zip((ex.id for ex in sampled), counts.tolist(), strict=True))
    annotated = [
        dataclasses.replace(
            ex,
            meta={
                **ex.meta,
                "filter": {
                    "successes": successes[ex.id],
                    "samples": f.num_samples,
                    "model": f.model,
                },
            },
        )
        for ex in kept
    ]
    datasets.write_examples(f.output, annotated)
    print(format_histogram(hist))
    print(
        f"kept {stats['kept']} of {stats['total']} prompts (dropped {stats['dropped_all_solved']} "
        f"always solved, {stats['dropped_never_solved']} never solved); wrote {f.output}"
    )
    return FilterResult(sampled, counts, hist, annotated, stats)


def run(argv: Sequence[str]) -> FilterResult:
    """Parses `argv` (program name first) into `FLAGS` and runs the command."""
    FLAGS.unparse_flags()
    rest = FLAGS(list(argv))
    if len(rest) > 1:
        raise app.UsageError(f"unexpected arguments: {rest[1:]}")
    return _execute()


def _parse_flags(argv: list[str]) -> list[str]:
    """This module's flags first, then absl's own (logging verbosity); usage errors exit 1."""
    if any(a in ("-h", "--help", "--helpshort") for a in argv[1:]):
        print(f"{__doc__}\nFlags:\n{FLAGS.get_help()}")
        sys.exit(0)
    try:
        return flags.FLAGS(FLAGS(argv, known_only=True))
    except flags.Error as e:
        print(f"FATAL Flags parsing error: {e}\nPass --help to see the flags.", file=sys.stderr)
        sys.exit(1)


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {list(argv[1:])}")
    _execute()


if __name__ == "__main__":
    app.run(main, flags_parser=_parse_flags)
