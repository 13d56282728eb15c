"""`rtpo report RUN [RUN ...]`: one self-contained HTML page to look at run folders with.

    rtpo report RUN                      writes RUN/report.html
    rtpo report RUN_A RUN_B ... --out F  one page comparing the runs (each chart overlays them)

The page holds everything inline (SVG charts drawn here, one small script for the generations filter, no
server, no network, nothing fetched): the learning curve against V* (tabular: `eval/value` and the exact
optimum `eval/v_star`) or the held-out metrics (llm: every `eval/*` key) over rollouts spent; per-turn
advantage statistics across phases (`adv/zero_rate`, `adv/abs_mean`, `adv/value_std_across_boundaries`
— the spread of the sibling values across boundaries — per `phase/turn`); trunk outcomes (`trunk/*`);
the rollout/train ratio (`consistency/rollout_train_ratio`); the time per phase (`time/*`); the summary,
the resolved config and provenance.json; and, for llm runs, RUN/generations/iter_N.jsonl as a table, each
turn of an episode marked.  Text from the run folder (model output, tool output, config values) is
escaped: it is shown, never interpreted as markup.

Reads only the run folder's files (rtpo.rundir.checkpoint's names); imports no backend.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rtpo.rundir.checkpoint import (
    CONFIG,
    GENERATIONS_DIR,
    METRICS,
    PROVENANCE,
    SUMMARY_JSON,
    read_metrics,
)

REPORT = "report.html"
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
TURN_KEYS = ("adv/zero_rate", "adv/zero_rollout_share", "adv/abs_mean", "adv/value_std_across_boundaries")
MAX_TURN_CHARS = 4000  # one turn's text in the generations table; the rest is cut with a note
MAX_EPISODES = 64  # per iteration file


class ReportError(ValueError):
    """A path that is not a run folder, or a run folder whose files cannot be read: one line."""


@dataclass
class Run:
    """What the report reads from one run folder."""

    path: Path
    label: str
    metrics: list[dict]
    config_text: str
    summary: dict | None = None
    provenance: dict | None = None
    generations: dict[int, list[dict]] = field(default_factory=dict)


def load_run(path: str | Path) -> Run:
    p = Path(path)
    if not p.is_dir():
        raise ReportError(f"{path}: not a run folder (no such folder)")
    if not (p / CONFIG).is_file() or not (p / METRICS).is_file():
        raise ReportError(f"{path}: not a run folder (needs {CONFIG} and {METRICS})")
    try:
        metrics = read_metrics(p)
        config_text = (p / CONFIG).read_text(errors="replace")
    except OSError as e:
        raise ReportError(f"{path}: cannot read: {e}") from None
    if not all(isinstance(m, dict) for m in metrics):
        raise ReportError(f"{path}/{METRICS}: a line is not a JSON object")
    gens: dict[int, list[dict]] = {}
    for f in sorted((p / GENERATIONS_DIR).glob("iter_*.jsonl")):
        m = re.fullmatch(r"iter_(\d+)\.jsonl", f.name)
        if m is None:
            continue
        episodes = []
        for line in f.read_text(errors="replace").splitlines()[:MAX_EPISODES]:
            try:
                e = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn line (a killed run) is left out, not fatal
            if isinstance(e, dict):
                episodes.append(e)
        gens[int(m.group(1))] = episodes
    return Run(p, p.name, metrics, config_text, _json(p / SUMMARY_JSON), _json(p / PROVENANCE), gens)


def _json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


# -- numbers ------------------------------------------------------------------------------------------
def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def _series(metrics: list[dict], key: str, x_key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for i, m in enumerate(metrics):
        y = _num(m.get(key))
        x = _num(m.get(x_key)) if x_key else float(i + 1)
        if y is not None and x is not None:
            xs.append(x)
            ys.append(y)
    return xs, ys


def _last(metrics: list[dict], key: str) -> float | None:
    for m in reversed(metrics):
        v = _num(m.get(key))
        if v is not None:
            return v
    return None


def _keys(runs: list[Run], prefix: str) -> list[str]:
    keys: dict[str, None] = {}
    for r in runs:
        for m in r.metrics:
            for k, v in m.items():
                if k.startswith(prefix) and _num(v) is not None:
                    keys.setdefault(k, None)
    return list(keys)


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About n round tick values covering [lo, hi]."""
    span = hi - lo
    step = 10 ** math.floor(math.log10(span / n))
    for mult in (1, 2, 2.5, 5, 10):
        if span / (step * mult) <= n:
            step *= mult
            break
    first = math.ceil(lo / step)
    return [k * step for k in range(first, math.floor(hi / step + 1e-9) + 1)]


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e5 or a < 1e-3:
        return f"{v:.2e}"
    return f"{v:.4g}"


