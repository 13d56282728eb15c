"""Exact solve against mdptoolbox-hiive's FiniteHorizon and against memory bandwidth; writes bench/solve.json.

    python bench/bench_solve.py [--repeats 15]          (needs the `bench` extra: mdptoolbox-hiive)

The MDP is stationary so that FiniteHorizon can express it without blowing it up: one random sparse
layer (S states, A = 8 actions, 8 successors per (s, a)) repeated for K = 8 turns, the last turn ending
every episode; "states" is K·S, the states backward induction visits (10⁴ and 10⁵).  FiniteHorizon holds
one (S, S) CSR matrix per action that it reuses at every stage.  rtpo is timed on two layouts of the
same MDP (V_0 checked equal to FiniteHorizon's for both):

- "shared": the TurnMDP is given the one layer for every turn (`(layer,) * K`), so it keeps one copy and
  one transition matrix, as FiniteHorizon does: the like-for-like comparison.
- "distinct": K separate copies of the layer, as a non-stationary MDP holds them; at 10⁵ states they do
  not fit in cache, so this is the row whose useful bytes are set against memory bandwidth.

Every job is timed twice in each of `repeats` rounds (the order of the jobs reversed every other
round): cold, right after a streaming copy of a 256 MB array has pushed every cache out (the copy's
bytes read + written per second are the bandwidth yardstick), then warm, at once again, with the caches
holding what the cold call left — the steady state of solving the same MDP over and over.  Each figure
is the minimum over the rounds, so every ratio comes from the same minutes of the same machine; the
JSON records the load average before and after.  The jobs: FiniteHorizon.run(); `solve(mdp)` (kernel
"auto": numba where installed, both sizes being past AUTO_NUMBA_ENTRIES; the row's `kernel` says which
ran); `solve(mdp, kernel="numpy")`, the scipy path; and the K−1 scipy CSR matvecs alone (`matvec_s`:
the kernel FiniteHorizon and rtpo's numpy path spend their inner loop in, so mdptoolbox / matvec_s
bounds any speed-up a solver built on it can reach; the numba kernel runs its own loop and is not bound
by it).  All on one thread.  numba's own costs are measured apart, each in a fresh process: its import,
the first call compiling the kernel into an empty cache, and the first call loading it from that cache
(what every later process pays).

useful bytes of a solve: the problem in its standard sparse form, read once per turn — per transition
entry of turns k < K−1 a float64 probability and an int32 successor (12 bytes, as scipy's CSR holds
them), per (s, a) the float64 reward — and per state the value V (8 bytes) and the greedy action (4)
written: what any backward induction over these arrays must move.  rtpo's numba kernel moves 10 bytes an
entry here (uint16 successors; `moved_bytes`) and writes no Q̃ (built on first access to `Solution.q`);
FiniteHorizon also writes its V and policy per stage.  `fraction_of_stream_bandwidth` sets the useful
bytes per second of the cold solve against the copy's.
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


def stationary_mdp(states_per_turn: int, layout: str = "shared") -> TurnMDP:
    layer = random_mdp(0, num_turns=2, num_states=states_per_turn, num_actions=A, branching=B)
    succ0, prob0, r0, t0 = layer.succ[0], layer.prob[0], layer.reward[0], layer.tau[0]
    last = np.zeros_like(prob0)

    def turns(x, n=K):
        return (x,) * n if layout == "shared" else tuple(np.array(x) for _ in range(n))

    return TurnMDP(
        succ=turns(succ0),
        prob=turns(prob0, K - 1) + (last,),
        reward=turns(r0),
        tau=turns(t0),
        psi=(np.arange(states_per_turn),) * K,
        init=np.full(states_per_turn, 1.0 / states_per_turn),
        num_contexts=states_per_turn,
    )


def useful_bytes(mdp: TurnMDP) -> int:
    total = 0
    for k in range(mdp.num_turns):
        S = mdp.num_states[k]
        total += S * A * 8 + S * (8 + 4)  # reward read; V and the action written
        if k < mdp.num_turns - 1:
            total += mdp.prob[k].size * (8 + 4)  # float64 probability + int32 successor
    return total


def moved_bytes(mdp: TurnMDP) -> int:
    """What the numba kernel reads and writes: its lane layout (padding included) once per turn, the
    rewards in their lanes, V and the action."""
    from rtpo.tabular._solve_numba import LANES, successor_dtype

    m = -(-A // LANES) * LANES
    entry = 8 + successor_dtype(mdp).itemsize
    total = 0
    for k in range(mdp.num_turns):
        S = mdp.num_states[k]
        total += S * m * 8 + S * (8 + 4)
        if k < mdp.num_turns - 1:
            total += S * m * mdp.prob[k].shape[2] * entry
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


_JIT_PROBE = """
import json, sys, time
t0 = time.perf_counter()
import numba  # noqa: F401
t1 = time.perf_counter()
from rtpo.tabular import random_mdp, solve
mdp = random_mdp(0, 3, 4, 3, branching=2)
t2 = time.perf_counter()
sol = solve(mdp, kernel="numba")
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "first_call_s": t3 - t2, "kernel": sol.kernel}))
"""


def numba_costs() -> dict:
    """numba's import and first-call seconds, each in a fresh process: compiling into an empty cache
    (NUMBA_CACHE_DIR a new folder), then loading from it."""
    import subprocess
    import sys
    import tempfile

    from rtpo.tabular.solve import _numba_installed

    if not _numba_installed():
        return {"installed": False}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache, "PYTHONPATH": str(HERE.parent)}
        runs = [
            json.loads(
                subprocess.run(
                    [sys.executable, "-c", _JIT_PROBE], env=env, capture_output=True, text=True, check=True
                ).stdout
            )
            for _ in range(2)
        ]
    import numba

    return {
        "installed": True,
        "numba": numba.__version__,
        "import_s": min(r["import_s"] for r in runs),
        "first_call_compile_s": runs[0]["first_call_s"],
        "first_call_cached_s": runs[1]["first_call_s"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", type=Path, default=HERE / "solve.json")
    args = ap.parse_args()
    jit = numba_costs()
    load_before = os.getloadavg()
    src = np.ones(2**25)  # 256 MB
    dst = np.empty_like(src)
    rows = []
    for total_states in (10_000, 100_000):
        mdps = {layout: stationary_mdp(total_states // K, layout) for layout in ("shared", "distinct")}
        assert len({id(m) for m in mdps["shared"].transition_csr}) == 1
        assert len({id(m) for m in mdps["distinct"].transition_csr}) == K - 1
        fh = toolbox_solver(mdps["shared"])
        fh.run()
        x = np.random.default_rng(0).random(total_states // K)
        jobs = {"mdptoolbox": fh.run, "copy": lambda: np.copyto(dst, src)}
        kernel = {}
        for layout, mdp in mdps.items():
            sol = solve(mdp)  # builds the cached CSR or lane layout (and loads the kernel)
            ref = solve(mdp, kernel="numpy")
            assert np.allclose(sol.v[0], fh.V[:, 0], rtol=0, atol=1e-9), f"rtpo ({layout}) and mdptoolbox disagree"
            assert np.array_equal(sol.policy, ref.policy) and all(np.array_equal(a, b) for a, b in zip(sol.q, ref.q))
            kernel[layout] = sol.kernel
            jobs[f"rtpo/{layout}"] = lambda m=mdp: solve(m)
            jobs[f"rtpo-numpy/{layout}"] = lambda m=mdp: solve(m, kernel="numpy")
            jobs[f"matvec/{layout}"] = lambda m=mdp, x=x: [c @ x for c in m.transition_csr]
        flush = jobs.pop("copy")
        cold, warm = dict.fromkeys(jobs, float("inf")), dict.fromkeys(jobs, float("inf"))
        best_copy = float("inf")
        for r in range(args.repeats):
            for name in list(jobs) if r % 2 == 0 else list(jobs)[::-1]:
                t0 = time.perf_counter()
                flush()
                t1 = time.perf_counter()
                jobs[name]()
                t2 = time.perf_counter()
                jobs[name]()
                t3 = time.perf_counter()
                best_copy = min(best_copy, t1 - t0)
                cold[name], warm[name] = min(cold[name], t2 - t1), min(warm[name], t3 - t2)
        stream = 2 * src.nbytes / best_copy
        for layout, mdp in mdps.items():
            ub = useful_bytes(mdp)
            name, numpy_name = f"rtpo/{layout}", f"rtpo-numpy/{layout}"
            rows.append(
                {
                    "key": f"{total_states}/{layout}",
                    "states": total_states,
                    "layout": layout,
                    "states_per_turn": total_states // K,
                    "num_turns": K,
                    "num_actions": A,
                    "successors": B,
                    "kernel": kernel[layout],
                    "rtpo_solve_s": warm[name],
                    "mdptoolbox_finite_horizon_s": warm["mdptoolbox"],
                    "speedup_vs_mdptoolbox": warm["mdptoolbox"] / warm[name],
                    "rtpo_solve_cold_s": cold[name],
                    "mdptoolbox_finite_horizon_cold_s": cold["mdptoolbox"],
                    "speedup_vs_mdptoolbox_cold": cold["mdptoolbox"] / cold[name],
                    "rtpo_numpy_kernel_s": warm[numpy_name],
                    "numpy_kernel_speedup_vs_mdptoolbox": warm["mdptoolbox"] / warm[numpy_name],
                    "matvec_s": warm[f"matvec/{layout}"],
                    "speedup_ceiling_vs_mdptoolbox": warm["mdptoolbox"] / warm[f"matvec/{layout}"],
                    "useful_bytes": ub,
                    "moved_bytes": moved_bytes(mdp) if kernel[layout] == "numba" else None,
                    "useful_bytes_per_s": ub / cold[name],
                    "stream_copy_bytes_per_s": stream,
                    "fraction_of_stream_bandwidth": ub / cold[name] / stream,
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
        "threads": 1,
        "numba_jit": jit,
        "rows": rows,
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
