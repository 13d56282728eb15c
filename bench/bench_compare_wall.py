"""Wall time of README's `rtpo compare` example in two checkouts of rtpo, interleaved; writes
bench/compare_wall.json.

    python bench/bench_compare_wall.py --before CHECKOUT --after CHECKOUT [--rounds 2]

Each round runs `rtpo compare default --methods rtpo,grpo,seeupo --seeds 3` (README's example on the
default scenario: 9 runs of 20 iterations, 2 worker processes) once per checkout, the order alternating
(before after, after before, ...), each in a fresh process with the checkout first on PYTHONPATH and its
output in a fresh temporary folder.  The figure is after / before of the minimum wall time over the rounds;
the JSON records each run's wall time, the commits and the load average before and after (reportable:
load ≤ 4 at both ends).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXAMPLE = ["compare", "default", "--methods", "rtpo,grpo,seeupo", "--seeds", "3"]


def _commit(checkout: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def _run(checkout: Path) -> float:
    with tempfile.TemporaryDirectory(prefix="rtpo-compare-wall-") as out:
        env = {**os.environ, "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": "1"}
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "rtpo.commands.cli", *EXAMPLE, "--out", out],
            cwd=checkout,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--after", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=HERE / "compare_wall.json")
    args = ap.parse_args()
    load_before = os.getloadavg()
    walls: dict[str, list[float]] = {"before": [], "after": []}
    for r in range(args.rounds):
        for side in ("before", "after") if r % 2 == 0 else ("after", "before"):
            walls[side].append(_run(getattr(args, side)))
            print(side, walls[side][-1], flush=True)
    load_after = os.getloadavg()
    best = {side: min(v) for side, v in walls.items()}
    out = {
        "command": "python bench/bench_compare_wall.py --before BEFORE --after AFTER"
        + ("" if args.rounds == 2 else f" --rounds {args.rounds}"),
        "example": "rtpo " + " ".join(EXAMPLE),
        "before_commit": _commit(args.before),
        "after_commit": _commit(args.after),
        "walls_s": walls,
        "before_s": best["before"],
        "after_s": best["after"],
        "after_over_before": best["after"] / best["before"],
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "reportable": max(load_before[0], load_after[0]) <= 4.0,
        "cpu_count": os.cpu_count(),
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
