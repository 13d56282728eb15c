"""The region_chain family and the tool-chain options (issue 12): w = 0 is exactly the tool chain, the
region bit is exogenous (no policy changes P(g)), a deterministic reward pays its mean exactly, and
early answers end episodes before K."""

from __future__ import annotations

import numpy as np
import pytest

from rtpo.scenario.load import load_scenario
from rtpo.tabular import evaluate, solve, uniform_policy
from rtpo.tabular.generators import region_chain, tool_chain


def _same_mdp(a, b):
    assert a.num_turns == b.num_turns
    for k in range(a.num_turns):
        np.testing.assert_array_equal(a.reward[k], b.reward[k])
    assert solve(a).value == pytest.approx(solve(b).value, abs=1e-12)


def test_w_zero_is_the_tool_chain():
    _same_mdp(region_chain(num_turns=4, w=0.0, bernoulli=True), tool_chain(num_turns=4))


@pytest.mark.parametrize("w", [0.3, 0.8])
def test_the_region_sets_a_share_w_of_the_value_whatever_the_policy(w):
    m = region_chain(num_turns=4, w=w)
    v_star, v_unif = solve(m).value, evaluate(m, uniform_policy(m)).value
    base = tool_chain(num_turns=4)
    # value = (1 − w) · tool-chain value + w · P(g = 1), for the optimal and the uniform policy alike
    assert v_star == pytest.approx((1 - w) * solve(base).value + w * 0.5, abs=1e-9)
    assert v_unif == pytest.approx((1 - w) * evaluate(base, uniform_policy(base)).value + w * 0.5, abs=1e-9)


def test_shipped_scenario_loads_and_solves():
    cfg = load_scenario("scenarios/tabular/region_chain.yaml")
    assert cfg.task.params.w == 0.8 and cfg.task.params.bernoulli is False
