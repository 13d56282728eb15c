"""Scenarios by name: every file of scenarios/ is package data, `rtpo scenarios` lists names and files, and
`rtpo run|compare|config show NAME` and `rtpo.train("NAME")` take a shipped name where a path would go
(rtpo.scenario.shipped).  A name that matches nothing is one line naming the closest; a folder is one line.
The slow test builds the wheel, installs it in a fresh venv (not editable) and runs a scenario by name there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from rtpo.commands import cli
from rtpo.scenario.load import ConfigError, default_scenario_text, load_scenario
from rtpo.scenario.shipped import scenario_file, shipped

ROOT = Path(__file__).resolve().parents[1]
REPO = sorted((ROOT / "scenarios").glob("*/*.yaml"))


def test_every_repository_scenario_is_shipped_under_its_name():
    found = {s.qualified: s for s in shipped()}
    assert sorted(found) == sorted(f"{p.parent.name}/{p.stem}" for p in REPO), "scenarios/ and the package differ"
    for p in REPO:
        s = found[f"{p.parent.name}/{p.stem}"]
        assert s.path.read_bytes() == p.read_bytes(), f"{s.path} is not {p}"
    names = [s.name for s in shipped()]
    assert len(names) == len(set(names)), f"two shipped scenarios share a name: {sorted(names)}"
    assert default_scenario_text() == (ROOT / "scenarios" / "tabular" / "default.yaml").read_text()


def test_names_paths_and_their_precedence(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the repository: its scenarios/ folder is not here
    region = next(s.path for s in shipped() if s.qualified == "tabular/region_chain")
    assert scenario_file("region_chain") == region
    assert scenario_file("tabular/region_chain") == region
    assert scenario_file("region_chain.yaml") == region
    assert scenario_file("scenarios/tabular/region_chain.yaml") == region  # the README's paths, from anywhere
    local = tmp_path / "region_chain"
    local.write_text("name: mine\n")
    assert scenario_file("region_chain") == Path("region_chain")  # a file that exists is itself
    assert load_scenario("math_short", ["budget.iterations=1"]).name == "math_short"


@pytest.mark.parametrize(
    "arg, closest", [("region_chian", "region_chain"), ("chain", "region_chain"), ("tiny-cpu-serch", "tiny-cpu-search")]
)
def test_a_name_that_matches_nothing_names_the_closest(arg, closest, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        load_scenario(arg)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{arg}: no such scenario file, nor a shipped scenario name")
    assert f"the closest shipped name is {closest!r}" in msg, msg


def test_a_folder_is_one_line(tmp_path, capsys):
    assert cli.main(["run", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err == f"rtpo: error: {tmp_path}: is a folder; give a scenario file (.yaml) or a shipped name (rtpo scenarios)"
    )


def test_rtpo_scenarios_prints_name_and_file(capsys):
    assert cli.main(["scenarios"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[0] == "default", "the embedded default comes first"
    rows = {line.split()[0]: Path(line.split()[1]) for line in lines}
    assert set(rows) == {s.name for s in shipped()}
    assert all(path.is_file() and path.stem == name for name, path in rows.items()), rows


def test_commands_and_the_api_take_a_name(tmp_path, monkeypatch, capsys):
    import rtpo
    from rtpo.compare.jobs import _scenario_data

    monkeypatch.chdir(tmp_path)
    assert cli.main(["config", "show", "region_chain"]) == 0
    assert "name: region_chain" in capsys.readouterr().out
    assert (
        cli.main(["run", "region_chain", "budget.iterations=1", "--out", str(tmp_path / "runs"), "--no-progress"]) == 0
    )
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("region_chain-") and (run_dir / "metrics.jsonl").stat().st_size > 0
    data, stem = _scenario_data("math_short")  # rtpo compare NAME
    assert stem == "math_short" and data["name"] == "math_short"
    result = rtpo.train("math_short", budget__iterations=1)
    assert result.config.name == "math_short" and result.run_dir is None


def _outer_site_packages() -> str:
    return sysconfig.get_paths()["purelib"]


@pytest.mark.slow
def test_an_installed_wheel_runs_a_scenario_by_name(tmp_path):
    """pip wheel (offline, no build isolation) -> a fresh venv with the wheel alone (--no-deps; its
    dependencies come from this environment through a .pth appended after the venv's own site-packages)
    -> `rtpo scenarios` and `rtpo run region_chain` there, from a folder without the repository."""
    pytest.importorskip("setuptools", reason="building the wheel offline needs setuptools (the dev extra)")
    src = tmp_path / "src"
    shutil.copytree(ROOT / "rtpo", src / "rtpo", symlinks=False, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = dict(capture_output=True, text=True, env=env, timeout=600)
    dist = tmp_path / "dist"
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(src)],
        **run,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    (wheel,) = dist.glob("rtpo-*.whl")
    venv = tmp_path / "venv"
    out = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], **run)
    assert out.returncode == 0, out.stderr
    py = venv / "bin" / "python"
    out = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        **run,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], **run)
    (Path(site.stdout.strip()) / "outer-env.pth").write_text(_outer_site_packages() + "\n")
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = subprocess.run([str(py), "-c", "import rtpo; print(rtpo.__file__)"], cwd=work, **run)
    assert where.stdout.strip().startswith(str(venv)), f"rtpo imported from {where.stdout} {where.stderr}"
    listed = subprocess.run([str(venv / "bin" / "rtpo"), "scenarios"], cwd=work, **run)
    assert listed.returncode == 0, listed.stderr
    region = [line for line in listed.stdout.splitlines() if line.split()[0] == "region_chain"]
    assert region and region[0].split()[1].startswith(str(venv)), listed.stdout
    ran = subprocess.run(
        [str(venv / "bin" / "rtpo"), "run", "region_chain", "budget.iterations=2", "--out", "runs", "--no-progress"],
        cwd=work,
        **run,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    (run_dir,) = (work / "runs").iterdir()
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert run_dir.name.startswith("region_chain-") and len(lines) >= 2, ran.stdout


def test_readme_names_every_tabular_and_tiny_cpu_scenario():
    """A new user finds every scenario that runs on a laptop in README's list (issue 27: the list lacked
    several; tiny-cpu-mdp-region6 came later and was missing again).  `{a,b}` in README is expanded.
    Mutant: drop `tiny-cpu-mdp-region6` from README's list and this turns red."""
    import itertools
    import re

    text = (ROOT / "README.md").read_text()
    named = set()
    for word in re.findall(r"`([a-z0-9_{},.-]+)`", text):
        parts = re.split(r"\{([^}]*)\}", word)
        choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
        named |= {"".join(c) for c in itertools.product(*choices)}
    shipped = [p.stem for p in (ROOT / "scenarios" / "tabular").glob("*.yaml")]
    shipped += [p.stem for p in (ROOT / "scenarios" / "llm").glob("tiny-cpu*.yaml")]
    missing = sorted(set(shipped) - named)
    assert missing == [], f"README's scenario list does not name {missing}"
