"""Partial rollouts' host bookkeeping: splicing rounds, ending rows, the version lag, the
checkpoint's arrays."""

import dataclasses

import numpy as np
import pytest

from rlvr_jax.data import curriculum
from rlvr_jax.rl import losses
from rlvr_jax.rl import partial as partial_lib
from rlvr_jax.rl.config import RLConfig
from rlvr_jax.sampling.config import SamplerConfig
from rlvr_jax.types import FINISH_EOS, FINISH_LENGTH, FINISH_STOP, Rollout

PAD = 0


def _segment(rows: list[tuple[list[int], int]], budget: int) -> Rollout:
    """A round's rollout: each row's new tokens and finish reason, log-prob -token/10."""
    N = len(rows)
    tokens = np.full((N, budget), PAD, np.int32)
    logp = np.zeros((N, budget), np.float32)
    for n, (toks, _) in enumerate(rows):
        tokens[n, : len(toks)] = toks
        logp[n, : len(toks)] = [-t / 10 for t in toks]
    lengths = np.asarray([len(t) for t, _ in rows], np.int32)
    return Rollout(
        prompt_NP=np.zeros((N, 1), np.int32),
        prompt_lengths_N=np.ones(N, np.int32),
        tokens_NT=tokens,
        logp_NT=logp,
        mask_NT=np.arange(budget)[None] < lengths[:, None],
        injected_NT=np.zeros((N, budget), bool),
        lengths_N=lengths,
        finish_N=np.asarray([f for _, f in rows], np.int32),
    )


def test_rows_continue_from_where_they_stopped_until_they_end():
    G, T, budget = 2, 5, 2
    a = partial_lib.new_group(7, [5, 6], G, T, PAD)
    b = partial_lib.new_group(9, [8], G, T, PAD)
    assert partial_lib.contexts([a, b]) == [[5, 6], [5, 6], [8], [8]]
    # Round 1 at version 3: a0 ends on an end id, a1 and both rows of b use the whole budget.
    seg = _segment([([11], FINISH_EOS), ([12, 13], 0), ([14, 15], 0), ([16, 17], 0)], budget)
    assert partial_lib.absorb([a, b], seg, version=3) == 7
    assert a.done_G.tolist() == [True, False] and not b.done_G.any()
    assert a.finish_G[0] == FINISH_EOS
    assert partial_lib.contexts([a, b]) == [[5, 6, 11], [5, 6, 12, 13], [8, 14, 15], [8, 16, 17]]
    # Round 2 at version 4: a0's new tokens are dropped (it had ended), a1 stops on a stop
    # sequence, b's rows run on.
    seg = _segment([([21, 22], 0), ([23], FINISH_STOP), ([24, 25], 0), ([26, 27], 0)], budget)
    assert partial_lib.absorb([a, b], seg, version=4) == 5
    assert a.complete and not b.complete
    assert a.tokens_GT.tolist() == [[11, PAD, PAD, PAD, PAD], [12, 13, 23, PAD, PAD]]
    assert a.version_GT.tolist() == [[3, -1, -1, -1, -1], [3, 3, 4, -1, -1]]
    np.testing.assert_allclose(a.logp_GT[1, :3], [-1.2, -1.3, -2.3], rtol=1e-6)
    assert a.finish_G.tolist() == [FINISH_EOS, FINISH_STOP]
    assert a.segments_G.tolist() == [1, 2]
    # Round 3: b reaches T = 5 tokens; the tokens past T are dropped and the rows end on length
    # even where the round saw an end id past T.
    seg = _segment([([1], 0), ([1], 0), ([31, 32], 0), ([33, 34], FINISH_EOS)], budget)
    partial_lib.absorb([a, b], seg, version=6)
    assert b.complete
    assert b.lengths_G.tolist() == [5, 5]
    assert b.tokens_GT[1].tolist() == [16, 17, 26, 27, 33]
    assert b.finish_G.tolist() == [FINISH_LENGTH, FINISH_LENGTH]
    assert partial_lib.lag_metrics([a, b], version=6) == {
        "partial/version_lag_mean": pytest.approx(np.mean([3, 3, 3, 2] + [3, 3, 2, 2, 0] * 2)),
        "partial/version_lag_max": 3.0,
        "partial/multi_round_rows": 0.75,
    }


def test_the_training_rollout_is_the_complete_groups_rows_with_bucketed_prompts():
    G, T = 2, 4
    groups = [partial_lib.new_group(i, [3] * (i + 1), G, T, PAD) for i in range(2)]
    seg = _segment([([5], FINISH_EOS), ([6, 7], FINISH_EOS)] * 2, T)
    partial_lib.absorb(groups, seg, version=0)
    r = partial_lib.training_rollout(groups, buckets=(4, 8), pad_id=PAD)
    assert np.asarray(r.prompt_NP).shape == (4, 4)
    assert np.asarray(r.prompt_lengths_N).tolist() == [1, 1, 2, 2]
    assert np.asarray(r.lengths_N).tolist() == [1, 2, 1, 2]
    assert np.asarray(r.mask_NT).sum(axis=1).tolist() == [1, 2, 1, 2]
    np.testing.assert_allclose(np.asarray(r.logp_NT)[1, :2], [-0.6, -0.7], rtol=1e-6)
    running = partial_lib.new_group(5, [3], G, T, PAD)
    with pytest.raises(ValueError, match="complete groups only"):
        partial_lib.training_rollout([*groups, running], (4,), PAD)
    assert partial_lib.round_groups([*groups, running], B=4) == [running]


