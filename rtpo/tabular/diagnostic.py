"""Which regime a tabular task is in, before training: the exact per-turn variance decomposition of the
return under a policy (Thm 2(b), Eq. 58, 72) and an index of RTPO's information per rollout against GRPO's.

Definitions (SPEC §1, Thm 2, Eq. 54–55, 58).  H_k is the history up to boundary k (the paper's S_k: the
states, actions and realised rewards before turn k), u the turn-k action, R the whole return
Σ_j γ^{D_j} r_j with D_j = Σ_{m<j} τ_m, and, for a live episode in tabular state s_k with return so far
P_k and discount γ^{D_k},

    Q^π(H_k, u) = E[R | H_k, u] = P_k + γ^{D_k} Q̃_k(s_k, u)           (Eq. 54 on the full return)
    V^π(H_k)    = E[R | H_k]    = P_k + γ^{D_k} V_k(s_k)
    A_k         = Q^π(H_k, u) − V^π(H_k) = γ^{D_k} (Q̃_k − V_k)(s_k, u)  (Eq. 55)

An episode that ended before turn k has no turn-k action: its history is the whole episode, V^π(H_k)
is its realised return, A_k = 0 and Var(R | H_k) = 0.  Then, for every k, exactly (law of total
variance twice; E[A_k | H_k] = 0 makes the cross term vanish):

    Var(R) = E[Var(R | H_k, u)] + Var(A_k) + σ_V²(k),    σ_V²(k) = Var_{H_k}[V^π(H_k)]   (Eq. 58)

`decompose` computes every term exactly: one backward pass for Q̃, V and the second moment of the
return-to-go, one forward pass carrying, per tabular state, the mass and the moments of (P_k, γ^{D_k})
that the history adds (Bernoulli rewards: E[r̃²] = r).

Information index (the derivation; an idealisation stated up front: baselines are their large-group
limits, μ_R for GRPO's group mean and V^π(H_k) for RTPO's sibling mean, so Thm 2(a)'s finite-group
shrinkage factors (G−1)/G and (G−2)/(G−1) are left out).  A rollout that trains turn k multiplies
∇ log π_k(u) by a centred return Y; the part of Y that carries the turn-k credit is A_k.  Take as the
information one sample gives about A_k the share of A_k's variance its best linear predictor from Y
explains, ρ² = Cov(Y, A_k)² / (E[Y²] E[A_k²]) ∈ [0, 1] (1: the sample reveals A_k exactly).  Given
that the episode is live at k (probability p_k) and E[A_k | H_k] = 0:

    GRPO, Y = R − μ_R:       Cov(Y, A_k) = E[A_k²],  E[Y²] = E[(R − μ_R)² | live]  (= Var(R) when p_k = 1)
                             ρ²_G(k) = Var(A_k | live) / E[(R − μ_R)² | live]
                             = Var(A) / (E[Var(R|H,u)] + Var(A) + σ_V²) without early ends
    RTPO sibling, Y = R − V^π(H_k):  E[Y²] = E[Var(R | H_k, u) | live] + Var(A_k | live)
                             ρ²_R(k) = Var(A_k) / (E[Var(R | H_k, u)] + Var(A_k))   (σ_V² removed, Thm 2(b))

Per rollout: a GRPO trajectory is one sample for every turn it reaches, so I_GRPO = Σ_k p_k ρ²_G(k).
RTPO spends, per trunk, 1 + (G−1) Σ_k p_k rollouts (the trunk trains nothing) and gets (G−1) p_k
turn-k samples, so I_RTPO = (G−1) Σ_k p_k ρ²_R(k) / (1 + (G−1) Σ_k p_k).  The index is
I_RTPO / I_GRPO: above 1, RTPO's rollouts carry more turn-level credit than GRPO's (σ_V²-rich tasks:
region_chain); below 1, GRPO's K samples per rollout win (the Bernoulli tool chain, where σ_V² is a few
percent of Var(R)).  It is a per-rollout statement about the initial policy's gradient signal, not a
prediction of final values: summed over turns, one easy turn can dominate it.  On 37 generated families
it was not built on (bench/bench_regime.py, docs/results.md §1d) it named the winner of every clear
contest (17) and of 15 of 20 close ones, which is no better than the base rate of always naming GRPO
(32 of 37); an independent check on four other families found it right twice.

The call (`regime_call`, the last line `rtpo solve`/`compare` print) uses the per-turn *bottleneck*
index instead (`bottleneck_index`: each method's rollouts per unit of turn-k information, summed over the
turns with something to learn, so the hardest turn dominates), with bands chosen on the design half of
the benchmark's families and a confidence measured on the held-out half (REGIME_CALIBRATION).  It names
a winner only where that held-out hit rate's Wilson 95% lower bound is above 1/2, and prints the hit rate
with its interval; elsewhere, and for any RTPO G other than the benchmark's, it prints "no call".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rtpo.tabular.mdp import TurnMDP
from rtpo.tabular.solve import evaluate, state_policy


@dataclass(frozen=True)
class VarianceDecomposition:
    """Per turn k (arrays of shape (K,)) under one policy; see the module docstring for the definitions.

    mean_return, var_return: E[R], Var(R).
    live:        p_k, the probability that the episode is still running at boundary k.
    downstream:  E[Var(R | H_k, u)] (0 on ended episodes).
    var_adv:     Var(A_k) = E[A_k²].
    sigma_v2:    σ_V²(k) = Var(V^π(H_k)).
    centred_live: E[(R − μ_R)² · 1{live at k}].
    """

    mean_return: float
    var_return: float
    live: np.ndarray
    downstream: np.ndarray
    var_adv: np.ndarray
    sigma_v2: np.ndarray
    centred_live: np.ndarray

    @property
    def rho2_grpo(self) -> np.ndarray:
        """ρ²_G(k) = Var(A_k | live) / E[(R − μ_R)² | live] (0 where nothing is live or R is constant)."""
        return _ratio(self.var_adv, self.centred_live)

    @property
    def rho2_sibling(self) -> np.ndarray:
        """ρ²_R(k) = Var(A_k) / (E[Var(R | H_k, u)] + Var(A_k))."""
        return _ratio(self.var_adv, self.downstream + self.var_adv)

    def info_grpo(self) -> float:
        """I_GRPO = Σ_k p_k ρ²_G(k): information per GRPO rollout."""
        return float(np.sum(self.live * self.rho2_grpo))

    def info_rtpo(self, G: int) -> float:
        """I_RTPO = (G−1) Σ_k p_k ρ²_R(k) / (1 + (G−1) Σ_k p_k): information per RTPO rollout."""
        if G < 2:
            raise ValueError(f"G must be >= 2, got {G}")
        return float((G - 1) * np.sum(self.live * self.rho2_sibling) / (1 + (G - 1) * np.sum(self.live)))

    def info_index(self, G: int) -> float:
        """I_RTPO(G) / I_GRPO; nan when GRPO's rollouts carry no signal at all (constant R)."""
        g = self.info_grpo()
        return self.info_rtpo(G) / g if g > 0 else float("nan")

    def bottleneck_index(self, G: int) -> float:
        """cost_GRPO / cost_RTPO(G), cost_m = Σ_k 1 / I_m(k) over the turns with something to learn
        (Var(A_k) > 0), I_GRPO(k) = p_k ρ²_G(k), I_RTPO(k) = (G−1) p_k ρ²_R(k) / (1 + (G−1) Σ_j p_j): the
        per-turn terms of `info_grpo`/`info_rtpo` (Thm 2(b), Eq. 58), combined so that each method's hardest
        turn dominates its cost rather than its easiest (> 1: RTPO needs fewer rollouts); nan where no turn
        has anything to learn."""
        if G < 2:
            raise ValueError(f"G must be >= 2, got {G}")
        learn = self.var_adv > 1e-12 * max(float(self.var_adv.max(initial=0.0)), 1e-300)
        if not learn.any():
            return float("nan")
        i_g = self.live * self.rho2_grpo
        i_r = (G - 1) * self.live * self.rho2_sibling / (1 + (G - 1) * self.live.sum())
        with np.errstate(divide="ignore"):
            cost_g = float(np.sum(1.0 / i_g[learn]))
            cost_r = float(np.sum(1.0 / i_r[learn]))
        return cost_g / cost_r if cost_r > 0 else float("nan")


