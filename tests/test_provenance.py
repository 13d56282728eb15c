"""RUN/provenance.json: the command line, git commit and package versions of every process that ran a
run folder — the first `rtpo run`, each `--resume` after it, and a fork's source history."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from rtpo.commands.cli import main
from rtpo.rundir import checkpoint, provenance

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["budget.iterations=2", "budget.queries_per_iteration=4", "logging.plot=false", "logging.keep_last=null"]


def _entries(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / checkpoint.PROVENANCE).read_text())["invocations"]


@pytest.fixture
def run_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr(sys, "argv", ["rtpo", "run", *SMALL])
    assert main(["run", *SMALL, "--out", str(tmp_path / "runs"), "--no-progress"]) == 0
    (d,) = (tmp_path / "runs").iterdir()
    return d


def test_a_new_run_records_command_git_and_packages(run_dir):
    (entry,) = _entries(run_dir)
    assert entry["command"] == ["rtpo", "run", *SMALL] and entry["resumed"] is False
    assert entry["packages"]["numpy"] == metadata.version("numpy")
    assert entry["python"] == ".".join(map(str, sys.version_info[:3]))
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if shutil.which("git") is None or head.returncode != 0:
        assert entry["git"] is None
    else:
        assert entry["git"]["commit"] == head.stdout.strip() and isinstance(entry["git"]["dirty"], bool)


def test_resume_appends_and_a_fork_keeps_its_sources_history(run_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["rtpo", "run", "--resume", str(run_dir), "budget.iterations=3"])
    assert main(["run", "--resume", str(run_dir), "budget.iterations=3", "--no-progress"]) == 0
    first, second = _entries(run_dir)
    assert (first["resumed"], second["resumed"]) == (False, True)
    assert second["command"][-1] == "budget.iterations=3"
    monkeypatch.setattr(sys, "argv", ["rtpo", "fork"])
    assert main(["run", "--resume", str(run_dir), "--iter", "1", "--out", str(tmp_path / "f"), "--no-progress"]) == 0
    (fork,) = (tmp_path / "f").iterdir()
    assert _entries(fork)[:2] == [first, second] and _entries(fork)[2]["command"] == ["rtpo", "fork"]
    assert len(_entries(run_dir)) == 2  # the source run is left as it was


def test_git_state_outside_a_work_tree_is_none(tmp_path):
    assert provenance.git_state(tmp_path) is None
