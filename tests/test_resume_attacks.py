"""Attack class "resume never loses what exists": foreign, missing, corrupt and truncated checkpoints.

Each is refused with one line and exit 2 before anything in the run folder is touched; a run folder's
files are compared byte for byte before and after the refused resume.
"""

from __future__ import annotations

import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rtpo.commands.cli import main
from rtpo.rundir.checkpoint import CHECKPOINT_ID, METRICS, fingerprint, latest_path, read_checkpoint
from rtpo.rundir.runner import run_scenario
from rtpo.scenario.load import ConfigError, load_scenario

SMALL = ["budget.iterations=2", "budget.queries_per_iteration=4", "logging.plot=false"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two finished runs of the same shapes (seeds 0 and 1) and a half-done copy of the first."""
    root = tmp_path_factory.mktemp("runs")
    a = run_scenario(load_scenario(None, SMALL), out_root=root / "a", progress=False).run_dir
    b = run_scenario(load_scenario(None, [*SMALL, "seed=1"]), out_root=root / "b", progress=False).run_dir
    return a, b


def _files(run_dir):
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def _refused(run_dir, capsys, match):
    before = _files(run_dir)
    assert main(["run", "--resume", str(run_dir), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err, err
    assert _files(run_dir) == before  # nothing touched


def test_a_foreign_checkpoint_is_refused(runs, tmp_path, capsys):
    a, b = runs
    victim = tmp_path / a.name
    shutil.copytree(a, victim)
    shutil.copy(latest_path(b), latest_path(victim))  # same shapes, another run
    _refused(victim, capsys, "belongs to another run")


def test_fingerprint_names_the_run_not_its_budget():
    cfg = load_scenario(None, SMALL)
    assert fingerprint(cfg) == fingerprint(load_scenario(None, [*SMALL, "budget.iterations=9", "logging.plot=true"]))
    for other in (["seed=1"], ["method.G=4"], ["task.p_advance=0.7"], ["train.lr=0.2"]):
        assert fingerprint(load_scenario(None, [*SMALL, *other])) != fingerprint(cfg)


def test_a_deleted_checkpoint_is_refused_not_restarted(runs, tmp_path, capsys):
    a, _ = runs
    victim = tmp_path / a.name
    shutil.copytree(a, victim)
    latest_path(victim).unlink()
    assert (victim / CHECKPOINT_ID).exists() and (victim / METRICS).read_text()
    _refused(victim, capsys, "is missing but the run wrote one")


@pytest.mark.parametrize(
    "mangle,match",
    [
        (lambda b: b[: len(b) // 2], "truncated or altered"),
        (lambda b: b[:-1], "truncated or altered"),
        (lambda b: b[:10], "not an rtpo checkpoint"),
        (lambda b: b"", "not an rtpo checkpoint"),
        (lambda b: b[:-5] + bytes([b[-5] ^ 1]) + b[-4:], "corrupt checkpoint"),
        (lambda b: b.replace(b'"bytes": ', b'"bytes": 1', 1), "truncated or altered"),
        (lambda b: b.split(b"\n", 1)[0] + b"\nnot json\n" + b.split(b"\n", 2)[2], "corrupt checkpoint header"),
        (lambda b: b"\x80\x04K\x01." + b, "not an rtpo checkpoint"),  # a bare pickle
    ],
)
def test_corrupt_checkpoints_are_one_line_and_touch_nothing(runs, tmp_path, capsys, mangle, match):
    a, _ = runs
    victim = tmp_path / a.name
    shutil.copytree(a, victim)
    latest_path(victim).write_bytes(mangle(latest_path(a).read_bytes()))
    _refused(victim, capsys, match)


@given(st.binary(max_size=512), st.integers(0, 4096))
@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_bytes_are_a_config_error_never_another_exception(runs, tmp_path, junk, cut):
    a, _ = runs
    good = latest_path(a).read_bytes()
    for blob in {junk, good[:cut] + junk, junk + good} - {good}:
        path = tmp_path / "c.pkl"
        path.write_bytes(blob)
        with pytest.raises(ConfigError):
            read_checkpoint(path)


def test_an_intact_checkpoint_resumes_and_extending_the_budget_is_not_foreign(runs, tmp_path):
    a, _ = runs
    victim = tmp_path / a.name
    shutil.copytree(a, victim)
    assert main(["run", "--resume", str(victim), "--no-progress"]) == 0  # a finished run: nothing to do
    assert read_checkpoint(latest_path(victim), load_scenario(victim / "config.yaml"))["progress"]["metric_lines"] > 0


def test_out_naming_a_file_is_one_line(tmp_path, capsys):
    f = tmp_path / "a_file"
    f.write_text("x")
    assert main(["run", "--out", str(f), "--no-progress", *SMALL]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "exists and is not a folder" in err
    assert f.read_text() == "x"
