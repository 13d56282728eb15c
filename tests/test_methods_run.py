"""Every registered method runs on the tabular backend with sane metrics and exact budget accounting,
and the structural properties of each baseline hold on real rollouts."""

import numpy as np
import pytest

from rtpo.core import methods
from rtpo.core.types import Ragged
from rtpo.tabular import TabularEvaluator, tool_chain
from tests._method_helpers import make, run, stack

K, Q = 3, 4
CONFIGS = {
    "rtpo": {"G": 3},
    "grpo": {"G": 8},
    "gspo": {"G": 8},
    "seeupo": {"G": 8},
    "tree_grpo": {"M": 2, "N": 3, "L": 1},
    "arpo": {"M": 8, "N": 4},
    "rtpo_offpolicy": {"G": 3},
    "rtpo_sync_interval": {"G": 3, "sync_every": 2},
    "rtpo_sync_kl": {"G": 3, "kl_threshold": 1e-3},
    "rtpo_multitrunk": {"G": 3, "candidates": 3},
    "refuel": {"eta": 1.0, "pairs_per_query": 4},
    "rtpo_adaptive": {"G": 3},
}


def test_every_method_of_the_comparison_set_is_registered():
    assert set(CONFIGS) <= set(methods.names())


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_method_runs_improves_and_accounts_its_budget(name):
    mdp, pol, ctx = stack(K=K, seed=0, lr=0.2)
    ev = TabularEvaluator(mdp, pol)
    v0 = ev(ctx.learner)["eval/value"]
    m = make(name, **CONFIGS[name])
    iters = 12
    metrics = run(m, ctx, iters, queries=Q)
    # tool_chain episodes never end early, so the planned rollouts are exactly the generated ones
    assert ctx.budget.rollouts == m.rollouts_per_query(K) * Q * iters
    assert ctx.budget.turns == ctx.budget.tokens  # one token per tabular turn
    assert ctx.budget.turns <= ctx.budget.rollouts * K
    for met in metrics:
        assert all(np.isfinite(v) for v in met.values()), met
        if "adv/zero_rate" in met:
            assert 0.0 <= met["adv/zero_rate"] <= 1.0
    v1 = ev(ctx.learner)["eval/value"]
    assert v1 > v0 + 0.05, (name, v0, v1)


def test_leave_one_out_rtpo_runs_and_scales_the_sibling_advantage():
    """SPEC §6: the leave-one-out baseline is the sibling advantage times n/(n−1); on RTPO's phases the
    logged |A| reflects that factor on identical rollouts (same seed, phase K−1 comes first)."""
    out = {}
    for est in ("sibling_mean", "leave_one_out"):
        _, _, ctx = stack(K=K, seed=4)
        m = make("rtpo", G=4, estimator=est)
        state = m.begin(ctx, np.arange(Q))
        out[est] = m.phase(ctx, state)
    n = 3
    assert out["leave_one_out"]["return/mean"] == out["sibling_mean"]["return/mean"]
    np.testing.assert_allclose(out["leave_one_out"]["adv/abs_mean"], n / (n - 1) * out["sibling_mean"]["adv/abs_mean"])


def test_grpo_rows_are_one_sequence_per_trajectory_with_its_advantage():
    _, _, ctx = stack(K=K, seed=1)
    g = make("grpo", G=4, normalize=False)
    state = g.begin(ctx, np.arange(2))
    from rtpo.core.methods.flat import flat_batch, path_return

    paths = state.data.paths
    returns = np.array([path_return(p) for p in paths]).reshape(2, 4)
    adv = returns - returns.mean(axis=1, keepdims=True)
    batch = flat_batch(paths, adv.reshape(-1), "auto")
    assert len(batch) == 8 * K
    np.testing.assert_array_equal(batch.seq_id, np.repeat(np.arange(8), K))
    np.testing.assert_array_equal(batch.turn, np.tile(np.arange(K), 8))
    np.testing.assert_array_equal(batch.advantages.values, np.repeat(adv.reshape(-1), K))


