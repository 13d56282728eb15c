"""The tabular weight sync touches only what changed, with the same bits as a whole rebuild.

TabularSampler.load_weights(weights) marks only the turns whose weights differ from the ones it holds;
TabularSampler.load_from(learner) (what RunContext.sync calls) also copies only the turns the learner
changed since the sampler's last sync from it.  A marked turn's rows are evaluated as they are sampled,
and its table is rebuilt once they reach its number of contexts.  In real RTPO and GRPO runs, after every
sync the sampler's weights and (brought up to date) tables equal a fresh sampler's built from
learner.weights(), and every generate draws the same actions with the same log-probs as that fresh one."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from rtpo.tabular import SoftmaxTable, TabularLearner, TabularSampler, random_mdp
from tests._method_helpers import make, run, stack


def _assert_whole_rebuild(sampler, policy, weights, when: str) -> None:
    fresh = TabularSampler(policy, weights)
    np.testing.assert_array_equal(sampler.current_weights(), weights, err_msg=f"{when}: weights ≠ the learner's")
    table, cdf = copy.deepcopy(sampler).tables()  # a copy: bringing the tables up to date changes the sampler
    np.testing.assert_array_equal(table, fresh._table, err_msg=f"{when}: log-prob table ≠ whole rebuild")
    np.testing.assert_array_equal(cdf, fresh._cdf, err_msg=f"{when}: cdf ≠ whole rebuild")


def _mdp(kind: str):
    # "wide": 300 contexts a turn, more than a phase samples, so marked turns are sampled row by row
    return None if kind == "chain" else random_mdp(3, num_turns=3, num_states=300, num_actions=3, branching=3)


@pytest.mark.parametrize("kind", ["chain", "wide"])
@pytest.mark.parametrize("method", ["rtpo", "grpo"])
def test_sync_from_the_learner_is_bit_identical_to_a_whole_rebuild(method, kind):
    """Mutants: TabularLearner._step bumps no turn_versions (the sampler keeps the weights of its first
    sync); _table_rows serving a marked turn's old table rows instead of evaluating them: both red."""
    _, pol, ctx = stack(mdp=_mdp(kind), K=4, seed=2, lr=0.3)
    sampler, learner = ctx.sampler, ctx.learner
    real_sync, real_generate = sampler.load_from, sampler.generate
    synced, row_by_row = [], []

    def checked_sync(lrn):
        real_sync(lrn)
        synced.append(sampler.synced_turns)
        _assert_whole_rebuild(sampler, pol, lrn.weights(), f"sync {len(synced)}")

    def checked_generate(contexts, turn, n, rng):
        fresh = TabularSampler(pol, learner.weights())
        want = fresh.generate(contexts, turn, n, copy.deepcopy(rng))
        row_by_row.append(bool(sampler._stale.any()))
        got = real_generate(contexts, turn, n, rng)
        np.testing.assert_array_equal(got.tokens.values, want.tokens.values, err_msg="actions ≠ a fresh sampler's")
        np.testing.assert_array_equal(got.logp.values, want.logp.values, err_msg="log-probs ≠ a fresh sampler's")
        return got

    sampler.load_from, sampler.generate = checked_sync, checked_generate
    run(make(method, G=3), ctx, 3, queries=6)
    assert len(synced) >= 3, "the runs must sync through load_from (once an iteration at least)"
    if method == "rtpo":
        # one turn trained per phase: a sync marks the turn the phase before it trained, or nothing (the
        # first phase of an iteration follows the trunk rollout, which trains nothing)
        assert set(synced[1:]) == {0, 1}, synced
    else:  # GRPO trains every turn the batch reaches in one update
        assert max(synced) >= 2, synced
    if kind == "wide":
        assert any(row_by_row), "a wide table's marked turns must be sampled row by row"


def test_a_loaded_learner_and_foreign_weights_resync_every_turn():
    """After learner.load_state_dict every turn changed; after sampler.load_weights(other) the sampler holds
    weights that are not the learner's.  Either way the next load_from must give the learner's weights.
    Mutants: load_state_dict without bumping turn_versions; load_weights leaving the sampler's record of its
    last sync from the learner: both red."""
    pol = SoftmaxTable(3, 5, 4)
    w = pol.init_params(np.random.default_rng(0))
    learner, sampler = TabularLearner(pol, w, lr=0.3), TabularSampler(pol, w)
    sampler.load_from(learner)
    other = np.random.default_rng(1).standard_normal(w.shape)
    state = learner.state_dict()
    state["params"] = other
    learner.load_state_dict(state)
    sampler.load_from(learner)
    _assert_whole_rebuild(sampler, pol, other, "after load_state_dict")
    assert sampler.synced_turns == 3, "every turn of a loaded learner is new"
    sampler.load_weights(w)
    sampler.load_from(learner)
    _assert_whole_rebuild(sampler, pol, other, "after load_weights of other weights")
    sampler.load_from(learner)
    assert sampler.synced_turns == 0, "nothing changed since the last sync"


def test_load_weights_marks_only_the_changed_turns_and_unchanged_weights_nothing():
    pol = SoftmaxTable(3, 5, 4)
    w = pol.init_params(np.random.default_rng(0))
    s = TabularSampler(pol, w)
    assert s.synced_turns == 3
    s.load_weights(w.copy())
    assert s.synced_turns == 0
    w2 = w.copy()
    w2[1, 2, 3] += 0.5
    s.load_weights(w2)
    assert s.synced_turns == 1 and s._stale.tolist() == [False, True, False]
    _assert_whole_rebuild(s, pol, w2, "one turn changed")
    w2[1, 2, 3] = np.nan  # a NaN weight is never equal to itself: its turn is marked, never skipped
    s.load_weights(w2)
    s.load_weights(w2)
    assert s.synced_turns == 1


def test_a_marked_turn_is_rebuilt_once_its_sampled_rows_reach_its_contexts():
    """Row by row until the rows sampled since the sync reach C (= 5 here), then the table."""
    from rtpo.core.types import Ragged

    pol = SoftmaxTable(2, 5, 3)
    w = pol.init_params(np.random.default_rng(0))
    s = TabularSampler(pol, w)
    w2 = w + 0.25
    s.load_weights(w2)
    pairs = Ragged.from_dense(np.array([[1, 0], [1, 3]]))
    s.generate(pairs, np.array([1, 1]), 1, np.random.default_rng(0))
    assert s._stale.tolist() == [True, True], "2 of 5 rows: still row by row"
    s.generate(Ragged.from_dense(np.array([[1, 1], [1, 2], [1, 4]])), np.array([1, 1, 1]), 1, np.random.default_rng(0))
    assert s._stale.tolist() == [True, False], "5 rows of turn 1 asked for: its table is rebuilt"
    _assert_whole_rebuild(s, pol, w2, "after the rebuild")
