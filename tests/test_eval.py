"""`rtpo eval` and its core (rtpo.commands.eval): the unbiased Pass@k estimator against brute-force enumeration,
and the command on tabular targets, where the exact success probability of the policy is known, so the
sampled Pass@k is checked against the exact one within a stated tolerance."""

from __future__ import annotations

import itertools
import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from rtpo.commands import cli
from rtpo.commands.eval import load_checkpoint_policy, mean_pass_at_k, pass_at_k

ROOT = Path(__file__).resolve().parents[1]


# -- the estimator ----------------------------------------------------------------------------------
def _brute_force(n: int, c: int, k: int) -> Fraction:
    """The fraction of all k-subsets of n samples (c of them successes) that hold at least one success."""
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    hits = sum(any(samples[i] for i in s) for s in subsets)
    return Fraction(hits, len(subsets))


@given(st.integers(1, 10).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_equals_enumeration_of_k_subsets(nck):
    n, c, k = nck
    assert pass_at_k(n, c, k) == pytest.approx(float(_brute_force(n, c, k)), abs=1e-12)


@given(st.integers(1, 400).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_matches_exact_binomials_for_large_n(nck):
    """The product form against exact integer binomials where a factorial form would overflow floats."""
    n, c, k = nck
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-9, abs=1e-12)


@given(st.integers(2, 30).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))))
def test_pass_at_k_is_non_decreasing_in_k(nc):
    n, c = nc
    values = [pass_at_k(n, c, k) for k in range(1, n + 1)]
    assert all(a <= b + 1e-12 for a, b in zip(values, values[1:]))
    assert values[0] == pytest.approx(c / n)  # pass@1 is the success rate


def test_pass_at_k_edge_cases():
    assert pass_at_k(10, 0, 1) == 0.0 and pass_at_k(10, 0, 10) == 0.0  # c = 0
    assert pass_at_k(10, 10, 1) == 1.0 and pass_at_k(10, 10, 7) == 1.0  # c = n
    assert pass_at_k(10, 1, 10) == 1.0 and pass_at_k(10, 0, 10) == 0.0  # k = n
    assert pass_at_k(10, 3, 8) == 1.0  # n - c < k
    assert pass_at_k(1000, 1, 1) == pytest.approx(1e-3)
    with pytest.raises(ValueError, match=r"k=5 needs at least k samples per problem, got n=4"):
        pass_at_k(4, 1, 5)  # k > n
    with pytest.raises(ValueError, match=r"k must be >= 1"):
        pass_at_k(4, 1, 0)
    with pytest.raises(ValueError, match=r"successes c must be in \[0, n=4\], got c=5"):
        pass_at_k(4, 5, 1)
    with pytest.raises(TypeError, match="k must be an integer"):
        pass_at_k(4, 1, 1.5)
    with pytest.raises(ValueError, match="no problems"):
        mean_pass_at_k([], 4, 1)
    assert mean_pass_at_k([0, 4, 2], 4, 1) == pytest.approx(0.5)


# -- the command on tabular targets -----------------------------------------------------------------
# A random MDP whose return is 0/1 (Bernoulli reward only where an episode ends, γ = 1), with a
# non-uniform start distribution, so the exact Pass@k = Σ_s init(s)·(1 − (1 − V_0(s))^k) is a real
# average over start states (a "problem" of the tabular backend is one start-state draw).
BINARY = {
    "name": "binary",
    "seed": 3,
    "backend": {"kind": "tabular"},
    "task": {
        "kind": "random",
        "seed": 5,
        "num_turns": 3,
        "num_states": 4,
        "num_actions": 3,
        "end_prob": 0.3,
        "terminal_reward_only": True,
        "bernoulli_rewards": True,
        "init_scale": 1.0,
    },
    "method": {"name": "rtpo", "G": 4},
    "budget": {"iterations": 3, "queries_per_iteration": 16},
    "train": {"lr": 0.5},
    "logging": {"progress": False, "plot": False},
}
Q, N, KS = 2000, 4, (1, 2, 4)


