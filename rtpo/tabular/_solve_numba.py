"""`solve`'s backward induction (C.1, Eq. 20) fused into one compiled call over every turn.

Imported only when solve's kernel is "numba" (or "auto" picks it): numba is the optional `fast` extra.

Layout.  The kernel does not read the CSR matrix.  `lane_layout(mdp)` stores each turn's transitions
once more, with the actions in lanes of LANES = 4: for state s, action block l (actions 4l..4l+3) and
successor j, the four actions' probabilities lie side by side (and their int32 successors, in a second
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


def _lane_sums_intrinsic(blocks: int):
    """An intrinsic (prob, succ, v, base, stride, width, v_off) -> `blocks`·LANES sums: for each block
    b, lane i, Σ_{j<width} prob[base + b·stride + 4j + i] · v[v_off + succ[same]], left to right from 0.0.

    Written in LLVM IR because numba's loop leaves the four lanes scalar: per entry j and block, one
    <4 x double> load of the probabilities, four scalar V loads put into a vector, one fmul and one fadd
    (no fast-math flags: each lane is exactly the scalar chain).  Two blocks advance in the same loop.
    """

    @intrinsic
    def lane_sums(typingctx, prob, succ, v, base, stride, width, v_off):
        ret = types.UniTuple(types.float64, blocks * LANES)
        sig = ret(prob, succ, v, base, stride, width, v_off)

        def codegen(context, builder, signature, args):
            pa = context.make_array(signature.args[0])(context, builder, args[0])
            ia = context.make_array(signature.args[1])(context, builder, args[1])
            va = context.make_array(signature.args[2])(context, builder, args[2])
            i64, f64 = ir.IntType(64), ir.DoubleType()
            vec = ir.VectorType(f64, LANES)
            base_, stride_, width_, voff = (builder.sext(x, i64) if x.type != i64 else x for x in args[3:7])
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
            vecp = vec.as_pointer()
            nxt = []
            for b, acc in enumerate(accs):
                e = builder.add(
                    builder.add(base_, builder.mul(stride_, ir.Constant(i64, b))), builder.shl(j, ir.Constant(i64, 2))
                )
                p = builder.load(builder.bitcast(builder.gep(pa.data, [e]), vecp), align=8)
                g = zero
                for lane in range(LANES):
                    idx = builder.load(builder.gep(ia.data, [builder.add(e, ir.Constant(i64, lane))]))
                    vi = builder.load(builder.gep(va.data, [builder.add(voff, builder.zext(idx, i64))]))
                    g = builder.insert_element(g, vi, ir.Constant(ir.IntType(32), lane))
                nxt.append(builder.fadd(acc, builder.fmul(p, g)))
            j1 = builder.add(j, ir.Constant(i64, 1))
            end = builder.block
            j.add_incoming(j1, end)
            for acc, n in zip(accs, nxt):
                acc.add_incoming(n, end)
            builder.cbranch(builder.icmp_signed("<", j1, width_), loop, done)
            builder.position_at_end(done)
            results = [builder.phi(vec) for _ in accs]  # the phis first here too
            for r, n in zip(results, nxt):
                r.add_incoming(zero, pre)
                r.add_incoming(n, end)
            out = [builder.extract_element(r, ir.Constant(ir.IntType(32), i)) for r in results for i in range(LANES)]
            return context.make_tuple(builder, signature.return_type, out)

        return sig, codegen

    return lane_sums


_lane_sums1 = _lane_sums_intrinsic(1)
_lane_sums2 = _lane_sums_intrinsic(2)


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _finish(row, lo, sums, R, r, D, d, use_disc, n):  # pragma: no cover - compiled
    """row[lo + i] = Q̃ of action lo + i from its sum: ×γ^τ (D[d + a]) where γ ≠ 1, then +r (R[r + a])
    (Eq. 20); −inf past the n real actions (padding: never the maximum, never picked)."""
    for i in range(len(sums)):
        a = lo + i
        if a < n:
            x = sums[i]
            if use_disc:
                x *= D[d + a]
            row[a] = x + R[r + a]
        else:
            row[a] = -np.inf


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
def _turn(P, I, R, D, meta_k, v_next_off, n, tie, q, row, v, actions, blocks):  # pragma: no cover - compiled
    """One turn with a continuation, `blocks` lane blocks per state (a constant where the caller passes
    one, so LLVM unrolls the state's loops); writes V, the greedy actions and, if q is not empty, Q̃."""
    S, B, p_off, r_off, d_off = meta_k[S_K], meta_k[WIDTH], meta_k[P_OFF], meta_k[R_OFF], meta_k[D_OFF]
    v_off, prefetch = meta_k[V_OFF], meta_k[PREFETCH] != 0
    stride = LANES * B  # one block's entries
    span = blocks * stride  # one state's entries
    use_disc = d_off >= 0
    write_q = q.shape[0] != 0
    end = P.shape[0]
    for s in range(S):
        base = p_off + s * span
        if prefetch:
            ahead = base + PREFETCH_AHEAD
            stop = min(ahead + span, end)
            for j in range(ahead, stop, 8):  # 64-byte lines: 8 probabilities ...
                _prefetch(P, j)
            for j in range(ahead, stop, 16):  # ... and 16 int32 successors
                _prefetch(I, j)
        r, d = r_off + s * n, d_off + s * n
        b = 0
        while b + 2 <= blocks:
            _finish(
                row, b * LANES, _lane_sums2(P, I, v, base + b * stride, stride, B, v_next_off), R, r, D, d, use_disc, n
            )
            b += 2
        if b < blocks:
            _finish(
                row, b * LANES, _lane_sums1(P, I, v, base + b * stride, stride, B, v_next_off), R, r, D, d, use_disc, n
            )
        best = _greedy(row, blocks * LANES, n, tie)
        actions[v_off + s] = best
        v[v_off + s] = row[best]
        if write_q:
            for a in range(n):
                q[(v_off + s) * n + a] = row[a]


@numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _last_turn(R, meta_k, n, tie, q, row, v, actions):  # pragma: no cover - compiled
    """Turn K−1: no continuation, Q̃ = r."""
    S, r_off, v_off = meta_k[S_K], meta_k[R_OFF], meta_k[V_OFF]
    write_q = q.shape[0] != 0
    for s in range(S):
        for a in range(n):
            row[a] = R[r_off + s * n + a]
        best = _greedy(row, n, n, tie)
        actions[v_off + s] = best
        v[v_off + s] = row[best]
        if write_q:
            for a in range(n):
                q[(v_off + s) * n + a] = row[a]


@numba.njit(cache=True, nogil=True, boundscheck=False)
def solve_turns(P, I, R, D, meta, n, tie, q, v, actions):  # pragma: no cover - compiled
    """Backward induction over every turn, last first, in one call.

    P, I: the pooled lane layouts (float64 probabilities, int32 successors; `LaneLayout`).
    R, D: the pooled rewards and γ^τ, each turn's (S_k, A) block flat.  meta: (K, 7) int64, per turn
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
        nxt = meta[k + 1, V_OFF]
        if blocks == 2:
            _turn(P, I, R, D, meta[k], nxt, n, tie, q, row, v, actions, 2)
        elif blocks == 1:
            _turn(P, I, R, D, meta[k], nxt, n, tie, q, row, v, actions, 1)
        else:
            _turn(P, I, R, D, meta[k], nxt, n, tie, q, row, v, actions, blocks)


def _lanes(prob: np.ndarray, succ: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One turn's (S, A, B) arrays in the lane layout, flat: (S, ⌈A/4⌉, B, 4) probabilities (float64)
    and successors (int32; dead entries and padded actions → state 0, padded probabilities 0)."""
    S, A, B = prob.shape
    L = -(-A // LANES)
    p = np.zeros((S, L * LANES, B))
    i = np.zeros((S, L * LANES, B), dtype=np.int32)
    p[:, :A] = prob
    i[:, :A] = np.where(prob > 0, succ, 0)
    p = np.ascontiguousarray(p.reshape(S, L, LANES, B).transpose(0, 1, 3, 2)).reshape(-1)
    i = np.ascontiguousarray(i.reshape(S, L, LANES, B).transpose(0, 1, 3, 2)).reshape(-1)
    return p, i


class LaneLayout:
    """An MDP's arrays as `solve_turns` reads them: P, I (lane layouts), R (rewards), D (γ^τ) pooled
    over turns, each distinct input array stored once (shared layers stay shared), and meta."""

    def __init__(self, mdp) -> None:
        K, A = mdp.num_turns, mdp.num_actions
        if max(mdp.num_states) >= 2**31:
            raise ValueError("solve(kernel='numba'): int32 successors hold at most 2**31 - 1 states per turn")
        meta = np.zeros((K, 7), dtype=np.int64)
        meta[:, S_K] = mdp.num_states
        meta[:, V_OFF] = mdp.state_offset[:-1]
        meta[:, D_OFF] = -1
        ps, is_, rs, ds = [], [], [], []
        at: dict[tuple, int] = {}

        def place(key, parts, make) -> int:
            if key not in at:
                x = make()
                at[key] = sum(a.size for a in parts)
                parts.append(x)
            return at[key]

        lane_of: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        for k in range(K):
            meta[k, R_OFF] = place(("r", id(mdp.reward[k])), rs, lambda: mdp.reward[k].reshape(-1))
            if mdp.gamma != 1.0:  # γ^τ as backup computes it: bit-identical
                meta[k, D_OFF] = place(("d", id(mdp.tau[k])), ds, lambda: (mdp.gamma ** mdp.tau[k]).reshape(-1))
            if k == K - 1:
                continue
            key = (id(mdp.prob[k]), id(mdp.succ[k]))  # held by mdp: the ids stay valid
            meta[k, WIDTH] = mdp.prob[k].shape[2]
            if key not in lane_of:
                lane_of[key] = _lanes(mdp.prob[k], mdp.succ[k])
                at[("p", key)] = sum(a.size for a in ps)
                ps.append(lane_of[key][0])
                is_.append(lane_of[key][1])
            meta[k, P_OFF] = at[("p", key)]
            # prefetch unless the turn reads what the later turn (run just before it) has just read and
            # that fits in cache
            nbytes = lane_of[key][0].nbytes + lane_of[key][1].nbytes
            same = k + 1 < K - 1 and (id(mdp.prob[k + 1]), id(mdp.succ[k + 1])) == key
            meta[k, PREFETCH] = 0 if same and nbytes <= PREFETCH_RESIDENT_BYTES else 1
        if sum(a.size for a in ps) >= 2**63 - 1:  # pragma: no cover - a bound of int64 offsets
            raise ValueError("solve(kernel='numba'): the MDP is too large for int64 offsets")

        def pool(parts, dtype):
            out = np.concatenate(parts).astype(dtype, copy=False) if parts else np.empty(0, dtype)
            out.flags.writeable = False
            return out

        self.P, self.I = pool(ps, np.float64), pool(is_, np.int32)
        self.R, self.D = pool(rs, np.float64), pool(ds, np.float64)
        meta.flags.writeable = False
        self.meta = meta


_layouts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def lane_layout(mdp) -> LaneLayout:
    """mdp's LaneLayout, built once per MDP (a TurnMDP is immutable) and dropped with it."""
    layout = _layouts.get(mdp)
    if layout is None:
        layout = _layouts[mdp] = LaneLayout(mdp)
    return layout
