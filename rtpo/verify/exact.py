"""Exact enumeration helpers for the claim tests: return distributions, sibling-group expectations, bounds.

Everything here is computed by enumerating finite outcomes on small TurnMDPs, so a claim test can
compare two sides of an identity to float precision instead of sampling.  The only statistical helper
is `hoeffding_radius`, used where a claim is about a sampling procedure (T1a, T1b, T3a).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np

from rtpo.tabular.mdp import TurnMDP

Dist = tuple[np.ndarray, np.ndarray]  # (values, probabilities), values unique, probabilities > 0

_DECIMALS = 12


def merge(values: np.ndarray, probs: np.ndarray) -> Dist:
    """Collapse equal values (to 1e-12) and drop zero-probability outcomes."""
    values = np.round(np.asarray(values, np.float64), _DECIMALS)
    probs = np.asarray(probs, np.float64)
    keep = probs > 0
    uniq, inv = np.unique(values[keep], return_inverse=True)
    out = np.zeros(uniq.size)
    np.add.at(out, inv, probs[keep])
    return uniq, out


def return_distribution(
    mdp: TurnMDP, pi: np.ndarray, k: int, states: np.ndarray, weights: np.ndarray, first_action: int | None = None
) -> Dist:
    """Exact law of R = Σ_{j≥k} γ^{Σ τ} r_j started from a mixture over turn-k states.

    pi: (K, C, A) policy over contexts c = mdp.psi[k][s].  first_action fixes u_k (the law of R | S_k, u).
    Bernoulli rewards branch on {0, 1}; an (s, a) row whose probabilities sum to 0 ends the episode.
    """
    K, A = mdp.num_turns, mdp.num_actions
    # particles: (state, accumulated return, current discount) with probability
    part = {(int(s), 0.0, 1.0): float(w) for s, w in zip(states, weights) if w > 0}
    done_v: list[float] = []
    done_p: list[float] = []
    for j in range(k, K):
        nxt: dict[tuple[int, float, float], float] = {}
        for (s, acc, disc), p in part.items():
            pol = np.zeros(A)
            if j == k and first_action is not None:
                pol[first_action] = 1.0
            else:
                pol = np.asarray(pi[j][mdp.psi[j][s]], np.float64)
            for a in np.flatnonzero(pol > 0):
                pa = p * pol[a]
                r = float(mdp.reward[j][s, a])
                outcomes = [(1.0, r), (0.0, 1.0 - r)] if mdp.bernoulli_rewards else [(r, 1.0)]
                disc2 = disc * mdp.gamma ** int(mdp.tau[j][s, a])
                row = mdp.prob[j][s, a]
                for rv, pr in outcomes:
                    if pr <= 0:
                        continue
                    acc2 = round(acc + disc * rv, _DECIMALS)
                    if j == K - 1 or row.sum() <= 0:
                        done_v.append(acc2)
                        done_p.append(pa * pr)
                        continue
                    for b in np.flatnonzero(row > 0):
                        key = (int(mdp.succ[j][s, a, b]), acc2, round(disc2, _DECIMALS))
                        nxt[key] = nxt.get(key, 0.0) + pa * pr * float(row[b])
        part = nxt
    return merge(np.array(done_v), np.array(done_p))


def state_return_distribution(mdp: TurnMDP, pi: np.ndarray, k: int, s: int, u: int | None = None) -> Dist:
    """Law of the return from boundary (k, s), optionally with the turn-k action fixed to u."""
    return return_distribution(mdp, pi, k, np.array([s]), np.array([1.0]), u)


def boundary_laws(mdp: TurnMDP, pi: np.ndarray, k: int):
    """Every (s, u) at turn k with the return laws a sibling group sees there: yields (s, u, own, same)
    where own = the law with the turn-k action fixed to u and same = the law from (k, s) under π."""
    for s in range(mdp.num_states[k]):
        same = state_return_distribution(mdp, pi, k, s)
        for u in range(mdp.num_actions):
            yield s, u, state_return_distribution(mdp, pi, k, s, u), same


def initial_return_distribution(mdp: TurnMDP, pi: np.ndarray) -> Dist:
    """Law of the full-episode return R from the initial distribution."""
    s = np.arange(mdp.num_states[0])
    return return_distribution(mdp, pi, 0, s, np.asarray(mdp.init))


def mean_var(d: Dist) -> tuple[float, float]:
    v, p = d
    m = float(p @ v)
    return m, float(p @ (v - m) ** 2)


def exchangeable_combos(d: Dist, m: int) -> tuple[np.ndarray, np.ndarray]:
    """All outcomes of m i.i.d. draws from d, as multisets: (M, m) values and (M,) probabilities.

    Estimators are permutation-equivariant in the other members of a group, so enumerating
    multisets with multinomial weights gives the same expectations as the full product space.
    """
    v, p = d
    if m == 0:
        return np.zeros((1, 0)), np.ones(1)
    rows, probs = [], []
    for combo in itertools.combinations_with_replacement(range(v.size), m):
        counts = np.bincount(combo, minlength=v.size)
        coef = math.factorial(m) / np.prod([math.factorial(int(c)) for c in counts])
        rows.append(v[list(combo)])
        probs.append(coef * np.prod(p**counts))
    return np.array(rows), np.array(probs)


def group_expectation(
    estimator: Callable[[np.ndarray], np.ndarray], own: Dist, others: Dist, n_others: int, target: float = 0.0
) -> tuple[float, float]:
    """E[est(R_own, R_2..R_n)[own]] and E[(est[own] − target)²] over every outcome combination.

    The group is passed to the estimator as one (M, 1 + n_others) batch of rows (the own return in
    column 0), so an estimator that mixes rows (a cross-state baseline) is exposed.
    """
    combos, w_c = exchangeable_combos(others, n_others)
    ov, op = own
    returns = np.concatenate([np.repeat(ov, combos.shape[0])[:, None], np.tile(combos, (ov.size, 1))], axis=1)
    weights = np.repeat(op, combos.shape[0]) * np.tile(w_c, ov.size)
    a = np.asarray(estimator(returns))[:, 0]
    return float(weights @ a), float(weights @ (a - target) ** 2)


def hoeffding_radius(value_range: float, n: np.ndarray | int, delta: float) -> np.ndarray:
    """t with P(|mean of n i.i.d. draws in an interval of length value_range − mean| ≥ t) ≤ delta."""
    n = np.maximum(np.asarray(n, np.float64), 1.0)
    return value_range * np.sqrt(np.log(2.0 / delta) / (2.0 * n))


def duplicate_states(mdp: TurnMDP) -> tuple[TurnMDP, tuple[np.ndarray, ...]]:
    """Every state s of every turn becomes two copies (s, 2s) and (s, 2s+1) with identical rows; arrivals
    split evenly between the copies.  Returns the MDP and the ψ that merges each pair — a ψ that is
    decision-sufficient (A11) yet not the identity."""
    P, R, T = mdp.to_dense()
    K, S, A, _ = P.shape
    P2 = np.zeros((K, 2 * S, A, 2 * S))
    R2 = np.repeat(R, 2, axis=1)
    T2 = np.repeat(T, 2, axis=1)
    for k in range(K):
        split = np.repeat(P[k], 2, axis=-1) / 2.0  # (S, A, 2S)
        P2[k] = np.repeat(split, 2, axis=0)
    init = np.repeat(np.pad(mdp.init, (0, S - mdp.num_states[0])), 2) / 2.0
    dup = TurnMDP.from_arrays(P2, R2, init, gamma=mdp.gamma, tau=T2, bernoulli_rewards=mdp.bernoulli_rewards)
    psi = tuple(np.arange(2 * S) // 2 for _ in range(K))
    return dup, psi


def deterministic_policies(num_turns: int, num_contexts: int, num_actions: int):
    """Every deterministic policy over (turn, context) as a one-hot (K, C, A) array (tiny sizes only)."""
    eye = np.eye(num_actions)
    for choice in itertools.product(range(num_actions), repeat=num_turns * num_contexts):
        yield eye[np.array(choice)].reshape(num_turns, num_contexts, num_actions)
