"""Weight sync on a Ray local cluster: object store vs collective (gloo), same weights, same run; writes
bench/weight_sync.json.

    python bench/bench_weight_sync.py [--quick] [--mb 64,256] [--workers 2] [--repeats 3]

For each model size a trainer group of one rank holds a {name: float32 tensor} state dict of that size
(tensors of 4 MB, like the layers of a real model) and RayRunContext.sync() sends it to the rollout
workers, whose sampler stores what it receives.  Reported per size and mode: seconds per sync (median
of `repeats`, after one warm-up sync) and the collective/object-store ratio.  On CPU both paths copy
through memory; on GPUs the collective path is NCCL while the object store stages through host memory.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np


class _Env:
    num_turns, gamma = 1, 1.0


class _Sampler:
    """Keeps what it is sent (the rollout side of the measurement)."""

    def __init__(self) -> None:
        self.weights = None

    def load_weights(self, weights) -> None:
        self.weights = weights


class _Learner:
    def __init__(self, mb: int) -> None:
        import torch

        g = torch.Generator().manual_seed(0)
        n = max(1, mb // 4)
        self.w = {f"layer{i}.weight": torch.randn(1024 * 1024, generator=g) for i in range(n)}  # 4 MB each

    def weights(self):
        return self.w


@dataclass(frozen=True)
class BlobFactory:
    mb: int

    def __call__(self, role: str = "driver"):
        from rtpo.core.methods.base import RunContext

        learner = _Learner(self.mb) if role in ("trainer", "driver") else None
        return RunContext(env=_Env(), sampler=_Sampler(), learner=learner, rng=np.random.default_rng(0))


def measure(mb: int, mode: str, workers: int, repeats: int) -> dict:
    from rtpo.distributed import wrap_with_ray

    ctx = wrap_with_ray(
        BlobFactory(mb), {"rollout_workers": workers, "trainer_workers": 1, "cpus_per_worker": 0.5, "weight_sync": mode}
    )
    try:
        ctx.sync()  # warm-up: forms the group / first put
        ctx.pop_metrics()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            ctx.sync()
            times.append(time.perf_counter() - t0)
        met = ctx.pop_metrics()
        return {
            "sync_s_median": statistics.median(times),
            "sync_s": times,
            "broadcast_s_mean": met.get("ray/weight_broadcast_s", 0.0) / repeats if mode == "collective" else None,
        }
    finally:
        ctx.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one small size, 2 repeats")
    ap.add_argument("--mb", default="64,256")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "weight_sync.json"))
    args = ap.parse_args()
    sizes = [16] if args.quick else [int(x) for x in args.mb.split(",")]
    repeats = 2 if args.quick else args.repeats
    out = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_1m": os.getloadavg()[0]},
        "rollout_workers": args.workers,
        "repeats": repeats,
        "sizes": {},
    }
    for mb in sizes:
        row = {mode: measure(mb, mode, args.workers, repeats) for mode in ("object_store", "collective")}
        row["ratio_collective_over_object_store"] = (
            row["collective"]["sync_s_median"] / row["object_store"]["sync_s_median"]
        )
        out["sizes"][f"{mb}MB"] = row
        print(
            f"{mb} MB: object store {row['object_store']['sync_s_median']:.3f} s, collective "
            f"{row['collective']['sync_s_median']:.3f} s, ratio {row['ratio_collective_over_object_store']:.2f}"
        )
    out["machine"]["load_1m_after"] = os.getloadavg()[0]
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
