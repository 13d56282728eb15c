"""The columnar tabular path (rollouts as rtpo.core.types.Rollouts, vectorised returns and batches) gives
exactly the per-episode path's results.

Bit-identical, not merely close: both paths draw the same random numbers in the same order, sample
with the same sampler and train with the same learner and loss; the columnar path only replaces
per-episode Python loops by gathers over the same arrays.  Returns are summed per episode with numpy's
own reduction of a length-L row (segment_returns groups episodes by length for that), so they equal
Trajectory.ret to the last bit, and so do advantages, batches, parameters and every metric.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from rtpo.core.types import Rollouts, discounted_return, segment_returns
from rtpo.tabular import SoftmaxTable, TabularEnv, TabularSampler, tool_chain
from rtpo.tabular.generators import region_chain
from tests._method_helpers import make, run, stack

MDPS = {
    "tool_chain": lambda: tool_chain(num_turns=5, num_actions=3, seed=1),
    "region_chain": lambda: region_chain(num_turns=5, num_actions=3, seed=2, early_answer=True, gamma=0.9),
}


def _run(mdp, name: str, columnar: bool, iterations: int = 3, **cfg):
    _, _, ctx = stack(mdp, seed=7, lr=0.2, init_scale=0.5, columnar=columnar)
    metrics = run(make(name, **cfg), ctx, iterations, queries=12)
    return ctx.learner.weights(), metrics, ctx.budget


@pytest.mark.parametrize("task", sorted(MDPS))
@pytest.mark.parametrize(
    "name,cfg",
    [
        ("rtpo", dict(G=4, epochs=2)),
        ("rtpo", dict(G=3, epochs=1, minibatch_size=5, drop_zero_groups=True)),
        ("grpo", dict(G=4, epochs=2)),
        ("grpo", dict(G=3, epochs=2, minibatch_size=4, normalize=False)),
    ],
)
def test_columnar_path_is_bit_identical_to_the_per_episode_path(task, name, cfg):
    w_col, m_col, b_col = _run(MDPS[task](), name, True, **cfg)
    w_epi, m_epi, b_epi = _run(MDPS[task](), name, False, **cfg)
    assert np.array_equal(w_col, w_epi), np.abs(w_col - w_epi).max()
    assert m_col == m_epi
    assert b_col == b_epi
    assert np.abs(w_col).max() > 0  # training moved θ, so the comparison is not vacuous


def test_the_comparison_sees_a_one_ulp_change(monkeypatch):
    """The identity test is not vacuous: one ulp on the columnar returns changes the parameters."""
    orig = Rollouts.returns
    monkeypatch.setattr(Rollouts, "returns", lambda self: np.nextafter(orig(self), np.inf))
    w_col, _, _ = _run(MDPS["region_chain"](), "rtpo", True, G=4, epochs=2)
    monkeypatch.undo()
    w_epi, _, _ = _run(MDPS["region_chain"](), "rtpo", False, G=4, epochs=2)
    assert not np.array_equal(w_col, w_epi)


def test_segment_returns_equal_discounted_return_bit_for_bit():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 20, size=300)
    n = int(lengths.sum())
    reward = rng.standard_normal(n) * rng.random(n) ** 4
    duration = rng.integers(1, 5, size=n).astype(np.float64)
    start = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    pick = rng.permutation(300)[:200]  # any subset and order of segments
    for gamma in (1.0, 0.97):
        got = segment_returns(reward, duration, start[pick], lengths[pick], gamma)
        want = [
            discounted_return(reward[s : s + c], duration[s : s + c], gamma) for s, c in zip(start[pick], lengths[pick])
        ]
        assert np.array_equal(got, np.array(want))


def test_rollouts_episodes_select_and_pickle():
    from rtpo.core.rollout import rollout

    mdp = region_chain(num_turns=4, num_actions=3, seed=0, early_answer=True)
    pol = SoftmaxTable(mdp.num_turns, mdp.num_contexts, mdp.num_actions, init_scale=1.0)
    rng = np.random.default_rng(0)
    env, sampler = TabularEnv(mdp), TabularSampler(pol, pol.init_params(rng))
    q = np.arange(6)
    res = rollout(env, sampler, env.reset(q, rng), q, rng, n=3, record_boundaries=True)
    cols = res.columns
    assert isinstance(cols, Rollouts) and res.trajectories is cols and len(cols) == 18
    trajs = list(cols)
    assert [t.num_turns for t in trajs] == list(cols.num_rows)
    assert np.array_equal(cols.returns(), [t.ret for t in trajs])
    assert sum(t.num_turns for t in trajs) == res.turns
    # episodes end early (early_answer), so the lengths differ and the per-length grouping is exercised
    assert len(set(cols.num_rows.tolist())) > 1
    sel = cols.select(np.array([5, 5, 0]))
    assert [t.query_id for t in sel] == [trajs[5].query_id] * 2 + [trajs[0].query_id]
    assert np.array_equal(sel[0].tokens.values, trajs[5].tokens.values)
    back = pickle.loads(pickle.dumps(cols))
    assert np.array_equal(back.returns(), cols.returns()) and np.array_equal(back.snapshots, cols.snapshots)
    with pytest.raises(AttributeError):
        cols.gamma = 0.5
    # the boundaries a per-episode consumer reads are the recorded ones
    b = res.boundaries[2]
    assert [x.k for x in b] == list(range(trajs[2].num_turns))
    assert np.array_equal(b[0].context, trajs[2].contexts[0])
    with pytest.raises(ValueError, match="at least one row"):
        Rollouts(**{**{k: getattr(cols, k) for k in Rollouts.__slots__}, "num_rows": np.zeros(18, np.int64)})


@pytest.mark.parametrize("scenario", ["scenarios/tabular/default.yaml", "scenarios/tabular/region_chain.yaml"])
def test_backend_rollout_path_option_selects_the_path_with_equal_results(scenario):
    """`backend.rollout_path` (default columnar) keeps the per-episode path selectable from a scenario."""
    from pathlib import Path

    from rtpo.scenario.backends import get_backend
    from rtpo.scenario.load import load_scenario

    root = Path(__file__).resolve().parents[1]
    out = {}
    for path in ("columnar", "per_episode"):
        cfg = load_scenario(root / scenario, ["budget.queries_per_iteration=8", f"backend.rollout_path={path}"])
        built = get_backend(cfg.backend.kind).build(cfg)
        assert built.ctx.columnar is (path == "columnar")
        method = cfg.method.build()
        for _ in range(2):
            state = method.begin(built.ctx, np.arange(8))
            while state.pending:
                method.phase(built.ctx, state)
        out[path] = built.ctx.learner.weights()
    assert load_scenario(root / scenario).backend.rollout_path == "columnar"
    assert np.array_equal(out["columnar"], out["per_episode"])


def test_loss_shortcut_for_one_token_sequences_is_exact_and_only_taken_there():
    """FlatBatch.one_token_seqs skips the sequence mean only where every sequence is one token; the loss
    and its gradient equal the full segment-mean computation bit for bit."""
    import dataclasses

    import torch

    from rtpo.core.loss import FlatBatch, LossConfig, clipped_policy_loss
    from rtpo.core.types import Ragged, TurnBatch

    rng = np.random.default_rng(3)
    n = 50

    def batch(seq_id):
        tok = Ragged.from_dense(rng.integers(0, 4, size=(n, 1)))
        return TurnBatch(
            Ragged.from_dense(np.zeros((n, 2), np.int64)),
            tok,
            Ragged(rng.standard_normal(n) - 1.5, tok.offsets),
            Ragged(rng.standard_normal(n), tok.offsets),
            seq_id,
            np.ones(n),
            np.zeros(n, np.int64),
        )

    rtpo_rows = FlatBatch.from_batch(batch(np.arange(n)))
    grpo_rows = FlatBatch.from_batch(batch(np.repeat(np.arange(10), 5)))  # 5 one-token rows per sequence
    shuffled = FlatBatch.from_batch(batch(rng.permutation(n)))
    assert rtpo_rows.one_token_seqs and not grpo_rows.one_token_seqs and not shuffled.one_token_seqs
    for ratio in ("token", "sequence"):
        cfg = LossConfig(ratio=ratio, aggregation="seq-mean-token-mean")
        out = []
        for flat in (rtpo_rows, dataclasses.replace(rtpo_rows, one_token_seqs=False)):
            logp = torch.tensor(rng.standard_normal(n) * 0 + np.linspace(-2, -1, n), requires_grad=True)
            value, metrics = clipped_policy_loss(logp, flat, cfg)
            value.backward()
            out.append((float(value), metrics, logp.grad.numpy().copy()))
        assert out[0][0] == out[1][0] and out[0][1] == out[1][1] and np.array_equal(out[0][2], out[1][2])


@pytest.mark.parametrize("width", [1, 2, 3, 4, 5, 8])
def test_inverse_cdf_count_equals_the_compare_sum(width, monkeypatch):
    """The sampler's and the environment's inverse-CDF index (a popcount of the compare row for widths
    1, 2, 4, 8) counts exactly what (cum <= u).sum(-1) counts, draws on a CDF entry and ties included,
    with or without numpy's bitwise_count."""
    from rtpo.tabular import backend

    rng = np.random.default_rng(width)
    cum = np.cumsum(rng.integers(0, 3, size=(300, 3, width)) / 4.0, axis=-1)  # repeated entries: ties
    u = np.where(rng.random((300, 3)) < 0.5, cum[..., rng.integers(0, width)], rng.random((300, 3)) * 2)
    want = (cum <= u[..., None]).sum(axis=-1)
    got = backend._count_at_most(cum, u)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    assert np.array_equal(backend._count_at_most(cum[:, 0], u[:, 0]), want[:, 0])
    monkeypatch.delattr(np, "bitwise_count")  # numpy < 2: the plain sum
    assert np.array_equal(backend._count_at_most(cum, u), want)


def test_zero_advantage_mask_is_the_group_range():
    from rtpo.core.estimators import zero_advantage_mask

    rng = np.random.default_rng(0)
    r = rng.integers(0, 3, size=(4, 50, 5)).astype(np.float64)
    r[0, :10] = 1.0  # tied groups
    r[1, 0, 2] = np.nan
    for x in (r, r[0], r[0, 0]):
        assert np.array_equal(zero_advantage_mask(x), np.ptp(x, axis=-1) <= 1e-12)
