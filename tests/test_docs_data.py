"""docs/data.md stays true: each layout's example record loads with its layout to the answer the block
states, every layout has an example, and the YAML example is a valid task section."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

DOC = Path(__file__).resolve().parents[1] / "docs" / "data.md"
BLOCK = re.compile(r"```jsonl layout=(\S+) answer=([^\n]+)\n(.*?)```", re.S)


def _blocks():
    return BLOCK.findall(DOC.read_text())


def test_every_layout_has_an_example():
    from rtpo.llm.tasks import LAYOUTS

    assert {layout for layout, _, _ in _blocks()} == set(LAYOUTS.names())


@pytest.mark.parametrize("layout,answer,body", _blocks(), ids=[b[0] for b in _blocks()])
def test_example_record_loads(tmp_path, layout, answer, body):
    from rtpo.llm.tasks import load_math

    p = tmp_path / "example.jsonl"
    p.write_text(body)
    task = load_math(p, layout)
    assert len(task) == 1 and task[0].answer == answer.strip() and task[0].question


def test_yaml_example_is_a_valid_task_section(tmp_path):
    pytest.importorskip("transformers")
    from rtpo.llm.schema import parse_task

    text = re.search(r"```yaml\n(.*?)```", DOC.read_text(), re.S).group(1)
    task = parse_task(yaml.safe_load(text)["task"])
    assert task.fields.mapping() == {"question": "problem_text", "answer": "worked_solution", "id": "uid"}
