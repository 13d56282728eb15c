"""logging.profile_iteration: a torch profiler trace of exactly that iteration in RUN/profile, a valid
Chrome trace holding the iteration's optimiser steps; other iterations and unset runs write none.

Mutant: stopping the profiler before the iteration's phases (at begin) leaves no Adam step in the
trace and turns the test red.
"""

from __future__ import annotations

import json

from rtpo.rundir.runner import run_scenario
from rtpo.scenario.load import load_scenario


def test_profile_iteration_writes_a_trace_of_that_iteration(tmp_path):
    over = [
        "budget.iterations=2",
        "budget.queries_per_iteration=8",
        "logging.plot=false",
        "logging.profile_iteration=1",
    ]
    res = run_scenario(load_scenario(None, over), out_root=tmp_path, progress=False)
    traces = sorted(p.name for p in (res.run_dir / "profile").iterdir())
    assert traces == ["iter_1.trace.json"], f"exactly iteration 1's trace expected, got {traces}"
    trace = json.loads((res.run_dir / "profile" / "iter_1.trace.json").read_text())
    names = {e.get("name", "") for e in trace["traceEvents"]}
    # the learner runs Adam's kernel without Optimizer.step's wrapper (rtpo.tabular.backend): its
    # second-moment update (addcmul_) is the step's mark in either form
    assert any(n in ("aten::addcmul_", "Optimizer.step#Adam.step") or "Adam.step" in n for n in names), (
        "the trace should hold the iteration's optimiser steps (no Adam update op in it)"
    )
    plain = run_scenario(load_scenario(None, over[:-1]), out_root=tmp_path / "plain", progress=False)
    assert not (plain.run_dir / "profile").exists()
