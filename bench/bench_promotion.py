"""Promotion, measured (issue 25 item 4): the same exact world compared on both backends at equal rollout
budgets, and whether the methods' ordering on the tabular backend carries over to the llm backend.

    python bench/bench_promotion.py                          # runs both comparisons -> bench/promotion.json
    python bench/bench_promotion.py --tabular DIR --llm DIR  # reads two finished `rtpo compare` folders

The MDP is scenarios/llm/tiny-cpu-mdp.yaml's task section (the default scenario's tool chain: A = 4 tools,
p_advance 0.8, a Bernoulli reward at the last turn) at K = TURNS; the budget is what RTPO plans for
ITERATIONS iterations of QUERIES queries (rtpo compare's equal-rollout rule), the same number on both
backends.  Each backend keeps its own policy and step size (a softmax table at the default scenario's lr,
a tiny Qwen3 after its format warm start at tiny-cpu-mdp's lr with a k3 KL anchor), every method runs
2 epochs per update on both (so the rows differ only in the method).

Per backend, method and seed (seeds are paired across methods: one seed is one table init, or one tiny
model and its warm start, for every method):
  gain_final:  (V − V_uniform) / (V* − V_uniform) of the last exact evaluation;
  gain_auc:    the mean of the gain at budget fractions 1/2, 3/4 and 1, linearly interpolated between
               evaluations (how fast it learns, not only where it ends: at K = 2 every method ends near V*
               on the tabular backend).  The llm side evaluates every 4 phases, which is every 2 RTPO
               iterations but every 4 GRPO/SeeUPO iterations (one phase each): their first evaluation
               comes after about a quarter of the budget, so the fractions start at 1/2;
and over seeds the mean with its 95% Student-t half-width.  For each pair of methods, the paired
per-seed difference (a − b) of each figure with its 95% interval on each backend, and a verdict:
  "same order"  both backends resolve the difference (interval excludes 0) with the same sign;
  "reversed"    both resolve it with opposite signs;
  "tabular tie" / "llm tie" / "both tie": the named backend's interval contains 0.
Everything in the JSON is measured by this command; loadavg is recorded but nothing here is a time.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TURNS = 2
ITERATIONS = 16
QUERIES = 16
METHODS = "rtpo,grpo,seeupo"
FRACTIONS = (0.5, 0.75, 1.0)
COMMON = [f"task.num_turns={TURNS}", f"budget.iterations={ITERATIONS}", f"budget.queries_per_iteration={QUERIES}"]
COMMON += ["method.epochs=2"]
TABULAR = ["default", *COMMON]
LLM = ["scenarios/llm/tiny-cpu-mdp.yaml", *COMMON, "eval.every=4", "method.kl_coef=0.05"]


def compare(args: list[str], seeds: int, extra: list[str]) -> Path:
    out = Path(tempfile.mkdtemp(prefix="rtpo-promotion-"))
    cmd = [sys.executable, "-m", "rtpo", "compare", args[0], "--methods", METHODS, "--seeds", str(seeds)]
    cmd += ["--workers", "1", *args[1:], *extra, "--out", str(out)]
    subprocess.run(cmd, check=True, env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    return folder


def _curve(run: Path) -> list[tuple[float, float]]:
    """(rollouts, gain) at every exact evaluation of one run folder."""
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line) if line.strip() else {}
        if all(k in r for k in ("eval/value", "eval/v_star", "eval/v_uniform", "budget/rollouts")):
            gap = r["eval/v_star"] - r["eval/v_uniform"]
            out.append((float(r["budget/rollouts"]), (r["eval/value"] - r["eval/v_uniform"]) / gap))
    return out


def _gains(curve: list[tuple[float, float]], budget: float) -> dict:
    """gain_final and gain_auc (module docstring) of one run's evaluation curve."""
    n, g = np.array([c[0] for c in curve]), np.array([c[1] for c in curve])
    points = [f * budget for f in FRACTIONS]
    if points[0] < n[0]:  # the last fraction takes the final evaluation (a method may stop short of B)
        raise SystemExit(
            f"bench_promotion: evaluations cover {n[0]:.0f}..{n[-1]:.0f} rollouts, not the fractions' "
            f"{points[0]:.0f}..{points[-1]:.0f}: evaluate more often (eval.every)"
        )
    auc = np.interp(points, n, g)  # past the last evaluation np.interp holds its value
    return {"gain_final": float(g[-1]), "gain_auc": float(auc.mean()), "evaluations": len(curve)}


def _ci(values) -> dict:
    from rtpo.compare import mean_ci

    m, h = mean_ci(list(values))
    return {"mean": m, "half_width_95": h, "n": len(values)}


