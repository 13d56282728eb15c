"""`solve`'s backward induction (C.1, Eq. 20) fused into one compiled call over every turn.

Imported only when solve's kernel is "numba" (or "auto" picks it): numba is the optional `fast` extra.

Layout.  The kernel does not read the CSR matrix.  `lane_layout(mdp)` stores each turn's transitions
once more, with the actions in lanes of LANES = 4: for state s, action block l (actions 4l..4l+3) and
successor j, the four actions' probabilities lie side by side (and their successors, in a second
array of the same shape).  One step of the inner loop then loads four probabilities at once, gathers the
four V_{k+1} values and advances four independent sums with one vector multiply and one vector add.  A
row of the CSR layout holds one action's successors, whose sum is one dependent chain of B additions;
four or eight chains side by side are what keeps the core busy.  Padded actions (A not a multiple of 4)
have probability 0 and successor 0 and are never picked; dead entries (probability 0) point at state
0, as in the CSR matrix.  Turns holding the same arrays (a stationary layer given as `(layer,) * K`)
share one copy, as they share one CSR matrix.

Bit-identity.  Every floating-point operation is the numpy path's, in its order: per action the sum
Σ_j P[j]·V[succ j] left to right from 0.0 over all B entries, zeros included (scipy's csr_matvec), then
×γ^τ, then +r.  Vector lanes are independent sums (no reassociation across lanes), numba is not given
fastmath, and the intrinsics below emit plain fmul/fadd, so LLVM neither reorders nor contracts them
to FMAs.  The greedy step is `solve._argmax`'s rule: the lowest action within `tie` of the
NaN-propagating row maximum, action A−1 for a row holding a NaN, and V(s) = Q̃(s, best).

Outputs.  One call writes V (every turn, one flat array) and the greedy actions (int32): what the
values and the policy need.  Q̃ (S·A floats per turn, 8× V at A = 8) is written only when asked for —
solve's result builds it on first access by a second call — since at 10⁵ states writing it to fresh
pages costs more than the rest of the solve.
"""

from __future__ import annotations

import weakref

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

LANES = 4  # actions per vector: 4 doubles, one 256-bit register
# entries ahead of the current state that the kernel asks the cache for: a turn's layout that is out of
# cache streams faster with it (bench/solve.json, the distinct rows)
PREFETCH_AHEAD = 1024
# a turn whose layout the previous (later) turn has just read, and which fits in cache, is not prefetched
PREFETCH_RESIDENT_BYTES = 16 << 20
# meta columns, one row per turn
S_K, WIDTH, P_OFF, R_OFF, D_OFF, V_OFF, PREFETCH = range(7)


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


