"""Full-history contexts for the tabular backend: what a flat trainer conditions on when rollout used ψ.

An LLM rolled out under a truncating ψ (last m turns, think-stripping) is trained by flat baselines on
the full concatenated history, with the same weights θ (Eq. 2/10).  The tabular analogue:

- `FullHistoryEnv` is a TabularEnv that also exposes `full_contexts(episodes)`: the context id C + s
  (s the local state, which summarises the whole history in a TurnMDP) for turns where ψ_k aliases
  states, and the rollout context itself where ψ_k is injective (there the two views coincide).
- `history_features(mdp)` gives a LogLinear feature table over both kinds of context that shares θ the
  way one network shares weights:  φ(k, c, u) = e[k, c, u] for a rollout context c = ψ_k(s), and
  φ(k, C + s, u) = e[k, ψ_k(s), u] + h[k, s, u] for the full context of s.  The rollout policy reads
  only e; the full-history policy reads e plus the history weights h, which only flat training on
  full contexts moves.  At θ = 0 both are uniform, so the rollout/train ratio starts at 1 and departs
  from it as h is trained.
"""

from __future__ import annotations

import numpy as np

from rtpo.core.types import Ragged
from rtpo.tabular.backend import TabularEnv, TabularEpisodes
from rtpo.tabular.mdp import TurnMDP
from rtpo.tabular.policy import LogLinear


def _injective(psi_k: np.ndarray) -> bool:
    return np.unique(psi_k).size == psi_k.size


class FullHistoryEnv(TabularEnv):
    """TabularEnv plus full_contexts(): token pairs (k, C + s_local), or (k, ψ_k(s)) where ψ_k is injective."""

    def __init__(self, mdp: TurnMDP) -> None:
        super().__init__(mdp)
        off = mdp.state_offset
        full = []
        for k, psi_k in enumerate(mdp.psi):
            local = np.arange(mdp.num_states[k], dtype=np.int64)
            full.append(psi_k.copy() if _injective(psi_k) else mdp.num_contexts + local)
        self._full = np.concatenate(full)
        self.num_full_contexts = mdp.num_contexts + max(mdp.num_states)
        assert self._full.size == off[-1]

    def full_contexts(self, ep: TabularEpisodes) -> Ragged:
        return Ragged.from_dense(np.stack([ep.turn, self._full[ep.state]], axis=1))


def history_features(mdp: TurnMDP) -> np.ndarray:
    """(K, C + S, A, D) features shared by rollout contexts [0, C) and full contexts [C, C + S), S = max S_k.

    D = K·C·A (rollout weights e) + K·S·A (history weights h); see the module docstring."""
    K, C, A, S = mdp.num_turns, mdp.num_contexts, mdp.num_actions, max(mdp.num_states)
    d_e, d_h = K * C * A, K * S * A
    phi = np.zeros((K, C + S, A, d_e + d_h))
    e_idx = np.arange(d_e).reshape(K, C, A)
    h_idx = d_e + np.arange(d_h).reshape(K, S, A)
    ks, cs, us = np.meshgrid(np.arange(K), np.arange(C), np.arange(A), indexing="ij")
    phi[ks, cs, us, e_idx] = 1.0
    for k in range(K):
        s = np.arange(mdp.num_states[k])
        for u in range(A):
            phi[k, C + s, u, e_idx[k, mdp.psi[k], u]] += 1.0
            phi[k, C + s, u, h_idx[k, s, u]] += 1.0
    return phi


def history_policy(mdp: TurnMDP, init_scale: float = 0.0) -> LogLinear:
    """LogLinear over history_features(mdp): the rollout and full-history views share θ."""
    return LogLinear(history_features(mdp), init_scale=init_scale)
