"""T2b, Eq. 58/72: the solver's per-turn decomposition Var(R) = E[Var(R | S_k, u)] + Var(A_k) + σ_V²(k)
(rtpo.tabular.diagnostic.decompose) against brute force: every trajectory of a tiny MDP (every start
state, action, Bernoulli reward outcome and successor) is enumerated with its probability, histories
are grouped by their prefix up to boundary k, and every term is computed from the definitions, to 1e-12.

The MDPs have everything the forward pass must carry: γ < 1 with token durations τ > 1 (a history's
discount γ^{D_k} varies), rewards on continuing rows (a history's return so far varies), Bernoulli
rewards, episodes that end before K, an aliasing ψ and a non-uniform policy.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from rtpo.tabular import random_mdp
from rtpo.tabular.diagnostic import decompose
from rtpo.tabular.generators import region_chain
from rtpo.tabular.tasks import modulo_psi

TOL = 1e-12


def _trajectories(mdp, pi):
    """Every complete trajectory: (probability, return, [(history key at boundary k, action u_k)])."""
    K, A = mdp.num_turns, mdp.num_actions
    out = []

    def walk(k, s, prob, ret, disc, hist, steps):
        p_u = pi[k][mdp.psi[k][s]]
        for u in range(A):
            if p_u[u] <= 0:
                continue
            r = float(mdp.reward[k][s, u])
            rewards = [(1.0, r), (0.0, 1.0 - r)] if mdp.bernoulli_rewards else [(r, 1.0)]
            here = (*hist, ("s", k, s))
            step = steps + [(here, u)]
            for rr, pr in rewards:
                if pr <= 0:
                    continue
                ret2, disc2 = ret + disc * rr, disc * mdp.gamma ** int(mdp.tau[k][s, u])
                h2 = (*here, ("u", u), ("r", rr))
                row = mdp.prob[k][s, u] if k < K - 1 else np.zeros(1)
                if row.sum() <= 0:
                    out.append((prob * p_u[u] * pr, ret2, step, h2))
                    continue
                for b in np.flatnonzero(row > 0):
                    walk(k + 1, int(mdp.succ[k][s, u, b]), prob * p_u[u] * pr * row[b], ret2, disc2, h2, step)

    for s0 in np.flatnonzero(np.asarray(mdp.init) > 0):
        walk(0, int(s0), float(mdp.init[s0]), 0.0, 1.0, (), [])
    return out


def _brute(mdp, pi):
    trajs = _trajectories(mdp, pi)
    p = np.array([t[0] for t in trajs])
    R = np.array([t[1] for t in trajs])
    assert abs(p.sum() - 1.0) < TOL
    mu = float(p @ R)
    terms = defaultdict(list)
    for k in range(mdp.num_turns):
        # history key at k: the live prefix, or ("end", whole history) for an episode that already ended
        hkey = [t[2][k][0] if len(t[2]) > k else ("end", t[3]) for t in trajs]
        live = np.array([len(t[2]) > k for t in trajs])
        hu = [(h, t[2][k][1]) if lv else (h, None) for h, t, lv in zip(hkey, trajs, live)]

        def cond_mean(keys):
            num, den = defaultdict(float), defaultdict(float)
            for key, pi_, r in zip(keys, p, R):
                num[key] += pi_ * r
                den[key] += pi_
            return np.array([num[key] / den[key] for key in keys])

        q_h, v_h = cond_mean(hu), cond_mean(hkey)  # E[R | H_k, u], E[R | H_k]
        adv = q_h - v_h
        terms["live"].append(float(p[live].sum()))
        terms["downstream"].append(float(p @ (R - q_h) ** 2))
        terms["var_adv"].append(float(p @ adv**2))
        terms["sigma_v2"].append(float(p @ (v_h - mu) ** 2))
        terms["centred_live"].append(float(p[live] @ (R[live] - mu) ** 2))
        # the information shares from their definition: squared correlation of Y with A_k given live
        pl, al = p[live] / p[live].sum(), adv[live]
        for name, y in (("rho2_grpo", R[live] - mu), ("rho2_sibling", R[live] - v_h[live])):
            ey2, ea2 = pl @ y**2, pl @ al**2
            terms[name].append(float((pl @ (y * al)) ** 2 / (ey2 * ea2)) if ey2 * ea2 > 0 else 0.0)
    return mu, float(p @ (R - mu) ** 2), {k: np.array(v) for k, v in terms.items()}


def _cases():
    rng = np.random.default_rng(7)
    for seed in range(3):
        mdp = random_mdp(
            seed, num_turns=3, num_states=3, num_actions=2, gamma=0.9, max_tau=2, end_prob=0.3, bernoulli_rewards=True
        )
        mdp = mdp.with_psi(modulo_psi(mdp, 2))
        pi = rng.dirichlet(np.ones(mdp.num_actions), size=(mdp.num_turns, mdp.num_contexts))
        yield mdp, pi
    chain = region_chain(num_turns=3, num_actions=3, seed=1, w=0.8, early_answer=True)
    yield chain, np.full((chain.num_turns, chain.num_contexts, chain.num_actions), 1.0 / chain.num_actions)


def test_T2b_variance_decomposition_by_enumeration_eq58():
    """T2b, Eq. 58/72: each term of decompose() equals its brute-force value, the terms sum to Var(R) at
    every k, and the information shares are the squared correlations they are defined as."""
    for mdp, pi in _cases():
        dec = decompose(mdp, pi)
        mu, var, bf = _brute(mdp, pi)
        assert abs(dec.mean_return - mu) < TOL and abs(dec.var_return - var) < TOL
        for name in ("live", "downstream", "var_adv", "sigma_v2", "centred_live"):
            np.testing.assert_allclose(getattr(dec, name), bf[name], rtol=0, atol=TOL, err_msg=name)
        np.testing.assert_allclose(dec.downstream + dec.var_adv + dec.sigma_v2, var, rtol=0, atol=TOL)
        np.testing.assert_allclose(dec.rho2_grpo, bf["rho2_grpo"], rtol=0, atol=1e-10)
        np.testing.assert_allclose(dec.rho2_sibling, bf["rho2_sibling"], rtol=0, atol=1e-10)
        assert np.all(bf["sigma_v2"][1:] > 1e-6)  # the cases exercise the cross-state term


def test_T2b_information_index_regimes():
    """The index sides with Thm 2(b): a region bit that sets most of a deterministic reward (σ_V² large)
    puts RTPO ahead per rollout; the Bernoulli tool chain (σ_V² a few % of Var(R)) puts GRPO ahead."""
    from rtpo.tabular import tool_chain

    rich = region_chain(num_turns=6, num_actions=4, seed=0, w=0.8)
    poor = tool_chain(num_turns=6, num_actions=4, seed=0)
    uni = lambda m: np.full((m.num_turns, m.num_contexts, m.num_actions), 1.0 / m.num_actions)  # noqa: E731
    d_rich, d_poor = decompose(rich, uni(rich)), decompose(poor, uni(poor))
    assert d_rich.info_index(3) > 1 > d_poor.info_index(3)
    assert np.max(d_poor.sigma_v2 / d_poor.var_return) < 0.15 < np.min(d_rich.sigma_v2[1:] / d_rich.var_return)
