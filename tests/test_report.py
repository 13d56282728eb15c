"""`rtpo report`: one self-contained HTML page of run folders (rtpo.rundir.report).

The page is checked as text (every section, no external reference, model and tool text escaped, turn
boundaries marked, several runs overlaid) and, where Chromium is installed, in the real browser: it loads
with no console message and the script ran (data-ready), and its screenshot shows the learning curve
(pixels of the curve's colour in the plot area).  Mutants: the same page with the curve drawn in the
background colour has no such pixels; a page that logs an error is caught by the console check.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from rtpo.commands import cli
from rtpo.rundir.report import COLORS, ReportError, write_report
from rtpo.rundir.runner import run_scenario
from rtpo.scenario.load import load_scenario

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


@pytest.fixture(scope="module")
def tabular_runs(tmp_path_factory):
    """Two real tabular runs (RTPO and GRPO, 4 iterations each) written by the runner."""
    root = tmp_path_factory.mktemp("runs")
    out = []
    for method in ("rtpo", "grpo"):
        cfg = load_scenario(None, ["budget.iterations=4", "logging.plot=false", f"method.name={method}"])
        out.append(run_scenario(cfg, out_root=root, progress=False).run_dir)
    return out


@pytest.fixture()
def llm_like_run(tmp_path, tabular_runs):
    """A run folder in the llm backend's layout: held-out eval/* keys and RUN/generations/iter_N.jsonl whose
    text tries to break out of the page (markup, a closing </pre>, a script)."""
    run = tmp_path / "tiny-cpu-rtpo-0-x"
    shutil.copytree(tabular_runs[0], run)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for i, m in enumerate(lines):
        for k in [k for k in m if k.startswith("eval/")]:
            del m[k]
        m["eval/pass@1"] = 0.1 * i
        m["eval/reward_mean"] = 0.05 * i
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    episode = {
        "iteration": 0,
        "query_id": 3,
        "question": "Compute 2+2 <b>bold</b>",
        "gold": "4",
        "turns": [
            {"role": "assistant", "text": "<script>window.pwned=1</script> let me call python"},
            {"role": "tool", "text": "</pre></td></tr></table><h1>injected</h1>"},
            {"role": "assistant", "text": "\\boxed{4}"},
        ],
        "answer": "4",
        "reward": 1.0,
    }
    (run / "generations").mkdir()
    (run / "generations" / "iter_0.jsonl").write_text(json.dumps(episode) + "\n" + '{"torn line')
    return run


def _curve_polylines(page: str, color: str) -> int:
    return len(re.findall(rf'<polyline [^>]*stroke="{color}"', page))


def test_one_run_page_has_every_section_and_nothing_external(tabular_runs):
    path = write_report([tabular_runs[0]])
    assert path == tabular_runs[0] / "report.html"
    page = path.read_text()
    for section in ("learning", "turns", "trunks", "consistency", "timing", "summary", "config", "provenance"):
        assert f'<section id="{section}">' in page, f"section {section} missing"
    v_star = json.loads((tabular_runs[0] / "summary.json").read_text())["optimum"]
    assert f"V* = {v_star:.4g}" in page, "the learning curve's V* line is missing"
    assert "adv/value_std_across_boundaries" in page and "turn 0" in page and "consistency/rollout_train_ratio" in page
    # self-contained: no external fetch of any kind (the SVG namespace is a name, not a fetch)
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:|//)", page) and "<link" not in page
    assert "@import" not in page and "url(" not in page
    assert re.sub(r"http://www\.w3\.org/2000/svg", "", page).count("http") == 0
    assert page.count("<script>") == 1


def test_llm_generations_are_escaped_and_turns_marked(llm_like_run):
    page = write_report([llm_like_run]).read_text()
    assert "held-out eval/pass@1" in page and "held-out eval/reward_mean" in page, "llm curves are the eval/* keys"
    assert "V*" not in page.split('<section id="turns">')[0], "no optimum line without an exact optimum"
    assert "<h1>injected</h1>" not in page and "<script>window.pwned" not in page, "run-folder text became markup"
    assert "&lt;script&gt;window.pwned=1&lt;/script&gt;" in page and "&lt;h1&gt;injected&lt;/h1&gt;" in page
    assert page.count("<script>") == 1 and "<b>bold</b>" not in page
    marks = re.findall(r'<div class="turnmark">(turn \d+ · \w+)</div>', page)
    assert marks == ["turn 1 · assistant", "turn 1 · tool", "turn 2 · assistant"], marks
    assert "iteration 0 (1 episodes)" in page, "the torn last line is left out, the episode kept"


def test_several_runs_on_one_page(tabular_runs, tmp_path):
    out = tmp_path / "cmp.html"
    assert cli.main(["report", *map(str, tabular_runs), "--out", str(out)]) == 0
    page = out.read_text()
    learning = page.split('<section id="learning">')[1].split("</section>")[0]
    assert _curve_polylines(learning, COLORS[0]) == 1 and _curve_polylines(learning, COLORS[1]) == 1
    for run in tabular_runs:
        assert run.name in page
    # GRPO's phases train every turn at once (phase/turn = -1): named so, not "turn -1"
    # (mutant: the label f"turn {turn}" for every phase)
    turns = page.split('<section id="turns">')[1].split("</section>")[0]
    assert "turn -1" not in turns, "a flat method's phase is labelled as a turn that does not exist"
    assert f"{tabular_runs[1].name} · all turns (flat)" in turns and "<td>all turns (flat)</td>" in turns


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["report", "NOWHERE"], "NOWHERE: not a run folder (no such folder)"),
        (["report", "."], ".: not a run folder (needs config.yaml and metrics.jsonl)"),
    ],
)
def test_bad_input_is_one_line_exit_2(argv, expected, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.strip() == f"rtpo: error: {expected}"


def test_several_runs_need_out_and_out_must_be_html(tabular_runs, tmp_path):
    with pytest.raises(ReportError, match="several runs need --out"):
        write_report(tabular_runs)
    with pytest.raises(ReportError, match="must end in .html"):
        write_report(tabular_runs[:1], tmp_path / "x.png")


def _chromium(args: list[str], page: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0", *args,
         page.resolve().as_uri()],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip


def _console(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def _curve_pixels(png: Path, color: str) -> int:
    from PIL import Image

    img = np.asarray(Image.open(png).convert("RGB"), dtype=np.int16)
    rgb = np.array([int(color[i : i + 2], 16) for i in (1, 3, 5)], dtype=np.int16)
    return int((np.abs(img - rgb).sum(axis=2) < 40).sum())


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed (apt-get install chromium; .ci/run does)")
def test_the_page_in_a_real_browser(tabular_runs, tmp_path):
    page = write_report([tabular_runs[0]], tmp_path / "report.html")
    dom = _chromium(["--dump-dom"], page)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert _console(dom.stderr) == [], _console(dom.stderr)
    assert 'data-ready="1"' in dom.stdout, "the page's script did not run to its end"
    shot = tmp_path / "shot.png"
    out = _chromium(["--window-size=1300,900", f"--screenshot={shot}"], page)
    assert out.returncode == 0 and shot.is_file(), out.stderr[-2000:]
    assert _console(out.stderr) == [], _console(out.stderr)
    # the learning curve is the first chart: its colour fills a line across the plot area
    assert _curve_pixels(shot, COLORS[0]) > 300, "no learning curve in the screenshot"
    # mutant: the same page with the curve drawn in the plot's background colour shows none of it
    hidden = tmp_path / "hidden.html"
    hidden.write_text(page.read_text().replace(COLORS[0], "#fafafa"))
    _chromium(["--window-size=1300,900", f"--screenshot={tmp_path / 'hidden.png'}"], hidden)
    assert _curve_pixels(tmp_path / "hidden.png", COLORS[0]) < 20
    # and the console check catches a page that logs an error
    bad = tmp_path / "bad.html"
    bad.write_text(page.read_text().replace("<script>", "<script>console.error('broken');", 1))
    assert any("broken" in line for line in _console(_chromium(["--dump-dom"], bad).stderr))
