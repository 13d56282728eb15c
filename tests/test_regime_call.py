"""The regime diagnostic's call (rtpo.tabular.diagnostic.regime_call): `rtpo solve`/`rtpo compare` name a
winner only where the held-out half of bench/bench_regime.py's families supports it, with that half's hit
rate and Wilson interval, and say "no call" everywhere else.  The shipped calibration is the committed
benchmark's (docs/results/regime_benchmark/regime.json), re-derived here from its rows.

Mutant: making regime_call ignore MIN_CONFIDENCE (call in every band) turns
test_a_band_without_held_out_support_makes_no_call red."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from rtpo.tabular.diagnostic import MIN_CONFIDENCE, REGIME_CALIBRATION, regime_call

ROOT = Path(__file__).resolve().parents[1]
REGIME_JSON = ROOT / "docs" / "results" / "regime_benchmark" / "regime.json"
_spec = importlib.util.spec_from_file_location("bench_regime", ROOT / "bench" / "bench_regime.py")
bench_regime = importlib.util.module_from_spec(_spec)
sys.modules["bench_regime"] = bench_regime
_spec.loader.exec_module(bench_regime)

CAL = {
    "G_rtpo": 3,
    "G_grpo": 8,
    "bands": (
        {
            "call": "grpo",
            "lo": 0.0,
            "hi": 0.25,
            "hits": 9,
            "families": 10,
            "wilson95": (0.6, 0.98),
            "clear": (7, 7),
            "close": (2, 3),
        },
        {
            "call": "rtpo",
            "lo": 2.0,
            "hi": None,
            "hits": 1,
            "families": 2,
            "wilson95": (0.09, 0.91),
            "clear": (1, 1),
            "close": (0, 1),
        },
    ),
}


def test_a_supported_band_calls_its_method_with_the_held_out_confidence():
    line = regime_call(0.1, 3, CAL)
    assert line.startswith("call: GRPO ahead"), line
    assert "9 of 10 held-out families" in line and "Wilson 95% 0.60–0.98" in line, line
    assert "clear contests 7/7, close 2/3" in line, line
    assert regime_call(0.0, 3, CAL).startswith("call: GRPO"), "the band's lower edge is inside it"


def test_a_band_without_held_out_support_makes_no_call():
    assert CAL["bands"][1]["wilson95"][0] <= MIN_CONFIDENCE
    for index in (2.0, 50.0, math.inf):  # an infinite index (GRPO has no signal on a turn) is in the top band
        line = regime_call(index, 3, CAL)
        assert line.startswith("no call") and "RTPO band" in line and "too few to call" in line, line


def test_between_the_bands_and_off_protocol_there_is_no_call():
    assert regime_call(0.25, 3, CAL).startswith("no call") and "between the calibrated bands" in regime_call(
        0.25, 3, CAL
    )
    assert "between the calibrated bands" in regime_call(1.0, 3, CAL)
    off = regime_call(0.1, 6, CAL)  # the calibration was measured with RTPO G = 3
    assert off.startswith("no call") and "RTPO G = 3" in off and "has G = 6" in off, off
    assert regime_call(math.nan, 3, CAL).startswith("no call")


def test_the_shipped_calibration_is_the_committed_benchmarks():
    payload = json.loads(REGIME_JSON.read_text(encoding="utf-8"))
    committed = payload["calibration"]
    assert committed == json.loads(json.dumps(bench_regime.calibrate(payload["rows"]))), (
        "regime.json's calibration is not what calibrate() derives from its own rows"
    )
    shipped = REGIME_CALIBRATION["bands"]
    assert len(shipped) == len(committed["bands"])
    for mine, theirs in zip(shipped, committed["bands"], strict=True):
        for key in ("call", "lo", "hi", "hits", "families"):
            assert mine[key] == theirs[key], f"diagnostic's band {key} differs from regime.json's"
        for key in ("wilson95", "clear", "close"):
            assert list(mine[key]) == list(theirs[key]), f"diagnostic's band {key} differs from regime.json's"
    assert REGIME_CALIBRATION["G_rtpo"] == payload["protocol"]["G_rtpo"] == bench_regime.G_RTPO
    assert REGIME_CALIBRATION["G_grpo"] == payload["protocol"]["G_grpo"]


def _rows(points):
    return [{"family": i, "bottleneck": b, "winner": w, "clear": c} for i, (b, w, c) in enumerate(points)]


def test_calibrate_chooses_bands_on_the_design_half_only_and_scores_the_held_out_half():
    # even = design, odd = held out; design: GRPO at 0.1, 0.2; RTPO at 0.4; GRPO at 0.8; RTPO at 4, 8
    points = [
        (0.1, "grpo", True),
        (0.15, "grpo", True),
        (0.2, "grpo", True),
        (0.3, "rtpo", False),
        (0.4, "rtpo", False),
        (0.5, "grpo", False),
        (0.8, "grpo", False),
        (5.0, "rtpo", True),
        (4.0, "rtpo", True),
        (9.0, "grpo", False),
        (8.0, "rtpo", True),
        (0.05, "grpo", True),
    ]
    cal = bench_regime.calibrate(_rows(points))
    grpo, rtpo = cal["bands"]
    assert grpo["hi"] == pytest.approx(math.sqrt(0.2 * 0.4), abs=1e-4), (
        "GRPO band ends between 0.2 and the first design RTPO win"
    )
    assert rtpo["lo"] == pytest.approx(math.sqrt(0.8 * 4.0), abs=1e-4) and rtpo["hi"] is None
    # held out below sqrt(0.08) ≈ 0.283: families 1 (0.15) and 11 (0.05), both GRPO; 3 (0.3) is between
    assert (grpo["hits"], grpo["families"], grpo["held_out_families"]) == (2, 2, [1, 11])
    assert (rtpo["hits"], rtpo["families"], rtpo["held_out_families"]) == (1, 2, [7, 9])
    assert rtpo["clear"] == [1, 1] and rtpo["close"] == [0, 1]
    assert cal["held_out_no_call"] == 2  # families 3 and 5


def test_bands_never_call_against_the_theorys_direction():
    # design (even): GRPO won at 0.2 and at 2.0, RTPO at 3.0: the GRPO band stops at 1 (an index > 1 favours RTPO)
    points = [
        (0.2, "grpo", True),
        (0.1, "grpo", True),
        (2.0, "grpo", True),
        (0.3, "grpo", True),
        (3.0, "rtpo", True),
        (5.0, "rtpo", True),
    ]
    grpo, rtpo = bench_regime.calibrate(_rows(points))["bands"]
    assert grpo["hi"] == 1.0 and rtpo["lo"] == pytest.approx(math.sqrt(6.0), abs=1e-4)
    # design: RTPO won at 0.2 and 0.5, GRPO at 0.3: no GRPO band, and the RTPO band starts at 1, not at 0.39
    points = [
        (0.2, "rtpo", True),
        (0.1, "grpo", True),
        (0.3, "grpo", True),
        (0.3, "grpo", True),
        (0.5, "rtpo", True),
        (5.0, "rtpo", True),
    ]
    (rtpo,) = bench_regime.calibrate(_rows(points))["bands"]
    assert rtpo["call"] == "rtpo" and rtpo["lo"] == 1.0 and rtpo["held_out_families"] == [5]
    # every design family won by GRPO: one GRPO band up to 1 and no RTPO band
    (only,) = bench_regime.calibrate(_rows([(b, "grpo", True) for b in (0.2, 0.3, 2.0, 3.0)]))["bands"]
    assert only["call"] == "grpo" and only["hi"] == 1.0


def test_the_bottleneck_index_is_the_benchmarks():
    payload = json.loads(REGIME_JSON.read_text(encoding="utf-8"))
    for row in payload["rows"][:4]:
        got = bench_regime.predictors(row["task"])["bottleneck"]
        assert got == pytest.approx(row["bottleneck"], rel=1e-9), f"family {row['family']}"


def test_solve_prints_the_call_only_where_calibrated(capsys):
    """`rtpo solve` on the Bernoulli chain at K = 8 with RTPO G = 3: deep in the GRPO band, a call with its
    held-out confidence; region_chain at K = 6 (index 0.77) lies between the bands, and the chain's own
    G = 6 is off the calibrated protocol: no call."""
    from rtpo.commands import cli

    chain = str(ROOT / "scenarios" / "tabular" / "search_long.yaml")
    region = str(ROOT / "scenarios" / "tabular" / "region_chain.yaml")
    outs = []
    for path, extra in (
        (chain, ["method.G=3"]),
        (region, ["method.G=3", "task.num_turns=6", "task.num_actions=3"]),
        (chain, []),
    ):
        assert cli.main(["solve", path, *extra]) == 0
        outs.append(capsys.readouterr().out.strip().splitlines()[-1])
    assert outs[0].startswith("call: GRPO ahead") and "held-out families" in outs[0], outs[0]
    assert outs[1].startswith("no call") and "between the calibrated bands" in outs[1], outs[1]
    assert outs[2].startswith("no call") and "has G = 6" in outs[2], outs[2]


def test_a_stopped_benchmark_keeps_its_finished_families_and_resume_runs_only_the_rest(tmp_path, monkeypatch):
    """The JSON is rewritten after every family (its command names the families it holds), and --resume
    runs only the families that JSON lacks, ending where an uninterrupted run ends.  Mutants: writing the
    JSON only at the end (nothing survives the stop: red), --resume ignoring the kept rows (family 0 and 1
    run again: red)."""
    calls: list[tuple[int, str, float, int]] = []
    stop_at = {"family": 2}

    def fake_value(task, method, lr, seed):
        family = next(i for i in range(8) if bench_regime.family_section(i) == task)
        if family == stop_at["family"]:
            raise KeyboardInterrupt
        calls.append((family, method, lr, seed))
        return 0.5 + 0.01 * seed + 0.1 * (method == "grpo") * (family % 2) - 0.05 * lr

    monkeypatch.setattr(bench_regime, "value", fake_value)
    monkeypatch.setattr(bench_regime, "predictors", lambda task: {"summed": 0.5, "bottleneck": 0.3})
    out = tmp_path / "regime.json"
    with pytest.raises(KeyboardInterrupt):
        bench_regime.main(["--families", "3", "--tune-seeds", "2", "--out", str(out)])
    kept = json.loads(out.read_text())
    assert [r["family"] for r in kept["rows"]] == [0, 1], "the two finished families were not kept"
    assert kept["command"] == "python bench/bench_regime.py --families 2 --tune-seeds 2"
    assert kept["families_requested"] == 3 and kept["protocol"]["families"] == 2

    stop_at["family"] = None
    calls.clear()
    bench_regime.main(["--families", "3", "--tune-seeds", "2", "--out", str(out), "--resume"])
    per_family = 2 * (len(bench_regime.LRS) * 2 + bench_regime.REPORTED)
    assert {c[0] for c in calls} == {2} and len(calls) == per_family, "resume re-ran finished families"
    resumed = json.loads(out.read_text())
    fresh = tmp_path / "fresh.json"
    bench_regime.main(["--families", "3", "--tune-seeds", "2", "--out", str(fresh)])
    fresh_rows = json.loads(fresh.read_text())
    for key in ("command", "rows", "summary", "calibration", "protocol"):
        assert resumed[key] == fresh_rows[key], f"the resumed run's {key} differs from an uninterrupted run's"
    with pytest.raises(SystemExit, match="another protocol"):
        bench_regime.main(["--families", "4", "--tune-seeds", "4", "--out", str(out), "--resume"])
