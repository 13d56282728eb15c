"""Exact solve against mdptoolbox-hiive's FiniteHorizon and against memory bandwidth; writes bench/solve.json.

    python bench/bench_solve.py [--repeats 15]          (needs the `bench` extra: mdptoolbox-hiive)

The MDP is stationary so that FiniteHorizon can express it without blowing it up: one random sparse
layer (S states, A actions, 8 successors per (s, a)) repeated for K = 8 turns, the last turn ending
every episode; "states" is K·S, the states backward induction visits (10⁴ and 10⁵), at A = 8 (keys
`STATES/LAYOUT`) and at A = 2 (keys `STATES/LAYOUT/a2`: half a vector of four actions, the rest padding).  FiniteHorizon holds
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

Cache.  Each row says where the data one warm solve reads lives (`cache_level`: "L2", "L3" or "memory"):
the bytes the kernel reads per call (`moved_bytes`: one layer's layout for "shared", K − 1 of them for
"distinct", plus rewards, V and actions) against this machine's L2 and L3 sizes (sysfs).  A warm figure
whose data fit in L2 or L3 is an in-cache figure; "memory" rows are out of cache even warm.

The goal (issue 31): speedup_vs_mdptoolbox ≥ 4 (warm, like for like: the shared layout) at 10⁴ and 10⁵
states and at A = 2; `goal_met` and `short_of_goal_by` (1 − speed-up / 4) say where it is missed.

First calls.  `rtpo_first_call_s`: the first solve(mdp) of an MDP in a process whose kernel is loaded (it
builds the lane layout, then solves); `mdptoolbox_first_call_s`: FiniteHorizon's construction and first
run.  numba's compile (into an empty cache) and cache load are `numba_jit` (fresh processes).

useful bytes of a solve: the problem in its standard sparse form, read once per turn — per transition
entry of turns k < K−1 a float64 probability and an int32 successor (12 bytes, as scipy's CSR holds
them), per (s, a) the float64 reward — and per state the value V (8 bytes) and the greedy action (4)
written: what any backward induction over these arrays must move.  rtpo's numba kernel reads 10 bytes
an entry here (a float64 probability and a uint16 successor: `read_bytes_per_entry`), over its lane layout
(padding included: at A = 2 each entry's vector holds two padded actions; `moved_bytes`), and writes no
Q̃ (built on first access to `Solution.q`); FiniteHorizon also writes its V and policy per stage.
`fraction_of_stream_bandwidth` sets the bytes the kernel really moves per second of the cold solve
(`moved_bytes_per_s`) against the copy's; `useful_fraction_of_stream_bandwidth` the useful bytes'.
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
ACTIONS = (8, 2)  # A = 8, then A = 2 (issue 31)
GOAL = 4.0  # issue 31: at least 4x FiniteHorizon's speed, warm, like for like


def cache_sizes() -> dict[str, int]:
    """{"L1", "L2", "L3"}: data/unified cache bytes of cpu0 (sysfs; {} where it is not there)."""
    out = {}
    for d in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            kind, level, size = ((d / f).read_text().strip() for f in ("type", "level", "size"))
        except OSError:
            continue
        if kind in ("Data", "Unified"):
            mult = {"K": 1 << 10, "M": 1 << 20}.get(size[-1], 1)
            out[f"L{level}"] = int(size.rstrip("KM")) * mult
    return out


def cache_level(nbytes: int, caches: dict[str, int]) -> str:
    """The smallest cache level that holds nbytes ("memory" if none does)."""
    for level in ("L2", "L3"):
        if level in caches and nbytes <= caches[level]:
            return level
    return "memory"


def stationary_mdp(states_per_turn: int, layout: str = "shared", num_actions: int = A) -> TurnMDP:
    layer = random_mdp(0, num_turns=2, num_states=states_per_turn, num_actions=num_actions, branching=B)
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
        total += S * mdp.num_actions * 8 + S * (8 + 4)  # reward read; V and the action written
        if k < mdp.num_turns - 1:
            total += mdp.prob[k].size * (8 + 4)  # float64 probability + int32 successor
    return total


def read_bytes_per_entry(mdp: TurnMDP) -> int:
    """Bytes the numba kernel reads per transition entry: a float64 probability and its successor."""
    from rtpo.tabular._solve_numba import successor_dtype

    return 8 + successor_dtype(mdp).itemsize


def moved_bytes(mdp: TurnMDP, distinct_only: bool = False) -> int:
    """What the numba kernel reads and writes: its lane layout (padding included) once per turn, the
    rewards in their lanes, V and the action.  distinct_only: each distinct layout once (what must sit
    in cache for a warm call to read nothing from memory)."""
    from rtpo.tabular._solve_numba import LANES

    m = -(-mdp.num_actions // LANES) * LANES
    entry = read_bytes_per_entry(mdp)
    total, seen = 0, set()
    for k in range(mdp.num_turns):
        S = mdp.num_states[k]
        total += S * m * 8 + S * (8 + 4)
        if k < mdp.num_turns - 1 and not (distinct_only and id(mdp.prob[k]) in seen):
            seen.add(id(mdp.prob[k]))
            total += S * m * mdp.prob[k].shape[2] * entry
    return total


def toolbox_solver(mdp: TurnMDP):
    import scipy.sparse as sp
    from hiive.mdptoolbox.mdp import FiniteHorizon

    S = mdp.num_states[0]
    ptr = np.arange(0, S * B + 1, B)
    P = [
        sp.csr_matrix((mdp.prob[0][:, a].reshape(-1), mdp.succ[0][:, a].reshape(-1), ptr), shape=(S, S))
        for a in range(mdp.num_actions)
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
    if jit["installed"]:  # load the kernel here, so that each row's first call is its own layout and solve
        solve(random_mdp(0, 3, 4, 3, branching=2), kernel="numba")
    caches = cache_sizes()
    load_before = os.getloadavg()
    src = np.ones(2**25)  # 256 MB
    dst = np.empty_like(src)
    rows = []
    for num_actions in ACTIONS:
        for total_states in (10_000, 100_000):
            rows += measure(total_states, num_actions, args.repeats, src, dst, caches)
    load_after = os.getloadavg()
    out = {
        "command": "python bench/bench_solve.py" + ("" if args.repeats == 15 else f" --repeats {args.repeats}"),
        "repeats": args.repeats,
        "goal": f"speedup_vs_mdptoolbox >= {GOAL} on the shared (like-for-like) rows, warm (issue 31)",
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "reportable": max(load_before[0], load_after[0]) <= 4.0,
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "numpy": np.__version__,
        "threads": 1,
        "cache_bytes": caches,
        "numba_jit": jit,
        "rows": rows,
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


def measure(total_states: int, num_actions: int, repeats: int, src, dst, caches: dict) -> list[dict]:
    """The rows of one size and action count: both layouts, timed with mdptoolbox in the same rounds."""
    S = total_states // K
    suffix = "" if num_actions == A else f"/a{num_actions}"
    mdps = {layout: stationary_mdp(S, layout, num_actions) for layout in ("shared", "distinct")}
    t0 = time.perf_counter()
    fh = toolbox_solver(mdps["shared"])
    fh.run()
    fh_first = time.perf_counter() - t0
    x = np.random.default_rng(0).random(S)
    jobs = {"mdptoolbox": fh.run, "copy": lambda: np.copyto(dst, src)}
    kernel, first = {}, {}
    for layout, mdp in mdps.items():
        t0 = time.perf_counter()
        sol = solve(mdp)  # builds the cached CSR or lane layout (the kernel is loaded by now)
        first[layout] = time.perf_counter() - t0
        assert len({id(m) for m in mdp.transition_csr}) == (1 if layout == "shared" else K - 1)
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
    for r in range(repeats):
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
    rows = []
    for layout, mdp in mdps.items():
        ub = useful_bytes(mdp)
        numba = kernel[layout] == "numba"
        mb = moved_bytes(mdp) if numba else None
        resident = moved_bytes(mdp, distinct_only=True) if numba else ub
        name, numpy_name = f"rtpo/{layout}", f"rtpo-numpy/{layout}"
        speedup = warm["mdptoolbox"] / warm[name]
        level = cache_level(resident, caches)
        rows.append(
            {
                "key": f"{total_states}/{layout}{suffix}",
                "states": total_states,
                "layout": layout,
                "like_for_like": layout == "shared",
                "states_per_turn": S,
                "num_turns": K,
                "num_actions": num_actions,
                "successors": B,
                "kernel": kernel[layout],
                "rtpo_solve_s": warm[name],
                "mdptoolbox_finite_horizon_s": warm["mdptoolbox"],
                "speedup_vs_mdptoolbox": speedup,
                "working_set_bytes": resident,
                "cache_level": level,
                "in_cache": level != "memory",
                "goal_speedup_at_least": GOAL,
                "goal_met": bool(speedup >= GOAL),
                "short_of_goal_by": max(0.0, 1.0 - speedup / GOAL),
                "rtpo_solve_cold_s": cold[name],
                "mdptoolbox_finite_horizon_cold_s": cold["mdptoolbox"],
                "speedup_vs_mdptoolbox_cold": cold["mdptoolbox"] / cold[name],
                "rtpo_first_call_s": first[layout],
                "mdptoolbox_first_call_s": fh_first,
                "rtpo_numpy_kernel_s": warm[numpy_name],
                "numpy_kernel_speedup_vs_mdptoolbox": warm["mdptoolbox"] / warm[numpy_name],
                "matvec_s": warm[f"matvec/{layout}"],
                "speedup_ceiling_vs_mdptoolbox": warm["mdptoolbox"] / warm[f"matvec/{layout}"],
                "useful_bytes": ub,
                "read_bytes_per_entry": read_bytes_per_entry(mdp) if numba else 12,
                "moved_bytes": mb,
                "useful_bytes_per_s": ub / cold[name],
                "moved_bytes_per_s": (mb if numba else ub) / cold[name],
                "stream_copy_bytes_per_s": stream,
                "fraction_of_stream_bandwidth": (mb if numba else ub) / cold[name] / stream,
                "useful_fraction_of_stream_bandwidth": ub / cold[name] / stream,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


if __name__ == "__main__":
    main()
