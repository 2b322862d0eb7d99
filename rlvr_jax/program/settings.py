"""The run's settings: one frozen dataclass per config section, defaults, checks, load and save.

`default_config()` is every field with its default as a ConfigDict; config files start from it
(`configs/*.py`) and the command line overrides any field (`--config.rl.group_size=16`).
`settings_from_config` builds the typed `Settings` once, naming every unknown or bad field, before
anything compiles; library code below this layer only ever sees the typed sections.
`save_settings` / `load_settings` keep them in a run's workdir (`settings.json`), so that eval and
export rebuild the same model and data; which of them a resume may change is
`runtime/resume_settings.py`'s.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal

import jax
import ml_collections

from rlvr_jax.config_types import ConfigError, NotFoundError, from_config
from rlvr_jax.data import curriculum as curriculum_lib
from rlvr_jax.data import hub_splits, sources
from rlvr_jax.data import modes as modes_lib
from rlvr_jax.model import lora as lora_lib
from rlvr_jax.model import sharding
from rlvr_jax.rewards.config import RewardSettings
from rlvr_jax.rl import state as state_lib
from rlvr_jax.rl import train_step as ts


@dataclasses.dataclass(frozen=True)
class LoraSettings:
    """LoRA adapters on the policy (`model/lora.py`); rank 0 trains the full model.

    Attributes:
      rank: the adapters' rank r; 0 turns LoRA off.
      alpha: the adapters' scale is alpha / rank.
      targets: the adapted projections, out of q, k, v, o, gate, up, down.
      base: the frozen base's storage: "model" (`model.param_dtype`) or "int8" (one scale per
        output channel, dequantised inside each matmul: QLoRA-style).
    """

    rank: int = 0
    alpha: float = 16.0
    targets: tuple[str, ...] = lora_lib.TARGETS
    base: Literal["model", "int8"] = "model"

    def __post_init__(self):
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise ValueError(f"model.lora.rank={self.rank!r} must be an integer >= 0 (0: off)")
        if self.enabled:
            self.config()  # names a bad alpha or target
        elif self.base != "model":
            raise ValueError(f"model.lora.base={self.base!r} needs LoRA on (model.lora.rank > 0)")

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    def config(self) -> lora_lib.LoraConfig:
        """The adapters' `LoraConfig` (only with `enabled`)."""
        try:
            return lora_lib.LoraConfig(rank=self.rank, alpha=self.alpha, targets=self.targets)
        except ValueError as e:
            raise ValueError(str(e).replace("LoraConfig.", "model.lora.")) from None


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """Attributes:
    source: weights (see `model.loading`): "embedded", "random:PRESET", a directory, a .gguf
      file or a hub id.
    tokenizer: "" for the source's own, or "chars:<alphabet>" (from-scratch models).
    dtype, param_dtype, remat: `ModelConfig` overrides.
    attention, attention_block: the training forwards' attention (`ModelConfig.attention`):
      "auto", "xla_blockwise", "dense", "cudnn" or "pallas", and the blockwise path's block.
    moe_dispatch: how a mixture-of-experts model's tokens reach their experts
      (`ModelConfig.moe_dispatch`): "auto", "ragged", "blocked" or "dense"; no effect on a
      dense model.
    lora: LoRA adapters (`LoraSettings`); the RL and SFT stages then train the adapters only.
    """

    source: str = "embedded"
    tokenizer: str = ""
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat: bool = False
    attention: Literal["auto", "xla_blockwise", "dense", "cudnn", "pallas"] = "auto"
    attention_block: int = 512
    moe_dispatch: Literal["auto", "ragged", "blocked", "dense"] = "auto"
    lora: LoraSettings = LoraSettings()

    def __post_init__(self):
        if self.attention_block < 1:
            raise ValueError(f"model.attention_block={self.attention_block} must be >= 1")


