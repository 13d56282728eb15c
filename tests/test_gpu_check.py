"""bench/gpu_check.sh's CPU dry run: the code a GPU host runs works end to end (tiny model, in process),
and the shell wrapper parses and reaches it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_check_script_parses_and_reaches_the_python_side():
    subprocess.run(["bash", "-n", str(ROOT / "bench" / "gpu_check.sh")], check=True)
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_check.sh"), "--help"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and "--dry-run" in out.stdout


@pytest.mark.slow
def test_gpu_check_dry_run_writes_its_json(tmp_path):
    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location("bench_gpu_check", ROOT / "bench" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "gpu_check.json"
    got = mod.main(["--dry-run", "--out", str(out), "--workdir", str(tmp_path), "--max-tokens", "4"])
    assert out.is_file()
    assert got["dry_run"] is True and got["learner_backend"] == "gloo"
    assert got["generation"]["tokens"] > 0 and got["generation"]["tokens_per_s"] > 0
    split = got["iteration"]["split_s"]
    assert {"generate", "train", "ratio_pass", "weight_sync_load"} <= set(split)
    assert got["learner"]["trained_tokens"] > 0 and got["learner"]["mfu"] is None  # no peak FLOP/s on CPU
    assert abs(sum(split.values()) - got["iteration"]["seconds"]) < 1e-6
