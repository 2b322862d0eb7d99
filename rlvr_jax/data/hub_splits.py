"""The configs and splits of every hub dataset the sources name, recorded so that a split that
does not exist is named before anything is downloaded, and checked by tests with no network.

Host code, no imports beyond `sources`. Asking the hub for a split it lacks fails only after the
model has loaded (the evaluator) or deep inside `datasets` with a message that does not say which
setting chose it; `check_hf` and `check_tfds` raise `HubSplitError` naming the dataset, the split
asked and the splits that exist, and `check_source` does it for a `SOURCES` name as the loaders
resolve it (the source's own split when none is given). A dataset id or builder that is not
recorded (an `hf_path=` or `tfds_name=` override) is not checked: nothing offline can vouch for it.

Where each entry was read (none could be queried from here; these are the hub's own pages):
- openai/gsm8k: the dataset card's `configs` (huggingface.co/datasets/gsm8k, commit 60b4b82
  "Add socratic data files"): configs "main" and "socratic", each with train (7,473 rows) and
  test (1,319); the same counts as ../shared/data/gsm8k/{train,test}.jsonl.
- HuggingFaceH4/MATH-500: the repository's file tree at ff5b202, the head of its history, holds
  one data file, test.jsonl, so one config "default" with split test (500 rows, as
  ../shared/data/math500/test.jsonl).
- HuggingFaceH4/aime_2024: the config "default" with split train only, 30 rows (evalscope's
  aime24 benchmark page: subset default, evaluation split train; NeMo RL and verifiers load
  `split="train"`), as ../shared/data/aime/test.jsonl has 30.
- AI-MO/aimo-validation-amc: the dataset viewer (huggingface.co/datasets/AI-MO/aimo-validation-amc
  /viewer): subset "default", split train only, 83 rows; the card's configs list only train.
- TFDS gsm8k: the builder's `_split_generators` (tensorflow/datasets,
  tensorflow_datasets/text/gsm8k/gsm8k.py): train, test, train_socratic, test_socratic.
"""

from __future__ import annotations

from rlvr_jax.data.sources import spec_of

# The config a dataset with a single unnamed one answers to (`load_dataset(path, None)`).
DEFAULT_CONFIG = "default"

# {dataset id: {config: splits}} on the Hugging Face hub.
HF_SPLITS: dict[str, dict[str, tuple[str, ...]]] = {
    "openai/gsm8k": {"main": ("train", "test"), "socratic": ("train", "test")},
    "HuggingFaceH4/MATH-500": {DEFAULT_CONFIG: ("test",)},
    "HuggingFaceH4/aime_2024": {DEFAULT_CONFIG: ("train",)},
    "AI-MO/aimo-validation-amc": {DEFAULT_CONFIG: ("train",)},
}

# {builder: splits} in TensorFlow Datasets.
TFDS_SPLITS: dict[str, tuple[str, ...]] = {
    "gsm8k": ("train", "test", "train_socratic", "test_socratic"),
}


class HubSplitError(ValueError):
    """A split (or config) that the recorded hub dataset does not have."""


def split_names(split: str) -> list[str]:
    """The split names in a split expression: "train[:10%]+test" -> ["train", "test"]."""
    return [part.split("[", 1)[0].strip() for part in split.split("+")]


def _check_names(what: str, split: str, splits: tuple[str, ...]) -> None:
    for name in split_names(split):
        if name not in splits:
            raise HubSplitError(
                f"{what} has no split {name!r} (asked for {split!r}); its splits: "
                f"{list(splits)}. Ask for one of them, or pass a local JSONL path"
            )


def check_hf(path: str, config: str | None, split: str) -> None:
    """Raises `HubSplitError` unless the recorded Hugging Face dataset `path` has `config`
    (None: its single unnamed one) and every split that `split` names."""
    configs = HF_SPLITS.get(path)
    if configs is None:
        return
    key = config or DEFAULT_CONFIG
    if key not in configs:
        raise HubSplitError(
            f"Hugging Face dataset {path!r} has no config {config!r}; its configs: "
            f"{sorted(configs)}"
        )
    shown = f"Hugging Face dataset {path!r}" + (f" (config {config!r})" if config else "")
    _check_names(shown, split, configs[key])


def check_tfds(builder: str, split: str) -> None:
    """Raises `HubSplitError` unless the recorded TFDS `builder` has every split `split` names."""
    splits = TFDS_SPLITS.get(builder)
    if splits is not None:
        _check_names(f"TFDS dataset {builder!r}", split, splits)


def check_source(name: str, split: str | None, hub: str = "hf") -> str:
    """The split `load_hf` / `load_tfds` ask `hub` for, for the `SOURCES` dataset `name` (the
    source's own when `split` is empty); raises `HubSplitError` when the hub lacks it.

    A source the hub does not hold is left to the loader, which names that.
    """
    spec = spec_of(name)
    if hub == "hf" and spec.hf is not None:
        path, config, default = spec.hf
        split = split or default
        check_hf(path, config, split)
    elif hub == "tfds" and spec.tfds is not None:
        builder, default = spec.tfds
        split = split or default
        check_tfds(builder, split)
    return split or ""
