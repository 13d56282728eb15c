"""GRPO's normalised advantage divides by the n − 1 (unbiased) group std, as verl's
compute_grpo_outcome_advantage, TRL's GRPOTrainer and Tree-GRPO compute it (torch.std's default), with
the population std kept as a setting (`std: population`).  Hand-computed on K = 1 bandits."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rtpo.core import estimators
from rtpo.core.methods import base, flat
from rtpo.tabular import TurnMDP
from tests._method_helpers import make, stack

EPS = 1e-6

# G = 4 binary returns with k ones: centred ±, Σ (R − μ)² = k(4 − k)/4; unbiased σ² = that / 3,
# population σ² = that / 4.  (advantage of a 1, advantage of a 0)
HAND = {
    "unbiased": {
        1: (0.75 / (0.5 + EPS), -0.25 / (0.5 + EPS)),  # σ = √(3/12) = 0.5
        2: (0.5 / (1 / math.sqrt(3) + EPS), -0.5 / (1 / math.sqrt(3) + EPS)),  # σ = √(4/12)
        3: (0.25 / (0.5 + EPS), -0.75 / (0.5 + EPS)),
    },
    "population": {
        1: (0.75 / (math.sqrt(3) / 4 + EPS), -0.25 / (math.sqrt(3) / 4 + EPS)),  # σ = √(3/16)
        2: (0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS)),  # σ = √(4/16)
        3: (0.25 / (math.sqrt(3) / 4 + EPS), -0.75 / (math.sqrt(3) / 4 + EPS)),
    },
}


def test_estimator_by_hand():
    r = np.array([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    a = estimators.group_advantage(r)
    np.testing.assert_allclose(a[0], [HAND["unbiased"][2][0], *[HAND["unbiased"][2][1]] * 2, HAND["unbiased"][2][0]])
    np.testing.assert_allclose(a[1], [HAND["unbiased"][1][0], *[HAND["unbiased"][1][1]] * 3])
    assert np.all(a[2] == 0.0)
    p = estimators.group_advantage(r, std="population")
    np.testing.assert_allclose(p[1], [HAND["population"][1][0], *[HAND["population"][1][1]] * 3])
    np.testing.assert_array_equal(estimators.get("group_norm")(r), a)
    np.testing.assert_array_equal(estimators.get("group_norm_population")(r), p)
    # the two differ by exactly √((n−1)/n) in σ (up to eps)
    np.testing.assert_allclose(p[:2], a[:2] / math.sqrt(3 / 4), rtol=1e-5)  # σ_pop = σ_unbiased · √(3/4)
    with pytest.raises(ValueError, match="std must be one of"):
        estimators.group_advantage(r, std="sample")


def _bandit() -> TurnMDP:
    """K = 1, two actions paying 1 and 0 exactly: each trajectory's return is its action's reward."""
    P = np.zeros((1, 1, 2, 1))
    R = np.array([[[1.0, 0.0]]])
    return TurnMDP.from_arrays(P, R, np.array([1.0]))


@pytest.mark.parametrize("std", ["unbiased", "population"])
@pytest.mark.parametrize("name", ["grpo", "gspo", "arpo"])
def test_k1_method_trains_on_the_hand_computed_advantage(monkeypatch, name, std):
    """One iteration of the registered method on the K = 1 bandit: the advantages of the batch it trains
    on are the HAND table's for each query's count of 1s."""
    seen = {}
    real = base.ppo_update  # Method.ppo, the one caller of ppo_update

    def spy(learner, batch, *a, **kw):
        seen["adv"] = batch.advantages.values.copy()
        seen["seq"] = batch.seq_id.copy()
        return real(learner, batch, *a, **kw)

    monkeypatch.setattr(base, "ppo_update", spy)
    _, _, ctx = stack(mdp=_bandit(), seed=3)
    cfg = {"M": 4, "N": 4} if name == "arpo" else {"G": 4}
    m = make(name, std=std, **cfg)
    Q = 12
    state = m.begin(ctx, np.arange(Q))
    returns = np.array([flat.path_return(p) for p in state.data.paths]).reshape(Q, 4)
    while state.pending:
        m.phase(ctx, state)
    adv = seen["adv"].reshape(Q, 4)  # K = 1: one row (one token) per trajectory, queries contiguous
    counts = returns.sum(axis=1).astype(int)
    assert {1, 2, 3} <= set(counts.tolist())  # the seed exercises every informative count
    for q in range(Q):
        k = counts[q]
        if k in (0, 4):
            assert np.all(adv[q] == 0.0)
            continue
        want = np.where(returns[q] == 1.0, HAND[std][k][0], HAND[std][k][1])
        np.testing.assert_allclose(adv[q], want, rtol=1e-12)


def test_tree_grpo_std_setting():
    r = np.array([[[1.0, 0.0], [0.0, 0.0]]])  # one prompt, 2 trees × 2 leaves
    a = estimators.tree_advantage(r)
    inter = (r.reshape(1, 4) - 0.25) / (0.5 + EPS)  # unbiased σ over 4 leaves = 0.5 (k = 1 above)
    intra = np.array([[[0.5, -0.5], [0.0, 0.0]]]) / (math.sqrt(0.5) + EPS)  # σ of (1, 0) over n − 1 = 1
    np.testing.assert_allclose(a, inter.reshape(r.shape) + intra)
    with pytest.raises(ValueError, match="std must be one of"):
        make("tree_grpo", std="nope")
    with pytest.raises(ValueError, match="std must be one of"):
        make("grpo", std="nope")
