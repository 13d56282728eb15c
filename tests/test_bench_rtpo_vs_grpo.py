"""The committed RTPO-vs-GRPO benchmark result (bench/rtpo_vs_grpo.json) is internally consistent, and the
consistency check catches broken accounting.  No timing is asserted: only sums, counts and structure.

The quick mode (1 query, 1 round, 8 tokens per turn) runs here end to end: about 45 s on two idle cores.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "bench" / "rtpo_vs_grpo.json"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_rtpo_vs_grpo", ROOT / "bench" / "bench_rtpo_vs_grpo.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def result() -> dict:
    return json.loads(RESULT.read_text())


def test_committed_result_is_consistent(result):
    bench = _bench()
    assert result["categories"] == list(bench.CATEGORIES)
    assert bench.check_result(result) == []
    assert result["accounting_problems"] == []
    for setting in result["settings"].values():
        cfg = setting["config"]
        g_a = 1 + (cfg["G_rtpo"] - 1) * cfg["K"]
        assert setting["G_grpo_equal_rollouts"] == g_a
        for res in setting["paths"].values():
            q = cfg["queries_per_iteration"]
            assert res["rtpo"]["rollouts"]["mean"] == q * g_a == res["grpo_equal_rollouts"]["rollouts"]["mean"]
            for name in ("grpo_equal_rollouts", "grpo_equal_tokens"):
                ratio = res[f"ratio_rtpo_over_{name}"]
                assert ratio["rollouts"] == pytest.approx(
                    res["rtpo"]["rollouts"]["mean"] / res[name]["rollouts"]["mean"]
                )
                assert len(res[name]["per_iteration"]) == cfg["measured_rounds"]


@pytest.mark.parametrize("breakage", ["split", "rollouts", "phases", "ratio"])
def test_check_catches_broken_accounting(result, breakage):
    bench = _bench()
    broken = copy.deepcopy(result)
    res = next(iter(next(iter(broken["settings"].values()))["paths"].values()))
    it = res["rtpo"]["per_iteration"][0]
    if breakage == "split":
        it["split_s"]["train"] += 1.0
    elif breakage == "rollouts":
        res["grpo_equal_rollouts"]["per_iteration"][0]["rollouts"] += 1
    elif breakage == "phases":
        it["phases"] -= 1
    else:
        it["rollout_train_ratio"][0] = 0.9
    assert bench.check_result(broken) != []


@pytest.mark.slow
def test_quick_mode_runs_and_its_accounting_holds(tmp_path):
    """The benchmark end to end on the real stack (vLLM, FSDP2, sandboxed tool) in quick mode; only its
    accounting is checked, never its timings."""
    pytest.importorskip("vllm")
    out = tmp_path / "quick.json"
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "bench_rtpo_vs_grpo.py"),
            "--quick",
            "--out",
            str(out),
            "--model-cache",
            str(tmp_path / "models"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    bench = _bench()
    assert bench.check_result(result) == [] and result["accounting_problems"] == []
    setting = result["settings"]["bpe512-h256"]
    res = setting["paths"]["after"]
    assert res["rtpo"]["engine_loads"]["mean"] == setting["config"]["K"]  # K syncs: the trunk's θ is not reloaded
    assert res["grpo_equal_rollouts"]["engine_loads"]["mean"] == 1
    for name in ("rtpo", "grpo_equal_rollouts", "grpo_equal_tokens"):
        assert len(res[name]["per_iteration"]) == 1 and res[name]["tokens"]["mean"] > 0
