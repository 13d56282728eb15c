"""REFUEL on the llm backend: the FSDP learner trains the pair regression (a pair is one sequence, kept
whole in a micro-batch; the loss split is checked against an unsharded reference in test_learner.py),
and a run on the tiny model trains on real pairs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
def test_refuel_runs_on_the_llm_backend(tmp_path):
    from rtpo.rundir.runner import run_scenario
    from rtpo.scenario.load import load_scenario

    cfg = load_scenario(
        ROOT / "scenarios" / "llm" / "tiny-cpu-learn.yaml",
        [
            "method.name=refuel",
            "method.pairs_per_query=2",
            "method.epochs=2",
            "backend.engine=hf",
            "budget.iterations=1",
            "budget.queries_per_iteration=2",
            "task.n=4",
            "task.eval_queries=2",
            "logging.plot=false",
            f"backend.model_cache={tmp_path / 'models'}",
        ],
    )
    res = run_scenario(cfg, out_root=tmp_path / "runs", progress=False)
    (line,) = res.metrics
    pairs = line["phase/boundaries"]
    assert pairs >= 1
    assert line["budget/rollouts"] == 2 * 2 + 2 * pairs  # roll-ins, then two continuations per pair
    assert np.isfinite(line["loss/policy"]) and line["loss/policy"] >= 0  # a mean of squared residuals
    # the first step is at θ = θ_old, where every residual is −η(R − R′): the ratio starts at 1
    assert line["consistency/rollout_train_ratio"] == pytest.approx(1.0, abs=1e-4)
