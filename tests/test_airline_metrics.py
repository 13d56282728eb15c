"""The Appendix G (τ³-airline) metrics: trunk outcome statistics and the evaluation report's additions."""

from __future__ import annotations

import numpy as np
import pytest

from rtpo.commands.eval import EvalSamples
from rtpo.core.methods.reverse import trunk_outcomes


def test_trunk_outcomes_count_failures_by_the_turn_they_ended():
    returns = np.array([1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    turns = np.array([2, 1, 3, 3, 1, 2, 3, 1])
    out = trunk_outcomes(returns, turns, num_turns=3)
    assert out["trunk/success_rate"] == 2 / 8
    assert [out[f"trunk/fail_turn_{k}"] for k in range(3)] == [2 / 8, 1 / 8, 3 / 8]
    assert sum(out[f"trunk/fail_turn_{k}"] for k in range(3)) + out["trunk/success_rate"] == pytest.approx(1.0)
    assert out["trunk/failed_turns_mean"] == (1 + 3 + 3 + 2 + 3 + 1) / 6
    assert "trunk/failed_turns_mean" not in trunk_outcomes(np.ones(2), [1, 2], 2)


def test_eval_summary_reports_tables_8_9_14():
    s = EvalSamples(
        query_ids=np.arange(2),
        returns=np.array([[1.0, 0.0], [0.0, 1.0]]),
        tokens=np.array([[100, 40], [60, 300]]),
        turns=np.array([[2, 1], [3, 4]]),
        malformed_turns=np.zeros((2, 2), np.int64),
        threshold=0.0,
        counters={"tool/calls": 8.0, "tool/ok": 6.0, "tool/errors": 2.0, "tool/attempted": 9.0, "end/normal": 3.0},
    ).summary((1, 2))
    assert s["tokens_per_success"] == (100 + 300) / 2  # response tokens per successful trajectory
    assert s["tokens_per_turn"] == 500 / 10
    assert s["tool_calls_attempted"] == 9.0 and s["tool_error_calls"] == 2.0
    # Table 9's execution success is 1 - errors/attempted (the paper's numbers work out only so), not ok/ran
    assert s["tool_ok_rate"] == 1 - 2 / 9 and s["normal_termination_rate"] == 3 / 4
    four = EvalSamples(
        query_ids=np.arange(1),
        returns=np.zeros((1, 1)),
        tokens=np.ones((1, 1), np.int64),
        turns=np.ones((1, 1), np.int64),
        malformed_turns=np.zeros((1, 1), np.int64),
        threshold=0.0,
        counters={"tool/attempted": 4.0, "tool/calls": 2.0, "tool/ok": 1.0, "tool/errors": 3.0},
    ).summary()
    assert four["tool_ok_rate"] == 0.25, "4 attempts, 3 errors: 1 - 3/4 (ok/ran would give 0.5)"
    none = EvalSamples(
        query_ids=np.arange(1),
        returns=np.zeros((1, 2)),
        tokens=np.ones((1, 2), np.int64),
        turns=np.ones((1, 2), np.int64),
        malformed_turns=np.zeros((1, 2), np.int64),
        threshold=0.0,
    ).summary()
    assert none["tokens_per_success"] is None and none["normal_termination_rate"] is None
    assert none["tool_error_calls"] is None
