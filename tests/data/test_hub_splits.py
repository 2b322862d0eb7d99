"""Every hub dataset, config and split the code can ask for is one the hub has, by the record in
`data.hub_splits` (no network): the sources' own splits, and the data settings of every config
file loaded as the entry points load it. A split the record lacks is named, with the ones that
exist, by the loaders, the settings and the evaluator."""

from __future__ import annotations

import dataclasses
import sys
import types
from pathlib import Path

import pytest
from absl import flags
from ml_collections import config_flags

from rlvr_jax.config_types import ConfigError, from_config
from rlvr_jax.data import datasets as ds
from rlvr_jax.data import hub_splits, sources
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.evals import evaluation
from rlvr_jax.program.runtime import config_file
from rlvr_jax.program.studies import ablation, pipeline

REPO = Path(__file__).resolve().parents[2]
CONFIG_FILES = sorted(
    p
    for p in [*REPO.glob("configs/*.py"), *REPO.glob("configs/pipelines/*.py")]
    if p.name != "__init__.py"
)
# Arguments beyond the default that switch a config to a hub dataset.
MORE_ARGS = [("ablation.py", "qwen")]

Ask = tuple[str, str, str | None, str]  # (hub, dataset id or builder, config, split)


def _recorded(ask: Ask) -> bool:
    """Whether the record holds the ask; read straight from the tables, not through the
    checks under test."""
    hub, dataset, config, split = ask
    if hub == "tfds":
        return split in hub_splits.TFDS_SPLITS.get(dataset, ())
    configs = hub_splits.HF_SPLITS.get(dataset, {})
    return split in configs.get(config or hub_splits.DEFAULT_CONFIG, ())


def _source_asks(name: str, split: str = "") -> list[Ask]:
    """What `load_hf` / `load_tfds` ask for `name` and `split` ("": the source's own)."""
    spec = sources.spec_of(name)
    asks: list[Ask] = []
    if spec.hf is not None:
        path, config, default = spec.hf
        asks.append(("hf", path, config, split or default))
    if spec.tfds is not None:
        builder, default = spec.tfds
        asks.append(("tfds", builder, None, split or default))
    return asks


def _load_config(path: Path, arg: str = ""):
    """The ConfigDict of `path[:arg]`, parsed by the same config flag as the entry points'."""
    values = flags.FlagValues()
    holder = config_flags.DEFINE_config_file("config", None, "config", flag_values=values)
    config_file.guard(holder, values)
    values(["prog", f"--config={path}{':' + arg if arg else ''}"])
    return values.config


def _training_configs(config) -> list:
    """The configs a run of `config` trains with: each pipeline stage, each ablation variant."""
    if "pipeline" in config:
        ps, base = pipeline.split_config(config)
        return [pipeline.stage_config(base, stage, base.model.source) for stage in ps.stages]
    if "ablation" in config:
        study, base = ablation.split_config(config)
        return [ablation.variant_config(base, name, 0, study) for name in study.variants]
    return [config]


def _config_asks() -> dict[str, list[Ask]]:
    """Per config file (and argument), the hub asks of its data settings."""
    out: dict[str, list[Ask]] = {}
    runs = [(p, "") for p in CONFIG_FILES] + [
        (REPO / "configs" / name, arg) for name, arg in MORE_ARGS
    ]
    for path, arg in runs:
        asks = []
        for c in _training_configs(_load_config(path, arg)):
            data = from_config(settings_lib.DataSettings, c.data, "data")
            if data.path or data.name not in sources.SOURCES:
                continue  # local JSONL or a generated task: no hub
            for split in (data.split, data.eval_split):
                if split or split is data.split:
                    asks += [a for a in _source_asks(data.name, split) if a[0] == "hf"]
        out[f"{path.relative_to(REPO)}{':' + arg if arg else ''}"] = asks
    return out


def test_every_source_split_is_recorded():
    asks = [a for name in sources.SOURCES for a in _source_asks(name)]
    assert {a[1] for a in asks if a[0] == "hf"} == set(hub_splits.HF_SPLITS)
    assert [a for a in asks if not _recorded(a)] == []
    # AIME 2024 and AMC have only "train" on the hub; MATH-500 only "test".
    assert _source_asks("aime")[0][3] == _source_asks("amc")[0][3] == "train"
    assert _source_asks("math500")[0][3] == "test"


