"""The tabular weight sync after one RTPO phase: TabularSampler.load_weights rebuilding only the turn the
phase trained, against the whole-table rebuild it did before (the same sampler forced to rebuild every
turn), in the same run, at growing table sizes.  K = 8, A = 4; C contexts per turn.

    python bench/bench_sampler_sync.py     # -> bench/sampler_sync.json
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

K, A = 8, 4
SIZES = (256, 4096, 32768)
REPEATS = 30


def _time(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _phase_sync(sampler, w: np.ndarray, force_full: bool):
    """A callable doing one phase's sync: a copy of w with one turn moved (as one RTPO phase trains one
    turn), loaded; force_full drops the previous table first, so the sampler rebuilds every turn."""
    step = [0]

    def sync() -> None:
        step[0] += 1
        w2 = w.copy()
        w2[step[0] % K] += 1e-3 * step[0]
        if force_full:
            sampler._table = None
        sampler.load_weights(w2)

    return sync


def main() -> None:
    from rtpo.core.threads import torch_threads
    from rtpo.tabular import SoftmaxTable, TabularSampler

    rows = []
    load = os.getloadavg()
    with torch_threads(1):
        for C in SIZES:
            pol = SoftmaxTable(K, C, A)
            w = pol.init_params(np.random.default_rng(0))
            inc = TabularSampler(pol, w)
            full = TabularSampler(pol, w)
            t_inc = _time(_phase_sync(inc, w, False), REPEATS)
            t_full = _time(_phase_sync(full, w, True), REPEATS)
            rows.append(
                {
                    "key": str(C),
                    "contexts_per_turn": C,
                    "table_entries": K * C * A,
                    "incremental_s": t_inc,
                    "whole_rebuild_s": t_full,
                    "incremental_over_whole": t_inc / t_full,
                }
            )
            print(f"C={C}: one-turn sync {t_inc * 1e3:.3f} ms vs whole rebuild {t_full * 1e3:.3f} ms", flush=True)
    out = {
        "command": "python bench/bench_sampler_sync.py",
        "turns": K,
        "actions": A,
        "repeats_min_of": REPEATS,
        "rows": rows,
        "loadavg_before": list(load),
        "loadavg_after": list(os.getloadavg()),
    }
    Path(__file__).with_name("sampler_sync.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
