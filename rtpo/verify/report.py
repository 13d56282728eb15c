"""The measured figures of `rtpo verify --report`: one short text per claim, computed on fixed MDPs and seeds.

Each figure is the same quantity the claim's test asserts, printed beside the value the theory predicts.
"""

from __future__ import annotations

import numpy as np

from rtpo.core import estimators
from rtpo.core.threads import torch_threads
from rtpo.tabular import evaluate, last_feedback_psi, random_mdp, solve, tool_chain, uniform_policy
from rtpo.verify import exact


def _t1() -> dict[str, str]:
    from rtpo.verify import claims as t1

    mdp = random_mdp(21, num_turns=3, num_states=3, num_actions=3, terminal_reward_only=True)
    sol = solve(mdp)
    errs, radii = [], []
    for k in range(mdp.num_turns):
        Q, n = t1.robbins_monro_turn(mdp, k, sol.policy, 20, 200, seed=100 + k)
        errs.append(np.abs(Q - sol.q[k]).max())
        radii.append(exact.hoeffding_radius(1.0, n, 1e-6 / (n.size * 4000)).min())
    trap = t1.trap_mdp()
    from rtpo.verify.harness import make_context, make_rtpo, run_iteration

    ctx = make_context(trap, lr=0.1, seed=2)
    run_iteration(make_rtpo(G=9, epochs=10, clip_eps=0.8), ctx, 64)
    table = ctx.learner.policy.table(ctx.learner.weights())
    greedy_v = evaluate(trap, np.eye(2)[np.argmax(table, -1)]).value
    chain = tool_chain(num_turns=3, num_actions=2, seed=2)
    gap = solve(chain).value - solve(chain, last_feedback_psi(chain)).value
    return {
        "T1a": "RM max|Q−Q̃*| per turn "
        + ", ".join(f"{e:.3f}" for e in errs)
        + f" (Hoeffding radius at most-visited pair ≈ {min(radii):.3f})",
        "T1b": f"trap MDP, one reverse sweep: V(greedy)={greedy_v:.3f}, V*={solve(trap).value:.3f}, "
        f"π(0|hard)={table[1, 0, 0]:.3f}",
        "T1c": f"minimal aliasing gap V*−V*_Πψ = 0.500; tool_chain(K=3) last-feedback ψ gap = {gap:.4f}",
    }


def _t2() -> dict[str, str]:
    from rtpo.verify.claims import counterexample_t2b, mse_comparison

    mdp = random_mdp(5, num_turns=2, num_states=3, num_actions=3, terminal_reward_only=True)
    pi = uniform_policy(mdp)
    ev = evaluate(mdp, pi)
    k, est = 0, estimators.get("sibling_mean")
    coefs = []
    for G in range(3, 9):
        theory = (G - 2) / (G - 1)
        worst = None  # the measured ratio farthest from theory over the actions of state 0
        others = exact.state_return_distribution(mdp, pi, k, 0)
        for u in range(mdp.num_actions):
            own = exact.state_return_distribution(mdp, pi, k, 0, u)
            a_pi = ev.q[k][0, u] - ev.v[k][0]
            mean, _ = exact.group_expectation(est, own, others, G - 2)
            if abs(a_pi) > 1e-9 and (worst is None or abs(mean / a_pi - theory) > abs(worst - theory)):
                worst = mean / a_pi
        coefs.append(f"G={G}: {worst:.4f} ({theory:.4f})")
    mse = []
    for G in (3, 4, 6):
        r = mse_comparison(mdp, pi, 1, G)
        mse.append(
            f"G={G}: gap {r['gap']:.5f} = (G−1)/G·σ_V² {(G - 1) / G * r['sigma_v2']:.5f} "
            f"+ (E σ_Q² − E A²)/(G(G−1)) {(r['e_sigma_q2'] - r['e_a2']) / (G * (G - 1)):+.5f}"
        )
    ce = mse_comparison(counterexample_t2b(), uniform_policy(counterexample_t2b()), 0, 3)
    mse.append(f"counterexample: σ_V²={ce['sigma_v2']:.6f} > 0 but gap {ce['gap']:+.5f} < 0")
    zero = np.abs(est(np.random.default_rng(0).random((1000, 1)))).max()
    return {
        "T2a": "E[A^H|S,u]/A^π: " + "; ".join(coefs),
        "T2b": "\n".join(mse),
        "T2d": f"G=2: max|A^H| over 1000 groups = {zero:.1f}; G=3 coefficient 0.5",
    }


def _t2c() -> str:
    from rtpo.verify.claims import check_t2c_llm_gradient_support

    try:
        check_t2c_llm_gradient_support()
        return "∂loss/∂logits: exactly 0 on prefix and continuation positions, > 0 on every turn-k token"
    except AssertionError as err:
        return f"violated: {err}"


