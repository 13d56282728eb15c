"""solve's greedy step (no index gathers on rows without near-ties) and the shared storage of turns
given the same arrays: both must leave every result bit-identical to the plain rules they replace."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rtpo.tabular import TurnMDP, random_mdp, solve
from rtpo.tabular.solve import _TIE, backup


def plain_greedy(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row by row: the lowest action within _TIE of the row maximum, and its Q̃."""
    best = np.array([next(a for a in range(q.shape[1]) if q[s, a] >= q[s].max() - _TIE) for s in range(q.shape[0])])
    return best, q[np.arange(q.shape[0]), best]


def plain_solve(mdp: TurnMDP):
    K, A = mdp.num_turns, mdp.num_actions
    policy = np.zeros((K, max(mdp.num_states), A))
    policy[:, :, 0] = 1.0
    qs, vs, v = [None] * K, [None] * K, None
    for k in range(K - 1, -1, -1):
        qs[k] = backup(mdp, k, v)
        best, v = plain_greedy(qs[k])
        policy[k, : mdp.num_states[k]] = np.eye(A)[best]
        vs[k] = v
    return qs, vs, policy


def rounded(mdp: TurnMDP, decimals: int) -> TurnMDP:
    """The same MDP with rewards rounded: many exact ties between actions."""
    reward = tuple(np.round(r, decimals) for r in mdp.reward)
    return TurnMDP(mdp.succ, mdp.prob, reward, mdp.tau, mdp.psi, mdp.init, mdp.num_contexts, mdp.gamma)


@given(st.integers(0, 10_000), st.integers(1, 4), st.integers(1, 6), st.integers(1, 5), st.sampled_from([None, 0, 1]))
def test_solve_equals_the_plain_greedy_rule_bit_for_bit(seed, K, S, A, decimals):
    mdp = random_mdp(seed, K, S, A, branching=2, end_prob=0.2, max_tau=2, gamma=0.9)
    if decimals is not None:
        mdp = rounded(mdp, decimals)
    sol = solve(mdp)
    qs, vs, policy = plain_solve(mdp)
    assert np.array_equal(sol.policy, policy)
    assert all(np.array_equal(a, b) for a, b in zip(sol.v, vs))
    assert all(np.array_equal(a, b) for a, b in zip(sol.q, qs))


def test_near_ties_go_to_the_lowest_action_and_keep_its_value():
    # action 0 is 5e-13 below action 1 (within _TIE): the rule picks 0 and V is Q̃(s, 0), not the max;
    # a plain argmax (or V = row max) gets this row wrong
    r = np.array([[1.0 - 5e-13, 1.0, 0.0], [0.0, 2.0, 2.0 - 2e-12], [3.0, 3.0, 3.0]])
    mdp = TurnMDP.from_arrays(np.zeros((1, 3, 3, 3)), r[None], np.array([1.0, 0.0, 0.0]))
    sol = solve(mdp)
    assert sol.policy[0].argmax(axis=1).tolist() == [0, 1, 0]
    assert sol.v[0].tolist() == [1.0 - 5e-13, 2.0, 3.0]


def test_nan_rows_fall_back_to_the_plain_rule():
    r = np.array([[np.nan, 1.0], [0.0, 1.0]])
    mdp = TurnMDP.from_arrays(np.zeros((1, 2, 2, 2)), r[None], np.array([0.5, 0.5]))
    pol = solve(mdp).policy[0]
    assert np.array_equal(pol.sum(axis=1), [1.0, 1.0])  # still one action per state
    assert pol[1].tolist() == [0.0, 1.0]


def stationary(layer: TurnMDP, K: int, shared: bool) -> TurnMDP:
    def turns(x, n=K):
        return (x,) * n if shared else tuple(np.array(x) for _ in range(n))

    return TurnMDP(
        turns(layer.succ[0]),
        turns(layer.prob[0], K - 1) + (np.zeros_like(layer.prob[0]),),
        turns(layer.reward[0]),
        turns(layer.tau[0]),
        (np.arange(layer.num_states[0]),) * K,
        np.full(layer.num_states[0], 1.0 / layer.num_states[0]),
        layer.num_states[0],
        0.95,
    )


def test_turns_given_one_array_share_one_copy_and_one_matrix():
    layer = random_mdp(3, num_turns=2, num_states=7, num_actions=3, branching=2, max_tau=2)
    shared, distinct = stationary(layer, 5, True), stationary(layer, 5, False)
    assert len({id(x) for x in shared.prob[:-1]}) == 1 and len({id(x) for x in shared.reward}) == 1
    assert len({id(m) for m in shared.transition_csr}) == 1
    assert len({id(x) for x in distinct.prob}) == 5 and len({id(m) for m in distinct.transition_csr}) == 4
    a, b = solve(shared), solve(distinct)
    assert a.value == b.value and np.array_equal(a.policy, b.policy)
    assert all(np.array_equal(x, y) for x, y in zip(a.q, b.q))
    # still a copy of the caller's array, read-only
    src = np.array(layer.reward[0])
    mdp = TurnMDP(shared.succ, shared.prob, (src,) * 5, shared.tau, shared.psi, shared.init, 7, 0.95)
    src[0, 0] += 1.0
    assert mdp.reward[0][0, 0] == layer.reward[0][0, 0]
    with pytest.raises(ValueError):
        mdp.reward[0][0, 0] = 0.0
