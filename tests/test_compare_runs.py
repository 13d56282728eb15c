"""`rtpo compare --runs RUN...`: the comparison's tables and figures over run folders written earlier,
without running anything: the same rows (seed statistics, intervals, per-seed values) `rtpo compare`
computed for those runs, and one-line refusals for folders that cannot be compared."""

import json

import pytest

pytest.importorskip("rtpo.rundir.runner", reason="needs the scenario runner (rtpo.rundir.runner)")

from rtpo import compare  # noqa: E402
from rtpo.commands.cli import main as rtpo_main  # noqa: E402
from tests.test_compare import SCENARIO  # noqa: E402


@pytest.fixture(scope="module")
def earlier(tmp_path_factory):
    """An earlier `rtpo compare` (2 methods × 2 seeds): its comparison.json and its run folders."""
    root = tmp_path_factory.mktemp("earlier")
    p = root / "tiny.yaml"
    p.write_text(SCENARIO)
    argv = [str(p), "--methods", "rtpo,grpo:G=4", "--seeds", "2", "--workers", "1", "--out", str(root)]
    assert compare.main([*argv, "budget.max_rollouts=60"]) == 0
    out = next(root.glob("compare-tiny-*"))
    return json.loads((out / "comparison.json").read_text()), sorted((out / "runs").iterdir()), p


def test_compare_runs_gives_the_tables_compare_gave(earlier, tmp_path, capsys):
    payload, runs, _ = earlier
    assert rtpo_main(["compare", "--runs", *map(str, runs), "--out", str(tmp_path)]) == 0
    out = next(tmp_path.glob("compare-runs-tiny-*"))
    again = {r["method"]: r for r in json.loads((out / "comparison.json").read_text())["rows"]}
    before = {r["method"].split(":")[0]: r for r in payload["rows"]}  # the labels were the specs given
    assert set(again) == set(before) == {"rtpo", "grpo"}
    for name, r in again.items():
        assert sorted(r["per_seed"], key=lambda p: p["seed"]) == sorted(
            before[name]["per_seed"], key=lambda p: p["seed"]
        )
        for key in ("value_over_optimum", "normalised_gain", "rollouts", "rollout_train_ratio", "zero_advantage_rate"):
            assert r[key] == before[name][key]  # mean and 95% interval over the same seeds
        assert r["settings"] == before[name]["settings"]
    md = (out / "comparison.md").read_text()
    assert "| rtpo |" in md and "| grpo |" in md and "each at the budget it ran" in md
    for png in ("curves.png", "ratio.png"):
        assert (out / png).stat().st_size > 0
    assert "| rtpo |" in capsys.readouterr().out


def test_runs_of_one_method_with_different_settings_are_separate_rows(earlier, tmp_path):
    from rtpo.rundir.runner import run_scenario
    from rtpo.scenario.load import load_scenario

    _, runs, scenario = earlier
    rtpo_runs = [r for r in runs if load_scenario(r / "config.yaml").method.name == "rtpo"]
    g5 = run_scenario(load_scenario(str(scenario), ["method.G=5"]), out_root=tmp_path / "g5", progress=False)
    outcomes, meta = __import__("rtpo.compare.existing", fromlist=["from_runs"]).from_runs(
        [*map(str, rtpo_runs), str(g5.run_dir)]
    )
    assert [o.job.label for o in outcomes] == ["rtpo:G=3", "rtpo:G=3", "rtpo:G=5"]
    assert meta["seeds"] == 2


def test_folders_that_cannot_be_compared_are_one_line_errors(earlier, tmp_path, capsys):
    from rtpo.rundir.runner import run_scenario
    from rtpo.scenario.load import load_scenario

    _, runs, scenario = earlier
    other = run_scenario(load_scenario(str(scenario), ["task.num_actions=4"]), out_root=tmp_path / "o", progress=False)
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "config.yaml").write_text((runs[0] / "config.yaml").read_text())
    cases = [
        ([str(runs[0]), str(other.run_dir)], "a different scenario from .* \\(task.num_actions: 4 vs 3\\)"),
        ([str(runs[0]), str(unfinished)], "the run has not finished \\(no summary.json\\); `rtpo run --resume"),
        ([str(tmp_path)], "not a run folder \\(no config.yaml\\)"),
    ]
    for argv, pattern in cases:
        assert rtpo_main(["compare", "--runs", *argv, "--out", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0
        assert __import__("re").search(pattern, err), err
    assert rtpo_main(["compare", "--runs", str(runs[0]), "method.G=4"]) == 2
    assert "takes no scenario, override or option" in capsys.readouterr().err


def test_runs_of_one_seed_count_as_one_seed_with_a_warning(earlier, tmp_path, capsys):
    """Three folders of one seed (the same run given thrice, or copies of it) used to report '3 seeds
    ± 0.000'; they are one seed: counted once, with a warning naming the duplicates.  Fails before."""
    import shutil

    _, runs, _ = earlier
    from rtpo.scenario.load import load_scenario

    (one,) = [r for r in runs if load_scenario(r / "config.yaml").method.name == "rtpo" and "seed0" in r.name] or [
        next(r for r in runs if load_scenario(r / "config.yaml").method.name == "rtpo")
    ]
    copy = tmp_path / "copy"
    shutil.copytree(one, copy)
    assert rtpo_main(["compare", "--runs", str(one), str(one), str(copy), "--out", str(tmp_path / "x")]) == 0
    err = capsys.readouterr().err
    assert err.count("warning: --runs") == 2 and "counted once" in err, err
    out = next((tmp_path / "x").glob("compare-runs-*"))
    payload = json.loads((out / "comparison.json").read_text())
    (row,) = payload["rows"]
    assert len(row["per_seed"]) == 1, row["per_seed"]
    assert payload["seeds"] == 1
