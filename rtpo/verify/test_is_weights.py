"""IS1 (variance of the stale-continuation product weight) and IS2 (per-token clipping ≠ trajectory weight),
Eq. 4, 14–16, 100–103, 105."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rtpo.core import estimators
from rtpo.core.loss import FlatBatch, LossConfig, clipped_policy_loss
from rtpo.core.types import Ragged, TurnBatch
from rtpo.verify.claims import all_sequences, iid_weight_variance, sequence_weight  # noqa: F401 - shared with report.py
from rtpo.verify.strategies import categorical_pairs, clip_ranges, seeds, token_log_ratios


@settings(max_examples=25)
@given(categorical_pairs(), st.integers(1, 5))
def test_IS1_iid_variance_closed_form_eq102(pair, n):
    """IS1, Eq. 100–102, exact for i.i.d. tokens: E[ω] = 1 and Var(ω) = (1 + χ²(π_new‖π_old))^N − 1,
    enumerating all V^N continuations; ω computed by the core's clamped_trajectory_weight (no clamp)."""
    new, old = pair
    chi2 = float(np.sum(new**2 / old) - 1.0)
    m, var = iid_weight_variance(new, old, n)
    assert m == pytest.approx(1.0, abs=1e-12)
    assert var == pytest.approx((1.0 + chi2) ** n - 1.0, rel=1e-9, abs=1e-12)


@settings(max_examples=20)
@given(st.integers(2, 3), st.integers(1, 5), seeds)
def test_IS1_autoregressive_growth_bounds_eq101(vocab, n, seed):
    """IS1, Eq. 101 "up to conditioning" made exact: for autoregressive policies π(a_t | a_{t−1}), with
    per-context χ²_c = χ²(π_new(·|c)‖π_old(·|c)), E[ω²] lies in [(1 + min_c χ²_c)^N, (1 + max_c χ²_c)^N]
    (tower property, one token at a time); so Var(ω) ≥ (1+δ)^N − 1 for δ = min_c χ²_c."""
    rng = np.random.default_rng(seed)
    old = np.maximum(rng.dirichlet(np.ones(vocab), size=vocab + 1), 0.02)  # row vocab = start context
    new = np.maximum(rng.dirichlet(np.ones(vocab), size=vocab + 1), 0.02)
    old, new = old / old.sum(1, keepdims=True), new / new.sum(1, keepdims=True)
    chi2 = np.sum(new**2 / old, axis=1) - 1.0
    seqs = all_sequences(vocab, n)
    prev = np.concatenate([np.full((seqs.shape[0], 1), vocab), seqs[:, :-1]], axis=1)
    p = np.prod(old[prev, seqs], axis=1)
    w = sequence_weight(np.log(new[prev, seqs]), np.log(old[prev, seqs]))
    second = float(p @ w**2)
    assert float(p @ w) == pytest.approx(1.0, abs=1e-12)
    assert (1 + chi2.min()) ** n * (1 - 1e-12) <= second <= (1 + chi2.max()) ** n * (1 + 1e-12)


@settings(max_examples=60)
@given(token_log_ratios(), clip_ranges)
def test_IS2_per_token_clip_product_bounds_eq16(log_rho, eps):
    """IS2, Eq. 16, exact version.  With ρ_t the token ratios, ω = Π ρ_t:
      (i) Π clip(ρ_t, 1−ε, 1+ε) ∈ [(1−ε)^T, (1+ε)^T] and clip(ω) ∈ [1−ε, 1+ε];
     (ii) Π clip(ρ_t) = ω · Π (clip(ρ_t)/ρ_t): it differs from ω iff the clip factors do not cancel — in
          particular whenever every clipped ratio is clipped on the same side;
    (iii) for T ≥ 2 with every ratio above 1+ε (or below 1−ε) it also differs from clip(ω).
    The paper's "≠ whenever any ratio is clipped" is not exact: see test_IS2_counterexamples."""
    rho = np.exp(log_rho)
    T = rho.size
    clipped = np.clip(rho, 1 - eps, 1 + eps)
    prod_clip = float(np.prod(clipped))
    omega = float(np.prod(rho))
    assert (1 - eps) ** T * (1 - 1e-12) <= prod_clip <= (1 + eps) ** T * (1 + 1e-12)
    assert prod_clip == pytest.approx(omega * float(np.prod(clipped / rho)), rel=1e-12)
    # "clipped" with a margin, so a ratio that touches the boundary to float precision does not count
    above, below = rho > (1 + eps) * (1 + 1e-9), rho < (1 - eps) * (1 - 1e-9)
    if (above.any() and not below.any()) or (below.any() and not above.any()):
        assert not np.isclose(prod_clip, omega, rtol=1e-12, atol=0)
    if T >= 2 and (above.all() or below.all()):
        assert not np.isclose(prod_clip, float(np.clip(omega, 1 - eps, 1 + eps)), rtol=1e-12, atol=0)


