"""rtpo.llm.data_files: every accepted format reads to the same records, and every bad file is one line naming the
file and the line/row (fixtures generated in each exact layout: JSONL, a JSON list, datasets' JSON lines,
verl-style Parquet, Arrow IPC, and folders written by `datasets.save_to_disk`)."""

from __future__ import annotations

import json

import pytest

from rtpo.llm.data_files import DataError, chat_text, get_path, iter_raw, read_records

ROWS = [
    {"id": "a", "question": "1+1?", "answer": "2", "meta": {"level": 1}},
    {"id": "b", "question": "2+2?", "answer": "4", "meta": {"level": 2}},
    {"id": "c", "question": "3+3?", "answer": "6", "meta": {"level": 3}},
]
FIELDS = {"q": "question", "a": "answer", "level": "meta.level"}


def _write(tmp_path, fmt, rows=ROWS):
    """`rows` written in format `fmt`; returns the path to read."""
    if fmt == "jsonl":
        p = tmp_path / "d.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "json":
        p = tmp_path / "d.json"
        p.write_text(json.dumps(rows, indent=1))
    elif fmt == "json_wrapped":
        p = tmp_path / "d.json"
        p.write_text(json.dumps({"data": rows}))
    elif fmt == "json_lines":  # what datasets' Dataset.to_json writes under a .json name
        p = tmp_path / "d.json"
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt in ("parquet", "arrow_stream", "arrow_file"):
        pa = pytest.importorskip("pyarrow")
        table = pa.Table.from_pylist(rows)
        if fmt == "parquet":
            import pyarrow.parquet as pq

            p = tmp_path / "d.parquet"
            pq.write_table(table, p)
        else:
            p = tmp_path / "d.arrow"
            opener = pa.ipc.new_stream if fmt == "arrow_stream" else pa.ipc.new_file
            with pa.OSFile(str(p), "wb") as sink, opener(sink, table.schema) as w:
                w.write_table(table)
    elif fmt in ("save_to_disk", "save_to_disk_dict"):
        datasets = pytest.importorskip("datasets")
        ds = datasets.Dataset.from_list(rows)
        p = tmp_path / "ds"
        if fmt == "save_to_disk":
            ds.save_to_disk(str(p), num_shards=2)  # two shards: read in state.json's order
        else:
            datasets.DatasetDict({"train": ds, "test": ds.select([0])}).save_to_disk(str(p))
    else:
        raise AssertionError(fmt)
    return p


FORMATS = ["jsonl", "json", "json_wrapped", "json_lines", "parquet", "arrow_stream", "arrow_file", "save_to_disk"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_reads_the_same_records(tmp_path, fmt):
    p = _write(tmp_path, fmt)
    recs = read_records(p, fields=FIELDS, id_field="id")
    assert [(r.id, r.q, r["a"], r.level) for r in recs] == [
        ("a", "1+1?", "2", 1),
        ("b", "2+2?", "4", 2),
        ("c", "3+3?", "6", 3),
    ]
    assert recs[0].raw["meta"] == {"level": 1} and recs[0].sources == {
        "q": "question",
        "a": "answer",
        "level": "meta.level",
    }
    assert str(p) in recs[2].where or "data-" in recs[2].where  # shards name themselves
    assert len(read_records(p, limit=2)) == 2  # no mapping: the records as they are
    assert read_records(p)[1].values == ROWS[1]


def test_dataset_dict_needs_a_split(tmp_path):
    p = _write(tmp_path, "save_to_disk_dict")
    with pytest.raises(DataError, match=r"splits train, test: name one") as e:
        read_records(p)
    assert "\n" not in str(e.value)
    assert [r.id for r in read_records(p, split="train", id_field="id")] == ["a", "b", "c"]
    assert [r.id for r in read_records(p / "test", id_field="id")] == ["a"]
    with pytest.raises(DataError, match="no split 'dev'"):
        read_records(p, split="dev")


def test_first_present_source_and_dotted_literal_keys():
    rec = {"a.b": 1, "a": {"b": 2}, "Problem": "x"}
    assert get_path(rec, "a.b") == 1 and get_path({"a": {"b": 2}}, "a.b") == 2
    assert get_path(rec, "a.c", None) is None
    with pytest.raises(KeyError):
        get_path(rec, "nope")


def test_chat_text_takes_the_last_user_message():
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "q1"},
        {"role": "user", "content": "q2"},
    ]
    assert chat_text(msgs, "f:1") == "q2" and chat_text("plain", "f:1") == "plain"
    with pytest.raises(DataError, match=r"f:1: chat prompt has no 'user' message"):
        chat_text([{"role": "system", "content": "x"}], "f:1")
    with pytest.raises(DataError, match=r"f:1: expected a string or a list of chat messages"):
        chat_text(3, "f:1")


def _jsonl(tmp_path, lines: list[str] | bytes, name="bad.jsonl"):
    p = tmp_path / name
    if isinstance(lines, bytes):
        p.write_bytes(lines)
    else:
        p.write_text("\n".join(lines) + "\n")
    return p


GOOD = '{"id": 1, "question": "q", "answer": "a"}'


