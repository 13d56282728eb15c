"""Scenario config validation: every bad file, key or value is a one-line error naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from rtpo.commands.cli import main
from rtpo.scenario.load import ConfigError, default_scenario_text, load_scenario, parse_scenario, parse_yaml

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = sorted((ROOT / "scenarios" / "tabular").glob("*.yaml"))


def _error(overrides: list[str], path=None) -> str:
    with pytest.raises(ConfigError) as info:
        load_scenario(path, overrides)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_default_loads_and_round_trips():
    cfg = load_scenario(None)
    assert cfg.backend.kind == "tabular" and cfg.method.name == "rtpo"
    assert parse_scenario(cfg.to_dict()) == cfg
    assert parse_scenario(parse_yaml(cfg.to_yaml(), "x")).to_dict() == cfg.to_dict()


def test_repo_default_is_the_embedded_default():
    assert (ROOT / "scenarios" / "tabular" / "default.yaml").read_text() == default_scenario_text()


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_shipped_scenarios_validate(path):
    cfg = load_scenario(path)
    assert cfg.name == path.stem


def test_expected_scenarios_exist():
    names = {p.stem for p in SCENARIOS}
    assert {"default", "math_short", "search_long", "aliased"} <= names
    assert load_scenario(ROOT / "scenarios/tabular/math_short.yaml").task.params.num_turns == 3
    assert load_scenario(ROOT / "scenarios/tabular/search_long.yaml").task.params.num_turns >= 6
    assert load_scenario(ROOT / "scenarios/tabular/aliased.yaml").task.psi != "identity"


def test_overrides_are_yaml_scalars():
    cfg = load_scenario(
        None,
        [
            "method.G=6",
            "train.lr=1e-3",
            "task.psi=modulo:3",
            "budget.max_rollouts=500",
            "method.clip_eps_high=null",
            "name=other",
        ],
    )
    assert cfg.method.config.G == 6
    assert cfg.train.lr == 1e-3 and isinstance(cfg.train.lr, float)
    assert cfg.task.psi == "modulo:3"
    assert cfg.budget.max_rollouts == 500
    assert cfg.name == "other"


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["method.G=1"], "method.G: must be >= 2"),
        (["method.G=abc"], "method.G: must be a valid integer"),
        (["method.G=4.5"], "method.G: must be a valid integer"),
        (["method.epochs=true"], "method.epochs: must be a valid integer"),
        (["method.bogus=1"], "method.bogus: unknown key"),
        (["method.name=nope"], "method.name: unknown method 'nope'"),
        (["method.estimator=nope"], "method.estimator: unknown estimator 'nope'"),
        (["budget.iterations=0"], "budget.iterations: must be >= 1"),
        (["budget.bogus=1"], "budget.bogus: unknown key"),
        (["train.optimizer=rmsprop"], "train.optimizer: must be 'adam' or 'sgd'"),
        (["train.lr=-1"], "train.lr: must be > 0"),
        (["task.kind=nope"], "task.kind: unknown tabular task 'nope'"),
        (["task.psi=modulo:0"], "task.psi: must be identity, last_feedback or modulo:<n>"),
        (["task.num_turns=0"], "task.num_turns: must be in [1, 64], got 0"),
        (["task.sharpnes=2"], "task.sharpnes: unknown key"),
        (["task.policy=tree"], "task.policy: must be 'softmax', 'loglinear' or 'shared'"),
        (["backend.kind=quantum"], "backend.kind: unknown backend 'quantum'"),
        (["backend.extra=1"], "backend.extra: unknown key"),
        (["bogus=1"], "bogus: unknown key"),
        (["seed=-1"], "seed: must be a non-negative integer"),
        (["eval.target=2"], "eval.target: must be <= 1"),
        (["method.G"], "override 'method.G': must look like key.sub=value"),
        (["method..G=3"], "method..G: not a valid key path"),
        (["method.G={a: 1}"], "method.G: override value must be a scalar"),
        (["method.G.x=3"], "method.G: is a value, not a section"),
    ],
)
def test_bad_override_is_one_line_naming_the_key(overrides, expected):
    assert _error(overrides).startswith(expected)


def test_bad_files(tmp_path):
    assert "missing.yaml: no such scenario file, nor a shipped scenario name" in _error([], tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmethod: {name: rtpo\n")
    assert "invalid YAML at line" in _error([], bad)
    bad.write_text("- 1\n- 2\n")
    assert "must be a mapping" in _error([], bad)
    bad.write_text(default_scenario_text().replace("  G: 8", "  G: 8\n  H: 3"))
    assert _error([], bad).startswith("method.H: unknown key")
    bad.write_text(default_scenario_text().replace("name: default\n", ""))
    assert _error([], bad) == "name: required key missing"


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["run", "method.G=1"], "method.G: must be >= 2"),
        (["run", "method.bogus=3"], "method.bogus: unknown key"),
        (["run", "budget.iterations=x"], "budget.iterations: must be a valid integer"),
        (["run", "/no/such/file.yaml"], "/no/such/file.yaml: no such scenario file, nor a shipped scenario name"),
        (["solve", "/no/such/file.yaml"], "/no/such/file.yaml: no such scenario file, nor a shipped scenario name"),
        (["run", "--bogus-flag"], "unrecognized arguments"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(argv, expected, capsys, tmp_path):
    with pytest.raises(SystemExit) if argv[0] == "frobnicate" or "--bogus-flag" in argv else _nullctx() as info:
        rc = main([*argv, "--out", str(tmp_path)] if argv[0] == "run" else argv)
    if info is not None:
        rc = info.value.code
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and expected in err
    assert not list(tmp_path.iterdir())  # nothing was started


class _nullctx:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False
