"""`rtpo plot` over run folders written earlier: one curve per scenario+method (mean, band over seeds),
readable labels, vector output; bad input is one line."""

from __future__ import annotations

import pytest

from rtpo.commands.cli import main
from rtpo.rundir.runner import run_scenario
from rtpo.scenario.load import load_scenario

SMALL = ["budget.iterations=2", "budget.queries_per_iteration=8", "logging.plot=false"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("plotruns")
    return [
        run_scenario(load_scenario(None, [*SMALL, f"seed={s}", *m]), out_root=root, progress=False).run_dir
        for s in (0, 1)
        for m in ([], ["name=other", "method.G=4"])
    ]


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_plot_of_existing_runs(runs, tmp_path, suffix, capsys):
    out = tmp_path / f"c{suffix}"
    assert main(["plot", *map(str, runs), "--out", str(out)]) == 0
    assert out.stat().st_size > 1000
    if suffix == ".svg":
        text = out.read_text()
        assert "policy value" in text and "rollouts spent" in text  # readable labels, not raw keys
        assert "default rtpo (n=2)" in text and "other rtpo (n=2)" in text


def test_bad_plot_input_is_one_line(runs, tmp_path, capsys):
    assert main(["plot", str(tmp_path), "--out", str(tmp_path / "x.png")]) == 2
    assert main(["plot", str(runs[0]), "--metric", "no/such", "--out", str(tmp_path / "x.png")]) == 2
    assert main(["plot", str(runs[0]), "--out", str(tmp_path / "x.jpg")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("rtpo: error: ") for line in err)
