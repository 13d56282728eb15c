"""Data records from local files in the common layouts, with one-line errors naming file and line/row.

One reader for every task that trains or evaluates on a data set (math benchmarks, QA for search, ...).
Nothing is downloaded: point it at a file or folder you have.

Formats (chosen by the path, see docs/data.md):

| path                          | format                                            | a record's place in errors  |
|-------------------------------|---------------------------------------------------|-----------------------------|
| `*.jsonl`, `*.ndjson`         | one JSON object a line (blank lines skipped)      | `file:LINE` (1-based)       |
| `*.json`                      | a JSON list of objects (or `{"data": [...]}`);    | `file: item I` (0-based);   |
|                               | a `.json` holding JSON lines (what `Dataset.      | JSON lines: `file:LINE`     |
|                               | to_json` writes) is read as JSONL                 |                             |
| `*.parquet`                   | Parquet (needs pyarrow: `pip install rtpo[data]`) | `file: row I` (0-based)     |
| `*.arrow`                     | an Arrow IPC stream or file (one datasets shard)  | `file: row I` (0-based)     |
| a folder with `state.json`    | a Hugging Face `datasets` folder written by       | `shard: row I`              |
|                               | `Dataset.save_to_disk` (its `.arrow` shards in    |                             |
|                               | the order state.json lists them)                  |                             |
| a folder with                 | a `DatasetDict.save_to_disk` folder: name the     |                             |
| `dataset_dict.json`           | split (`split=` or `path/<split>`)                |                             |

Nested columns (verl's `reward_model: {ground_truth: ...}`) are addressed with dotted paths
(`reward_model.ground_truth`).  A field mapping `{name: source}` gives each record the field `name` read from
`source` in the file; `read_records` fails on the first record that lacks a required field, holds an empty
one, or repeats an id.  Row numbers of columnar files are 0-based, so `row 3` is `dataset[3]`.

    >>> recs = read_records("train.parquet", fields={"question": "prompt", "answer": "reward_model.ground_truth"})
    >>> recs[0].question, recs[0].where        # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DataError",
    "Record",
    "chat_text",
    "get_path",
    "iter_raw",
    "read_records",
]

JSONL_EXTS = (".jsonl", ".ndjson")
KNOWN = ".jsonl, .ndjson, .json, .parquet, .arrow, or a datasets save_to_disk folder"
_MISSING = object()
_RAISE = object()


class DataError(ValueError):
    """A data file or record that cannot be used; the message is one line naming the file and line/row."""


@dataclass(frozen=True)
class Record:
    """One record: `values` holds the mapped fields (name -> value), `raw` the whole record as read,
    `where` its place (`file:line` or `file: row i`) for error messages, `id` its id as a string (None
    when the mapping names no id field)."""

    where: str
    values: Mapping[str, Any]
    raw: Mapping[str, Any] = field(repr=False)
    id: str | None = None
    sources: Mapping[str, str] = field(default_factory=dict, repr=False)  # name -> the source it was read from

    def label(self, name: str) -> str:
        """`field 'reward_model.ground_truth'`: how errors name the mapped field `name`."""
        return f"field {self.sources.get(name, name)!r}"

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def get(self, name: str, default: Any = None) -> Any:
        return self.values.get(name, default)

    def error(self, message: str) -> DataError:
        """A DataError for this record: `raise rec.error("field 'answer': not a number")`."""
        return DataError(_one_line(f"{self.where}: {message}"))


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _pyarrow(path: str, what: str):
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise DataError(
            f"{path}: reading {what} needs pyarrow (pip install 'rtpo[data]'), or convert the file to JSONL"
        ) from None
    import pyarrow as pa

    return pa


def _damaged(path: str, what: str, e: BaseException) -> DataError:
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return DataError(
        _one_line(f"{path}: not a readable {what} file ({type(e).__name__}{': ' + first if first else ''})")
    )


def _json_value(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{where}: invalid JSON ({e.msg})") from None
    except (ValueError, RecursionError):  # an int past 4300 digits, nesting past the stack
        raise DataError(f"{where}: invalid JSON (too deeply nested or a number too long)") from None


def _jsonl(path: str) -> Iterator[tuple[str, Any]]:
    with open(path, "rb") as f:
        for lineno, raw_line in enumerate(f, start=1):
            try:
                line = raw_line.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{lineno}: not UTF-8 (byte 0x{raw_line[e.start]:02x})") from None
            if line.strip():
                yield f"{path}:{lineno}", _json_value(line, f"{path}:{lineno}")


def _json(path: str) -> Iterator[tuple[str, Any]]:
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not UTF-8 (byte 0x{raw[e.start]:02x})") from None
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            if e.msg == "Extra data":  # JSON lines under a .json name (datasets' to_json default)
                yield from _jsonl(path)
                return
            raise DataError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
        except (ValueError, RecursionError):
            raise DataError(f"{path}: invalid JSON (too deeply nested or a number too long)") from None
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            data = data["data"]
        else:
            raise DataError(f"{path}: a .json file must hold a list of records (or JSON lines), got one object")
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
        except (ValueError, RecursionError):
            raise DataError(f"{path}: invalid JSON (too deeply nested or a number too long)") from None
    if not isinstance(data, list):
        raise DataError(f"{path}: a .json file must hold a list of records (or JSON lines), got {type(data).__name__}")
    for i, rec in enumerate(data):
        yield f"{path}: item {i}", rec


def _table_rows(table: Any, path: str) -> Iterator[tuple[str, Any]]:
    for i, rec in enumerate(table.to_pylist()):
        yield f"{path}: row {i}", rec


def _parquet(path: str) -> Iterator[tuple[str, Any]]:
    _pyarrow(path, "Parquet")
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises many types for a damaged file
        raise _damaged(path, "Parquet", e) from None
    yield from _table_rows(table, path)


def _arrow(path: str) -> Iterator[tuple[str, Any]]:
    pa = _pyarrow(path, "Arrow")
    try:
        with pa.memory_map(path) as src:
            try:
                table = pa.ipc.open_stream(src).read_all()  # datasets writes the stream format
            except pa.ArrowInvalid:
                src.seek(0)
                table = pa.ipc.open_file(src).read_all()
    except Exception as e:  # noqa: BLE001
        raise _damaged(path, "Arrow", e) from None
    yield from _table_rows(table, path)


def _read_json_file(path: str) -> Any:
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise DataError(f"{path}: not a valid JSON file ({type(e).__name__})") from None


def _saved_dataset(folder: str, split: str | None) -> Iterator[tuple[str, Any]]:
    """A `datasets` save_to_disk folder: state.json lists the Arrow shards in order."""
    dict_file = os.path.join(folder, "dataset_dict.json")
    if os.path.isfile(dict_file):
        info = _read_json_file(dict_file)
        splits = info.get("splits") if isinstance(info, dict) else None
        if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
            raise DataError(f"{dict_file}: expected {{'splits': [names]}}")
        if split is None:
            if len(splits) != 1:
                raise DataError(
                    f"{folder}: a DatasetDict folder with splits {', '.join(splits)}: name one "
                    f"(split=..., or the path {os.path.join(folder, splits[0] if splits else 'SPLIT')})"
                )
            split = splits[0]
        if split not in splits:
            raise DataError(f"{folder}: no split {split!r} (splits: {', '.join(splits)})")
        yield from _saved_dataset(os.path.join(folder, split), None)
        return
    if split is not None:
        raise DataError(f"{folder}: split={split!r} given, but the folder holds one dataset (no dataset_dict.json)")
    state_file = os.path.join(folder, "state.json")
    state = _read_json_file(state_file)
    files = state.get("_data_files") if isinstance(state, dict) else None
    if not isinstance(files, list) or not files:
        raise DataError(f"{state_file}: no '_data_files' list (not a datasets save_to_disk folder?)")
    if state.get("_indices_data_files"):
        raise DataError(
            f"{state_file}: an index mapping over the data is not supported; save with "
            "dataset.flatten_indices().save_to_disk(...)"
        )
    for entry in files:
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(name, str) or os.path.basename(name) != name:
            raise DataError(f"{state_file}: bad _data_files entry {entry!r}")
        shard = os.path.join(folder, name)
        if not os.path.isfile(shard):
            raise DataError(f"{shard}: listed in state.json but missing")
        yield from _arrow(shard)


def iter_raw(path: str | os.PathLike, *, split: str | None = None) -> Iterator[tuple[str, Any]]:
    """(where, record as read) for every record of `path`, in file order; records are not checked here
    (a record may be any JSON value).  Raises DataError for a missing, unreadable or unknown file."""
    path = os.fspath(path)
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "state.json")) or os.path.isfile(os.path.join(path, "dataset_dict.json")):
            yield from _saved_dataset(path, split)
            return
        raise DataError(f"{path}: a folder, but not a datasets save_to_disk folder (no state.json); expected {KNOWN}")
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file or folder")
    if split is not None:
        raise DataError(f"{path}: split={split!r} applies to a DatasetDict folder only")
    ext = os.path.splitext(path)[1].lower()
    if ext in JSONL_EXTS:
        yield from _jsonl(path)
    elif ext == ".json":
        yield from _json(path)
    elif ext == ".parquet":
        yield from _parquet(path)
    elif ext == ".arrow":
        yield from _arrow(path)
    else:
        raise DataError(f"{path}: unknown data format {ext or '(no extension)'!r}; expected {KNOWN}")


def get_path(record: Mapping[str, Any], dotted: str, default: Any = _RAISE) -> Any:
    """`record["a"]["b"]` for "a.b"; a key holding a literal dot is found first.  Missing -> `default`
    (KeyError when none is given)."""
    if dotted in record:
        return record[dotted]
    cur: Any = record
    for part in dotted.split("."):
        if isinstance(cur, Mapping) and part in cur:
            cur = cur[part]
        else:
            if default is _RAISE:
                raise KeyError(dotted)
            return default
    return cur


def chat_text(value: Any, where: str, role: str = "user") -> str:
    """The text of a prompt given either as a string or as chat messages ([{role, content}, ...], verl's
    `prompt` column): the last message of `role`."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(m, Mapping) for m in value):
        contents = [m.get("content") for m in value if m.get("role") == role]
        if not contents:
            raise DataError(f"{where}: chat prompt has no {role!r} message")
        text = contents[-1]
        if not isinstance(text, str):
            raise DataError(f"{where}: the last {role!r} message's content is not a string")
        return text
    raise DataError(f"{where}: expected a string or a list of chat messages, got {type(value).__name__}")


