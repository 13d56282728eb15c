"""rtpo_adaptive (G.9 adaptive sibling allocation): the Beta tie algebra by hand, the allocation against
brute force, the two reductions to fixed-G RTPO draw for draw, the posterior bookkeeping, the spend,
and a resumed run that allocates as the uninterrupted one."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rtpo.core.methods.rtpo_adaptive import (
    RTPOAdaptive,
    allocate,
    beta_moment,
    informative_table,
    ragged_advantages,
    state_keys,
)
from rtpo.core.metrics import reproducible
from rtpo.core.types import Ragged
from rtpo.rundir.runner import run_scenario
from rtpo.scenario.load import load_scenario
from rtpo.tabular import tool_chain
from tests._method_helpers import make, run, stack


def test_beta_moments_and_informative_probability_by_hand():
    # E[p^2] under Beta(2, 3) = (2/5)(3/6); Beta(1, 1): E[p^n] = 1/(n+1)
    assert beta_moment(2.0, 3.0, 2) == pytest.approx(0.2)
    assert beta_moment(1.0, 1.0, 3) == pytest.approx(0.25)
    # by quadrature of the Beta(2, 3) density 12 p (1-p)^2
    p = np.linspace(0.0, 1.0, 200_001)
    assert beta_moment(2.0, 3.0, 4) == pytest.approx(np.trapezoid(p**4 * 12 * p * (1 - p) ** 2, p), abs=1e-9)
    # Beta(1, 1): P_tie(n) = 2/(n+1), so I = 0, 0, 1/3, 1/2, 3/5
    np.testing.assert_allclose(informative_table(np.array([1.0]), np.array([1.0]), 4)[0], [0, 0, 1 / 3, 1 / 2, 3 / 5])
    # I(2) = 2 E[p(1-p)], I(3) = 3 E[p(1-p)] for any Beta (the identity behind the even allocation)
    a, b = np.array([0.3, 2.0, 7.5]), np.array([1.7, 0.4, 2.5])
    epq = beta_moment(a, b, 1) - beta_moment(a, b, 2)
    table = informative_table(a, b, 3)
    np.testing.assert_allclose(table[:, 2], 2 * epq)
    np.testing.assert_allclose(table[:, 3], 3 * epq)


def test_allocation_by_hand_moves_siblings_off_a_state_predicted_to_fail():
    # state 0: Beta(1, 19) (19 failures seen), state 1: Beta(1, 1); budget 4 = fixed G = 3 on 2 boundaries.
    # I_0(2) = 1 - (1/20)(2/21) - (19/20)(20/21) = 38/420; I_1 = 1/3, 1/2, 3/5 at n = 2, 3, 4.
    # [2, 2]: 38/420 + 1/3 = 0.424; [0, 4]: 3/5 = 0.6 (the best of the allocations of 4)
    a, b = np.array([1.0, 1.0]), np.array([19.0, 1.0])
    table = informative_table(a, b, 4)
    assert table[0, 2] == pytest.approx(38 / 420)
    np.testing.assert_array_equal(allocate(a, b, 4, 4), [0, 4])
    # capped at G-1 = 2 the capacity is the budget: fixed G
    np.testing.assert_array_equal(allocate(a, b, 4, 2), [2, 2])
    # one shared posterior: the even allocation, though [3, 3, 0] ties it (I(3) + I(3) = 3 I(2))
    np.testing.assert_array_equal(allocate(np.ones(3), np.ones(3), 6, 4), [2, 2, 2])


@given(
    st.integers(1, 4),
    st.integers(3, 5),
    st.integers(0, 3),
    st.lists(st.floats(0.05, 20.0), min_size=8, max_size=8),
)
def test_allocation_is_the_exact_optimum_and_spends_the_whole_budget(m, G, extra, ab):
    cap = G - 1 + extra
    a, b = np.array(ab[:m]), np.array(ab[4 : 4 + m])
    budget = (G - 1) * m
    counts = allocate(a, b, budget, cap)
    assert counts.sum() == budget
    assert np.all((counts == 0) | ((counts >= 2) & (counts <= cap)))
    table = informative_table(a, b, cap)
    rows = np.arange(m)
    best = max(
        table[rows, list(x)].sum() for x in itertools.product([0, *range(2, cap + 1)], repeat=m) if sum(x) == budget
    )
    got = table[rows, counts].sum()
    assert got == pytest.approx(best, abs=1e-7)
    assert got >= table[rows, np.full(m, G - 1)].sum() - 1e-12  # never worse than fixed G
    # on boundaries sharing one posterior: fixed G exactly
    np.testing.assert_array_equal(allocate(np.full(m, a[0]), np.full(m, b[0]), budget, cap), np.full(m, G - 1))


def test_ragged_advantages_are_the_sibling_mean_per_group():
    returns = np.array([1.0, 0.0, 0.5, 0.5, 0.5, 0.0, 0.0, 1.0, 1.0])
    adv, zero = ragged_advantages("sibling_mean", returns, np.array([2, 3, 4]))
    np.testing.assert_allclose(adv, [0.5, -0.5, 0, 0, 0, -0.5, -0.5, 0.5, 0.5])
    np.testing.assert_array_equal(zero, [False, True, False])


def _params(ctx):
    return np.asarray(ctx.learner.weights(), dtype=np.float64).copy()


@pytest.mark.parametrize("columnar", [True, False])
def test_capped_at_g_minus_one_it_is_fixed_g_rtpo_draw_for_draw(columnar):
    out = {}
    for name, kw in (("rtpo", {}), ("rtpo_adaptive", {"max_siblings": 2})):
        _, _, ctx = stack(K=3, seed=3, lr=0.2)
        ctx.columnar = columnar
        out[name] = (run(make(name, G=3, **kw), ctx, 4), _params(ctx))
    np.testing.assert_array_equal(out["rtpo"][1], out["rtpo_adaptive"][1])
    for m_fixed, m_adapt in zip(out["rtpo"][0], out["rtpo_adaptive"][0], strict=True):
        assert {k: v for k, v in m_adapt.items() if not k.startswith("alloc/")} == m_fixed


def test_at_one_turn_from_one_start_state_it_is_fixed_g_rtpo():
    """K = 1: every boundary is the start state, so all share one posterior and the even allocation is
    optimal (I(2) = 2·E[p(1−p)], I concave on {0, 2, 3, ...}); with the default cap 2(G−1) it still
    forks G−1 siblings everywhere, whatever the posterior has learnt."""
    out = {}
    for name in ("rtpo", "rtpo_adaptive"):
        mdp = tool_chain(num_turns=1, num_actions=3, seed=1)
        _, _, ctx = stack(mdp=mdp, seed=5, lr=0.3)
        out[name] = (run(make(name, G=5), ctx, 6), _params(ctx))
    np.testing.assert_array_equal(out["rtpo"][1], out["rtpo_adaptive"][1])
    assert all(m["alloc/max_group"] == 4 and m["alloc/skipped_rate"] == 0 for m in out["rtpo_adaptive"][0])


def test_it_reallocates_spends_fixed_g_budget_and_lowers_the_tie_rate():
    """On a 4-turn tool chain the posteriors learn which boundary states tie: the adaptive variant skips
    some boundaries, spends exactly fixed G's rollouts, and a smaller share of its siblings sits in tied
    groups than fixed G's over the same number of iterations."""
    share = {}
    spend = {}
    for name in ("rtpo", "rtpo_adaptive"):
        _, _, ctx = stack(K=4, seed=0, lr=0.3)
        metrics = run(make(name, G=3), ctx, 15, queries=8)
        spend[name] = ctx.budget.rollouts
        share[name] = np.mean([m["adv/zero_rollout_share"] for m in metrics if "adv/zero_rollout_share" in m])
        if name == "rtpo_adaptive":
            assert max(m["alloc/skipped_rate"] for m in metrics) > 0
            assert max(m["alloc/max_group"] for m in metrics) > 2
    assert spend["rtpo"] == spend["rtpo_adaptive"] == 8 * (1 + 2 * 4) * 15
    assert share["rtpo_adaptive"] < share["rtpo"], share