@pytest.mark.parametrize(
    "content,match",
    [
        (
            [GOOD, '{"id": 2, "question": "q"}'],
            r"bad\.jsonl:2: missing field 'answer' \(fields\.a\); the record has: id, question",
        ),
        (
            [GOOD, '{"id": 2, "question": "  ", "answer": "a"}'],
            r"bad\.jsonl:2: field 'question' \(fields\.q\) is empty",
        ),
        ([GOOD, '{"id": 2, "question": "q", "answer": null}'], r"bad\.jsonl:2: field 'answer' \(fields\.a\) is empty"),
        ([GOOD, GOOD.replace('"a"}', '"b"}')], r"bad\.jsonl:2: duplicate id '1' \(first at line 1\)"),
        ([GOOD, '{"question": "q", "answer": "a"}'], r"bad\.jsonl:2: missing id field 'id'"),
        ([GOOD, '{"id": [1], "question": "q", "answer": "a"}'], r"bad\.jsonl:2: id field must be a string or number"),
        ([GOOD, "[1, 2]"], r"bad\.jsonl:2: expected a JSON object \(a record\), got list"),
        ([GOOD, "{oops"], r"bad\.jsonl:2: invalid JSON"),
        (GOOD.encode() + b"\n\xff\xfe\n", r"bad\.jsonl:2: not UTF-8 \(byte 0xff\)"),
        (GOOD.encode() + b"\n" + b"[" * 100000 + b"\n", r"bad\.jsonl:2: invalid JSON"),
        (b"\n\n", r"bad\.jsonl: no records \(empty file\)"),
    ],
)
def test_bad_jsonl_is_one_line_naming_file_and_line(tmp_path, content, match):
    p = _jsonl(tmp_path, content)
    with pytest.raises(DataError, match=match) as e:
        read_records(p, fields={"q": "question", "a": "answer"}, id_field="id")
    assert str(p) in str(e.value) and "\n" not in str(e.value)


def test_bad_json_list_and_folders(tmp_path):
    p = tmp_path / "bad.json"
    p.write_bytes(b'[{"q": 1},\n\n {"q": "\xff"}]')
    with pytest.raises(DataError, match=r"bad\.json:3: not UTF-8"):
        read_records(p)
    p.write_text('[{"q": "x"}, 3]')
    with pytest.raises(DataError, match=r"bad\.json: item 1: expected a JSON object"):
        read_records(p)
    p.write_text('{"q": "x"}')
    with pytest.raises(
        DataError, match=r"bad\.json: a \.json file must hold a list of records \(or JSON lines\), got one object"
    ):
        read_records(p, fields={"q": "q"})
    p.write_text("[1, 2")
    with pytest.raises(DataError, match=r"bad\.json:1: invalid JSON"):
        read_records(p)
    with pytest.raises(DataError, match=r"nope\.jsonl: no such file or folder"):
        read_records(tmp_path / "nope.jsonl")
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(DataError, match=r"d\.csv: unknown data format '\.csv'; expected \.jsonl"):
        read_records(tmp_path / "d.csv")
    (tmp_path / "folder").mkdir()
    with pytest.raises(DataError, match=r"folder: a folder, but not a datasets save_to_disk folder"):
        read_records(tmp_path / "folder")


def test_a_single_json_object_is_rejected(tmp_path):
    p = tmp_path / "one.json"
    p.write_text('{"question": "q"}')
    with pytest.raises(DataError, match=r"one\.json: a \.json file must hold a list"):
        read_records(p)


def test_bad_columnar_files_name_file_and_row(tmp_path):
    pytest.importorskip("pyarrow")
    rows = [dict(ROWS[0]), {"id": "b", "question": "", "answer": "4", "meta": {"level": 2}}]
    p = _write(tmp_path, "parquet", rows)
    with pytest.raises(DataError, match=r"d\.parquet: row 1: field 'question' \(fields\.q\) is empty"):
        read_records(p, fields=FIELDS, id_field="id")
    p = _write(tmp_path, "arrow_stream", [ROWS[0], ROWS[0]])
    with pytest.raises(DataError, match=r"d\.arrow: row 1: duplicate id 'a' \(first at row 0\)"):
        read_records(p, id_field="id")
    bad = tmp_path / "damaged.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(DataError, match=r"damaged\.parquet: not a readable Parquet file \(Arrow\w*") as e:
        read_records(bad)
    assert "\n" not in str(e.value)
    bad = tmp_path / "damaged.arrow"
    bad.write_bytes(b"\x00" * 64)
    with pytest.raises(DataError, match=r"damaged\.arrow: not a readable Arrow file"):
        read_records(bad)


def test_broken_save_to_disk_folders(tmp_path):
    p = _write(tmp_path, "save_to_disk")
    shards = json.loads((p / "state.json").read_text())["_data_files"]
    assert len(shards) == 2
    (p / shards[1]["filename"]).unlink()
    with pytest.raises(DataError, match=r"data-00001-of-00002\.arrow: listed in state\.json but missing"):
        read_records(p)
    (p / "state.json").write_bytes(b"\xff{")
    with pytest.raises(DataError, match=r"state\.json: not a valid JSON file"):
        read_records(p)
    (p / "state.json").write_text(json.dumps({"_data_files": [{"filename": "../x.arrow"}]}))
    with pytest.raises(DataError, match=r"state\.json: bad _data_files entry"):
        read_records(p)


def test_iter_raw_keeps_file_order_and_places(tmp_path):
    p = _jsonl(tmp_path, [GOOD, "", '{"x": 2}'], name="ok.jsonl")
    assert [w for w, _ in iter_raw(p)] == [f"{p}:1", f"{p}:3"]


def test_mapping_is_checked(tmp_path):
    p = _jsonl(tmp_path, [GOOD], name="ok.jsonl")
    with pytest.raises(DataError, match=r"task\.fields\.q: expected a field name"):
        read_records(p, fields={"q": ""}, mapping_name="task.fields")
    recs = read_records(p, fields={"q": ["problem", "question"]}, required=())
    assert recs[0].q == "q" and recs[0].label("q") == "field 'question'"
