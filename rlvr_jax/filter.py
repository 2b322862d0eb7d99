"""Offline difficulty filter: drop the prompts the initial policy always (or never) solves.

A prompt the policy solves in all N samples gives a zero-variance group at the start of training
(no gradient), and one it never solves is often out of reach; filtering both before training
spends the rollout budget where the group advantage is informative.

Command:
  python -m rlvr_jax.filter --model=embedded --dataset=gsm8k \\
      --data_path=../shared/data/gsm8k/train.jsonl --template=chat --num_samples=8 \\
      --output=/tmp/gsm8k_filtered.jsonl
  python -m rlvr_jax.filter --model=embedded --dataset=reasoning_gym:gcd,lcm --level=1,2 \
      --num_prompts=256 --verifier=reasoning_gym --template='chat:{question}' \
      --output=/tmp/rg_filtered.jsonl

It samples N completions per prompt with the KV-cache sampler, verifies each, writes the kept
examples as JSONL `Example` records (load them with `datasets.load_jsonl("examples", path)`; each
record's meta["filter"] holds its success count), and prints a histogram of the per-prompt success
counts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Iterator, Sequence

import numpy as np
from absl import app, flags

from rlvr_jax.config_types import ConfigError
from rlvr_jax.data import datasets, reasoning_gym_tasks, templates
from rlvr_jax.data.example import Example
from rlvr_jax.data.tokenizer import Tokenizer, load_tokenizer
from rlvr_jax.envs import single_turn
from rlvr_jax.envs.task import Task
from rlvr_jax.model import loading
from rlvr_jax.program.runtime import compilation, user_errors
from rlvr_jax.program.studies import difficulty
from rlvr_jax.rewards.config import RewardSettings

# The training verifiers the filter can score with: single-turn ones that score text on the host.
TASK_VERIFIERS = ("math", "countdown", "reasoning_gym")

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
flags.DEFINE_string(
    "dataset",
    "gsm8k",
    f"Dataset name: one of {', '.join(datasets.DATASET_NAMES)}, or "
    "'reasoning_gym:<task>[,<task>...]' (docs/reasoning_gym.md).",
    flag_values=FLAGS,
)
flags.register_validator(
    "dataset",
    lambda name: name in datasets.DATASET_NAMES or reasoning_gym_tasks.is_reasoning_gym(name),
    message=f"--dataset must be one of {datasets.DATASET_NAMES} or 'reasoning_gym:<task>'",
    flag_values=FLAGS,
)
flags.DEFINE_string("data_path", "", "Local JSONL file or directory.", flag_values=FLAGS)
flags.DEFINE_string(
    "split", "", "Split (default: test locally, the source's on a hub).", flag_values=FLAGS
)
flags.DEFINE_enum("hub", "hf", ["hf", "tfds"], "Hub when --data_path is empty.", flag_values=FLAGS)
flags.DEFINE_integer("num_prompts", 0, "Use the first N prompts (0: all).", flag_values=FLAGS)
flags.DEFINE_list(
    "level",
    [],
    "Generated tasks: arithmetic levels / countdown number counts / reasoning-gym levels.",
    flag_values=FLAGS,
)
flags.DEFINE_list(
    "weights", [], "reasoning-gym mix: each task's share (empty: equal).", flag_values=FLAGS
)
flags.DEFINE_string(
    "task_config", "", "reasoning-gym: JSON {task: {config field: value}}.", flag_values=FLAGS
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
flags.DEFINE_enum(
    "verifier",
    "last_number",
    ["last_number", *TASK_VERIFIERS],
    "'last_number' (the last number equals the answer, in this process), or the training "
    "verifier of that name (`reward.verifier`, scored in its verifier pool: 'reasoning_gym' "
    "for reasoning-gym tasks).",
    flag_values=FLAGS,
)
flags.DEFINE_integer("workers", 2, "Verifier processes of a training verifier.", flag_values=FLAGS)
flags.DEFINE_integer("num_samples", 8, "N samples per prompt.", flag_values=FLAGS)
flags.DEFINE_integer("batch_prompts", 8, "Prompts per sampler call.", flag_values=FLAGS)
flags.DEFINE_list("buckets", ["64", "128", "256"], "Prompt length buckets.", flag_values=FLAGS)
flags.DEFINE_integer("max_new_tokens", 256, "Generated tokens per sample.", flag_values=FLAGS)
flags.DEFINE_float("temperature", 1.0, "Sampling temperature.", flag_values=FLAGS)
flags.DEFINE_float("top_p", 1.0, "Top-p.", flag_values=FLAGS)
flags.DEFINE_string("dtype", "float32", "Compute dtype.", flag_values=FLAGS)
flags.DEFINE_integer("seed", 0, "Seed of sampling and generated tasks.", flag_values=FLAGS)
flags.DEFINE_string(
    "compile_cache",
    str(compilation.default_cache_dir()),
    compilation.CACHE_FLAG_HELP,
    flag_values=FLAGS,
)
flags.DEFINE_bool(
    "drop_all_solved", True, "Drop prompts solved in all N samples.", flag_values=FLAGS
)
flags.DEFINE_bool("drop_never_solved", False, "Drop prompts never solved.", flag_values=FLAGS)
flags.DEFINE_string("output", "", "Where to write the kept examples (JSONL).", flag_values=FLAGS)
flags.DEFINE_bool(user_errors.VERBOSE_FLAG, False, user_errors.VERBOSE_HELP, flag_values=FLAGS)


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
    if spec.startswith("chars:"):
        return Tokenizer.from_characters(spec.removeprefix("chars:"))
    if spec.endswith(".gguf"):
        return Tokenizer.from_gguf(spec)
    if spec:
        return Tokenizer.from_hf_dir(spec)
    tok = load_tokenizer(model)
    if tok is None:
        raise app.UsageError(f"--model={model!r} has no tokenizer of its own; pass --tokenizer")
    return tok


@contextlib.contextmanager
def _verifier(
    name: str, workers: int, tokenizer: Tokenizer, examples: list[Example], template: str
) -> Iterator[difficulty.Verifier | Task]:
    """The named verifier; a training verifier's task (and its pool) is closed on exit."""
    if name in difficulty.VERIFIERS:
        yield difficulty.VERIFIERS[name]
        return
    reward = RewardSettings(verifier=name, workers=workers)
    try:
        task = single_turn.build_task(reward, tokenizer, tokenizer.vocab_size, examples, template)
    except ConfigError as e:
        raise app.UsageError(f"--verifier={name}: {e}") from e
    with task:
        yield task


