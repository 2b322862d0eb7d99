"""Problem sources from the hubs: Hugging Face `datasets` and TensorFlow Datasets.

Host code. Each hub package is imported inside its loader, only there, so that neither is needed
to load local JSONL; a missing package, no network or a failed download is a `DataSourceError`
whose message says to pass a local JSONL path. The rows go through the same parsing and counting
as local JSONL (`sources.example_from_row`, `load_report.collect`). A split or config that the
recorded dataset lacks (`hub_splits`) is a `HubSplitError` before anything is imported.
"""

from __future__ import annotations

from rlvr_jax.config_types import UserError
from rlvr_jax.data.example import Example
from rlvr_jax.data.hub_splits import check_hf, check_tfds
from rlvr_jax.data.load_report import LoadReport, collect
from rlvr_jax.data.sources import example_from_row, spec_of


class DataSourceError(UserError, RuntimeError):
    """A hub source (Hugging Face `datasets`, TFDS) could not be imported or downloaded."""


def _unavailable(what: str, name: str, cause: BaseException) -> DataSourceError:
    # The first line of the cause: a library's own advice after it is for its own API.
    reason = (str(cause).strip().splitlines() or [""])[0]
    return DataSourceError(
        f"could not load {name!r} from {what} ({type(cause).__name__}: {reason}); pass a local "
        f"JSONL path instead (data.path=, or --data_path=, e.g. ../shared/data/{name}/test.jsonl, "
        "see ../shared/data/README.md)"
    )


def load_hf(
    name: str,
    split: str | None = None,
    *,
    hf_path: str | None = None,
    hf_config: str | None = None,
    exclude_multiple_choice: bool = False,
    exclude_true_false: bool = False,
) -> tuple[list[Example], LoadReport]:
    """Loads a dataset from the Hugging Face hub with `datasets` (imported here, only here).

    Args:
      name: one of `SOURCES`.
      split: the hub split; defaults to the source's (MATH-500 "test", AIME 2024 "train", ...).
      hf_path: overrides the hub dataset id.
      hf_config: overrides the hub config name.
      exclude_multiple_choice: see `load_jsonl`.
      exclude_true_false: see `load_jsonl`.

    Raises:
      HubSplitError: when the recorded dataset has no such config or split (`hub_splits`).
      DataSourceError: when `datasets` is not installed or the download fails; the message says
        to pass a local JSONL path.
    """
    spec = spec_of(name)
    default_path, default_config, default_split = spec.hf or (None, None, "train")
    path, config = hf_path or default_path, hf_config or default_config
    split = split or default_split
    if path is None:
        raise DataSourceError(f"{name!r} has no Hugging Face dataset id; pass hf_path=")
    check_hf(path, config, split)
    try:
        import datasets
    except ImportError as e:
        raise _unavailable("Hugging Face (`datasets` is not installed)", name, e) from e
    try:
        ds = datasets.load_dataset(path, config, split=split)
        rows = list(ds)
    except Exception as e:  # network, auth and format errors all mean: use local data
        raise _unavailable(f"Hugging Face {path!r} split {split!r}", name, e) from e
    fields = (spec.question_field, spec.answer_field)
    return collect(
        enumerate(rows, start=1),
        lambda i, row: example_from_row(row, spec, split, i - 1, fields),
        f"hf:{path}[{split}]",
        exclude_multiple_choice,
        exclude_true_false,
    )


def load_tfds(
    name: str,
    split: str | None = None,
    *,
    tfds_name: str | None = None,
    data_dir: str | None = None,
    exclude_multiple_choice: bool = False,
    exclude_true_false: bool = False,
) -> tuple[list[Example], LoadReport]:
    """Loads a dataset from TensorFlow Datasets (imported here, only here).

    Args:
      name: one of `SOURCES`; only those with a TFDS builder (GSM8K) work without `tfds_name`.
      split: the TFDS split; defaults to the source's.
      tfds_name: overrides the builder name.
      data_dir: TFDS data directory.
      exclude_multiple_choice: see `load_jsonl`.
      exclude_true_false: see `load_jsonl`.

    Raises:
      HubSplitError: when the recorded builder has no such split (`hub_splits`).
      DataSourceError: when `tensorflow_datasets` is not installed, the source has no builder, or
        the download fails; the message says to pass a local JSONL path.
    """
    spec = spec_of(name)
    builder, default_split = spec.tfds or (tfds_name, "test")
    builder, split = tfds_name or builder, split or default_split
    if builder is None:
        raise _unavailable("TFDS", name, LookupError(f"TFDS has no builder for {name!r}"))
    check_tfds(builder, split)
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise _unavailable("TFDS (`tensorflow_datasets` is not installed)", name, e) from e
    try:
        ds = tfds.load(builder, split=split, data_dir=data_dir)
        rows = [
            {k: v.decode("utf-8") if isinstance(v, bytes) else v for k, v in row.items()}
            for row in tfds.as_numpy(ds)
        ]
    except Exception as e:  # network and preparation errors all mean: use local data
        raise _unavailable(f"TFDS {builder!r} split {split!r}", name, e) from e
    fields = (spec.question_field, spec.answer_field)
    return collect(
        enumerate(rows, start=1),
        lambda i, row: example_from_row(row, spec, split, i - 1, fields),
        f"tfds:{builder}[{split}]",
        exclude_multiple_choice,
        exclude_true_false,
    )
