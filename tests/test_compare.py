"""`rtpo compare`: equal budgets, the table with intervals, plots, and one-line errors."""

import json
import math

import numpy as np
import pytest

pytest.importorskip("rtpo.rundir.runner", reason="needs the scenario runner (rtpo.rundir.runner)")

from rtpo import compare  # noqa: E402

SCENARIO = """
name: tiny
seed: 0
backend: {kind: tabular}
task: {kind: tool_chain, num_turns: 3, num_actions: 3, seed: 1, psi: identity, policy: softmax}
method: {name: rtpo, G: 3, epochs: 1}
budget: {iterations: 2, queries_per_iteration: 4}
train: {lr: 0.2}
eval: {every: 1}
"""


@pytest.fixture
def scenario(tmp_path):
    p = tmp_path / "tiny.yaml"
    p.write_text(SCENARIO)
    return p


def test_method_spec_parsing():
    assert compare.parse_method_spec("grpo:normalize=false:G=4") == ("grpo", {"normalize": False, "G": 4})
    assert compare.parse_method_spec("rtpo") == ("rtpo", {})
    with pytest.raises(ValueError, match="key=value"):
        compare.parse_method_spec("grpo:normalize")


def test_mean_ci_is_the_student_t_interval():
    from scipy import stats

    x = [0.1, 0.4, 0.35, 0.2]
    m, h = compare.mean_ci(x)
    lo, hi = stats.t.interval(0.95, len(x) - 1, loc=np.mean(x), scale=stats.sem(x))
    assert m == pytest.approx(np.mean(x)) and h == pytest.approx((hi - lo) / 2)
    assert math.isnan(compare.mean_ci([0.3])[1])


def test_jobs_share_one_budget_and_method_overrides_apply_where_they_exist(scenario, tmp_path):
    jobs, meta = compare.build_jobs(str(scenario), ["rtpo", "grpo:G=4", "tree_grpo"], 2, ["method.G=5"], None, tmp_path)
    # the budget is what the scenario's own method (rtpo, now G=5) plans: 2 iterations × (1 + 4·3) × 4
    assert meta["budgets"] == {"None": 2 * 13 * 4}
    assert len(jobs) == 6 and {j.seed for j in jobs} == {0, 1}
    by = {j.label: j for j in jobs}
    assert by["rtpo"].data["method"] == {"name": "rtpo", "G": 5, "epochs": 1}  # scenario settings kept
    assert by["grpo:G=4"].data["method"]["G"] == 5  # the global method.G override wins for methods with G
    assert "G" not in by["tree_grpo"].data["method"]  # skipped where the Config has no G
    for j in jobs:
        assert j.data["budget"]["max_rollouts"] == 104
    assert by["grpo:G=4"].data["budget"]["iterations"] == 104 // (5 * 4)  # whole iterations that fit


def test_compare_runs_every_method_and_seed_at_equal_budget(scenario, tmp_path, capsys):
    rc = compare.main(
        [str(scenario), "--methods", "rtpo,grpo:G=4", "--seeds", "2", "--out", str(tmp_path), "budget.max_rollouts=60"]
    )
    assert rc == 0
    out = next(tmp_path.glob("compare-tiny-*"))
    payload = json.loads((out / "comparison.json").read_text())
    rows = {r["method"]: r for r in payload["rows"]}
    assert set(rows) == {"rtpo", "grpo:G=4"}
    for r in rows.values():
        assert len(r["per_seed"]) == 2 and not r["failed"]
        assert all(p["rollouts"] <= 60 for p in r["per_seed"])
        assert 0 < r["value_over_optimum"]["mean"] <= 1
    assert rows["rtpo"]["rollout_train_ratio"]["mean"] == 1.0  # RTPO trains on the recorded c_k
    assert rows["grpo:G=4"]["per_seed"][0]["rollouts"] == 48  # 3 whole iterations of 4 queries × 4
    assert all(isinstance(p["wrong_first_action"], bool) for r in rows.values() for p in r["per_seed"])
    assert 0 <= rows["rtpo"]["wrong_first_action"] <= 2
    md = (out / "comparison.md").read_text()
    assert "| rtpo |" in md and "±" in md
    for png in ("curves.png", "ratio.png", "zero_adv_vs_G.png"):
        assert (out / png).stat().st_size > 0
    assert len(list((out / "runs").iterdir())) == 4