def _tick_labels(ticks: list[float]) -> list[str]:
    """Labels with as many digits as the step needs (1.00000001 next to 1.00000002, not 1 next to 1)."""
    if len(ticks) < 2:
        return [_fmt(t) for t in ticks]
    step = abs(ticks[1] - ticks[0])
    big = max(abs(t) for t in ticks)
    if big == 0 or step == 0:
        return [_fmt(t) for t in ticks]
    if big < 1e-3 or big >= 1e5:
        return [f"{t:.2e}" if t else "0" for t in ticks]
    digits = min(12, max(1, math.ceil(math.log10(big / step)) + 1, math.floor(math.log10(big)) + 1))
    return [f"{t:.{digits}g}" if abs(t) > step * 1e-6 else "0" for t in ticks]


# -- SVG ----------------------------------------------------------------------------------------------
def svg_chart(
    title: str,
    series: list[tuple[str, str, list[float], list[float]]],
    x_label: str,
    references: list[tuple[str, float]] = (),
    width: int = 580,
    height: int = 280,
) -> str:
    """A line chart as inline SVG: series are (label, color, xs, ys); references are labelled dashed
    horizontal lines (V*, ratio 1)."""
    left, right, top, bottom = 84, 16, 28, 44
    xs_all = [x for _, _, xs, _ in series for x in xs]
    ys_all = [y for _, _, _, ys in series for y in ys] + [y for _, y in references]
    if not xs_all:
        return ""
    x0, x1 = min(xs_all), max(xs_all)
    y0, y1 = min(ys_all), max(ys_all)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        pad = abs(y0) * 0.1 or 1.0
        y0, y1 = y0 - pad, y1 + pad
    else:
        pad = (y1 - y0) * 0.05
        y0, y1 = y0 - pad, y1 + pad
    pw, ph = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + (1 - (y - y0) / (y1 - y0)) * ph

    e = html.escape
    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{e(title)}">',
        f'<text x="{left}" y="17" class="ctitle">{e(title)}</text>',
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" class="plot"/>',
    ]
    yt = _ticks(y0, y1)
    for t, lab in zip(yt, _tick_labels(yt), strict=True):
        y = sy(t)
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" class="ytick">{lab}</text>')
    xt = _ticks(x0, x1)
    for t, lab in zip(xt, _tick_labels(xt), strict=True):
        x = sx(t)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + ph}" class="grid"/>')
        parts.append(f'<text x="{x:.1f}" y="{top + ph + 16}" class="xtick">{lab}</text>')
    parts.append(f'<text x="{left + pw / 2}" y="{height - 6}" class="xlabel">{e(x_label)}</text>')
    for label, y in references:
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" class="ref"/>')
        parts.append(f'<text x="{left + pw - 4}" y="{sy(y) - 4:.1f}" class="reflabel">{e(label)} = {_fmt(y)}</text>')
    for label, color, xs, ys in series:
        pts = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(xs, ys, strict=True))
        parts.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2.5" class="curve">')
        parts.append(f"<title>{e(label)}</title></polyline>")
        if len(xs) <= 60:
            for x, y in zip(xs, ys, strict=True):
                parts.append(
                    f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{color}">'
                    f"<title>{e(label)}: {_fmt(x)}, {_fmt(y)}</title></circle>"
                )
    ly = top + 8
    if series:  # the legend on a light box, so a reference line under it stays readable
        box_w = 30 + 6.2 * max(len(s[0]) for s in series)
        parts.append(
            f'<rect x="{left + 4}" y="{ly - 4}" width="{min(box_w, pw - 8):.0f}" height="{14 * len(series) + 4}" '
            'class="legendbox"/>'
        )
    for label, color, _, _ in series:
        parts.append(f'<rect x="{left + 8}" y="{ly}" width="12" height="4" fill="{color}"/>')
        parts.append(f'<text x="{left + 25}" y="{ly + 6}" class="legend">{e(label)}</text>')
        ly += 14
    parts.append("</svg>")
    return "".join(parts)


