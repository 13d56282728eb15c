"""Figures quoted in README.md and docs/ are links to the committed bench JSON they come from.

A figure is written as a Markdown link whose target is a JSON file under bench/ and whose title is the
path of the value inside it:

    [7.2 ms](bench/results.json "benchmarks[name=test_bench_solve_sparse_1e5_states].stats.min")

The link text is the value rendered with the unit after the number: `ms` (×1e3), `µs` (×1e6), `k` or
`k/s` (÷1e3), `M/s` (÷1e6), `%` (×100), `kB` (÷1e3), `MB` (÷1e6), `GB/s`, `GB` and `GFLOP/s` (÷1e9); anything else (`×`, `s`, none) takes the
value as it is.  The number of decimals written is the precision the figure claims.

    python bench/figures.py            # check every figure (exit 1 and list the stale ones)
    python bench/figures.py --write    # rewrite every figure's text from its JSON

A path is dot-separated keys; `[i]` indexes a list, `[key=value]` picks the list element whose `key`
equals `value`, and `[k1=v1&k2=v2]` the one matching every pair (a value may itself hold `=`: each pair
splits at its first one).  The bench that writes each JSON is named in the JSON's own "command" field or
in the bench's docstring (bench/run.py for results.json).

Targets are committed JSON under bench/ (benchmarks) or docs/results/ (the `rtpo compare` outputs that
docs/results.md reproduces, each holding the exact command in its "command" field); a link to any other
JSON is reported as a problem.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ("README.md", "docs")

LINK = re.compile(r"\[(?P<text>[^\]\[]*)\]\((?P<target>[\w./-]+\.json) \"(?P<path>[^\"]+)\"\)")
SOURCES = ("bench", "docs/results")
NUMBER = re.compile(r"(?P<num>[-+]?\d[\d,]*(?:\.(?P<dec>\d+))?)\s?(?P<unit>[^\d\s].*)?$")
SCALE = {
    "ms": 1e3,
    "µs": 1e6,
    "k": 1e-3,
    "k/s": 1e-3,
    "M/s": 1e-6,
    "%": 1e2,
    "kB": 1e-3,
    "MB": 1e-6,
    "GB/s": 1e-9,
    "GB": 1e-9,
    "GFLOP/s": 1e-9,
}
STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]|\[([^\]]+=[^\]]*)\]")


@dataclass(frozen=True)
class Figure:
    file: Path
    line: int
    text: str
    target: str
    path: str
    span: tuple[int, int]


def lookup(data, path: str):
    """The value at `path` in `data` (see the module docstring); KeyError naming the step that fails."""
    cur = data
    for m in STEP.finditer(path):
        key, idx, select = m.groups()
        if key is not None:
            if not isinstance(cur, dict) or key not in cur:
                raise KeyError(f"no key {key!r} on the way to {path!r}")
            cur = cur[key]
        elif idx is not None:
            cur = cur[int(idx)]
        else:
            pairs = [part.split("=", 1) for part in select.split("&")]
            hits = [x for x in cur if isinstance(x, dict) and all(str(x.get(k)) == v for k, v in pairs)]
            if len(hits) != 1:
                raise KeyError(f"{len(hits)} elements with {select} on the way to {path!r}")
            cur = hits[0]
    return cur


def render(value: float, like: str) -> str:
    """`value` written with the unit and number of decimals of the figure text `like`."""
    m = NUMBER.match(like.strip())
    if m is None:
        raise ValueError(f"figure text {like!r} does not start with a number")
    unit = (m.group("unit") or "").strip()
    decimals = len(m.group("dec") or "")
    x = float(value) * SCALE.get(unit, 1.0)
    body = f"{x:,.{decimals}f}" if "," in m.group("num") else f"{x:.{decimals}f}"
    sep = " " if " " in like.strip()[len(m.group("num")) : len(m.group("num")) + 1] else ""
    return f"{body}{sep}{unit}" if unit else body


def figures(root: Path = ROOT) -> list[Figure]:
    files = []
    for name in DOCS:
        p = root / name
        files += sorted(p.rglob("*.md")) if p.is_dir() else ([p] if p.is_file() else [])
    out = []
    for f in files:
        text = f.read_text(encoding="utf-8")
        for m in LINK.finditer(text):
            out.append(Figure(f, text.count("\n", 0, m.start()) + 1, m["text"], m["target"], m["path"], m.span("text")))
    return out


def resolve(fig: Figure, root: Path = ROOT) -> str:
    target = (fig.file.parent / fig.target).resolve()
    if not any(target.is_relative_to(root.resolve() / src) for src in SOURCES):
        raise ValueError(f"{fig.target} is not committed output under {' or '.join(SOURCES)}/")
    data = json.loads(target.read_text(encoding="utf-8"))
    return render(lookup(data, fig.path), fig.text)


def check(root: Path = ROOT) -> list[str]:
    """One line per figure whose text differs from its JSON (or whose JSON/path is missing)."""
    bad = []
    for fig in figures(root):
        where = f"{fig.file.relative_to(root)}:{fig.line}"
        try:
            want = resolve(fig, root)
        except (OSError, KeyError, IndexError, TypeError, ValueError) as e:
            bad.append(f"{where}: [{fig.text}] -> {fig.target} {fig.path!r}: {e}")
            continue
        if want != fig.text:
            bad.append(f"{where}: the text says {fig.text!r}, {fig.target} says {want!r} ({fig.path})")
    return bad


def write(root: Path = ROOT) -> int:
    changed = 0
    by_file: dict[Path, list[Figure]] = {}
    for fig in figures(root):
        by_file.setdefault(fig.file, []).append(fig)
    for f, figs in by_file.items():
        text = f.read_text(encoding="utf-8")
        for fig in sorted(figs, key=lambda x: -x.span[0]):
            new = resolve(fig, root)
            if new != fig.text:
                text = text[: fig.span[0]] + new + text[fig.span[1] :]
                changed += 1
        f.write_text(text, encoding="utf-8")
    return changed


if __name__ == "__main__":
    if "--write" in sys.argv[1:]:
        print(f"rewrote {write()} figures")
    else:
        problems = check()
        print("\n".join(problems) or f"all {len(figures())} figures match their JSON")
        raise SystemExit(1 if problems else 0)