def _place(where: str, path: str) -> str:
    """'line 3' / 'row 3' / 'item 3' for a place in `path` itself, the full place for another file (a shard)."""
    if where.startswith(path + ": "):
        return where[len(path) + 2 :]
    if where.startswith(path + ":"):
        return "line " + where[len(path) + 1 :]
    return where


def _is_empty(value: Any) -> bool:
    return value is None or (
        isinstance(value, (str, list, dict)) and not (value.strip() if isinstance(value, str) else value)
    )


def read_records(
    path: str | os.PathLike,
    *,
    fields: Mapping[str, str | Sequence[str]] | None = None,
    required: Sequence[str] | None = None,
    id_field: str | Sequence[str] | None = None,
    split: str | None = None,
    limit: int | None = None,
    require_id: bool = True,
    allow_empty: bool = False,
    mapping_name: str = "fields",
) -> list[Record]:
    """Every record of `path` (see the module docstring for the formats) as a Record.

    fields:   {name: source} — Record.values[name] is the record's `source` (a dotted path into nested
              columns; a list of sources: the first present).  None: the record's top-level keys as they are.
    required: names that must be present and non-empty in every record (default: every name in `fields`).
    id_field: source(s) of the record id (dotted; a list: the first present).  Ids must be unique: a
              duplicate is an error naming both places.  None: no ids.
    require_id: a record without an id field is an error (False: its Record.id is None).
    allow_empty: required fields must be present but may be empty/null (the caller checks values itself).
    split:    the split of a DatasetDict folder.
    limit:    stop after this many records.
    mapping_name: how errors call the mapping (e.g. "task.fields"), so a user knows what to change.

    Raises DataError (one line: file, line/row, field) for a missing/unreadable file, a record that is not
    an object, a missing or empty required field, a duplicate id, or a file with no records.
    """
    path = os.fspath(path)
    sources: dict[str, tuple[str, ...]] = {}
    for name, src in (fields or {}).items():
        srcs = (src,) if isinstance(src, str) else tuple(src)
        if not srcs or not all(isinstance(s, str) and s for s in srcs):
            raise DataError(f"{mapping_name}.{name}: expected a field name (or a list of them), got {src!r}")
        sources[name] = srcs
    need = tuple(sources) if required is None else tuple(required)
    ids = (id_field,) if isinstance(id_field, str) else tuple(id_field or ())
    out: list[Record] = []
    seen: dict[str, str] = {}
    for where, rec in iter_raw(path, split=split):
        if not isinstance(rec, Mapping):
            raise DataError(f"{where}: expected a JSON object (a record), got {type(rec).__name__}")
        found: dict[str, str] = {}
        if fields is None:
            values = dict(rec)
        else:
            values = {}
            for name, srcs in sources.items():
                for s in srcs:
                    v = get_path(rec, s, _MISSING)
                    if v is not _MISSING:
                        values[name], found[name] = v, s
                        break
        for name in need:
            label = repr(found[name]) if name in found else " / ".join(repr(s) for s in sources.get(name, (name,)))
            hint = f" ({mapping_name}.{name})" if fields is not None and name in sources else ""
            if name not in values:
                present = ", ".join(list(rec)[:12])
                raise DataError(_one_line(f"{where}: missing field {label}{hint}; the record has: {present}"))
            if not allow_empty and _is_empty(values[name]):
                raise DataError(f"{where}: field {label}{hint} is empty")
        rec_id = None
        if ids:
            raw_id = next((v for v in (get_path(rec, s, _MISSING) for s in ids) if v is not _MISSING), _MISSING)
            if raw_id is _MISSING or raw_id is None or raw_id == "":
                if require_id:
                    raise DataError(f"{where}: missing id field {' / '.join(repr(s) for s in ids)}")
            elif isinstance(raw_id, (dict, list)):
                raise DataError(f"{where}: id field must be a string or number, got {type(raw_id).__name__}")
            else:
                rec_id = str(raw_id)
                if rec_id in seen:
                    first = _place(seen[rec_id], path)
                    raise DataError(_one_line(f"{where}: duplicate id {rec_id[:60]!r} (first at {first})"))
                seen[rec_id] = where
        out.append(Record(where, values, rec, rec_id, found))
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise DataError(f"{path}: no records (empty file)")
    return out
