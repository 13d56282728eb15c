"""Exact solve against mdptoolbox-hiive's FiniteHorizon and against memory bandwidth; writes bench/solve.json.

    python bench/bench_solve.py [--repeats 15]          (needs the `bench` extra: mdptoolbox-hiive)

The MDP is stationary so that FiniteHorizon can express it without blowing it up: one random sparse
layer (S states, A = 8 actions, 8 successors per (s, a)) repeated for K = 8 turns, the last turn ending
every episode; "states" is K·S, the states backward induction visits (10⁴ and 10⁵).  rtpo holds the
K turns as its usual per-turn arrays (K distinct copies), FiniteHorizon one (S, S) CSR matrix per action
that it reuses at every stage.  Both V_0 are checked equal.

Timings are minimums over `repeats` interleaved rounds (A B B A ...), each round also timing a streaming
copy of a 256 MB array (bytes read + written per second), so every ratio comes from the same minutes of
the same machine; the JSON records the load average before and after.

useful bytes of one rtpo solve: per turn k < K−1 the CSR entries (8-byte probability + index) and per
turn the (S, A) reward read, the (S, A) Q̃ written and the (S,) V written — what any backward induction
over these arrays must move at least once.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from rtpo.tabular import TurnMDP, random_mdp, solve

HERE = Path(__file__).resolve().parent
K, A, B = 8, 8, 8


def stationary_mdp(states_per_turn: int) -> TurnMDP:
    layer = random_mdp(0, num_turns=2, num_states=states_per_turn, num_actions=A, branching=B)
    succ0, prob0, r0, t0 = layer.succ[0], layer.prob[0], layer.reward[0], layer.tau[0]
    last = np.zeros_like(prob0)
    return TurnMDP(
        succ=(succ0,) * K,
        prob=(prob0,) * (K - 1) + (last,),
        reward=(r0,) * K,
        tau=(t0,) * K,
        psi=(np.arange(states_per_turn),) * K,
        init=np.full(states_per_turn, 1.0 / states_per_turn),
        num_contexts=states_per_turn,
    )


def useful_bytes(mdp: TurnMDP) -> int:
    total = 0
    for k in range(mdp.num_turns):
        S = mdp.num_states[k]
        total += S * A * 8 * 2 + S * 8  # reward read, Q̃ written, V written
        if k < mdp.num_turns - 1:
            m = mdp.transition_csr[k]
            total += m.data.nbytes + m.indices.nbytes + m.indptr.nbytes
    return total


def toolbox_solver(mdp: TurnMDP):
    import scipy.sparse as sp
    from hiive.mdptoolbox.mdp import FiniteHorizon

    S = mdp.num_states[0]
    ptr = np.arange(0, S * B + 1, B)
    P = [
        sp.csr_matrix((mdp.prob[0][:, a].reshape(-1), mdp.succ[0][:, a].reshape(-1), ptr), shape=(S, S))
        for a in range(A)
    ]
    fh = FiniteHorizon(P, np.asarray(mdp.reward[0]), 1.0, K, skip_check=True)
    fh.verbose = False
    return fh


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", type=Path, default=HERE / "solve.json")
    args = ap.parse_args()
    load_before = os.getloadavg()
    src = np.ones(2**25)  # 256 MB
    dst = np.empty_like(src)
    rows = []
    for total_states in (10_000, 100_000):
        mdp = stationary_mdp(total_states // K)
        fh = toolbox_solver(mdp)
        sol = solve(mdp)  # builds the cached CSR
        fh.run()
        assert np.allclose(sol.v[0], fh.V[:, 0], rtol=0, atol=1e-9), "rtpo and mdptoolbox disagree on V_0"
        best = {"rtpo": float("inf"), "mdptoolbox": float("inf"), "copy": float("inf")}
        jobs = {"rtpo": lambda m=mdp: solve(m), "mdptoolbox": fh.run, "copy": lambda: np.copyto(dst, src)}
        for r in range(args.repeats):
            order = ["rtpo", "mdptoolbox", "copy"] if r % 2 == 0 else ["copy", "mdptoolbox", "rtpo"]
            for name in order:
                t0 = time.perf_counter()
                jobs[name]()
                best[name] = min(best[name], time.perf_counter() - t0)
        ub = useful_bytes(mdp)
        stream = 2 * src.nbytes / best["copy"]
        rows.append(
            {
                "states": total_states,
                "states_per_turn": total_states // K,
                "num_turns": K,
                "num_actions": A,
                "successors": B,
                "rtpo_solve_s": best["rtpo"],
                "mdptoolbox_finite_horizon_s": best["mdptoolbox"],
                "speedup_vs_mdptoolbox": best["mdptoolbox"] / best["rtpo"],
                "useful_bytes": ub,
                "useful_bytes_per_s": ub / best["rtpo"],
                "stream_copy_bytes_per_s": stream,
                "fraction_of_stream_bandwidth": ub / best["rtpo"] / stream,
            }
        )
        print(json.dumps(rows[-1]))
    out = {
        "command": "python bench/bench_solve.py",
        "repeats": args.repeats,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "numpy": np.__version__,
        "rows": rows,
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
