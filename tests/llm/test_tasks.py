"""Math task loaders on small hand-written fixtures in each public layout, bad files, generated arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rtpo.llm.tasks import LAYOUTS, MathDataError, arithmetic_task, load_math

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "math"


@pytest.mark.parametrize(
    "file,layout,answers,first_id",
    [
        ("gsm8k.jsonl", "gsm8k", ["34", "120", "1500"], "gsm8k-0"),
        ("math500.jsonl", "math500", [r"\frac{7}{8}", "6", r"5\sqrt{2}"], "fixture/prealgebra/1.json"),
        ("aime24.jsonl", "aime24", ["49", "024"], "60"),
        ("aime24_capitalized.jsonl", "aime24", ["210"], "fixture-I-1"),
        ("aime25.jsonl", "aime25", ["29", "15"], "aime25-0"),
        ("amc23.jsonl", "amc23", ["8", "4.5"], "0"),
        ("oe_math.jsonl", "oe_math", ["3, -3", "55"], "9001"),
    ],
)
def test_layouts_load_fixtures(file, layout, answers, first_id):
    task = load_math(FIX / file, layout)
    assert [it.answer for it in task] == answers
    assert task[0].id == first_id and all(it.question and it.source == layout for it in task)


def test_every_layout_has_a_fixture():
    covered = {"gsm8k", "math500", "aime24", "aime25", "amc23", "oe_math"}
    covered |= {"math", "verl", "generic"}  # tests/llm/test_task_data.py
    assert covered == set(LAYOUTS.names())


def test_limit_and_json_list(tmp_path):
    assert len(load_math(FIX / "gsm8k.jsonl", "gsm8k", limit=2)) == 2
    p = tmp_path / "list.json"
    p.write_text(json.dumps([{"problem": "1+1?", "answer": 2}]))
    assert load_math(p, "math500")[0].answer == "2"


@pytest.mark.parametrize(
    "lines,layout,pattern",
    [
        (['{"question": "q", "answer": "no marker"}'], "gsm8k", r"bad\.jsonl:1: field 'answer': .*####"),
        (['{"problem": "p", "answer": "1"}', '{"problem": "p"}'], "math500", r"bad\.jsonl:2: missing field 'answer'"),
        (['{"problem": "p", "answer": "1"}', "{not json"], "math500", r"bad\.jsonl:2: invalid JSON"),
        (['{"question": "", "answer": 3}'], "amc23", r"bad\.jsonl:1: field 'question' must be a non-empty string"),
        (['{"question": "q", "final_answer": []}'], "oe_math", r"bad\.jsonl:1: field 'final_answer': empty"),
        (["[1, 2]"], "aime25", r"bad\.jsonl:1: expected a JSON object"),
        (['{"question": "q", "answer": null}'], "aime25", r"bad\.jsonl:1: field 'answer': expected a number"),
    ],
)
def test_bad_files_name_file_line_and_field(tmp_path, lines, layout, pattern):
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(MathDataError, match=pattern) as e:
        load_math(p, layout)
    assert "\n" not in str(e.value)


def test_missing_file_empty_file_and_unknown_layout(tmp_path):
    with pytest.raises(MathDataError, match="no such file"):
        load_math(tmp_path / "nope.jsonl", "gsm8k")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(MathDataError, match=r"empty\.jsonl: no records"):
        load_math(tmp_path / "empty.jsonl", "gsm8k")
    with pytest.raises(KeyError, match="valid: .*gsm8k"):
        load_math(FIX / "gsm8k.jsonl", "gsm9k")


def test_arithmetic_is_seeded_and_correct():
    a, b = arithmetic_task(20, seed=3), arithmetic_task(20, seed=3)
    assert a == b and arithmetic_task(20, seed=4) != a
    for it in a:
        expr = it.question.removeprefix("Compute ").split(".")[0]
        assert int(it.answer) == eval(expr)  # noqa: S307 - the reference for the hand-written evaluator
    with pytest.raises(ValueError, match="unsupported"):
        arithmetic_task(2, seed=0, ops=("/",))


def test_build_task_from_config():
    from rtpo.llm.tasks import build_task

    assert build_task("arithmetic", n=5, seed=1) == arithmetic_task(5, seed=1)
    assert len(build_task("math_file", path=str(FIX / "aime25.jsonl"), layout="aime25")) == 2
    with pytest.raises(ValueError, match="task 'arithmetic'.*nn"):
        build_task("arithmetic", nn=5, seed=1)
    with pytest.raises(KeyError, match="valid: arithmetic, math_file"):
        build_task("gsm")


# -- attack class "data files": bad bytes are one line naming file and line ------------------------------
@pytest.mark.parametrize(
    "content,match",
    [
        (b'{"problem": "q", "answer": "1"}\n\xff\xfe bad\n', r":2: not UTF-8"),
        (b'{"problem": "q", "answer": "1"}\n{"problem": \n', r":2: invalid JSON"),
        (b'{"problem": "q", "answer": "1"}\n[1, 2]\n', r":2: expected a JSON object"),
        (b'{"problem": "q", "answer": "1"}\n' + b"[" * 100000 + b"\n", r":2: invalid JSON"),
        (
            b'{"id": 1, "problem": "q", "answer": "1"}\n{"id": 1, "problem": "r", "answer": "2"}\n',
            r":2: duplicate id '1' \(first at line 1\)",
        ),
    ],
)
def test_bad_data_lines_name_file_and_line(tmp_path, content, match):
    from rtpo.llm.tasks.math import MathDataError, load_math

    p = tmp_path / "bad.jsonl"
    p.write_bytes(content)
    with pytest.raises(MathDataError, match=match) as e:
        load_math(p, "math500")
    assert str(p) in str(e.value) and "\n" not in str(e.value)


def test_bad_json_file_names_the_line(tmp_path):
    from rtpo.llm.tasks.math import MathDataError, load_math

    p = tmp_path / "bad.json"
    p.write_bytes(b'[{"problem": "q", "answer": "1"},\n\n {"problem": "\xff"}]')
    with pytest.raises(MathDataError, match=r"bad\.json:3: not UTF-8"):
        load_math(p, "math500")
