"""The committed RTPO-vs-GRPO benchmark result (bench/rtpo_vs_grpo.json) is internally consistent, and the
consistency check catches broken accounting.  No timing is asserted: only sums, counts and structure.

Running the benchmark itself takes minutes even with --quick (vLLM start, one warm-up round and the
measured rounds of three arms), so it is not run here: `python bench/bench_rtpo_vs_grpo.py --quick`.
"""

from __future__ import annotations

import copy
import importlib.util
import json
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
                assert ratio["rollouts"] == pytest.approx(res["rtpo"]["rollouts"]["mean"] / res[name]["rollouts"]["mean"])
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
