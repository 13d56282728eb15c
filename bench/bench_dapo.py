"""DAPO's dynamic sampling against plain GRPO at equal rollout budgets, on shipped tabular families.

Each (family, variant) runs SEEDS seeds of GRPO (G = 8, the family's other settings) until
budget.max_rollouts rollouts are spent (every re-sampled rollout counts); reported: the mean final exact
value / V* with its standard error, the rollouts actually spent, the mean share of informative groups
and the ratio dynamic / plain of the mean value.  Small and honest: a few seeds, tabular only (the LLM
comparison on tiny-cpu-learn is not in this file).  Timings are not figures here; os.getloadavg() is
recorded because the machine is shared.

    python bench/bench_dapo.py            # -> bench/dapo.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

FAMILIES = ("default", "region_chain")
SEEDS = 6
MAX_ROLLOUTS = 6000
VARIANTS = {
    "grpo": ["method.name=grpo", "method.G=8"],
    "grpo_dynamic_sampling": ["method.name=grpo", "method.G=8", "method.dynamic_sampling=true"],
}


def _scenario(name: str) -> str:
    return str(Path(__file__).resolve().parents[1] / "scenarios" / "tabular" / f"{name}.yaml")


def run_cell(family: str, over: list[str], seeds: int, max_rollouts: int) -> dict:
    from rtpo.rundir.runner import run_in_memory
    from rtpo.scenario.load import load_scenario

    values, rollouts, informative = [], [], []
    for seed in range(seeds):
        cfg = load_scenario(
            _scenario(family),
            [
                *over,
                f"seed={100 + seed}",
                "budget.iterations=1000",
                f"budget.max_rollouts={max_rollouts}",
                "eval.every=1000",
                "logging.plot=false",
                "logging.progress=false",
            ],
        )
        res = run_in_memory(cfg)
        values.append(float(res.summary["value_over_optimum"]))
        rollouts.append(float(res.metrics[-1]["budget/rollouts"]))
        inf = [
            m["dapo/informative_groups"] / cfg.budget.queries_per_iteration
            for m in res.metrics
            if "dapo/informative_groups" in m
        ]
        informative.append(float(np.mean(inf)) if inf else float("nan"))
    v = np.asarray(values)
    return {
        "value_over_optimum_mean": float(v.mean()),
        "value_over_optimum_se": float(v.std(ddof=1) / np.sqrt(v.size)),
        "value_over_optimum": values,
        "rollouts_mean": float(np.mean(rollouts)),
        "informative_group_share_mean": float(np.nanmean(informative)) if not np.all(np.isnan(informative)) else None,
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=SEEDS)
    ap.add_argument("--max-rollouts", type=int, default=MAX_ROLLOUTS)
    ap.add_argument("--out", default=str(Path(__file__).with_name("dapo.json")))
    args = ap.parse_args(argv)
    t0 = time.time()
    out = {
        "command": "python bench/bench_dapo.py"
        + (
            ""
            if (args.seeds, args.max_rollouts) == (SEEDS, MAX_ROLLOUTS)
            else f" --seeds {args.seeds} --max-rollouts {args.max_rollouts}"
        ),
        "what": "GRPO with and without DAPO dynamic sampling at equal rollout budgets (tabular; final value/V*)",
        "seeds": args.seeds,
        "max_rollouts": args.max_rollouts,
        "loadavg_start": list(os.getloadavg()),
        "families": {},
    }
    for fam in FAMILIES:
        cells = {name: run_cell(fam, over, args.seeds, args.max_rollouts) for name, over in VARIANTS.items()}
        base = cells["grpo"]["value_over_optimum_mean"]
        cells["ratio_dynamic_over_plain"] = cells["grpo_dynamic_sampling"]["value_over_optimum_mean"] / base
        out["families"][fam] = cells
        print(
            fam,
            json.dumps({k: (v if not isinstance(v, dict) else v["value_over_optimum_mean"]) for k, v in cells.items()}),
        )
    out["loadavg_end"] = list(os.getloadavg())
    out["wall_s"] = time.time() - t0
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
