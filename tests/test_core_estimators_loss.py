"""Estimators and the clipped loss against independent loop references."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rtpo.core import estimators
from rtpo.core.loss import FlatBatch, LossConfig, clipped_policy_loss
from rtpo.core.types import Ragged, TurnBatch

groups = st.integers(1, 4).flatmap(
    lambda g: st.lists(st.lists(st.floats(-3, 3, allow_nan=False), min_size=g, max_size=g), min_size=1, max_size=4)
)


@given(groups)
def test_sibling_advantage_is_return_minus_group_mean_eq7(rows):
    r = np.array(rows)
    adv = estimators.get("sibling_mean")(r)
    for i, row in enumerate(rows):
        for j, x in enumerate(row):
            assert adv[i, j] == pytest.approx(x - sum(row) / len(row), abs=1e-12)
    assert np.allclose(adv.sum(axis=-1), 0.0, atol=1e-9)


def test_one_sibling_gives_zero_advantage_G2():
    assert np.all(estimators.sibling_advantage(np.array([[1.0], [0.0]])) == 0.0)


@given(groups.filter(lambda rows: len(rows[0]) >= 2))
def test_leave_one_out_matches_loop(rows):
    adv = estimators.get("leave_one_out")(np.array(rows))
    for i, row in enumerate(rows):
        for j, x in enumerate(row):
            others = row[:j] + row[j + 1 :]
            assert adv[i, j] == pytest.approx(x - sum(others) / len(others), abs=1e-9)


def test_group_norm_and_mean():
    r = np.array([[1.0, 0.0, 0.0, 1.0]])
    assert np.allclose(estimators.get("group_mean")(r), [[0.5, -0.5, -0.5, 0.5]])
    # n − 1 std (verl, TRL): σ = √(1/3), so ±0.5/σ = ±0.866; population: σ = 0.5, ±1
    assert np.allclose(estimators.get("group_norm")(r), np.array([[1, -1, -1, 1]]) * 0.5 / (3**-0.5 + 1e-6))
    assert np.allclose(estimators.get("group_norm_population")(r), np.array([[1, -1, -1, 1]]) / (1 + 2e-6))
    assert np.all(estimators.get("group_norm")(np.ones((1, 3))) == 0.0)


def test_registry_rejects_unknown_and_duplicate_names():
    with pytest.raises(KeyError, match="valid: .*sibling_mean"):
        estimators.get("nope")
    with pytest.raises(ValueError, match="already registered"):
        estimators.ESTIMATORS.register("sibling_mean")(lambda r: r)


def test_clamped_trajectory_weight_eq105():
    new = np.log(np.array([[0.5, 0.5], [0.9, 0.9]]))
    old = np.log(np.array([[0.25, 0.5], [0.1, 0.1]]))
    w = estimators.clamped_trajectory_weight(new, old, 0.5, 4.0)
    assert w == pytest.approx([2.0, 4.0])  # 2 inside the range; 81 clamped to 4
    with pytest.raises(ValueError):
        estimators.clamped_trajectory_weight(new, old, 2.0, 1.0)


def _batch(lengths, seq_id, rng):
    tok = Ragged.from_rows([rng.integers(0, 5, n) for n in lengths], dtype=np.int64)
    old = Ragged(rng.normal(-1.0, 0.3, tok.values.size), tok.offsets)
    adv = Ragged(np.repeat(rng.normal(0, 1, len(lengths)), lengths), tok.offsets)
    ctx = Ragged.from_rows([np.array([1])] * len(lengths), dtype=np.int64)
    return TurnBatch(ctx, tok, old, adv, np.asarray(seq_id), np.ones(len(lengths)), np.zeros(len(lengths)))


def _reference_eq6(logp, batch, eps, aggregation):
    """Eq. 6 by loops: J = mean over sequences of 1/T Σ_t min(ρA, clip(ρ)A)."""
    per_seq: dict[int, list[float]] = {}
    all_terms = []
    for i in range(len(batch)):
        lo, hi = batch.tokens.offsets[i], batch.tokens.offsets[i + 1]
        for t in range(lo, hi):
            rho = np.exp(logp[t] - batch.old_logp.values[t])
            a = batch.advantages.values[t]
            term = min(rho * a, min(max(rho, 1 - eps), 1 + eps) * a)
            per_seq.setdefault(int(batch.seq_id[i]), []).append(term)
            all_terms.append(term)
    if aggregation == "token-mean":
        return -float(np.mean(all_terms))
    return -float(np.mean([np.mean(v) for v in per_seq.values()]))


@given(st.integers(0, 10_000), st.sampled_from(["seq-mean-token-mean", "token-mean"]), st.floats(0.05, 0.4))
def test_clipped_loss_matches_loop_reference(seed, aggregation, eps):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 5, size=rng.integers(1, 6))
    seq_id = rng.integers(0, 3, size=lengths.size)
    batch = _batch(lengths, seq_id, rng)
    logp = batch.old_logp.values + rng.normal(0, 0.3, batch.num_tokens)
    cfg = LossConfig(clip_eps=eps, aggregation=aggregation, log_ratio_clip=None)
    loss, metrics = clipped_policy_loss(torch.tensor(logp), FlatBatch.from_batch(batch), cfg)
    assert float(loss) == pytest.approx(_reference_eq6(logp, batch, eps, aggregation), rel=1e-9, abs=1e-12)
    assert 0.0 <= metrics["loss/clipfrac"] <= 1.0


def test_gradient_at_theta_old_is_advantage_over_length():
    rng = np.random.default_rng(0)
    batch = _batch([1, 3], [0, 1], rng)
    logp = torch.tensor(batch.old_logp.values, requires_grad=True)
    loss, _ = clipped_policy_loss(logp, FlatBatch.from_batch(batch), LossConfig())
    loss.backward()
    a = batch.advantages.values
    # d(-J)/d logp_t = -A_t / (T_row · num_rows) at ρ = 1 (Eq. 6)
    expected = -a / np.repeat(batch.tokens.lengths, batch.tokens.lengths) / 2
    assert np.allclose(logp.grad.numpy(), expected, atol=1e-12)


def test_clipped_tokens_get_no_gradient():
    ctx = Ragged.from_rows([np.array([0])] * 2, dtype=np.int64)
    tok = Ragged.from_dense(np.array([[1], [2]]))
    old = Ragged.from_dense(np.log(np.array([[0.5], [0.5]])))
    adv = Ragged.from_dense(np.array([[1.0], [-1.0]]))
    batch = TurnBatch(ctx, tok, old, adv, np.arange(2), np.ones(2), np.zeros(2))
    # row 0: ρ = 1.6 > 1+ε with A > 0 -> clipped; row 1: ρ = 0.4 < 1−ε with A < 0 -> clipped
    logp = torch.tensor(np.log([0.8, 0.2]), requires_grad=True)
    loss, metrics = clipped_policy_loss(logp, FlatBatch.from_batch(batch), LossConfig(clip_eps=0.2))
    loss.backward()
    assert np.all(logp.grad.numpy() == 0.0)
    assert metrics["loss/clipfrac"] == 1.0


def test_sequence_ratio_is_length_normalised_gspo():
    rng = np.random.default_rng(1)
    batch = _batch([2, 2], [0, 0], rng)  # one sequence over two rows
    delta = np.array([0.1, -0.3, 0.2, 0.0])
    logp = batch.old_logp.values + delta
    cfg = LossConfig(ratio="sequence", clip_eps=0.5)
    loss, _ = clipped_policy_loss(torch.tensor(logp), FlatBatch.from_batch(batch), cfg)
    s = np.exp(delta.mean())
    a = batch.advantages.values
    expected = -np.mean(np.minimum(s * a, np.clip(s, 0.5, 1.5) * a))
    assert float(loss) == pytest.approx(expected, abs=1e-12)


def test_loss_config_rejects_bad_values():
    with pytest.raises(ValueError, match="clip_eps"):
        LossConfig(clip_eps=1.5)
    with pytest.raises(ValueError, match="ratio"):
        LossConfig(ratio="tokens")
