"""The rollout driver and the RTPO method on the tabular backend."""

import numpy as np
import pytest

from rtpo.core import RunContext, methods, rollout
from rtpo.core.types import Generation, Ragged
from rtpo.tabular import (
    TabularEnv,
    TabularEvaluator,
    TurnMDP,
    evaluate,
    random_mdp,
    tool_chain,
    uniform_policy,
)
from tests._method_helpers import stack


def _stack(mdp, seed=0, lr=0.1):
    """(policy, env, sampler, learner) of the shared tabular stack (θ0 drawn from default_rng(seed))."""
    _, pol, ctx = stack(mdp, seed=seed, lr=lr)
    return pol, ctx.env, ctx.sampler, ctx.learner


def test_trunk_mean_return_matches_exact_value_within_hoeffding():
    mdp = random_mdp(3, num_turns=3, num_states=3, num_actions=2, end_prob=0.2, bernoulli_rewards=True)
    pol, env, sampler, _ = _stack(mdp)
    n = 20_000
    rng = np.random.default_rng(1)
    res = rollout(env, sampler, env.reset(np.zeros(n, np.int64), rng), np.zeros(n, np.int64), rng)
    mean = np.mean([t.ret for t in res.trajectories])
    exact = evaluate(mdp, uniform_policy(mdp)).value
    # returns lie in [0, K]; Hoeffding: P(|mean − exact| > t) <= 2 exp(−2 n t² / K²) = 1e-6
    K = mdp.num_turns
    tol = K * np.sqrt(np.log(2 / 1e-6) / (2 * n))
    assert abs(mean - exact) < tol


def test_fork_n_ways_from_snapshots_keeps_the_recorded_context():
    mdp = tool_chain(num_turns=4, num_actions=3, seed=2)
    _, env, sampler, _ = _stack(mdp)
    rng = np.random.default_rng(0)
    q = np.arange(5)
    trunks = rollout(env, sampler, env.reset(q, rng), q, rng, record_boundaries=True)
    b = [row[2] for row in trunks.boundaries]
    sibs = rollout(env, sampler, env.restore([x.snapshot for x in b]), q, rng, n=3)
    assert len(sibs.trajectories) == 15
    for i, s in enumerate(sibs.trajectories):
        assert s.start_turn == 2
        assert np.array_equal(s.contexts[0], b[i // 3].context)
        assert s.query_id == q[i // 3]
    assert sibs.turns == sum(s.num_turns for s in sibs.trajectories)


def test_restore_rejects_a_state_of_another_turn():
    mdp = tool_chain(num_turns=3, num_actions=2)
    env = TabularEnv(mdp)
    with pytest.raises(ValueError, match="does not belong"):
        env.restore([np.array([0, 5])])


def test_malformed_response_is_feedback_not_a_crash():
    mdp = tool_chain(num_turns=3, num_actions=2)
    env = TabularEnv(mdp)
    ep = env.reset(np.zeros(3, np.int64), np.random.default_rng(0))
    tokens = Ragged.from_rows([np.array([7]), np.array([0, 1]), np.array([1])], dtype=np.int64)
    gen = Generation(tokens, Ragged(np.zeros(4), tokens.offsets))
    _, out = env.step(ep, gen, np.random.default_rng(0))
    assert out.malformed.tolist() == [True, True, False]
    assert out.done[:2].all() and out.reward[:2].tolist() == [0.0, 0.0]


def test_rtpo_budget_ratio_and_phase_order():
    mdp = tool_chain(num_turns=4, num_actions=3, seed=1)
    _, env, sampler, learner = _stack(mdp)
    cls = methods.get("rtpo")
    G, trunks_per_query, Q = 4, 2, 6
    m = cls(cls.Config(G=G, trunks_per_query=trunks_per_query))
    ctx = RunContext(env, sampler, learner, np.random.default_rng(0))
    state = m.begin(ctx, np.arange(Q))
    turns = []
    while state.pending:
        met = m.phase(ctx, state)
        turns.append(met["phase/turn"])
        assert met["consistency/rollout_train_ratio"] == 1.0  # trains on the recorded c_k (Eq. 5, 18)
    assert turns == [3.0, 2.0, 1.0, 0.0]
    n_bound = sum(len(r) for r in state.data.tree.boundaries)
    assert n_bound == Q * trunks_per_query * 4  # tool_chain never ends early
    assert ctx.budget.rollouts == Q * trunks_per_query + (G - 1) * n_bound


def test_rtpo_learns_a_bandit():
    # K = 1: RTPO is one phase of sibling-baseline PPO on a 3-armed Bernoulli bandit
    P = np.zeros((1, 1, 3, 1))
    R = np.array([[[0.2, 0.8, 0.5]]])
    mdp = TurnMDP.from_arrays(P, R, np.array([1.0]), bernoulli_rewards=True)
    pol, env, sampler, learner = _stack(mdp, lr=0.3)
    cls = methods.get("rtpo")
    m = cls(cls.Config(G=8))
    ctx = RunContext(env, sampler, learner, np.random.default_rng(0))
    for _ in range(40):
        st = m.begin(ctx, np.arange(16))
        while st.pending:
            m.phase(ctx, st)
    assert pol.table(learner.weights())[0, 0].argmax() == 1
    assert TabularEvaluator(mdp, pol)(learner)["eval/value_over_v_star"] > 0.95


def test_method_registry():
    assert "rtpo" in methods.names()
    with pytest.raises(KeyError, match="valid: .*rtpo"):
        methods.get("ppo-but-not")
    with pytest.raises(ValueError, match="G must be"):
        methods.get("rtpo").Config(G=1)
    with pytest.raises(KeyError, match="unknown estimator"):
        methods.get("rtpo").Config(estimator="bogus")


def test_adam_phase_k_leaves_every_other_turn_untouched():
    """Algorithm 1 freezes turns > k while turn k trains; with one shared tensor Adam's momentum would
    keep moving them (FINDINGS #7).  The per-turn parameter groups make a phase move turn k only."""
    mdp = tool_chain(num_turns=3, num_actions=3, seed=2)
    _, env, sampler, learner = _stack(mdp, lr=0.1)
    cls = methods.get("rtpo")
    m = cls(cls.Config(G=4, epochs=2))
    ctx = RunContext(env, sampler, learner, np.random.default_rng(0))
    for _ in range(2):  # the second iteration starts with non-zero Adam moments on every turn
        st = m.begin(ctx, np.arange(16))
        while st.pending:
            before = learner.weights()
            k = int(m.phase(ctx, st)["phase/turn"])
            after = learner.weights()
            others = [j for j in range(mdp.num_turns) if j != k]
            assert np.array_equal(before[others], after[others])
            assert not np.array_equal(before[k], after[k])