def test_sweep_repeats_the_comparison_per_value(scenario, tmp_path):
    rc = compare.main(
        [
            str(scenario),
            "--methods",
            "rtpo",
            "--seeds",
            "1",
            "--workers",
            "1",
            "--out",
            str(tmp_path),
            "--sweep",
            "method.G=2,3",
        ]
    )
    assert rc == 0
    out = next(tmp_path.glob("compare-tiny-*"))
    rows = json.loads((out / "comparison.json").read_text())["rows"]
    assert [(r["sweep"], r["G"]) for r in rows] == [("2", 2), ("3", 3)]
    # G = 2 leaves one sibling per boundary: every advantage is 0 (G.2, Eq. 107)
    assert rows[0]["zero_advantage_rate"]["mean"] == 1.0
    assert (out / "sweep.png").exists()


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--methods", "nope"], "unknown method 'nope'"),
        (["--methods", "grpo:bogus=1"], "grpo:bogus=1: method.bogus: unknown key"),
        (["--seeds", "0"], "--seeds"),
        (["--sweep", "task.num_turns"], "--sweep"),
        (["task.num_turns=-1"], "task.num_turns"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(scenario, tmp_path, capsys, argv, needle):
    rc = compare.main([str(scenario), "--out", str(tmp_path), *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and needle in err and "\n" not in err
    assert not list(tmp_path.glob("compare-*"))  # nothing started


def test_rtpo_variants_inherit_the_scenarios_rtpo_settings(scenario, tmp_path):
    jobs, _ = compare.build_jobs(
        str(scenario), ["rtpo_offpolicy", "rtpo_sync_kl:kl_threshold=0.1", "seeupo"], 1, [], None, tmp_path
    )
    by = {j.label: j.data["method"] for j in jobs}
    assert by["rtpo_offpolicy"] == {"name": "rtpo_offpolicy", "G": 3, "epochs": 1}
    assert by["rtpo_sync_kl:kl_threshold=0.1"] == {"name": "rtpo_sync_kl", "G": 3, "epochs": 1, "kl_threshold": 0.1}
    assert by["seeupo"] == {"name": "seeupo"}  # not an RTPO config: its own defaults


def test_report_shows_resolved_settings_and_samples_per_turn(tmp_path, capsys):
    """RTPO inherits the scenario's epochs: 2 while GRPO runs its default 1: both are printed, the
    difference is called out, and samples per turn are counted from the runs' own batches."""
    p = tmp_path / "tiny.yaml"
    p.write_text(SCENARIO.replace("epochs: 1", "epochs: 2"))
    rc = compare.main([str(p), "--methods", "rtpo,grpo:G=4", "--seeds", "1", "--workers", "1", "--out", str(tmp_path)])
    assert rc == 0
    printed = capsys.readouterr().out
    out = next(tmp_path.glob("compare-tiny-*"))
    rows = {r["method"]: r for r in json.loads((out / "comparison.json").read_text())["rows"]}
    assert rows["rtpo"]["settings"]["epochs"] == 2 and rows["grpo:G=4"]["settings"]["epochs"] == 1
    assert rows["rtpo"]["settings"]["G"] == 3 and rows["grpo:G=4"]["settings"]["normalize"] is True
    # budget 2·(1 + 2·3)·4 = 56: RTPO 2 iterations × 4 queries × (G−1) siblings per turn; GRPO 3 × 4 × 4
    assert rows["rtpo"]["samples_per_turn"] == {"0": 16.0, "1": 16.0, "2": 16.0}
    assert rows["grpo:G=4"]["samples_per_turn"] == {"0": 48.0, "1": 48.0, "2": 48.0}
    md = (out / "comparison.md").read_text()
    line = "differs between methods: epochs (rtpo 2, grpo:G=4 1)"
    assert line in md and line in printed
    assert "- rtpo: epochs=2, " in md and "- grpo:G=4: 0: 48, 1: 48, 2: 48" in md


def test_wrong_first_action_per_seed():
    """eval/first_action_wrong: the start-state mass whose most likely first action is not optimal; a
    seed is locked onto a wrong first action when it exceeds 1/2 at its last evaluation."""
    from rtpo.tabular import SoftmaxTable, TabularEvaluator, TabularLearner, TurnMDP

    # two start states (mass 0.3, 0.7), K = 1: action 0 is optimal in state 0, action 1 in state 1
    mdp = TurnMDP.from_arrays(np.zeros((1, 2, 2, 2)), np.array([[[1.0, 0.0], [0.0, 1.0]]]), np.array([0.3, 0.7]))
    pol = SoftmaxTable(1, 2, 2)
    ev = TabularEvaluator(mdp, pol)
    for params, wrong in (
        ([[3.0, 0.0], [0.0, 3.0]], 0.0),
        ([[0.0, 3.0], [0.0, 3.0]], 0.3),
        ([[3.0, 0.0], [3.0, 0.0]], 0.7),
    ):
        learner = TabularLearner(pol, np.array([params]))
        assert ev(learner)["eval/first_action_wrong"] == pytest.approx(wrong)
    assert compare._wrong_first_action([{"eval/first_action_wrong": 0.7}]) is True
    assert compare._wrong_first_action([{"eval/first_action_wrong": 0.7}, {"eval/first_action_wrong": 0.3}]) is False
    assert compare._wrong_first_action([{"eval/value": 1.0}]) is None


_AFTER_TORCH_RAN = """
import sys, torch
from rtpo import compare
torch.set_num_threads(2)
torch.log_softmax(torch.randn(512, 4096), dim=-1)  # starts this process's OpenMP team with 2 threads
sys.exit(compare.main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_worker_processes_start_after_torch_ran_multithreaded_in_the_caller(scenario, tmp_path):
    """A caller that already ran a multi-threaded torch op (a test session, a notebook, rtpo.commands.api) gets its
    comparison: workers come from a fork server, so none inherits a forked OpenMP team (which blocks at
    its first parallel op forever)."""
    import subprocess
    import sys

    argv = [str(scenario), "--methods", "rtpo,grpo:G=4", "--seeds", "1", "--workers", "2", "--out", str(tmp_path)]
    proc = subprocess.run([sys.executable, "-c", _AFTER_TORCH_RAN, *argv], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(next(tmp_path.glob("compare-tiny-*/comparison.json")).read_text())["rows"]
    assert {r["method"] for r in rows} == {"rtpo", "grpo:G=4"} and not any(r["failed"] for r in rows)


def test_turn_count_comes_from_the_task_section_without_building(monkeypatch):
    """compare's K (for the planned budget) is the task section's num_turns: equal to the built environment's
    on every shipped tabular scenario, and read without building on llm ones (an llm build starts a model
    and an inference engine in the comparing process).  Mutant: reading num_actions instead fails the
    tabular half; always building fails the llm half."""
    from rtpo.compare.jobs import _num_turns
    from rtpo.scenario import backends
    from rtpo.scenario.load import load_scenario
    from rtpo.scenario.shipped import shipped

    seen = {"tabular": 0, "llm": 0}
    for s in shipped():
        cfg = load_scenario(str(s.path))
        kind = cfg.backend.kind
        if kind.startswith("tabular"):
            built = backends.get_backend(kind).build(cfg).ctx.env.num_turns
            assert _num_turns(cfg) == built, f"{s.name}: task section K {_num_turns(cfg)} != environment's {built}"
            seen["tabular"] += 1
        elif kind == "llm" and isinstance(getattr(cfg.task, "num_turns", None), int):
            with monkeypatch.context() as m:
                m.setattr(backends, "get_backend", lambda k, name=s.name: pytest.fail(f"{name}: compare built {k}"))
                assert _num_turns(cfg) == cfg.task.num_turns
            seen["llm"] += 1
    assert seen["tabular"] >= 5 and seen["llm"] >= 5, seen
