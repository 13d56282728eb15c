"""An rtpo plugin: importing this module registers an estimator, a method and a tabular task.

- estimator `sibling_trimmed_mean`: A_j = R_j − V̂ with V̂ the mean of a boundary's sibling returns after
  dropping the highest and the lowest one (Eq. 7's sibling baseline, made robust to one outlying
  return; groups of fewer than 3 keep the plain mean).
- method `rtpo_trimmed`: RTPO (Algorithm 1, the shared `ReverseTurn` iteration) whose estimator defaults
  to `sibling_trimmed_mean`; every other RTPO key (G, trunks_per_query, epochs, ...) works as for `rtpo`.

- tabular task `combination_lock`: K turns, A actions, one right action per turn (drawn from `seed`);
  one wrong action and the episode can no longer succeed; reward 1 only after K right actions.  The
  hardest case for credit assignment over turns: a sparse reward and no partial credit.

A plugin uses only rtpo's public registries; nothing in rtpo is edited.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rtpo.core.estimators import ESTIMATORS
from rtpo.core.methods import register_method
from rtpo.core.methods.reverse import ReverseTurn, RTPOConfig
from rtpo.tabular.mdp import TurnMDP
from rtpo.tabular.tasks import TASKS, TaskKind


@ESTIMATORS.register("sibling_trimmed_mean")
def sibling_trimmed_mean_advantage(returns: np.ndarray) -> np.ndarray:
    """A_j = R_j − V̂, V̂ the mean over the last axis (one sibling group) without its largest and smallest
    member (the plain mean of Eq. 7 for groups of 1 or 2)."""
    r = np.asarray(returns, dtype=np.float64)
    if r.ndim == 0 or r.shape[-1] < 1:
        raise ValueError(f"an advantage group needs at least 1 member, got shape {r.shape}")
    if r.shape[-1] < 3:
        return r - r.mean(axis=-1, keepdims=True)
    inner = np.sort(r, axis=-1)[..., 1:-1]
    return r - inner.mean(axis=-1, keepdims=True)


@dataclass(frozen=True)
class TrimmedConfig(RTPOConfig):
    """RTPO's settings with the trimmed-mean sibling baseline.

    estimator: registered advantage estimator (default: this plugin's sibling_trimmed_mean).
    """

    estimator: str = "sibling_trimmed_mean"


@register_method("rtpo_trimmed")
class RTPOTrimmed(ReverseTurn):
    Config = TrimmedConfig


@dataclass(frozen=True)
class LockParams:
    """A combination lock.

    num_turns:   K, turns (digits of the code).
    num_actions: A, choices per turn.
    seed:        which choice is right at each turn.
    """

    num_turns: int = 4
    num_actions: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_turns < 1 or self.num_actions < 2:
            raise ValueError("num_turns must be >= 1 and num_actions >= 2")


def combination_lock(p: LockParams) -> TurnMDP:
    """States per turn: 0 = every choice so far right, 1 = a wrong one made; R = 1 for the right last choice
    in state 0."""
    K, A = p.num_turns, p.num_actions
    code = np.random.default_rng(p.seed).integers(A, size=K)
    P = np.zeros((K, 2, A, 2))
    R = np.zeros((K, 2, A))
    for k in range(K):
        P[k, 0, :, 1] = 1.0
        P[k, 0, code[k], :] = (1.0, 0.0)
        P[k, 1, :, 1] = 1.0
    R[K - 1, 0, code[K - 1]] = 1.0
    return TurnMDP.from_arrays(P, R, init=np.array([1.0, 0.0]))


TASKS.register("combination_lock")(TaskKind(LockParams, combination_lock, lambda p: (p.num_turns, 2, p.num_actions, 1)))