def test_full_history_training_breaks_the_ratio_rtpo_keeps_it_exactly_one():
    """MM1 / Eq. 2, 10 on the methods: under a truncating ψ, GRPO trained on full-history contexts sees
    a rollout/train ratio ≠ 1 once θ has moved; RTPO, training on the recorded c_k, stays exactly 1."""
    mdp, _, ctx = stack(K=4, seed=2, truncate=True)
    g = run(make("grpo", G=8, train_context="full_history"), ctx, 6)
    assert g[0]["consistency/rollout_train_ratio"] == 1.0  # θ = θ0 = 0: both views uniform
    assert abs(g[-1]["consistency/rollout_train_ratio"] - 1.0) > 1e-3
    _, _, ctx = stack(K=4, seed=2, truncate=True)
    r = run(make("rtpo", G=3), ctx, 6)
    assert all(m["consistency/rollout_train_ratio"] == 1.0 for m in r if "consistency/rollout_train_ratio" in m)
    # train_context="rollout" on the same environment has no mismatch either
    _, _, ctx = stack(K=4, seed=2, truncate=True)
    g2 = run(make("grpo", G=8, train_context="rollout"), ctx, 6)
    assert all(m["consistency/rollout_train_ratio"] == 1.0 for m in g2)


def test_full_history_needs_an_environment_that_exposes_it():
    _, _, ctx = stack(K=K, seed=0)
    with pytest.raises(ValueError, match="full_contexts"):
        run(make("grpo", G=4, train_context="full_history"), ctx, 1)


def test_history_features_share_theta_between_views():
    from rtpo.tabular.history import FullHistoryEnv, history_policy

    mdp, pol, ctx = stack(K=3, seed=0, truncate=True)
    env = ctx.env
    assert isinstance(env, FullHistoryEnv)
    C = mdp.num_contexts
    rng = np.random.default_rng(0)
    theta = rng.standard_normal(pol.dim)
    table = pol.table(theta)  # (K, C + S, A)
    # full context of state s at turn k: logits = rollout logits of ψ_k(s) + the history weights
    d_e = mdp.num_turns * C * mdp.num_actions
    h = theta[d_e:].reshape(mdp.num_turns, -1, mdp.num_actions)
    e = theta[:d_e].reshape(mdp.num_turns, C, mdp.num_actions)
    for k in range(1, mdp.num_turns):  # turn 0 has an injective ψ (one state per ok bit)
        for s in range(mdp.num_states[k]):
            logits = e[k, mdp.psi[k][s]] + h[k, s]
            p = np.exp(logits - logits.max())
            np.testing.assert_allclose(table[k, C + s], p / p.sum(), rtol=1e-10)
    ep = env.reset(np.zeros(3, np.int64), rng)
    np.testing.assert_array_equal(env.full_contexts(ep).values, env.contexts(ep).values)  # turn 0 coincides
    assert history_policy(mdp).num_contexts == C + max(mdp.num_states)


def test_seeupo_never_syncs_and_updates_m_from_the_turn_ratio():
    _, _, ctx = stack(K=K, seed=3, lr=0.3)
    s = make("seeupo", G=8)
    state = s.begin(ctx, np.arange(8))
    assert np.ptp(state.data.returns) > 0  # some advantage is non-zero, so θ moves
    sampler_theta = ctx.sampler._params.clone()
    turns = []
    while state.pending:
        met = s.phase(ctx, state)
        turns.append(met["phase/turn"])
        assert met["phase/synced"] == 0.0
    assert turns == [2.0, 1.0, 0.0]
    assert (ctx.sampler._params == sampler_theta).all()  # no sync inside the iteration
    m = state.data.m
    assert np.all((m >= 0.8) & (m <= 1.2)) and np.any(m != 1.0)


def test_tree_grpo_paths_share_their_parents_prefix():
    mdp = tool_chain(num_turns=4, num_actions=3, seed=0)
    _, _, ctx = stack(mdp, seed=5)
    t = make("tree_grpo", M=3, N=2, L=2)
    state = t.begin(ctx, np.arange(2))
    paths = state.data.paths
    assert len(paths) == 2 * 3 * (2 * 2 + 1)
    assert ctx.budget.rollouts == len(paths)
    for p in paths:
        turns = [tr.start_turn + j for tr, j in p]
        assert turns == list(range(4))  # every leaf path is a full root-to-leaf episode
        # rows before the fork come from earlier rollouts (shared prefix), later rows from the leaf's own
        own = p[-1][0]
        assert all(tr is own for tr, j in p if tr.start_turn + j >= own.start_turn)
        assert all(tr is not own for tr, j in p if tr.start_turn + j < own.start_turn)
    # the generated turns are only the new ones: a fork does not regenerate its prefix
    assert ctx.budget.turns == sum(p[-1][0].num_turns for p in paths)


