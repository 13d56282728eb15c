"""The clipped loss's closed-form gradient (rtpo/core/loss.py, beside the loss it differentiates) and
the tabular learner's autograd-free step: both equal autograd's results bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rtpo.core import RunContext, methods
from rtpo.core.loss import FlatBatch, LossConfig, clipped_policy_loss, clipped_policy_loss_grad, closed_form_gradient
from rtpo.tabular import SoftmaxTable, TabularEnv, TabularLearner, TabularSampler, tool_chain
from rtpo.tabular.generators import region_chain


def exact_log(r: float) -> float:
    """A float64 x with torch.exp(x) == r exactly (a ratio sitting on the clip boundary)."""
    x = np.log(r)
    for _ in range(64):
        e = float(torch.exp(torch.tensor(x, dtype=torch.float64)))
        if e == r:
            return float(x)
        x = np.nextafter(x, np.inf if e < r else -np.inf)
    raise AssertionError(f"no float64 x with exp(x) == {r}")


def flat_batch(rng: np.random.Generator, n: int, one_token_seqs: bool) -> FlatBatch:
    seq = np.arange(n) if one_token_seqs else np.sort(rng.integers(0, max(1, n // 3), n))
    _, seq_index = np.unique(seq, return_inverse=True)
    return FlatBatch(
        old_logp=torch.tensor(rng.normal(-1.0, 0.5, n)),
        advantages=torch.tensor(rng.normal(size=n)),
        weight=torch.tensor(rng.choice([1.0, 0.5, 2.0], n)),
        token_seq=torch.as_tensor(seq_index),
        num_seqs=int(seq_index.max()) + 1,
        one_token_seqs=one_token_seqs,
    )


@given(
    st.integers(0, 10_000),
    st.integers(1, 40),
    st.booleans(),
    st.sampled_from(["seq-mean-token-mean", "token-mean"]),
    st.sampled_from([0.0, 0.05]),
    st.sampled_from([None, 0.28]),
    st.sampled_from([10.0, 0.5, None]),
)
def test_closed_form_gradient_is_autograds(seed, n, one_token, aggregation, kl, eps_high, log_clip):
    rng = np.random.default_rng(seed)
    flat = flat_batch(rng, n, one_token)
    logp = flat.old_logp + torch.tensor(rng.normal(0.0, 0.4, n))
    logp[: n // 3] = flat.old_logp[: n // 3]  # ratio exactly 1: the min's two arguments tie
    if n > 3:
        logp[-1] = flat.old_logp[-1] + 0.2  # far outside the clip range ...
        logp[-2] = flat.old_logp[-2] + 11.0  # ... and beyond the log-ratio clip
    cfg = LossConfig(aggregation=aggregation, kl_coef=kl, clip_eps_high=eps_high, log_ratio_clip=log_clip)
    if n > 5:  # ratios exactly on the clip boundaries (a clamp passes its gradient there), positive advantage
        hi = cfg.clip_eps if eps_high is None else eps_high
        for i, r in ((-3, 1.0 + hi), (-4, 1.0 - cfg.clip_eps)):
            flat.old_logp[i], logp[i], flat.advantages[i] = 0.0, exact_log(r), abs(float(flat.advantages[i])) + 0.1
    ref = flat.old_logp + torch.tensor(rng.normal(0.0, 0.1, n))
    x = logp.clone().requires_grad_(True)
    loss, metrics = clipped_policy_loss(x, flat, cfg, ref)
    loss.backward()
    value, grad, metrics2 = clipped_policy_loss_grad(logp, flat, cfg, ref)
    assert value == loss.item() and metrics2 == metrics
    if kl == 0.0:
        assert torch.equal(grad, x.grad)
    else:  # the KL term's gradient is summed in another order than autograd's: equal to rounding
        torch.testing.assert_close(grad, x.grad, rtol=1e-14, atol=1e-17)


def test_closed_form_gradient_covers_the_token_ratio_only():
    assert closed_form_gradient(LossConfig())
    assert not closed_form_gradient(LossConfig(ratio="sequence"))
    assert not closed_form_gradient(LossConfig(objective="pair_regression"))
    flat = flat_batch(np.random.default_rng(0), 4, True)
    with pytest.raises(ValueError, match="token-level ratio"):
        clipped_policy_loss_grad(flat.old_logp, flat, LossConfig(ratio="sequence"))


def run(mdp, method: str, closed_form: bool, iterations: int = 3, **cfg):
    policy = SoftmaxTable(mdp.num_turns, mdp.num_contexts, mdp.num_actions, init_scale=0.5)
    rng = np.random.default_rng(0)
    p0 = policy.init_params(rng)
    learner = TabularLearner(policy, p0, lr=0.3, closed_form=closed_form)
    ctx = RunContext(TabularEnv(mdp), TabularSampler(policy, p0), learner, rng)
    cls = methods.get(method)
    m = cls(cls.Config(G=4, epochs=2, **cfg))
    logs = []
    for _ in range(iterations):
        state = m.begin(ctx, np.arange(24))
        while state.pending:
            logs.append(m.phase(ctx, state))
    return learner.weights(), logs, learner.opt.state_dict()


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize(
    "method,cfg",
    [("rtpo", {}), ("rtpo", {"minibatch_size": 16}), ("grpo", {}), ("grpo", {"kl_coef": 0.05})],
)
def test_tabular_learner_closed_form_equals_autograd(method, cfg):
    for mdp in (tool_chain(num_turns=4, num_actions=3, seed=1), region_chain(num_turns=4, num_actions=3, seed=1)):
        w1, logs1, opt1 = run(mdp, method, True, **cfg)
        w0, logs0, opt0 = run(mdp, method, False, **cfg)
        assert np.array_equal(w1, w0)
        assert logs1 == logs0  # metrics (loss, clipfrac, grad norm, ...) identical too
        for s1, s0 in zip(opt1["state"].values(), opt0["state"].values()):
            assert torch.equal(s1["exp_avg"], s0["exp_avg"]) and torch.equal(s1["exp_avg_sq"], s0["exp_avg_sq"])
        assert not np.array_equal(w1, run(mdp, method, True, iterations=2, **cfg)[0])  # it does train


def test_closed_form_step_leaves_absent_turns_without_gradient():
    # an RTPO phase trains one turn: the others get no gradient (None), so Adam cannot move them
    mdp = tool_chain(num_turns=4, num_actions=3, seed=1)
    policy = SoftmaxTable(4, mdp.num_contexts, 3)
    learner = TabularLearner(policy, policy.init_params(np.random.default_rng(0)), closed_form=True)
    ctx = RunContext(TabularEnv(mdp), TabularSampler(policy, learner.weights()), learner, np.random.default_rng(0))
    m = methods.get("rtpo")(methods.get("rtpo").Config(G=4, epochs=1))
    state = m.begin(ctx, np.arange(8))
    m.phase(ctx, state)  # turn K−1
    assert [p.grad is not None for p in learner.parts] == [False, False, False, True]
