"""The cost of the digest (xxh3_128) of every shard file a checkpoint records (rtpo.rundir.checkpoint): the real
write_checkpoint with a DCP learner of the tiny-cpu checkpoint's size, with the digests and with them
switched off (what a checkpoint write cost before); writes bench/checkpoint_digest.json.

    python bench/bench_checkpoint_digest.py [--repeats 7] [--out bench/checkpoint_digest.json]

The learner state is float32 tensors of the bytes bench/checkpoint.json measured for a tiny-cpu run's
shard (model + AdamW moments), written by torch.distributed.checkpoint in this process alone, into a
fresh folder each time (so every write is a real write and fsync).  Reported: the median write time of
each variant, their ratio (the acceptance bound is 1.1), the verifying read's time, and the load average
(the machine is shared: figures measured under load).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default=str(ROOT / "bench" / "checkpoint_digest.json"))
    args = ap.parse_args(argv)
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    from rtpo.rundir import checkpoint
    from rtpo.scenario.load import load_scenario

    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    shard_bytes = json.loads((ROOT / "bench" / "checkpoint.json").read_text())["dcp_files"]["learner-1/__0_0.distcp"]
    n = shard_bytes // 4 // 4  # four tensors of float32 (weights and the two moments, plus one more layer)
    g = torch.Generator().manual_seed(0)
    tensors = {f"model.w{i}": torch.randn(n, generator=g) for i in range(4)}
    cfg = load_scenario(None, ["budget.iterations=1"])

    def save(folder: Path) -> dict:
        dcp.save({"model": tensors}, checkpoint_id=str(folder), no_dist=True)
        return {"dir": str(folder), "steps": 1, "tied": {}, "world_size": 1, "config": {}}

    state = {"sampler": None, "rng": None, "budget": {}, "progress": {}}
    real_digest = checkpoint._digest_path
    times: dict[str, list[float]] = {"with_digest": [], "without_digest": [], "verify_read": []}
    with tempfile.TemporaryDirectory(dir=ROOT / "bench") as tmp:
        for r in range(args.repeats):
            for variant in ("without_digest", "with_digest") if r % 2 == 0 else ("with_digest", "without_digest"):
                run = Path(tmp) / f"{variant}-{r}"
                checkpoint._digest_path = real_digest if variant == "with_digest" else (lambda p: "")
                try:
                    t0 = time.perf_counter()
                    checkpoint.write_checkpoint(
                        run, cfg, {**state, "learner": checkpoint.ShardedLearner(save)}, "iter_1"
                    )
                    times[variant].append(time.perf_counter() - t0)
                finally:
                    checkpoint._digest_path = real_digest
                if variant == "with_digest":
                    t0 = time.perf_counter()
                    checkpoint.read_checkpoint(checkpoint.latest_path(run), cfg)
                    times["verify_read"].append(time.perf_counter() - t0)
                import shutil

                shutil.rmtree(run)
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {
        "command": "python bench/bench_checkpoint_digest.py",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "loadavg": os.getloadavg()},
        "note": "shared machine: measured under the load average given",
        "shard_bytes": 4 * n * 4,
        "repeats": args.repeats,
        "seconds": times,
        "median_s": med,
        "ratio_write_with_over_without_digest": med["with_digest"] / med["without_digest"],
        "verify_read_gb_per_s": 4 * n * 4 / med["verify_read"] / 1e9,
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "seconds"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
