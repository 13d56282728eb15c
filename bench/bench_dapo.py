"""DAPO's dynamic sampling against plain GRPO at equal rollout budgets, on shipped tabular families and
on the tiny LLM scenario that learns.

Tabular: each (family, variant) runs SEEDS seeds of GRPO (G = 8, the family's other settings) until
budget.max_rollouts rollouts are spent (every re-sampled rollout counts); reported: the mean final exact
value / V* with its standard error, the rollouts actually spent, the mean share of informative groups
and the ratio dynamic / plain of the mean value.

--llm: the same two variants on scenarios/llm/tiny-cpu-learn.yaml (GRPO with its G = 4, 16 queries per
iteration, so plain GRPO spends 64 rollouts an iteration) until LLM_MAX_ROLLOUTS rollouts (16 plain
iterations) are spent, LLM_SEEDS seeds (the seed also draws the random tiny model); reported: the final
pass@1 on the scenario's 64 held-out problems (evaluated once, at the end, with the scenario's fixed
evaluation seed) with its standard error, and the same spend and informative-group figures.

Small and honest: a few seeds.  Timings are not figures here; os.getloadavg() is recorded because the
machine is shared.

    python bench/bench_dapo.py            # -> bench/dapo.json
    python bench/bench_dapo.py --llm      # -> bench/dapo_llm.json
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


LLM_SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "llm" / "tiny-cpu-learn.yaml"
LLM_SEEDS = 3
LLM_MAX_ROLLOUTS = 1024
LLM_VARIANTS = {
    "grpo": ["method.name=grpo"],
    "grpo_dynamic_sampling": ["method.name=grpo", "method.dynamic_sampling=true"],
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


def run_llm_cell(over: list[str], seeds: int, max_rollouts: int, model_cache: Path) -> dict:
    """One variant on tiny-cpu-learn over seeds 0..seeds-1: final pass@1 (mean 0/1 return on the 64
    evaluation problems), rollouts spent, informative-group share."""
    from rtpo.rundir.runner import run_in_memory
    from rtpo.scenario.load import load_scenario

    values, rollouts, informative, walls, updates = [], [], [], [], []
    for seed in range(seeds):
        cfg = load_scenario(
            str(LLM_SCENARIO),
            [
                *over,
                f"seed={seed}",
                f"backend.model_cache={model_cache}",
                "budget.iterations=1000",
                f"budget.max_rollouts={max_rollouts}",
                "eval.every=100000",  # one evaluation, after the last phase
            ],
        )
        res = run_in_memory(cfg)
        values.append(float(res.summary["final_value"]))
        rollouts.append(float(res.summary["rollouts"]))
        walls.append(float(res.summary["wall_s"]))
        updates.append(int(res.summary["phases_done"]))  # GRPO: one train step per iteration
        inf = [
            m["dapo/informative_groups"] / cfg.budget.queries_per_iteration
            for m in res.metrics
            if "dapo/informative_groups" in m
        ]
        informative.append(float(np.mean(inf)) if inf else float("nan"))
        print(
            f"  seed {seed}: pass@1 {values[-1]:.3f}, {rollouts[-1]:.0f} rollouts, {updates[-1]} steps, {walls[-1]:.0f} s",
            flush=True,
        )
    v = np.asarray(values)
    return {
        "pass_at_1_mean": float(v.mean()),
        "pass_at_1_se": float(v.std(ddof=1) / np.sqrt(v.size)),
        "pass_at_1": values,
        "rollouts_mean": float(np.mean(rollouts)),
        "train_steps": updates,
        "informative_group_share_mean": float(np.nanmean(informative)) if not np.all(np.isnan(informative)) else None,
        "wall_s": walls,
    }


def main_llm(args) -> None:
    import tempfile

    t0 = time.time()
    seeds = args.seeds if args.seeds is not None else LLM_SEEDS
    max_rollouts = args.max_rollouts if args.max_rollouts is not None else LLM_MAX_ROLLOUTS
    out = {
        "command": "python bench/bench_dapo.py --llm"
        + (
            ""
            if (seeds, max_rollouts) == (LLM_SEEDS, LLM_MAX_ROLLOUTS)
            else f" --seeds {seeds} --max-rollouts {max_rollouts}"
        ),
        "what": "GRPO with and without DAPO dynamic sampling at equal rollout budgets on tiny-cpu-learn (final pass@1)",
        "scenario": "scenarios/llm/tiny-cpu-learn.yaml",
        "seeds": seeds,
        "max_rollouts": max_rollouts,
        "loadavg_start": list(os.getloadavg()),
    }
    cells = {}
    with tempfile.TemporaryDirectory(prefix="bench_dapo_llm_") as cache:
        for name, over in LLM_VARIANTS.items():
            print(name, flush=True)
            cells[name] = run_llm_cell(over, seeds, max_rollouts, Path(cache))
    cells["ratio_dynamic_over_plain"] = (
        cells["grpo_dynamic_sampling"]["pass_at_1_mean"] / cells["grpo"]["pass_at_1_mean"]
    )
    out["variants"] = cells
    out["loadavg_end"] = list(os.getloadavg())
    out["wall_s"] = time.time() - t0
    Path(args.out or Path(__file__).with_name("dapo_llm.json")).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: (v if not isinstance(v, dict) else v["pass_at_1_mean"]) for k, v in cells.items()}))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llm", action="store_true", help="tiny-cpu-learn instead of the tabular families")
    ap.add_argument("--seeds", type=int, default=None, help=f"default {SEEDS} (--llm: {LLM_SEEDS})")
    ap.add_argument(
        "--max-rollouts", type=int, default=None, help=f"default {MAX_ROLLOUTS} (--llm: {LLM_MAX_ROLLOUTS})"
    )
    ap.add_argument("--out", default=None, help="default bench/dapo.json (--llm: bench/dapo_llm.json)")
    args = ap.parse_args(argv)
    if args.llm:
        main_llm(args)
        return
    args.seeds = SEEDS if args.seeds is None else args.seeds
    args.max_rollouts = MAX_ROLLOUTS if args.max_rollouts is None else args.max_rollouts
    args.out = args.out or str(Path(__file__).with_name("dapo.json"))
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
