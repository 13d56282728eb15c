"""TabularSampler.load_weights rebuilds only the turns whose weights changed, with the same bits as a whole
rebuild: after every sync of real RTPO and GRPO runs the incremental tables equal a fresh sampler's."""

from __future__ import annotations

import numpy as np
import pytest

from rtpo.tabular import SoftmaxTable, TabularSampler
from tests._method_helpers import make, run, stack


def _fresh_tables(policy, weights):
    s = TabularSampler(policy, weights)
    return s._table, s._cdf


@pytest.mark.parametrize("method", ["rtpo", "grpo"])
def test_incremental_sync_is_bit_identical_to_a_whole_rebuild(method):
    _, pol, ctx = stack(K=4, seed=2, lr=0.3)
    sampler = ctx.sampler
    real = sampler.load_weights
    rebuilt = []

    def checked(weights):
        real(weights)
        rebuilt.append(sampler.rebuilt_turns)
        table, cdf = _fresh_tables(pol, weights)
        np.testing.assert_array_equal(sampler._table, table, err_msg="incremental log-prob table ≠ whole rebuild")
        np.testing.assert_array_equal(sampler._cdf, cdf, err_msg="incremental cdf ≠ whole rebuild")

    sampler.load_weights = checked
    run(make(method, G=3), ctx, 3, queries=6)
    assert rebuilt, "the runs must sync"
    if method == "rtpo":  # one turn trained per phase: every sync after the first phase rebuilds one turn
        assert min(rebuilt) <= 1 and max(rebuilt) <= 4, rebuilt


def test_only_changed_turns_are_recomputed_and_unchanged_weights_rebuild_nothing():
    pol = SoftmaxTable(3, 5, 4)
    w = pol.init_params(np.random.default_rng(0))
    s = TabularSampler(pol, w)
    assert s.rebuilt_turns == 3
    s.load_weights(w.copy())
    assert s.rebuilt_turns == 0
    w2 = w.copy()
    w2[1, 2, 3] += 0.5
    s.load_weights(w2)
    assert s.rebuilt_turns == 1
    table, _ = _fresh_tables(pol, w2)
    np.testing.assert_array_equal(s._table, table)
    w2[1, 2, 3] = np.nan  # a NaN weight is never equal to itself: its turn is rebuilt, never skipped
    s.load_weights(w2)
    s.load_weights(w2)
    assert s.rebuilt_turns == 1
