"""region_chain, the tool chain's deterministic reward and early answers, and the shared-across-turns policy."""

import numpy as np

from rtpo.tabular.build import shared_features
from rtpo.tabular.generators import region_chain, tool_chain
from rtpo.tabular.solve import policy_value, solve, uniform_policy


def test_region_chain_w0_is_the_tool_chain_and_w_sets_the_region_share():
    a, b = tool_chain(num_turns=4, seed=3, bernoulli=False), region_chain(num_turns=4, seed=3, w=0.0)
    for k in range(4):
        assert np.array_equal(a.reward[k], b.reward[k]) and np.array_equal(a.prob[k], b.prob[k])
    w = 0.8
    r = region_chain(num_turns=4, seed=3, w=w)
    assert not r.bernoulli_rewards
    # the region bit is exogenous: V* and every policy's value are (1-w) * chain + w * p_region
    assert np.isclose(solve(r).value, (1 - w) * solve(a).value + w * 0.5)
    assert np.isclose(policy_value(r, uniform_policy(r)), (1 - w) * policy_value(a, uniform_policy(a)) + w * 0.5)


def test_early_answer_ends_episodes_before_k():
    m = tool_chain(num_turns=3, num_actions=3, early_answer=True)
    assert np.all(m.prob[0][:, 2].sum(axis=-1) == 0) and np.all(m.prob[0][:, :2].sum(axis=-1) == 1)


def test_shared_features_tie_turns():
    f = shared_features(3, 2, 2)
    assert np.array_equal(f[0, 1, 0, :4], f[2, 1, 0, :4]) and f.shape == (3, 2, 2, 4 + 6)