def _ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.zeros_like(a)
    np.divide(a, b, out=out, where=b > 1e-300)
    return out


def reward_second_moment(mdp: TurnMDP, k: int) -> np.ndarray:
    """E[r̃_k² | s, u]: r for Bernoulli rewards (r̃ ∈ {0, 1}), r² for rewards paid exactly; (S_k, A)."""
    r = np.asarray(mdp.reward[k], np.float64)
    return r.copy() if mdp.bernoulli_rewards else r * r


def decompose(mdp: TurnMDP, pi: np.ndarray, psi: Sequence[np.ndarray] | None = None) -> VarianceDecomposition:
    """The exact per-turn decomposition Var(R) = E[Var(R | H_k, u)] + Var(A_k) + σ_V²(k) under π
    ((K, C, A) over the contexts ψ, default mdp.psi), from one backward and one forward pass."""
    K = mdp.num_turns
    ev = evaluate(mdp, pi, psi)
    pol = [state_policy(mdp, pi, k, psi) for k in range(K)]
    ends = [mdp.prob[k].sum(axis=-1) <= 0.0 if k < K - 1 else np.ones(mdp.reward[k].shape, bool) for k in range(K)]
    disc = [mdp.gamma ** np.asarray(mdp.tau[k], np.float64) for k in range(K)]
    # backward: W_k(s, u) = E[G_k² | s, u] for the return-to-go G_k = r̃_k + γ^τ G_{k+1}
    W: list = [None] * K
    M_next = None
    for k in range(K - 1, -1, -1):
        W[k] = reward_second_moment(mdp, k)
        if M_next is not None:
            csr = mdp.transition_csr[k]
            shape = mdp.reward[k].shape
            ev_next = (csr @ ev.v[k + 1]).reshape(shape)
            em_next = (csr @ M_next).reshape(shape)
            W[k] = W[k] + 2.0 * mdp.reward[k] * disc[k] * ev_next + disc[k] ** 2 * em_next
        M_next = np.sum(pol[k] * W[k], axis=1)
    # forward: per state, m0 = P(s), mP = E[P 1_s], mP2 = E[P² 1_s], mg = E[γ^D 1_s], mg2 = E[γ^2D 1_s],
    # mPg = E[P γ^D 1_s]; ended episodes accumulate (mass, E[R 1], E[R² 1])
    S0 = mdp.num_states[0]
    m0 = np.asarray(mdp.init, np.float64).copy()
    mP, mP2, mPg = np.zeros(S0), np.zeros(S0), np.zeros(S0)
    mg, mg2 = m0.copy(), m0.copy()
    end0 = end1 = end2 = 0.0
    mu = float(ev.value)
    e_r2 = float(np.asarray(mdp.init) @ np.sum(pol[0] * W[0], axis=1))
    var_r = e_r2 - mu * mu
    live, down, vadv, sv2, cl = (np.zeros(K) for _ in range(5))
    for k in range(K):
        q, v, p = ev.q[k], ev.v[k], pol[k]
        m_k = np.sum(p * W[k], axis=1)  # E[G_k² | s]
        live[k] = m0.sum()
        down[k] = float(np.sum(mg2[:, None] * p * (W[k] - q * q)))
        vadv[k] = float(np.sum(mg2[:, None] * p * (q - v[:, None]) ** 2))
        hist2 = float(np.sum(mP2 + 2.0 * v * mPg + v * v * mg2))  # E[V(H_k)² 1_live]
        sv2[k] = hist2 + end2 - mu * mu
        r1 = float(np.sum(mP + v * mg))  # E[R 1_live]
        r2 = float(np.sum(mP2 + 2.0 * v * mPg + m_k * mg2))  # E[R² 1_live]
        cl[k] = r2 - 2.0 * mu * r1 + mu * mu * live[k]
        if k == K - 1:
            break
        r, rr, d = mdp.reward[k], reward_second_moment(mdp, k), disc[k]
        n0 = m0[:, None] * p
        nP = (mP[:, None] + mg[:, None] * r) * p
        nP2 = (mP2[:, None] + 2.0 * mPg[:, None] * r + mg2[:, None] * rr) * p
        ng = d * mg[:, None] * p
        ng2 = d * d * mg2[:, None] * p
        nPg = d * (mPg[:, None] + mg2[:, None] * r) * p
        e = ends[k]
        end0 += float(n0[e].sum())
        end1 += float(nP[e].sum())
        end2 += float(nP2[e].sum())
        push = mdp.transition_csr[k].T  # ended rows have no entries
        m0, mP, mP2, mg, mg2, mPg = (push @ x.reshape(-1) for x in (n0, nP, nP2, ng, ng2, nPg))
    return VarianceDecomposition(mu, var_r, live, down, vadv, sv2, cl)


