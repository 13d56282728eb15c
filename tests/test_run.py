"""The runner: run folder contents, exact evaluation, RTPO's ratio, budget cap, and resume determinism."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rtpo.core.methods.rtpo import RTPO
from rtpo.core.metrics import reproducible
from rtpo.rundir.checkpoint import latest_path, read_checkpoint
from rtpo.rundir.runner import read_metrics, run_scenario
from rtpo.scenario.load import load_scenario

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["budget.iterations=2", "budget.queries_per_iteration=16"]


def _untimed(metrics: list[dict]) -> list[dict]:
    return [reproducible(m) for m in metrics]  # rtpo.core.metrics: the wall-clock keys left out


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    cfg = load_scenario(None, SMALL)
    return cfg, run_scenario(cfg, out_root=tmp_path_factory.mktemp("runs"), progress=False)


def test_run_folder_contents(small_run):
    cfg, res = small_run
    d = res.run_dir
    assert d.name.startswith("default-rtpo-0-")
    for name in ("config.yaml", "metrics.jsonl", "ckpt/latest", "learning_curve.png", "summary.md", "summary.json"):
        assert (d / name).is_file(), name
    assert (d / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert load_scenario(d / "config.yaml").to_dict() == cfg.to_dict()
    K = cfg.task.params.num_turns
    lines = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert lines == res.metrics and len(lines) == 2 * K  # one line per phase
    assert [(m["iteration"], m["phase"]) for m in lines] == [(i, p) for i in range(2) for p in range(K)]
    assert [m["global_phase"] for m in lines] == list(range(1, 2 * K + 1))
    assert [m["phase/turn"] for m in lines[:K]] == list(range(K - 1, -1, -1))  # reverse turn order
    for m in lines:
        for key in (
            "eval/value",
            "eval/v_star",
            "eval/value_over_v_star",
            "adv/zero_rate",
            "loss/approx_kl",
            "consistency/kl_rollout_train",
            "budget/rollouts",
            "budget/tokens",
            "time/phase_s",
        ):
            assert key in m, key
        assert m["eval/value_over_v_star"] == pytest.approx(m["eval/value"] / m["eval/v_star"])
    # batch arithmetic of the config comment: trunks + (G-1)·boundaries per iteration (no early ends)
    Q, G = 16, cfg.method.config.G
    assert lines[K - 1]["budget/rollouts"] == Q + (G - 1) * Q * K
    assert lines[-1]["budget/rollouts"] == 2 * (Q + (G - 1) * Q * K)
    md = (d / "summary.md").read_text()
    assert "value / optimum" in md and "learning_curve.png" in md
    assert res.summary["rollouts"] == lines[-1]["budget/rollouts"]


def test_rtpo_rollout_train_ratio_is_exactly_one(small_run):
    _, res = small_run
    ratios = [m["consistency/rollout_train_ratio"] for m in res.metrics]
    assert ratios and all(r == 1.0 for r in ratios)
    assert all(m["consistency/abs_log_ratio"] == 0.0 for m in res.metrics)


def test_default_scenario_reaches_095_of_v_star(tmp_path):
    """The embedded default, unmodified: RTPO's final exact value is >= 0.95 V*."""
    res = run_scenario(load_scenario(None), out_root=tmp_path, progress=False)
    assert res.summary["stopped_by"] == "iterations"
    assert res.summary["value_over_optimum"] >= 0.95
    assert res.summary["reached_target"] is True


def test_max_rollouts_stops_the_run(tmp_path):
    cfg = load_scenario(None, [*SMALL, "budget.iterations=50", "budget.max_rollouts=500", "logging.plot=false"])
    res = run_scenario(cfg, out_root=tmp_path, progress=False)
    assert res.summary["stopped_by"] == "max_rollouts"
    rollouts = [m["budget/rollouts"] for m in res.metrics]
    K = cfg.task.params.num_turns
    per_iter = rollouts[K - 1]
    # stopped at the first iteration boundary that spent it: every begun iteration ran all K phases
    assert len(rollouts) % K == 0 and rollouts[-1] >= 500 and rollouts[-1] - per_iter < 500
    assert "eval/value" in res.metrics[-1]
    assert res.summary["rollouts"] == rollouts[-1] == read_checkpoint(latest_path(res.run_dir))["budget"]["rollouts"]


@pytest.mark.parametrize("every", [1, 4])
def test_resume_after_crash_continues_exactly(tmp_path, monkeypatch, every):
    """Crash in phase 7; with a checkpoint every 4 phases the resume restarts after phase 4 and redoes 5–6."""
    cfg = load_scenario(
        None, [*SMALL, "budget.iterations=3", "logging.plot=false", f"logging.checkpoint_every={every}"]
    )
    full = run_scenario(cfg, out_root=tmp_path / "a", progress=False)
    real_phase = RTPO.phase
    calls = {"n": 0}

    def crashing_phase(self, ctx, state):
        calls["n"] += 1
        if calls["n"] == 7:  # mid-iteration (K = 4 phases per iteration)
            raise RuntimeError("simulated crash")
        return real_phase(self, ctx, state)

    monkeypatch.setattr(RTPO, "phase", crashing_phase)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_scenario(cfg, out_root=tmp_path / "b", progress=False)
    monkeypatch.setattr(RTPO, "phase", real_phase)
    (run_dir,) = (tmp_path / "b").iterdir()
    assert len(read_metrics(run_dir)) == 6
    assert read_checkpoint(latest_path(run_dir))["progress"]["metric_lines"] == (6 if every == 1 else 4)
    resumed = run_scenario(None, resume=run_dir, progress=False)
    assert _untimed(resumed.metrics) == _untimed(full.metrics)


