"""TurnMDP: an immutable finite-horizon turn-boundary MDP (SPEC §1) stored as per-turn arrays.

Turn k has its own state space of size S_k.  Transitions are stored sparsely with a fixed branching B
per turn: from state s under macro-action a the next boundary state is succ[k][s, a, b] with
probability prob[k][s, a, b].  A (s, a) row whose probabilities sum to 0 ends the episode (a final
answer); every row of the last turn K−1 ends it.  Dense inputs (K, S, A, S) convert to this form, and
large tree MDPs (10⁵ states) are built in it directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import scipy.sparse as sparse


def _ro(a: np.ndarray, dtype) -> np.ndarray:
    a = np.array(a, dtype=dtype, copy=True)
    a.flags.writeable = False
    return a


def _ro_shared(arrays, dtype) -> tuple[np.ndarray, ...]:
    """_ro of each array, converting an input object that appears several times once (`arrays` holds
    the inputs for the whole call, so their ids stay valid)."""
    copies: dict[int, np.ndarray] = {}
    for x in arrays:
        if id(x) not in copies:
            copies[id(x)] = _ro(x, dtype)
    return tuple(copies[id(x)] for x in arrays)


@dataclass(frozen=True, eq=False)
class TurnMDP:
    """Per turn k = 0..K−1 (S_k states, A actions, B_k successors):

    succ[k]:   (S_k, A, B_k) int64, next state's index in turn k+1's space (ignored where prob is 0).
    prob[k]:   (S_k, A, B_k) float64; each (s, a) row sums to 1 (continue) or 0 (episode ends).
    reward[k]: (S_k, A) float64, expected reward r_k(s, a); with bernoulli_rewards the environment
               samples r ~ Bernoulli(reward) instead (rewards must lie in [0, 1]).
    tau[k]:    (S_k, A) int64 ≥ 1, token duration τ_k of the macro-action (discount steps, Eq. 19).
    psi[k]:    (S_k,) int64 context id in [0, num_contexts): the context map ψ the policy sees.
    init:      (S_0,) initial distribution.
    gamma:     per-token-step discount γ.
    """

    succ: tuple[np.ndarray, ...]
    prob: tuple[np.ndarray, ...]
    reward: tuple[np.ndarray, ...]
    tau: tuple[np.ndarray, ...]
    psi: tuple[np.ndarray, ...]
    init: np.ndarray
    num_contexts: int
    gamma: float = 1.0
    bernoulli_rewards: bool = False

    def __post_init__(self) -> None:
        K = len(self.reward)
        if K < 1:
            raise ValueError("a TurnMDP needs at least one turn")
        for name in ("succ", "prob", "tau", "psi"):
            if len(getattr(self, name)) != K:
                raise ValueError(f"TurnMDP.{name} must have one array per turn ({K})")
        # one read-only copy per distinct input array: turns given the same array (a stationary layer
        # passed as `(layer,) * K`) keep sharing it, and so do their transition matrices
        for name, dtype in (("succ", np.int64), ("prob", np.float64), ("reward", np.float64), ("tau", np.int64)):
            object.__setattr__(self, name, _ro_shared(getattr(self, name), dtype))
        object.__setattr__(self, "psi", _ro_shared(self.psi, np.int64))
        object.__setattr__(self, "init", _ro(self.init, np.float64))
        A = self.reward[0].shape[1] if self.reward[0].ndim == 2 else -1
        if A < 1:
            raise ValueError("reward[0] must have shape (S_0, A) with A >= 1")
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {self.gamma}")
        if self.init.ndim != 1 or self.init.shape[0] != self.reward[0].shape[0]:
            raise ValueError("init must have shape (S_0,)")
        if np.any(self.init < 0) or not np.isclose(self.init.sum(), 1.0, atol=1e-9):
            raise ValueError("init must be a probability vector")
        for k in range(K):
            S_k = self.reward[k].shape[0]
            if self.reward[k].shape != (S_k, A):
                raise ValueError(f"reward[{k}] must have shape (S_{k}, {A})")
            if self.prob[k].shape[:2] != (S_k, A) or self.succ[k].shape != self.prob[k].shape:
                raise ValueError(f"succ[{k}] and prob[{k}] must have shape (S_{k}, A, B)")
            if self.tau[k].shape != (S_k, A) or np.any(self.tau[k] < 1):
                raise ValueError(f"tau[{k}] must have shape (S_{k}, A) with entries >= 1")
            if self.psi[k].shape != (S_k,) or np.any(self.psi[k] < 0) or np.any(self.psi[k] >= self.num_contexts):
                raise ValueError(f"psi[{k}] must map each of the S_{k} states to a context in [0, {self.num_contexts})")
            if np.any(self.prob[k] < 0):
                raise ValueError(f"prob[{k}] has negative entries")
            sums = self.prob[k].sum(axis=-1)
            if not np.all(np.isclose(sums, 1.0, atol=1e-9) | np.isclose(sums, 0.0, atol=1e-12)):
                raise ValueError(f"each (s, a) row of prob[{k}] must sum to 1 (continue) or 0 (end)")
            if k == K - 1:
                if np.any(sums > 0):
                    raise ValueError("the last turn's rows must all end the episode (prob 0)")
            else:
                S_next = self.reward[k + 1].shape[0]
                live = self.prob[k] > 0
                if np.any(live & ((self.succ[k] < 0) | (self.succ[k] >= S_next))):
                    raise ValueError(f"succ[{k}] points outside turn {k + 1}'s {S_next} states")
            if self.bernoulli_rewards and (np.any(self.reward[k] < 0) or np.any(self.reward[k] > 1)):
                raise ValueError("bernoulli_rewards needs every reward in [0, 1]")

    # -- shape helpers ------------------------------------------------------------------------------
    @property
    def num_turns(self) -> int:
        return len(self.reward)

    @property
    def num_actions(self) -> int:
        return self.reward[0].shape[1]

    @property
    def num_states(self) -> tuple[int, ...]:
        return tuple(r.shape[0] for r in self.reward)

    @cached_property
    def state_offset(self) -> np.ndarray:
        """(K+1,) offsets of each turn's states in the flat (global) state numbering."""
        off = np.zeros(self.num_turns + 1, dtype=np.int64)
        np.cumsum(self.num_states, out=off[1:])
        return off

    @cached_property
    def transition_csr(self) -> tuple[sparse.csr_matrix, ...]:
        """Per turn k < K−1, P_k as a CSR matrix of shape (S_k·A, S_{k+1}): row s·A + a holds the B_k
        entries prob[k][s, a, :] at columns succ[k][s, a, :] (dead entries point at column 0 with
        probability 0).  Built once; a matvec with it is E[V_{k+1}(s') | s, a] in one streaming pass
        (Eq. 20) and its transpose pushes state mass forward.  Turns that hold the same prob and succ
        arrays (a stationary MDP built as `(layer,) * K`) share one matrix, as a stationary solver's
        single P would: K−1 times less memory, and the matvecs of successive turns stay in cache."""
        out = []
        built: dict[tuple[int, int, int], sparse.csr_matrix] = {}
        for k in range(self.num_turns - 1):
            p = self.prob[k]
            S, A, B = p.shape
            n = self.num_states[k + 1]
            key = (id(p), id(self.succ[k]), n)  # both arrays are held by self, so their ids stay valid
            if key in built:
                out.append(built[key])
                continue
            idx_t = np.int32 if max(n, S * A * B) < 2**31 else np.int64
            cols = np.where(p > 0, self.succ[k], 0).astype(idx_t).reshape(-1)
            ptr = np.arange(0, S * A * B + 1, B, dtype=idx_t)
            built[key] = sparse.csr_matrix((p.reshape(-1), cols, ptr), shape=(S * A, n))
            out.append(built[key])
        return tuple(out)

    def with_psi(self, psi, num_contexts: int | None = None) -> TurnMDP:
        """The same MDP seen through another context map ψ (K arrays of (S_k,) context ids)."""
        psi = tuple(np.asarray(p, dtype=np.int64) for p in psi)
        nc = int(max(int(p.max()) for p in psi) + 1) if num_contexts is None else num_contexts
        return TurnMDP(
            self.succ, self.prob, self.reward, self.tau, psi, self.init, nc, self.gamma, self.bernoulli_rewards
        )

    def identity_psi(self) -> TurnMDP:
        """ψ = identity: every state its own context (a decision-sufficient map, A11)."""
        return self.with_psi([np.arange(s) for s in self.num_states])

    # -- constructors -------------------------------------------------------------------------------
    @staticmethod
    def from_arrays(P, R, init, gamma: float = 1.0, tau=None, psi=None, bernoulli_rewards: bool = False) -> TurnMDP:
        """From dense arrays: P (K, S, A, S), R (K, S, A), init (S,); tau (K, S, A) ints (default 1);
        psi (K, S) context ids (default identity).  P[K−1] must be all zero or is ignored; a row of
        P[k] that sums to 0 ends the episode there."""
        P = np.asarray(P, dtype=np.float64)
        R = np.asarray(R, dtype=np.float64)
        if P.ndim != 4 or P.shape[1] != P.shape[3]:
            raise ValueError(f"P must have shape (K, S, A, S), got {P.shape}")
        K, S, A, _ = P.shape
        if R.shape != (K, S, A):
            raise ValueError(f"R must have shape (K, S, A) = {(K, S, A)}, got {R.shape}")
        tau = np.ones((K, S, A), dtype=np.int64) if tau is None else np.asarray(tau)
        if tau.shape != (K, S, A):
            raise ValueError(f"tau must have shape {(K, S, A)}, got {tau.shape}")
        psi_arr = np.tile(np.arange(S), (K, 1)) if psi is None else np.asarray(psi, dtype=np.int64)
        if psi_arr.shape != (K, S):
            raise ValueError(f"psi must have shape {(K, S)}, got {psi_arr.shape}")
        succ, prob = [], []
        for k in range(K):
            pk = P[k] if k < K - 1 else np.zeros_like(P[k])
            nnz = (pk > 0).sum(axis=-1)
            B = max(int(nnz.max()), 1)
            # put each row's non-zeros first (stable, so successor order follows state order)
            order = np.argsort(pk <= 0, axis=-1, kind="stable")[..., :B]
            succ.append(order)
            prob.append(np.take_along_axis(pk, order, axis=-1))
        return TurnMDP(
            tuple(succ),
            tuple(prob),
            tuple(R),
            tuple(tau),
            tuple(psi_arr),
            np.asarray(init, dtype=np.float64),
            int(psi_arr.max()) + 1,
            gamma,
            bernoulli_rewards,
        )

    def to_dense(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Dense (P, R, tau) with S = max_k S_k (padding states are unreachable); for small MDPs."""
        K, A, S = self.num_turns, self.num_actions, max(self.num_states)
        P = np.zeros((K, S, A, S))
        R = np.zeros((K, S, A))
        T = np.ones((K, S, A), dtype=np.int64)
        for k in range(K):
            Sk = self.num_states[k]
            R[k, :Sk] = self.reward[k]
            T[k, :Sk] = self.tau[k]
            s_idx, a_idx, b_idx = np.nonzero(self.prob[k])
            np.add.at(P[k], (s_idx, a_idx, self.succ[k][s_idx, a_idx, b_idx]), self.prob[k][s_idx, a_idx, b_idx])
        return P, R, T