def _lane_q_intrinsic(blocks: int):
    """An intrinsic (P, I, v, base, stride, width, v_off, R, r, D, d, disc, n, row, lo) that writes Q̃ of the
    `blocks`·LANES actions lo.. of one state into row[lo:] (Eq. 20): for block b and lane i, with
    e = base + b·stride + LANES·j + i,

        row[lo + LANES·b + i] = (Σ_{j<width} P[e] · v[v_off + I[e]]) [× D[d + lo + LANES·b + i]] + R[r + lo + LANES·b + i]

    the sum left to right from 0.0, the product by γ^τ only where `disc` (a branch: D is empty for γ = 1);
    −inf for actions ≥ n (padding).

    Written in LLVM IR because numba's loop leaves the lanes scalar: per successor j and block, one
    <4 x double> load of the probabilities, one integer load of the four successors (64 bits of uint16,
    128 of uint32: a load per successor made the kernel load-bound, ~15% slower), four scalar V loads
    put into a vector, one fmul and one fadd (no fast-math flags: each lane is exactly the scalar
    chain); every index is unsigned (no negative wraparound code).  Blocks advance in the same loop,
    their chains independent.
    """

    @intrinsic
    def lane_q(typingctx, P, I, v, base, stride, width, v_off, R, r, D, d, disc, n, row, lo):
        sig = types.void(P, I, v, base, stride, width, v_off, R, r, D, d, disc, n, row, lo)

        def codegen(context, builder, signature, args):
            Pa, Ia, va, Ra, Da, rowa = (
                context.make_array(signature.args[i])(context, builder, args[i]) for i in (0, 1, 2, 7, 9, 13)
            )
            i32, i64, f64 = ir.IntType(32), ir.IntType(64), ir.DoubleType()
            vec = ir.VectorType(f64, LANES)
            vecp = vec.as_pointer()

            def as64(x):
                return builder.sext(x, i64) if x.type != i64 else x

            def splat(x):  # an i64 in every lane
                one = builder.insert_element(
                    ir.Constant(ir.VectorType(i64, LANES), ir.Undefined), x, ir.Constant(i32, 0)
                )
                return builder.shuffle_vector(one, one, ir.Constant(ir.VectorType(i32, LANES), [0] * LANES))

            base_, stride_, width_, voff, r_, d_, n_, lo_ = (as64(args[i]) for i in (3, 4, 5, 6, 8, 10, 12, 14))
            it = Ia.data.type.pointee  # the successor type; four of them are loaded as one integer
            wide = ir.IntType(it.width * LANES)
            zero = ir.Constant(vec, [0.0] * LANES)
            pre = builder.block
            loop = builder.append_basic_block("lanes.loop")
            done = builder.append_basic_block("lanes.done")
            builder.cbranch(builder.icmp_signed(">", width_, ir.Constant(i64, 0)), loop, done)
            builder.position_at_end(loop)
            # every phi first: LLVM's verifier wants them at the top of the block
            j = builder.phi(i64, "j")
            accs = [builder.phi(vec, f"acc{b}") for b in range(blocks)]
            j.add_incoming(ir.Constant(i64, 0), pre)
            for acc in accs:
                acc.add_incoming(zero, pre)
            nxt = []
            for b, acc in enumerate(accs):
                e = builder.add(
                    builder.add(base_, builder.mul(stride_, ir.Constant(i64, b))), builder.shl(j, ir.Constant(i64, 2))
                )
                prob = builder.load(builder.bitcast(builder.gep(Pa.data, [e]), vecp), align=8)
                g = zero
                word = builder.load(builder.bitcast(builder.gep(Ia.data, [e]), wide.as_pointer()), align=2)
                for lane in range(LANES):
                    idx = builder.trunc(builder.lshr(word, ir.Constant(wide, it.width * lane)), it)
                    x = builder.load(builder.gep(va.data, [builder.add(voff, builder.zext(idx, i64))]))
                    g = builder.insert_element(g, x, ir.Constant(i32, lane))
                nxt.append(builder.fadd(acc, builder.fmul(prob, g)))
            j1 = builder.add(j, ir.Constant(i64, 1))
            end = builder.block
            j.add_incoming(j1, end)
            for acc, x in zip(accs, nxt):
                acc.add_incoming(x, end)
            builder.cbranch(builder.icmp_signed("<", j1, width_), loop, done)
            builder.position_at_end(done)
            sums = [builder.phi(vec) for _ in accs]  # the phis first here too
            for r, x in zip(sums, nxt):
                r.add_incoming(zero, pre)
                r.add_incoming(x, end)
            neg_inf = ir.Constant(vec, [float("-inf")] * LANES)
            n_vec, lo_vec = splat(n_), splat(lo_)
            ats = [builder.add(lo_, ir.Constant(i64, LANES * b)) for b in range(blocks)]
            flag = builder.icmp_unsigned("!=", builder.zext(args[11], i64), ir.Constant(i64, 0))
            plain = builder.block
            with builder.if_then(flag):
                scaled = [
                    builder.fmul(
                        x, builder.load(builder.bitcast(builder.gep(Da.data, [builder.add(d_, at)]), vecp), align=8)
                    )
                    for x, at in zip(sums, ats)
                ]
                then = builder.block
            merged = [builder.phi(vec) for _ in sums]  # the phis first in the merge block
            for phi, x, y in zip(merged, sums, scaled):
                phi.add_incoming(y, then)
                phi.add_incoming(x, plain)
            for b, (x, at) in enumerate(zip(merged, ats)):
                rp = builder.gep(Ra.data, [builder.add(r_, at)])
                x = builder.fadd(x, builder.load(builder.bitcast(rp, vecp), align=8))
                lane_ids = builder.add(
                    lo_vec, ir.Constant(ir.VectorType(i64, LANES), [LANES * b + i for i in range(LANES)])
                )
                x = builder.select(builder.icmp_unsigned("<", lane_ids, n_vec), x, neg_inf)
                builder.store(x, builder.bitcast(builder.gep(rowa.data, [at]), vecp), align=8)
            return context.get_dummy_value()

        return sig, codegen

    return lane_q