def decomposition_text(dec: VarianceDecomposition, G: int, label: str = "") -> list[str]:
    """The lines `rtpo solve` and `rtpo compare` print: one per turn, then the information index."""
    head = f"variance decomposition under the initial policy{label}: Var(R) = {dec.var_return:.6g} = "
    lines = [
        head + "E[Var(R|S_k,u)] + Var(A_k) + sigma_V^2(k) at every k (Thm 2, Eq. 58)",
        "   k   live   E[Var(R|S_k,u)]   Var(A_k)   sigma_V^2(k)   sigma_V^2 share   rho2_GRPO   rho2_sibling",
    ]
    share = _ratio(dec.sigma_v2, np.full_like(dec.sigma_v2, dec.var_return))
    for k in range(dec.live.size):
        lines.append(
            f"  {k:2d}  {dec.live[k]:5.3f}   {dec.downstream[k]:15.6g}   {dec.var_adv[k]:8.4g}   "
            f"{dec.sigma_v2[k]:12.6g}   {share[k]:15.3f}   {dec.rho2_grpo[k]:9.4f}   {dec.rho2_sibling[k]:12.4f}"
        )
    lines.append(
        f"information per rollout (rtpo.tabular.diagnostic): GRPO {dec.info_grpo():.4g}, RTPO(G={G}) "
        f"{dec.info_rtpo(G):.4g}; index RTPO/GRPO = {dec.info_index(G):.3f} "
        f"(more turn-level credit per {'RTPO' if dec.info_index(G) > 1 else 'GRPO'} rollout)"
    )
    lines.append(regime_call(dec.bottleneck_index(G), G))
    return lines