def test_pending_groups_survive_the_checkpoints_json():
    G, T = 2, 6
    a = partial_lib.new_group(3, [4, 5, 6], G, T, PAD)
    b = partial_lib.new_group(8, [9], G, T, PAD)
    partial_lib.absorb([a, b], _segment([([1, 2], 0), ([3], FINISH_EOS)] * 2, 2), version=5)
    arrays = {"position": np.asarray(3), **partial_lib.to_arrays([a, b])}
    text = curriculum.state_to_json(arrays)
    own, mine = partial_lib.split_arrays(curriculum.state_from_json(text))
    assert list(own) == ["position"]
    back = partial_lib.from_arrays(mine, T, PAD)
    for x, y in zip([a, b], back, strict=True):
        assert (x.example, x.prompt) == (y.example, y.prompt)
        for name in (
            "tokens_GT", "logp_GT", "injected_GT", "version_GT", "lengths_G", "finish_G",
            "done_G", "segments_G",
        ):  # fmt: skip
            np.testing.assert_array_equal(getattr(x, name), getattr(y, name), err_msg=name)
    assert partial_lib.from_arrays(partial_lib.split_arrays({})[1], T, PAD) == []
    with pytest.raises(ValueError, match="max_new_tokens=6; this run has 7"):
        partial_lib.from_arrays(mine, 7, PAD)


def _with_experts(segment: Rollout) -> Rollout:
    """The round with an MoE sampler's experts: token x's experts are (x, x + 100) in layer 0
    and (x + 200, x + 300) in layer 1, so a test can tell where every token's went."""
    x = np.asarray(segment.tokens_NT)[:, :, None, None]
    experts = x + np.asarray([[0, 100], [200, 300]], np.int32)
    return dataclasses.replace(segment, experts_NTLk=experts.astype(np.int32))


def test_rows_keep_the_experts_of_every_round_and_a_restored_group_has_none():
    G, T, budget = 2, 4, 2
    a = partial_lib.new_group(7, [5, 6], G, T, PAD)
    b = partial_lib.new_group(9, [8], G, T, PAD)
    seg = _segment([([11], FINISH_EOS), ([12, 13], 0), ([14, 15], 0), ([16, 17], 0)], budget)
    partial_lib.absorb([a, b], _with_experts(seg), version=0)
    # The round's tokens past the budget of b are dropped with their experts.
    seg = _segment([([1], 0), ([23], FINISH_STOP), ([24, 25], 0), ([26, 27], FINISH_EOS)], budget)
    partial_lib.absorb([a, b], _with_experts(seg), version=1)
    assert a.complete and b.complete
    rollout = partial_lib.training_rollout([a, b], (4,), PAD)
    tokens, mask = np.asarray(rollout.tokens_NT), np.asarray(rollout.mask_NT)
    experts = np.asarray(rollout.experts_NTLk)
    assert experts.shape == (2 * G, T, 2, 2)
    assert tokens[1].tolist() == [12, 13, 23, PAD] and tokens[3].tolist() == [16, 17, 26, 27]
    np.testing.assert_array_equal(experts[..., 0, 0][mask], tokens[mask])
    np.testing.assert_array_equal(experts[..., 1, 1][mask], tokens[mask] + 300)
    assert not experts[~mask].any()
    # A dense round records none.
    c = partial_lib.new_group(1, [3], G, T, PAD)
    partial_lib.absorb([c], _segment([([2], FINISH_EOS)] * G, budget), version=0)
    assert c.experts_GTLk is None
    assert partial_lib.training_rollout([a, c], (4,), PAD).experts_NTLk is None
    # The checkpoint keeps no experts; a restored group that has tokens takes none from its
    # later rounds, so a rollout with it has none (its earlier tokens' are unknown).
    d = partial_lib.new_group(2, [4], G, T, PAD)
    partial_lib.absorb([d], _with_experts(_segment([([5], 0), ([6], 0)], 1)), version=0)
    assert d.experts_GTLk is not None
    arrays = partial_lib.split_arrays(partial_lib.to_arrays([d]))[1]
    assert not [k for k in arrays if "experts" in k]
    (back,) = partial_lib.from_arrays(arrays, T, PAD)
    assert back.experts_GTLk is None
    seg = _with_experts(_segment([([7, 8], FINISH_EOS), ([9], FINISH_EOS)], 3))
    partial_lib.absorb([back], seg, version=1)
    assert back.complete and back.experts_GTLk is None
    assert partial_lib.training_rollout([a, back], (4,), PAD).experts_NTLk is None


def test_the_config_requires_the_importance_weight_and_refuses_the_think_budget():
    sampler = SamplerConfig(max_new_tokens=8)
    with pytest.raises(ValueError, match="set rl.loss.tis_cap"):
        RLConfig(group_size=2, sampler=sampler, partial_budget=4)
    with pytest.raises(ValueError, match="partial_budget=-1"):
        RLConfig(group_size=2, sampler=sampler, partial_budget=-1)
    thinking = SamplerConfig(
        max_new_tokens=8, think_budget=2, think_open=(5,), think_close=(6,), think_stop=(6,)
    )
    with pytest.raises(ValueError, match="think_budget=2"):
        RLConfig(
            group_size=2,
            sampler=thinking,
            partial_budget=4,
            loss=losses.LossConfig(tis_cap=2.0),
        )
    RLConfig(group_size=2, sampler=sampler, partial_budget=4, loss=losses.LossConfig(tis_cap=2.0))
