"""`rtpo compare --tune KEY=v1,v2,...`: per-method selection on tuning seeds disjoint from the reported
seeds, the winner is the best mean tuning score, the reported runs use it, and the report prints it."""

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rtpo.rundir.runner", reason="needs the scenario runner (rtpo.rundir.runner)")

from rtpo import compare  # noqa: E402
from rtpo.compare.tuning import Selection, Tune, select  # noqa: E402
from rtpo.scenario.load import ConfigError, load_scenario  # noqa: E402

SCENARIO = """
name: tiny
seed: 10
backend: {kind: tabular}
task: {kind: tool_chain, num_turns: 3, num_actions: 3, seed: 1, psi: identity, policy: softmax}
method: {name: rtpo, G: 3, epochs: 1}
budget: {iterations: 2, queries_per_iteration: 4, max_rollouts: 120}
train: {lr: 0.2}
eval: {every: 1}
"""


@pytest.fixture
def scenario(tmp_path):
    p = tmp_path / "tiny.yaml"
    p.write_text(SCENARIO)
    return p


def _summary(run_dir: str) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())


def test_tune_selects_on_disjoint_seeds_and_reports_the_winner(scenario, tmp_path, capsys):
    argv = [str(scenario), "--methods", "rtpo,grpo:G=4", "--seeds", "2", "--tune-seeds", "2", "--workers", "1"]
    rc = compare.main([*argv, "--out", str(tmp_path), "--tune", "train.lr=0.01,1.0"])
    assert rc == 0
    out = next(tmp_path.glob("compare-tiny-*"))
    payload = json.loads((out / "comparison.json").read_text())
    tuning = payload["tuning"]
    assert tuning["key"] == "train.lr" and tuning["values"] == ["0.01", "1.0"]
    rows = {r["method"]: r for r in payload["rows"]}
    for sel in tuning["selections"]:
        reported = [p["seed"] for p in rows[sel["method"]]["per_seed"]]
        assert reported == [10, 11] and sel["seeds"] == [12, 13]  # disjoint: scenario seed + 2, + 3
        # each candidate's score is the mean value/V* of its own tuning runs (their folders, by lr)
        for value, got in sel["scores"].items():
            folder = out / "tuning" / f"train.lr={value}" / "runs"
            runs = [d for d in folder.iterdir() if load_scenario(d / "config.yaml").method.name == sel["method"][:4]]
            vals = [_summary(str(d))["value_over_optimum"] for d in runs]
            assert len(vals) == 2 and got == pytest.approx(np.mean(vals))
            assert {load_scenario(d / "config.yaml").seed for d in runs} == {12, 13}
        assert sel["chosen"] == max(sel["scores"], key=sel["scores"].get)
        assert 0.0 <= sel["stability"] <= 1.0 and set(sel["per_seed"]) == set(sel["scores"])
        # the reported runs ran with the chosen value
        for p in rows[sel["method"]]["per_seed"]:
            assert load_scenario(Path(p["run_dir"]) / "config.yaml").train.lr == float(sel["chosen"])
        assert rows[sel["method"]]["settings"]["train.lr"] == float(sel["chosen"])
    md = (out / "comparison.md").read_text()
    assert "Tuned per method: train.lr over 0.01, 1.0 on tuning seeds 12, 13" in md
    assert "disjoint from the reported seeds 10, 11" in md
    assert "*" in md.split("Tuned per method")[1]
    assert "Tuned per method" in capsys.readouterr().out


def test_a_method_key_tunes_only_the_methods_that_have_it_unfixed():
    t = Tune.parse("method.epochs=1,2", 2)
    assert t.applies_to("rtpo") and t.applies_to("grpo")
    assert not t.applies_to("grpo:epochs=1")  # the spec fixes it
    assert not Tune.parse("method.eta=0.5,1", 2).applies_to("rtpo")  # RTPO has no eta
    assert Tune.parse("train.lr=0.1,0.3", 2).applies_to("refuel")