def summarise(folder: Path) -> dict:
    """Per method: per-seed gains and their means with intervals, from a `rtpo compare` folder."""
    meta = json.loads((folder / "comparison.json").read_text())
    (budget,) = {float(b) for b in meta["budgets"].values()}
    per: dict[str, dict[int, dict]] = {}
    for row in meta["rows"]:
        for run in row["per_seed"]:
            curve = _curve(folder / "runs" / Path(run["run_dir"]).name)
            if curve:
                per.setdefault(row["method"], {})[int(run["seed"])] = _gains(curve, budget)
    methods = {}
    for m, seeds in per.items():
        methods[m] = {
            "seeds": sorted(seeds),
            "per_seed": {str(s): seeds[s] for s in sorted(seeds)},
            **{k: _ci([seeds[s][k] for s in sorted(seeds)]) for k in ("gain_final", "gain_auc")},
        }
    return {"folder": str(folder), "command": meta.get("command"), "budget_rollouts": budget, "methods": methods}


def _verdict(tabular: int, llm: int) -> str:
    """The module docstring's verdict from each backend's resolved sign (0 = the interval contains 0)."""
    if tabular == 0 and llm == 0:
        return "both tie"
    if tabular == 0 or llm == 0:
        return "tabular tie" if tabular == 0 else "llm tie"
    return "same order" if tabular == llm else "reversed"


def pairs(backends: dict) -> list[dict]:
    names = sorted(set.intersection(*(set(b["methods"]) for b in backends.values())))
    out = []
    for a, b in itertools.combinations(names, 2):
        row: dict = {"pair": f"{a} - {b}"}
        for key in ("gain_final", "gain_auc"):
            verdict = {}
            for name, be in backends.items():
                ma, mb = be["methods"][a], be["methods"][b]
                common = sorted(set(ma["seeds"]) & set(mb["seeds"]))
                d = [ma["per_seed"][str(s)][key] - mb["per_seed"][str(s)][key] for s in common]
                ci = _ci(d)
                resolved = ci["n"] > 1 and abs(ci["mean"]) > ci["half_width_95"]
                row[f"{key}.{name}"] = {**ci, "resolved": bool(resolved)}
                verdict[name] = int(np.sign(ci["mean"])) if resolved else 0
            row[f"{key}.verdict"] = _verdict(verdict["tabular"], verdict["llm"])
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tabular", help="a finished `rtpo compare` folder of the tabular side")
    ap.add_argument("--llm", help="a finished `rtpo compare` folder of the llm side")
    ap.add_argument("--tabular-seeds", type=int, default=10)
    ap.add_argument("--llm-seeds", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "bench" / "promotion.json"))
    ap.add_argument("extra", nargs="*", help="key=value overrides for both sides")
    args = ap.parse_args(argv)
    load_start = os.getloadavg()
    tab = Path(args.tabular) if args.tabular else compare(TABULAR, args.tabular_seeds, args.extra)
    llm = Path(args.llm) if args.llm else compare(LLM, args.llm_seeds, args.extra)
    backends = {"tabular": summarise(tab), "llm": summarise(llm)}
    if backends["tabular"]["budget_rollouts"] != backends["llm"]["budget_rollouts"]:
        raise SystemExit(
            f"bench_promotion: unequal budgets: tabular {backends['tabular']['budget_rollouts']:.0f} "
            f"vs llm {backends['llm']['budget_rollouts']:.0f} rollouts"
        )
    out = {
        "command": "python bench/bench_promotion.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        # what regenerates this file from nothing (with --tabular/--llm the comparisons were run before,
        # by the commands recorded under backends.*.command)
        "regenerate": "python bench/bench_promotion.py",
        "mdp": {"task": "tool_chain (tiny-cpu-mdp's section)", "num_turns": TURNS, "num_actions": 4},
        "budget_rollouts": backends["tabular"]["budget_rollouts"],
        "fractions": list(FRACTIONS),
        "backends": backends,
        "pairs": pairs(backends),
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    for be, data in backends.items():
        for m, r in data["methods"].items():
            f, a = r["gain_final"], r["gain_auc"]
            print(
                f"{be:8s} {m:8s} gain {f['mean']:.3f} ± {f['half_width_95']:.3f}  "
                f"auc {a['mean']:.3f} ± {a['half_width_95']:.3f}  (n={f['n']})"
            )
    for p in out["pairs"]:
        print(p["pair"], "final:", p["gain_final.verdict"], " auc:", p["gain_auc.verdict"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