def test_IS2_counterexamples_eq4_103():
    """IS2, Eq. 4 / 103 as literally stated are false in two places (minimal counterexamples, ε = 0.2):
    opposite-side clipping cancels — ρ = (1.5, 0.64): Π clip = 1.2·0.8 = 0.96 = ω although both are
    clipped; and one clipped ratio commutes — ρ = (1.5, 1.0): Π clip = 1.2 = clip(Π ρ)."""
    eps = 0.2
    rho = np.array([1.5, 0.64])
    assert np.all((rho > 1 + eps) | (rho < 1 - eps))
    assert np.prod(np.clip(rho, 1 - eps, 1 + eps)) == pytest.approx(np.prod(rho), rel=1e-12)
    rho = np.array([1.5, 1.0])
    assert np.prod(np.clip(rho, 1 - eps, 1 + eps)) == pytest.approx(np.clip(np.prod(rho), 1 - eps, 1 + eps))


@settings(max_examples=40)
@given(token_log_ratios(), st.floats(0.3, 0.9), st.floats(1.1, 3.0))
def test_IS2_core_weight_clips_the_product_eq105(log_rho, rho_min, rho_max):
    """IS2 / Eq. 105, 109–110: the core's off-policy weight ω̄ is clamp(Π_t ρ_t, ρ_min, ρ_max) — the clamp of
    the product — not the product of per-token clips, which differs as soon as two or more tokens
    leave [ρ_min, ρ_max] on the same side."""
    old = np.zeros_like(log_rho)
    got = float(estimators.clamped_trajectory_weight(log_rho[None], old[None], rho_min, rho_max)[0])
    omega = float(np.exp(log_rho.sum()))
    assert got == pytest.approx(min(max(omega, rho_min), rho_max), rel=1e-12)
    rho = np.exp(log_rho)
    if (rho > rho_max).sum() >= 2 and not (rho < rho_min).any():
        assert not np.isclose(got, float(np.prod(np.clip(rho, rho_min, rho_max))), rtol=1e-9)


def _one_token_rows(log_ratio: np.ndarray, adv: np.ndarray) -> TurnBatch:
    n = log_ratio.size
    one = Ragged.from_dense(np.zeros((n, 1), np.int64))
    return TurnBatch(
        contexts=Ragged.from_dense(np.zeros((n, 1), np.int64)),
        tokens=one,
        old_logp=Ragged(np.zeros(n), one.offsets),
        advantages=Ragged(np.asarray(adv, np.float64), one.offsets),
        seq_id=np.arange(n),
        weight=np.ones(n),
        turn=np.zeros(n),
    )


@settings(max_examples=30)
@given(token_log_ratios(max_len=10), clip_ranges, st.sampled_from([1.0, -1.0]))
def test_IS2_core_loss_clips_each_token_eq15(log_rho, eps, sign):
    """IS2, Eq. 6 / 15 through the core loss: each token's surrogate is min(ρ_t A, clip(ρ_t, 1−ε, 1+ε) A),
    so the per-token ratio the loss acts with lies in [1−ε, 1+ε] on the clipped side, and its gradient
    is exactly zero where the clip binds (ρ > 1+ε with A > 0, ρ < 1−ε with A < 0)."""
    adv = np.full(log_rho.size, sign)
    batch = _one_token_rows(log_rho, adv)
    logp = torch.tensor(log_rho, dtype=torch.float64, requires_grad=True)
    cfg = LossConfig(clip_eps=eps, aggregation="token-mean", log_ratio_clip=None)
    loss, _ = clipped_policy_loss(logp, FlatBatch.from_batch(batch), cfg)
    loss.backward()
    rho = np.exp(log_rho)
    per_token = np.minimum(rho * adv, np.clip(rho, 1 - eps, 1 + eps) * adv)
    assert float(loss.detach()) == pytest.approx(-per_token.mean(), rel=1e-12, abs=1e-12)
    binds = ((rho > 1 + eps) & (adv > 0)) | ((rho < 1 - eps) & (adv < 0))
    grad = logp.grad.numpy()
    assert np.all(grad[binds] == 0.0)
    assert np.all(grad[~binds] != 0.0)


def test_IS2_report_gap_grows_with_length():
    """IS2, "the discrepancy compounds with T": with every ratio at ρ = 1.3 > 1+ε (ε = 0.2),
    |log ω − log Π clip(ρ_t)| = T·log(1.3/1.2) grows linearly in T, exactly."""
    eps = 0.2
    for T in range(1, 9):
        rho = np.full(T, 1.3)
        gap = np.log(np.prod(rho)) - np.log(np.prod(np.clip(rho, 1 - eps, 1 + eps)))
        assert gap == pytest.approx(T * np.log(1.3 / 1.2), rel=1e-12)