def test_fixed_g_weighting_reaches_the_batch_and_equals_per_group_where_groups_are_g_minus_one(monkeypatch):
    """weighting=fixed_g: every trained row of a group of n carries (G−1)·c(G−1)/(n·c(n)) = (G−2)/(n−1)
    (sibling_mean, c(n) = 1 − 1/n) as its surrogate weight; the per_group default trains with weight 1.
    Capped at G − 1 every group has G − 1 siblings, so the two weightings train identical parameters."""
    from rtpo.core.methods import reverse

    seen = []
    real = reverse.turn_rows

    def spy(trajs, offsets, adv, seq_id=None, weight=None):
        seen.append(None if weight is None else np.asarray(weight))
        return real(trajs, offsets, adv, seq_id, weight)

    monkeypatch.setattr(reverse, "turn_rows", spy)
    _, _, ctx = stack(K=4, seed=0, lr=0.3)
    metrics = run(make("rtpo_adaptive", G=3, weighting="fixed_g"), ctx, 6, queries=8)
    weights = np.concatenate([w for w in seen if w is not None])
    assert len(seen) > 0 and all(w is not None for w in seen), "fixed_g must pass a weight for every phase"
    sizes = [m["alloc/max_group"] for m in metrics if "alloc/max_group" in m]
    assert max(sizes) > 2, "the run must allocate unequal groups for the weighting to matter"
    allowed = {1.0 / (n - 1) for n in range(2, 5)}  # (G − 2)/(n − 1) at G = 3, n ≤ cap = 4
    assert set(np.round(weights, 12)) <= {round(a, 12) for a in allowed}, set(weights)
    assert np.any(weights < 1.0), "a group larger than G − 1 must be down-weighted"
    seen.clear()
    params = {}
    for weighting in ("per_group", "fixed_g"):
        _, _, ctx = stack(K=3, seed=3, lr=0.2)
        run(make("rtpo_adaptive", G=3, max_siblings=2, weighting=weighting), ctx, 3)
        params[weighting] = _params(ctx)
    np.testing.assert_array_equal(params["per_group"], params["fixed_g"])