# -- sections -----------------------------------------------------------------------------------------
def _color(i: int) -> str:
    return COLORS[i % len(COLORS)]


def _learning_curves(runs: list[Run]) -> str:
    x_key = "budget/rollouts"
    out = []
    if any(_last(r.metrics, "eval/v_star") is not None for r in runs):  # tabular: the exact optimum is known
        series = [(r.label, _color(i), *_series(r.metrics, "eval/value", x_key)) for i, r in enumerate(runs)]
        refs = []
        v_star = {v for r in runs if (v := _last(r.metrics, "eval/v_star")) is not None}
        v_psi = {v for r in runs if (v := _last(r.metrics, "eval/v_star_psi")) is not None}
        if len(v_star) == 1:
            refs.append(("V*", v_star.pop()))
        if len(v_psi) == 1 and not any(abs(v - y) < 1e-12 for v in v_psi for _, y in refs):
            refs.append(("V*_psi", v_psi.pop()))
        if len(runs) > 1 and not refs:  # different tasks: each run's optimum as its own line
            refs = [(f"V* {r.label}", v) for r in runs if (v := _last(r.metrics, "eval/v_star")) is not None]
        out.append(svg_chart("policy value eval/value vs V* (exact optimum)", series, x_key, refs))
    else:
        keys = [k for k in _keys(runs, "eval/") if not k.endswith("_s")]
        for key in keys[:8]:
            series = [(r.label, _color(i), *_series(r.metrics, key, x_key)) for i, r in enumerate(runs)]
            out.append(svg_chart(f"held-out {key}", series, x_key))
    if not out:
        series = [(r.label, _color(i), *_series(r.metrics, "return/mean", x_key)) for i, r in enumerate(runs)]
        out.append(svg_chart("return/mean (no evaluation metric in these runs)", series, x_key))
    return _section("learning", "Learning curve", "".join(out))


def _turn_label(turn: int) -> str:
    """A phase's `phase/turn`: k for a reverse-turn phase, -1 for a flat method's phase (GRPO and the like
    train every turn at once)."""
    return f"turn {turn}" if turn >= 0 else "all turns (flat)"


