"""`mesh.seq="auto"`: the smallest seq split whose step compiles within the memory budget,
chosen before the state is placed; with `rl.num_microbatches="auto"`, the pair."""

import dataclasses
import json

import jax
import pytest

from rlvr_jax.config_types import ConfigError
from rlvr_jax.data import templates
from rlvr_jax.envs.single_turn import build_task
from rlvr_jax.model import sharding
from rlvr_jax.program import settings as settings_lib
from rlvr_jax.program.parts import build
from rlvr_jax.program.stages import memory_fit, rl_stage
from rlvr_jax.rl import memory, sharding_plan
from rlvr_jax.rl import state as state_lib
from tests.test_bad_settings import _tiny

GiB = 1 << 30
# 4 rows on fsdp 4 x tensor 2: seq takes 1 or 2 of fsdp's 4 devices; 10 answer tokens refuse 4.
SMALL = dict(
    train__batch_prompts=1,
    rl__group_size=4,
    mesh__tensor=2,
    data__buckets=(16,),
    model__attention_block=16,
    **{"rl.sampler__max_new_tokens": 10},
)


def _config(**overrides):
    return _tiny(**{**SMALL, **overrides})


def _settings(**overrides) -> settings_lib.Settings:
    return settings_lib.settings_from_config(_config(**overrides))


@dataclasses.dataclass
class Step:
    """What `rl_stage.run` has before it places the state: the inputs of `resolve_seq`."""

    s: settings_lib.Settings
    model_cfg: object
    task: object
    state: object
    batch: object

    def resolve(self, log=None, **rl):
        s = dataclasses.replace(self.s, rl=dataclasses.replace(self.s.rl, **rl))
        fused = rl_stage.fused_step(s, self.task)
        log = log if log is not None else (lambda _: None)
        return memory_fit.resolve_seq(
            s, self.model_cfg, self.task, self.state, self.batch, fused, log
        )


def _step(s: settings_lib.Settings) -> Step:
    tok, params, model_cfg, s = build.policy_and_settings(s)
    train, _, _ = build.load_examples(s.data)
    template = templates.get_template(s.data.template)
    enc = templates.encode_prompts(train, template, tok, s.data.buckets)
    optimizer = state_lib.make_optimizer(s.optim)
    state = state_lib.init_train_state(
        params, optimizer, jax.random.key(0), use_reference=s.rl.loss.kl_beta > 0
    )
    task = build_task(s.reward, tok, model_cfg.vocab_size, train, s.data.template)
    B, G = s.train.batch_prompts, s.rl.group_size
    batch = rl_stage.make_batch(enc.ids[:B], enc.examples[:B], G, s.data.buckets, tok.pad_id, task)
    return Step(s, model_cfg, task, state, batch)


@pytest.fixture(scope="module")
def step() -> Step:
    return _step(_settings(**{"mesh__seq": "auto", "rl__memory_budget_gib": 1.0}))


@pytest.fixture(scope="module")
def measured(step) -> dict[tuple[int, int], int]:
    """Per-device bytes of the fused step at (seq, microbatches), compiled as the search does."""
    out = {}
    rows = step.batch.prompt_NP.shape[0]
    for mesh in memory_fit.seq_candidates(step.s, jax.device_count()):
        plan = sharding_plan.plan_step(step.state, step.model_cfg, sharding.make_mesh(mesh), rows)
        state = memory.abstract_like(step.state, plan.state)
        batch = memory.abstract_like(step.batch, plan.rows)
        measure = memory_fit.step_memory(
            step.s, step.model_cfg, step.task, state, batch, plan, fused=True
        )
        for count in (1, 2, 4):
            rl = dataclasses.replace(step.s.rl, num_microbatches=count)
            out[mesh.seq, count] = measure(rl).total
    return out


def _between(low: int, high: int) -> float:
    assert low < high
    return (low + high) / 2 / GiB


def test_candidates_are_powers_of_two_of_fsdp_that_divide_every_length(step):
    meshes = memory_fit.seq_candidates(step.s, 8)
    assert [(m.fsdp, m.seq, m.tensor) for m in meshes] == [(4, 1, 2), (2, 2, 2)]
    longer = _settings(**{"mesh__seq": "auto", "rl.sampler__max_new_tokens": 12})
    assert [m.seq for m in memory_fit.seq_candidates(longer, 8)] == [1, 2, 4]


