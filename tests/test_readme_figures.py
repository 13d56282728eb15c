"""Every performance figure in README.md and docs/ is a link to the bench JSON it comes from, and says
what that JSON says (bench/figures.py; `python bench/figures.py --write` regenerates them)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_figures", ROOT / "bench" / "figures.py")
figures = importlib.util.module_from_spec(_spec)
sys.modules["bench_figures"] = figures  # dataclasses look their module up there
_spec.loader.exec_module(figures)


def test_readme_figures_match_their_json():
    found = figures.figures(ROOT)
    assert len(found) >= 10, "the README's benchmark figures are no longer links to their JSON"
    assert figures.check(ROOT) == []


def test_readme_quotes_no_stale_tabular_figures():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "9.1k sibling-turn samples/s" not in readme and "K = 8: 0.17 s" not in readme


def test_checker_flags_a_stale_figure_and_rewrites_it(tmp_path):
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "x.json").write_text(json.dumps({"rows": [{"n": 10, "t": 0.01234}], "r": 0.4763}))
    (tmp_path / "README.md").write_text(
        'solve [12.3 ms](bench/x.json "rows[n=10].t"), ratio [0.50×](bench/x.json "r"), '
        'share [47.6%](bench/x.json "r"), missing [1 s](bench/x.json "nope")\n'
    )
    bad = figures.check(tmp_path)
    assert len(bad) == 2 and "'0.50×'" in bad[0] and "'0.48×'" in bad[0] and "nope" in bad[1]
    (tmp_path / "README.md").write_text(
        (tmp_path / "README.md").read_text().replace(', missing [1 s](bench/x.json "nope")', "")
    )
    assert figures.write(tmp_path) == 1
    assert figures.check(tmp_path) == []
    assert "[0.48×]" in (tmp_path / "README.md").read_text()


def test_render_units():
    assert figures.render(163_000.4, "9.1k/s") == "163.0k/s"
    assert figures.render(0.0072, "0.17 ms") == "7.20 ms"
    assert figures.render(1234.5, "1,000") == "1,234"
    assert figures.render(9223, "9.2 kB") == "9.2 kB" and figures.render(1754749, "1.75 MB") == "1.75 MB"


def test_selector_matches_every_pair_and_values_may_hold_equals(tmp_path):
    (tmp_path / "docs" / "results" / "k").mkdir(parents=True)
    rows = [
        {"sweep": "3", "method": "rtpo:G=3", "v": {"mean": 0.5}},
        {"sweep": "10", "method": "rtpo:G=3", "v": {"mean": 0.25}},
        {"sweep": "10", "method": "grpo", "v": {"mean": 0.75}},
    ]
    (tmp_path / "docs" / "results" / "k" / "comparison.json").write_text(json.dumps({"rows": rows}))
    target = "docs/results/k/comparison.json"
    (tmp_path / "README.md").write_text(
        f'RTPO [0.250]({target} "rows[sweep=10&method=rtpo:G=3].v.mean") vs [0.75]({target} "rows[sweep=10].v.mean")\n'
    )
    bad = figures.check(tmp_path)
    # the first pair matches one row; a selector that matches two rows is reported, not guessed
    assert len(bad) == 1 and "2 elements with sweep=10" in bad[0]


def test_a_link_to_json_outside_the_committed_outputs_is_a_problem(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "x.json").write_text(json.dumps({"r": 1.0}))
    (tmp_path / "README.md").write_text('ratio [1.0×](runs/x.json "r")\n')
    bad = figures.check(tmp_path)
    assert len(bad) == 1 and "not committed output" in bad[0]


def test_readme_results_summary_quotes_only_linked_figures():
    """The Baselines summary's results (values, intervals, rates) are links into docs/results/*.json."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Baselines and the equal-budget comparison") : readme.index("## LLM backend")]
    bare = figures.LINK.sub("", section)
    assert not re.findall(r"(?<![\w.])0\.\d{2,}", bare), "a result in the README is not a link to its JSON"
    assert len(figures.LINK.findall(section)) >= 40


def _committed_intervals() -> set[tuple[float, float]]:
    found: set[tuple[float, float]] = set()

    def walk(x):
        if isinstance(x, dict):
            if isinstance(x.get("mean"), int | float) and isinstance(x.get("ci95"), int | float):
                found.add((x["mean"], x["ci95"]))
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    for f in sorted((ROOT / "docs" / "results").rglob("*.json")):
        walk(json.loads(f.read_text(encoding="utf-8")))
    return found


def test_results_doc_intervals_come_from_the_committed_comparisons():
    """Every `mean ± ci` that docs/results.md writes outside a figure link is a (mean, ci95) pair of some
    committed comparison JSON under docs/results/, to the decimals written — except figures the text
    itself marks as superseded (kept to explain an earlier, withdrawn result)."""
    pairs = _committed_intervals()
    text = figures.LINK.sub("", (ROOT / "docs" / "results.md").read_text(encoding="utf-8"))
    stale = []
    for para in text.split("\n\n"):
        if "superseded" in para or "Before main's 45d5a06" in para:
            continue
        for m in re.finditer(r"(-?\d+\.(\d+)) ± (\d+\.(\d+))", para):
            a, da, b, db = m.group(1), len(m.group(2)), m.group(3), len(m.group(4))
            if not any(f"{x:.{da}f}" == a and f"{y:.{db}f}" == b for x, y in pairs):
                stale.append(m.group(0))
    assert len(pairs) > 100 and stale == []