def _per_turn(runs: list[Run]) -> str:
    charts, tables = [], []
    keys = [k for k in TURN_KEYS if _keys(runs, k)] + [k for k in _keys(runs, "sibling/")]
    for key in keys:
        series = []
        for i, r in enumerate(runs):
            by_turn: dict[int, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
            for m in r.metrics:
                turn, y, x = _num(m.get("phase/turn")), _num(m.get(key)), _num(m.get("global_phase"))
                if turn is not None and y is not None and x is not None:
                    by_turn[int(turn)][0].append(x)
                    by_turn[int(turn)][1].append(y)
            for j, (turn, (xs, ys)) in enumerate(sorted(by_turn.items())):
                label = _turn_label(turn) if len(runs) == 1 else f"{r.label} · {_turn_label(turn)}"
                series.append((label, _color(i * 4 + j), xs, ys))
        if series:
            charts.append(svg_chart(f"{key} per phase, by turn", series, "global_phase"))
    for r in runs:
        rows: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for m in r.metrics:
            turn = _num(m.get("phase/turn"))
            if turn is None:
                continue
            for key in [*keys, "phase/boundaries"]:
                v = _num(m.get(key))
                if v is not None:
                    rows[int(turn)][key].append(v)
        if rows:
            cols = [k for k in [*keys, "phase/boundaries"] if any(rows[t].get(k) for t in rows)]
            body = [
                [_turn_label(t), str(max(len(v) for v in rows[t].values()))]
                + [_fmt(sum(rows[t][k]) / len(rows[t][k])) if rows[t].get(k) else "" for k in cols]
                for t in sorted(rows)
            ]
            tables.append(_table(f"{r.label}: means over phases", ["turn", "phases", *cols], body))
    if not charts and not tables:
        return ""
    return _section("turns", "Per-turn advantage and sibling-value statistics", "".join(charts + tables))


def _trunks(runs: list[Run]) -> str:
    charts = []
    for key in ("trunk/success_rate", "trunk/return_mean", "trunk/malformed_rate", "trunk/turns_mean"):
        series = [(r.label, _color(i), *_series(r.metrics, key, "iteration")) for i, r in enumerate(runs)]
        series = [s for s in series if s[2]]
        if series:
            charts.append(svg_chart(key, series, "iteration"))
    tables = []
    for r in runs:
        fail = sorted(k for k in _keys([r], "trunk/fail_turn_"))
        if fail:
            vals = [[_fmt(v) if (v := _last(r.metrics, k)) is not None else "" for k in fail]]
            tables.append(_table(f"{r.label}: where the last iteration's trunks failed", fail, vals))
    if not charts:
        return ""
    return _section("trunks", "Trunk outcomes", "".join(charts + tables))


def _consistency(runs: list[Run]) -> str:
    charts = []
    for key, refs in (("consistency/rollout_train_ratio", [("1", 1.0)]), ("consistency/kl_rollout_train", [])):
        series = [(r.label, _color(i), *_series(r.metrics, key, "global_phase")) for i, r in enumerate(runs)]
        series = [s for s in series if s[2]]
        if series:
            charts.append(svg_chart(key, series, "global_phase", refs))
    if not charts:
        return ""
    return _section("consistency", "Rollout/train ratio", "".join(charts))


def _timing(runs: list[Run]) -> str:
    charts, tables = [], []
    series = [(r.label, _color(i), *_series(r.metrics, "time/phase_s", "global_phase")) for i, r in enumerate(runs)]
    series = [s for s in series if s[2]]
    if series:
        charts.append(svg_chart("time/phase_s: seconds per phase", series, "global_phase"))
    for r in runs:
        keys = [k for k in _keys([r], "time/") if k != "time/elapsed_s"]
        rows = []
        for k in keys:
            vals = [v for m in r.metrics if (v := _num(m.get(k))) is not None]
            rows.append([k, str(len(vals)), _fmt(sum(vals) / len(vals)), _fmt(sum(vals))])
        if rows:
            elapsed = _last(r.metrics, "time/elapsed_s")
            title = f"{r.label}: seconds" + (f" (elapsed {_fmt(elapsed)} s)" if elapsed is not None else "")
            tables.append(_table(title, ["key", "phases", "mean", "total"], rows))
    if not charts and not tables:
        return ""
    return _section("timing", "Time per phase", "".join(charts + tables))


def _summary(runs: list[Run]) -> str:
    tables = []
    for r in runs:
        if r.summary:
            rows = [[k, _cell(v)] for k, v in r.summary.items()]
            tables.append(_table(f"{r.label}: summary.json", ["key", "value"], rows))
    return _section("summary", "Summary", "".join(tables)) if tables else ""


def _cell(v: Any) -> str:
    n = _num(v)
    return _fmt(n) if n is not None and not isinstance(v, int) else str(v)


def _config(runs: list[Run]) -> str:
    e = html.escape
    blocks = [
        f"<details{' open' if len(runs) == 1 else ''}><summary>{e(r.label)}: config.yaml</summary>"
        f"<pre>{e(r.config_text)}</pre></details>"
        for r in runs
    ]
    return _section("config", "Config (the resolved scenario)", "".join(blocks))


def _provenance(runs: list[Run]) -> str:
    e = html.escape
    blocks = []
    for r in runs:
        inv = (r.provenance or {}).get("invocations")
        if not isinstance(inv, list):
            continue
        rows = []
        for i in inv:
            if not isinstance(i, dict):
                continue
            git = i.get("git") if isinstance(i.get("git"), dict) else None
            rows.append(
                [
                    " ".join(str(c) for c in i.get("command", [])),
                    str(i.get("started", "")),
                    "yes" if i.get("resumed") else "",
                    f"{git.get('commit', '')[:12]}{' (dirty)' if git.get('dirty') else ''}" if git else "",
                    str(i.get("python", "")),
                    str(i.get("platform", "")),
                ]
            )
        blocks.append(
            _table(f"{r.label}: provenance.json", ["command", "started", "resumed", "git", "python", "platform"], rows)
        )
        pk = inv[-1].get("packages") if inv and isinstance(inv[-1], dict) else None
        if isinstance(pk, dict):
            blocks.append(
                f"<details><summary>{e(r.label)}: package versions</summary>"
                + _table("", ["package", "version"], [[str(k), str(v)] for k, v in pk.items()])
                + "</details>"
            )
    return _section("provenance", "Provenance", "".join(blocks)) if blocks else ""


def _generations(runs: list[Run]) -> str:
    e = html.escape
    blocks = []
    for r in runs:
        for it, episodes in sorted(r.generations.items()):
            rows = []
            for ep in episodes:
                turns_html, turn = [], 0
                for t in ep.get("turns", []) if isinstance(ep.get("turns"), list) else []:
                    if not isinstance(t, dict):
                        continue
                    role = str(t.get("role", "?"))
                    if role == "assistant":
                        turn += 1
                    text = str(t.get("text", ""))
                    cut = ""
                    if len(text) > MAX_TURN_CHARS:
                        cut = f'<span class="cut">[{len(text) - MAX_TURN_CHARS} more characters]</span>'
                        text = text[:MAX_TURN_CHARS]
                    cls = "assistant" if role == "assistant" else "tool"
                    turns_html.append(
                        f'<div class="turn {cls}"><div class="turnmark">turn {turn} · {e(role)}</div>'
                        f"<pre>{e(text)}</pre>{cut}</div>"
                    )
                rows.append(
                    "<tr>"
                    + "".join(
                        f"<td>{e(str(ep.get(k, '')))}</td>"
                        if not isinstance(ep.get(k), str)
                        else f"<td><pre>{e(ep[k])}</pre></td>"
                        for k in ("query_id", "question", "gold", "answer", "reward")
                    )
                    + f"<td>{turn}</td><td>{''.join(turns_html)}</td></tr>"
                )
            head = "".join(
                f"<th>{h}</th>" for h in ("query", "question", "gold", "answer", "reward", "turns", "episode")
            )
            blocks.append(
                f"<details><summary>{e(r.label)}: iteration {it} ({len(episodes)} episodes)</summary>"
                f'<table class="gens"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></details>'
            )
    if not blocks:
        return ""
    search = '<p><input id="genfilter" type="search" placeholder="filter episodes by text" size="40"></p>'
    return _section("generations", "Generations", search + "".join(blocks))


def _table(title: str, head: list[str], rows: list[list[str]]) -> str:
    e = html.escape
    cap = f"<caption>{e(title)}</caption>" if title else ""
    th = "".join(f"<th>{e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table>{cap}<thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{anchor}"><h2>{html.escape(title)}</h2>{body}</section>'


CSS = """
body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0 24px 40px;color:#222;background:#fff}
h1{font-size:20px;margin:16px 0 4px} h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #ddd}
nav a{margin-right:12px} .runs span{display:inline-block;margin-right:16px}
.runs i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px}
svg.chart{margin:4px 12px 12px 0;vertical-align:top} .plot{fill:#fafafa;stroke:#bbb}
.grid{stroke:#e6e6e6} .ref{stroke:#555;stroke-dasharray:6 4;stroke-width:1.5}
.ctitle{font-weight:600;font-size:13px} .xtick,.xlabel{font-size:11px;text-anchor:middle}
.ytick{font-size:11px;text-anchor:end} .reflabel{font-size:11px;text-anchor:end;fill:#444}
.legend{font-size:11px} .legendbox{fill:#fff;fill-opacity:.85;stroke:#ddd} table{border-collapse:collapse;margin:8px 0 16px} caption{text-align:left;font-weight:600}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top} th{background:#f3f3f3}
pre{margin:0;white-space:pre-wrap;word-break:break-word;max-width:900px;font-size:12px}
.turn{border-left:4px solid #1f77b4;margin:4px 0;padding:2px 6px} .turn.tool{border-color:#2ca02c;background:#f6fbf6}
.turnmark{font-size:11px;color:#666;border-top:1px dashed #aaa} .cut{color:#a00;font-size:11px}
"""

SCRIPT = """
(function () {
  var box = document.getElementById("genfilter");
  if (box) {
    box.addEventListener("input", function () {
      var q = box.value.toLowerCase();
      var rows = document.querySelectorAll("table.gens tbody tr");
      for (var i = 0; i < rows.length; i++) {
        rows[i].style.display = rows[i].textContent.toLowerCase().indexOf(q) >= 0 ? "" : "none";
      }
    });
  }
  document.body.setAttribute("data-ready", "1");
})();
"""


def render(runs: list[Run]) -> str:
    """The whole page for these runs (one run, or several overlaid)."""
    e = html.escape
    title = "rtpo report: " + ", ".join(r.label for r in runs)
    legend = "".join(f'<span><i style="background:{_color(i)}"></i>{e(r.label)}</span>' for i, r in enumerate(runs))
    sections = [
        _learning_curves(runs),
        _per_turn(runs),
        _trunks(runs),
        _consistency(runs),
        _timing(runs),
        _summary(runs),
        _config(runs),
        _provenance(runs),
        _generations(runs),
    ]
    nav = "".join(
        f'<a href="#{a}">{t}</a>' for a, t in re.findall(r'<section id="([a-z]+)"><h2>([^<]+)</h2>', "".join(sections))
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{e(title)}</title><style>{CSS}</style></head><body>"
        f'<h1>{e(title)}</h1><div class="runs">{legend}</div><nav>{nav}</nav>'
        + "".join(sections)
        + f"<script>{SCRIPT}</script></body></html>\n"
    )


def write_report(run_paths: list[str | Path], out: str | Path | None = None) -> Path:
    """Read the run folders and write the page (default: RUN/report.html for one run); returns its path."""
    if not run_paths:
        raise ReportError("report: give at least one run folder")
    runs = [load_run(p) for p in run_paths]
    labels = [r.label for r in runs]
    for i, r in enumerate(runs):  # two runs of the same folder name (different parents) stay apart
        if labels.count(r.label) > 1:
            r.label = f"{r.path.parent.name}/{r.label}#{i}"
    if out is None:
        if len(runs) > 1:
            raise ReportError("report: several runs need --out FILE.html")
        out = runs[0].path / REPORT
    target = Path(out)
    if target.suffix.lower() not in (".html", ".htm"):
        raise ReportError(f"--out {out}: must end in .html")
    from rtpo.rundir.checkpoint import atomic_write_text

    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(target, render(runs))
    return target
