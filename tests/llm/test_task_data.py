"""Math tasks from user data: the MATH training layout (answer = the solution's last \\boxed{}), verl's
RLHFDataset parquet, a `datasets.save_to_disk` folder, and `task.fields` pointing at a file's own column
names; through load_math and through a scenario's task section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rtpo.llm.tasks import MathDataError, load_math
from rtpo.scenario.schema import ConfigError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "math"

# verl's examples/data_preprocess/gsm8k.py writes these columns (the instruction appended to the question)
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def _verl_rows():
    qs = [("Tom has 3 apples and buys 4. How many?", "7"), ("What is 6 times 7?", "42"), ("Half of 18?", "9")]
    return [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"{q} {INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": a},
            "extra_info": {"split": "train", "index": i, "answer": f"... #### {a}", "question": q},
        }
        for i, (q, a) in enumerate(qs)
    ]


def _verl_parquet(tmp_path, rows):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    p = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), p)
    return p


def test_math_training_layout_extracts_the_last_boxed():
    task = load_math(FIX / "math_train.jsonl", "math")
    assert [it.answer for it in task] == ["14", r"\frac{3}{4}", "-3"]  # the last box, braces balanced
    assert [it.id for it in task] == ["math-0", "math-1", "math-2"] and task[0].question == r"What is $2+3\cdot 4$?"


def test_a_solution_without_a_box_names_file_line_and_field(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text(
        json.dumps({"problem": "p", "solution": r"so \boxed{1}"})
        + "\n"
        + json.dumps({"problem": "p", "solution": "no box"})
        + "\n"
    )
    with pytest.raises(MathDataError, match=r"m\.jsonl:2: field 'solution': no \\boxed\{\.\.\.\} answer") as e:
        load_math(p, "math")
    assert "\n" not in str(e.value)
    p.write_text(json.dumps({"problem": "p", "solution": r"unclosed \boxed{1"}) + "\n")
    with pytest.raises(MathDataError, match=r"m\.jsonl:1: field 'solution': no \\boxed"):
        load_math(p, "math")


def test_verl_parquet_layout(tmp_path):
    task = load_math(_verl_parquet(tmp_path, _verl_rows()), "verl")
    assert [it.answer for it in task] == ["7", "42", "9"]
    assert [it.id for it in task] == ["0", "1", "2"]  # extra_info.index
    assert task[1].question == f"What is 6 times 7? {INSTRUCTION}"  # the chat prompt's user message


def test_verl_parquet_bad_rows_name_file_and_row(tmp_path):
    rows = _verl_rows()
    rows[2]["reward_model"] = {"style": "rule", "ground_truth": ""}
    with pytest.raises(MathDataError, match=r"train\.parquet: row 2: field 'reward_model\.ground_truth': empty answer"):
        load_math(_verl_parquet(tmp_path, rows), "verl")
    rows = _verl_rows()
    rows[1]["extra_info"]["index"] = 0
    with pytest.raises(MathDataError, match=r"train\.parquet: row 1: duplicate id '0' \(first at row 0\)"):
        load_math(_verl_parquet(tmp_path, rows), "verl")
    rows = _verl_rows()
    rows[0]["prompt"] = [{"role": "system", "content": "hi"}]
    with pytest.raises(
        MathDataError, match=r"train\.parquet: row 0: field 'prompt': chat prompt has no 'user' message"
    ):
        load_math(_verl_parquet(tmp_path, rows), "verl")


def test_save_to_disk_folder_with_a_field_mapping(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [json.loads(line) for line in (FIX / "math_train.jsonl").read_text().splitlines()]
    rows = [{"uid": f"p{i}", "text": r["problem"], "worked": r["solution"]} for i, r in enumerate(rows)]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "ds"))
    fields = {"question": "text", "answer": "worked", "id": "uid"}
    task = load_math(tmp_path / "ds", "generic", fields=fields)  # one split: read without naming it
    assert [(it.id, it.answer) for it in task] == [("p0", "14"), ("p1", r"\frac{3}{4}"), ("p2", "-3")]
    assert load_math(tmp_path / "ds" / "train", "generic", fields=fields) == task.__class__("generic:train", task.items)
    with pytest.raises(
        MathDataError,
        match=r"data-00000-of-00001\.arrow: row 0: missing field 'problem_text' \(task\.fields\.question\)",
    ):
        load_math(tmp_path / "ds", "generic", fields={**fields, "question": "problem_text"})
    with pytest.raises(MathDataError, match=r"task\.fields: unknown key\(s\) solution"):
        load_math(tmp_path / "ds", "generic", fields={"solution": "worked"})


def test_the_old_unicode_error_is_gone(tmp_path):
    """An Arrow shard pointed at directly is read as Arrow, never decoded as text."""
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list([{"problem": "1+1?", "answer": "2"}]).save_to_disk(str(tmp_path / "ds"))
    shard = next((tmp_path / "ds").glob("*.arrow"))
    assert load_math(shard, "math500")[0].answer == "2"
    assert load_math(tmp_path / "ds", "math500")[0].answer == "2"


def test_scenario_task_fields(tmp_path):
    pytest.importorskip("transformers")
    from rtpo.llm.schema import load_task, parse_task

    p = tmp_path / "mine.jsonl"
    p.write_text(
        "".join(json.dumps({"q": f"{i}+1?", "sol": rf"It is \boxed{{{i + 1}}}.", "key": i}) + "\n" for i in range(4))
    )
    task = parse_task({"kind": "generic", "path": str(p), "fields": {"question": "q", "answer": "sol", "id": "key"}})
    loaded = load_task(task)
    assert [(it.id, it.answer) for it in loaded] == [("0", "1"), ("1", "2"), ("2", "3"), ("3", "4")]
    with pytest.raises(ConfigError, match=r"task\.fields.*questoin.*did you mean.*question"):
        parse_task({"kind": "generic", "path": str(p), "fields": {"questoin": "q"}})
    bad = parse_task({"kind": "generic", "path": str(p), "fields": {"question": "nope"}})
    with pytest.raises(
        ConfigError, match=r"task\.path: .*mine\.jsonl:1: missing field 'nope' \(task\.fields\.question\)"
    ):
        load_task(bad)