def test_selection_is_the_best_mean_and_ties_keep_the_earlier_value():
    class Out:
        def __init__(self, label, seed, v):
            self.job = type("J", (), {"sweep": None, "label": label, "seed": seed})()
            self.summary = None if v is None else {"value_over_optimum": v}

    t = Tune.parse("train.lr=0.1,0.3,1.0", 2)
    by_value = {
        "0.1": [Out("a", 2, 0.5), Out("a", 3, 0.7), Out("b", 2, 0.9), Out("b", 3, 0.9)],
        "0.3": [Out("a", 2, 0.8), Out("a", 3, 0.4), Out("b", 2, 0.9), Out("b", 3, None)],  # a failed run: −inf
        "1.0": [Out("a", 2, 0.6), Out("a", 3, 0.7), Out("b", 2, 0.9), Out("b", 3, 0.9)],
    }
    sel = select(t, by_value)
    assert sel[(None, "a")].scores == pytest.approx({"0.1": 0.6, "0.3": 0.6, "1.0": 0.65})
    assert sel[(None, "a")].chosen == "1.0"
    assert sel[(None, "b")].chosen == "0.1"  # 0.1 and 1.0 tie at 0.9; 0.3 has a failed seed
    assert sel[(None, "b")].seeds == [2, 3]
    assert isinstance(sel[(None, "a")], Selection)


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--tune", "train.lr"], "--tune 'train.lr'"),
        (["--tune", "train.lr=0.1"], "at least two values"),
        (["--tune", "train.lr=0.1,0.1"], "repeated"),
        (["--tune", "train.lr=0.1,0.3", "--tune-seeds", "0"], "--tune-seeds"),
        (["--tune", "method.eta=0.5,1", "--methods", "rtpo"], "applies to none"),
        (["--tune", "train.lr=0.1,-1"], "train.lr"),
    ],
)
def test_bad_tune_input_is_one_line_and_exit_2(scenario, tmp_path, capsys, argv, needle):
    rc = compare.main([str(scenario), "--out", str(tmp_path), *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and needle in err and "\n" not in err, err
    assert not list(tmp_path.glob("compare-*"))  # nothing started


def test_tune_parse_errors_are_config_errors():
    with pytest.raises(ConfigError):
        Tune.parse("=1,2", 2)


def test_settings_lines_show_each_sweep_values_own_setting():
    rows = [
        {"method": "rtpo", "sweep": "3", "settings": {"G": 3, "train.lr": 1.0}},
        {"method": "rtpo", "sweep": "6", "settings": {"G": 3, "train.lr": 0.3}},
        {"method": "rtpo", "sweep": "10", "settings": {"G": 3, "train.lr": 1.0}},
        {"method": "grpo", "sweep": "3", "settings": {"G": 16, "train.lr": 0.1}},
    ]
    lines = compare.settings_lines(rows)
    assert "- rtpo (at 3, 10): G=3, train.lr=1.0" in lines
    assert "- rtpo (at 6): G=3, train.lr=0.3" in lines
    assert "- grpo: G=16, train.lr=0.1" in lines


def test_stability_is_the_bootstrap_share_that_picks_the_chosen_value():
    """By hand: a candidate that wins on every tuning seed is chosen in every resample (1.0); two candidates
    that split two seeds (0.9/0.1 and 0.2/0.6) are chosen by resamples in proportion to the seed draws
    that favour them: resample {s0, s0} (1/4) picks 'a', {s1, s1} (1/4) picks 'b', a mixed one (1/2) has
    means 0.5 vs 0.4 and picks 'a' — so 'a' is chosen with probability 3/4 (within bootstrap noise)."""
    from rtpo.compare.tuning import BOOTSTRAP, stability

    firm = {"a": {0: 0.9, 1: 0.8, 2: 0.7}, "b": {0: 0.1, 1: 0.2, 2: 0.3}}
    assert stability(firm, ("a", "b"), "a") == 1.0
    assert stability(firm, ("a", "b"), "b") == 0.0
    split = {"a": {0: 0.9, 1: 0.1}, "b": {0: 0.2, 1: 0.6}}
    got = stability(split, ("a", "b"), "a")
    sd = (0.75 * 0.25 / BOOTSTRAP) ** 0.5
    assert abs(got - 0.75) < 5 * sd, f"stability {got} is not 3/4 within 5 bootstrap sd ({sd:.4f})"
    assert stability(split, ("a", "b"), "a") == got  # a fixed stream: the report is reproducible
    # a tie in the means goes to the earlier candidate, as select() breaks it
    assert stability({"a": {0: 0.5}, "b": {0: 0.5}}, ("a", "b"), "a") == 1.0
    # a failed run (−inf) never wins a resample that draws it
    assert stability({"a": {0: float("-inf"), 1: 0.9}, "b": {0: 0.2, 1: 0.2}}, ("a", "b"), "b") > 0.0


def test_the_report_flags_unstable_choices_and_marks_one_seed_as_unmeasurable():
    from rtpo.compare.tuning import Selection, Tune, tuning_lines

    tune = Tune("train.lr", ("0.1", "1.0"), 2)
    shaky = Selection(None, "rtpo", {"0.1": 0.5, "1.0": 0.4}, [12, 13], "0.1", stability=0.62)
    firm = Selection(None, "grpo", {"0.1": 0.9, "1.0": 0.4}, [12, 13], "0.1", stability=1.0)
    text = "\n".join(tuning_lines(tune, [shaky, firm], [10, 11], None))
    assert "62% (unstable)" in text and "| 100% |" in text
    assert "Unstable: 1 of 2 choices" in text
    one = Selection(None, "rtpo", {"0.1": 0.5, "1.0": 0.4}, [12], "0.1", stability=1.0)
    text = "\n".join(tuning_lines(Tune("train.lr", ("0.1", "1.0"), 1), [one], [10], None))
    assert "n/a" in text and "One tuning seed" in text


def test_the_default_tune_seed_count_is_the_one_the_stability_bench_found():
    """DEFAULT_TUNE_SEEDS is the fewest tuning seeds whose rerun agreement reached STABLE on the shipped
    families (bench/bench_tune_stability.py); a default changed without re-measuring fails here."""
    from rtpo.compare.tuning import DEFAULT_TUNE_SEEDS, STABLE

    bench = json.loads((Path(__file__).resolve().parents[1] / "bench" / "tune_stability.json").read_text())
    assert bench["stable"] == STABLE
    assert bench["smallest_tune_seeds_reaching_stable"] == DEFAULT_TUNE_SEEDS
    assert bench["by_tune_seeds"][str(DEFAULT_TUNE_SEEDS)]["mean_agreement"] >= STABLE