_lane_q1, _lane_q2 = _lane_q_intrinsic(1), _lane_q_intrinsic(2)


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _greedy(row, m, n, tie):  # pragma: no cover - compiled
    """The lowest action within tie of the NaN-propagating maximum of row[:m] (padded lanes −inf),
    n−1 when the maximum is NaN: `solve._argmax`'s rule, without branches."""
    top = row[0]
    for a in range(1, m):
        x = row[a]
        top = x if (x > top or x != x) else top  # once NaN, stays NaN (NaN > x and x != x are both false)
    thr = top - tie
    best = n - 1
    for a in range(m - 1, -1, -1):
        best = a if row[a] >= thr else best
    return best


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _store(row, m, n, tie, at, q, v, actions):  # pragma: no cover - compiled
    """The greedy step of the state at flat index `at` from its Q̃ row: its action, V and, if q is not
    empty, its Q̃ (the n real actions)."""
    best = _greedy(row, m, n, tie)
    at = np.uint64(at)
    actions[at] = best
    v[at] = row[best]
    if q.shape[0] != 0:
        for a in range(n):
            q[at * np.uint64(n) + np.uint64(a)] = row[a]


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _turn(P, I, R, D, meta_k, v_next_off, n, tie, q, row, v, actions, blocks, B):  # pragma: no cover - compiled
    """One turn with a continuation, `blocks` lane blocks of B successors per state (constants where the
    caller passes them, so LLVM unrolls the state's loops); writes V, the greedy actions and, if q is not
    empty, Q̃."""
    S, p_off, r_off, d_off = meta_k[S_K], meta_k[P_OFF], meta_k[R_OFF], meta_k[D_OFF]
    v_off, prefetch = meta_k[V_OFF], meta_k[PREFETCH] != 0
    stride = LANES * B  # one block's entries
    span = blocks * stride  # one state's entries
    m = blocks * LANES  # lanes per state
    use_disc = d_off >= 0
    end = P.shape[0]
    for s in range(S):
        base = p_off + s * span
        if prefetch:
            ahead = base + PREFETCH_AHEAD
            stop = min(ahead + span, end)
            for j in range(ahead, stop, 8):  # 64-byte lines: 8 probabilities ...
                _prefetch(P, j)
            for j in range(ahead, stop, 64 // I.itemsize):  # ... and 32 uint16 or 16 uint32 successors
                _prefetch(I, j)
        r, d = np.uint64(r_off + s * m), np.uint64(d_off + s * m)  # R, D: (S, m) lanes (d unread if γ = 1)
        lo = 0
        while lo + 2 * LANES <= m:
            _lane_q2(P, I, v, base + lo * B, stride, B, v_next_off, R, r, D, d, use_disc, n, row, lo)
            lo += 2 * LANES
        if lo < m:
            _lane_q1(P, I, v, base + lo * B, stride, B, v_next_off, R, r, D, d, use_disc, n, row, lo)
        _store(row, m, n, tie, s + v_off, q, v, actions)


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _last_turn(R, meta_k, n, tie, q, row, v, actions):  # pragma: no cover - compiled
    """Turn K−1: no continuation, Q̃ = r."""
    S, r_off, v_off = meta_k[S_K], meta_k[R_OFF], meta_k[V_OFF]
    m = row.shape[0]
    for s in range(S):
        for a in range(n):
            row[a] = R[np.uint64(r_off + s * m + a)]
        _store(row, n, n, tie, s + v_off, q, v, actions)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def solve_turns(P, I, R, D, meta, n, tie, q, v, actions):  # pragma: no cover - compiled
    """Backward induction over every turn, last first, in one call.

    P, I: the pooled lane layouts (float64 probabilities, uint16 or uint32 successors; `LaneLayout`).
    R, D: the pooled rewards and γ^τ, each turn's (S_k, m) lanes flat, m = ⌈A/4⌉·4.  meta: (K, 7) int64, per turn
    S_k, B_k, and the offsets of its layout in P/I, its rewards in R, its γ^τ in D (−1: γ = 1) and its
    states in v/actions; and whether to prefetch its layout.  n: A.
    Writes v (Σ_k S_k) = V_k, actions (Σ_k S_k) int32 = the greedy action of every state and, if q is
    not empty, q (Σ_k S_k · A) = Q̃_k (Eq. 20).  The branches only pick a loop with a constant number of
    lane blocks (A ≤ 4, A ≤ 8) or the general one; each computes the same thing.
    """
    K = meta.shape[0]
    blocks = (n + LANES - 1) // LANES
    row = np.empty(blocks * LANES)
    _last_turn(R, meta[K - 1], n, tie, q, row, v, actions)
    for k in range(K - 2, -1, -1):
        nxt, B = meta[k + 1, V_OFF], meta[k, WIDTH]
        if blocks == 2 and B == 8:
            _turn(P, I, R, D, meta[k], nxt, n, tie, q, row, v, actions, 2, 8)
        elif blocks == 2:
            _turn(P, I, R, D, meta[k], nxt, n, tie, q, row, v, actions, 2, B)
        elif blocks == 1:
            _turn(P, I, R, D, meta[k], nxt, n, tie, q, row, v, actions, 1, B)
        else:
            _turn(P, I, R, D, meta[k], nxt, n, tie, q, row, v, actions, blocks, B)


def successor_dtype(mdp) -> np.dtype:
    """The narrowest unsigned type that holds every successor index: uint16 where no turn has more than
    2¹⁶ states (10 bytes a transition entry instead of 12: the solve streams them), else uint32."""
    if max(mdp.num_states) > 2**32:
        raise ValueError("solve(kernel='numba'): successors are uint32, at most 2**32 states per turn")
    return np.dtype(np.uint16 if max(mdp.num_states) <= 2**16 else np.uint32)


def _lanes(x: np.ndarray, dtype) -> np.ndarray:
    """One turn's (S, A, B) array in the lane layout, flat: (S, ⌈A/4⌉, B, 4) of `dtype`, padded actions 0."""
    S, A, B = x.shape
    L = -(-A // LANES)
    out = np.zeros((S, L * LANES, B), dtype=dtype)
    out[:, :A] = x
    return np.ascontiguousarray(out.reshape(S, L, LANES, B).transpose(0, 1, 3, 2)).reshape(-1)


def _successor_lanes(prob: np.ndarray, succ: np.ndarray, dtype) -> np.ndarray:
    """succ in the lane layout, dead entries (probability 0) and padded actions → state 0."""
    return _lanes(np.where(prob > 0, succ, 0), dtype)


class _Pool:
    """Arrays laid end to end, each key stored once: `add(key, build, *args)` gives the key's offset,
    building its array as build(*args) on first sight; `array` is the pooled, read-only result."""

    def __init__(self, dtype) -> None:
        self.dtype, self.parts, self.offset = dtype, [], {}
        self.size = 0

    def add(self, key, build, *args) -> int:
        if key not in self.offset:
            x = build(*args)
            self.offset[key], self.size = self.size, self.size + x.size
            self.parts.append(x)
        return self.offset[key]

    def array(self) -> np.ndarray:
        out = np.concatenate(self.parts).astype(self.dtype, copy=False) if self.parts else np.empty(0, self.dtype)
        out.flags.writeable = False
        return out


class LaneLayout:
    """An MDP's arrays as `solve_turns` reads them, pooled over turns, each distinct input array stored
    once (shared layers stay shared): P, I (the lane layouts of prob and succ), R (rewards) and D (γ^τ,
    empty for γ = 1) in the (S_k, m) lanes of the layout, m = ⌈A/4⌉·4 (the padded lanes, R −inf and
    D 1, are read but never used: the kernel masks them to −inf); and meta."""

    def __init__(self, mdp) -> None:
        K, A = mdp.num_turns, mdp.num_actions
        m = -(-A // LANES) * LANES
        idx_t = successor_dtype(mdp)
        P, I, R, D = _Pool(np.float64), _Pool(idx_t), _Pool(np.float64), _Pool(np.float64)

        def lanes_of(x: np.ndarray, fill: float) -> np.ndarray:  # (S, A) -> (S, m), flat
            out = np.full((x.shape[0], m), fill)
            out[:, :A] = x
            return out.reshape(-1)

        meta = np.zeros((K, 7), dtype=np.int64)
        meta[:, S_K] = mdp.num_states
        meta[:, V_OFF] = mdp.state_offset[:-1]
        meta[:, D_OFF] = -1
        for k in range(K):
            reward, tau = mdp.reward[k], mdp.tau[k]  # held by mdp: their ids stay valid
            meta[k, R_OFF] = R.add(id(reward), lanes_of, reward, -np.inf)
            if mdp.gamma != 1.0:  # γ^τ as backup computes it: bit-identical
                meta[k, D_OFF] = D.add(id(tau), lambda t: lanes_of(mdp.gamma**t, 1.0), tau)
            if k == K - 1:
                continue
            prob, succ = mdp.prob[k], mdp.succ[k]
            key = (id(prob), id(succ))
            meta[k, WIDTH] = prob.shape[2]
            meta[k, P_OFF] = P.add(key, _lanes, prob, np.float64)
            i_off = I.add(key, _successor_lanes, prob, succ, idx_t)
            assert i_off == meta[k, P_OFF]  # the same entries in the same order: one offset serves both
            # prefetch, unless the turn reads the layout that the turn after it (run just before) has just
            # read and that fits in cache
            nbytes = mdp.prob[k].size // A * m * (8 + idx_t.itemsize)
            same = k + 1 < K - 1 and (id(mdp.prob[k + 1]), id(mdp.succ[k + 1])) == key
            meta[k, PREFETCH] = 0 if same and nbytes <= PREFETCH_RESIDENT_BYTES else 1
        self.P, self.I, self.R, self.D = P.array(), I.array(), R.array(), D.array()
        meta.flags.writeable = False
        self.meta = meta


_layouts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def lane_layout(mdp) -> LaneLayout:
    """mdp's LaneLayout, built once per MDP (a TurnMDP is immutable) and dropped with it."""
    layout = _layouts.get(mdp)
    if layout is None:
        layout = _layouts[mdp] = LaneLayout(mdp)
    return layout