def test_auto_takes_the_smallest_split_that_fits_and_the_run_records_auto(measured, tmp_path):
    # Between seq 2's and seq 1's memory at 4 microbatches: seq 1 does not fit, seq 2 does.
    budget = _between(measured[2, 4], measured[1, 4])
    config = _config(
        **{"mesh__seq": "auto", "rl__memory_budget_gib": budget, "rl__num_microbatches": 4},
        train__steps=1,
        eval__in_stage=False,
        train__use_tensorboard=False,
    )
    lines = []
    result = rl_stage.run(settings_lib.settings_from_config(config), tmp_path, log=lines.append)
    assert result["steps"] == 1
    (chosen,) = [line for line in lines if line.startswith('mesh.seq="auto"')]
    assert chosen.startswith('mesh.seq="auto" -> 2 (per-device peak ')
    assert memory.format_bytes(measured[2, 4]) in chosen
    assert f"budget; compiled seq 1: {memory.format_bytes(measured[1, 4])}, 2: " in chosen
    # As `rl.num_microbatches="auto"`: the run records the setting, each start resolves it.
    saved = json.loads((tmp_path / settings_lib.SETTINGS_FILE).read_text())
    assert saved["mesh"]["seq"] == "auto" and saved["mesh"]["fsdp"] == -1


def test_with_auto_microbatches_each_split_gets_its_own_search(step, measured):
    budget = _between(measured[2, 4], min(measured[1, c] for c in (1, 2, 4)))
    lines = []
    s = step.resolve(lines.append, num_microbatches="auto", memory_budget_gib=budget)
    # No count fits seq 1; seq 2 keeps its fewest count that fits.
    count = min(c for c in (1, 2, 4) if measured[2, c] <= budget * GiB)
    assert (s.mesh.seq, s.mesh.fsdp, s.rl.num_microbatches) == (2, 2, count)
    (line,) = lines
    assert line.startswith(f'mesh.seq="auto" -> 2, rl.num_microbatches="auto" -> {count} (')


def test_a_budget_below_every_split_is_refused_naming_the_least(step, measured):
    with pytest.raises(ConfigError) as e:
        step.resolve(num_microbatches=4, memory_budget_gib=1e-6)
    least = min(measured[1, 4], measured[2, 4])
    assert 'mesh.seq="auto": no seq split in [1, 2] fits 1.0 KiB per device' in str(e.value)
    assert f"needs {memory.format_bytes(least)}" in str(e.value)


def test_a_cpu_needs_an_explicit_budget(step):
    with pytest.raises(ConfigError, match=r'mesh.seq="auto" needs a memory budget.*memory_budget'):
        step.resolve(memory_budget_gib=0.0)


@pytest.mark.parametrize(
    "value, message",
    [
        ("autoo", "mesh.seq='autoo'"),
        (0, 'mesh.seq=0 must be an integer >= 1 or "auto"'),
        (3, "rl.sampler.max_new_tokens=10 is not a multiple of mesh.seq=3"),
    ],
)
def test_a_bad_value_is_refused_naming_it(value, message):
    with pytest.raises(ConfigError, match=message):
        _settings(mesh__seq=value)
    # Lengths that 3 divides: the devices do not.
    thirds = {"data__buckets": (12,), "model__attention_block": 12}
    with pytest.raises(ConfigError, match="seq=3: 8 devices are not a multiple of 6"):
        _settings(mesh__seq=3, **thirds, **{"rl.sampler__max_new_tokens": 12})


def test_auto_is_no_mesh_until_resolved():
    cfg = sharding.MeshConfig(seq="auto")
    with pytest.raises(ValueError, match='mesh.seq="auto" is chosen from compiled memory'):
        sharding.make_mesh(cfg)


def test_auto_with_a_learned_reward_is_refused():
    with pytest.raises(ConfigError, match=r'mesh.seq="auto" with reward.rm_path'):
        _settings(mesh__seq="auto", reward__rm_path="/tmp/rm")


def test_splits_are_tried_smallest_first_and_larger_ones_never_compiled():
    seen = []

    def search(seq):
        seen.append(seq)
        total = 1000 // seq
        m = memory.ProgramMemory(arguments=0, outputs=0, aliased=0, temps=total)
        return memory.MicrobatchChoice(1, 300, ((1, m),))

    assert memory.smallest_seq([1, 2, 4, 8], search, budget=300).seq == 4
    assert seen == [1, 2, 4]


def test_a_numbered_split_keeps_its_own_fewest_microbatches(step, measured):
    budget = _between(measured[1, 2], measured[1, 1])
    s = dataclasses.replace(step.s, mesh=dataclasses.replace(step.s.mesh, seq=1))
    s = dataclasses.replace(
        s, rl=dataclasses.replace(s.rl, num_microbatches="auto", memory_budget_gib=budget)
    )
    rows = step.batch.prompt_NP.shape[0]
    plan = sharding_plan.plan_step(step.state, step.model_cfg, sharding.make_mesh(s.mesh), rows)
    state = memory.abstract_like(step.state, plan.state)
    batch = memory.abstract_like(step.batch, plan.rows)
    assert memory_fit.resolve_seq(s, step.model_cfg, step.task, state, batch, True) is s
    lines = []
    resolved = memory_fit.resolve_microbatches(
        s, step.model_cfg, step.task, state, batch, plan, True, lines.append
    )
    assert resolved.rl.num_microbatches == 2 and resolved.mesh == s.mesh
    assert lines[0].startswith('rl.num_microbatches="auto" -> 2 (')
