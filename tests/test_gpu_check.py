"""bench/gpu_check.sh's CPU dry run: the code a GPU host runs works end to end (tiny model, in process),
and the shell wrapper parses and reaches it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

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
    """Every section of the GPU check runs on CPU at tiny sizes and lands in the JSON: the learner
    against the plain loop on one batch, the HF engine, one RTPO iteration with its split, and the
    plan hook (which records whether `rtpo plan` exists rather than failing)."""
    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location("bench_gpu_check", ROOT / "bench" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "gpu_check.json"
    got = mod.main(["--dry-run", "--out", str(out), "--workdir", str(tmp_path), "--max-tokens", "4"])
    assert out.is_file()
    assert json.loads(out.read_text())["iteration"] == json.loads(json.dumps(got["iteration"], default=str))
    failed = {k: v["error"] for k, v in got.items() if isinstance(v, dict) and "error" in v}
    assert not failed, f"sections failed on CPU: {failed}"
    assert got["dry_run"] is True and got["ceilings"] == {"skipped": "no CUDA device"}
    lrn = got["learner"]
    assert lrn["learner"]["backend"] == "gloo" and lrn["learner"]["attn_implementation"] == "sdpa"
    assert lrn["step_flops"] > 0 and lrn["ratio"] > 0 and lrn["learner_mfu"] is None  # no peak FLOP/s on CPU
    gen = got["generation"]
    assert gen["tokens"] > 0 and gen["tokens_per_s"] > 0 and "installed" in gen["vllm"]
    it = got["iteration"]
    assert it["learner_backend"] == "gloo" and it["device"] == "cpu"
    split = it["split_s"]
    assert {"generate", "train", "ratio_pass", "weight_sync_load"} <= set(split)
    assert it["trained_tokens"] > 0 and it["generated_tokens"] > 0
    assert abs(sum(split.values()) - it["seconds"]) < 1e-6
    ckpt = it["checkpoint"]  # a DCP checkpoint written and read back from the learner's device, and the export
    assert ckpt["weights_equal_after_load"] is True and "config.json" in ckpt["exported_files"], ckpt
    assert it["rollout_train_time_ratio"] == pytest.approx(split["generate"] / split["train"])
    # tiny-cpu's consistency metric: the engine's and the learner's log-probs of the same tokens agree
    assert it["consistency_rollout_train_ratio"] and all(
        abs(r - 1) < 1e-3 for r in it["consistency_rollout_train_ratio"]
    )
    assert "available" in got["plan"]
    if got["plan"]["available"]:  # rtpo plan's predictions beside the measurements
        rows = {r["quantity"]: r for r in got["plan_vs_measured"]}
        gen_tokens = rows["generated tokens"]
        # the plan's default episode shape is the upper bound (every turn, every token)
        assert gen_tokens["predicted"] >= gen_tokens["measured"] > 0, gen_tokens
        assert rows["iteration s"]["measured"] == it["seconds"]
    assert "learner / plain time" in mod.summary(got)


def test_step_flops_counts_the_body_the_kept_logits_and_causal_attention():
    """bench/learner_mfu.step_flops: 3 x forward, forward = 2·N_body·T + 2·d·V·R + 2·L·H·d_h·Σs² (a
    hand count for a toy shape; a mutant dropping the attention or lm_head term changes it)."""
    spec = importlib.util.spec_from_file_location("bench_learner_mfu", ROOT / "bench" / "learner_mfu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cfg = SimpleNamespace(hidden_size=8, vocab_size=100, num_hidden_layers=2, num_attention_heads=2, head_dim=4)
    n_params = 8 * 100 + 1000  # embedding + body
    rows, ctx, rsp = 3, 5, 2
    fwd = 2 * 1000 * rows * 7 + 2 * 8 * 100 * rows * 3 + 2 * 2 * 2 * 4 * rows * 49
    assert mod.step_flops(cfg, rows, ctx, rsp, n_params) == 3 * fwd
