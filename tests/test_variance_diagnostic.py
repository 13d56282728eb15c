"""The variance diagnostic where users meet it: `rtpo solve` prints the solver's exact decomposition under
the scenario's initial policy, and `rtpo compare` puts it under its table.  (The decomposition itself is
checked term by term against brute-force enumeration in rtpo/verify/test_t2b_variance_decomposition.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from rtpo import compare
from rtpo.commands import cli
from rtpo.scenario.load import load_scenario
from rtpo.tabular.build import build_mdp, initial_policy
from rtpo.tabular.diagnostic import decompose

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)$", re.M)


@pytest.mark.parametrize("name,regime", [("region_chain", "RTPO"), ("search_long", "GRPO"), ("default", "GRPO")])
def test_solve_prints_the_exact_decomposition(name, regime, capsys):
    path = ROOT / "scenarios" / "tabular" / f"{name}.yaml"
    assert cli.main(["solve", str(path)]) == 0
    out = capsys.readouterr().out
    cfg = load_scenario(path)
    mdp = build_mdp(cfg.task)
    dec = decompose(mdp, initial_policy(cfg, mdp))
    rows = np.array([[float(x) for x in m.groups()] for m in ROW.finditer(out)])
    assert rows.shape == (mdp.num_turns, 8)
    np.testing.assert_allclose(rows[:, 2], dec.downstream, rtol=1e-5, atol=1e-12)
    np.testing.assert_allclose(rows[:, 4], dec.sigma_v2, rtol=1e-5, atol=1e-12)
    np.testing.assert_allclose(dec.downstream + dec.var_adv + dec.sigma_v2, dec.var_return, atol=1e-12)
    index = float(re.search(r"index RTPO/GRPO = (\S+)", out).group(1))
    G = cfg.method.config.G
    assert index == pytest.approx(dec.info_index(G), abs=1e-3) and f"RTPO(G={G})" in out
    assert f"(more turn-level credit per {regime} rollout)" in out
    assert "no call on which method will win" in out  # an uncalibrated index is never printed as a prediction


def test_initial_policy_is_the_runs_theta0():
    """init_scale > 0: the diagnostic's policy is the one the run starts from (same seed, same draw)."""
    from rtpo.scenario.backends import get_backend

    cfg = load_scenario(None, ["task.init_scale=0.7", "seed=5"])
    built = get_backend("tabular").build(cfg)
    mdp = build_mdp(cfg.task)
    table = built.ctx.learner.policy.table(built.ctx.learner.weights())
    np.testing.assert_array_equal(initial_policy(cfg, mdp), table)
    assert not np.allclose(table, 1.0 / mdp.num_actions)


def test_compare_report_shows_the_regime(tmp_path):
    scenario = tmp_path / "rc.yaml"
    scenario.write_text(
        "name: rc\nbackend: {kind: tabular}\n"
        "task: {kind: region_chain, num_turns: 3, num_actions: 3, seed: 1}\n"
        "method: {name: rtpo, G: 3}\nbudget: {iterations: 1, queries_per_iteration: 2}\n"
    )
    argv = [str(scenario), "--methods", "rtpo,grpo:G=3", "--seeds", "1", "--workers", "1", "--out", str(tmp_path)]
    assert compare.main([*argv, "--sweep", "task.w=0.0,0.8"]) == 0
    md = next(tmp_path.glob("compare-*/comparison.md")).read_text()
    assert "Which regime (task.w=0.0)" in md and "Which regime (task.w=0.8)" in md
    idx = [float(x) for x in re.findall(r"index RTPO/GRPO = (\S+)", md)]
    assert len(idx) == 2 and idx[0] < 1 < idx[1]  # w = 0 is the tool chain; the region bit flips it


def test_compare_index_uses_the_compared_rtpo_group_size(tmp_path):
    """The scenario's RTPO has G = 6; the compared row rtpo:G=3 is what the index must describe."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "name: s\nbackend: {kind: tabular}\ntask: {kind: tool_chain, num_turns: 3, num_actions: 3, seed: 1}\n"
        "method: {name: rtpo, G: 6}\nbudget: {iterations: 1, queries_per_iteration: 2}\n"
    )
    _, meta = compare.build_jobs(str(scenario), ["rtpo:G=3", "grpo"], 1, [], None, tmp_path)
    assert "RTPO(G=3)" in meta["diagnostics"]["None"][-2]
    _, meta = compare.build_jobs(str(scenario), ["grpo"], 1, [], None, tmp_path)
    assert "RTPO(G=6)" in meta["diagnostics"]["None"][-2]  # no RTPO row: the scenario's own
