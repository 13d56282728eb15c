"""MM1: flat training under truncated rollout contexts uses a mismatched ratio; RTPO's ratio is exactly 1 (Eq. 2, 5, 10).

Setting: tool_chain with rollout context ψ = last feedback only (a truncation), and a log-linear policy
whose features index one table holding both full-history contexts (the state) and truncated contexts,
so both views share θ — the rollout engine sees ψ(S_k), a flat trainer re-scores under the full S_k.
"""

from __future__ import annotations

import numpy as np
import torch

from rtpo.core.loss import FlatBatch, LossConfig, clipped_policy_loss
from rtpo.core.types import Ragged, TurnBatch
from rtpo.tabular import evaluate
from rtpo.verify.claims import exact_rows, shared_setting  # noqa: F401 - shared with report.py
from rtpo.verify.harness import make_context, make_rtpo, run_iteration


def test_MM1_rtpo_ratio_exactly_one_eq5():
    """MM1, Eq. 5 / 18: RTPO records c_k = ψ(S_k) at rollout and trains on the same c_k, so at θ = θ_old
    (every phase, after its sync) the core's rollout/train metric is exactly 1 and |log ρ| is exactly 0 —
    also with a truncating ψ and two iterations of updates in between."""
    mdp, policy, theta, _ = shared_setting()
    ctx = make_context(mdp, policy=policy, params=theta, lr=0.2, seed=1)
    metrics = []
    for _ in range(2):
        metrics += run_iteration(make_rtpo(G=4, epochs=2), ctx, 16)
    trained = [m for m in metrics if "consistency/rollout_train_ratio" in m]
    assert len(trained) >= 2 * mdp.num_turns - 1
    for m in trained:
        assert m["consistency/rollout_train_ratio"] == 1.0
        assert m["consistency/abs_log_ratio"] == 0.0


def test_MM1_flat_ratio_mismatch_exact_eq2_10():
    """MM1, Eq. 2 / 10, exact over the rollout distribution at θ = θ_old, stated exactly:
    * per token ρ_flat = π(a | S_k)/π_old(a | ψ(S_k)) ≠ 1 (with positive probability);
    * its arithmetic mean is NOT biased: E_rollout[ρ_flat] = Σ_{a ∈ supp π_old(·|ψ)} π(a | S_k) = 1 for
      full-support policies — the paper's "biased ratio" is not a biased *mean* (finding);
    * its log-mean is: E_rollout[log ρ_flat] = −KL(π(·|ψ(S_k)) ‖ π(·|S_k)) < 0, so the geometric-mean
      ratio the paper plots (0.89 for GRPO) is exp(−E KL) < 1 and RTPO's is 1;
    * a positive fraction of tokens sits outside [1−ε, 1+ε] before any update (clipped at step 0).
    """
    mdp, policy, theta, full_ids = shared_setting()
    eps = 0.2
    for k in range(mdp.num_turns):
        w, states, _, p_roll, p_full = exact_rows(mdp, policy, theta, full_ids, k)
        rho = p_full / p_roll
        mean_rho = np.sum(p_roll * rho, axis=1)
        np.testing.assert_allclose(mean_rho, 1.0, rtol=0, atol=1e-12)
        kl = np.sum(p_roll * np.log(p_roll / p_full), axis=1)
        mean_log = np.sum(p_roll * np.log(rho), axis=1)
        np.testing.assert_allclose(mean_log, -kl, atol=1e-12)
        assert float(w @ kl) > 1e-3  # strictly mismatched (the features differ between the two views)
        outside = np.sum(p_roll * ((rho < 1 - eps) | (rho > 1 + eps)), axis=1)
        assert float(w @ outside) > 0


def test_MM1_flat_gradient_biased_rtpo_exact_eq10():
    """MM1, Eq. 10 through the core loss, exact expectation over the rollout distribution at θ = θ_old:
    the flat surrogate (numerator re-scored under the full context, denominator the rollout log-prob)
    has gradient ∇_θ E_{a∼π_θ(·|S_k)}[A] — the objective of a policy that was never run — while RTPO's
    (recorded c_k) has ∇_θ E_{a∼π_θ(·|ψ(S_k))}[A], the rollout policy's own policy gradient.  With A the
    exact turn-k advantage of the rollout policy, RTPO's gradient equals the exact policy gradient and
    the flat one does not."""
    mdp, policy, theta, full_ids = shared_setting()
    pi = policy.table(theta)
    ev = evaluate(mdp, pi)
    cfg = LossConfig(clip_eps=0.2, log_ratio_clip=None)
    k = 1
    w, states, trunc_ctx, p_roll, p_full = exact_rows(mdp, policy, theta, full_ids, k)
    n, A = p_roll.shape
    adv = ev.q[k][states] - ev.v[k][states][:, None]  # exact A^π(S_k, a)
    rows_w = (w[:, None] * p_roll).reshape(-1) * (n * A)  # the loss averages over rows: weights give the expectation
    tokens = np.tile(np.arange(A), n)
    one = Ragged.from_dense(tokens[:, None])

    def grad(ctx_ids: np.ndarray) -> np.ndarray:
        batch = TurnBatch(
            contexts=Ragged.from_dense(np.stack([np.full(n * A, k), np.repeat(ctx_ids, A)], 1)),
            tokens=one,
            old_logp=Ragged(np.log(p_roll).reshape(-1), one.offsets),
            advantages=Ragged(adv.reshape(-1), one.offsets),
            seq_id=np.arange(n * A),
            weight=rows_w,
            turn=np.full(n * A, k),
        )
        th = torch.tensor(theta, requires_grad=True)
        lp = policy.log_probs(th, torch.full((n * A,), k), torch.as_tensor(np.repeat(ctx_ids, A)))
        lp = lp.gather(1, torch.as_tensor(tokens)[:, None]).squeeze(1)
        loss, _ = clipped_policy_loss(lp, FlatBatch.from_batch(batch), cfg)
        (g,) = torch.autograd.grad(-loss, th)
        return g.numpy()

    # the exact policy gradient of the rollout policy's turn-k objective: Σ_s w_s Σ_a ∇π_θ(a|ψ(s)) A(s, a)
    th = torch.tensor(theta, requires_grad=True)
    probs = torch.softmax(policy.logits(th, torch.full((n,), k), torch.as_tensor(trunc_ctx)), -1)
    (g_true,) = torch.autograd.grad((torch.as_tensor(w)[:, None] * probs * torch.as_tensor(adv)).sum(), th)
    g_rtpo = grad(trunc_ctx)
    g_flat = grad(full_ids[states])
    np.testing.assert_allclose(g_rtpo, g_true.numpy(), rtol=1e-10, atol=1e-12)
    assert np.linalg.norm(g_flat - g_true.numpy()) > 1e-3 * np.linalg.norm(g_true.numpy())
