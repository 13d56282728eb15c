"""The two test tiers: plain `pytest` deselects `slow` (pyproject addopts), and the README's test command
runs exactly the pytest invocations `.ci/run` runs (the fast tier, then the slow tier)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _pytest_calls(words: list[str]) -> list[tuple[str, ...]]:
    """The argument lists of the pytest invocations in a `&&`-joined command (python -m pytest = pytest)."""
    calls, cur = [], None
    for w in [*words, "&&"]:
        if w == "&&":
            if cur is not None:
                calls.append(tuple(cur))
            cur = None
        elif cur is not None:
            cur.append(w)
        elif w == "pytest":
            cur = []
    return calls


def test_default_run_deselects_slow():
    opts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    args = shlex.split(opts["addopts"])
    assert args[args.index("-m") + 1] == "not slow"
    assert any(m.startswith("slow:") for m in opts["markers"])


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    (command,) = re.findall(r"^ {4}(python3 -m venv .*pip install -e '\.\[ci\]'.*)$", readme, re.M)
    ci_lines = [ln.strip() for ln in (ROOT / ".ci/run").read_text().splitlines()]
    ci_calls = [tuple(shlex.split(ln)[3:]) for ln in ci_lines if ln.startswith("python -m pytest")]
    assert _pytest_calls(shlex.split(command)) == ci_calls == [(), ("-m", "slow")]