def test_every_config_files_hub_splits_are_recorded():
    by_config = _config_asks()
    assert len(by_config) == len(CONFIG_FILES) + len(MORE_ARGS)
    assert {k: [a for a in v if not _recorded(a)] for k, v in by_config.items()} == {
        k: [] for k in by_config
    }
    # The GSM8K configs read the hub, both splits: the gathering sees them.
    assert by_config["configs/qwen_small.py"] == [
        ("hf", "openai/gsm8k", "main", "train"),
        ("hf", "openai/gsm8k", "main", "test"),
    ]
    assert by_config["configs/ablation.py:qwen"]
    assert by_config["configs/pipelines/qwen3_gsm8k.py"]


def test_an_unrecorded_split_is_caught(monkeypatch):
    """The check fails where it should: AIME's former hub split "test" is not on the hub."""
    old = dataclasses.replace(sources.SOURCES["aime"], hf=("HuggingFaceH4/aime_2024", None, "test"))
    monkeypatch.setitem(sources.SOURCES, "aime", old)
    asks = [a for name in sources.SOURCES for a in _source_asks(name)]
    assert [a for a in asks if not _recorded(a)] == [
        ("hf", "HuggingFaceH4/aime_2024", None, "test")
    ]
    with pytest.raises(ds.HubSplitError, match="'HuggingFaceH4/aime_2024' has no split 'test'"):
        hub_splits.check_source("aime", "")


def _fake_datasets(monkeypatch) -> list:
    calls = []

    def load_dataset(path, config, split):
        calls.append((path, config, split))
        return [{"problem": "p", "question": "q", "answer": "x\n#### 1"}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    return calls


def test_loaders_ask_the_recorded_split_and_name_a_bad_one(monkeypatch):
    calls = _fake_datasets(monkeypatch)
    for name in sources.SOURCES:
        ds.load_hf(name)
    assert [("hf", *c) for c in calls] == [_source_asks(n)[0] for n in sources.SOURCES]
    assert all(_recorded(("hf", *c)) for c in calls)

    calls.clear()
    with pytest.raises(ds.HubSplitError) as e:
        ds.load("aime", split="test")  # no path: the hub
    assert str(e.value) == (
        "Hugging Face dataset 'HuggingFaceH4/aime_2024' has no split 'test' (asked for 'test'); "
        "its splits: ['train']. Ask for one of them, or pass a local JSONL path"
    )
    with pytest.raises(ds.HubSplitError, match=r"no split 'validation'.*\['test'\]"):
        ds.load_hf("math500", "test+validation[:10]")
    with pytest.raises(ds.HubSplitError, match=r"no config 'socratik'.*\['main', 'socratic'\]"):
        ds.load_hf("gsm8k", hf_config="socratik")
    assert calls == []  # refused before the hub was asked
    ds.load_hf("gsm8k", "train[:10%]+test", hf_config="socratic")
    ds.load_hf("aime", "test", hf_path="someone/aime_copy")  # not recorded: not checked
    assert calls == [
        ("openai/gsm8k", "socratic", "train[:10%]+test"),
        ("someone/aime_copy", None, "test"),
    ]

    fake_tfds = types.SimpleNamespace(load=lambda *a, **k: None, as_numpy=lambda d: [])
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake_tfds)
    with pytest.raises(ds.HubSplitError, match=r"TFDS dataset 'gsm8k' has no split 'validation'"):
        ds.load("gsm8k", hub="tfds", split="validation")


def test_settings_name_a_split_the_hub_lacks():
    def settings(**data):
        config = settings_lib.default_config()
        config.data.update(data)
        return settings_lib.settings_from_config(config, check_devices=False)

    with pytest.raises(ConfigError) as e:
        settings(name="aime", split="test")
    assert "data.split='test' with data.name='aime'" in str(e.value)
    assert "has no split 'test'" in str(e.value) and "['train']" in str(e.value)
    with pytest.raises(ConfigError, match=r"data.eval_split='train'.*math500.*\['test'\]"):
        settings(name="math500", split="test", eval_split="train")
    # MATH-500 has no "train", the default split: a hub run must name its split.
    with pytest.raises(ConfigError, match="data.split='train' with data.name='math500'"):
        settings(name="math500")
    assert settings(name="aime").data.split == "train"
    assert settings(name="gsm8k", split="train", eval_split="test").data.eval_split == "test"
    # Local JSONL: the split names a file, nothing to check against the hub.
    assert settings(name="aime", split="test", path="/data/aime").data.split == "test"


def test_evaluator_checks_named_datasets_before_loading():
    evaluation.check_named(["aime", "amc", "math500", "gsm8k"], "", "")
    evaluation.check_named(["aime"], "../shared/data", "test")  # local files
    evaluation.check_named(["aime:/data/aime.jsonl", "arithmetic"], "", "test")
    with pytest.raises(ds.HubSplitError, match=r"'HuggingFaceH4/aime_2024' has no split 'test'"):
        evaluation.check_named(["math500", "aime"], "", "test")
