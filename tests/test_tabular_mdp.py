"""TurnMDP construction, validation and the sparse/dense round trip."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rtpo.tabular import TurnMDP, evaluate, random_mdp, solve, tool_chain, uniform_policy
from rtpo.tabular.generators import last_feedback_psi


@given(st.integers(0, 10_000), st.integers(1, 4), st.integers(1, 4), st.integers(1, 3), st.sampled_from([None, 1, 2]))
def test_dense_roundtrip_preserves_values(seed, K, S, A, branching):
    mdp = random_mdp(seed, K, S, A, branching=branching, end_prob=0.3, max_tau=3, gamma=0.9)
    P, R, T = mdp.to_dense()
    again = TurnMDP.from_arrays(P, R, mdp.init, gamma=0.9, tau=T)
    assert solve(again).value == pytest.approx(solve(mdp).value, abs=1e-12)
    pi = uniform_policy(mdp)
    assert evaluate(again, pi).value == pytest.approx(evaluate(mdp, pi).value, abs=1e-12)


def test_validation_names_the_problem():
    P = np.zeros((2, 2, 1, 2))
    P[0, :, 0, 0] = 0.5  # rows sum to 0.5
    with pytest.raises(ValueError, match="sum to 1"):
        TurnMDP.from_arrays(P, np.zeros((2, 2, 1)), np.array([1.0, 0.0]))
    with pytest.raises(ValueError, match="init"):
        TurnMDP.from_arrays(np.zeros((1, 2, 1, 2)), np.zeros((1, 2, 1)), np.array([0.7, 0.7]))
    with pytest.raises(ValueError, match="R must have shape"):
        TurnMDP.from_arrays(np.zeros((1, 2, 1, 2)), np.zeros((1, 2, 2)), np.array([1.0, 0.0]))
    with pytest.raises(ValueError, match="gamma"):
        random_mdp(0, gamma=1.5)


def test_arrays_are_read_only():
    mdp = random_mdp(0)
    with pytest.raises(ValueError):
        mdp.reward[0][0, 0] = 1.0


def test_tool_chain_optimum_is_every_right_tool():
    K, p = 5, 0.8
    mdp = tool_chain(num_turns=K, num_actions=3, p_advance=p, sharpness=1.0)
    # with sharpness 1, V* = E[(progress + 1)/K] where progress ~ Binomial(K−1, p)
    assert solve(mdp).value == pytest.approx(((K - 1) * p + 1) / K, abs=1e-12)
    # hiding the progress count (only the last feedback bit) can only lose value
    assert solve(mdp, last_feedback_psi(mdp)).value < solve(mdp).value - 1e-3
