"""CONTRIBUTING.md's worked example runs as written: its `# contributing-example` code blocks are
executed in order in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_contributing_example_runs(tmp_path):
    text = (ROOT / "CONTRIBUTING.md").read_text()
    blocks = re.findall(r"```python\n# contributing-example\n(.*?)```", text, re.S)
    assert len(blocks) >= 2
    from rtpo.core.estimators import ESTIMATORS

    namespace = {"OUT": tmp_path}
    with ESTIMATORS.temporary():
        for block in blocks:
            exec(compile(block, "CONTRIBUTING.md", "exec"), namespace)
        adv = ESTIMATORS.get("sibling_median")([[1.0, 0.0, 0.0]])
        assert adv.tolist() == [[1.0, 0.0, 0.0]]
    assert "sibling_median" not in ESTIMATORS
