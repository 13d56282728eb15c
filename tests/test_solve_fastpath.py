"""solve's greedy step (no index gathers on rows without near-ties), its fused numba kernel, and the
shared storage of turns given the same arrays: all must leave every result bit-identical to the plain
rules they replace.  The kernel tests run on both kernels ("numba" skips where numba is not installed)."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rtpo.tabular import TurnMDP, random_mdp, solve
from rtpo.tabular.solve import _TIE, backup

solve_mod = importlib.import_module("rtpo.tabular.solve")  # the module (rtpo.tabular.solve is the function)

KERNELS = [
    "numpy",
    pytest.param("numba", marks=pytest.mark.skipif(not solve_mod._numba_installed(), reason="no numba")),
]


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


def assert_same_solution(a, b):
    assert np.array_equal(a.policy, b.policy)
    assert all(np.array_equal(x, y, equal_nan=True) for x, y in zip(a.v, b.v))
    assert all(np.array_equal(x, y, equal_nan=True) for x, y in zip(a.q, b.q))
    assert a.value == b.value or (np.isnan(a.value) and np.isnan(b.value))


@pytest.mark.parametrize("kernel", KERNELS)
@given(st.integers(0, 10_000), st.integers(1, 4), st.integers(1, 6), st.integers(1, 5), st.sampled_from([None, 0, 1]))
def test_solve_equals_the_plain_greedy_rule_bit_for_bit(kernel, seed, K, S, A, decimals):
    mdp = random_mdp(seed, K, S, A, branching=2, end_prob=0.2, max_tau=2, gamma=0.9)
    if decimals is not None:
        mdp = rounded(mdp, decimals)
    sol = solve(mdp, kernel=kernel)
    assert sol.kernel == kernel
    qs, vs, policy = plain_solve(mdp)
    assert np.array_equal(sol.policy, policy)
    assert all(np.array_equal(a, b) for a, b in zip(sol.v, vs))
    assert all(np.array_equal(a, b) for a, b in zip(sol.q, qs))


@pytest.mark.skipif(not solve_mod._numba_installed(), reason="no numba")
@given(
    st.integers(0, 10_000),
    st.integers(1, 4),
    st.integers(1, 12),
    st.sampled_from([1, 3, 8]),
    st.sampled_from([1, 2, 8]),
    st.sampled_from([1.0, 0.9]),
    st.sampled_from([None, 0, 1]),
    st.integers(0, 6),
)
def test_numba_kernel_equals_the_numpy_kernel_bit_for_bit(seed, K, S, A, B, gamma, decimals, edits):
    # every loop of the kernel: A = B = 8 with γ = 1 (its unrolled one), γ < 1, other shapes; exact ties
    # (rounded rewards or copied actions), near-ties and NaN rewards (which reach earlier turns through V)
    mdp = random_mdp(seed, K, S, A, branching=B, end_prob=0.2, max_tau=2, gamma=gamma)
    reward = [np.round(r, decimals) if decimals is not None else np.array(r) for r in mdp.reward]
    succ, prob, tau = (list(map(np.array, x)) for x in (mdp.succ, mdp.prob, mdp.tau))
    rng = np.random.default_rng(seed)
    for _ in range(edits):
        k, s, a = rng.integers(K), rng.integers(S), rng.integers(A)
        if rng.random() < 0.25:
            reward[k][s, a] = np.nan
        else:  # action b copies a's transitions: an exact tie or a near-tie either way, at any turn
            b = (a + 1) % A
            succ[k][s, b], prob[k][s, b], tau[k][s, b] = succ[k][s, a], prob[k][s, a], tau[k][s, a]
            reward[k][s, b] = reward[k][s, a] + rng.choice([-5e-13, 0.0, 5e-13])
    mdp = TurnMDP(tuple(succ), tuple(prob), tuple(reward), tuple(tau), mdp.psi, mdp.init, mdp.num_contexts, gamma)
    assert_same_solution(solve(mdp, kernel="numba"), solve(mdp, kernel="numpy"))


@pytest.mark.parametrize("kernel", KERNELS)
def test_near_ties_go_to_the_lowest_action_and_keep_its_value(kernel):
    # action 0 is 5e-13 below action 1 (within _TIE): the rule picks 0 and V is Q̃(s, 0), not the max;
    # a plain argmax (or V = row max) gets this row wrong
    r = np.array([[1.0 - 5e-13, 1.0, 0.0], [0.0, 2.0, 2.0 - 2e-12], [3.0, 3.0, 3.0]])
    mdp = TurnMDP.from_arrays(np.zeros((1, 3, 3, 3)), r[None], np.array([1.0, 0.0, 0.0]))
    sol = solve(mdp, kernel=kernel)
    assert sol.policy[0].argmax(axis=1).tolist() == [0, 1, 0]
    assert sol.v[0].tolist() == [1.0 - 5e-13, 2.0, 3.0]


@pytest.mark.parametrize("kernel", KERNELS)
def test_nan_rows_fall_back_to_the_plain_rule(kernel):
    r = np.array([[np.nan, 1.0], [0.0, 1.0], [1.0, np.nan]])
    mdp = TurnMDP.from_arrays(np.zeros((1, 3, 2, 3)), r[None], np.array([0.5, 0.5, 0.0]))
    pol = solve(mdp, kernel=kernel).policy[0]
    assert np.array_equal(pol.sum(axis=1), [1.0, 1.0, 1.0])  # still one action per state
    assert pol.tolist() == [[0.0, 1.0], [0.0, 1.0], [0.0, 1.0]]  # a NaN row takes the last action


def test_kernel_choice_is_explicit_and_fails_closed(monkeypatch):
    small = random_mdp(0, 2, 4, 3, branching=2)
    assert solve(small).kernel == "numpy"  # auto: below AUTO_NUMBA_ENTRIES numba's import does not pay
    with pytest.raises(ValueError, match="unknown kernel 'fortran'"):
        solve(small, kernel="fortran")
    with pytest.raises(ValueError, match="psi=None only"):
        solve(small, small.psi, kernel="numba")
    assert solve(small, small.psi).kernel == "numpy"
    monkeypatch.setattr(solve_mod, "_numba_installed", lambda: False)
    with pytest.raises(ImportError, match=r"needs numba.*rtpo\[fast\]"):
        solve(small, kernel="numba")
    big = random_mdp(0, 2, solve_mod.AUTO_NUMBA_ENTRIES // 64, 8, branching=8)
    assert solve(big).kernel == "numpy"  # auto without numba
    monkeypatch.undo()
    if solve_mod._numba_installed():
        assert solve(big).kernel == "numba"


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