def test_posterior_counts_trunk_and_sibling_outcomes_and_forgets():
    m = make("rtpo_adaptive", G=3, forget=0.5, reward_low=0.0, reward_high=2.0)
    keys = state_keys(1, Ragged.from_rows([np.array([1, 7]), np.array([1, 8])], dtype=np.int64))
    assert keys[0] != keys[1] and state_keys(2, Ragged.from_rows([np.array([1, 7])]))[0] != keys[0]
    m.observe([keys[0], keys[0], keys[1]], np.array([2.0, 0.5, -1.0]))  # outcomes 1, 0.25, 0 (clipped)
    a, b = m.posterior(keys)
    np.testing.assert_allclose(a, [1 + 1.25, 1 + 0.0])
    np.testing.assert_allclose(b, [1 + 0.75, 1 + 1.0])
    _, _, ctx = stack(K=2, seed=0)
    m.begin(ctx, np.arange(1))  # a new iteration halves what was seen
    np.testing.assert_allclose(m.posterior(keys)[0], [1 + 0.625, 1.0])
    # the store round-trips and refuses a malformed one
    fresh = RTPOAdaptive(m.cfg)
    fresh.load_state_dict(m.state_dict())
    assert fresh.counts.keys() == m.counts.keys()
    with pytest.raises(ValueError, match="rtpo_adaptive"):
        fresh.load_state_dict({"oops": 1})


def test_config_refuses_what_cannot_work():
    for kw, msg in (
        ({"G": 2}, "G >= 3"),
        ({"G": 4, "max_siblings": 2}, "max_siblings"),
        ({"prior_a": 0.0}, "prior_a"),
        ({"forget": 1.5}, "forget"),
        ({"reward_low": 1.0, "reward_high": 1.0}, "reward_high"),
        ({"weighting": "both"}, "weighting must be one of"),
        ({"weighting": "fixed_g", "estimator": "group_norm"}, "linear in the returns"),
    ):
        with pytest.raises(ValueError, match=msg):
            make("rtpo_adaptive", **kw)


ADAPTIVE = [
    "method.name=rtpo_adaptive",
    "method.G=3",
    "method.epochs=1",
    "budget.iterations=3",
    "budget.queries_per_iteration=8",
    "logging.plot=false",
    "logging.checkpoint_every=1",
]


def test_a_resumed_run_allocates_as_the_uninterrupted_one(tmp_path, monkeypatch):
    """Crash inside iteration 2: the resume restores the posterior store (Method.state_dict in the
    checkpoint), so its metrics equal the uninterrupted run's.  Mutant: a resume that drops the store
    (load_state_dict a no-op) allocates differently."""

    def untimed(metrics):
        return [reproducible(m) for m in metrics]  # rtpo.core.metrics: the wall-clock keys left out

    cfg = load_scenario(None, ADAPTIVE)
    full = run_scenario(cfg, out_root=tmp_path / "a", progress=False)
    K = cfg.task.params.num_turns
    real = RTPOAdaptive.phase

    def resume_after_crash(root, load=RTPOAdaptive.load_state_dict):
        calls = {"n": 0}

        def crashing(self, ctx, state):
            calls["n"] += 1
            if calls["n"] == K + 2:  # the second phase of iteration 2
                raise RuntimeError("simulated crash")
            return real(self, ctx, state)

        monkeypatch.setattr(RTPOAdaptive, "phase", crashing)
        with pytest.raises(RuntimeError, match="simulated crash"):
            run_scenario(cfg, out_root=root, progress=False)
        monkeypatch.setattr(RTPOAdaptive, "phase", real)
        monkeypatch.setattr(RTPOAdaptive, "load_state_dict", load)
        (run_dir,) = root.iterdir()
        return run_scenario(None, resume=run_dir, progress=False)

    assert untimed(resume_after_crash(tmp_path / "b").metrics) == untimed(full.metrics)
    dropped = resume_after_crash(tmp_path / "c", load=lambda self, state: None)
    assert untimed(dropped.metrics) != untimed(full.metrics)
