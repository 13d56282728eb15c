"""The fused backward-induction step of `solve` (C.1, Eq. 20) as one numba kernel per turn.

Imported only when solve's kernel is "numba" (or "auto" picks it): numba is the optional `fast` extra.
One pass over a turn's states reads each CSR entry (probability, successor), the reward and, where
γ ≠ 1, the discount once, and writes Q̃, V and the one-hot policy row once: no (S, A) temporaries, no
separate compare or gather passes.  Every floating-point operation is the numpy path's, in its order
(scipy's CSR matvec sums a row's entries left to right from 0.0; then ×γ^τ, then +r), and numba is not
given fastmath, so LLVM neither reorders the sums nor contracts them to FMAs: results are bit-identical.
One compiled signature serves every MDP (int32 CSR indices; int64 ones only past 2³¹ entries).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

# entries ahead of the current row that the kernel asks the cache for (8 KB of probabilities): the
# CSR arrays of a turn out of cache stream at about twice the rate with it (bench/solve.json, distinct)
PREFETCH_AHEAD = 1024


@intrinsic
def _prefetch(typingctx, arr, idx):
    """llvm.prefetch (read, keep in all cache levels) of &arr[idx]; a hint, it never faults."""
    sig = types.void(arr, idx)

    def codegen(context, builder, signature, args):
        a = context.make_array(signature.args[0])(context, builder, args[0])
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0"
        )
        ptr = builder.bitcast(builder.gep(a.data, [args[1]]), i8p)
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _sum(data, indices, lo, n, v_next):  # pragma: no cover - compiled
    """Σ_j data[j] · v_next[indices[j]] over the n entries from lo, left to right from 0.0 (scipy's
    csr_matvec order)."""
    acc = 0.0
    for j in range(lo, lo + n):
        acc += data[j] * v_next[np.uint64(indices[j])]  # unsigned: no negative-index wraparound select
    return acc


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _pick(q, s, n, tie, policy, v):  # pragma: no cover - compiled
    """Row s of the greedy step over n actions: the lowest action within tie of the row maximum — the
    maximum propagating a NaN as np.maximum does, so a row holding one picks no action by the compare
    and keeps n−1 — written one-hot into policy[s], with V(s) = q[s, best]."""
    m = q[s, 0]
    for a in range(1, n):
        x = q[s, a]
        m = x if (x > m or x != x) else m  # once NaN, stays NaN (NaN > x and x != x are both false)
    thr = m - tie
    best = n - 1
    for a in range(n - 2, -1, -1):
        best = a if q[s, a] >= thr else best
    for a in range(n):
        policy[s, a] = 0.0
    policy[s, best] = 1.0
    v[s] = q[s, best]


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _turn(data, indices, width, reward, disc, use_disc, v_next, tie, q, v, policy, n):  # pragma: no cover
    """greedy_turn's loop for a turn with a continuation, over n = A actions (constants where the
    caller passes them, so LLVM unrolls the inner loops)."""
    end = data.shape[0] - 1
    span = n * width  # one state's entries
    for s in range(q.shape[0]):
        ahead = s * span + PREFETCH_AHEAD
        if ahead <= end:
            for j in range(ahead, min(ahead + span, end + 1), 8):  # 64-byte lines: 8 probabilities ...
                _prefetch(data, j)
            for j in range(ahead, min(ahead + span, end + 1), 16):  # ... and 16 int32 successors
                _prefetch(indices, j)
        for a in range(n):
            lo = (s * n + a) * width
            acc = _sum(data, indices, lo, width, v_next)
            if use_disc:
                acc *= disc[s, a]
            q[s, a] = acc + reward[s, a]
        _pick(q, s, n, tie, policy, v)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def greedy_turn(last, data, indices, width, reward, disc, v_next, tie, q, v, policy):  # pragma: no cover - compiled
    """Turn k's backup and greedy step, in place.

    last: turn K−1 (no continuation: Q̃ = r; data, indices and v_next are not read).
    data, indices: the turn's CSR arrays (S·A·width entries, row s·A + a holding `width` of them).
    reward: (S, A).  disc: (S, A) γ^τ, or (0, 0) for γ = 1.  v_next: V_{k+1}.
    Writes q (S, A) = Q̃_k (Eq. 20), v (S,) and policy (S, A) one-hot: per row the lowest action within
    `tie` of the NaN-propagating row maximum (action A−1 when the row holds a NaN), and V(s) = Q̃(s, best)
    — `_argmax`'s rule.  The branches below only pick a loop with constant trip counts (8 actions, 8
    successors: the bench's shape) or the general one; every branch computes the same thing.
    """
    S, A = reward.shape
    if last:
        for s in range(S):
            for a in range(A):
                q[s, a] = reward[s, a]
            _pick(q, s, A, tie, policy, v)
    elif disc.shape[0] != 0:
        _turn(data, indices, width, reward, disc, True, v_next, tie, q, v, policy, A)
    elif A == 8 and width == 8:
        _turn(data, indices, 8, reward, disc, False, v_next, tie, q, v, policy, 8)
    else:
        _turn(data, indices, width, reward, disc, False, v_next, tie, q, v, policy, A)
