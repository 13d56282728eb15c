"""Advantage estimators and importance weights: pure functions on arrays, registered by name.

Shapes: `returns` is (..., n) — the last axis is one group (the G-1 siblings of a boundary, or the G
trajectories of a query); the result has the same shape.
"""

from __future__ import annotations

from collections.abc import Callable

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


GROUP_STDS = ("unbiased", "population")


def group_std(returns: np.ndarray, std: str = "unbiased") -> np.ndarray:
    """σ_g over the last axis, keepdims: "unbiased" divides by n − 1 (torch.std's default, which verl's
    compute_grpo_outcome_advantage, TRL's GRPOTrainer and Tree-GRPO use), "population" by n (numpy's
    default; what this testbed used before).  A group of one has σ = 0 (its advantage is 0 anyway)."""
    if std not in GROUP_STDS:
        raise ValueError(f"std must be one of {GROUP_STDS}, got {std!r}")
    r = np.asarray(returns, dtype=np.float64)
    n = r.shape[-1]
    if std == "population" or n == 1:
        return r.std(axis=-1, keepdims=True)
    return r.std(axis=-1, ddof=1, keepdims=True)


def group_advantage(
    returns: np.ndarray, normalize: bool = True, eps: float = 1e-6, std: str = "unbiased"
) -> np.ndarray:
    """GRPO's group-relative advantage, Eq. 1 / Eq. 9: A_i = (R_i − μ_g) / (σ_g + eps).

    normalize=False is the un-normalised form the paper writes in Eq. 1 ("Dr.GRPO").  σ_g is the
    group's standard deviation as the public implementations compute it (SPEC §3: the n − 1 form,
    std="unbiased"); std="population" keeps the 1/n form.  eps = 1e-6 is added to σ, as verl does.
    """
    r = _check_group(returns, 1)
    centred = r - r.mean(axis=-1, keepdims=True)
    if not normalize:
        return centred
    return centred / (group_std(r, std) + eps)


ESTIMATORS.register("group_norm")(lambda returns: group_advantage(returns, normalize=True))
ESTIMATORS.register("group_norm_population")(lambda returns: group_advantage(returns, std="population"))
ESTIMATORS.register("group_mean")(lambda returns: group_advantage(returns, normalize=False))


def zero_advantage_mask(returns: np.ndarray, atol: float = 1e-12) -> np.ndarray:
    """(...,) True where every member of the group has the same return, so every advantage is 0.

    The paper's zero-advantage rate (τ³-Airline: 89.61% at G=3) is the mean of this mask.
    """
    r = np.asarray(returns, dtype=np.float64)
    # max − min over each group (np.ptp), with the groups as columns of a contiguous copy: numpy then
    # reduces across rows, vectorised, where a reduction over a short last axis costs a loop per group
    by_member = np.ascontiguousarray(np.moveaxis(r, -1, 0))
    return by_member.max(axis=0) - by_member.min(axis=0) <= atol


def clamped_trajectory_weight(logp_new: np.ndarray, logp_old: np.ndarray, rho_min: float, rho_max: float) -> np.ndarray:
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


# -- estimators of the baselines (SPEC §3 "Baseline details") and of the off-policy variant ----------


@ESTIMATORS.register("tree")
def tree_advantage(returns: np.ndarray, eps: float = 1e-6, std: str = "unbiased") -> np.ndarray:
    """Tree-GRPO's advantage (SPEC §3): A = norm over the leaves of the prompt + norm over the leaves of
    the tree, each norm being group_advantage(·, normalize=True, std=std) (n − 1 std, as Tree-GRPO's code).

    returns: (..., M, n) leaf returns of M trees with n leaves each (one prompt per leading index).
    """
    r = _check_group(returns, 1)
    if r.ndim < 2:
        raise ValueError(f"tree_advantage needs (..., M trees, n leaves), got shape {r.shape}")
    flat = r.reshape(r.shape[:-2] + (-1,))
    inter = group_advantage(flat, normalize=True, eps=eps, std=std).reshape(r.shape)
    intra = group_advantage(r, normalize=True, eps=eps, std=std)
    return inter + intra


def seeupo_advantage(returns: np.ndarray, task_mean: np.ndarray, clip: float = 3.0, eps: float = 1e-6) -> np.ndarray:
    """SeeUPO's turn-k advantage before the M reweighting (SPEC §3): A⁰ = R − μ_task, then
    A = clip((A⁰ − mean A⁰) / (std A⁰ + eps), −clip, clip) with mean/std over the whole turn batch.

    returns, task_mean: (B,) the rows' returns and the mean return of each row's query group.
    """
    a0 = np.asarray(returns, np.float64) - np.asarray(task_mean, np.float64)
    if a0.ndim != 1 or a0.size == 0:
        raise ValueError(f"seeupo_advantage needs a non-empty 1-D batch, got shape {a0.shape}")
    return np.clip((a0 - a0.mean()) / (a0.std() + eps), -clip, clip)


def seeupo_reweight(m: np.ndarray, mean_log_ratio: np.ndarray, eps: float = 0.2) -> np.ndarray:
    """SeeUPO's downstream weight after the turn-k update (SPEC §3):
    M ← clip(M · clip(exp(mean_t Δlog π_k), 1−ε, 1+ε), 1−ε, 1+ε)."""
    step = np.clip(np.exp(np.asarray(mean_log_ratio, np.float64)), 1.0 - eps, 1.0 + eps)
    return np.clip(np.asarray(m, np.float64) * step, 1.0 - eps, 1.0 + eps)


def off_policy_turn_value(r_k: np.ndarray, discount_k: np.ndarray, f_kp1: np.ndarray, omega: np.ndarray) -> np.ndarray:
    """Implements Eq. 109 (G.6) / Eq. 105: Q̂^off_{j,k} = r_{j,k} + γ^{τ_{j,k}} · ω̄_{j,k} · F̂_{j,k}^{π_θ0}.

    r_k: turn-k rewards; discount_k: γ^{τ_k}; f_kp1: the reused θ0 continuation's return from turn k+1
    (0 where the episode ended at turn k); omega: the clamped trajectory weight ω̄ (1 = on-policy).
    """
    return np.asarray(r_k, np.float64) + np.asarray(discount_k, np.float64) * np.asarray(
        omega, np.float64
    ) * np.asarray(f_kp1, np.float64)


def arpo_branch_probability(h_now: np.ndarray, h_init: np.ndarray, alpha: float = 0.5, beta: float = 0.2) -> np.ndarray:
    """ARPO's branching probability after a tool call (SPEC §3): P = clip(α + β·(H_now − H_initial), 0, 1),
    with H the entropy normalised to [0, 1]."""
    dh = np.asarray(h_now, np.float64) - np.asarray(h_init, np.float64)
    return np.clip(alpha + beta * dh, 0.0, 1.0)