@pytest.fixture(scope="module")
def binary_scenario(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("scenario") / "binary.yaml"
    path.write_text(yaml.safe_dump(BINARY))
    return path


@pytest.fixture(scope="module")
def binary_run(binary_scenario, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    assert cli.main(["run", str(binary_scenario), "--out", str(out), "--no-progress"]) == 0
    (run_dir,) = out.iterdir()
    return run_dir


def _eval(capsys, *args) -> dict:
    rc = cli.main(["eval", *map(str, args)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    out = Path(captured.out.strip().splitlines()[-1].removeprefix("wrote "))
    return json.loads(out.read_text())


def _exact_pass_at_k(cfg, checkpoint: Path | None, ks) -> dict[int, float]:
    """Exact Pass@k of the target's policy from the MDP: per start state, 1 − (1 − P(success | s))^k."""
    from rtpo.scenario.backends import get_backend
    from rtpo.tabular.build import build_mdp
    from rtpo.tabular.solve import evaluate

    built = get_backend("tabular").build(cfg)
    if checkpoint is not None:
        load_checkpoint_policy(checkpoint, built.ctx.learner)
    mdp = build_mdp(cfg.task)
    ev = evaluate(mdp, built.ctx.sampler.policy.table(built.ctx.learner.weights()))
    assert np.all((ev.v[0] >= 0) & (ev.v[0] <= 1))
    return {k: float(mdp.init @ (1 - (1 - ev.v[0]) ** k)) for k in ks}


def _check_against_exact(report: dict, exact: dict[int, float]) -> None:
    # Each problem's estimate lies in [0, 1] and problems are independent, so the mean over Q problems has
    # standard deviation <= sqrt(μ(1 − μ) / Q) for μ the exact Pass@k: allow 4 of them (p ≈ 6e-5 per check).
    for k, mu in exact.items():
        tol = 4 * math.sqrt(mu * (1 - mu) / report["num_problems"])
        assert abs(report[f"pass@{k}"] - mu) <= tol, (k, report[f"pass@{k}"], mu, tol)


def _check_report(report: dict) -> None:
    for key in (
        "pass@1",
        "reward_mean",
        "success_rate",
        "tokens_mean",
        "turns_mean",
        "tool_calls_mean",
        "tool_ok_rate",
        "truncation_rate",
        "malformed_rate",
        "num_problems",
        "samples_per_problem",
        "num_episodes",
        "sampling",
        "per_problem",
        "seed",
        "split",
        "k",
        "target",
        "exact",
    ):
        assert key in report, key
    passes = [report[f"pass@{k}"] for k in report["k"]]
    assert passes == sorted(passes)  # non-decreasing in k
    succ = np.array(report["per_problem"]["successes"])
    n = report["samples_per_problem"]
    assert succ.size == report["num_problems"] and np.all((0 <= succ) & (succ <= n))
    assert report["pass@1"] == pytest.approx(succ.sum() / (succ.size * n)) == report["success_rate"]
    assert report["num_episodes"] == succ.size * n


def test_eval_of_a_scenario_matches_the_exact_pass_at_k(binary_scenario, tmp_path, capsys):
    from rtpo.scenario.load import load_scenario

    report = _eval(
        capsys, binary_scenario, "--samples", N, "--k", "1,2,4", "--queries", Q, "--out", tmp_path / "e.json"
    )
    _check_report(report)
    assert report["target"]["kind"] == "scenario" and report["target"]["checkpoint"] is None
    assert report["sampling"] == {"temperature": 1.0, "top_p": 1.0}
    # return is 0/1, so the mean reward is the success rate and the exact value is P(success)
    assert report["reward_mean"] == report["success_rate"]
    exact = _exact_pass_at_k(load_scenario(binary_scenario), None, KS)
    assert report["exact"]["eval/value"] == pytest.approx(exact[1], abs=1e-12)
    _check_against_exact(report, exact)
    assert report["tool_calls_mean"] is None and report["truncation_rate"] is None  # tabular env counts none


def test_eval_of_a_run_folder_loads_the_checkpoint_policy(binary_run, capsys):
    from rtpo.rundir.checkpoint import latest_path
    from rtpo.rundir.runner import read_metrics
    from rtpo.scenario.load import load_scenario

    report = _eval(capsys, binary_run, "--samples", N, "--k", "1,2,4", "--queries", Q)
    assert (binary_run / "eval.json").is_file()  # the default report path of a run
    _check_report(report)
    ckpt = report["target"]["checkpoint"]
    assert ckpt["path"] == str(latest_path(binary_run)) and ckpt["global_phase"] == 9 and ckpt["iteration"] == 3
    # the checkpoint's policy is the trained one: its exact value is the run's last evaluation, not θ0's
    final = read_metrics(binary_run)[-1]["eval/value"]
    assert report["exact"]["eval/value"] == pytest.approx(final, abs=1e-12)
    cfg = load_scenario(binary_run / "config.yaml")
    exact = _exact_pass_at_k(cfg, latest_path(binary_run), KS)
    assert abs(exact[1] - _exact_pass_at_k(cfg, None, KS)[1]) > 0.02  # training moved it (0.324 -> 0.350)
    _check_against_exact(report, exact)
    # the checkpoint file itself is a target too, with the same result
    again = _eval(
        capsys,
        latest_path(binary_run),
        "--samples",
        N,
        "--k",
        "1,2,4",
        "--queries",
        Q,
        "--out",
        binary_run / "again.json",
    )
    assert {k: v for k, v in again.items() if k not in ("wall_s", "target")} == {
        k: v for k, v in report.items() if k not in ("wall_s", "target")
    }


def test_same_seed_same_report_other_seed_other_samples(binary_scenario, tmp_path, capsys):
    args = [binary_scenario, "--samples", 3, "--k", "1,3", "--queries", 300]
    a = _eval(capsys, *args, "--seed", 11, "--out", tmp_path / "a.json")
    b = _eval(capsys, *args, "--seed", 11, "--out", tmp_path / "b.json")
    c = _eval(capsys, *args, "--seed", 12, "--out", tmp_path / "c.json")
    drop = ("wall_s",)
    assert {k: v for k, v in a.items() if k not in drop} == {k: v for k, v in b.items() if k not in drop}
    assert a["per_problem"] != c["per_problem"] and a["seed"] == 11 and c["seed"] == 12


def test_default_seed_samples_and_out(binary_scenario, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = _eval(capsys, binary_scenario, "--k", "2", "--queries", 10)
    assert (tmp_path / "eval-binary.json").is_file()
    assert report["samples_per_problem"] == 2 and report["seed"] == BINARY["seed"] + 7919
    assert set(report) >= {"pass@1", "pass@2"}


def test_threshold_flag_defines_success(binary_scenario, tmp_path, capsys):
    report = _eval(capsys, binary_scenario, "--queries", 50, "--threshold", 1.0, "--out", tmp_path / "t.json")
    assert report["success_threshold"] == 1.0 and report["pass@1"] == 0.0  # a 0/1 return never exceeds 1


def test_table_is_printed(binary_scenario, tmp_path, capsys):
    assert (
        cli.main(
            [
                "eval",
                str(binary_scenario),
                "--samples",
                "2",
                "--k",
                "1,2",
                "--queries",
                "20",
                "--out",
                str(tmp_path / "x.json"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    for row in ("pass@1", "pass@2", "mean reward", "tokens / episode", "truncation rate", "exact eval/value"):
        assert row in out, row
    assert f"wrote {tmp_path / 'x.json'}" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["no/such/target"], "rtpo: error: no/such/target: no such scenario file, run folder or checkpoint"),
        (
            ["{scenario}", "--k", "1,x"],
            "rtpo: error: --k: must be a comma-separated list of positive integers, got '1,x'",
        ),
        (["{scenario}", "--k", ""], "rtpo: error: --k: must be a comma-separated list of positive integers, got ''"),
        (
            ["{scenario}", "--k", "1,8", "--samples", "4"],
            "rtpo: error: --k: k=8 > --samples 4 (pass@k needs at least k samples per problem)",
        ),
        (["{scenario}", "--samples", "0"], "rtpo: error: --samples: must be >= 1, got 0"),
        (
            ["{scenario}", "--queries", "many"],
            "rtpo: error: --queries: must be a positive integer or 'all', got 'many'",
        ),
        (["{scenario}", "method.nope=1"], "rtpo: error: method.nope: unknown key"),
        (["{scenario}", "colour.x=1"], "rtpo: error: colour: unknown key"),
        (["{empty_run}"], "rtpo: error: {empty_run}: run folder without a checkpoint"),
        (["{tmp}"], "rtpo: error: {tmp}: neither a run folder (config.yaml) nor a HF model folder (config.json)"),
        (["task.kind=random"], "rtpo: error: eval needs a TARGET"),
    ],
)
def test_bad_input_is_one_line_exit_2(argv, message, binary_scenario, tmp_path, capsys):
    empty_run = tmp_path / "empty-run"
    empty_run.mkdir()
    (empty_run / "config.yaml").write_text(binary_scenario.read_text())
    subs = {"scenario": binary_scenario, "empty_run": empty_run, "tmp": tmp_path}
    argv = [a.format(**subs) for a in argv]
    assert cli.main(["eval", *argv, "--out", str(tmp_path / "never.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(message.format(**subs)), err
    assert not (tmp_path / "never.json").exists()
