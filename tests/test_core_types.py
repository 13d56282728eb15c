"""Core data types: invariants are enforced on construction and Ragged's vectorised ops match loops."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rtpo.core.types import Boundary, Generation, Ragged, ReverseTree, Trajectory, TurnBatch, discounted_return

rows_st = st.lists(st.lists(st.integers(-5, 5), max_size=4), max_size=6)


@given(rows_st, st.data())
def test_ragged_take_matches_python_loop(rows, data):
    r = Ragged.from_rows([np.array(x, dtype=np.int64) for x in rows], dtype=np.int64)
    assert len(r) == len(rows)
    if not rows:
        return
    idx = np.array(data.draw(st.lists(st.integers(0, len(rows) - 1), max_size=8)), dtype=np.int64)
    taken = r.take(idx)
    assert [list(taken[i]) for i in range(len(idx))] == [rows[i] for i in idx]


@given(rows_st)
def test_ragged_dense_roundtrip_and_concat(rows):
    r = Ragged.from_rows([np.array(x, dtype=np.int64) for x in rows], dtype=np.int64)
    dense, mask = r.to_dense(pad=-99)
    assert mask.sum() == r.values.size
    assert [list(dense[i][mask[i]]) for i in range(len(rows))] == rows
    both = Ragged.concat([r, r])
    assert [list(x) for x in both] == rows + rows


def test_ragged_rejects_bad_offsets_and_is_read_only():
    with pytest.raises(ValueError, match="offsets"):
        Ragged(np.arange(3), np.array([0, 2, 1, 3]))
    with pytest.raises(ValueError, match="end at len"):
        Ragged(np.arange(3), np.array([0, 2]))
    r = Ragged(np.arange(3), np.array([0, 1, 3]))
    with pytest.raises(ValueError):
        r.values[0] = 7


def _traj(rewards, durations, gamma=1.0, start=0):
    n = len(rewards)
    one = Ragged.from_dense(np.zeros((n, 1), dtype=np.int64))
    return Trajectory(
        one,
        one,
        Ragged.from_dense(np.zeros((n, 1))),
        np.array(rewards, float),
        np.array(durations, float),
        np.zeros(n, bool),
        query_id=0,
        start_turn=start,
        gamma=gamma,
    )


def test_discounted_return_uses_token_durations_eq19():
    # R = r0 + γ^{τ0} r1 + γ^{τ0+τ1} r2
    t = _traj([1.0, 2.0, 4.0], [2, 3, 1], gamma=0.5)
    assert t.ret == pytest.approx(1.0 + 0.5**2 * 2.0 + 0.5**5 * 4.0, abs=1e-15)
    assert discounted_return(np.array([0.0, 0.0, 1.0]), np.array([5, 5, 5]), 1.0) == 1.0


def test_trajectory_and_batch_invariants():
    with pytest.raises(ValueError, match="rewards"):
        one = Ragged.from_dense(np.zeros((2, 1), dtype=np.int64))
        Trajectory(one, one, Ragged.from_dense(np.zeros((2, 1))), np.zeros(3), np.ones(2), np.zeros(2, bool), 0, 0)
    tok = Ragged.from_rows([np.array([1, 2]), np.array([3])], dtype=np.int64)
    bad_logp = Ragged.from_rows([np.array([0.1]), np.array([0.2, 0.3])])
    with pytest.raises(ValueError, match="align"):
        TurnBatch(tok, tok, bad_logp, bad_logp, np.arange(2), np.ones(2), np.zeros(2))
    with pytest.raises(ValueError, match="identical offsets"):
        Generation(tok, bad_logp)


def test_reverse_tree_rejects_boundaries_past_the_trunk_end():
    trunk = _traj([0.0, 1.0], [1, 1])
    ok = Boundary(trunk=0, k=1, snapshot=(1, 0), context=np.array([1, 0]))
    ReverseTree((trunk,), ((), (ok,)))
    with pytest.raises(ValueError, match="never reached"):
        ReverseTree((trunk,), ((), (), (Boundary(0, 2, None, np.zeros(1)),)))
    with pytest.raises(ValueError, match="filed under"):
        ReverseTree((trunk,), ((ok,), ()))
