"""Learning benchmark of an exact world on the llm backend: scenarios/llm/tiny-cpu-mdp.yaml (the default
scenario's 4-turn tool chain as a chat, a tiny Qwen3 on CPU, format warm start then RTPO) with the exact
value of the model's policy after every evaluation (rtpo.llm.exact).  Writes bench/exact_world.json:

  curve:            one row per evaluation: iteration, rollouts, elapsed seconds, eval/value, value / V*,
                    the malformed mass at the first context, and the evaluation's own cost (contexts,
                    tokens, seconds);
  v_star:           the MDP's optimum (the tabular solver's);
  first_at_0_9:     the first evaluation whose value / V* ≥ 0.9 (null when none did);
  exact_eval_share: seconds in exact evaluation over the run's wall seconds;
  loadavg_start / loadavg_end: os.getloadavg() around the run — the machine is shared, so every second
                    here is measured under that load and is not a speed figure.

Usage: python bench/bench_exact_world.py [--run RUN_DIR | --seeds N] [key=value ...]
  without --run: runs the scenario (with the overrides) into a temporary folder first;
  --run RUN_DIR: reads a finished (or partial) run folder of that scenario instead;
  --seeds N:     runs seeds 0..N-1 (each its own tiny model and warm start) and reports value / V* at the
                 first evaluation, at the end, and their difference, each with a 95% t-interval over seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "llm" / "tiny-cpu-mdp.yaml"


def summarise(run_dir: Path) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    curve = [
        {
            "iteration": r.get("iteration"),
            "rollouts": r.get("budget/rollouts"),
            "elapsed_s": r.get("time/elapsed_s"),
            "value": r["eval/value"],
            "value_over_v_star": r["eval/value_ratio"],
            "malformed_mass": r.get("eval/malformed_mass"),
            "contexts": r.get("eval/exact_contexts"),
            "tokens": r.get("eval/exact_tokens"),
            "seconds": r.get("time/exact_eval_s"),
        }
        for r in rows
        if "eval/value" in r
    ]
    v_star = next((r["eval/v_star"] for r in rows if "eval/v_star" in r), None)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    wall = summary.get("wall_s") or (rows[-1].get("time/elapsed_s") if rows else None)
    first = next((c for c in curve if c["value_over_v_star"] >= 0.9), None)
    return {
        "scenario": "scenarios/llm/tiny-cpu-mdp.yaml",
        "run_finished": bool(summary),
        "v_star": v_star,
        "final_value": curve[-1]["value"] if curve else None,
        "final_value_over_v_star": curve[-1]["value_over_v_star"] if curve else None,
        "best_value_over_v_star": max((c["value_over_v_star"] for c in curve), default=None),
        "first_at_0_9": first,
        "wall_s": wall,
        "exact_eval_share": (sum(c["seconds"] or 0.0 for c in curve) / wall) if wall else None,
        "curve": curve,
    }


def _run(overrides: list[str]) -> Path:
    out_root = Path(tempfile.mkdtemp(prefix="rtpo-exact-world-"))
    cmd = [sys.executable, "-m", "rtpo", "run", str(SCENARIO), *overrides, "--out", str(out_root), "--no-progress"]
    subprocess.run(cmd, check=True, env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    (run_dir,) = [p for p in out_root.iterdir() if p.is_dir()]
    return run_dir


def _interval(xs: list[float]) -> dict:
    """Mean and its 95% t-interval half-width over seeds (scipy's t quantile)."""
    from scipy import stats

    a = np.asarray(xs, dtype=np.float64)
    half = float(stats.t.ppf(0.975, a.size - 1) * a.std(ddof=1) / np.sqrt(a.size)) if a.size > 1 else float("nan")
    return {"mean": float(a.mean()), "ci95_half": half, "values": [float(x) for x in a]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, default=None, help="read this run folder instead of running")
    ap.add_argument("--seeds", type=int, default=None, help="run seeds 0..N-1 (seed=s) and report intervals")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "exact_world.json")
    ap.add_argument("--loadavg-start", default=None, help="with --run: the load recorded when it started (a,b,c)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    load_start = [float(x) for x in args.loadavg_start.split(",")] if args.loadavg_start else list(os.getloadavg())
    command = " ".join(["python bench/bench_exact_world.py", *(sys.argv[1:] if argv is None else argv)])
    if args.seeds is not None:
        runs = [summarise(_run([*args.overrides, f"seed={s}"])) for s in range(args.seeds)]
        result = {
            "command": command,
            "scenario": "scenarios/llm/tiny-cpu-mdp.yaml",
            "overrides": args.overrides,
            "seeds": args.seeds,
            "first_eval_value_over_v_star": _interval([r["curve"][0]["value_over_v_star"] for r in runs]),
            "final_value_over_v_star": _interval([r["final_value_over_v_star"] for r in runs]),
            "gain": _interval([r["final_value_over_v_star"] - r["curve"][0]["value_over_v_star"] for r in runs]),
            "runs": runs,
        }
    else:
        result = {"command": command, **summarise(args.run if args.run is not None else _run(args.overrides))}
    result.update({"loadavg_start": load_start, "loadavg_end": list(os.getloadavg()), "cpus": os.cpu_count()})
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("curve", "runs")}, indent=2))


if __name__ == "__main__":
    main()
