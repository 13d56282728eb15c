"""BL: the comparison methods' estimators are what their papers (or public code) define, by exact computation.

The claims the RTPO-vs-baseline tables rest on: GRPO divides by the unbiased group std (Eq. 9, as verl,
TRL and Tree-GRPO compute it); REFUEL's pair regression is, at θ = θ_old, 4η times a two-sibling
leave-one-out policy gradient and has no log-ratio clamp (Gao et al. 2024); rtpo_adaptive's groups keep
the sibling-mean advantage unbiased, and its `fixed_g` weighting restores fixed-G RTPO's expected
gradient on every state that gets a group (enumerated over all sibling draws); ARPO branches with the
public code's probability clip(τ + β·ΔH) in its stochastic mode.  Each has a mutant in
rtpo/verify/mutants.py (grpo_population_std, refuel_log_ratio_clamped, refuel_eta_ignored,
adaptive_weights_ignored, adaptive_cross_group_baseline, arpo_tau_ignored).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from rtpo.core import methods
from rtpo.core.loss import FlatBatch, LossConfig, clipped_policy_loss, policy_loss
from rtpo.core.methods import arpo as arpo_mod
from rtpo.core.methods import rtpo_adaptive as adaptive_mod
from rtpo.tabular import TurnMDP
from rtpo.verify.harness import make_context


def _method(name: str, **cfg):
    cls = methods.get(name)
    return cls(cls.Config(**cfg))


# -- GRPO ------------------------------------------------------------------------------------------------


def test_BL1_grpo_normalises_by_the_unbiased_group_std_eq9():
    """A = (R − mean) / (σ + 1e-6) with σ² = Σ (R − mean)² / (n − 1) by default, / n with std: population."""
    r = np.array([[1.0, 0.0, 0.0, 0.0], [3.0, 1.0, 0.0, 2.0]])
    for std, dof in (("unbiased", 1), ("population", 0)):
        adv = _method("grpo", G=4, std=std).advantages(r)
        mu = r.mean(axis=1, keepdims=True)
        sigma = np.sqrt(((r - mu) ** 2).sum(axis=1, keepdims=True) / (r.shape[1] - dof))
        np.testing.assert_allclose(
            adv, (r - mu) / (sigma + 1e-6), rtol=1e-12, err_msg=f"GRPO's std={std!r} is not the n−{dof} group std"
        )
    # by hand, one ones-in-four group: σ_unbiased = 0.5, so the 1 gets 0.75 / 0.5 = 1.5
    assert _method("grpo", G=4).advantages(r)[0, 0] == np.float64(0.75) / (0.5 + 1e-6)


# -- REFUEL ----------------------------------------------------------------------------------------------


def _pair_grad(loss_fn, logits, acts, old, adv, weight, seq, cfg):
    logits.grad = None
    flat = FlatBatch(old, torch.tensor(adv), torch.tensor(weight), torch.tensor(seq), int(seq.max()) + 1)
    logp = torch.log_softmax(logits, -1)[acts.reshape(-1)]
    loss_fn(logp, flat, cfg)[0].backward()
    return logits.grad.clone()


def test_BL2_refuel_pair_gradient_is_4_eta_loo_policy_gradient_at_theta_old():
    """∇L_REFUEL = 4η ∇(−J) of Eq. 6 with the two-sibling leave-one-out advantages A_y = R − R′ (Gao et al.
    2024's reduction), through REFUEL's own loss settings (REFUELConfig.loss) and the loss dispatcher."""
    rng = np.random.default_rng(3)
    P, A, eta = 6, 4, 0.7
    logits = torch.tensor(rng.standard_normal(A), requires_grad=True)
    acts = rng.integers(0, A, size=(P, 2))
    R = rng.random((P, 2))
    old = torch.log_softmax(logits.detach(), -1)[acts.reshape(-1)]
    diff = R[:, 0] - R[:, 1]
    cfg = _method("refuel", eta=eta).cfg.loss()
    g_refuel = _pair_grad(
        policy_loss, logits, acts, old, np.repeat(diff, 2), np.tile([1.0, -1.0], P), np.repeat(np.arange(P), 2), cfg
    )
    g_loo = _pair_grad(
        clipped_policy_loss,
        logits,
        acts,
        old,
        np.stack([diff, -diff], 1).reshape(-1),
        np.ones(2 * P),
        np.arange(2 * P),
        LossConfig(),
    )
    torch.testing.assert_close(g_refuel, 4 * eta * g_loo, rtol=1e-12, atol=1e-12, msg="REFUEL ≠ 4η · LOO PG at θ_old")


def test_BL2b_refuel_regression_has_no_log_ratio_clamp():
    """REFUEL's regression has no clamp: a pair whose log-ratio gap ran to 14 (beyond E.3's ±10) gets the
    full gradient 2(Δ(y) − Δ(y′) − η(R − R′)) · (e_y − e_y′) on its two logits (one pair, one token each)."""
    eta, d = 0.5, 1.0  # R − R′
    logp = torch.tensor([2.0, -12.0], dtype=torch.float64, requires_grad=True)  # log π_θ of y, y′
    old = torch.zeros(2, dtype=torch.float64)  # Δ(y) = 2, Δ(y′) = −12: gap 14
    flat = FlatBatch(old, torch.tensor([d, d]), torch.tensor([1.0, -1.0]), torch.tensor([0, 0]), 1, unit_weight=False)
    cfg = _method("refuel", eta=eta).cfg.loss()
    loss, _ = policy_loss(logp, flat, cfg)
    loss.backward()
    residual = 14.0 - eta * d
    np.testing.assert_allclose(
        logp.grad.numpy(),
        [2 * residual, -2 * residual],
        rtol=1e-12,
        err_msg="REFUEL's default loss clamps the log-ratio (REFUEL has no clamp)",
    )


# -- rtpo_adaptive ---------------------------------------------------------------------------------------


def _expected_group_gradient(pi: np.ndarray, r: np.ndarray, n: int, fixed_n: int | None) -> np.ndarray:
    """E over all A^n sibling draws y_1..y_n ~ π of Σ_j w A_j ∇_θ log π(y_j) for a softmax π at one boundary
    state (∇ log π(a) = e_a − π), with A the method's ragged sibling-mean advantages and w its fixed_g
    weight (w = 1 when fixed_n is None: the per_group weighting)."""
    A = pi.size
    w = 1.0 if fixed_n is None else adaptive_mod.group_weights("sibling_mean", np.array([n]), fixed_n)[0]
    total = np.zeros(A)
    for ys in itertools.product(range(A), repeat=n):
        ys = np.array(ys)
        prob = float(np.prod(pi[ys]))
        adv, _ = adaptive_mod.ragged_advantages("sibling_mean", r[ys], np.array([n]))
        total += prob * w * sum(adv[j] * (np.eye(A)[ys[j]] - pi) for j in range(n))
    return total


def test_BL3_adaptive_groups_are_unbiased_and_fixed_g_weighting_restores_fixed_g_eq7():
    """Exact enumeration at one boundary state (A = 3, softmax π, deterministic returns r(a)): a group of n
    siblings with the sibling-mean advantage (Eq. 7) contributes n·c(n)·g = (n − 1)·g in expectation, with
    g = Σ_a π(a) r(a) (e_a − π) (unbiased up to that known factor); with weighting fixed_g every n gives
    fixed-G RTPO's (G − 2)·g."""
    pi = np.array([0.5, 0.3, 0.2])
    r = np.array([1.0, 0.0, 0.4])
    g = sum(pi[a] * r[a] * (np.eye(3)[a] - pi) for a in range(3))
    G = 4  # fixed G: groups of G − 1 = 3 siblings
    for n in (2, 3, 4, 5):
        per_group = _expected_group_gradient(pi, r, n, None)
        np.testing.assert_allclose(
            per_group, (n - 1) * g, atol=1e-12, err_msg=f"a group of {n} is not (n − 1)·g in expectation"
        )
        fixed = _expected_group_gradient(pi, r, n, G - 1)
        np.testing.assert_allclose(
            fixed, (G - 2) * g, atol=1e-12, err_msg=f"fixed_g weighting of a group of {n} ≠ fixed-G RTPO's"
        )
    assert math.isclose(adaptive_mod.own_return_coefficient("sibling_mean", 4), 0.75)
    assert math.isclose(adaptive_mod.own_return_coefficient("leave_one_out", 4), 1.0)


