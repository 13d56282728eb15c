"""Reductions: one method collapses to another in a limiting configuration (STYLE: tests reduce one
function to another)."""

import numpy as np

from rtpo.core import estimators
from rtpo.core.methods.base import IterationState
from rtpo.core.methods.flat import FlatIteration, trajectory_path
from rtpo.core.methods.grpo import GRPO
from rtpo.core.methods.rtpo import RTPO
from rtpo.tabular import TurnMDP, tool_chain
from tests._method_helpers import make, run, stack


class _RecordingRTPO(RTPO):
    """RTPO that keeps the siblings each phase trains on (through the sibling_returns hook)."""

    seen: list

    def sibling_returns(self, ctx, state, k, siblings):
        self.seen = list(siblings)
        return super().sibling_returns(ctx, state, k, siblings)


def _bandit_k1():
    # K = 1, one state, three answers with success probabilities 0.2, 0.5, 0.9
    P = np.zeros((1, 1, 3, 1))
    R = np.array([[[0.2, 0.5, 0.9]]])
    return TurnMDP.from_arrays(P, R, np.array([1.0]), bernoulli_rewards=True)


def test_depth1_rtpo_tree_is_unnormalised_grpo_on_the_siblings():
    """K = 1: the G−1 siblings of the single boundary are G−1 independent answers to the prompt, the
    sibling baseline is their mean — GRPO's un-normalised advantage on the group of the siblings (not of
    the trunk: it is in no baseline) — and one update on them moves θ exactly as GRPO's does."""
    G = 5
    mdp = _bandit_k1()
    _, _, ctx_r = stack(mdp, seed=3)
    rtpo = _RecordingRTPO(RTPO.Config(G=G))
    state = rtpo.begin(ctx_r, np.arange(4))
    theta0 = ctx_r.learner.weights()
    m_r = rtpo.phase(ctx_r, state)
    sibs = rtpo.seen
    returns = np.array([s.ret for s in sibs]).reshape(4, G - 1)
    np.testing.assert_array_equal(
        estimators.sibling_advantage(returns), estimators.group_advantage(returns, normalize=False)
    )

    _, _, ctx_g = stack(mdp, seed=3)
    grpo = GRPO(GRPO.Config(G=G - 1, normalize=False))
    flat = IterationState(pending=["update"], data=FlatIteration([trajectory_path(s) for s in sibs], None, {}))
    np.testing.assert_array_equal(ctx_g.learner.weights(), theta0)
    m_g = grpo.phase(ctx_g, flat)
    np.testing.assert_allclose(ctx_g.learner.weights(), ctx_r.learner.weights(), rtol=0, atol=1e-12)
    assert m_g["adv/abs_mean"] == m_r["adv/abs_mean"]
    assert m_g["adv/zero_rate"] == m_r["adv/zero_rate"]
    assert m_g["loss/policy"] == m_r["loss/policy"]


def _params_after(name, iterations=3, **cfg):
    _, _, ctx = stack(tool_chain(num_turns=4, num_actions=3, seed=2), seed=7)
    metrics = run(make(name, **cfg), ctx, iterations)
    return ctx.learner.weights(), metrics, ctx.budget


def test_sync_every_phase_is_on_policy_rtpo():
    """G.6's endpoints: fixed-interval sync with interval 1, and KL-adaptive sync with threshold 0, are
    on-policy RTPO — ω̄ ≡ 1 after a sync, so the reweighted return is the plain return, bit for bit."""
    ref, ref_m, ref_b = _params_after("rtpo", G=3)
    for name, cfg in (
        ("rtpo_sync_interval", {"sync_every": 1}),
        ("rtpo_sync_kl", {"kl_threshold": 0.0}),
        ("rtpo_multitrunk", {"candidates": 1}),
    ):
        got, got_m, got_b = _params_after(name, G=3, **cfg)
        np.testing.assert_array_equal(got, ref, err_msg=name)
        assert got_b == ref_b
        assert [m["return/mean"] for m in got_m if "return/mean" in m] == [
            m["return/mean"] for m in ref_m if "return/mean" in m
        ]


def test_gspo_on_single_token_rows_is_grpo_with_sequence_mean():
    """One row per sequence and one token per row (K = 1): the sequence ratio is the token ratio and the
    sequence-mean of token-means is the token-mean, so GSPO and GRPO make the same update."""
    mdp = _bandit_k1()
    out = []
    for name in ("grpo", "gspo"):
        _, _, ctx = stack(mdp, seed=5)
        run(make(name, G=4, epochs=2), ctx, 3)
        out.append(ctx.learner.weights())
    np.testing.assert_allclose(out[0], out[1], atol=1e-12)


def test_tree_grpo_without_expansions_is_normalised_grpo():
    """L = 0: M trees of one leaf each; the tree term of the advantage is 0 and the prompt term is GRPO's
    normalised advantage over the M leaves, so Tree-GRPO makes GRPO's update with G = M."""
    mdp = tool_chain(num_turns=3, num_actions=3, seed=1)
    _, _, ctx_t = stack(mdp, seed=11)
    m_t = run(make("tree_grpo", M=4, N=0, L=0), ctx_t, 1)[0]
    _, _, ctx_g = stack(mdp, seed=11)
    m_g = run(make("grpo", G=4), ctx_g, 1)[0]
    np.testing.assert_allclose(ctx_t.learner.weights(), ctx_g.learner.weights(), atol=1e-12)
    assert m_t["return/mean"] == m_g["return/mean"]
