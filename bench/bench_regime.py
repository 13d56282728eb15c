"""Does the regime diagnostic predict the winner on families it was not built on?  A held-out benchmark.

Families: FAMILIES task sections drawn at random (a fixed stream, `family_section`) from the registered
tabular kinds — the tool chain (K, A, advance probability, reward shape, Bernoulli or exact reward,
early answers), the region chain (where an exogenous bit enters and how much of the reward it sets),
random MDPs (states, branching, early ends, terminal-only or dense rewards) — under a softmax table
or shared parameters (`policy: shared`).  None of them is a shipped scenario, and nothing below was
tuned on them: both predictors are fixed by their derivation before the benchmark runs.

Protocol, per family: RTPO (G = 3, one trunk) and GRPO (G = 8) at an equal rollout budget (ROLLOUTS),
one PPO epoch each, Adam lr chosen per method from LRS by mean value/V* on TUNE_SEEDS tuning seeds, then
REPORTED seeds (disjoint) at the chosen lr.  The winner is the higher mean value/V*; a family is *clear*
when the two 95% t-intervals are apart, *close* otherwise.

Predictors (rtpo.tabular.diagnostic, under the initial policy; Thm 2(b), Eq. 58):
- `summed`: the existing index I_RTPO/I_GRPO, information per rollout summed over turns (> 1: RTPO).
- `bottleneck`: per turn k, the rollouts each method needs per unit of turn-k information,
  1/I_m(k) with I_GRPO(k) = p_k ρ²_G(k) and I_RTPO(k) = (G−1) p_k ρ²_R(k) / (1 + (G−1) Σ_j p_j); the
  policy is learnt when every turn with something to learn is (Var(A_k) > 0), so a method's cost is
  Σ_k 1/I_m(k) over those turns, dominated by its hardest turn rather than its easiest.  Index =
  cost_GRPO / cost_RTPO (> 1: RTPO).
Reported: each predictor's hit rate with a Wilson 95% interval, on clear and on close families.

Calibration (`calibrate`; what `rtpo solve`/`compare` print, rtpo.tabular.diagnostic.regime_call): the
theory fixes the statistic (the bottleneck index) and the direction (> 1: RTPO, < 1: GRPO); its
idealisation (large-group baselines, no tied groups, the initial policy's signal) says nothing about how
far from 1 a call is safe.  The families split by index parity, independently of any outcome: on the
*design* half (even) the GRPO band ends at the first design family RTPO won (going up from the lowest
index) and the RTPO band starts above the last design family GRPO won, each edge the geometric mean of
the two design indices around it, and never on the wrong side of 1; between the bands, no call.  On the
*held-out* half (odd) each band's hit rate is reported with its Wilson 95% interval, separately for
clear and close contests; a band calls its method only if that interval's lower bound is above 1/2.

    python bench/bench_regime.py                # -> docs/results/regime_benchmark/regime.json (FAMILIES × 44 runs)
    python bench/bench_regime.py --resume       # continue an interrupted run from its --out JSON
    python bench/bench_regime.py --calibrate    # re-derive the calibration of an existing JSON (no runs)
    python bench/bench_regime.py --table        # docs/results.md §1d's table, from that JSON

The JSON is rewritten after every family, so a run stopped part-way keeps the families it finished; its
"command" names the family count those rows are (families are a fixed stream, so that command
regenerates them), and "families_requested" what was asked for.  `--resume` keeps the rows of an --out
JSON with the same protocol and runs the families it lacks.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import numpy as np

FAMILIES = 64
ROLLOUTS = 3000
LRS = (0.1, 0.3, 1.0)
TUNE_SEEDS = 4  # bench/tune_stability.json: the fewest tuning seeds whose choice a rerun repeats in >= 80% of cells
REPORTED = 10
G_RTPO, G_GRPO = 3, 8


def family_section(i: int) -> dict:
    """The task section of family i (a fixed stream per family)."""
    rng = np.random.default_rng(1000 + i)
    kind = str(rng.choice(["tool_chain", "region_chain", "random"], p=[0.3, 0.4, 0.3]))
    K = int(rng.integers(2, 9))
    A = int(rng.integers(2, 5))
    sec: dict = {"kind": kind, "num_turns": K, "num_actions": A, "seed": int(rng.integers(0, 1000))}
    if kind in ("tool_chain", "region_chain"):
        sec["p_advance"] = float(np.round(rng.uniform(0.5, 1.0), 2))
        sec["sharpness"] = float(rng.choice([1.0, 2.0, 3.0]))
        sec["bernoulli"] = bool(rng.random() < (0.5 if kind == "tool_chain" else 0.3))
        sec["early_answer"] = bool(A >= 3 and rng.random() < 0.3)
        if kind == "region_chain":
            sec["w"] = float(np.round(rng.uniform(0.3, 0.95), 2))
            sec["p_region"] = float(np.round(rng.uniform(0.2, 0.8), 2))
    else:
        sec["num_states"] = int(rng.integers(3, 9))
        sec["branching"] = None if rng.random() < 0.5 else 2
        sec["end_prob"] = float(rng.choice([0.0, 0.2]))
        sec["terminal_reward_only"] = bool(rng.random() < 0.5)
        sec["bernoulli_rewards"] = bool(rng.random() < 0.5)
    sec["psi"] = "identity"
    sec["policy"] = "shared" if rng.random() < 0.2 else "softmax"
    return sec


def scenario(task: dict, method: str, lr: float, seed: int) -> dict:
    m = {"name": "rtpo", "G": G_RTPO, "trunks_per_query": 1} if method == "rtpo" else {"name": "grpo", "G": G_GRPO}
    return {
        "name": "regime-bench",
        "seed": seed,
        "backend": {"kind": "tabular"},
        "task": task,
        "method": {**m, "epochs": 1},
        "budget": {"iterations": 100000, "queries_per_iteration": 16, "max_rollouts": ROLLOUTS},
        "train": {"lr": lr, "optimizer": "adam"},
        "eval": {"every": 100000},
        "logging": {"progress": False, "plot": False, "checkpoint_every": 100000},
    }


def value(task: dict, method: str, lr: float, seed: int) -> float:
    from rtpo.rundir.runner import run_in_memory
    from rtpo.scenario.load import parse_scenario

    res = run_in_memory(parse_scenario(scenario(task, method, lr, seed)), None, progress=False)
    return float(res.summary["value_over_optimum"])


def predictors(task: dict) -> dict:
    from rtpo.scenario.load import parse_scenario
    from rtpo.tabular.build import build_mdp, initial_policy
    from rtpo.tabular.diagnostic import decompose

    cfg = parse_scenario(scenario(task, "rtpo", 0.1, 0))
    mdp = build_mdp(cfg.task)
    dec = decompose(mdp, initial_policy(cfg, mdp))
    return {
        "summed": float(dec.info_index(G_RTPO)),
        "bottleneck": dec.bottleneck_index(G_RTPO),
        "sigma_v2_share": (dec.sigma_v2 / dec.var_return).tolist() if dec.var_return > 0 else None,
    }


def t_interval(x: np.ndarray) -> tuple[float, float]:
    from scipy import stats

    m, s = float(x.mean()), float(x.std(ddof=1))
    h = float(stats.t.ppf(0.975, x.size - 1)) * s / math.sqrt(x.size)
    return m, h


def wilson(hits: int, n: int) -> tuple[float, float] | None:
    if n == 0:
        return None
    z, p = 1.96, hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def summarise(rows: list[dict]) -> dict:
    """Hits and Wilson 95% intervals per predictor on clear, close and all families, beside the base rate of
    always naming the more frequent winner (a predictor worth printing must beat it)."""
    summary: dict = {}
    groups = {"clear": lambda r: r["clear"], "close": lambda r: not r["clear"], "all": lambda r: True}
    for name in ("summed", "bottleneck", "always_grpo"):
        for group, keep in groups.items():
            sel = [r for r in rows if keep(r) and (name == "always_grpo" or r[f"{name}_call"] is not None)]
            hits = sum(
                (r["winner"] == "grpo") if name == "always_grpo" else (r[f"{name}_call"] == r["winner"]) for r in sel
            )
            ci = wilson(hits, len(sel))
            summary[f"{name}/{group}"] = {
                "families": len(sel),
                "hits": hits,
                "hit_rate": hits / len(sel) if sel else None,
                "wilson95": list(ci) if ci else None,
            }
    return summary


def _edge(a: float, b: float) -> float:
    return float(math.sqrt(a * b)) if a > 0 and b > 0 else (a + b) / 2


def calibrate(rows: list[dict]) -> dict:
    """The bands of the bottleneck index chosen on the design families (even) and their hit rates on the
    held-out families (odd); see the module docstring."""
    design = sorted(
        (r["bottleneck"], r["winner"]) for r in rows if r["family"] % 2 == 0 and math.isfinite(r["bottleneck"])
    )
    held = [r for r in rows if r["family"] % 2 == 1 and not math.isnan(r["bottleneck"])]
    first_rtpo = next((i for i, (_, w) in enumerate(design) if w == "rtpo"), None)
    last_grpo = max((i for i, (_, w) in enumerate(design) if w == "grpo"), default=None)
    bands = []
    if first_rtpo is None:
        bands.append(("grpo", 0.0, 1.0))
    elif first_rtpo > 0:
        bands.append(("grpo", 0.0, min(1.0, _edge(design[first_rtpo - 1][0], design[first_rtpo][0]))))
    if last_grpo is None:
        bands.append(("rtpo", 1.0, math.inf))
    elif last_grpo < len(design) - 1:
        bands.append(("rtpo", max(1.0, _edge(design[last_grpo][0], design[last_grpo + 1][0])), math.inf))
    out = []
    for call, lo, hi in bands:
        inside = [r for r in held if lo <= r["bottleneck"] and (r["bottleneck"] < hi or hi == math.inf)]
        hits = [r for r in inside if r["winner"] == call]
        ci = wilson(len(hits), len(inside))
        out.append(
            {
                "call": call,
                "lo": round(lo, 4),
                "hi": None if hi == math.inf else round(hi, 4),  # None: unbounded above
                "hits": len(hits),
                "families": len(inside),
                "wilson95": [round(ci[0], 4), round(ci[1], 4)] if ci else None,
                "clear": [sum(r["clear"] for r in hits), sum(r["clear"] for r in inside)],
                "close": [sum(not r["clear"] for r in hits), sum(not r["clear"] for r in inside)],
                "held_out_families": [r["family"] for r in inside],
            }
        )
    called = {f for b in out for f in b["held_out_families"]}
    return {
        "index": "bottleneck",
        "split": "design: even family numbers, held out: odd",
        "design_families": sum(r["family"] % 2 == 0 for r in rows),
        "held_out_families": len(held),
        "held_out_no_call": len([r for r in held if r["family"] not in called]),
        "held_out_always_grpo": {
            "hits": sum(r["winner"] == "grpo" for r in held),
            "families": len(held),
            "wilson95": wilson(sum(r["winner"] == "grpo" for r in held), len(held)),
        },
        "bands": out,
    }


def table(payload: dict) -> str:
    """The per-family markdown table of a regime benchmark payload (docs/results/regime_benchmark/regime.json)."""
    lines = [
        "| family | kind | K | A | policy | summed index | bottleneck index | RTPO value/V* | GRPO value/V* | contest | winner |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in payload["rows"]:
        t = r["task"]
        mark = {n: ("✓" if r[f"{n}_call"] == r["winner"] else "✗") for n in ("summed", "bottleneck")}
        lines.append(
            f"| {r['family']} | {t['kind']} | {t['num_turns']} | {t['num_actions']} | {t['policy']} | "
            f"{r['summed']:.3g} {mark['summed']} | {r['bottleneck']:.3g} {mark['bottleneck']} | "
            f"{r['rtpo']['mean']:.3f} ± {r['rtpo']['ci95']:.3f} | {r['grpo']['mean']:.3f} ± {r['grpo']['ci95']:.3f} | "
            f"{'clear' if r['clear'] else 'close'} | {r['winner'].upper()} |"
        )
    return "\n".join(lines)


def protocol(families: int, tune_seeds: int) -> dict:
    return {
        "families": families,
        "rollouts": ROLLOUTS,
        "lrs": list(LRS),
        "tune_seeds": tune_seeds,
        "reported_seeds": REPORTED,
        "G_rtpo": G_RTPO,
        "G_grpo": G_GRPO,
    }


def family_row(i: int, tune_seeds: int) -> dict:
    """Family i's predictors, each method's tuning and reported values, the winner and the calls."""
    task = family_section(i)
    row: dict = {"family": i, "task": task, **predictors(task)}
    for method in ("rtpo", "grpo"):
        tune = {lr: np.mean([value(task, method, lr, 100 + s) for s in range(tune_seeds)]) for lr in LRS}
        lr = max(LRS, key=lambda v: tune[v])  # ties: the first (smaller) lr
        vals = np.array([value(task, method, lr, s) for s in range(REPORTED)])
        m, h = t_interval(vals)
        row[method] = {"lr": lr, "tuning": {str(k): float(v) for k, v in tune.items()}, "mean": m, "ci95": h}
        row[method]["values"] = vals.tolist()
    r, g = row["rtpo"], row["grpo"]
    row["winner"] = "rtpo" if r["mean"] > g["mean"] else "grpo"
    row["clear"] = bool(abs(r["mean"] - g["mean"]) > r["ci95"] + g["ci95"])
    for name in ("summed", "bottleneck"):
        idx = row[name]
        row[f"{name}_call"] = None if not np.isfinite(idx) else ("rtpo" if idx > 1 else "grpo")
    return row


def payload(rows: list[dict], tune_seeds: int, requested: int, wall_s: float, loads: list) -> dict:
    """The JSON of the families finished so far: its command regenerates exactly these rows."""
    return {
        "command": f"python bench/bench_regime.py --families {len(rows)} --tune-seeds {tune_seeds}",
        "families_requested": requested,
        "calibration": calibrate(rows),
        "protocol": protocol(len(rows), tune_seeds),
        "summary": summarise(rows),
        "rows": rows,
        "wall_s": wall_s,
        "loadavg_before": loads[0],
        "loadavg_after": loads[-1],
    }


def resumed_rows(out: Path, tune_seeds: int) -> tuple[list[dict], float, list | None]:
    """The rows, wall time and starting load of an earlier run's JSON at `out`, if its protocol is this one's."""
    if not out.is_file():
        return [], 0.0, None
    old = json.loads(out.read_text())
    mine, theirs = protocol(0, tune_seeds), dict(old["protocol"], families=0)
    if mine != theirs:
        raise SystemExit(f"bench_regime: --resume: {out} has another protocol ({theirs} vs {mine})")
    rows = old["rows"]
    if [r["family"] for r in rows] != list(range(len(rows))):
        raise SystemExit(f"bench_regime: --resume: {out} does not hold families 0..{len(rows) - 1} in order")
    return rows, float(old.get("wall_s", 0.0)), old.get("loadavg_before")


def main(argv: list[str] | None = None) -> None:
    from rtpo.core.threads import torch_threads

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", type=int, default=FAMILIES)
    p.add_argument("--tune-seeds", type=int, default=TUNE_SEEDS, help="tuning seeds per candidate lr")
    p.add_argument(
        "--out",
        default=str(Path(__file__).resolve().parents[1] / "docs" / "results" / "regime_benchmark" / "regime.json"),
    )
    p.add_argument("--resume", action="store_true", help="keep the finished families of --out and run the rest")
    p.add_argument("--table", action="store_true", help="print the markdown table of an existing --out JSON")
    p.add_argument("--calibrate", action="store_true", help="re-derive the calibration of an existing --out JSON")
    ns = p.parse_args(argv)
    out = Path(ns.out)
    if ns.table:
        print(table(json.loads(out.read_text())))
        return
    if ns.calibrate:
        data = json.loads(out.read_text())
        data["calibration"] = calibrate(data["rows"])
        out.write_text(json.dumps(data, indent=2) + "\n")
        print(json.dumps(data["calibration"], indent=2))
        return
    rows, wall0, load0 = resumed_rows(out, ns.tune_seeds) if ns.resume else ([], 0.0, None)
    rows = rows[: ns.families]
    loads, t0 = [load0 or list(os.getloadavg())], time.perf_counter()
    with torch_threads(1):
        for i in range(len(rows), ns.families):
            row = family_row(i, ns.tune_seeds)
            rows.append(row)
            loads.append(list(os.getloadavg()))
            data = payload(rows, ns.tune_seeds, ns.families, wall0 + time.perf_counter() - t0, loads)
            out.write_text(json.dumps(data, indent=2) + "\n")  # after every family: a stopped run keeps them
            r, g = row["rtpo"], row["grpo"]
            print(
                f"family {i} {row['task']['kind']} K={row['task']['num_turns']}: rtpo {r['mean']:.3f}±{r['ci95']:.3f} "
                f"grpo {g['mean']:.3f}±{g['ci95']:.3f} ({'clear' if row['clear'] else 'close'}); "
                f"summed {row['summed']:.3g} bottleneck {row['bottleneck']:.3g}",
                flush=True,
            )
    for k, v in summarise(rows).items():
        print(f"{k}: {v['hits']}/{v['families']} (Wilson 95% {v['wilson95']})")


if __name__ == "__main__":
    main()