def test_resume_after_sigkill_loses_and_duplicates_nothing(tmp_path):
    """`rtpo run` as a subprocess, SIGKILLed once some phases are checkpointed, then `--resume`d."""
    scenario = tmp_path / "kill.yaml"
    cfg = load_scenario(None, ["budget.iterations=6", "budget.queries_per_iteration=16", "logging.plot=false"])
    scenario.write_text(cfg.to_yaml().replace("name: default", "name: killed"))
    out = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rtpo", "run", str(scenario), "--out", str(out), "--no-progress"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    total = 6 * cfg.task.params.num_turns
    try:
        deadline = time.monotonic() + 240
        run_dir = None
        while time.monotonic() < deadline:
            dirs = list(out.iterdir()) if out.exists() else []
            if dirs and (dirs[0] / "ckpt" / "latest").exists():
                run_dir = dirs[0]
                ckpt = read_checkpoint(latest_path(run_dir))
                if ckpt["progress"]["metric_lines"] >= 3:
                    break
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.02)
        else:
            pytest.fail("the run never checkpointed 3 phases")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    ckpt = read_checkpoint(latest_path(run_dir))
    done = ckpt["progress"]["metric_lines"]
    assert 3 <= done < total  # really interrupted mid-run
    before = read_metrics(run_dir)[:done]

    from rtpo.commands.cli import main

    assert main(["run", "--resume", str(run_dir), "--no-progress"]) == 0
    after = read_metrics(run_dir)
    assert [m["global_phase"] for m in after] == list(range(1, total + 1))  # nothing lost or duplicated
    assert after[:done] == before  # completed phases untouched
    reference = run_scenario(load_scenario(scenario), out_root=tmp_path / "ref", progress=False)
    assert _untimed(after) == _untimed(reference.metrics)


@pytest.mark.parametrize(
    "task",
    [
        {"kind": "tool_chain", "num_turns": 4, "policy": "loglinear", "psi": "modulo:3"},
        {"kind": "random", "num_turns": 3, "num_states": 5, "end_prob": 0.3, "psi": "last_feedback"},
    ],
)
def test_other_tasks_policies_and_context_maps_run(task, tmp_path):
    from rtpo.scenario.load import parse_scenario

    data = load_scenario(
        None, ["budget.iterations=1", "budget.queries_per_iteration=8", "logging.plot=false", "method.G=3"]
    ).to_dict()
    cfg = parse_scenario({**data, "task": task})
    res = run_scenario(cfg, out_root=tmp_path, progress=False)
    last = res.metrics[-1]
    assert last["eval/v_star_psi"] <= last["eval/v_star"] + 1e-12
    assert all(m.get("consistency/rollout_train_ratio", 1.0) == 1.0 for m in res.metrics)
    assert len(res.metrics) == task["num_turns"]


def test_a_task_that_fails_to_load_leaves_no_folder_behind(tmp_path, monkeypatch, capsys):
    """The backend (task data, model, engines) is built before a run folder is made or changed: a task
    that fails to load is one line, exit 2, and leaves no run folder with only config.yaml in it, no
    forked folder for --resume --iter, and a resumed run's config.yaml as it was."""
    import dataclasses

    from rtpo.commands import cli
    from rtpo.scenario import backends
    from rtpo.scenario.load import ConfigError

    out = tmp_path / "runs"
    assert (
        cli.main(["run", "budget.iterations=1", "budget.queries_per_iteration=4", "--out", str(out), "--no-progress"])
        == 0
    )
    (run,) = out.iterdir()
    config_before = (run / "config.yaml").read_text()
    capsys.readouterr()

    spec = backends.get_backend("tabular")

    def failing_build(cfg):
        raise ConfigError("task.path: data.jsonl:2: field 'answer' is missing")

    monkeypatch.setitem(backends.BACKENDS._items, "tabular", dataclasses.replace(spec, build=failing_build))
    for args in (
        ["run", "--out", str(out)],
        ["run", "--resume", str(run), "budget.iterations=2"],
        ["run", "--resume", str(run), "--iter", "1", "--out", str(out)],
    ):
        assert cli.main([*args, "--no-progress"]) == 2
        assert capsys.readouterr().err == "rtpo: error: task.path: data.jsonl:2: field 'answer' is missing\n"
        assert list(out.iterdir()) == [run]
        assert (run / "config.yaml").read_text() == config_before
