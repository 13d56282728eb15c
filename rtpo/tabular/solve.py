"""Exact solvers on a TurnMDP: turn action values Q̃, continuation values F, values V (SPEC §1).

    Q̃_k^π(s, u) = r_k(s, u) + γ^{τ_k(s,u)} Σ_{s'} P_k(s' | s, u) F_k^π(s')        (Eq. 20)
    F_k^π(s')    = V_{k+1}^π(s'),  F_{K−1} ≡ 0                                        (Eq. 19)
    V_k^π(s)     = Σ_u π_k(u | ψ_k(s)) Q̃_k^π(s, u)

`solve` is backward induction (C.1): π*_k ∈ argmax_u Q̃_k^{π*}(s, u) with π*_{k+1..K−1} already fixed.
Policies here are dense (K, C, A) arrays of probabilities over contexts c = ψ_k(s).

solve's inner step runs on one of two kernels with bit-identical results: "numpy" (a scipy CSR matvec,
then the greedy step over the (S, A) block) or "numba" (rtpo.tabular._solve_numba: every turn's backup
and greedy step in one compiled call, over a copy of the transitions laid out four actions to a vector;
the optional `fast` extra).  The numba kernel writes V and the greedy actions; its Solution builds Q̃,
the one-hot policy and ψ on first access.  kernel="auto" (the default) takes numba where it
is installed, ψ is the identity (psi=None) and the MDP has at least AUTO_NUMBA_ENTRIES transition
entries, where the fused pass pays for numba's import and cached first call (bench/solve.json, numba_jit), and numpy otherwise;
kernel="numba" refuses in one line without numba or with a psi (the pooled ψ path is numpy's).
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rtpo.tabular.mdp import TurnMDP

_TIE = 1e-12
KERNELS = ("auto", "numba", "numpy")
AUTO_NUMBA_ENTRIES = 1 << 18  # Σ_k S_k·A·B_k at or above which kernel="auto" takes numba (if installed)


def backup(mdp: TurnMDP, k: int, v_next: np.ndarray | None) -> np.ndarray:
    """Q̃_k(s, u) = r_k(s, u) + γ^{τ_k(s,u)} E[V_{k+1}(s') | s, u]  (Eq. 20), shape (S_k, A)."""
    if v_next is None or k == mdp.num_turns - 1:
        return np.array(mdp.reward[k], dtype=np.float64)
    # one CSR matvec streams prob and succ once; no (S_k, A, B) gather temporary
    cont = (mdp.transition_csr[k] @ np.asarray(v_next, dtype=np.float64)).reshape(mdp.reward[k].shape)
    if mdp.gamma != 1.0:
        cont *= mdp.gamma ** mdp.tau[k]
    cont += mdp.reward[k]
    return cont


def state_policy(mdp: TurnMDP, pi: np.ndarray, k: int, psi: Sequence[np.ndarray] | None = None) -> np.ndarray:
    """π_k(· | ψ_k(s)) for every state of turn k: (S_k, A)."""
    psi_k = mdp.psi[k] if psi is None else np.asarray(psi[k])
    return np.asarray(pi[k])[psi_k]


@dataclass(frozen=True)
class Evaluation:
    """Exact values of a policy.  q[k]: (S_k, A); v[k]: (S_k,); f[k]: (S_{k+1},) (empty for k = K−1);
    value: Σ_s init(s) V_0(s)."""

    q: tuple[np.ndarray, ...]
    v: tuple[np.ndarray, ...]
    f: tuple[np.ndarray, ...]
    value: float


@dataclass(frozen=True)
class Solution(Evaluation):
    """Evaluation of the recursively optimal policy plus the policy itself.

    policy: (K, C, A) one-hot over contexts (C = max S_k under identity ψ); ties go to the lowest action.
    psi:    the context map the policy is defined on.
    actions (a property): (K, C) the action the policy takes in each context.
    From the numba kernel q, policy and psi are built on first access (`_CompiledSolution`).
    """

    policy: np.ndarray = None  # type: ignore[assignment]
    psi: tuple[np.ndarray, ...] = ()
    kernel: str = "numpy"  # the kernel that computed it ("numpy" or "numba"; see the module docstring)

    @property
    def actions(self) -> np.ndarray:
        """(K, C) int64: the action the policy takes in each (turn, context), policy.argmax(axis=2)."""
        return self.policy.argmax(axis=2)


def evaluate(mdp: TurnMDP, pi: np.ndarray, psi: Sequence[np.ndarray] | None = None) -> Evaluation:
    """Policy evaluation by the backward recursion of Eq. 19–20 for π given over contexts ψ (default mdp.psi)."""
    K = mdp.num_turns
    q: list = [None] * K
    v: list = [None] * K
    v_next = None
    for k in range(K - 1, -1, -1):
        q[k] = backup(mdp, k, v_next)
        v[k] = np.sum(state_policy(mdp, pi, k, psi) * q[k], axis=1)
        v_next = v[k]
    f = tuple(v[k + 1] if k < K - 1 else np.zeros(0) for k in range(K))
    return Evaluation(tuple(q), tuple(v), f, float(mdp.init @ v[0]))


def policy_value(mdp: TurnMDP, pi: np.ndarray, psi: Sequence[np.ndarray] | None = None) -> float:
    return evaluate(mdp, pi, psi).value


def state_distribution(mdp: TurnMDP, pi: np.ndarray, psi: Sequence[np.ndarray] | None = None) -> tuple[np.ndarray, ...]:
    """d_k(s) = P(S_k = s) under π (mass < 1 where episodes end early), forward in k."""
    d = [np.asarray(mdp.init, dtype=np.float64)]
    for k in range(mdp.num_turns - 1):
        flow = d[k][:, None] * state_policy(mdp, pi, k, psi)  # P(S_k = s, U_k = a)
        d.append(mdp.transition_csr[k].T @ flow.reshape(-1))
    return tuple(d)


def uniform_policy(mdp: TurnMDP, num_contexts: int | None = None) -> np.ndarray:
    c = mdp.num_contexts if num_contexts is None else num_contexts
    return np.full((mdp.num_turns, c, mdp.num_actions), 1.0 / mdp.num_actions)


def _argmax(x: np.ndarray) -> np.ndarray:
    """Per row, the lowest index within _TIE of the row maximum."""
    # column by column: numpy's reductions over a short last axis are several times slower
    m = _row_max(x)
    m -= _TIE
    best = np.full(x.shape[0], x.shape[1] - 1, dtype=np.int64)
    for a in range(x.shape[1] - 2, -1, -1):
        best[x[:, a] >= m] = a
    return best


def _row_max(x: np.ndarray) -> np.ndarray:
    m = x[:, 0].copy()
    for a in range(1, x.shape[1]):
        np.maximum(m, x[:, a], out=m)
    return m


def _greedy(q: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Writes into `out` (S, A) the one-hot greedy policy of q (S, A) — per row the lowest action
    within _TIE of the maximum, as `_argmax` — and returns V(s) = q(s, best(s)).

    No index gathers on the common path: a row with exactly one action within _TIE of its maximum
    has that action's indicator as its policy row and the maximum itself as its value; only rows
    with near-ties (or none: NaN) take `_argmax`."""
    m = _row_max(q)
    thr = m - _TIE
    np.greater_equal(q, thr[:, None], out=out, casting="unsafe")
    tied = np.flatnonzero(out @ np.ones(q.shape[1]) != 1.0)
    if tied.size:
        best = _argmax(q[tied])
        out[tied] = 0.0
        out[tied, best] = 1.0
        m[tied] = q[tied, best]
    return m


@functools.cache
def _numba_installed() -> bool:
    return importlib.util.find_spec("numba") is not None  # ~80 µs a call: looked up once


def _numba_kernel():
    """rtpo.tabular._solve_numba, importing numba on first use."""
    from rtpo.tabular import _solve_numba

    return _solve_numba


def choose_kernel(mdp: TurnMDP, kernel: str = "auto", psi: Sequence[np.ndarray] | None = None) -> str:
    """The kernel solve(mdp, psi, kernel=kernel) runs: "numpy" or "numba" (see the module docstring)."""
    if kernel not in KERNELS:
        raise ValueError(f"solve: unknown kernel {kernel!r}; expected one of {', '.join(KERNELS)}")
    if kernel == "numpy" or (kernel == "auto" and psi is not None):
        return "numpy"
    if kernel == "numba":
        if psi is not None:
            raise ValueError("solve: kernel='numba' serves psi=None only (the pooled psi path runs on numpy)")
        if not _numba_installed():
            raise ImportError("solve: kernel='numba' needs numba, which is not installed (pip install 'rtpo[fast]')")
        return "numba"
    entries = sum(p.size for p in mdp.prob[:-1])
    if entries < AUTO_NUMBA_ENTRIES or not _numba_installed():
        return "numpy"
    try:
        _numba_kernel()
    except ImportError:  # installed but unusable (e.g. built for another numpy): auto keeps to numpy
        return "numpy"
    return "numba"


class _CompiledSolution(Solution):
    """A Solution from the numba kernel: v, f, value and the greedy actions are computed; q (one more
    compiled pass that also writes Q̃), policy (one-hot from the actions) and psi (the identity) are
    built on first access and kept.  At 10⁵ states these are 13 MB that a caller after V* alone would
    otherwise pay for in fresh pages on every solve."""

    def __init__(self, mdp: TurnMDP, v: tuple[np.ndarray, ...], actions: np.ndarray) -> None:
        K = mdp.num_turns
        f = tuple(v[k + 1] if k < K - 1 else np.zeros(0) for k in range(K))
        # the frozen dataclass's fields, less the three properties below (its __init__ would assign them)
        for name, value in (("v", v), ("f", f), ("value", float(mdp.init @ v[0])), ("kernel", "numba")):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_mdp", mdp)
        object.__setattr__(self, "_flat_actions", actions)

    def _lazy(self, name: str, build):
        got = self.__dict__.get(name)
        if got is None:
            got = build()
            object.__setattr__(self, name, got)
        return got

    @property  # type: ignore[override]
    def q(self) -> tuple[np.ndarray, ...]:
        return self._lazy("_q", lambda: _run_numba(self._mdp, with_q=True)[2])

    @property  # type: ignore[override]
    def policy(self) -> np.ndarray:
        def build():
            best = self.actions
            policy = np.zeros((*best.shape, self._mdp.num_actions))
            np.put_along_axis(policy, best[:, :, None], 1.0, axis=2)
            return policy

        return self._lazy("_policy", build)

    @property  # type: ignore[override]
    def psi(self) -> tuple[np.ndarray, ...]:
        return self._lazy("_psi", lambda: tuple(np.arange(s, dtype=np.int64) for s in self._mdp.num_states))

    @property
    def actions(self) -> np.ndarray:
        def build():
            mdp = self._mdp
            best = np.zeros((mdp.num_turns, max(mdp.num_states)), dtype=np.int64)  # unmapped contexts: 0
            off = mdp.state_offset
            for k in range(mdp.num_turns):
                best[k, : mdp.num_states[k]] = self._flat_actions[off[k] : off[k + 1]]
            best.flags.writeable = False
            return best

        return self._lazy("_actions", build)


def _run_numba(mdp: TurnMDP, with_q: bool):
    """One compiled call over every turn: (v per turn, actions flat int32, q per turn or None)."""
    kernel = _numba_kernel()
    layout = kernel.lane_layout(mdp)
    off, A = mdp.state_offset, mdp.num_actions
    n = int(off[-1])
    # one array for every turn's V and one for the actions (each turn a view): the kernel's flat indices
    v_all = np.empty(n)
    actions = np.empty(n, dtype=np.int32)
    q_all = np.empty(n * A if with_q else 0)
    kernel.solve_turns(layout.P, layout.I, layout.R, layout.D, layout.meta, A, _TIE, q_all, v_all, actions)
    v = tuple(v_all[off[k] : off[k + 1]] for k in range(mdp.num_turns))
    q = tuple(q_all[off[k] * A : off[k + 1] * A].reshape(-1, A) for k in range(mdp.num_turns)) if with_q else None
    return v, actions, q


def _solve_numba(mdp: TurnMDP) -> Solution:
    """solve(mdp) (identity ψ) with the fused kernel: every turn in one compiled call, last turn first."""
    v, actions, _ = _run_numba(mdp, with_q=False)
    return _CompiledSolution(mdp, v, actions)


def solve(
    mdp: TurnMDP,
    psi: Sequence[np.ndarray] | None = None,
    prefix_policy: np.ndarray | None = None,
    kernel: str = "auto",
) -> Solution:
    """Backward induction over turn boundaries (C.1).

    psi=None: the policy sees the full state (identity ψ); the result is the global optimum V*.
    psi given (K arrays of (S_k,) context ids, e.g. mdp.psi): the recursive optimum over policies that
    see only ψ_k(s).  A context pools several states, so its best action maximises the Q̃ averaged over
    those states weighted by d_k(s), the probability of reaching s at turn k under `prefix_policy` for
    turns < k (default uniform; in RTPO these are the trunk's θ0 turns).  Under a decision-sufficient ψ
    this equals V* whatever the prefix policy (Thm 1(c)); under an aliasing ψ it can be strictly lower.

    kernel: "auto" | "numba" | "numpy", the same result bit for bit (module docstring); the one that ran
    is Solution.kernel.
    """
    used = choose_kernel(mdp, kernel, psi)
    K = mdp.num_turns
    if psi is None:
        if used == "numba":
            return _solve_numba(mdp)
        psi_t = tuple(np.arange(s, dtype=np.int64) for s in mdp.num_states)
    else:
        psi_t = tuple(np.asarray(p, dtype=np.int64) for p in psi)
        if len(psi_t) != K or any(p.shape != (s,) for p, s in zip(psi_t, mdp.num_states)):
            raise ValueError("psi must hold one (S_k,) array of context ids per turn")
    C = int(max(int(p.max()) for p in psi_t) + 1)
    A = mdp.num_actions
    policy = np.zeros((K, C, A))
    policy[:, :, 0] = 1.0  # contexts no state maps to: any fixed choice
    weights = None
    if psi is not None:
        prefix = np.full((K, C, A), 1.0 / A) if prefix_policy is None else np.asarray(prefix_policy)
        weights = state_distribution(mdp, prefix, psi_t)
    q: list = [None] * K
    v: list = [None] * K
    v_next = None
    for k in range(K - 1, -1, -1):
        q[k] = backup(mdp, k, v_next)
        if weights is None:
            v[k] = _greedy(q[k], policy[k, : mdp.num_states[k]])
        else:
            rows = np.arange(mdp.num_states[k])
            w = weights[k] if weights[k].sum() > 0 else np.ones(mdp.num_states[k])
            pooled = np.zeros((C, A))
            np.add.at(pooled, psi_t[k], w[:, None] * q[k])
            seen = np.zeros(C, dtype=bool)
            seen[psi_t[k]] = True
            ctx_best = np.zeros(C, dtype=np.int64)
            ctx_best[seen] = _argmax(pooled[seen])
            policy[k, seen, 0] = 0.0
            policy[k, seen, ctx_best[seen]] = 1.0
            best = ctx_best[psi_t[k]]
            v[k] = q[k][rows, best]  # = Σ_u π_k(u | ψ_k(s)) Q̃_k(s, u) for the one-hot π_k
        v_next = v[k]
    f = tuple(v[k + 1] if k < K - 1 else np.zeros(0) for k in range(K))
    return Solution(tuple(q), tuple(v), f, float(mdp.init @ v[0]), policy=policy, psi=psi_t)


@dataclass(frozen=True)
class BestDeterministic:
    """The best deterministic ψ-policy found by exhaustive search.

    value: its exact value; policy: (K, C, A) one-hot; count: the number of policies searched
    (A ** the number of (turn, context) pairs some state maps to)."""

    value: float
    policy: np.ndarray
    count: int


ENUMERATION_LIMIT = 1 << 20


def best_deterministic_psi_policy(
    mdp: TurnMDP, psi: Sequence[np.ndarray] | None = None, limit: int = ENUMERATION_LIMIT, chunk: int = 1 << 14
) -> BestDeterministic | None:
    """The best deterministic policy over the contexts ψ (default mdp.psi), by evaluating every one of
    them exactly (Eq. 19–20 vectorised over a chunk of policies); None when there are more than `limit`.

    Under an aliasing ψ this is the quantity a user usually means by "the best ψ-policy", and it can be
    well above the recursive optimum `solve(mdp, psi, prefix_policy)` (which fixes each context's action
    by Q̃ pooled under a stated prefix weighting, not by the policy's own state distribution); a
    stochastic ψ-policy can be better still (memoryless policies of an aliased MDP).  Ties go to the
    first policy in lexicographic order of (turn, context) actions.
    """
    K, A = mdp.num_turns, mdp.num_actions
    psi_t = mdp.psi if psi is None else tuple(np.asarray(p, dtype=np.int64) for p in psi)
    used = [np.unique(p) for p in psi_t]  # contexts some state maps to, per turn
    n_pairs = sum(u.size for u in used)
    count = A**n_pairs
    if count > limit:
        return None
    # the policy with index i takes, at pair j (turn-major), action digit_j(i) in base A (digit 0 most significant)
    place = A ** np.arange(n_pairs - 1, -1, -1, dtype=np.int64)
    col = []  # per turn, (S_k,) the pair index of each state's context
    j = 0
    for k in range(K):
        lookup = np.full(int(psi_t[k].max()) + 1, -1, dtype=np.int64)
        lookup[used[k]] = np.arange(j, j + used[k].size)
        col.append(lookup[psi_t[k]])
        j += used[k].size
    best_v, best_i = -np.inf, 0
    for lo in range(0, count, chunk):
        ids = np.arange(lo, min(lo + chunk, count), dtype=np.int64)
        acts = (ids[:, None] // place[None, :]) % A  # (P, n_pairs)
        v_next = None
        for k in range(K - 1, -1, -1):
            if v_next is None:
                q = np.broadcast_to(mdp.reward[k][None], (ids.size, *mdp.reward[k].shape))
            else:
                cont = (mdp.transition_csr[k] @ v_next.T).T.reshape(ids.size, *mdp.reward[k].shape)
                q = mdp.reward[k][None] + (mdp.gamma ** mdp.tau[k])[None] * cont
            a = acts[:, col[k]]  # (P, S_k)
            v_next = np.take_along_axis(q, a[:, :, None], axis=2)[:, :, 0]
        vals = v_next @ np.asarray(mdp.init, np.float64)
        i = int(np.argmax(vals))
        if vals[i] > best_v + _TIE:
            best_v, best_i = float(vals[i]), int(ids[i])
    C = int(max(int(p.max()) for p in psi_t) + 1)
    policy = np.zeros((K, C, A))
    policy[:, :, 0] = 1.0
    digits = (best_i // place) % A
    j = 0
    for k in range(K):
        for c in used[k]:
            policy[k, c] = 0.0
            policy[k, c, digits[j]] = 1.0
            j += 1
    return BestDeterministic(best_v, policy, count)
