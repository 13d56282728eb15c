"""Advantage estimators and importance weights: pure functions on arrays, registered by name.

Shapes: `returns` is (..., n) — the last axis is one group (the G-1 siblings of a boundary, or the G
trajectories of a query); the result has the same shape.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from rtpo.core.registry import Registry

Estimator = Callable[[np.ndarray], np.ndarray]
ESTIMATORS: Registry[Estimator] = Registry("estimator")


def _check_group(returns: np.ndarray, minimum: int) -> np.ndarray:
    r = np.asarray(returns, dtype=np.float64)
    if r.ndim == 0 or r.shape[-1] < minimum:
        raise ValueError(f"an advantage group needs at least {minimum} members, got shape {r.shape}")
    return r


@ESTIMATORS.register("sibling_mean")
def sibling_advantage(returns: np.ndarray) -> np.ndarray:
    """RTPO's sibling baseline, Eq. 7 / Eq. 52: A^H_{j,k} = R_j − V̂_k, V̂_k = mean_j R_j.

    The group is the G−1 siblings of one boundary; the trunk is not in it.  Because R_j is in its own
    baseline, E[A^H_j | S_k, u_j] = (G−2)/(G−1)·A^π(S_k, u_j) (Thm 2(a), Eq. 56–57): G = 2 (one
    sibling) gives A ≡ 0 (G.2, Eq. 107).
    """
    r = _check_group(returns, 1)
    return r - r.mean(axis=-1, keepdims=True)


@ESTIMATORS.register("leave_one_out")
def leave_one_out_advantage(returns: np.ndarray) -> np.ndarray:
    """A_j = R_j − mean_{i≠j} R_i = n/(n−1)·(R_j − mean R).

    Removes the (G−2)/(G−1) shrinkage of Thm 2(a) (SPEC §6): E[A_j | S, u_j] = A^π(S, u_j) exactly.
    """
    r = _check_group(returns, 2)
    n = r.shape[-1]
    return n / (n - 1) * (r - r.mean(axis=-1, keepdims=True))


def group_advantage(returns: np.ndarray, normalize: bool = True, eps: float = 1e-6) -> np.ndarray:
    """GRPO's group-relative advantage, Eq. 1 / Eq. 9: A_i = (R_i − μ_g) / (σ_g + eps).

    normalize=False is the un-normalised form the paper writes in Eq. 1 ("Dr.GRPO"); σ_g is the
    population standard deviation of the group.
    """
    r = _check_group(returns, 1)
    centred = r - r.mean(axis=-1, keepdims=True)
    if not normalize:
        return centred
    return centred / (r.std(axis=-1, keepdims=True) + eps)


ESTIMATORS.register("group_norm")(lambda returns: group_advantage(returns, normalize=True))
ESTIMATORS.register("group_mean")(lambda returns: group_advantage(returns, normalize=False))


def zero_advantage_mask(returns: np.ndarray, atol: float = 1e-12) -> np.ndarray:
    """(...,) True where every member of the group has the same return, so every advantage is 0.

    The paper's zero-advantage rate (τ³-Airline: 89.61% at G=3) is the mean of this mask.
    """
    r = np.asarray(returns, dtype=np.float64)
    return np.ptp(r, axis=-1) <= atol


def clamped_trajectory_weight(
    logp_new: np.ndarray, logp_old: np.ndarray, rho_min: float, rho_max: float
) -> np.ndarray:
    """ω̄ = clamp(Π_{h>k} Π_t π_new/π_old, ρ_min, ρ_max), Eq. 105 / Eq. 109–110.

    logp_new, logp_old: (..., N) per-token log-probs of a reused continuation (the product runs over
    the last axis).  Computed in log space, then clamped.
    """
    if not rho_min <= rho_max:
        raise ValueError(f"rho_min ({rho_min}) must not exceed rho_max ({rho_max})")
    log_w = np.sum(np.asarray(logp_new, np.float64) - np.asarray(logp_old, np.float64), axis=-1)
    return np.clip(np.exp(log_w), rho_min, rho_max)


def get(name: str) -> Estimator:
    return ESTIMATORS.get(name)
