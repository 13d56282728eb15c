"""bench/bench_tabular.py's numpy reference is the same iteration as rtpo's tabular path (so the bench's
ratios compare like with like), and the committed bench/tabular.json is consistent.  No timing is
asserted here.

The reference shares nothing with rtpo but the MDP arrays and the random stream; after the same
iterations from the same seed the parameters agree to rounding (~1e-11: numpy's exp/log differ from
torch's in the last bits, and Adam's division by √v amplifies that where v is tiny), far below any
change of the algorithm — the mutated references below move them by > 1e-3.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    spec = importlib.util.spec_from_file_location("bench_tabular", ROOT / "bench" / "bench_tabular.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_tabular"] = mod
    spec.loader.exec_module(mod)
    return mod


bt = _bench()


def _both(scenario: str, method: str, iterations: int = 3, queries: int = 24, mutate=None, num_turns: int = bt.K):
    mdp = bt.sparse_random(64, num_turns) if scenario == "random_sparse" else bt.scenarios(num_turns)[scenario]
    ctx, m, _ = bt.rtpo_stack(mdp, method, columnar=True, init_scale=0.5)
    ref, rng = bt.reference_stack(mdp, method, init_scale=0.5)
    if mutate is not None:
        mutate(ref)
    for _ in range(iterations):
        bt.rtpo_iteration(ctx, m, queries)
        ref.iteration(queries, rng)
    return ctx.learner.weights(), ref.theta


@pytest.mark.parametrize("method", ["rtpo", "grpo"])
@pytest.mark.parametrize(
    ("scenario", "num_turns"), [("tool_chain", 8), ("region_chain", 8), ("tool_chain", 4), ("random_sparse", 8)]
)
def test_reference_iteration_equals_rtpo_parameters(scenario, num_turns, method):
    """At every size's kind of MDP (the default scenario's K = 4; the big size's sparse random MDP with
    dense rewards, here at 64 states per turn)."""
    ours, ref = _both(scenario, method, num_turns=num_turns)
    assert np.abs(ours).max() > 0.5  # trained away from the start, so agreement is not trivial
    np.testing.assert_allclose(ref, ours, rtol=0, atol=1e-9)


def test_a_changed_reference_disagrees(monkeypatch):
    """The agreement is specific: a reference without the ratio clip, or running RTPO where rtpo runs
    GRPO (same stream, other algorithm), ends far from rtpo's parameters."""
    mdp = bt.scenarios()["region_chain"]
    ctx, m, _ = bt.rtpo_stack(mdp, "rtpo", columnar=True, init_scale=0.5)
    ref, rng = bt.reference_stack(mdp, "rtpo", init_scale=0.5)
    monkeypatch.setattr(bt, "CLIP", 0.999)  # read by the reference's update only (rtpo's config is built)
    for _ in range(3):
        bt.rtpo_iteration(ctx, m, 24)
        ref.iteration(24, rng)
    assert np.abs(ctx.learner.weights() - ref.theta).max() > 1e-3
    monkeypatch.undo()

    ctx, m, _ = bt.rtpo_stack(mdp, "grpo", columnar=True, init_scale=0.5)
    ref, rng = bt.reference_stack(mdp, "rtpo", init_scale=0.5)
    for _ in range(2):
        bt.rtpo_iteration(ctx, m, 24)
        ref.iteration(24, rng)
    assert np.abs(ctx.learner.weights() - ref.theta).max() > 1e-3


def test_committed_json_is_consistent():
    data = json.loads((ROOT / "bench" / "tabular.json").read_text())
    assert data["command"].startswith("python bench/bench_tabular.py")
    keys = {r["key"] for r in data["rows"]}
    want = {
        f"{size}/{scen}/{method}"
        for size, (_, _, builders) in bt.sizes().items()
        for scen in builders
        for method in ("rtpo", "grpo")
    }
    assert keys == want, "the committed JSON must hold every size the bench runs"
    assert data["reportable"] == (max(data["loadavg_before"][0], data["loadavg_after"][0]) <= 4.0)
    for r in data["rows"]:
        assert r["goal_met"] == (r["columnar_over_reference"] <= 1.0)
        assert abs(r["over_goal_by"] - max(0.0, r["columnar_over_reference"] - 1.0)) < 1e-12
        for path in ("columnar", "per_episode", "reference"):
            assert r[f"{path}_s"] > 0 and abs(r[f"{path}_iter_per_s"] * r[f"{path}_s"] - 1) < 1e-9
        assert abs(r["columnar_over_reference"] - r["columnar_s"] / r["reference_s"]) < 1e-9
        assert r["max_abs_param_diff_columnar_vs_per_episode"] == 0.0  # bit-identical paths
        assert r["max_abs_param_diff_columnar_vs_reference"] < 1e-9