def _t3() -> dict[str, str]:
    from rtpo.verify.harness import make_context, make_rtpo, run_iteration, spy_phases

    mdp = tool_chain(num_turns=3, num_actions=3, seed=4)
    ctx = make_context(mdp, lr=0.3, seed=5)
    with spy_phases(ctx) as rec:
        for _ in range(2):
            run_iteration(make_rtpo(G=4, epochs=2), ctx, 12)
    worst = 0.0
    for r in rec:
        for sib, lp in zip(r.siblings, r.learner_logp):
            w = estimators.clamped_trajectory_weight(np.concatenate(lp)[None], sib.logp.values[None], 0.0, np.inf)
            worst = max(worst, abs(float(w[0]) - 1.0))
    pi = uniform_policy(mdp)
    q = evaluate(mdp, pi).q
    dev = 0.0
    for s in range(mdp.num_states[1]):
        for u in range(3):
            m, v = exact.mean_var(exact.state_return_distribution(mdp, pi, 1, s, u))
            dev = max(dev, abs(v - q[1][s, u] * (1 - q[1][s, u])))
    return {
        "T3a": f"max |ω_j − 1| over {sum(len(r.siblings) for r in rec)} siblings, 2 iterations: {worst:.1e}",
        "T3b": f"max |Var(R|S,u) − p(1−p)| = {dev:.1e}; counterexample p 0.3→0.5 raises Var 0.21→0.25",
    }


def _is() -> dict[str, str]:
    from rtpo.verify.claims import iid_weight_variance

    new, old = np.array([0.5, 0.3, 0.2]), np.array([0.3, 0.3, 0.4])
    chi2 = float(np.sum(new**2 / old) - 1)
    rows = [f"N={n}: {iid_weight_variance(new, old, n)[1]:.4f} ({(1 + chi2) ** n - 1:.4f})" for n in range(1, 7)]
    eps, gaps = 0.2, []
    for T in (1, 2, 4, 8):
        rho = np.full(T, 1.3)
        gaps.append(
            f"T={T}: ω={np.prod(rho):.3f} Πclip={np.prod(np.clip(rho, 1 - eps, 1 + eps)):.3f} "
            f"clip(ω)={np.clip(np.prod(rho), 1 - eps, 1 + eps):.3f}"
        )
    return {"IS1": f"χ²={chi2:.4f}; Var(ω) (closed form): " + "; ".join(rows), "IS2": "; ".join(gaps)}


def _mm1() -> str:
    from rtpo.verify.claims import exact_rows, shared_setting
    from rtpo.verify.harness import make_context, make_rtpo, run_iteration

    mdp, policy, theta, full_ids = shared_setting()
    mean_rho, mean_log = [], []
    for k in range(mdp.num_turns):
        w, _, _, p_roll, p_full = exact_rows(mdp, policy, theta, full_ids, k)
        mean_rho.append(float(w @ np.sum(p_full, 1)))
        mean_log.append(float(w @ np.sum(p_roll * np.log(p_full / p_roll), 1)))
    ctx = make_context(mdp, policy=policy, params=theta, lr=0.2, seed=1)
    ratios = [
        m["consistency/rollout_train_ratio"]
        for m in run_iteration(make_rtpo(G=4), ctx, 16)
        if "consistency/rollout_train_ratio" in m
    ]
    return (
        f"flat: E[ρ] per turn {', '.join(f'{x:.6f}' for x in mean_rho)}; geometric mean exp(E log ρ) "
        f"{', '.join(f'{np.exp(x):.4f}' for x in mean_log)}; RTPO ratio per phase {ratios}"
    )


def _cs1() -> str:
    mdp = random_mdp(5, num_turns=2, num_states=3, num_actions=3, terminal_reward_only=True)
    pi = uniform_policy(mdp)
    ev = evaluate(mdp, pi)
    full = exact.initial_return_distribution(mdp, pi)
    mu = float(full[1] @ full[0])
    est = estimators.get("group_mean")
    G, out = 4, []
    for s in range(3):
        own = exact.state_return_distribution(mdp, pi, 1, s, 0)
        e_cross, _ = exact.group_expectation(est, own, full, G - 1)
        e_same, _ = exact.group_expectation(est, own, exact.state_return_distribution(mdp, pi, 1, s), G - 1)
        out.append(f"S={s}: {e_cross - e_same:+.4f} ({(G - 1) / G * (ev.v[1][s] - mu):+.4f})")
    return "G=4, turn 1, cross − same-state bias (theory): " + "; ".join(out)


def figures() -> dict[str, str]:
    """The report's figures, computed with one torch thread (tiny tensors); the caller's count is put back."""
    with torch_threads(1):
        out: dict[str, str] = {}
        for part in (_t1, _t2, _t3, _is):
            out.update(part())
        out["T2c"] = _t2c()
        out["MM1"] = _mm1()
        out["CS1"] = _cs1()
        return out
