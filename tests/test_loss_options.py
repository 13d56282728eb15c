"""The loss options every method reaches (rtpo.core.loss through UpdateConfig): the four token
aggregations, the four KL estimators, the entropy bonus and the adaptive KL controller, each against a
hand computation on one batch; the closed-form gradient twin against autograd for every combination.

Mutants that turn these red: swapping k2's ½ for 1 (test_kl_estimators_by_hand); dividing
seq-mean-token-sum-norm by L without S (test_aggregations_by_hand); leaving the entropy bonus's sign
positive (test_entropy_bonus_by_hand, test_entropy_bonus_raises_tabular_entropy); the controller's clip at
±0.2 removed (test_adaptive_kl_by_hand); `_kl_term_grad`'s k2 sign flipped (test_closed_form_matches_autograd).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rtpo.core.loss import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    AdaptiveKL,
    FlatBatch,
    LossConfig,
    clipped_policy_loss,
    clipped_policy_loss_grad,
    closed_form_gradient,
)
from rtpo.core.metrics import reproducible
from rtpo.rundir.runner import run_scenario
from rtpo.scenario.load import ConfigError, load_scenario

# one batch: sequence 0 has two tokens, sequence 1 three; θ = θ_old so every ratio is 1 and each token's
# surrogate is w·A
ADV = [1.0, 3.0, -2.0, 0.5, 4.0]
SEQ = [0, 0, 1, 1, 1]
W = [1.0, 1.0, 2.0, 2.0, 2.0]


def _flat() -> FlatBatch:
    return FlatBatch(
        old_logp=torch.tensor([-1.0, -0.5, -2.0, -0.3, -1.2], dtype=torch.float64),
        advantages=torch.tensor(ADV, dtype=torch.float64),
        weight=torch.tensor(W, dtype=torch.float64),
        token_seq=torch.tensor(SEQ),
        num_seqs=2,
    )


def test_aggregations_by_hand():
    flat = _flat()
    x = [w * a for w, a in zip(W, ADV)]  # 1, 3, -4, 1, 8
    s0, s1 = x[0] + x[1], x[2] + x[3] + x[4]
    L = 4.0
    hand = {
        "token-mean": sum(x) / 5,
        "seq-mean-token-mean": (s0 / 2 + s1 / 3) / 2,
        "seq-mean-token-sum": (s0 + s1) / 2,
        "seq-mean-token-sum-norm": (s0 / L + s1 / L) / 2,
    }
    assert set(hand) == set(AGGREGATIONS)
    for agg, j in hand.items():
        cfg = LossConfig(aggregation=agg, norm_length=L)
        loss, m = clipped_policy_loss(flat.old_logp.clone(), flat, cfg)
        assert float(loss) == pytest.approx(-j, abs=1e-12), f"{agg}: loss {float(loss)} != -J = {-j}"
        assert m["loss/policy"] == pytest.approx(-j, abs=1e-12)


def test_kl_estimators_by_hand():
    flat = _flat()
    logp = flat.old_logp.clone()
    ref = logp + torch.tensor([0.3, -0.2, 4.0, 0.0, -13.0], dtype=torch.float64)  # d = ref − logp
    d = [0.3, -0.2, 4.0, 0.0, -13.0]
    k3 = [math.exp(v) - v - 1 for v in d]
    hand = {
        "k1": sum(-v for v in d) / 5,
        "k2": sum(0.5 * v * v for v in d) / 5,
        "k3": sum(k3) / 5,
        "low_var_kl": sum(min(k, 10.0) for k in k3) / 5,  # exp(4) − 5 = 49.6 and 13 − 1 = 12 are capped
    }
    assert set(hand) == set(KL_ESTIMATORS)
    base, _ = clipped_policy_loss(logp, flat, LossConfig())
    for est, kl in hand.items():
        loss, m = clipped_policy_loss(logp, flat, LossConfig(kl_coef=0.5, kl_estimator=est), ref)
        assert m["loss/kl_ref"] == pytest.approx(kl, rel=1e-12), f"{est}: KL {m['loss/kl_ref']} != hand {kl}"
        assert float(loss - base) == pytest.approx(0.5 * kl, rel=1e-12), f"{est}: β·KL not added to the loss"


def test_entropy_bonus_by_hand():
    flat = _flat()
    ent = torch.tensor([0.5, 1.0, 2.0, 0.0, 1.5], dtype=torch.float64)
    base, _ = clipped_policy_loss(flat.old_logp.clone(), flat, LossConfig())
    loss, m = clipped_policy_loss(flat.old_logp.clone(), flat, LossConfig(entropy_coef=0.2), entropy=ent)
    assert m["loss/entropy"] == pytest.approx(1.0)
    assert float(loss - base) == pytest.approx(-0.2 * 1.0), "the bonus is −c·mean H"
    with pytest.raises(ValueError, match="entropies"):
        clipped_policy_loss(flat.old_logp.clone(), flat, LossConfig(entropy_coef=0.2))
    assert not closed_form_gradient(LossConfig(entropy_coef=0.2))


@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize("est", KL_ESTIMATORS)
@pytest.mark.parametrize("seed", [0, 1])
def test_closed_form_matches_autograd(agg, est, seed):
    rng = np.random.default_rng(seed)
    n = 12
    seq = np.sort(rng.integers(0, 4, n))
    _, idx = np.unique(seq, return_inverse=True)
    flat = FlatBatch(
        old_logp=torch.tensor(rng.normal(-1.0, 0.5, n)),
        advantages=torch.tensor(rng.normal(size=n)),
        weight=torch.tensor(rng.choice([1.0, 0.5, 2.0], n)),
        token_seq=torch.as_tensor(idx),
        num_seqs=int(idx.max()) + 1,
    )
    logp = flat.old_logp + torch.tensor(rng.normal(0.0, 0.3, n))
    ref = flat.old_logp + torch.tensor(rng.normal(0.0, 1.5, n))
    ref[0] = logp[0] + 3.0  # k3 = e³ − 4 > 10: low_var_kl's cap passes no gradient there
    cfg = LossConfig(aggregation=agg, norm_length=7.0, kl_coef=0.3, kl_estimator=est)
    x = logp.clone().requires_grad_(True)
    loss, metrics = clipped_policy_loss(x, flat, cfg, ref)
    loss.backward()
    value, grad, metrics2 = clipped_policy_loss_grad(logp, flat, cfg, ref)
    assert value == pytest.approx(loss.item(), rel=1e-14) and metrics2 == metrics
    torch.testing.assert_close(grad, x.grad, rtol=1e-13, atol=1e-16, msg=f"{agg}/{est}: closed form != autograd")


def test_adaptive_kl_by_hand():
    ctl = AdaptiveKL(0.1, target=0.02, horizon=100)
    ctl.update(0.03, 10)  # error 0.5, clipped to 0.2: β·(1 + 0.2·10/100)
    assert ctl.value == pytest.approx(0.1 * 1.02)
    ctl.update(0.01, 50)  # error −0.5 → −0.2
    assert ctl.value == pytest.approx(0.1 * 1.02 * 0.9)
    ctl.update(0.021, 100)  # error 0.05
    assert ctl.value == pytest.approx(0.1 * 1.02 * 0.9 * 1.05)


def test_bad_loss_options_are_one_line_errors():
    with pytest.raises(ConfigError, match=r"method.*norm_length"):
        load_scenario(None, ["method.loss_aggregation=seq-mean-token-sum-norm"])
    with pytest.raises(ConfigError, match=r"method.*kl_estimator.*k4"):
        load_scenario(None, ["method.kl_estimator=k4"])
    with pytest.raises(ConfigError, match=r"method.*kl_target"):
        load_scenario(None, ["method.kl_target=0.01"])  # no starting kl_coef


def _tabular_loss_run(tmp_path, extra):
    cfg = load_scenario(None, ["budget.iterations=2", "budget.queries_per_iteration=16", "logging.plot=false", *extra])
    return cfg, run_scenario(cfg, out_root=tmp_path, progress=False)


def test_entropy_bonus_raises_tabular_entropy(tmp_path):
    """RTPO on the default family with a large entropy bonus ends with a higher-entropy policy than without."""
    from rtpo.tabular.build import build

    ents = {}
    for c in (0.0, 2.0):
        cfg, res = _tabular_loss_run(tmp_path / str(c), [f"method.entropy_coef={c}", "train.lr=0.3"])
        from rtpo.rundir.checkpoint import latest_path, read_checkpoint

        w = read_checkpoint(latest_path(res.run_dir))["learner"]["params"]
        lp = torch.log_softmax(torch.as_tensor(w), -1)
        ents[c] = float(-(lp.exp() * lp).sum(-1).mean())
        if c:
            assert all("loss/entropy" in m for m in res.metrics), "loss/entropy metric missing"
    assert build  # the tabular backend builds the learner this run used
    assert ents[2.0] > ents[0.0] + 1e-3, f"entropy bonus did not raise the policy's entropy: {ents}"


@pytest.mark.parametrize("placement", ["loss", "reward"])
@pytest.mark.parametrize("method", ["rtpo", "grpo"])
def test_adaptive_kl_moves_and_resumes_exactly(tmp_path, monkeypatch, method, placement):
    """kl_target: the β in use (loss/kl_coef; with the KL in the reward kl_reward/coef, every phase, and
    no loss/kl_coef) moves from kl_coef; a run crashed after some phases and resumed has the same metrics
    (the controller's β comes back from the checkpoint).  Mutant: load_checkpoint_state not restoring β."""
    from rtpo.core.methods.base import Method

    extra = [
        f"method.name={method}",
        f"method.kl_placement={placement}",
        "method.kl_coef=0.05",
        "method.kl_target=0.001",
        "method.kl_horizon=50",
        "method.kl_estimator=low_var_kl",
        "method.loss_aggregation=seq-mean-token-sum",
        "budget.iterations=3",
    ]
    cfg, full = _tabular_loss_run(tmp_path / "a", extra)
    key = "loss/kl_coef" if placement == "loss" else "kl_reward/coef"
    assert all(key in m for m in full.metrics), f"{key} missing from a phase's metrics"
    if placement == "reward":
        assert not any("loss/kl_coef" in m for m in full.metrics), "the reward placement's loss has no KL"
        assert all("kl_reward/token_kl_mean" in m and "kl_reward/penalty_mean" in m for m in full.metrics)
    coefs = [m[key] for m in full.metrics]
    # RTPO's first phase with the KL in the reward also reports begin's trunk rollout, penalised with β0
    # before the controller moved: a row-weighted mean of β0 and the next β
    first_is_beta0 = placement == "loss" or method == "grpo"
    assert (coefs[0] == 0.05 or not first_is_beta0) and len(set(coefs)) > 1, f"the adaptive β did not move: {coefs}"
    real = Method.phase
    calls = {"n": 0}

    def crashing(self, ctx, state):
        calls["n"] += 1
        if calls["n"] == len(full.metrics) - 1:
            raise RuntimeError("simulated crash")
        return real(self, ctx, state)

    monkeypatch.setattr(Method, "phase", crashing)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_scenario(cfg, out_root=tmp_path / "b", progress=False)
    monkeypatch.setattr(Method, "phase", real)
    (run_dir,) = (tmp_path / "b").iterdir()
    resumed = run_scenario(None, resume=run_dir, progress=False)
    assert [reproducible(m) for m in resumed.metrics] == [reproducible(m) for m in full.metrics], (
        "resumed run differs (adaptive β not restored?)"
    )
