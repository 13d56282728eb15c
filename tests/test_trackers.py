"""Trackers get the record metrics.jsonl gets: TensorBoard's event files, read back, hold the same
scalars under the same keys at the same steps, and the resolved scenario once."""

from __future__ import annotations

import math

import pytest

from rtpo.checkpoint import read_metrics
from rtpo.config import ConfigError, load_scenario
from rtpo.run import run_scenario


def test_tensorboard_holds_exactly_the_metrics_jsonl_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = load_scenario(None, ["budget.iterations=2", "logging.plot=false", "logging.trackers=[jsonl, tensorboard]"])
    res = run_scenario(cfg, out_root=tmp_path, progress=False)
    acc = EventAccumulator(str(res.run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    lines = read_metrics(res.run_dir)
    keys = {k for line in lines for k, v in line.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert set(acc.Tags()["scalars"]) == {k for k in keys if all(math.isfinite(line.get(k, 0.0)) for line in lines)}
    for key in ("eval/value", "consistency/rollout_train_ratio", "budget/rollouts", "loss/clipfrac"):
        events = acc.Scalars(key)
        expected = [(line["global_phase"], line[key]) for line in lines if key in line]
        assert [(e.step, pytest.approx(e.value, rel=1e-6)) for e in events] == expected
    assert "config" in acc.Tags()["tensors"] or acc.Tags().get("tensors")  # the scenario, once, as text


def test_unknown_tracker_is_one_line_with_a_suggestion():
    with pytest.raises(
        ConfigError, match=r"^logging\.trackers: unknown tracker 'tensorbord' \(did you mean 'tensorboard'\?\)"
    ):
        load_scenario(None, ["logging.trackers=tensorbord"])
