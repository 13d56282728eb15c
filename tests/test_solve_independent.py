"""`solve` against solvers that share no code with it, on Hypothesis-generated random MDPs.

V*: the occupancy-measure linear program of the finite-horizon MDP, solved by scipy's HiGHS.
    Variables x_k(s, u) ≥ 0 are discounted state-action occupancies:
        Σ_u x_0(s, u) = init(s)
        Σ_u x_k(s', u) = Σ_{s,u} γ^{τ_{k-1}(s,u)} P_{k-1}(s' | s, u) x_{k-1}(s, u)      (k ≥ 1)
    and V* = max Σ_{k,s,u} x_k(s, u) r_k(s, u).
Q̃: a plain recursion over the dense arrays (Eq. 20 with the max continuation), one scalar at a time.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.optimize import linprog

from rtpo.commands.cli import main
from rtpo.tabular import TurnMDP, random_mdp, solve

TOL = 1e-9


def lp_value(P, R, tau, init, gamma) -> float:
    K, S, A, _ = P.shape
    n = K * S * A
    idx = lambda k, s, a: (k * S + s) * A + a  # noqa: E731
    A_eq = np.zeros((K * S, n))
    b_eq = np.zeros(K * S)
    for s in range(S):
        for a in range(A):
            A_eq[s, idx(0, s, a)] = 1.0
        b_eq[s] = init[s]
    for k in range(1, K):
        for s2 in range(S):
            row = k * S + s2
            for a in range(A):
                A_eq[row, idx(k, s2, a)] += 1.0
            for s in range(S):
                for a in range(A):
                    A_eq[row, idx(k - 1, s, a)] -= gamma ** tau[k - 1, s, a] * P[k - 1, s, a, s2]
    c = -R.reshape(-1)
    res = linprog(
        c,
        A_eq=A_eq,
        b_eq=b_eq,
        bounds=(0, None),
        method="highs",
        options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10},
    )
    assert res.status == 0, res.message
    return -res.fun


def recursive_q(P, R, tau, gamma):
    K, S, A, _ = P.shape

    @cache
    def q(k: int, s: int, a: int) -> float:
        total = float(R[k, s, a])
        if k == K - 1:
            return total
        for s2 in range(S):
            p = float(P[k, s, a, s2])
            if p > 0.0:
                total += p * gamma ** int(tau[k, s, a]) * max(q(k + 1, s2, b) for b in range(A))
        return total

    return np.array([[[q(k, s, a) for a in range(A)] for s in range(S)] for k in range(K)])


@st.composite
def dense_mdps(draw):
    K = draw(st.integers(1, 4))
    S = draw(st.integers(1, 4))
    A = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**32 - 1))
    gamma = draw(st.sampled_from([1.0, 0.9, 0.5]))
    end_prob = draw(st.sampled_from([0.0, 0.3]))
    sparse = draw(st.booleans())
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.ones(S), size=(K, S, A))
    if sparse:  # knock out some successors, keep at least one per row
        keep = rng.random((K, S, A, S)) < 0.5
        keep[..., 0] |= ~keep.any(axis=-1)
        P = np.where(keep, P, 0.0)
        P /= P.sum(axis=-1, keepdims=True)
    P[rng.random((K, S, A)) < end_prob] = 0.0  # these (s, u) end the episode
    P[K - 1] = 0.0
    R = rng.uniform(-1.0, 1.0, size=(K, S, A))
    tau = rng.integers(1, 4, size=(K, S, A))
    init = rng.dirichlet(np.ones(S))
    return P, R, tau, init, gamma


@given(dense_mdps())
def test_solve_matches_lp_and_recursion(arrays):
    P, R, tau, init, gamma = arrays
    mdp = TurnMDP.from_arrays(P, R, init, gamma=gamma, tau=tau)
    sol = solve(mdp)
    q_ref = recursive_q(P, R, tau, gamma)
    for k in range(mdp.num_turns):
        np.testing.assert_allclose(sol.q[k], q_ref[k], rtol=0, atol=TOL)
        np.testing.assert_allclose(sol.v[k], q_ref[k].max(axis=1), rtol=0, atol=TOL)
        # the returned policy is greedy in Q̃ (backward induction, C.1)
        chosen = sol.policy[k][sol.psi[k]].argmax(axis=1)
        np.testing.assert_allclose(q_ref[k][np.arange(len(chosen)), chosen], q_ref[k].max(axis=1), atol=TOL)
    assert abs(sol.value - lp_value(P, R, tau, init, gamma)) <= TOL
    assert abs(sol.value - float(init @ q_ref[0].max(axis=1))) <= TOL


def test_lp_reference_can_fail():
    """The reference is not vacuous: a perturbed reward moves the LP optimum."""
    P = np.zeros((2, 2, 2, 2))
    P[0, :, :, 0] = 1.0
    R = np.array([[[0.0, 1.0], [0.0, 0.0]], [[2.0, 0.0], [0.0, 0.0]]])
    tau = np.ones((2, 2, 2), dtype=np.int64)
    init = np.array([1.0, 0.0])
    assert lp_value(P, R, tau, init, 1.0) == pytest.approx(3.0, abs=1e-12)  # u=1 (r=1), then u=0 (r=2)
    assert lp_value(P, R, tau, init, 0.5) == pytest.approx(2.0, abs=1e-12)  # 1 + 0.5·2


@pytest.mark.parametrize("seed", [0, 7])
def test_cli_solve_prints_v_star(seed, tmp_path, capsys):
    params = dict(seed=seed, num_turns=3, num_states=4, num_actions=3, gamma=0.9, max_tau=2, end_prob=0.2)
    scenario = tmp_path / "rand.yaml"
    scenario.write_text(
        "name: rand\nbackend: {kind: tabular}\nmethod: {name: rtpo}\n"
        "task: {kind: random, " + ", ".join(f"{k}: {v}" for k, v in params.items()) + "}\n"
    )
    assert main(["solve", str(scenario)]) == 0
    out = capsys.readouterr().out
    printed = float(re.search(r"^V\* = (\S+)$", out, re.M).group(1))
    P, R, tau = random_mdp(**params).to_dense()
    init = random_mdp(**params).init
    assert abs(printed - lp_value(P, R, tau, init, 0.9)) <= TOL
    assert "k=2:" in out


def test_cli_solve_aliased_scenario(capsys):
    path = Path(__file__).resolve().parents[1] / "scenarios" / "tabular" / "aliased.yaml"
    assert main(["solve", str(path)]) == 0
    out = capsys.readouterr().out
    v_star = float(re.search(r"^V\* = (\S+)$", out, re.M).group(1))
    v_psi = float(re.search(r"^V\*_psi .* = (\S+)$", out, re.M).group(1))
    assert v_psi < v_star - 1e-6  # the aliasing map hides decision-relevant progress