# The held-out calibration of the bottleneck index: bench/bench_regime.py chooses the bands on the design
# half of its generated families and scores them on the held-out half (docs/results/regime_benchmark/
# regime.json, "calibration"; tests/test_regime_call.py checks that these numbers are that JSON's).
REGIME_CALIBRATION: dict = {
    "G_rtpo": 3,
    "G_grpo": 8,
    "bands": (
        {
            "call": "grpo",
            "lo": 0.0,
            "hi": 0.4429,
            "hits": 14,
            "families": 14,
            "wilson95": (0.7847, 1.0),
            "clear": (7, 7),
            "close": (7, 7),
        },
        {
            "call": "rtpo",
            "lo": 1.0418,
            "hi": None,
            "hits": 1,
            "families": 2,
            "wilson95": (0.0945, 0.9055),
            "clear": (1, 1),
            "close": (0, 1),
        },
    ),
}
MIN_CONFIDENCE = 0.5  # a band calls its method only when the held-out Wilson 95% lower bound is above a coin's


def regime_call(index: float, G: int, calibration: dict = REGIME_CALIBRATION) -> str:
    """The line that says which method will win, or "no call".  A call is printed only where the held-out
    calibration supports it: the RTPO G matches the calibrated protocol's, the bottleneck index lies in a
    band chosen on the design families, and that band's hit rate on the held-out families has a Wilson 95%
    lower bound above MIN_CONFIDENCE; the line then gives that hit rate, its interval, and the clear/close
    split.  Everywhere else it says "no call" and why."""
    where = "docs/results.md §1d, docs/results/regime_benchmark/regime.json"
    head = "no call on which method will win"
    if G != calibration["G_rtpo"]:
        return (
            f"{head}: the held-out calibration is for RTPO G = {calibration['G_rtpo']} against GRPO "
            f"G = {calibration['G_grpo']} at equal rollouts, and this RTPO has G = {G} ({where})"
        )
    if np.isnan(index):
        return f"{head}: the bottleneck index is undefined here (no turn has anything to learn) ({where})"
    band = next((b for b in calibration["bands"] if b["lo"] <= index and (b["hi"] is None or index < b["hi"])), None)
    if band is None:
        return (
            f"{head}: bottleneck index {index:.3g} lies between the calibrated bands, where the "
            f"design families went either way ({where})"
        )
    held = f"{band['hits']} of {band['families']} held-out families in this band"
    if band["families"] == 0 or band["wilson95"][0] <= MIN_CONFIDENCE:
        lo, hi = band["wilson95"] if band["families"] else (0.0, 1.0)
        return (
            f"{head}: bottleneck index {index:.3g} is in the {band['call'].upper()} band, but {held} went that way "
            f"(Wilson 95% {lo:.2f}–{hi:.2f}), too few to call ({where})"
        )
    lo, hi = band["wilson95"]
    (ch, cn), (kh, kn) = band["clear"], band["close"]
    return (
        f"call: {band['call'].upper()} ahead at the benchmark's equal rollout budget (RTPO G = {G}, GRPO "
        f"G = {calibration['G_grpo']}, lr tuned per method), bottleneck index {index:.3g}; {held} went that way (Wilson 95% {lo:.2f}–{hi:.2f}; "
        f"clear contests {ch}/{cn}, close {kh}/{kn}) ({where})"
    )
