"""DAPO's sampling options on the group-relative methods (GRPOConfig): dynamic sampling, overlong
filtering and the soft overlong punishment, each against a hand computation or the budget's count.

Mutants that turn these red: keeping uninformative groups in the dynamic-sampling batch
(test_dynamic_sampling_keeps_informative_groups_and_counts_every_rollout); not charging the re-sampled
rollouts (the same test, through ctx.budget); the punishment's clip at −1 removed
(test_soft_overlong_punishment_by_hand); overlong_filter not masking (test_overlong_filter_masks_cut_paths).
"""

from __future__ import annotations

import numpy as np
import pytest

from rtpo.core.methods import base
from rtpo.core.methods.flat import trajectory_path
from rtpo.core.types import Ragged, Trajectory
from rtpo.scenario.load import ConfigError, load_scenario
from tests._method_helpers import make, stack


def _traj(lengths, reward, q=0):
    n = len(lengths)
    toks = Ragged.from_rows([np.arange(m) for m in lengths], dtype=np.int64)
    return Trajectory(
        contexts=Ragged.from_rows([np.array([1, 2])] * n, dtype=np.int64),
        tokens=toks,
        logp=Ragged(np.full(toks.values.size, -1.0), toks.offsets),
        rewards=np.r_[np.zeros(n - 1), reward],
        durations=np.ones(n),
        malformed=np.zeros(n, bool),
        query_id=q,
        start_turn=0,
    )


def test_soft_overlong_punishment_by_hand():
    """L_max = 20, L_cache = 5: ℓ ≤ 15 free, ℓ = 18 → −3/5, ℓ ≥ 20 → −1 (clipped); summed over turns."""
    m = make("grpo", G=2, max_response_tokens=20, overlong_buffer=5, overlong_penalty=0.5)
    paths = [
        trajectory_path(_traj([3, 15], 1.0)),
        trajectory_path(_traj([18, 40], 1.0)),
        trajectory_path(_traj([16], 0.0)),
    ]
    got = m.returns(paths)
    hand = [1.0, 1.0 + 0.5 * (-3 / 5 - 1.0), 0.0 + 0.5 * (-1 / 5)]
    np.testing.assert_allclose(got, hand, rtol=1e-12, err_msg="soft overlong punishment differs from Eq. 13 by hand")
    assert np.array_equal(make("grpo", G=2).returns(paths), [1.0, 1.0, 0.0]), "off by default"


class _SpyLearner:
    """Stands in for a learner in a batch-selection test: records the batch it is asked to train on (the
    real learners' arithmetic is tested elsewhere; this checks which rows reach them)."""

    def __init__(self):
        self.batches = []

    def logprobs(self, batch):
        return batch.old_logp

    def train_step(self, batch, loss):
        self.batches.append(batch)
        return {}


def test_overlong_filter_masks_cut_paths():
    m = make("grpo", G=2, max_response_tokens=10, overlong_filter=True)
    paths = [trajectory_path(_traj([3, 10], 1.0)), trajectory_path(_traj([4, 5], 0.0))]
    learner = _SpyLearner()
    ctx = base.RunContext(env=None, sampler=None, learner=learner, rng=np.random.default_rng(0))
    out = m.update(ctx, paths, np.array([1.0, -1.0]), {})
    assert out["dapo/overlong_rate"] == 0.5
    (batch,) = learner.batches
    assert set(batch.seq_id.tolist()) == {1}, "the path with a 10-token (cut) response must leave the loss"
    assert batch.tokens.lengths.tolist() == [4, 5]


def test_dynamic_sampling_keeps_informative_groups_and_counts_every_rollout():
    """K = 1 bandit-like tool chain at a peaky init: many groups are all-equal; the kept batch holds only
    groups whose returns differ, and the budget counts every re-sampled rollout."""
    _, _, ctx = stack(K=1, seed=4, init_scale=3.0)
    m = make("grpo", G=4, dynamic_sampling=True, max_resample_rounds=5)
    Q = 16
    state = m.begin(ctx, np.arange(Q))
    data = state.data
    d = data.metrics
    returns = m.returns(data.paths).reshape(-1, 4)
    assert d["dapo/resample_rounds"] >= 1, "the seed should give some all-equal groups"
    assert d["dapo/informative_groups"] == returns.shape[0] > 0
    assert np.all(np.ptp(returns, axis=1) > 0), "a kept group has all-equal returns"
    assert ctx.budget.rollouts == d["dapo/rollouts"] > Q * 4, "re-sampled rollouts not charged"
    out = m.phase(ctx, state)
    assert out["adv/zero_rate"] < 1.0 and out["dapo/informative_groups"] == d["dapo/informative_groups"]


def test_bad_dapo_options_are_one_line_errors():
    with pytest.raises(ConfigError, match=r"method.max_response_tokens"):
        load_scenario(None, ["method.name=grpo", "method.overlong_filter=true"])
    with pytest.raises(ConfigError, match=r"method.max_resample_rounds"):
        load_scenario(None, ["method.name=grpo", "method.max_resample_rounds=-1"])
