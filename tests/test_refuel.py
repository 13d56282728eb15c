"""REFUEL (rtpo.core.methods.refuel, core.loss.pair_regression_loss): hand-computed on a K = 1 bandit,
its reduction to a two-sibling leave-one-out policy gradient at θ = θ_old, and the pair layout it trains."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rtpo.core import RunContext
from rtpo.core.loss import FlatBatch, LossConfig, clipped_policy_loss, pair_regression_loss, policy_loss
from rtpo.core.methods import base as methods_base
from rtpo.core.train import turn_rows
from rtpo.tabular import SoftmaxTable, TabularEnv, TabularLearner, TabularSampler, TurnMDP
from tests._method_helpers import make

REWARD = np.array([1.0, 0.0, 0.25])  # K = 1, three actions paying exactly these


def _bandit_ctx(lr: float, seed: int = 0) -> RunContext:
    mdp = TurnMDP.from_arrays(np.zeros((1, 1, 3, 1)), REWARD[None, None], np.array([1.0]))
    pol = SoftmaxTable(1, 1, 3)
    p0 = np.zeros((1, 1, 3))  # uniform θ0
    return RunContext(
        TabularEnv(mdp),
        TabularSampler(pol, p0),
        TabularLearner(pol, p0, lr=lr, optimizer="sgd"),
        np.random.default_rng(seed),
    )


@pytest.mark.parametrize("eta", [1.0, 0.5])
def test_k1_one_sgd_step_by_hand(monkeypatch, eta):
    """θ1 = θ0 − lr ∇L with ∇L = (1/P) Σ_pairs 2 (0 − η (R − R′)) (e_y − e_{y′}) at θ0 (∇log π(a) = e_a − π)."""
    seen = {}
    real = methods_base.ppo_update  # Method.ppo, the one caller of ppo_update

    def spy(learner, batch, *a, **kw):
        seen["batch"] = batch
        return real(learner, batch, *a, **kw)

    monkeypatch.setattr(methods_base, "ppo_update", spy)
    lr, P = 0.1, 6
    ctx = _bandit_ctx(lr, seed=2)
    m = make("refuel", eta=eta)
    state = m.begin(ctx, np.arange(P))
    out = m.phase(ctx, state)
    b = seen["batch"]
    acts = b.tokens.values.reshape(P, 2)  # one token (the action) per row, pairs adjacent
    assert np.any(acts[:, 0] != acts[:, 1])  # the seed draws informative pairs
    np.testing.assert_array_equal(b.seq_id, np.repeat(np.arange(P), 2))
    np.testing.assert_array_equal(b.weight, np.tile([1.0, -1.0], P))
    grad = np.zeros(3)
    loss0 = 0.0
    for y, y2 in acts:
        d = REWARD[y] - REWARD[y2]
        grad += 2 * (0.0 - eta * d) * (np.eye(3)[y] - np.eye(3)[y2]) / P
        loss0 += (eta * d) ** 2 / P
    np.testing.assert_allclose(ctx.learner.weights()[0, 0], -lr * grad, atol=1e-15)
    assert out["loss/policy"] == pytest.approx(loss0, abs=1e-15)  # one step: measured at θ0
    assert out["samples/turn_0"] == 2 * P
    assert ctx.budget.rollouts == 3 * P == m.rollouts_per_query(1) * P


def test_at_theta_old_the_gradient_is_4_eta_times_a_two_sibling_leave_one_out_pg():
    """∇L_REFUEL = 4η ∇(−J) of Eq. 6 on the same rows with the leave-one-out advantages of two-sibling
    groups, A_y = R − R′, A_{y′} = R′ − R (seq-mean-token-mean over the 2P rows)."""
    rng = np.random.default_rng(0)
    P, A = 5, 4
    logits = torch.tensor(rng.standard_normal(A), requires_grad=True)
    acts = rng.integers(0, A, size=(P, 2))
    R = rng.random((P, 2))
    old = torch.log_softmax(logits.detach(), -1)[acts.reshape(-1)]
    diff = R[:, 0] - R[:, 1]

    def grad(loss_fn, adv, weight, seq, cfg):
        logits.grad = None
        flat = FlatBatch(old, torch.tensor(adv), torch.tensor(weight), torch.tensor(seq), int(seq.max()) + 1)
        logp = torch.log_softmax(logits, -1)[acts.reshape(-1)]
        loss_fn(logp, flat, cfg)[0].backward()
        return logits.grad.clone()

    eta = 0.7
    g_refuel = grad(
        pair_regression_loss,
        np.repeat(diff, 2),
        np.tile([1.0, -1.0], P),
        np.repeat(np.arange(P), 2),
        LossConfig(objective="pair_regression", eta=eta),
    )
    g_loo = grad(
        clipped_policy_loss, np.stack([diff, -diff], 1).reshape(-1), np.ones(2 * P), np.arange(2 * P), LossConfig()
    )
    torch.testing.assert_close(g_refuel, 4 * eta * g_loo, rtol=1e-12, atol=1e-12)
    # and policy_loss dispatches on the objective
    g2 = grad(
        policy_loss,
        np.repeat(diff, 2),
        np.tile([1.0, -1.0], P),
        np.repeat(np.arange(P), 2),
        LossConfig(objective="pair_regression", eta=eta),
    )
    torch.testing.assert_close(g2, g_refuel)


def test_regression_is_minimised_where_the_log_ratio_gap_equals_eta_times_the_return_gap():
    """Many SGD epochs on one fixed pair: Δ(y) − Δ(y′) → η (R − R′) (the regression's fixed point)."""
    ctx = _bandit_ctx(lr=0.1)  # L = (θ_y − θ_y′ − η(R − R′))² here: Hessian eigenvalue 4, SGD contracts by 0.6
    eta, y, y2 = 0.3, 0, 1
    lp0 = ctx.learner.logprobs(_pair_batch(ctx, y, y2, eta)).values.copy()
    batch = _pair_batch(ctx, y, y2, eta, old=lp0)
    cfg = LossConfig(objective="pair_regression", eta=eta, log_ratio_clip=None)
    for _ in range(200):
        ctx.learner.train_step(batch, cfg)
    lp = ctx.learner.logprobs(batch).values
    gap = (lp[0] - lp0[0]) - (lp[1] - lp0[1])
    assert gap == pytest.approx(eta * (REWARD[y] - REWARD[y2]), abs=1e-9)


def _pair_batch(ctx, y, y2, eta, old=None):
    from rtpo.core.types import Ragged, Trajectory

    def traj(a, lp):
        return Trajectory(
            contexts=Ragged.from_rows([np.array([0, 0])], dtype=np.int64),
            tokens=Ragged.from_rows([np.array([a])], dtype=np.int64),
            logp=Ragged.from_rows([np.array([lp])], dtype=np.float64),
            rewards=np.array([REWARD[a]]),
            durations=np.array([1.0]),
            malformed=np.array([False]),
            query_id=0,
            start_turn=0,
            gamma=1.0,
        )

    olds = [np.log(1 / 3)] * 2 if old is None else list(old)
    d = REWARD[y] - REWARD[y2]
    return turn_rows(
        [traj(y, olds[0]), traj(y2, olds[1])], [0, 0], np.array([d, d]), np.array([0, 0]), np.array([1.0, -1.0])
    )


def test_config_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="eta"):
        make("refuel", eta=0.0)
    with pytest.raises(ValueError, match="objective"):
        LossConfig(objective="squared")
