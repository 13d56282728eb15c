"""The best deterministic ψ-policy (rtpo.tabular.solve.best_deterministic_psi_policy) against a plain
itertools search with the backward-induction evaluator, and what `rtpo solve` reports on the aliased
scenario: the recursive optimum V*_ψ (0.5285) named for what it is, beside the best deterministic
ψ-policy (0.6665) that it is not."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np
import pytest

from rtpo.commands import cli
from rtpo.tabular import evaluate, random_mdp, solve, uniform_policy
from rtpo.tabular.generators import modulo_psi
from rtpo.tabular.solve import best_deterministic_psi_policy

ROOT = Path(__file__).resolve().parents[1]


def _itertools_best(mdp):
    used = [np.unique(p) for p in mdp.psi]
    pairs = [(k, int(c)) for k in range(mdp.num_turns) for c in used[k]]
    best = -np.inf
    for acts in itertools.product(range(mdp.num_actions), repeat=len(pairs)):
        pi = np.full((mdp.num_turns, mdp.num_contexts, mdp.num_actions), 1.0 / mdp.num_actions)
        for (k, c), a in zip(pairs, acts):
            pi[k, c] = np.eye(mdp.num_actions)[a]
        best = max(best, evaluate(mdp, pi).value)
    return best, mdp.num_actions ** len(pairs)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_matches_an_itertools_search(seed):
    mdp = random_mdp(seed, num_turns=3, num_states=4, num_actions=3, gamma=0.9, max_tau=2, end_prob=0.2)
    mdp = mdp.with_psi(modulo_psi(mdp, 2))
    got = best_deterministic_psi_policy(mdp, chunk=7)  # small chunks: the search crosses chunk borders
    want, count = _itertools_best(mdp)
    assert got.count == count and got.value == pytest.approx(want, abs=1e-12)
    assert evaluate(mdp, got.policy).value == pytest.approx(got.value, abs=1e-12)
    assert np.all(got.policy.sum(axis=-1) == 1.0) and set(np.unique(got.policy)) <= {0.0, 1.0}
    # between the recursive ψ-optimum and V* (a deterministic ψ-policy is one of the policies V* beats)
    assert solve(mdp, mdp.psi, prefix_policy=uniform_policy(mdp)).value <= got.value + 1e-12
    assert got.value <= solve(mdp).value + 1e-12


def test_identity_psi_gives_v_star_and_large_cases_are_refused():
    mdp = random_mdp(5, num_turns=3, num_states=3, num_actions=2).identity_psi()
    assert best_deterministic_psi_policy(mdp).value == pytest.approx(solve(mdp).value, abs=1e-12)
    big = random_mdp(5, num_turns=4, num_states=8, num_actions=4).identity_psi()  # 4^32 policies
    assert best_deterministic_psi_policy(big) is None


def test_solve_names_the_recursive_optimum_and_reports_the_best_psi_policy(capsys):
    assert cli.main(["solve", str(ROOT / "scenarios" / "tabular" / "aliased.yaml")]) == 0
    out = capsys.readouterr().out
    v_psi = float(
        re.search(r"^V\*_psi \(recursive optimum under psi: .*uniform prefix policy.*\) = (\S+)$", out, re.M)[1]
    )
    best = re.search(r"^best deterministic psi-policy \(exhaustive over (\d+) policies\) = (\S+) ", out, re.M)
    assert v_psi == pytest.approx(0.5285, abs=1e-9)
    assert int(best[1]) == 4**8 and float(best[2]) == pytest.approx(0.6665, abs=1e-9)
