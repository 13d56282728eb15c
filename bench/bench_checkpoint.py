"""Checkpoint bytes on disk of a tiny-cpu run: the sharded (DCP) format against the weights + AdamW state it
must hold, and against the older pickled format written by the same code in the same session; writes
bench/checkpoint.json.

    python bench/bench_checkpoint.py [--out bench/checkpoint.json]

Both runs are scenarios/llm/tiny-cpu.yaml for one iteration (the real Qwen3 vocabulary: 151,936 x 128
tied embeddings), with the HF engine (the engine does not enter a checkpoint).  The older format is the
same run with the learner's sharded save hidden and the sampler's weights stored between iterations,
exactly what checkpoints held before DCP.  Reported: the bytes of ckpt/iter_1 (every file), the model's
weight bytes (tied weights once), the optimiser-state bytes read from the DCP metadata, and the ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SCENARIO = ROOT / "scenarios" / "llm" / "tiny-cpu.yaml"
OVERRIDES = ["backend.engine=hf", "budget.iterations=1", "task.num_turns=2", "backend.max_tokens=8"]
OVERRIDES += ["task.eval_queries=2", "logging.plot=false"]


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _run(tmp: Path, name: str, legacy: bool) -> Path:
    from rtpo.commands import cli
    from rtpo.llm.learner import FSDPLearner
    from rtpo.rundir import runner as run_mod

    args = ["run", str(SCENARIO), *OVERRIDES, f"backend.model_cache={tmp / 'models'}"]
    args += ["--out", str(tmp / name), "--no-progress"]
    if not legacy:
        assert cli.main(args) == 0
    else:
        save, sharded = run_mod._save_checkpoint, FSDPLearner.save_sharded
        run_mod._save_checkpoint = lambda d, c, b, p: save(
            d, c, dataclasses.replace(b, sampler_state_at_boundary=None), p
        )
        del FSDPLearner.save_sharded
        try:
            assert cli.main(args) == 0
        finally:
            run_mod._save_checkpoint, FSDPLearner.save_sharded = save, sharded
    (run_dir,) = (tmp / name).iterdir()
    return run_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench" / "checkpoint.json"))
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch.distributed.checkpoint as dcp

    from rtpo.llm.build import _model_dir
    from rtpo.llm.model import load_hf_model
    from rtpo.rundir import checkpoint
    from rtpo.scenario.load import load_scenario

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        new = _run(tmp, "dcp", legacy=False)
        old = _run(tmp, "pickled", legacy=True)
        model = load_hf_model(_model_dir(load_scenario(new / checkpoint.CONFIG)))
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # tied: once
        state = checkpoint.read_checkpoint(checkpoint.latest_path(new))
        meta = dcp.FileSystemReader(state["learner"]["path"]).read_metadata()
        optim_bytes = sum(
            m.size.numel() * m.properties.dtype.itemsize
            for k, m in meta.state_dict_metadata.items()
            if k.startswith("optim.state.") and hasattr(m, "size")
        )
        folder = new / checkpoint.CKPT_DIR / "iter_1"
        new_bytes, old_bytes = _folder_bytes(folder), _folder_bytes(old / checkpoint.CKPT_DIR / "iter_1")
        files = {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}
    out = {
        "command": "python bench/bench_checkpoint.py",
        "scenario": "scenarios/llm/tiny-cpu.yaml " + " ".join(OVERRIDES),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "parameters": sum(p.numel() for p in model.parameters()),
        "weight_bytes": weight_bytes,
        "optimizer_state_bytes": optim_bytes,
        "dcp_checkpoint_bytes": new_bytes,
        "dcp_files": files,
        "ratio_dcp_over_weights_plus_optimizer": new_bytes / (weight_bytes + optim_bytes),
        "pickled_checkpoint_bytes": old_bytes,
        "ratio_pickled_over_weights_plus_optimizer": old_bytes / (weight_bytes + optim_bytes),
        "ratio_dcp_over_pickled": new_bytes / old_bytes,
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k.startswith(("ratio", "dcp_checkpoint", "pickled"))}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
