"""bench/llm_memory.json (written by bench/bench_llm_memory.py) is internally consistent: each ratio is
the quotient of the two measurements it names, and every measurement is a plausible positive figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parent.parent / "bench" / "llm_memory.json"


def test_llm_memory_json_ratios_are_its_measurements():
    data = json.loads(PATH.read_text())
    assert data["command"].endswith("python bench/bench_llm_memory.py")
    mem, learner = data["memory"], data["learner"]
    for key in ("run_peak_rss_bytes", "floor_peak_rss_bytes", "learner_peak_rss_bytes", "plain_train_peak_rss_bytes"):
        assert 100e6 < mem[key] < 24e9, key  # between 100 MB and the machine's memory
    assert mem["run_over_floor"] == pytest.approx(mem["run_peak_rss_bytes"] / mem["floor_peak_rss_bytes"])
    assert mem["learner_over_plain"] == pytest.approx(mem["learner_peak_rss_bytes"] / mem["plain_train_peak_rss_bytes"])
    assert learner["learner_step_s"] > 0 and learner["plain_step_s"] > 0
    assert learner["learner_over_plain"] == pytest.approx(learner["learner_step_s"] / learner["plain_step_s"])
    # the floor is part of the run (same engine, model, reference, optimiser), so a run cannot be far below it
    assert mem["run_over_floor"] > 0.8