# -- ARPO ------------------------------------------------------------------------------------------------


def _arpo_branches(**cfg) -> float:
    """ARPO's branches per query on a 3-turn chain whose every trunk reaches a tool round (boundary)."""
    P = np.zeros((3, 1, 2, 1))
    P[:2, 0, :, 0] = 1.0  # turns 0 and 1 lead on to the one state of the next turn; turn 2 ends
    mdp = TurnMDP.from_arrays(P, np.zeros((3, 1, 2)), np.array([1.0]))
    ctx = make_context(mdp, seed=1)
    m = _method("arpo", M=4, N=2, **cfg)
    state = m.begin(ctx, np.arange(3))
    return float(state.data.metrics["arpo/branches_per_query"])


def test_BL4_arpo_branches_with_the_public_codes_probability():
    """Stochastic mode (the public code): branch iff clip(u − β·ΔH, 0, 1) ≤ τ, i.e. with probability
    clip(τ + β·ΔH, 0, 1) — α plays no part; deterministic mode (the paper's text): iff clip(α + β·ΔH) > τ.
    β = 0 makes both exact: τ = 1 branches every initial rollout (N = 2 per query), τ = 0 none, whatever α."""
    cfg = arpo_mod.ARPOConfig(alpha=0.1, beta=0.3, tau=0.6)
    h0, h = 0.2, np.array([0.0, 0.5, 1.0, 4.0])
    np.testing.assert_allclose(arpo_mod.branch_probability(h, h0, cfg), np.clip(0.6 + 0.3 * (h - h0), 0, 1))
    det = arpo_mod.ARPOConfig(alpha=0.1, beta=0.3, tau=0.6, stochastic=False)
    np.testing.assert_allclose(arpo_mod.branch_probability(h, h0, det), np.clip(0.1 + 0.3 * (h - h0), 0, 1))
    assert _arpo_branches(alpha=0.0, beta=0.0, tau=1.0) == 2.0, "τ = 1 must branch every initial rollout"
    assert _arpo_branches(alpha=1.0, beta=0.0, tau=0.0) == 0.0, "τ = 0 must never branch"
    assert _arpo_branches(alpha=1.0, beta=0.0, tau=0.0, stochastic=False) == 2.0  # P = α = 1 > τ = 0
