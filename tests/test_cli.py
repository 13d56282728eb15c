"""The `rtpo` command's entry points and its dispatch to helpers' subcommands."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rtpo.commands import cli

ROOT = Path(__file__).resolve().parents[1]


def test_python_dash_m_rtpo_is_the_cli():
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    ok = subprocess.run([sys.executable, "-m", "rtpo", "run", "--help"], env=env, capture_output=True, text=True)
    assert ok.returncode == 0 and "--resume" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "rtpo", "run", "method.G=1"], env=env, capture_output=True, text=True, cwd=ROOT / "tests"
    )
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == ["rtpo: error: method.G: must be >= 2 (G-1 >= 1 siblings), got 1"]


def test_missing_helper_module_is_one_line_exit_2(capsys):
    assert cli._dispatch("rtpo.no_such_helper_module", ["x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rtpo.no_such_helper_module is not available" in err


def test_verify_and_compare_dispatch_their_arguments(monkeypatch):
    seen = {}

    def fake_dispatch(module, argv):
        seen[module] = argv
        return 0

    monkeypatch.setattr(cli, "_dispatch", fake_dispatch)
    assert cli.main(["verify", "-k", "T2", "--x"]) == 0
    assert cli.main(["compare", "a.yaml", "--methods", "rtpo,grpo"]) == 0
    assert seen == {"rtpo.verify.cli": ["-k", "T2", "--x"], "rtpo.compare": ["a.yaml", "--methods", "rtpo,grpo"]}


def test_resume_refuses_overrides(capsys, tmp_path):
    assert cli.main(["run", "method.G=3", "--resume", str(tmp_path)]) == 2
    assert "--resume" in capsys.readouterr().err


def test_resume_of_a_non_run_folder(capsys, tmp_path):
    assert cli.main(["run", "--resume", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"rtpo: error: --resume {tmp_path}: not a run folder (no config.yaml)"


def test_run_prints_summary(capsys, tmp_path):
    rc = cli.main(
        [
            "run",
            "budget.iterations=1",
            "budget.queries_per_iteration=4",
            "logging.plot=false",
            "--out",
            str(tmp_path),
            "--no-progress",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "run folder:" in out and "x optimum" in out
    (run_dir,) = tmp_path.iterdir()
    assert not (run_dir / "learning_curve.png").exists()


@pytest.mark.parametrize("name", ["math_short", "search_long", "aliased", "default"])
def test_solve_every_shipped_scenario(name, capsys):
    assert cli.main(["solve", str(ROOT / "scenarios" / "tabular" / f"{name}.yaml")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"scenario {name}:") and "V* = " in out and "k=0:" in out


def test_every_command_uses_the_shared_one_line_parser():
    """rtpo.commands.common is the one place the one-line-error parser is defined; a command that subclasses
    argparse itself again would drift from the `PROG: error: ...`, exit 2 contract."""
    import ast

    own = []
    for path in (ROOT / "rtpo").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(ast.unparse(b).endswith("ArgumentParser") for b in node.bases):
                own.append(f"{path.relative_to(ROOT)}:{node.name}")
    assert own == ["rtpo/commands/common.py:OneLineParser"]


@pytest.mark.parametrize(
    "argv, prefix",
    [
        (["compare", "--seeds", "0"], "rtpo compare: error: --seeds must be >= 1"),
        (["compare", "--bogus"], "rtpo compare: error: unrecognized arguments: --bogus"),
        (["eval", "no/such/target"], "rtpo: error: no/such/target: no such scenario file"),
        (["verify", "--jobs", "0"], "rtpo verify: error: --jobs must be >= 1"),
        (["solve"], "rtpo solve: error: the following arguments are required"),
    ],
)
def test_dispatched_commands_fail_in_one_line(argv, prefix, capsys):
    try:
        rc = cli.main(argv)
    except SystemExit as e:  # argparse errors of the top-level parser exit through cliutil.fail
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(prefix), err


@pytest.mark.parametrize("module", ["rtpo.compare", "rtpo.commands.eval"])
def test_python_dash_m_runs_the_subcommand(module):
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    bad = subprocess.run([sys.executable, "-m", module, "--bogus"], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and ": error: " in bad.stderr, bad.stderr
