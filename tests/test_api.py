"""rtpo.train (rtpo.commands.api): the runner from Python.  In memory it writes nothing and returns exactly what
`rtpo run` would have written; overrides are one-line errors like the CLI's; docs/python-api.md's example
runs as written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import rtpo
from rtpo.core.metrics import reproducible
from rtpo.scenario.load import ConfigError, load_scenario
from rtpo.tabular import solve
from rtpo.tabular.generators import tool_chain

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"budget": {"iterations": 2, "queries_per_iteration": 8}}


def _no_time(lines: list[dict]) -> list[dict]:
    return [reproducible(m) for m in lines]  # rtpo.core.metrics: the wall-clock keys left out


def test_the_docs_example_runs(tmp_path, monkeypatch):
    text = (ROOT / "docs" / "python-api.md").read_text()
    block = re.search(r"## RTPO on your own TurnMDP.*?```python\n(.*?)```", text, re.S).group(1)
    assert len(block.strip().splitlines()) <= 10
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(block, "docs/python-api.md", "exec"), namespace)
    assert namespace["result"].summary["reached_target"] is True
    assert list(tmp_path.iterdir()) == []  # in memory: nothing written


def test_in_memory_equals_the_run_folder_and_writes_nothing(tmp_path, monkeypatch):
    """The in-memory run is the runner's own loop: the same metric lines (bar wall times) and summary as
    the run folder `out=` writes, which is what `rtpo run` writes."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    mem = rtpo.train(**SMALL)
    assert list(work.iterdir()) == [] and mem.run_dir is None and mem.summary["run_dir"] is None

    disk = rtpo.train(out=tmp_path / "runs", **SMALL)
    assert disk.run_dir is not None and disk.run_dir.parent == tmp_path / "runs"
    lines = [json.loads(x) for x in (disk.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert _no_time(mem.metrics) == _no_time(lines) == _no_time(disk.metrics)
    assert len(mem.metrics) == 2 * 4
    keys = ("final_value", "optimum", "value_over_optimum", "rollouts", "tokens", "iterations_done")
    saved = json.loads((disk.run_dir / "summary.json").read_text())
    assert {k: mem.summary[k] for k in keys} == {k: saved[k] for k in keys}
    # the policy is the trained one: its table is what the exact evaluator scored
    assert mem.policy.shape == (4, mem.learner.policy.num_contexts, 4)
    np.testing.assert_allclose(mem.policy.sum(axis=-1), 1.0)
    np.testing.assert_array_equal(mem.policy, disk.policy)
    assert mem.config == load_scenario(None, ["budget.iterations=2", "budget.queries_per_iteration=8"])


def test_train_on_your_own_turn_mdp_reports_its_optimum(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mdp = tool_chain(num_turns=2, num_actions=3, p_advance=1.0, seed=3, bernoulli=False)
    res = rtpo.train(mdp=mdp, **SMALL)
    assert res.summary["optimum"] == pytest.approx(solve(mdp).value, abs=1e-12)
    assert res.policy.shape == (2, mdp.num_contexts, 3)
    from rtpo.tabular.solve import policy_value

    assert res.summary["final_value"] == pytest.approx(policy_value(mdp, res.policy), abs=1e-9)
    with pytest.raises(ConfigError, match="in memory only"):
        rtpo.train(mdp=mdp, out=tmp_path / "runs")
    with pytest.raises(ConfigError, match="mdp: must be a rtpo.tabular TurnMDP"):
        rtpo.train(mdp="not an mdp")
    assert list(tmp_path.iterdir()) == []


def test_overrides_merge_sections_and_name_bad_keys():
    cfg = rtpo.resolve(method={"G": 4}, budget__iterations=3, seed=5)
    assert (cfg.method.config.G, cfg.method.config.trunks_per_query, cfg.budget.iterations, cfg.seed) == (4, 1, 3, 5)
    assert cfg.budget.queries_per_iteration == 32  # the rest of the section is kept
    grpo = rtpo.resolve(method={"name": "grpo", "G": 6})  # keys GRPO lacks (trunks_per_query) are dropped
    assert grpo.method.name == "grpo" and grpo.method.config.G == 6
    base = load_scenario(None)
    assert rtpo.resolve(base, seed=2).to_dict() == {**base.to_dict(), "seed": 2}
    for kwargs, message in (
        ({"methd": {"G": 4}}, "methd: unknown key (did you mean 'method'?)"),
        ({"method": {"GG": 4}}, "method.GG: unknown key (did you mean 'G'?)"),
        ({"budget__iterations": 0}, "budget.iterations: must be >= 1"),
        ({"seed__x": 1}, "seed: is a value, not a section"),
    ):
        with pytest.raises(ConfigError) as e:
            rtpo.resolve(**kwargs)
        assert str(e.value).startswith(message), str(e.value)
    with pytest.raises(ConfigError, match="no such scenario file"):
        rtpo.resolve("nope.yaml")
    with pytest.raises(ConfigError, match="scenario: must be None"):
        rtpo.resolve(3)
