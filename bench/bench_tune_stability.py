"""How many tuning seeds `rtpo compare --tune` needs before its choice stops depending on which seeds it drew.

For each shipped tabular family and compared method (a "cell"), every candidate learning rate runs on
SEEDS seeds (disjoint from compare's reported and default tuning seeds).  For T = 1..SEEDS//2 tuning
seeds, PARTITIONS random pairs of disjoint T-seed sets are drawn from them (a fixed stream); a pair
agrees when both sets pick the same candidate (highest mean value/V*, ties to the earlier candidate, as
rtpo.compare.tuning.select).  Reported per T: the mean agreement over cells and the share of cells whose
agreement is at least STABLE (0.8).  The default `--tune-seeds` (rtpo.compare.tuning.DEFAULT_TUNE_SEEDS)
is the smallest T whose mean agreement reaches STABLE on these families.

    python bench/bench_tune_stability.py            # -> bench/tune_stability.json (~180 runs, in memory)
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

FAMILIES = ("default", "region_chain", "search_long")
METHODS = ("rtpo", "grpo")
CANDIDATES = ("0.1", "0.3", "1.0")
SEEDS = 10
SEED_OFFSET = 100
PARTITIONS = 400


def _scenario(name: str) -> str:
    return str(Path(__file__).resolve().parents[1] / "scenarios" / "tabular" / f"{name}.yaml")


def run_cell_scores(family: str, method: str) -> np.ndarray:
    """(len(CANDIDATES), SEEDS) value/V* of each candidate lr on each seed."""
    from rtpo.compare.jobs import build_jobs
    from rtpo.rundir.runner import run_in_memory
    from rtpo.scenario.load import parse_scenario

    out = np.zeros((len(CANDIDATES), SEEDS))
    for i, lr in enumerate(CANDIDATES):
        jobs, _ = build_jobs(
            _scenario(family), [method], SEEDS, [f"train.lr={lr}"], None, Path("unused"), seed_offset=SEED_OFFSET
        )
        for j, job in enumerate(sorted(jobs, key=lambda jb: jb.seed)):
            res = run_in_memory(parse_scenario(job.data), None, progress=False)
            out[i, j] = float(res.summary["value_over_optimum"])
    return out


def agreement(scores: np.ndarray, t: int, rng: np.random.Generator) -> float:
    """The share of PARTITIONS draws of two disjoint t-seed sets that pick the same candidate."""
    same = 0
    for _ in range(PARTITIONS):
        perm = rng.permutation(scores.shape[1])
        a, b = perm[:t], perm[t : 2 * t]
        same += int(np.argmax(scores[:, a].mean(axis=1)) == np.argmax(scores[:, b].mean(axis=1)))
    return same / PARTITIONS


def main(argv: list[str] | None = None) -> None:
    from rtpo.compare.tuning import STABLE
    from rtpo.core.threads import torch_threads

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(Path(__file__).with_name("tune_stability.json")))
    ns = p.parse_args(argv)
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    cells = {}
    with torch_threads(1):
        for family in FAMILIES:
            for method in METHODS:
                cells[f"{family}/{method}"] = run_cell_scores(family, method)
                print(f"{family}/{method}: {np.round(cells[f'{family}/{method}'].mean(axis=1), 3)}", flush=True)
    rng = np.random.default_rng(0)
    by_t = {}
    for t in range(1, SEEDS // 2 + 1):
        per_cell = {k: agreement(v, t, rng) for k, v in cells.items()}
        vals = np.array(list(per_cell.values()))
        by_t[str(t)] = {
            "mean_agreement": float(vals.mean()),
            "cells_at_least_stable": float(np.mean(vals >= STABLE)),
            "per_cell": per_cell,
        }
    chosen = next((int(t) for t, r in by_t.items() if r["mean_agreement"] >= STABLE), None)
    payload = {
        "command": "python bench/bench_tune_stability.py",
        "families": list(FAMILIES),
        "methods": list(METHODS),
        "candidates": {"train.lr": list(CANDIDATES)},
        "seeds": SEEDS,
        "seed_offset": SEED_OFFSET,
        "partitions": PARTITIONS,
        "stable": STABLE,
        "by_tune_seeds": by_t,
        "smallest_tune_seeds_reaching_stable": chosen,
        "scores": {k: v.tolist() for k, v in cells.items()},
        "wall_s": time.perf_counter() - t0,
        "loadavg_before": list(load_before),
        "loadavg_after": list(os.getloadavg()),
    }
    Path(ns.out).write_text(json.dumps(payload, indent=2) + "\n")
    for t, r in by_t.items():
        print(f"T={t}: mean agreement {r['mean_agreement']:.2f}, cells ≥ {STABLE}: {r['cells_at_least_stable']:.0%}")
    print(f"smallest T reaching {STABLE}: {chosen}; wrote {ns.out}")


if __name__ == "__main__":
    main()