def _execute() -> FilterResult:
    """Runs the command from the parsed `FLAGS`."""
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
        weights=tuple(float(w) for w in f.weights),
        task_config=f.task_config,
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
    with _verifier(f.verifier, f.workers, tokenizer, examples, f.template) as verify:
        sampled, counts = difficulty.count_successes(
            params,
            model_cfg,
            tokenizer,
            examples,
            templates.get_template(f.template),
            f.num_samples,
            verify,
            buckets=buckets,
            max_new_tokens=f.max_new_tokens,
            batch_prompts=f.batch_prompts,
            temperature=f.temperature,
            top_p=f.top_p,
            seed=f.seed,
        )
    hist = difficulty.success_histogram(counts, f.num_samples)
    kept, stats = difficulty.filter_by_success(
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
    print(difficulty.format_histogram(hist))
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
    """This module's flags first, then absl's own (logging verbosity); a flag error is raised
    (`user_errors.run` prints it and exits with status 2)."""
    if any(a in ("-h", "--help", "--helpshort") for a in argv[1:]):
        print(f"{__doc__}\nFlags:\n{FLAGS.get_help()}")
        sys.exit(0)
    return flags.FLAGS(FLAGS(argv, known_only=True))


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {list(argv[1:])}")
    compilation.enable_cache(FLAGS.compile_cache)
    _execute()


if __name__ == "__main__":
    user_errors.run("filter", main, flags_parser=_parse_flags, flag_values=FLAGS)
