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
    st.sampled_from([1, 3, 5, 8, 9]),
    st.sampled_from([1, 2, 8]),
    st.sampled_from([1.0, 0.9]),
    st.sampled_from([None, 0, 1]),
    st.integers(0, 6),
)
def test_numba_kernel_equals_the_numpy_kernel_bit_for_bit(seed, K, S, A, B, gamma, decimals, edits):
    # every loop of the kernel (one lane block: A ≤ 4; two: A ≤ 8, unrolled for B = 8; more: A = 9), γ = 1
    # and γ < 1, padded lanes (A not a multiple of 4); exact ties
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


needs_numba = pytest.mark.skipif(not solve_mod._numba_installed(), reason="no numba")


def edited(mdp: TurnMDP, seed: int) -> TurnMDP:
    """mdp with exact ties, near-ties and NaN rewards at fixed places (the hypothesis test's edits)."""
    reward = [np.array(r) for r in mdp.reward]
    succ, prob, tau = (list(map(np.array, x)) for x in (mdp.succ, mdp.prob, mdp.tau))
    rng = np.random.default_rng(seed)
    K, A = mdp.num_turns, mdp.num_actions
    for _ in range(6):
        k, s, a = rng.integers(K), rng.integers(mdp.num_states[0]), rng.integers(A)
        if rng.random() < 0.25:
            reward[k][s, a] = np.nan
        else:
            b = (a + 1) % A
            succ[k][s, b], prob[k][s, b], tau[k][s, b] = succ[k][s, a], prob[k][s, a], tau[k][s, a]
            reward[k][s, b] = reward[k][s, a] + rng.choice([-5e-13, 0.0, 5e-13])
    return TurnMDP(tuple(succ), tuple(prob), tuple(reward), tuple(tau), mdp.psi, mdp.init, mdp.num_contexts, mdp.gamma)


@needs_numba
@pytest.mark.parametrize("gamma", [1.0, 0.9])
@pytest.mark.parametrize(("A", "B"), [(8, 8), (7, 8), (6, 3), (4, 8), (2, 1), (9, 8), (13, 2)])
def test_every_kernel_loop_equals_the_numpy_kernel(A, B, gamma):
    # each (A, B) reaches one of solve_turns' loops — two blocks with B = 8 unrolled, two blocks, one
    # block, three or four blocks (the general loop) — full or with padded lanes; not left to sampling
    mdp = edited(random_mdp(A * 10 + B, 4, 9, A, branching=B, end_prob=0.2, max_tau=3, gamma=gamma), A + B)
    assert_same_solution(solve(mdp, kernel="numba"), solve(mdp, kernel="numpy"))


@pytest.mark.parametrize("kernel", KERNELS)
def test_padded_lanes_never_win_nor_poison_a_row(kernel):
    # A = 3: the kernel's fourth lane is padding.  Turn 0's rows all lead to state 1 of turn 1, but their
    # padded lane reads successor 0, whose V is NaN: the padding must neither be the maximum of a row of
    # negative values nor carry the NaN into it; an all −inf row takes action 0, as _argmax does
    P = np.zeros((2, 2, 3, 2))
    P[0, :, :, 1] = 1.0
    r = np.array([[[-3.0, -1.0, -2.0], [-np.inf, -np.inf, -np.inf]], [[np.nan] * 3, [-5.0, -4.0, -6.0]]])
    mdp = TurnMDP.from_arrays(P, r, np.array([0.5, 0.5]))
    sol = solve(mdp, kernel=kernel)
    assert sol.actions.tolist() == [[1, 0], [2, 1]]  # row NaN -> A−1; the others their maximum
    assert sol.v[0].tolist() == [-5.0, -np.inf]
    assert np.isnan(sol.v[1][0]) and sol.v[1][1] == -4.0


@needs_numba
def test_numba_solution_builds_q_policy_and_psi_on_first_access():
    mdp = random_mdp(5, 4, 30, 6, branching=3, gamma=0.9, max_tau=2, end_prob=0.1)
    fast, ref = solve(mdp, kernel="numba"), solve(mdp, kernel="numpy")
    assert isinstance(fast, solve_mod.Solution) and fast.kernel == "numba"
    assert not {"_q", "_policy", "_psi"} & set(vars(fast))  # nothing built yet
    assert fast.value == ref.value and all(np.array_equal(a, b) for a, b in zip(fast.f, ref.f))
    assert np.array_equal(fast.actions, ref.actions) and fast.actions.dtype == np.int64
    assert fast.q is fast.q and fast.policy is fast.policy  # built once, then kept
    assert_same_solution(fast, ref)
    assert all(np.array_equal(a, b) for a, b in zip(fast.psi, ref.psi))
    assert np.array_equal(ref.actions, ref.policy.argmax(axis=2))


@needs_numba
def test_the_lane_layout_keeps_a_shared_layer_once():
    from rtpo.tabular import _solve_numba as kernel

    layer = random_mdp(3, num_turns=2, num_states=11, num_actions=5, branching=3, max_tau=2)
    shared, distinct = stationary(layer, 5, True), stationary(layer, 5, False)
    one = 11 * 8 * 3  # S · (A padded to 8 lanes) · B entries
    assert kernel.lane_layout(shared).P.size == one and kernel.lane_layout(distinct).P.size == 4 * one
    assert kernel.lane_layout(shared) is kernel.lane_layout(shared)  # built once per MDP
    assert kernel.lane_layout(shared).I.dtype == np.uint16
    assert_same_solution(solve(shared, kernel="numba"), solve(distinct, kernel="numba"))
    # one reward array for every turn but a τ per turn: the pooled rewards and γ^τ sit at different
    # offsets, and each turn must read its own
    rng = np.random.default_rng(0)
    taus = tuple(rng.integers(1, 4, size=shared.tau[0].shape) for _ in range(5))
    mixed = TurnMDP(shared.succ, shared.prob, shared.reward, taus, shared.psi, shared.init, 11, 0.9)
    meta = kernel.lane_layout(mixed).meta
    assert len(set(meta[:, kernel.R_OFF])) == 1 and len(set(meta[:, kernel.D_OFF])) == 5
    assert_same_solution(solve(mixed, kernel="numba"), solve(mixed, kernel="numpy"))


@needs_numba
@pytest.mark.slow  # compiles the kernel's uint32 variant (seconds, once per cache)
def test_more_than_65536_states_a_turn_take_uint32_successors():
    from rtpo.tabular import _solve_numba as kernel

    mdp = edited(random_mdp(2, 3, 70_000, 3, branching=2, gamma=0.9, end_prob=0.1), 2)
    assert kernel.lane_layout(mdp).I.dtype == np.uint32
    assert_same_solution(solve(mdp, kernel="numba"), solve(mdp, kernel="numpy"))
