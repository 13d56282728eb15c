"""`rtpo run scenarios/llm/tiny-cpu-search.yaml` end to end (real engine, real FSDP2 learner, BM25 over the
generated corpus, summarising ψ): RTPO's rollout/train ratio is 1 within 1e-6 in every phase and the QA
metrics are logged; GRPO trained on the full history behind the summarised rollouts departs from 1
(Eq. 2/10); `rtpo eval` on the run folder reports F1, EM and search calls beside Pass@k."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("bm25s", reason="the search extra (bm25s) is not installed")
pytest.importorskip("transformers")

from rtpo.commands import cli  # noqa: E402

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "llm" / "tiny-cpu-search.yaml"
pytestmark = pytest.mark.slow


def _run(tmp: Path, *overrides: str) -> Path:
    out = tmp / "runs"
    rc = cli.main(
        [
            "run",
            str(SCENARIO),
            "backend.engine=hf",
            "budget.iterations=1",
            "task.num_turns=3",
            f"backend.model_cache={tmp.parent / 'models'}",
            f"task.data_dir={tmp.parent / 'data'}",
            *overrides,
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0
    (run,) = out.iterdir()
    return run


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def rtpo_run(tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("search-rtpo"))


def test_rtpo_ratio_is_one_and_qa_metrics_are_logged(rtpo_run):
    rows = _rows(rtpo_run)
    phases = [r for r in rows if "phase/turn" in r]
    assert len(phases) == 3
    for r in phases:
        assert abs(r["consistency/rollout_train_ratio"] - 1.0) < 1e-6
    last = rows[-1]
    for key in ("env/answer/f1", "env/answer/em", "env/tool/search/episodes", "env/tool/search/searches", "eval/f1"):
        assert key in last, key


def test_grpo_on_the_full_history_behind_summaries_departs_from_one(tmp_path_factory):
    run = _run(
        tmp_path_factory.mktemp("search-grpo"),
        "method.name=grpo",
        "method.train_context=full_history",
        "task.full_context_map=identity",
    )
    (row,) = [r for r in _rows(run) if "consistency/abs_log_ratio" in r]
    assert row["consistency/abs_log_ratio"] > 1e-3  # the learner sees contexts the sampler never saw


def test_eval_reports_f1_em_and_search_calls(rtpo_run, capsys):
    rc = cli.main(["eval", str(rtpo_run), "--samples", "2", "--k", "1,2", "--queries", "2"])
    out = capsys.readouterr().out
    assert rc == 0
    report = json.loads(Path(out.strip().splitlines()[-1].removeprefix("wrote ")).read_text())
    for key in ("pass@1", "pass@2", "f1_mean", "em_mean", "search_calls_mean", "retrieval_recall"):
        assert key in report, key
    assert 0.0 <= report["f1_mean"] <= 1.0 and report["search_calls_mean"] >= 0.0