@dataclasses.dataclass(frozen=True)
class DataSettings:
    """Attributes:
    name: a `datasets.DATASET_NAMES` entry ("arithmetic", "gsm8k", ...), or reasoning-gym tasks,
      "reasoning_gym:<task>" or a mix "reasoning_gym:<task>,<task>" (docs/reasoning_gym.md).
    path: local JSONL file or directory (empty: the hub, or generated tasks).
    split: training split; eval examples are held out from it (`num_eval`), or read from
      `eval_split` when set. From the hub (no `path`) it is one the dataset has
      (`data.hub_splits`: MATH-500 has only "test", AIME 2024 and AMC only "train"; "" is the
      dataset's own).
    eval_split: a separate split for evaluation ("" holds out `num_eval` from `split`).
    num_train: training prompts to keep (0 keeps all; generated tasks need it).
    num_eval: held-out prompts for evaluation.
    level: difficulty of generated tasks.
    levels: several difficulty levels of a generated task, in equal shares (an ordered
      curriculum moves between them); empty: `level` alone.
    weights: a reasoning-gym mix: each task's share of the examples (empty: equal shares).
    task_config: reasoning-gym: JSON {task: {config field: value}}, applied over the level's
      settings (e.g. '{"leg_counting": {"max_animals": 3}}').
    template: a `templates` name or "text:<format>".
    buckets: allowed prompt lengths (tokens).
    sampler: "epoch" (shuffled epochs) or "curriculum" (weights 1 - success rate).
    dynamic_sampling: DAPO's dynamic sampling (Yu et al. 2025): groups whose rewards are all
      equal carry no group-relative signal, so they are dropped and more prompts are drawn,
      rolled out and verified (a whole batch per round, shapes stay static) until the batch is
      full of groups with reward variance, or `dynamic_max_rounds` rounds have run; the batch is
      then topped up with dropped groups. Every attempted group updates the prompt sampler.
    dynamic_max_rounds: the most rollout rounds per step (the first included).
    modes: ask each prompt in thinking or non-thinking mode, as Qwen3's general RL over both
      (`data.modes`): "" (prompts as they are), "flag" ("/think" or "/no_think" after the
      question) or "enable_thinking" (the chat template's variable, per prompt; a chat
      template). The mode is drawn per example from its id; `reward.format="mode"` rewards
      following it.
    think_share: the share of prompts asked in thinking mode.
    seed: data order and generation seed.
    """

    name: str = "arithmetic"
    path: str = ""
    split: str = "train"
    eval_split: str = ""
    num_train: int = 0
    num_eval: int = 64
    level: int = 1
    levels: tuple[int, ...] = ()
    weights: tuple[float, ...] = ()
    task_config: str = ""
    template: str = "plain"
    buckets: tuple[int, ...] = (64,)
    sampler: Literal["epoch", "curriculum"] = "epoch"
    dynamic_sampling: bool = False
    dynamic_max_rounds: int = 3
    exclude_multiple_choice: bool = False
    exclude_true_false: bool = False
    modes: Literal["", "flag", "enable_thinking"] = ""
    think_share: float = 0.5
    seed: int = 0

    def __post_init__(self):
        if self.modes not in ("", *modes_lib.SWITCHES):
            raise ValueError(
                f"data.modes={self.modes!r}; expected '' or one of {modes_lib.SWITCHES}"
            )
        if not 0.0 <= self.think_share <= 1.0:
            raise ValueError(f"data.think_share={self.think_share} must be in [0, 1]")
        if self.dynamic_max_rounds < 1:
            raise ValueError(f"data.dynamic_max_rounds={self.dynamic_max_rounds} must be >= 1")
        if self.num_train < 0 or self.num_eval < 0:
            raise ValueError(
                f"num_train={self.num_train} and num_eval={self.num_eval} must be >= 0"
            )
        if not self.buckets or min(self.buckets) < 1:
            raise ValueError(f"buckets={self.buckets} must be positive prompt lengths")


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """Attributes:
    steps: RL steps.
    batch_prompts: B prompts per step (N = B x group_size rows).
    seed: model init (random sources), sampling and update seed.
    log_every, eval_every, checkpoint_every: intervals in steps (0 disables periodic ones;
      evaluation also runs before the first and after the last step, a checkpoint at the end).
    keep_checkpoints: how many to keep; 2, so that a damaged newest one falls back to the one
      before (each holds the f32 weights and Adam's two moments: 1.4 GiB for the demo's 135M).
    stage: "rl" (`program.stages.rl_stage`), "sft" (supervised fine-tuning on demonstrations,
      `program.stages.sft_stage`) or "rm" (a reward model on preference pairs,
      `program.stages.rm_stage`); `program.stages.dispatch.run` dispatches on it. Every stage counts
      `steps` in optimizer updates.
    compile_ahead: compile the training step on a thread while the evaluation before training
      runs (`run.Stage.precompile`: the fused RL step, or the host path's rollout and update
      each on its own thread), instead of at its first call.
    """

    stage: Literal["rl", "sft", "rm"] = "rl"
    steps: int = 100
    batch_prompts: int = 8
    seed: int = 0
    log_every: int = 1
    eval_every: int = 0
    checkpoint_every: int = 0
    keep_checkpoints: int = 2
    use_tensorboard: bool = True
    compile_ahead: bool = True

    def __post_init__(self):
        if self.steps < 0:
            raise ValueError(f"steps={self.steps} must be >= 0")
        if self.batch_prompts < 1:
            raise ValueError(f"batch_prompts={self.batch_prompts} must be >= 1")
        if self.log_every < 1:
            raise ValueError(f"log_every={self.log_every} must be >= 1")
        for name in ("eval_every", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0 (0 disables)")
        if self.keep_checkpoints < 1:
            raise ValueError(
                f"keep_checkpoints={self.keep_checkpoints} must be >= 1: a run resumes from its "
                "last checkpoint"
            )


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """Attributes:
    batch_prompts: prompts per evaluation call (the last batch is padded, shapes stay fixed).
    in_stage: the RL stage's own held-out evaluation, before and after training (and every
      `train.eval_every` steps). A pipeline evaluates every stage's exported policy itself
      (`program.studies.pipeline`), so its configs turn this off rather than evaluate the same
      weights twice.
    """

    batch_prompts: int = 32
    in_stage: bool = True

    def __post_init__(self):
        if self.batch_prompts < 1:
            raise ValueError(f"batch_prompts={self.batch_prompts} must be >= 1")


@dataclasses.dataclass(frozen=True)
class SFTSettings:
    """Supervised fine-tuning (`train.stage="sft"`, see `rlvr_jax.sft`).

    Attributes:
      path: demonstrations JSONL, one {"prompt", "response"} (or "question"/"solution", ...)
        object a line; empty builds them from the training examples of `data`, the response
        being `response_format` with the gold answer.
      prompt_field, response_field: field names to read instead of the known pairs.
      response_format: the response of a demonstration built from `data`; "{answer}" is
        replaced by the gold answer and "{thought}" by the example's written reasoning
        (`sft.traces.thought_for`: generated arithmetic worked one place value at a time).
      batch_size: sequences per optimizer update.
      epochs: passes over the demonstrations; 0 runs `train.steps` updates instead.
      buckets: padded sequence lengths (prompt + response + end token); longer demonstrations
        are counted and skipped.
      eval: greedy held-out accuracy of `data` with `reward.verifier`, before and after.
      export: write the policy as a Hugging Face directory `<workdir>/hf` at the end; the RL
        stage starts from it with `model.source=<workdir>/hf`.
    """

    path: str = ""
    prompt_field: str = ""
    response_field: str = ""
    response_format: str = "{answer}"
    batch_size: int = 16
    epochs: int = 0
    buckets: tuple[int, ...] = (256,)
    eval: bool = True
    export: bool = True

    def __post_init__(self):
        if self.batch_size < 1 or self.epochs < 0:
            raise ValueError(
                f"batch_size={self.batch_size} must be >= 1, epochs={self.epochs} >= 0"
            )
        if not self.buckets or min(self.buckets) < 2:
            raise ValueError(f"buckets={self.buckets} must be lengths of at least 2 tokens")
        if bool(self.prompt_field) != bool(self.response_field):
            raise ValueError("prompt_field and response_field are set together or not at all")


@dataclasses.dataclass(frozen=True)
class RMSettings:
    """Reward-model training (`train.stage="rm"`, `rewards.reward_model`, docs/reward_models.md).

    Attributes:
      path: preference pairs, a JSONL file of {"prompt", "chosen", "rejected"} objects; the
        prompt goes through `data.template`, as the policy's prompts do. Empty: pairs from the
        examples of `data`, the gold answer chosen over another example's
        (`data.preferences.pairs_from_examples`).
      num_eval: pairs held out (a seeded draw) for the pairwise accuracy before and after.
      batch_size: pairs per optimizer update (2 x batch_size sequences).
      epochs: passes over the training pairs; 0 runs `train.steps` updates instead.
      buckets: padded sequence lengths (prompt + response + end token); pairs with a longer
        side are counted and skipped.
    """

    path: str = ""
    num_eval: int = 64
    batch_size: int = 16
    epochs: int = 0
    buckets: tuple[int, ...] = (256,)

    def __post_init__(self):
        if self.batch_size < 1 or self.epochs < 0 or self.num_eval < 0:
            raise ValueError(
                f"rm.batch_size={self.batch_size} must be >= 1, epochs={self.epochs} and "
                f"num_eval={self.num_eval} >= 0"
            )
        if not self.buckets or min(self.buckets) < 2:
            raise ValueError(f"rm.buckets={self.buckets} must be lengths of at least 2 tokens")


@dataclasses.dataclass(frozen=True)
class Settings:
    model: ModelSettings
    data: DataSettings
    reward: RewardSettings
    rl: ts.RLConfig
    optim: state_lib.OptimConfig
    train: TrainSettings
    eval: EvalSettings
    curriculum: curriculum_lib.CurriculumConfig
    sft: SFTSettings = SFTSettings()
    mesh: sharding.MeshConfig = sharding.MeshConfig()
    rm: RMSettings = RMSettings()


_SECTIONS = {
    "model": ModelSettings,
    "data": DataSettings,
    "reward": RewardSettings,
    "rl": ts.RLConfig,
    "optim": state_lib.OptimConfig,
    "train": TrainSettings,
    "eval": EvalSettings,
    "curriculum": curriculum_lib.CurriculumConfig,
    "sft": SFTSettings,
    "mesh": sharding.MeshConfig,
    "rm": RMSettings,
}
# Values for fields without a default, so that every field exists and can be overridden.
_REQUIRED = {"group_size": 8, "max_new_tokens": 256}


def _default_dict(cls: type) -> ml_collections.ConfigDict:
    hints = typing.get_type_hints(cls)
    out = ml_collections.ConfigDict()
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        hint = hints[f.name]
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        elif dataclasses.is_dataclass(hint):
            value = None
        else:
            value = _REQUIRED[f.name]
        if dataclasses.is_dataclass(hint):
            # The class's own field defaults, not a default instance's: `__post_init__` may
            # resolve fields (e.g. std_scaling from the estimator) that must stay open.
            out[f.name] = _default_dict(hint)
        elif value is None:
            # A typed placeholder keeps `--config.x.y=v` overrides possible for optional fields.
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            inner = typing.get_args(args[0]) if args else ()
            kind = str if typing.get_origin(args[0]) is typing.Literal else args[0]
            out[f.name] = ml_collections.config_dict.placeholder(kind if not inner else str)
        elif typing.get_origin(hint) in (typing.Union, types.UnionType):
            # A number or a word (`rl.num_microbatches`: 4 or "auto"): the field takes either.
            out[f.name] = ml_collections.FieldReference(value, field_type=object)
        else:
            out[f.name] = value
    return out


def default_config() -> ml_collections.ConfigDict:
    """Every setting with its default; config files start from it and change what they need,
    so that any field can be overridden from the command line (`--config.rl.group_size=16`)."""
    return ml_collections.ConfigDict({k: _default_dict(v) for k, v in _SECTIONS.items()})


def settings_from_config(config: Any, check_devices: bool = True) -> Settings:
    """Typed settings from a ConfigDict; every unknown or bad field is named.

    `rl.sampler.eos_ids` and `pad_id` are left for `run` to fill from the tokenizer when the
    config does not set them. `check_devices=False` skips the mesh checks against this
    process's devices (a finished run's settings, read back to export or evaluate it elsewhere).
    """
    config = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    sections = _SECTIONS
    unknown = sorted(set(config) - set(sections))
    if unknown:
        raise ConfigError(f"unknown config section {unknown[0]!r}; known: {sorted(sections)}")
    if "rl" not in config:
        raise ConfigError("missing config section 'rl'")
    built = {k: from_config(cls, config.get(k, {}), k) for k, cls in sections.items()}
    s = Settings(**built)
    if max(s.data.buckets) + s.rl.sampler.max_new_tokens > 1 << 20:
        raise ConfigError(f"data.buckets={s.data.buckets} too long")
    s.rl.check_rows(s.train.batch_prompts * s.rl.group_size)
    try:
        s.rl.slots_for(s.train.batch_prompts * s.rl.group_size)  # more decode slots than rows
    except ValueError as e:
        raise ConfigError(str(e)) from e
    if s.rl.partial_budget and s.data.dynamic_sampling:
        raise ConfigError(
            f"rl.partial_budget={s.rl.partial_budget} with data.dynamic_sampling=True: both run "
            "rounds of rollouts per step; choose one"
        )
    if s.train.eval_every and not s.eval.in_stage:
        raise ConfigError(
            f"train.eval_every={s.train.eval_every} with eval.in_stage=False: the periodic "
            "evaluation is the stage's own; set train.eval_every=0 or eval.in_stage=True"
        )
    if s.reward.format == "mode" and not s.data.modes:
        raise ConfigError(
            "reward.format='mode' with data.modes='': the format rewards following the mode each "
            "prompt is asked in; set data.modes to 'flag' or 'enable_thinking'"
        )
    if s.model.lora.enabled and s.rl.critic.kind == "model":
        raise ConfigError(
            "rl.critic.kind='model' with model.lora.rank="
            f"{s.model.lora.rank}: a separate critic is a full decoder trained in full; with "
            "LoRA use rl.critic.kind='head'"
        )
    check_hub_splits(s.data)
    check_seq_split(s)
    if s.train.stage == "rl" and check_devices:
        check_mesh(s, jax.device_count())
    return s


def check_hub_splits(data: DataSettings) -> None:
    """Raises ConfigError when `data` reads a hub dataset (no `path`) with a `split` or
    `eval_split` that the dataset does not have (`data.hub_splits`): before any download, and
    naming the setting, the dataset and the splits it has."""
    if data.path or data.name not in sources.SOURCES:
        return
    asked = [("split", data.split)] + ([("eval_split", data.eval_split)] if data.eval_split else [])
    for field, split in asked:
        try:
            hub_splits.check_source(data.name, split)
        except hub_splits.HubSplitError as e:
            raise ConfigError(f"data.{field}={split!r} with data.name={data.name!r}: {e}") from None


def check_mesh(s: Settings, num_devices: int) -> None:
    """Raises ConfigError unless the mesh fits the devices and the rows split over its batch
    axes (otherwise every device would hold every row)."""
    # Every "auto" seq split takes its devices from fsdp: the row axes' product is seq 1's.
    mesh = dataclasses.replace(s.mesh, seq=1) if s.mesh.seq == "auto" else s.mesh
    try:
        sizes = mesh.sizes(num_devices)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    rows = s.train.batch_prompts * s.rl.group_size
    names = ["data", "fsdp"] + [a for a in ("seq", "expert") if sizes[a] > 1]
    if rows % math.prod(sizes[a] for a in names):
        across = f"{' x '.join(names)} = {' x '.join(str(sizes[a]) for a in names)}"
        raise ConfigError(
            f"train.batch_prompts={s.train.batch_prompts} x rl.group_size={s.rl.group_size} = "
            f"{rows} rows do not split over the mesh's {across} devices"
        )


def check_seq_split(s: Settings) -> None:
    """Raises ConfigError unless `mesh.seq` divides every length the update splits over it:
    the prompt buckets and `rl.sampler.max_new_tokens` (so the rows, prompt + answer, and the
    answers alone), the attention block and `rl.pack_length` (the packed rows' lengths).
    A forward whose length the axis does not divide would split its rows instead, silently
    losing the memory the axis is for. "auto" is checked here only against learned reward
    parts: their models are placed on the mesh before the step is measured; the split it
    chooses divides every length (`memory_fit.seq_candidates`)."""
    seq = s.mesh.seq
    if seq == "auto":
        learned = [f"reward.{k}" for k in ("rm_path", "judge_model") if getattr(s.reward, k)]
        if learned:
            raise ConfigError(
                f'mesh.seq="auto" with {learned[0]}: the learned reward\'s model is placed on '
                "the mesh before the step's memory is measured; give mesh.seq a number"
            )
        return
    if seq == 1:
        return
    lengths = {
        "rl.sampler.max_new_tokens": s.rl.sampler.max_new_tokens,
        "model.attention_block": s.model.attention_block,
        **{f"data.buckets[{i}]": b for i, b in enumerate(s.data.buckets)},
    }
    if s.rl.pack_length:
        lengths["rl.pack_length"] = s.rl.pack_length
    for name, length in lengths.items():
        if length % seq:
            raise ConfigError(
                f"{name}={length} is not a multiple of mesh.seq={seq}: the update splits each "
                f"row's tokens over mesh.seq; make it a multiple of {seq} or lower mesh.seq"
            )


SETTINGS_FILE = "settings.json"


def _plain_settings(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {
            f.name: _plain_settings(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init
        }
    if isinstance(obj, tuple | list):
        return [_plain_settings(x) for x in obj]
    return obj


def save_settings(settings: Settings, workdir: str | Path) -> Path:
    """Writes the run's settings as JSON (`workdir/settings.json`), so that tools reading the
    workdir later (`rlvr_jax.export`, `rlvr_jax.eval`) rebuild the same model and data."""
    path = Path(workdir) / SETTINGS_FILE
    if jax.process_index() == 0:
        path.write_text(json.dumps(_plain_settings(settings), indent=1) + "\n")
    return path


def load_settings(workdir: str | Path) -> Settings:
    """The settings `save_settings` wrote into `workdir`.

    Raises:
      NotFoundError: when the workdir holds no settings file.
    """
    path = Path(workdir) / SETTINGS_FILE
    if not path.is_file():
        raise NotFoundError(f"{path} does not exist: {str(workdir)!r} is not a run's workdir")
    return settings_from_config(json.loads(path.read_text()), check_devices=False)


def plain_settings(settings: Settings) -> dict[str, Any]:
    """The settings as a JSON-ready dict (the layout of settings.json)."""
    return _plain_settings(settings)