def test_arpo_branches_fill_the_budget_and_keep_prefixes():
    mdp = tool_chain(num_turns=4, num_actions=3, seed=0)
    # tau = 1 (the stochastic rule's threshold): P = 1 at every boundary -> every initial rollout
    # branches at boundary 1 (after turn 0)
    _, _, ctx = stack(mdp, seed=6)
    a = make("arpo", M=8, N=3, tau=1.0, beta=0.0)
    state = a.begin(ctx, np.arange(2))
    paths = state.data.paths
    assert len(paths) == 16 and ctx.budget.rollouts == 16
    assert state.data.metrics["arpo/branches_per_query"] == 3.0
    branched = [p for p in paths if p[0][0] is not p[-1][0]]
    assert len(branched) == 6
    for p in branched:
        assert p[0][0].start_turn == 0 and p[-1][0].start_turn == 1 and len(p) == 4
    # tau = 0 (and beta = 0): never branch, the budget is filled with fresh rollouts
    _, _, ctx = stack(mdp, seed=6)
    state = make("arpo", M=8, N=3, tau=0.0, beta=0.0).begin(ctx, np.arange(2))
    assert state.data.metrics["arpo/branches_per_query"] == 0.0
    assert all(p[0][0] is p[-1][0] for p in state.data.paths) and len(state.data.paths) == 16
    # paths of one query are contiguous, M per query
    q = [p[0][0].query_id for p in state.data.paths]
    assert q == [0] * 8 + [1] * 8


def test_arpo_needs_the_samplers_entropy():
    _, _, ctx = stack(K=K, seed=0)

    class Plain:
        def __init__(self, inner):
            self.inner = inner

        def generate(self, *a):
            return self.inner.generate(*a)

        def load_weights(self, w):
            self.inner.load_weights(w)

    ctx.sampler = Plain(ctx.sampler)
    with pytest.raises(TypeError, match="normalized_entropy"):
        make("arpo").begin(ctx, np.arange(2))


def test_tabular_entropy_is_normalised():
    _, _, ctx = stack(K=K, seed=0)
    c = Ragged.from_dense(np.array([[0, 0], [1, 1]]))
    np.testing.assert_allclose(ctx.sampler.normalized_entropy(c, np.array([0, 1])), 1.0)  # θ0 = 0: uniform


def test_off_policy_weight_is_one_before_any_update_and_moves_after():
    _, _, ctx = stack(tool_chain(num_turns=4, num_actions=2, seed=0), seed=8, lr=0.5)
    m = make("rtpo_offpolicy", G=3, rho_min=0.0, rho_max=1e9)
    state = m.begin(ctx, np.arange(16))
    first = m.phase(ctx, state)  # phase K−1: no continuation, nothing trained yet
    assert first["offpolicy/omega_mean"] == 1.0 and first["phase/synced"] == 0.0
    assert first["adv/abs_mean"] > 0  # the turn-(K−1) update did move θ
    second = m.phase(ctx, state)  # phase K−2: the turn-(K−1) policy has moved, the θ0 continuation is stale
    assert second["offpolicy/omega_mean"] != 1.0
    # the same budget as on-policy RTPO: trunk + (G−1) siblings per boundary, generated up front
    assert ctx.budget.rollouts == m.rollouts_per_query(4) * 16


def test_kl_sync_skips_syncs_below_threshold_and_logs_the_estimate():
    _, _, ctx = stack(K=4, seed=9, lr=0.3)
    never = run(make("rtpo_sync_kl", G=3, kl_threshold=1e9), ctx, 2)
    assert all(m["phase/synced"] == 0.0 for m in never)
    assert max(m["sync/kl_estimate"] for m in never) > 0.0
    _, _, ctx = stack(K=4, seed=9, lr=0.3)
    every2 = run(make("rtpo_sync_interval", G=3, sync_every=2), ctx, 1)
    assert [m["phase/synced"] for m in every2] == [1.0, 0.0, 1.0, 0.0]


@pytest.mark.parametrize(
    "name,bad",
    [
        ("grpo", {"G": 1}),
        ("grpo", {"train_context": "summary"}),
        ("seeupo", {"m_eps": 1.5}),
        ("tree_grpo", {"M": 1, "L": 0}),
        ("arpo", {"N": 20}),
        ("rtpo_offpolicy", {"rho_min": 3.0}),
        ("rtpo_sync_interval", {"sync_every": 0}),
        ("rtpo_sync_kl", {"kl_threshold": -1.0}),
        ("rtpo_multitrunk", {"candidates": 1, "trunks_per_query": 2}),
        ("rtpo_multitrunk", {"select": "best"}),
    ],
)
def test_bad_config_names_the_field(name, bad):
    cls = methods.get(name)
    with pytest.raises(ValueError, match=list(bad)[0]):
        cls.Config(**bad)
